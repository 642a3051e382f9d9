"""``tools/call`` answered on the stdio transport without the SDK's dispatch (transports/mcp_direct.py):
the same JSON the SDK would write, cancellation as the SDK does it, and only the calls it may take."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from mcp_types import JSONRPCResponse

from procpilot.contract import ToolResult
from procpilot.transports.mcp_direct import MODERN, SHAPED_ALIKE, DirectCalls
from tests.daemon import JsonLines, cli_env
from tests.engine.test_supervisor import alive

PROCPILOT = str(Path(sys.executable).parent / "procpilot")
# Volatile fields of a result: everything else must be identical whichever path answered.
_VOLATILE = {"sessionId", "pid", "durationMs"}


class Bare(JsonLines):
    """A bare JSON-RPC client on a real ``procpilot mcp``'s pipes: the handshake of ``version``,
    or for 2026-07-28 a ``server/discover`` under the envelope every request then carries."""

    def __init__(self, tmp_path: Path, version: str, *, stderr: int | None = None) -> None:
        super().__init__()
        env = cli_env(
            HOME=str(tmp_path), PROCPILOT_STATE_DIR=str(tmp_path / "state"), PROCPILOT_WORKSPACE=str(tmp_path)
        )
        args = [PROCPILOT, "mcp", "--agent", "t"]
        self.server = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, env=env)
        client = {"name": "t", "version": "0"}
        self.envelope: dict[str, Any] | None = None
        if version == MODERN:
            self.envelope = {
                "io.modelcontextprotocol/protocolVersion": version,
                "io.modelcontextprotocol/clientInfo": client,
                "io.modelcontextprotocol/clientCapabilities": {},
            }
            self.send({"jsonrpc": "2.0", "id": 0, "method": "server/discover", "params": {"_meta": self.envelope}})
            assert "result" in self.reply()
            return
        hello = {"protocolVersion": version, "capabilities": {}, "clientInfo": client}
        self.send({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": hello})
        assert self.reply()["result"]["protocolVersion"] == version
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        # The reply above may be the handshake's front's (transports/mcp_handshake.py), written
        # before the server loaded: calls are answered directly once the server's own reply to
        # initialize went out, which the reply to a ping after it tells.
        self.send({"jsonrpc": "2.0", "id": "settled", "method": "ping"})
        assert self.reply()["id"] == "settled"

    def params(self, params: dict[str, Any], *, through_sdk: bool = False) -> dict[str, Any]:
        """A call's params as this client sends them; ``through_sdk``: with a ``_meta`` that keeps
        the call on the SDK's path (one the direct path has not seen the SDK accept)."""
        if self.envelope is None:
            return params | ({"_meta": {}} if through_sdk else {})
        other = {"io.modelcontextprotocol/clientInfo": {"name": "t", "version": "1"}} if through_sdk else {}
        return params | {"_meta": self.envelope | other}

    def call(self, request_id: int, params: dict[str, Any]) -> dict[str, Any]:
        self.send({"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params})
        return self.reply()

    def close(self) -> None:
        assert self.server.stdin is not None and self.server.stdout is not None
        self.server.stdin.close()
        assert self.server.wait(timeout=30) == 0
        self.server.stdout.close()


@pytest.fixture
def bare(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Bare]:
    client = Bare(tmp_path, getattr(request, "param", "2025-06-18"))
    try:
        yield client
    finally:
        client.close()


def _masked(result: dict[str, Any]) -> Any:
    """``result`` with what differs from one session to the next (its id, pid and duration,
    wherever they appear) masked."""
    data = result.get("structuredContent", {})
    tokens = [str(data[k]) for k in ("sessionId", "pid") if data.get(k) is not None]

    def mask(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: "*" if k in _VOLATILE else mask(v) for k, v in value.items()}
        if isinstance(value, list):
            return [mask(v) for v in value]
        if isinstance(value, str):
            for token in tokens:
                value = value.replace(token, "*")
            return re.sub(r"after \d+ ms", "after * ms", value)
        return value

    return mask(result)


@pytest.mark.parametrize("bare", [*sorted(SHAPED_ALIKE), MODERN], indirect=True)
@pytest.mark.parametrize(
    "arguments",
    [
        {"command": "printf 'h\\xc3\\xa9\\n'; echo err >&2; exit 3"},  # an exit code, stderr, non-ASCII
        {"comand": "typo"},  # a typed error result
        {"command": "sleep 5", "yieldMs": 10},  # backgrounded
    ],
)
def test_a_direct_reply_is_what_the_sdk_would_have_written(bare: Bare, arguments: dict[str, Any]) -> None:
    direct = bare.call(1, bare.params({"name": "exec", "arguments": arguments}))
    through_sdk = bare.call(2, bare.params({"name": "exec", "arguments": arguments}, through_sdk=True))
    assert direct["id"] == 1 and through_sdk["id"] == 2
    assert _masked(direct["result"]) == _masked(through_sdk["result"])
    assert set(direct) == set(through_sdk) == {"jsonrpc", "id", "result"}


@pytest.mark.parametrize("bare", ["2025-06-18", MODERN], indirect=True)
@pytest.mark.parametrize("through_sdk", [False, True], ids=["direct", "sdk"])
def test_a_cancelled_call_is_never_answered(bare: Bare, through_sdk: bool) -> None:
    # Uncancelled, this call would be answered after a second.
    call = {"name": "exec", "arguments": {"command": "sleep 1", "yieldMs": 60000}}
    params = bare.params(call, through_sdk=through_sdk)
    bare.send({"jsonrpc": "2.0", "id": "long", "method": "tools/call", "params": params})
    bare.send({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": bare.params({"requestId": "long"})})
    bare.send({"jsonrpc": "2.0", "id": 7, "method": "tools/list", "params": bare.params({})})
    listed = bare.reply()  # the next line is this answer, not the cancelled call's
    assert listed["id"] == 7 and "tools" in listed["result"]
    assert bare.quiet(2.5)  # and nothing more came


def _started(pidfile: Path) -> int:
    """The pid a call's command wrote to ``pidfile`` (once it has: the call runs)."""
    deadline = time.monotonic() + 30
    while not pidfile.exists() or not pidfile.read_text().strip():
        assert time.monotonic() < deadline, "the call's command never started"
        time.sleep(0.01)
    return int(pidfile.read_text())


def _ended(pid: int, timeout: float = 15) -> bool:
    deadline = time.monotonic() + timeout
    while alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_closing_stdin_ends_the_calls_running_unanswered(tmp_path: Path) -> None:
    bare = Bare(tmp_path, "2025-06-18", stderr=subprocess.PIPE)
    assert bare.server.stdin is not None and bare.server.stdout is not None and bare.server.stderr is not None
    pidfile = tmp_path / "pid"
    call = {"name": "exec", "arguments": {"command": f"echo $$ > {pidfile}; sleep 30; echo late", "yieldMs": 60000}}
    bare.send({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": call})
    shell = _started(pidfile)
    bare.server.stdin.close()
    assert bare.server.wait(timeout=15) == 0  # not the 30 s the call would take
    assert bare.rest() == b""  # the call ended with the connection: never answered
    bare.server.stdout.close()
    with bare.server.stderr:  # nor did it try to write its result after the connection's end
        assert b"Error" not in bare.server.stderr.read()
    assert _ended(shell)


def test_unknown_tools_and_malformed_calls_still_get_the_sdks_answers(bare: Bare) -> None:
    unknown = bare.call(1, {"name": "nosuch", "arguments": {}})
    assert unknown["result"]["isError"] is True and "nosuch" in unknown["result"]["content"][0]["text"]
    no_name = bare.call(2, {"arguments": {}})
    assert no_name["error"]["code"] == -32602
    bad_arguments = bare.call(3, {"name": "exec", "arguments": ["not", "an", "object"]})
    assert "error" in bad_arguments
    # a name that is no string (nor any dict's key): it once raised out of the direct path and ended the server
    for request_id, name in ((4, ["exec"]), (5, {"tool": "exec"})):
        assert bare.call(request_id, {"name": name, "arguments": {}})["error"]["code"] == -32602
    assert bare.call(6, {"name": "exec", "arguments": {"command": "true"}})["result"]["isError"] is False


# -- which lines are taken ---------------------------------------------------------------------


def _line(message: dict[str, Any]) -> bytes:
    return json.dumps(message).encode()


def _handshake(calls: DirectCalls) -> None:
    hello = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}
    assert not calls.take(_line({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": hello}))

    calls.saw_reply(JSONRPCResponse(jsonrpc="2.0", id=0, result={"protocolVersion": "2025-06-18"}))
    assert not calls.active  # not before notifications/initialized
    assert not calls.take(_line({"jsonrpc": "2.0", "method": "notifications/initialized"}))
    assert calls.active


class _Held:
    """A tool whose calls run until ``release`` is set (a cancelled one still returns a result),
    and what the direct path writes back."""

    def __init__(self) -> None:
        self.started: list[dict[str, Any]] = []
        self.ended: list[dict[str, Any]] = []  # the calls that ended, however (a cancel too)
        self.release = asyncio.Event()
        self.replies: list[dict[str, Any]] = []
        self.replied = asyncio.Event()

    async def tool(self, arguments: dict[str, Any]) -> ToolResult:
        self.started.append(arguments)
        try:
            await self.release.wait()
        except asyncio.CancelledError:  # as a tool that ends its process tree, then tells what it saw
            await asyncio.sleep(0)
            self.ended.append(arguments)
            return ToolResult("cancelled", {"cancelled": True})
        self.ended.append(arguments)
        return ToolResult(json.dumps(arguments), dict(arguments))

    async def send(self, data: bytes) -> None:
        self.replies.append(json.loads(data))
        self.replied.set()

    async def until_started(self, count: int) -> None:
        await _turns(lambda: len(self.started) >= count)


async def _turns(check: Callable[[], bool]) -> None:
    """Turns of the loop until ``check()`` (a task started by take() runs on the next turn)."""
    for _ in range(100):
        if check():
            return
        await asyncio.sleep(0)
    raise AssertionError("not within 100 turns of the loop")


def _call(request_id: object, **params: Any) -> bytes:
    return _line({"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params})


def _cancel(request_id: object) -> bytes:
    return _line({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": request_id}})


async def test_only_plain_calls_of_known_tools_after_the_handshake_are_taken() -> None:
    held = _Held()
    calls = DirectCalls({"exec": held.tool}, held.send, limit=2)
    assert not calls.take(_call(1, name="exec", arguments={}))  # before the handshake: the SDK's
    _handshake(calls)
    assert calls.take(_call(1, name="exec", arguments={"command": "true"}))
    assert not calls.take(_call(1, name="exec", arguments={}))  # an id in use
    assert not calls.take(_call(2, name="exec", arguments={}, _meta={"progressToken": 1}))
    assert not calls.take(_call(3, name="nosuch", arguments={}))
    assert not calls.take(_call(4, name="exec", arguments=[]))
    assert not calls.take(_call(True, name="exec", arguments={}))  # not an id
    assert not calls.take(b'{"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": {')  # not JSON
    assert not calls.take(_call(6, name=["exec"], arguments={}))  # a name no tool has (and no dict key)
    assert not calls.take(b"\xef\xbb\xbf" + _call(7, name="exec"))  # a BOM: the SDK's parser refuses it
    assert calls.take(_call("1", name="exec"))  # "1" is not 1; no arguments is {}
    assert not calls.take(_call(5, name="exec", arguments={}))  # the limit (2) is reached: the SDK's
    await held.until_started(2)
    assert held.started == [{"command": "true"}, {}]
    assert not calls.take(_cancel(9))
    assert calls.take(_cancel(1))
    held.release.set()
    await held.replied.wait()
    assert [(reply["id"], reply["result"]["structuredContent"]) for reply in held.replies] == [("1", {})]
    assert len(held.ended) == 2  # the cancelled call ended too, with a result, unanswered


async def test_a_call_cancelled_before_it_ran_is_never_answered_and_frees_its_id() -> None:
    held = _Held()
    calls = DirectCalls({"exec": held.tool}, held.send)
    _handshake(calls)
    assert calls.take(_call(1, name="exec", arguments={"n": 1}))
    assert calls.take(_cancel(1))  # in the same read as the call: its task has not run yet
    assert calls.take(_cancel(1))  # a second cancel of it: still ours, and harmless
    await _turns(lambda: calls.take(_call(1, name="exec", arguments={"n": 2})))  # the id is free once it ended
    held.release.set()
    await held.replied.wait()
    assert held.started == [{"n": 2}] and [reply["id"] for reply in held.replies] == [1]
    assert held.replies[0]["result"]["structuredContent"] == {"n": 2}


async def test_the_connections_end_cancels_every_call_and_waits_for_it() -> None:
    held = _Held()
    calls = DirectCalls({"exec": held.tool}, held.send)
    owner = asyncio.ensure_future(calls.run())
    _handshake(calls)
    assert calls.take(_call(1, name="exec", arguments={}))
    assert calls.take(_call(2, name="exec", arguments={}))
    await held.until_started(2)
    owner.cancel()
    with pytest.raises(asyncio.CancelledError):
        await owner
    assert len(held.ended) == 2 and held.replies == []  # both ended (with results) before the owner did, unanswered
    assert not calls.take(_call(3, name="exec", arguments={}))  # and no call starts any more


async def test_the_connections_end_cancels_a_call_writing_its_reply_too() -> None:
    async def tool(arguments: dict[str, Any]) -> ToolResult:
        return ToolResult("ok", {})

    writing, cancelled = asyncio.Event(), asyncio.Event()

    async def send(data: bytes) -> None:  # a client that reads no more: the reply waits for the pipe
        writing.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            await asyncio.sleep(0)  # its end takes a turn of the loop: the owner waits for it
            cancelled.set()
            raise

    calls = DirectCalls({"exec": tool}, send)
    owner = asyncio.ensure_future(calls.run())
    _handshake(calls)
    assert calls.take(_call(1, name="exec", arguments={}))
    await writing.wait()
    owner.cancel()
    with pytest.raises(asyncio.CancelledError):
        await owner
    assert cancelled.is_set()


async def test_a_call_that_fails_past_its_tool_ends_the_connection_with_its_error() -> None:
    async def tool(arguments: dict[str, Any]) -> ToolResult:
        return ToolResult("ok", {})

    async def send(data: bytes) -> None:
        raise OSError(9, "the reply could not be written")

    calls = DirectCalls({"exec": tool}, send)
    _handshake(calls)
    assert calls.take(_call(1, name="exec", arguments={}))
    with pytest.raises(OSError, match="could not be written"):
        await asyncio.wait_for(calls.run(), timeout=10)


async def test_a_2026_call_is_taken_only_under_an_envelope_the_sdk_accepted() -> None:
    held = _Held()
    calls = DirectCalls({"exec": held.tool}, held.send)
    envelope = {"io.modelcontextprotocol/protocolVersion": MODERN, "io.modelcontextprotocol/clientInfo": {"name": "t"}}

    def call(request_id: int, meta: dict[str, Any]) -> bytes:
        params = {"name": "exec", "arguments": {}, "_meta": meta}
        return _line({"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params})

    discover = {"jsonrpc": "2.0", "id": 0, "method": "server/discover", "params": {"_meta": envelope}}
    assert not calls.take(_line(discover))
    assert not calls.take(call(1, envelope))  # not accepted yet: the SDK's
    calls.saw_reply(JSONRPCResponse(jsonrpc="2.0", id=0, result={"_meta": {}}))  # no stamp: not enough
    assert not calls.take(call(2, envelope))
    assert not calls.take(_line(discover | {"id": 3}))
    stamped = {"_meta": {"io.modelcontextprotocol/serverInfo": {"name": "procpilot", "version": "1"}}}
    calls.saw_reply(JSONRPCResponse(jsonrpc="2.0", id=3, result=stamped))
    assert calls.active
    assert calls.take(call(4, envelope))
    assert not calls.take(call(5, envelope | {"progressToken": 1}))  # anything else: the SDK's
    assert not calls.take(_line({"jsonrpc": "2.0", "id": 6, "method": "tools/call", "params": {"name": "exec"}}))
    await held.until_started(1)
    held.release.set()
    await held.replied.wait()
    assert [reply["id"] for reply in held.replies] == [4]
    assert held.replies[0]["result"]["_meta"] == stamped["_meta"]
