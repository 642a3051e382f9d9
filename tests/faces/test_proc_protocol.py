"""proc/* messages (spec 003): the handler on real processes, and ProcsAPI on top of it."""

from __future__ import annotations

import asyncio
import re
import shutil
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from procpilot.config import Settings
from procpilot.engine.capture import Stream
from procpilot.engine.spawn import SpawnSpec
from procpilot.engine.states import SessionState
from procpilot.engine.supervisor import Supervisor
from procpilot.faces.proc_protocol import (
    PROC_STATE_OF,
    ProcConfig,
    ProcHandler,
    ProcKillRequest,
    ProcKillResponse,
    ProcReadEvent,
    ProcSpawnRequest,
    ProcSpawnResponse,
    ProcState,
    ProcStatusRequest,
    ProcStatusResponse,
    ProcWriteRequest,
    ProcWriteResponse,
)
from procpilot.faces.procs_client import ProcRequestError, ProcsAPI, SyncProcsAPI
from procpilot.sync import SyncSupervisor
from procpilot.transports.serve import proc_handler_factory

PY = sys.executable
PROGRAMS = Path(__file__).parent.parent / "programs"
SCOPE = "agent-p"


@pytest.fixture
async def handler(supervisor: Supervisor) -> AsyncIterator[ProcHandler]:
    h = ProcHandler(supervisor, SCOPE, ProcConfig(timeout=60))
    yield h
    h.close()


class Events:
    """Collects pushed events."""

    def __init__(self) -> None:
        self.items: list[dict[str, Any]] = []

    def __call__(self, event: dict[str, Any]) -> None:
        self.items.append(event)

    def text(self, proc_id: str, stream: str) -> str:
        return "".join(e["data"] for e in self.items if e["proc_id"] == proc_id and e["stream_type"] == stream)

    def of(self, proc_id: str) -> list[dict[str, Any]]:
        return [e for e in self.items if e["proc_id"] == proc_id]


async def spawn(handler: ProcHandler, cmd: list[str], **fields: Any) -> dict[str, Any]:
    return await handler.handle({"type": "proc/spawn/req", "id": "s1", "session_id": "sess", "cmd": cmd, **fields})


async def status(handler: ProcHandler, proc_id: str) -> dict[str, Any]:
    return await handler.handle({"type": "proc/status/req", "id": "st", "proc_id": proc_id})


async def wait_ended(handler: ProcHandler, proc_id: str, timeout: float = 10) -> dict[str, Any]:
    session = handler.sup.get(SCOPE, proc_id)
    assert await session.wait_finished(timeout)
    return await status(handler, proc_id)


# -- the messages ----------------------------------------------------------------------------------


def test_message_types_and_spec_fields() -> None:
    types = {
        ProcSpawnRequest: "proc/spawn/req",
        ProcSpawnResponse: "proc/spawn/resp",
        ProcWriteRequest: "proc/write/req",
        ProcWriteResponse: "proc/write/resp",
        ProcReadEvent: "proc/read/event",
        ProcKillRequest: "proc/kill/req",
        ProcKillResponse: "proc/kill/resp",
        ProcStatusRequest: "proc/status/req",
        ProcStatusResponse: "proc/status/resp",
    }
    for model, type_string in types.items():
        assert model.model_fields["type"].default == type_string
    assert {"session_id", "cmd", "cwd", "env", "stdin_mode", "timeout"} <= set(ProcSpawnRequest.model_fields)
    assert {"proc_id", "stream_type", "data"} <= set(ProcReadEvent.model_fields)
    assert "signal" in ProcKillRequest.model_fields and "proc_id" in ProcStatusRequest.model_fields
    assert [s.value for s in ProcState] == ["RUNNING", "STOPPED", "CRASHED", "TIMEDOUT"]
    assert set(PROC_STATE_OF) == set(SessionState)
    assert PROC_STATE_OF[SessionState.EXITED_OK] is ProcState.STOPPED
    assert PROC_STATE_OF[SessionState.EXITED_ERROR] is ProcState.CRASHED
    assert PROC_STATE_OF[SessionState.KILLED] is ProcState.STOPPED
    assert PROC_STATE_OF[SessionState.TIMED_OUT] is ProcState.TIMEDOUT
    assert PROC_STATE_OF[SessionState.FAILED_TO_START] is ProcState.CRASHED
    assert PROC_STATE_OF[SessionState.RUNNING] is PROC_STATE_OF[SessionState.QUEUED] is ProcState.RUNNING
    with pytest.raises(ValueError, match="signal"):
        ProcKillRequest(proc_id="x", signal="SIGHUP")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="stdin_mode"):
        ProcSpawnRequest(cmd=["x"], stdin_mode="tty")  # type: ignore[arg-type]


