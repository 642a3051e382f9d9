"""One supervisor, every face: a process started through one face is the same process in all the others."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from mcp import Client

from procpilot.engine.supervisor import Supervisor
from procpilot.faces.all_tools import all_tools
from procpilot.faces.proc_protocol import ProcConfig, ProcHandler, ProcReadEvent, ProcState
from procpilot.faces.procs_client import ProcRequestError, ProcsAPI
from procpilot.transports.mcp import build_mcp_server

SCOPE = "agent-x"
Connect = Callable[[], Client]


@pytest.fixture
def connect(supervisor: Supervisor) -> Connect:
    """A client factory over every tool: the SDK's client must live in the test's own task."""
    server = build_mcp_server(all_tools(supervisor), scope=SCOPE)
    return lambda: Client(server)


async def call(client: Client, tool: str, **args: Any) -> dict[str, Any]:
    result = await client.call_tool(tool, args)
    data = result.structured_content or {}
    assert not result.is_error, data
    return data


async def call_error(client: Client, tool: str, **args: Any) -> dict[str, Any]:
    result = await client.call_tool(tool, args)
    assert result.is_error
    return result.structured_content or {}


async def test_every_tool_is_served_by_one_server(connect: Connect) -> None:
    async with connect() as client:
        names = {t.name for t in (await client.list_tools()).tools}
    assert names == {
        "exec",
        "process",
        "process.run",
        "process.monitor",
        "process.kill",
        "process.list",
        "process.logs",
    }


async def test_start_with_exec_read_with_process_logs(connect: Connect) -> None:
    async with connect() as client:
        done = await call(client, "exec", command="echo out; echo err >&2; exit 2")
        sid = done["sessionId"]
        logs = await call(client, "process.logs", process_id=sid)
        assert logs["stdout"] == "out\n" and logs["stderr"] == "err\n" and logs["state"] == "completed"
        monitor = await call(client, "process.monitor", process_id=sid)
        assert monitor["exit_code"] == 2 and monitor["command"] == "echo out; echo err >&2; exit 2"
        listed = await call(client, "process.list")
        assert [p["process_id"] for p in listed["processes"]] == [sid]


async def test_exec_background_is_killed_by_process_kill_and_seen_by_process(connect: Connect) -> None:
    async with connect() as client:
        started = await call(client, "exec", command="echo ready; sleep 30", background=True)
        sid = started["sessionId"]
        await call(client, "process", action="wait", sessionId=sid, pattern="ready", timeout=10_000)
        assert (await call(client, "process.monitor", process_id=sid))["state"] == "running"
        killed = await call(client, "process.kill", process_id=sid)
        assert killed["killed"] is True and killed["state"] == "killed"
        polled = await call(client, "process", action="poll", sessionId=sid)
        assert polled["status"] == "killed" and polled["output"] == "ready\n"


async def test_process_run_background_is_driven_by_the_process_tool(connect: Connect) -> None:
    async with connect() as client:
        started = await call(client, "process.run", command="read line; echo got $line", background=True)
        pid = started["process_id"]
        await call(client, "process", action="write", sessionId=pid, data="ping\n", eof=True)
        waited = await call(client, "process", action="wait", sessionId=pid, timeout=10_000)
        assert waited["status"] == "done"
        logs = await call(client, "process.logs", process_id=pid, stream="stdout")
        assert logs["stdout"] == "got ping\n" and logs["state"] == "completed"
        await call(client, "process", action="remove", sessionId=pid)
        err = await call_error(client, "process.monitor", process_id=pid)
        assert err["error"] == "ProcessNotFound"


async def test_start_with_proc_spawn_kill_with_process_kill(supervisor: Supervisor, connect: Connect) -> None:
    handler = ProcHandler(supervisor, SCOPE, ProcConfig())
    seen: list[ProcReadEvent] = []
    procs = ProcsAPI(handler)
    try:
        resp = await procs.spawn(["sh", "-c", "echo hello; exec sleep 30"], on_output=seen.append)
        proc_id = resp.proc_id or ""
        for _ in range(200):
            if seen:
                break
            await asyncio.sleep(0.02)
        async with connect() as client:
            monitor = await call(client, "process.monitor", process_id=proc_id)
            assert monitor["state"] == "running" and monitor["command"] == "sh -c 'echo hello; exec sleep 30'"
            killed = await call(client, "process.kill", process_id=proc_id)
            assert killed == {"killed": True, "signal_sent": "SIGTERM", "process_id": proc_id, "state": "killed"}
            logs = await call(client, "process.logs", process_id=proc_id)
            assert logs["stdout"] == "hello\n"
        status = await procs.status(proc_id)
        assert status.state is ProcState.STOPPED
        assert "".join(e.data for e in seen) == "hello\n"
        with pytest.raises(ProcRequestError) as info:
            await procs.write(proc_id, "late")
        assert info.value.code == "proc_dead"
    finally:
        procs.close()
        handler.close()


async def test_start_with_process_run_control_with_proc_messages(supervisor: Supervisor, connect: Connect) -> None:
    handler = ProcHandler(supervisor, SCOPE)
    procs = ProcsAPI(handler)
    try:
        async with connect() as client:
            started = await call(client, "process.run", command="cat", background=True)
            pid = started["process_id"]
            assert (await procs.status(pid)).state is ProcState.RUNNING
            await procs.write(pid, "via proc/write\n", eof=True)
            final = await procs.wait(pid, timeout=10)
            assert final.state is ProcState.STOPPED and final.exit_code == 0
            logs = await call(client, "process.logs", process_id=pid)
            assert logs["stdout"] == "via proc/write\n"
            other = await call(client, "process.run", command="sleep 30", background=True)
            killed = await procs.kill(other["process_id"], signal="SIGKILL")
            assert killed.state is ProcState.STOPPED
            assert (await call(client, "process.monitor", process_id=other["process_id"]))["state"] == "killed"
    finally:
        procs.close()
        handler.close()


async def test_states_agree_across_faces(supervisor: Supervisor, connect: Connect) -> None:
    handler = ProcHandler(supervisor, SCOPE)
    procs = ProcsAPI(handler)
    expectations = {
        "true": ("completed", "done", ProcState.STOPPED),
        "exit 5": ("completed", "error", ProcState.CRASHED),
    }
    try:
        async with connect() as client:
            for command, (spec000, spec002, spec003) in expectations.items():
                run = await call(client, "process.run", command=command)
                pid = run["process_id"]
                assert run["state"] == spec000
                # poll, not list: a foreground run is not listed (spec 004), every action takes its id
                polled = await call(client, "process", action="poll", sessionId=pid)
                assert polled["status"] == spec002
                assert (await procs.status(pid)).state is spec003
            timed = await call(client, "process.run", command="sleep 30", timeout=1)
            assert timed["state"] == "timed_out"
            assert (await procs.status(timed["process_id"])).state is ProcState.TIMEDOUT
    finally:
        procs.close()
        handler.close()


async def test_scopes_stay_apart_across_faces(supervisor: Supervisor, connect: Connect) -> None:
    other = ProcHandler(supervisor, "someone-else")
    try:
        async with connect() as client:
            started = await call(client, "process.run", command="sleep 30", background=True)
            resp = await other.handle({"type": "proc/status/req", "proc_id": started["process_id"]})
            assert resp["error"]["code"] == "unknown_proc"
            resp = await other.handle({"type": "proc/kill/req", "proc_id": started["process_id"]})
            assert resp["error"]["code"] == "unknown_proc"
            await call(client, "process.kill", process_id=started["process_id"], signal="SIGKILL")
    finally:
        other.close()
