"""Restart policies through the tools: exec's restart/maxRestarts, the config default, process.run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mcp import Client

from procpilot.config import load_settings
from procpilot.engine.supervisor import Supervisor
from procpilot.faces.all_tools import all_tools
from procpilot.transports.mcp import build_mcp_server


async def call(client: Client, tool: str, **args: Any) -> dict[str, Any]:
    result = await client.call_tool(tool, args)
    assert not result.is_error, result.content
    return result.structured_content or {}


async def test_exec_restart_keeps_the_session_and_its_log(tmp_path: Path, workspace: Path) -> None:
    # restart="on-failure" by default for background runs, 10 ms before the first restart.
    exec_ = {"restart": "on-failure", "restart_backoff_ms": 10, "max_restarts": 2}
    settings = load_settings(env={}, state_dir=tmp_path / "state", workspace_root=workspace, exec=exec_)
    async with Supervisor(settings) as sup, Client(build_mcp_server(all_tools(sup), scope="a")) as client:
        started = await call(client, "exec", command="echo crash; exit 1", background=True)
        sid = started["sessionId"]
        waited = await call(client, "process", action="wait", sessionId=sid, timeout=20_000)
        assert (waited["reason"], waited["status"], waited["restarts"]) == ("exited", "error", 2)
        log = await call(client, "process", action="log", sessionId=sid)
        assert log["output"].count("crash") == 3 and "restart 2 of 2" in log["output"]
        listed = await call(client, "process", action="list")
        assert listed["sessions"][0]["restarts"] == 2
        foreground = await call(client, "exec", command="exit 1")  # the default is for background runs
        assert "restarts" not in foreground
        told = await call(client, "exec", command="echo up", background=True, restart="always", maxRestarts=1)
        waited = await call(client, "process", action="wait", sessionId=told["sessionId"], timeout=20_000)
        assert (waited["status"], waited["restarts"]) == ("done", 1)
        run = await call(client, "process.run", command="sleep 30", background=True, restart="always")
        killed = await call(client, "process.kill", process_id=run["process_id"])
        assert killed["state"] == "killed"
        assert sup.get("a", run["process_id"]).restarts == 0  # a kill ends it for good