def test_config_defaults() -> None:
    config = ProcConfig()
    assert config.allowed_commands is None and config.timeout == 30
    assert config.max_output_bytes == 1024 * 1024 and config.max_procs == 10 and config.network_disabled is False


async def test_network_disabled_leaves_only_a_private_loopback(supervisor: Supervisor) -> None:
    import socket

    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        connect = (
            "import socket,sys\ntry:\n socket.create_connection(('127.0.0.1', int(sys.argv[1])), 2)\n"
            " print('connected')\nexcept OSError:\n print('refused')\n"
        )
        for disabled, expected in ((False, "connected"), (True, "refused")):
            procs = ProcsAPI(ProcHandler(supervisor, SCOPE, ProcConfig(network_disabled=disabled)))
            seen: list[str] = []
            argv = [sys.executable, "-c", connect, str(port)]
            p = await procs.spawn(argv, on_output=lambda event, into=seen: into.append(event.data))
            status = await procs.wait(p.proc_id, timeout=20)
            assert status.state is ProcState.STOPPED, (status, seen)
            assert "".join(seen).strip() == expected


# -- spawn, events, status ---------------------------------------------------------------------------


async def test_spawn_streams_events_in_order_and_status_after(handler: ProcHandler) -> None:
    events = Events()
    handler.subscribe(events)
    resp = await spawn(handler, [PY, str(PROGRAMS / "interleave.py"), "20"])
    assert resp["type"] == "proc/spawn/resp" and resp["id"] == "s1" and resp["error"] is None
    assert resp["session_id"] == "sess" and resp["state"] == "RUNNING" and isinstance(resp["pid"], int)
    proc_id = resp["proc_id"]
    done = await wait_ended(handler, proc_id)
    assert done["type"] == "proc/status/resp" and done["id"] == "st"
    assert done["state"] == "STOPPED" and done["exit_code"] == 0 and done["proc_id"] == proc_id
    out = [f"line {i} out\n" for i in range(0, 20, 2)]
    err = [f"line {i} err\n" for i in range(1, 20, 2)]
    assert events.text(proc_id, "stdout") == "".join(out)
    assert events.text(proc_id, "stderr") == "".join(err)
    mine = events.of(proc_id)
    assert [e["seq"] for e in mine] == list(range(len(mine)))
    assert all(e["type"] == "proc/read/event" and e["truncated"] is False for e in mine)
    # The program flushes each line and pauses: arrival order across the two streams is kept too.
    assert "".join(e["data"] for e in mine) == "".join(
        f"line {i} {'out' if i % 2 == 0 else 'err'}\n" for i in range(20)
    )


async def test_states_crashed_timedout_stopped(handler: ProcHandler) -> None:
    crashed = await spawn(handler, ["sh", "-c", "exit 3"])
    assert (await wait_ended(handler, crashed["proc_id"]))["state"] == "CRASHED"
    assert (await status(handler, crashed["proc_id"]))["exit_code"] == 3
    timed = await spawn(handler, ["sleep", "30"], timeout=0.3)
    assert (await wait_ended(handler, timed["proc_id"]))["state"] == "TIMEDOUT"
    killed = await spawn(handler, ["sleep", "30"])
    resp = await handler.handle({"type": "proc/kill/req", "id": "k", "proc_id": killed["proc_id"]})
    assert resp["type"] == "proc/kill/resp" and resp["id"] == "k" and resp["error"] is None
    assert resp["state"] == "STOPPED" and resp["signal_sent"] == "SIGTERM"
    running = await spawn(handler, ["sleep", "30"])
    assert (await status(handler, running["proc_id"]))["state"] == "RUNNING"
    resp = await handler.handle({"type": "proc/kill/req", "proc_id": running["proc_id"], "signal": "SIGKILL"})
    assert resp["state"] == "STOPPED" and resp["signal_sent"] == "SIGKILL"


