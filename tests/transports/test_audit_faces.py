"""Every state-changing call is in the audit log, whichever face made it (issue 23, item 9):
``process`` write, kill and remove over MCP, over REST and from the CLI, as ``process.kill`` was."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import httpx2
from mcp import Client

from tests.daemon import PROCPILOT, TOKEN_A, cli_env, post, start_daemon
from tests.transports.test_model_view import stdio


def audited(state_dir: Path) -> list[tuple[str, str | None, str | None]]:
    """(tool, action, session) of each audited call in a state directory's audit log."""
    lines = (state_dir / "audit.jsonl").read_text().splitlines()
    events = [json.loads(line) for line in lines]
    return [(e["tool"], (e.get("arguments") or {}).get("action"), e.get("process_id")) for e in events]


async def test_process_changes_over_mcp_are_audited(tmp_path: Path) -> None:
    async with Client(stdio(tmp_path), mode="legacy") as client:
        started = (await client.call_tool("exec", {"command": "cat", "background": True})).structured_content or {}
        sid = started["sessionId"]
        for action, more in (("write", {"data": "x\n"}), ("poll", {}), ("kill", {}), ("remove", {})):
            result = await client.call_tool("process", {"action": action, "sessionId": sid, **more})
            assert not result.is_error
    assert audited(tmp_path / "state")[1:] == [
        ("process", "write", sid),
        ("process", "kill", sid),
        ("process", "remove", sid),
    ]


def test_process_changes_over_rest_and_from_the_cli_are_audited(tmp_path: Path) -> None:
    served = start_daemon(tmp_path)
    try:

        def cli(*args: str) -> str:
            env = cli_env(HOME="/nonexistent", PROCPILOT_URL=served.url, PROCPILOT_TOKEN=TOKEN_A)
            done = subprocess.run([PROCPILOT, *args], env=env, capture_output=True, text=True, timeout=60, check=False)
            assert done.returncode == 0, done.stderr
            return done.stdout.strip()

        with httpx2.Client(base_url=served.url, headers={"Authorization": f"Bearer {TOKEN_A}"}) as http:
            rest = post(http, "exec", command="cat", background=True).json()["data"]["sessionId"]
            for action, more in (("write", {"data": "x\n"}), ("log", {}), ("kill", {}), ("remove", {})):
                assert post(http, "process", action=action, sessionId=rest, **more).status_code == 200
        by_cli = cli("run", "-d", "cat")
        cli("write", by_cli, "hello")
        cli("kill", by_cli)
        cli("rm", by_cli)
    finally:
        served.stop()
    changes = [row for row in audited(tmp_path / "state") if row[0] == "process"]
    expected: list[Any] = [("process", a, rest) for a in ("write", "kill", "remove")]
    expected += [("process", a, by_cli) for a in ("write", "kill", "remove")]
    assert changes == expected
