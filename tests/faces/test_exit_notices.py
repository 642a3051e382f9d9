"""Exits an agent was not told of head its next result: once, bounded, and never twice."""

from __future__ import annotations

from procpilot.contract import ToolSpec
from procpilot.engine.supervisor import Supervisor
from procpilot.faces.exec_process import exec_process_tools
from procpilot.faces.exit_notices import MAX_PER_AGENT, ExitNotices


def wrapped(supervisor: Supervisor) -> tuple[dict[str, ToolSpec], ExitNotices]:
    notices = ExitNotices(supervisor)
    return {spec.name: notices.wrap(spec) for spec in exec_process_tools(supervisor)}, notices


async def run_in_background(supervisor: Supervisor, command: str, scope: str) -> str:
    """Start ``command`` through the bare face (no result of it tells exits) and wait for its end."""
    bare = {spec.name: spec for spec in exec_process_tools(supervisor)}
    started = await bare["exec"].call({"command": command, "background": True}, scope)
    await supervisor.get(scope, started.data["sessionId"]).wait_finished(10)
    return str(started.data["sessionId"])


async def test_untold_exits_are_bounded_and_the_rest_counted(supervisor: Supervisor) -> None:
    tools, notices = wrapped(supervisor)
    try:
        count = MAX_PER_AGENT + 6
        for n in range(count):
            await run_in_background(supervisor, f"exit {n % 3}", "a")
        told = await tools["exec"].call({"command": "true"}, "a")
        assert len(told.data["exits"]) == MAX_PER_AGENT and told.data["exitsDropped"] == 6
        assert told.text.split("\n")[MAX_PER_AGENT] == "[6 more sessions ended; process list shows them all]"
        assert "exits" not in (await tools["exec"].call({"command": "true"}, "a")).data  # once
    finally:
        notices.close()


async def test_a_result_that_shows_the_end_tells_it_itself(supervisor: Supervisor) -> None:
    tools, notices = wrapped(supervisor)
    try:
        sid = await run_in_background(supervisor, "exit 2", "a")
        other = await run_in_background(supervisor, "exit 5", "b")
        polled = await tools["process"].call({"action": "poll", "sessionId": sid}, "a")
        assert polled.data["status"] == "error" and "exits" not in polled.data
        assert "exits" not in (await tools["exec"].call({"command": "true"}, "a")).data
        # Another agent's exits are its own.
        told = await tools["exec"].call({"command": "true"}, "b")
        assert [e["sessionId"] for e in told.data["exits"]] == [other]
    finally:
        notices.close()