async def test_config_timeout_is_the_default(supervisor: Supervisor) -> None:
    handler = ProcHandler(supervisor, SCOPE, ProcConfig(timeout=0.3))
    try:
        resp = await spawn(handler, ["sleep", "30"])
        assert (await wait_ended(handler, resp["proc_id"]))["state"] == "TIMEDOUT"
        resp = await spawn(handler, ["sleep", "0.6"], timeout=5)
        assert (await wait_ended(handler, resp["proc_id"]))["state"] == "STOPPED"
    finally:
        handler.close()


async def test_write_feeds_stdin_and_eof_closes_it(handler: ProcHandler) -> None:
    events = Events()
    handler.subscribe(events)
    resp = await spawn(handler, ["cat"])
    proc_id = resp["proc_id"]
    w1 = await handler.handle({"type": "proc/write/req", "id": "w1", "proc_id": proc_id, "data": "héllo\n"})
    assert w1["type"] == "proc/write/resp" and w1["id"] == "w1" and w1["error"] is None
    assert w1["bytes_written"] == len("héllo\n".encode()) and w1["stdin_closed"] is False
    w2 = await handler.handle({"type": "proc/write/req", "proc_id": proc_id, "data": "bye\n", "eof": True})
    assert w2["stdin_closed"] is True
    assert (await wait_ended(handler, proc_id))["state"] == "STOPPED"
    assert events.text(proc_id, "stdout") == "héllo\nbye\n"


async def test_stdin_mode_null_reads_eof(handler: ProcHandler) -> None:
    events = Events()
    handler.subscribe(events)
    resp = await spawn(handler, ["sh", "-c", "cat; echo after"], stdin_mode="null")
    assert (await wait_ended(handler, resp["proc_id"]))["state"] == "STOPPED"
    assert events.text(resp["proc_id"], "stdout") == "after\n"


async def test_a_split_utf8_character_arrives_whole(handler: ProcHandler) -> None:
    events = Events()
    handler.subscribe(events)
    code = (
        "import sys, time\n"
        "b = 'é€'.encode()\n"
        "for i in range(len(b)):\n"
        "    sys.stdout.buffer.write(b[i : i + 1]); sys.stdout.flush(); time.sleep(0.05)\n"
    )
    resp = await spawn(handler, [PY, "-c", code])
    await wait_ended(handler, resp["proc_id"])
    assert events.text(resp["proc_id"], "stdout") == "é€"
    assert all("\ufffd" not in e["data"] for e in events.of(resp["proc_id"]))


async def test_output_before_subscribing_is_not_lost(handler: ProcHandler, supervisor: Supervisor) -> None:
    # Output that is already in the session when the handler attaches is sent first, once.
    session = await supervisor.spawn(SpawnSpec(("sh", "-c", "printf early; sleep 0.3; printf late")), scope=SCOPE)
    await supervisor.wait(SCOPE, session.id, timeout=5, pattern=re.compile("early"))
    events = Events()
    handler.subscribe(events)
    handler._attach(session)
    await session.wait_finished(5)
    assert events.text(session.id, "stdout") == "earlylate"


async def test_max_output_bytes_stops_events_and_says_so(supervisor: Supervisor) -> None:
    handler = ProcHandler(supervisor, SCOPE, ProcConfig(max_output_bytes=100))
    events = Events()
    handler.subscribe(events)
    try:
        resp = await spawn(handler, [PY, "-c", "import sys\nfor i in range(50): print('x' * 19, flush=True)"])
        await wait_ended(handler, resp["proc_id"])
        mine = events.of(resp["proc_id"])
        assert sum(len(e["data"].encode()) for e in mine) == 100
        assert [e["truncated"] for e in mine].count(True) == 1 and mine[-1]["truncated"] is True
        assert mine[-1]["data"] == ""
        session = supervisor.get(SCOPE, resp["proc_id"])
        assert session.output[Stream.STDOUT].size == 1000  # all of it is still captured
    finally:
        handler.close()


async def test_a_failing_subscriber_does_not_stop_the_others(handler: ProcHandler) -> None:
    def broken(event: dict[str, Any]) -> None:
        raise RuntimeError("subscriber bug")

    events = Events()
    handler.subscribe(broken)
    remove = handler.subscribe(events)
    resp = await spawn(handler, ["echo", "still here"])
    await wait_ended(handler, resp["proc_id"])
    assert events.text(resp["proc_id"], "stdout") == "still here\n"
    remove()
    again = await spawn(handler, ["echo", "unheard"])
    await wait_ended(handler, again["proc_id"])
    assert events.of(again["proc_id"]) == []


