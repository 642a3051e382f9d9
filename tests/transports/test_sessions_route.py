"""GET /v1/sessions and `procpilot ps --agent`: an agent lists its own sessions; an approver may list
another agent's, or every agent's, each row naming its agent."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import pytest

from tests.daemon import PROCPILOT, TOKEN_A, TOKEN_B, Served, cleanup, cli_env, post, start_daemon


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    daemon = start_daemon(tmp_path_factory.mktemp("sessions"), server='approvers = ["agent-a"]')
    yield daemon
    assert daemon.stop() == 0, daemon.log_text()


def ps(served: Served, token: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = cli_env(HOME="/nonexistent", COLUMNS="200")
    env |= {"PROCPILOT_URL": served.url, "PROCPILOT_TOKEN": token}
    return subprocess.run([PROCPILOT, "ps", *args], env=env, capture_output=True, text=True, timeout=60, check=False)


def test_an_approver_lists_another_agents_sessions_and_nobody_else_may(served: Served) -> None:
    with served.http(TOKEN_B) as b, served.http(TOKEN_A) as a:
        started = post(b, "exec", command="sleep 30", background=True, name="bweb").json()["data"]
        try:
            assert a.get("/v1/sessions").json() == {"sessions": []}  # the caller's own: none
            theirs = a.get("/v1/sessions", params={"agent": "agent-b"}).json()["sessions"]
            assert [(r["agent"], r["sessionName"], r["pid"]) for r in theirs] == [("agent-b", "bweb", started["pid"])]
            everyone = a.get("/v1/sessions", params={"agent": "*"}).json()["sessions"]
            assert {r["agent"] for r in everyone} == {"agent-b"}
            refused = b.get("/v1/sessions", params={"agent": "agent-a"})
            assert refused.status_code == 403 and refused.json()["error"] == "ApprovalForbidden"
            shown = ps(served, TOKEN_A, "--agent", "agent-b", "--running")
            assert shown.returncode == 0, shown.stderr
            assert shown.stdout.split()[:2] == ["AGENT", "ID"] and "bweb" in shown.stdout
            denied = ps(served, TOKEN_B, "--agent", "agent-a")
            assert denied.returncode == 1 and "ApprovalForbidden" in denied.stderr
        finally:
            cleanup(b)
