"""One agent must never stall, exhaust or see through the shared daemon: each finding of the
adversarial review, reproduced against a real `procpilot serve`."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from tests.daemon import TOKEN_A, TOKEN_B, Served, cleanup, post, start_daemon

# agent-b runs under an allowlist, so its commands go through the policy's shell analysis.
POLICY = """
[policy.agents.agent-b]
allow = ["echo", "ls", "cat", "true"]
"""


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    daemon = start_daemon(tmp_path_factory.mktemp("hardening"), extra=POLICY)
    yield daemon
    assert daemon.stop() == 0, daemon.log_text()


def test_a_huge_command_is_refused_at_once(served: Served) -> None:
    with served.http(TOKEN_A) as c:
        started = time.monotonic()
        refused = post(c, "exec", command="echo " + "A" * 1_000_000)
        assert refused.status_code == 422, refused.text
        body = refused.json()
        assert body["error"] == "InvalidArgument" and "longer than" in body["message"]
        assert time.monotonic() - started < 5  # was 12 s of a stalled event loop


def test_big_commands_do_not_stall_a_quiet_agent(served: Served) -> None:
    # The largest command the kernel takes, analysed by the allowlist policy over and over, while
    # another agent calls: its calls are answered as they come (generous bound: a shared CI box).
    stop = threading.Event()

    def noisy() -> None:
        with served.http(TOKEN_B) as c:
            while not stop.is_set():
                post(c, "exec", command="echo a" + " | cat" * 20_000)

    threads = [threading.Thread(target=noisy) for _ in range(2)]
    for thread in threads:
        thread.start()
    try:
        time.sleep(0.5)
        with served.http(TOKEN_A) as c:
            for _ in range(5):
                started = time.monotonic()
                assert post(c, "process", action="list").status_code == 200
                assert time.monotonic() - started < 2
    finally:
        stop.set()
        for thread in threads:
            thread.join(60)
        with served.http(TOKEN_B) as c:
            cleanup(c)


@pytest.mark.parametrize("token", [TOKEN_A, TOKEN_B], ids=["no-policy", "allowlist"])
def test_deeply_nested_substitutions_are_invalid_arguments(served: Served, token: str) -> None:
    with served.http(token) as c:
        nested = post(c, "exec", command="echo " + "$(" * 2000 + "echo x" + ")" * 2000)
        assert nested.status_code == 422, nested.text
        assert nested.json()["error"] == "InvalidArgument"
        cleanup(c)


def test_a_command_the_policy_cannot_analyse_is_a_403(served: Served) -> None:
    with served.http(TOKEN_B) as c:
        refused = post(c, "exec", command='x=ls; eval "$x"')
        assert refused.status_code == 403, refused.text
        assert refused.json()["error"] == "UnanalyzableCommand"


def test_assignments_from_substitutions_run(served: Served) -> None:
    with served.http(TOKEN_A) as c:
        done = post(c, "exec", command="x=$(echo a b); echo $x").json()["data"]
        assert (done["status"], done["output"]) == ("done", "a b\n")
        missing = post(c, "exec", command="VAR=$(echo a) nosuchprog-xyz").json()["data"]
        assert missing["exitCode"] == 127 and missing["commandNotFound"] == "nosuchprog-xyz"
        cleanup(c)