# -- errors --------------------------------------------------------------------------------------------


async def test_unknown_proc(handler: ProcHandler) -> None:
    for kind, extra in (("status", {}), ("write", {"data": "x"}), ("kill", {})):
        resp = await handler.handle({"type": f"proc/{kind}/req", "id": kind, "proc_id": "nope", **extra})
        assert resp["type"] == f"proc/{kind}/resp" and resp["id"] == kind
        assert resp["error"]["code"] == "unknown_proc", kind
        assert resp["error"]["message"] and resp["error"]["hints"]


async def test_proc_dead_on_write_and_kill_after_exit(handler: ProcHandler) -> None:
    resp = await spawn(handler, ["true"])
    await wait_ended(handler, resp["proc_id"])
    write = await handler.handle({"type": "proc/write/req", "proc_id": resp["proc_id"], "data": "x"})
    assert write["error"]["code"] == "proc_dead"
    kill = await handler.handle({"type": "proc/kill/req", "proc_id": resp["proc_id"]})
    assert kill["error"]["code"] == "proc_dead"


async def test_write_to_closed_stdin_of_a_live_process(handler: ProcHandler) -> None:
    resp = await spawn(handler, ["sleep", "30"], stdin_mode="null")
    write = await handler.handle({"type": "proc/write/req", "proc_id": resp["proc_id"], "data": "x"})
    assert write["error"]["code"] == "stdin_closed"
    await handler.handle({"type": "proc/kill/req", "proc_id": resp["proc_id"], "signal": "SIGKILL"})


async def test_proc_limit(supervisor: Supervisor) -> None:
    handler = ProcHandler(supervisor, SCOPE, ProcConfig(max_procs=2))
    try:
        first = await spawn(handler, ["sleep", "30"])
        second = await spawn(handler, ["sleep", "30"])
        third = await spawn(handler, ["sleep", "30"])
        assert third["error"]["code"] == "proc_limit" and third["proc_id"] is None
        assert "max_procs" in third["error"]["message"]
        await handler.handle({"type": "proc/kill/req", "proc_id": first["proc_id"], "signal": "SIGKILL"})
        fourth = await spawn(handler, ["sleep", "30"])
        assert fourth["error"] is None
        for resp in (second, fourth):
            await handler.handle({"type": "proc/kill/req", "proc_id": resp["proc_id"], "signal": "SIGKILL"})
    finally:
        handler.close()


async def test_allowed_commands(supervisor: Supervisor) -> None:
    handler = ProcHandler(supervisor, SCOPE, ProcConfig(allowed_commands=["echo"]))
    try:
        refused = await spawn(handler, ["python3", "-c", "print(1)"])
        assert refused["error"]["code"] == "command_not_allowed" and "'python3'" in refused["error"]["message"]
        ok = await spawn(handler, ["echo", "fine"])
        assert ok["error"] is None
        echo = shutil.which("echo")
        assert echo is not None
        by_path = await spawn(handler, [echo, "fine"])
        assert by_path["error"] is None
        impostor = await spawn(handler, ["/tmp/echo", "x"])
        assert impostor["error"]["code"] == "command_not_allowed"
        await wait_ended(handler, ok["proc_id"])
        await wait_ended(handler, by_path["proc_id"])
    finally:
        handler.close()


async def test_spawn_errors(handler: ProcHandler, tmp_path: Path) -> None:
    cases: list[tuple[dict[str, Any], str]] = [
        ({"cmd": ["no-such-binary-qq"]}, "command_not_found"),
        ({"cmd": ["true"], "cwd": str(tmp_path)}, "path_out_of_scope"),
        ({"cmd": ["true"], "cwd": "../.."}, "path_out_of_scope"),
        ({"cmd": ["true"], "env": {"LD_PRELOAD": "/x.so"}}, "protected_variable"),
        ({"cmd": ["true"], "env": {"PATH": "/x"}}, "protected_variable"),
        ({"cmd": []}, "invalid_request"),
        ({"cmd": "true"}, "invalid_request"),
        ({"cmd": ["true"], "timeout": 0}, "invalid_request"),
        ({"cmd": ["true"], "surprise": 1}, "invalid_request"),
    ]
    for fields, code in cases:
        resp = await handler.handle({"type": "proc/spawn/req", "id": "e", **fields})
        assert resp["type"] == "proc/spawn/resp" and resp["id"] == "e"
        assert resp["error"]["code"] == code, (fields, resp["error"])
        assert resp["proc_id"] is None


