"""``tools/call`` answered on the stdio transport itself, without the SDK's request dispatch.

After idle, an ``exec true`` over MCP stdio cost 2.3x a raw ``sh -c true`` where a ``ping`` through
the same server cost 0.8x: the difference was the SDK's path for a call (a pydantic parse of the
message, two memory-stream hops, the dual-era dispatcher, a ``Context``, the result's conversion
through three pydantic models), ~0.6 ms a call, paid again after each idle gap as cold code (the
result's conversion alone: 5 µs back to back, 350 µs after 100 ms of idle). A call the SDK would
answer as a plain function call is answered here instead: the tool runs in a task of its own and
its result is written as the JSON the SDK writes for it, field for field, in every protocol version
this path serves (tests/transports/test_mcp_direct.py compares the two for each).

Only what needs nothing else of the SDK goes this way, and everything else goes to the SDK
untouched: a ``tools/call`` whose params are a known tool's ``name`` and its ``arguments``, an id
not already in use, at most ``limit`` such calls at once, and either a handshake-era connection
(``initialize`` answered with a version in ``SHAPED_ALIKE``, ``notifications/initialized`` seen)
and no ``_meta`` (so no progress token), or a 2026-07-28 connection and a ``_meta`` envelope equal
to one the SDK has already answered with a result on this connection (so one it validated;
anything else in ``_meta``, a progress token included, goes to the SDK).
``notifications/cancelled`` for a call answered here cancels it, and, as the SDK does, the
cancelled call is never answered.

Each call is a plain asyncio task (an anyio task and cancel scope cost ~7x as much to start, on
every call), kept by its id until it ends; :meth:`DirectCalls.run` owns them as a task group
would: the connection's end cancels every call still running and waits for it to end, and a
call that fails past its tool (whose failures are results) ends the connection with its error.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import anyio

from procpilot import chat_context, wire
from procpilot.contract import ToolResult
from procpilot.transports.mcp_results import MODERN, SHAPED_ALIKE, call_result, failed_call_result
from procpilot.transports.mcp_results import STAMP_KEY as _STAMP_KEY

__all__ = ["MODERN", "SHAPED_ALIKE", "DirectCalls", "Key", "ToolCaller", "request_key"]

ToolCaller = Callable[[dict[str, Any]], Awaitable[ToolResult]]
Key = tuple[bool, object]  # a JSON-RPC id: 1 and "1" are different ids
_VERSION_KEY = "io.modelcontextprotocol/protocolVersion"
_PENDING = 8  # enveloped requests remembered while waiting for the SDK to accept one
_PARAMS = frozenset({"name", "arguments", "_meta"})
_log = logging.getLogger(__name__)
# Lines worth a look: anything else goes to the SDK without being parsed here.
_CALL, _CANCELLED = b'"tools/call"', b'"notifications/cancelled"'
_INITIALIZE, _INITIALIZED = b'"initialize"', b'"notifications/initialized"'
_ENVELOPE_MARKER = _VERSION_KEY.encode()
# A \uD800-\uDFFF escape (a pair too: rare, and the SDK reads those right)
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_DECODE = json.JSONDecoder().raw_decode
_JSON_SPACE = b" \t\n\r"


class DirectCalls:
    """Which lines are answered here, and the calls running for them.

    Made on the running loop. ``send`` writes one whole reply line (the transport serializes
    writers); :meth:`run`, run beside the transport's other tasks, owns the calls."""

    def __init__(
        self,
        tools: Mapping[str, ToolCaller],
        send: Callable[[bytes], Awaitable[None]],
        *,
        limit: int = 256,
    ) -> None:
        self._tools = tools
        self._send = send
        self.limit = limit
        self._loop = asyncio.get_running_loop()
        self._initialize_id: object = None  # the id of the client's initialize request
        self._version: str | None = None  # the protocol version the SDK answered it with
        self._initialized = False  # notifications/initialized came
        # 2026-07-28: an envelope the SDK accepted, and the server's stamp from its answer
        self._envelope: dict[str, Any] | None = None
        self._stamp: Any = None
        self._pending: dict[Key, dict[str, Any]] = {}  # id: envelope, until answered
        self._running: dict[Key, _Call] = {}  # the calls whose tool runs, by id
        self._tasks: set[asyncio.Task[None]] = set()  # every call's task until it ends (its reply written)
        self._failed: asyncio.Future[None] = self._loop.create_future()  # a call's error, for run()
        self._closed = False  # run() ended: no call starts any more

    @property
    def active(self) -> bool:
        """Whether calls can be answered here (after that, ``saw_reply`` has nothing to learn)."""
        return (self._version is not None and self._initialized) or self._envelope is not None

    @property
    def handshake_era(self) -> bool:
        """Whether the connection speaks a handshake-era version and is initialized: the eras in
        which a server may send a log notification unasked (2026-07-28 allows one only on a
        request that opted in)."""
        return self._version is not None and self._initialized

    async def run(self) -> None:
        """Own the calls until cancelled (the connection's end): then cancel each call still
        running, or still writing its reply, and wait for all of them to end. A call that failed
        past its tool makes this raise its error, ending the connection as a failed task in a
        task group would."""
        try:
            await self._failed
        finally:
            self._closed = True
            for call in self._running.values():
                call.cancelled = True  # whatever it returns now, the connection is ending: not answered
            tasks = list(self._tasks)
            for task in tasks:
                task.cancel()
            if tasks:
                with anyio.CancelScope(shield=True):  # the connection's end waits for them
                    await asyncio.wait(tasks)

    def take(self, line: bytes) -> bool:
        """Whether ``line`` was dealt with here (a call started, or a cancel of one); if not,
        it goes to the SDK as it is."""
        learning = self._envelope is None and _ENVELOPE_MARKER in line
        if not (learning or _CALL in line or _CANCELLED in line or _INITIALIZE in line or _INITIALIZED in line):
            return False
        if _SURROGATE_ESCAPE.search(line):
            return False  # json.loads reads a lone surrogate, the SDK's parser refuses it: as it does
        try:
            # Only UTF-8, as the SDK's parser (json.loads would decode a BOM or UTF-16 the SDK refuses).
            text = line.strip(_JSON_SPACE).decode()
            message, end = _DECODE(text)
        except (ValueError, RecursionError):
            return False  # the transport answers what does not parse (or nests too deep to)
        if end != len(text) or not isinstance(message, dict) or message.get("jsonrpc") != "2.0":
            return False
        method = message.get("method")
        if learning:
            self._note_envelope(message)
        if method == "tools/call":
            return self._start(message)
        if method == "notifications/cancelled":
            return self._cancel(message.get("params"))
        if method == "initialize" and self._initialize_id is None:
            self._initialize_id = request_key(message.get("id"))
        elif method == "notifications/initialized":
            self._initialized = True
        return False

    def saw_reply(self, message: Any) -> None:
        """A message the SDK wrote: its answer to ``initialize`` says which version is spoken, and
        its answer to an enveloped request that the envelope was accepted (and with which stamp)."""
        key = request_key(getattr(message, "id", None))
        result = getattr(message, "result", None)
        if key is None or not isinstance(result, dict):
            return
        if key == self._initialize_id and self._version is None:
            version = result.get("protocolVersion")
            if version in SHAPED_ALIKE:
                self._version = version
        envelope = self._pending.pop(key, None)
        meta = result.get("_meta")
        if envelope is not None and self._envelope is None and isinstance(meta, dict) and meta.get(_STAMP_KEY):
            self._envelope, self._stamp = envelope, meta[_STAMP_KEY]
            self._pending.clear()

    def _note_envelope(self, message: dict[str, Any]) -> None:
        params, key = message.get("params"), request_key(message.get("id"))
        meta = params.get("_meta") if isinstance(params, dict) else None
        if not isinstance(meta, dict) or meta.get(_VERSION_KEY) != MODERN:
            return
        if key is not None and len(self._pending) < _PENDING:
            self._pending[key] = meta

    def _start(self, message: dict[str, Any]) -> bool:
        params, request_id = message.get("params"), message.get("id")
        if not isinstance(params, dict) or len(self._running) >= self.limit or self._closed:
            return False
        if "_meta" in params:  # 2026-07-28: the very envelope the SDK accepted before
            if self._envelope is None or params["_meta"] != self._envelope:
                return False
            if chat_context.META_KEY in params["_meta"]:
                return False  # the SDK's path serves the call as coming from that chat (mcp.py)
            version: str | None = MODERN
        else:
            version = self._version if self._initialized else None
        if version is None or not params.keys() <= _PARAMS:
            return False
        name = params.get("name")
        tool = self._tools.get(name) if isinstance(name, str) else None  # a list is no key: the SDK refuses it
        arguments = params.get("arguments", {})
        key = request_key(request_id)
        if key is None or tool is None or not isinstance(arguments, dict) or key in self._running:
            return False
        call = self._running[key] = _Call(tool, arguments, request_id, key, version, self._stamp)
        call.task = self._loop.create_task(self._call(call))
        self._tasks.add(call.task)
        return True

    def _cancel(self, params: object) -> bool:
        key = request_key(params.get("requestId")) if isinstance(params, dict) else None
        call = self._running.get(key) if key is not None else None
        if call is None:
            return False  # not one of ours: the SDK's to apply (or to ignore)
        if not call.cancelled:
            call.cancelled = True
            call.task.cancel()
            # A task cancelled before it first ran never runs its own cleanup: this one always does.
            call.task.add_done_callback(lambda task: self._end(call, task))
        return True

    async def _call(self, call: _Call) -> None:
        try:
            try:
                reply = await _reply(call)
            finally:
                self._end(call)
            if not call.cancelled:
                await self._send(reply)
        except Exception as exc:  # past the tool, whose failures are results: a bug
            self._fail(exc)
        finally:
            self._tasks.discard(call.task)

    def _end(self, call: _Call, task: asyncio.Task[None] | None = None) -> None:
        """``call``'s tool no longer runs: its id is free again (and, with ``task``, its task
        ended: a cancelled call is cleaned up twice, once here from its task's done callback)."""
        if self._running.get(call.key) is call:
            del self._running[call.key]
        if task is not None:
            self._tasks.discard(task)

    def _fail(self, exc: Exception) -> None:
        if self._failed.done():  # the connection is ending already: the error is logged, not lost
            _log.error("A direct tools/call failed", exc_info=exc)
        else:
            self._failed.set_exception(exc)


