"""Named sessions through the exec/process tools, and what process list shows of each session."""

from __future__ import annotations

from typing import Any

from mcp import Client

from procpilot.engine.supervisor import Supervisor
from procpilot.faces.exec_process import exec_process_tools
from procpilot.transports.mcp import build_mcp_server


async def call(client: Client, tool: str, **args: Any) -> tuple[str, dict[str, Any], bool]:
    result = await client.call_tool(tool, args)
    return result.content[0].text, result.structured_content or {}, bool(result.is_error)  # type: ignore[union-attr]


async def test_every_action_takes_the_name_and_list_shows_pid_age_cpu_memory(supervisor: Supervisor) -> None:
    async with Client(build_mcp_server(exec_process_tools(supervisor), scope="a")) as client:
        script = "python3 -c 'x = sum(range(3_000_000)); print(\"ready\", flush=True); import time; time.sleep(30)'"
        _, started, _ = await call(client, "exec", command=script, background=True, name="web")
        assert started["sessionName"] == "web" and started["name"] == "web"
        _, waited, _ = await call(client, "process", action="wait", sessionId="web", pattern="ready", timeout=10_000)
        assert waited["reason"] == "pattern" and waited["sessionId"] == started["sessionId"]
        text, _, err = await call(client, "exec", command="true", name="web")
        assert err and text.startswith("SessionNameInUse")
        _, listing, _ = await call(client, "process", action="list")
        row = listing["sessions"][0]
        assert row["sessionName"] == "web" and row["pid"] == started["pid"]
        assert row["cpuMs"] > 0 and row["memoryBytes"] > 1 << 20 and row["startedAt"] > 0
        assert row["waitingForInput"] is False
        _, prefixed, _ = await call(client, "process", action="poll", sessionId=started["sessionId"][:6])
        assert prefixed["sessionId"] == started["sessionId"]
        _, killed, _ = await call(client, "process", action="kill", sessionId="web")
        assert killed["status"] == "killed"