async def test_unknown_message_type(handler: ProcHandler) -> None:
    resp = await handler.handle({"type": "proc/explode/req", "id": "x"})
    assert resp["type"] == "proc/explode/resp" and resp["error"]["code"] == "invalid_request"
    resp = await handler.handle({"id": "y"})
    assert resp["type"] == "proc/error" and resp["id"] == "y" and resp["error"]["code"] == "invalid_request"


# -- ProcsAPI --------------------------------------------------------------------------------------------


async def test_procs_api_round_trip(handler: ProcHandler) -> None:
    seen: list[ProcReadEvent] = []
    async with ProcsAPI(handler, session_id="s-1") as procs:
        resp = await procs.spawn(["cat"], on_output=seen.append)
        assert isinstance(resp, ProcSpawnResponse) and resp.session_id == "s-1" and resp.state is ProcState.RUNNING
        written = await procs.write(resp.proc_id or "", "ping\n")
        assert written.bytes_written == 5
        assert (await procs.status(resp.proc_id or "")).state is ProcState.RUNNING
        await procs.write(resp.proc_id or "", "pong\n", eof=True)
        final = await procs.wait(resp.proc_id or "", timeout=10)
        assert final.state is ProcState.STOPPED and final.exit_code == 0
        assert "".join(e.data for e in seen) == "ping\npong\n"
        assert {e.stream_type for e in seen} == {"stdout"} and all(e.proc_id == resp.proc_id for e in seen)


async def test_procs_api_kill_and_errors(handler: ProcHandler) -> None:
    procs = ProcsAPI(handler)
    resp = await procs.spawn(["sleep", "30"])
    killed = await procs.kill(resp.proc_id or "", signal="SIGINT")
    assert killed.state is ProcState.STOPPED and killed.signal_sent == "SIGINT"
    with pytest.raises(ProcRequestError) as info:
        await procs.write(resp.proc_id or "", "x")
    assert info.value.code == "proc_dead"
    with pytest.raises(ProcRequestError) as info:
        await procs.status("nope")
    assert info.value.code == "unknown_proc" and info.value.hints
    with pytest.raises(ProcRequestError) as info:
        await procs.spawn(["no-such-binary-qq"])
    assert info.value.code == "command_not_found"
    procs.close()


async def test_ten_thousand_lines_reach_on_output_complete_and_in_order(handler: ProcHandler) -> None:
    seen: list[ProcReadEvent] = []
    procs = ProcsAPI(handler)
    code = "import sys\nw = sys.stdout.write\nfor i in range(10000): w(f'line {i}\\n')\n"
    resp = await procs.spawn([PY, "-c", code], on_output=seen.append)
    final = await procs.wait(resp.proc_id or "", timeout=30)
    assert final.state is ProcState.STOPPED
    assert "".join(e.data for e in seen).split("\n") == [f"line {i}" for i in range(10000)] + [""]
    assert [e.seq for e in seen] == list(range(len(seen)))
    procs.close()


async def test_ten_thousand_flushed_lines_on_both_streams(handler: ProcHandler) -> None:
    seen: list[ProcReadEvent] = []
    procs = ProcsAPI(handler)
    code = (
        "import sys\n"
        "for i in range(10000):\n"
        "    s = sys.stdout if i % 2 == 0 else sys.stderr\n"
        "    s.write(f'{i}\\n'); s.flush()\n"
    )
    resp = await procs.spawn([PY, "-c", code], on_output=seen.append)
    await procs.wait(resp.proc_id or "", timeout=60)
    out = "".join(e.data for e in seen if e.stream_type == "stdout")
    err = "".join(e.data for e in seen if e.stream_type == "stderr")
    assert out == "".join(f"{i}\n" for i in range(0, 10000, 2))
    assert err == "".join(f"{i}\n" for i in range(1, 10000, 2))
    procs.close()