class _Call:
    """One call answered here: what it runs, and how its reply is shaped."""

    __slots__ = ("arguments", "cancelled", "key", "request_id", "stamp", "task", "tool", "version")
    task: asyncio.Task[None]

    def __init__(
        self, tool: ToolCaller, arguments: dict[str, Any], request_id: object, key: Key, version: str, stamp: Any
    ) -> None:
        self.tool = tool
        self.arguments = arguments
        self.request_id = request_id
        self.key = key
        self.version = version  # the connection's protocol version, which shapes the result
        self.stamp = stamp  # 2026-07-28: the server's info, stamped on every result
        self.cancelled = False  # by notifications/cancelled: never answered


async def _reply(call: _Call) -> bytes:
    try:
        result = await call.tool(call.arguments)
    except Exception as exc:  # ToolSpec.call makes errors results: this is a bug, answered as the SDK would
        _log.exception("Tool raised an unexpected exception")
        result_json = failed_call_result(exc, call.version, call.stamp)
    else:
        result_json = call_result(result, call.version, call.stamp)
    message = {"jsonrpc": "2.0", "id": call.request_id, "result": result_json}
    # as transports/mcp.py's to_call_result: a path or a datetime in data is its text, and a lone
    # surrogate (a name decoded with surrogateescape) is U+FFFD, not an exception that ends the server
    return wire.dumps_bytes(message) + b"\n"


def request_key(request_id: object) -> Key | None:
    """A JSON-RPC id as a dict key: 1 and "1" are different ids (and true is none at all)."""
    if isinstance(request_id, bool) or not isinstance(request_id, int | str):
        return None
    return (isinstance(request_id, str), request_id)