class EarlyTransport:
    """A transport that pushes a process's first events before its spawn response (as a network may)."""

    def __init__(self) -> None:
        self.callbacks: list[Callable[[dict[str, Any]], None]] = []

    async def send(self, request: dict[str, Any]) -> dict[str, Any]:
        if request["type"] == "proc/spawn/req":
            for seq, text in enumerate(["a", "b"]):
                for cb in self.callbacks:
                    cb({"type": "proc/read/event", "proc_id": "p1", "stream_type": "stdout", "data": text, "seq": seq})
            # And one of somebody else's process, which must not leak into ours.
            for cb in self.callbacks:
                cb({"type": "proc/read/event", "proc_id": "other", "stream_type": "stdout", "data": "z", "seq": 0})
            await asyncio.sleep(0)
            return {"type": "proc/spawn/resp", "id": request["id"], "proc_id": "p1", "state": "RUNNING"}
        raise AssertionError(request)

    def on_event(self, callback: Callable[[dict[str, Any]], None]) -> Callable[[], None]:
        self.callbacks.append(callback)
        return lambda: self.callbacks.remove(callback)

    def push(self, data: str, seq: int) -> None:
        for cb in self.callbacks:
            cb({"type": "proc/read/event", "proc_id": "p1", "stream_type": "stdout", "data": data, "seq": seq})


async def test_events_before_the_spawn_response_are_replayed_in_order() -> None:
    transport = EarlyTransport()
    seen: list[str] = []
    procs = ProcsAPI(transport)
    resp = await procs.spawn(["x"], on_output=lambda e: seen.append(e.data))
    assert resp.proc_id == "p1"
    transport.push("c", 2)
    assert seen == ["a", "b", "c"]
    assert procs._early == {}  # nothing held for processes that are not ours
    transport.push("d", 3)
    assert seen == ["a", "b", "c", "d"]
    procs.close()
    transport.push("e", 4)
    assert seen == ["a", "b", "c", "d"] and transport.callbacks == []


async def test_a_failing_on_output_callback_does_not_break_delivery(handler: ProcHandler) -> None:
    calls: list[str] = []

    def flaky(event: ProcReadEvent) -> None:
        calls.append(event.data)
        raise RuntimeError("callback bug")

    procs = ProcsAPI(handler)
    resp = await procs.spawn(["sh", "-c", "echo one; sleep 0.1; echo two"], on_output=flaky)
    final = await procs.wait(resp.proc_id or "", timeout=10)
    assert final.state is ProcState.STOPPED and "".join(calls) == "one\ntwo\n"
    procs.close()


async def test_spec003_max_procs_holds_per_agent_across_connections(supervisor: Supervisor) -> None:
    """Spec 003's ``max_procs``, per agent: the daemon's handlers (one per WebSocket) share the
    count, so one agent on two connections cannot run twice the limit (it once ran 6 of 3); another
    agent has its own."""
    limited = supervisor.settings.proc.model_copy(update={"max_procs": 1})
    factory = proc_handler_factory(supervisor.settings.model_copy(update={"proc": limited}))
    first, second, other = (factory(supervisor, agent) for agent in (SCOPE, SCOPE, "other"))
    try:
        running = await spawn(first, ["sleep", "30"])
        refused = await spawn(second, ["sleep", "30"])
        assert running["error"] is None and refused["error"]["code"] == "proc_limit"
        elsewhere = await spawn(other, ["sleep", "30"])
        assert elsewhere["error"] is None
        for handler, resp in ((first, running), (other, elsewhere)):
            await handler.handle({"type": "proc/kill/req", "proc_id": resp["proc_id"], "signal": "SIGKILL"})
    finally:
        for handler in (first, second, other):
            handler.close()


def test_spec003_procsapi_example_is_synchronous(settings: Settings) -> None:
    """Spec 003's ProcsAPI example calls ``procs.spawn``, ``write``, ``kill`` and ``status``
    without ``await``: ``SyncProcsAPI`` runs it so (the client was async only)."""
    seen: list[str] = []
    with SyncSupervisor(settings) as sup, SyncProcsAPI(sup, SCOPE) as procs:
        resp = procs.spawn(["cat"], on_output=lambda event: seen.append(event.data))
        procs.write(resp.proc_id, "input data\n", eof=True)
        assert procs.wait(resp.proc_id, timeout=10).state is ProcState.STOPPED
        assert "".join(seen) == "input data\n"
        other = procs.spawn(["sleep", "30"])
        assert procs.status(other.proc_id).state is ProcState.RUNNING
        procs.kill(other.proc_id, signal="SIGKILL")
        status = procs.wait(other.proc_id, timeout=10)
        assert status.state is ProcState.STOPPED and status.exit_code is None
