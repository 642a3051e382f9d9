"""MCP over stdio without threads: the SDK's low-level server, fed from the event loop.

The SDK's ``stdio_server`` reads each line and writes each reply through anyio's worker threads
(``wrap_file``): two or three thread hand-offs per call, each a wake-up after idle. And a process
with a thread pays more for every spawn: vfork + exec in a multi-threaded process costs ~3x what
it costs in a single-threaded one (0.3 vs 0.09 ms here), on every session. So when stdin and stdout
are pipes or sockets (what an MCP client gives its server) they are read and written here, on the
loop, non-blocking; anything else (a terminal, a file) is served by the SDK's own transport.

A ``tools/call`` the SDK would answer as a plain function call is answered here without its
dispatch (transports/mcp_direct.py); everything else goes through the SDK's low-level server.
stdin is read by a callback the loop keeps registered (:class:`_Stdin`), which hands such a call
to its task at once: a call starts one turn of the loop after its line arrived, where a reading
task woken by a future per read (and an epoll registration made and dropped per read) took two.
A reply is written at once when no other waits for the pipe (:class:`_Replies`).
Every line is answered: one the SDK's parser refuses (not JSON, not a message, nested too deep)
or one past ``_MAX_LINE`` gets a JSON-RPC error here (transports/mcp_refusals.py), where the
SDK's transport would hand the server an exception it only logs; and every reply is written
whatever text it holds (wire.py). At most ``_SDK_REQUESTS`` requests are in the SDK's hands at
once; the next is refused with ``TooManyRequests`` (transports/mcp_inflight.py).

As the SDK does, fd 0 and fd 1 are moved out of the way while serving (to /dev/null and to
stderr), so nothing else in the process, or started by it, can read the client's requests or
write into the replies; they are put back on the way out.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import os
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import anyio
import mcp_types as types
from mcp.shared.message import SessionMessage
from pydantic import BaseModel
from pydantic_core import PydanticSerializationError

from procpilot import wire
from procpilot.transports.mcp_direct import DirectCalls, ToolCaller
from procpilot.transports.mcp_handshake import Handshake, stdio_is_pipe
from procpilot.transports.mcp_inflight import SdkRequests
from procpilot.transports.mcp_refusals import HEAD, INVALID_REQUEST, refusal, refusal_for
from procpilot.transports.mcp_sdk import context_streams, lowlevel_server

__all__ = ["reply_line", "serve_stdio", "stdio_is_pipe"]

_READ = 1 << 16
_MAX_LINE = 16 << 20  # one JSON-RPC message; a longer line is refused, not buffered without end
_SDK_REQUESTS = 256  # requests the SDK serves at once (as many as the direct path); past it, refused


# A notification pushed to the client: its JSON-RPC message (method and params).
Notification = dict[str, Any]
Subscribe = Callable[[Callable[[Notification], None]], Callable[[], None]]
_PUSH_QUEUE = 256  # notifications waiting for a slow client; past it they are dropped (results still tell)


async def serve_stdio(
    server: Any,
    tools: Mapping[str, ToolCaller] | None = None,
    *,
    pushes: Subscribe | None = None,
    handshake: Handshake | None = None,
) -> None:
    """Run an ``MCPServer`` on this process's stdin and stdout until the client closes stdin;
    calls of ``tools`` (the server's own tools, by name) are answered without its dispatch, and
    what ``pushes`` delivers is written to the client as notifications once it is initialized.
    ``handshake`` (transports/mcp_handshake.py): the lines read, and the replies written, before
    this server was loaded; they are served first, and the handshake's answers kept for next time."""
    if not stdio_is_pipe():
        await server.run_stdio_async()
        return
    low = lowlevel_server(server)
    if handshake is not None:
        handshake.handover()  # before fd 1 is moved: the front writes to it until it stops
    async with _claimed_stdio() as (wire_in, wire_out):
        replies = _Replies(wire_out)
        read_writer, read_stream = context_streams(0)
        write_stream, write_reader = context_streams(0)
        direct = DirectCalls(tools, replies.send) if tools else None
        open_requests = SdkRequests(_SDK_REQUESTS)
        async with anyio.create_task_group() as tg:
            if direct is not None:
                tg.start_soon(direct.run)  # the direct calls end with the connection
            tg.start_soon(_read_lines, wire_in, read_writer, direct, replies, handshake, open_requests)
            tg.start_soon(_forward_replies, write_reader, replies, direct, handshake, open_requests)
            if pushes is not None and direct is not None:
                tg.start_soon(_push, pushes, replies, direct)
            await low.run(read_stream, write_stream, low.create_initialization_options())
            tg.cancel_scope.cancel()


@contextlib.asynccontextmanager
async def _claimed_stdio() -> AsyncIterator[tuple[int, int]]:
    """The client's two pipes on descriptors of our own (non-blocking), fd 0 on /dev/null and
    fd 1 on stderr meanwhile."""
    wire_in = os.dup(0)
    wire_out = os.dup(1)
    saved_in = os.get_blocking(wire_in)
    saved_out = os.get_blocking(wire_out)
    null = os.open(os.devnull, os.O_RDONLY)
    try:
        os.dup2(null, 0)
        os.dup2(2, 1)
        os.set_blocking(wire_in, False)
        os.set_blocking(wire_out, False)
        yield wire_in, wire_out
    finally:
        os.close(null)
        # the descriptions are shared with whoever gave us the pipes: leave them as they were
        with contextlib.suppress(OSError):
            os.set_blocking(wire_in, saved_in)
            os.set_blocking(wire_out, saved_out)
        os.dup2(wire_in, 0)
        os.dup2(wire_out, 1)
        os.close(wire_in)
        os.close(wire_out)


async def _ready(fd: int, *, write: bool = False) -> None:
    """Until ``fd`` can be read (or, with ``write``, written) without blocking."""
    loop = asyncio.get_running_loop()
    ready = loop.create_future()
    add, remove = (loop.add_writer, loop.remove_writer) if write else (loop.add_reader, loop.remove_reader)
    add(fd, ready.set_result, None)
    try:
        await ready
    finally:
        remove(fd)


# What the reader hands the task that serves what the direct path did not take:
_OFFERED = 0  # a line the direct path declined: the SDK's
_LINE = 1  # a line not offered yet (it came after one the task had to serve, or before the server loaded)
_TOO_LONG = 2  # the head of a line past _MAX_LINE, which is refused


class _Stdin:
    """The client's lines, read by a callback the loop calls when stdin is readable.

    A line the direct path takes (transports/mcp_direct.py: a call started, a cancel) is dealt
    with right there, with no task to wake and no wait to set up: a call's task is started one
    turn of the loop after the line arrived. Any other line goes to :meth:`next`'s task (the
    SDK's, or a refusal), which may have to wait for the SDK or for a client slow to read
    replies; while it holds a line, stdin is not read (back-pressure, and the lines stay in
    order), so at most one read's lines wait here. Each read takes what the pipe holds, up to
    ``_READ`` bytes; a line past ``_MAX_LINE`` is refused as soon as it is that long."""

    def __init__(self, fd: int, direct: DirectCalls | None, handshake: Handshake | None) -> None:
        self._fd = fd
        self._direct = direct
        self._handshake = handshake
        self._loop = asyncio.get_running_loop()
        self._line = bytearray(handshake.rest if handshake else b"")  # the line being read
        self._skipping = False  # inside a line over _MAX_LINE: dropped up to its newline
        # The lines the handshake's front read come first, in order.
        self._backlog: collections.deque[tuple[int, bytes]] = collections.deque(
            (_LINE, early) for early in (handshake.lines if handshake else ())
        )
        self._ended = handshake is not None and handshake.eof  # the client closed stdin
        self._error: Exception | None = None  # why reading stopped, if not the end of input
        self._reading = False
        self._waiter: asyncio.Future[None] | None = None

    def offer(self, line: bytes) -> bool:
        """Whether ``line`` was dealt with here: taken by the direct path, or blank."""
        if self._handshake is not None:
            self._handshake.saw_request(line)
        return (self._direct is not None and self._direct.take(line)) or not line.strip()

    async def next(self) -> tuple[int, bytes] | None:
        """The next line left to the task (its kind and bytes), in order; None at the end of
        input. Reading goes on only while the task has no line in hand."""
        while not self._backlog:
            if self._ended:
                if self._error is not None:
                    raise self._error
                return None
            if not self._reading:
                self._loop.add_reader(self._fd, self._on_readable)
                self._reading = True
            self._waiter = self._loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return self._backlog.popleft()

    def close(self) -> None:
        """Stop reading (the task ends)."""
        self._pause()

    def _pause(self) -> None:
        if self._reading:
            self._loop.remove_reader(self._fd)
            self._reading = False

    def _on_readable(self) -> None:
        try:
            chunk = os.read(self._fd, _READ)
        except BlockingIOError:
            return
        except Exception as exc:  # raised by the task: a callback's error would only be logged
            self._error = exc
            chunk = b""
        if chunk:
            try:
                self._split(chunk)
            except Exception as exc:  # a bug in the direct path: the connection ends with it
                self._error, chunk = exc, b""
        if not chunk:
            self._ended = True
        if self._backlog or self._ended:
            self._pause()
            if self._waiter is not None and not self._waiter.done():
                self._waiter.set_result(None)

    def _split(self, chunk: bytes) -> None:
        line, backlog = self._line, self._backlog
        start = 0
        while (end := chunk.find(b"\n", start)) >= 0:
            if not self._skipping:
                if line:
                    line += chunk[start:end]
                    whole = bytes(line)
                    line.clear()
                else:
                    whole = chunk[start:end]
                if backlog:
                    backlog.append((_LINE, whole))  # after a line the task holds: in order
                elif not self.offer(whole):
                    backlog.append((_OFFERED, whole))
            self._skipping, start = False, end + 1
        if self._skipping:
            return
        line += chunk[start:]
        if len(line) > _MAX_LINE:
            # Answered now, not at its end: the caller learns at once, and nothing is buffered.
            backlog.append((_TOO_LONG, bytes(line[:HEAD])))
            line.clear()
            self._skipping = True


async def _read_lines(
    fd: int,
    sink: Any,
    direct: DirectCalls | None,
    replies: _Replies,
    handshake: Handshake | None,
    open_requests: SdkRequests,
) -> None:
    """Each line a JSON-RPC message for the server; a line it cannot take (not JSON, not a
    message, over ``_MAX_LINE``, a request past ``open_requests``' limit) is answered here with
    an error, and the next line is read. The lines the handshake's front read come first, in order."""
    stdin = _Stdin(fd, direct, handshake)
    async with sink:
        try:
            while (item := await stdin.next()) is not None:
                kind, line = item
                if kind == _TOO_LONG:
                    too_long = f"Invalid request: a line longer than {_MAX_LINE} bytes"
                    await replies.send(refusal(line, INVALID_REQUEST, too_long))
                elif kind == _OFFERED or not stdin.offer(line):
                    await _take(line, sink, replies, open_requests)
        finally:
            stdin.close()


async def _take(line: bytes, sink: Any, replies: _Replies, open_requests: SdkRequests) -> None:
    """A line for the SDK's server, or its refusal when the SDK's parser would not take it or
    the SDK serves as many requests as it may."""
    try:
        message = types.jsonrpc_message_adapter.validate_json(line, by_name=False)
    except Exception as exc:
        # The SDK's transport would hand the server the error, which logs it and answers nothing.
        await replies.send(refusal_for(line, exc))
        return
    if (refused := open_requests.admit(message)) is not None:
        await replies.send(refused)
        return
    await sink.send(SessionMessage(message))


class _Replies:
    """The client's stdout: whole lines, one writer at a time (the SDK's replies and direct ones).

    A line is written at once when no other waits for the pipe (nearly always: the client reads
    its replies); when the pipe takes only part of it, the rest is written under the lock, which
    every later line then waits for, so a client that does not read holds one line per writer
    here, never a growing buffer."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._lock = asyncio.Lock()
        self._queued = 0  # writers holding or waiting for the lock
        self._gone = False

    async def send(self, data: bytes) -> None:
        view = memoryview(data)
        if not self._queued:  # nobody holds the lock nor waits for it: no line is half written
            view = self._write(view)
            if not view:
                return
        self._queued += 1
        try:
            async with self._lock:
                while view := self._write(view):
                    await _ready(self._fd, write=True)  # the client reads slowly: wait, holding one reply only
        finally:
            self._queued -= 1

    def _write(self, view: memoryview) -> memoryview:
        """What is left of ``view`` once the pipe took what it would (nothing, the client gone)."""
        if self._gone:
            return view[:0]
        try:
            return view[os.write(self._fd, view) :]
        except BlockingIOError:
            return view
        except BrokenPipeError:
            self._gone = True  # the client is gone; the read side ends the server
            return view[:0]


async def _push(subscribe: Subscribe, replies: _Replies, direct: DirectCalls) -> None:
    """Write each notification ``subscribe`` delivers to a handshake-era client once it has
    initialized (before that it may not take one; a 2026-07-28 client takes log notifications
    only on requests that opted in, so it hears exits from results); one that finds the queue
    full is dropped."""
    queue: asyncio.Queue[Notification] = asyncio.Queue(_PUSH_QUEUE)

    def put(message: Notification) -> None:
        with contextlib.suppress(asyncio.QueueFull):
            queue.put_nowait(message)

    unsubscribe = subscribe(put)
    try:
        while True:
            message = await queue.get()
            if direct.handshake_era:
                line = json.dumps({"jsonrpc": "2.0", **message}, ensure_ascii=False, separators=(",", ":"), default=str)
                await replies.send(line.encode() + b"\n")
    finally:
        unsubscribe()


async def _forward_replies(
    source: Any, replies: _Replies, direct: DirectCalls | None, handshake: Handshake | None, open_requests: SdkRequests
) -> None:
    async with source:
        async for message in source:
            open_requests.answered(message.message)
            if direct is not None and not direct.active:
                direct.saw_reply(message.message)
            line = reply_line(message.message)
            if handshake is not None and handshake.wants(getattr(message.message, "id", None)):
                written, instead = handshake.saw_reply(json.loads(line))
                if written:  # the front answered it while the server loaded
                    if instead:
                        await replies.send(instead)
                    continue
            await replies.send(line)


def reply_line(message: BaseModel) -> bytes:
    """A message the SDK made, as one line. pydantic raises on a lone surrogate (in a result a
    handler made from a name decoded with surrogateescape, say), wire.py does not."""
    try:
        return (message.model_dump_json(by_alias=True, exclude_unset=True) + "\n").encode()
    except PydanticSerializationError:
        return wire.dumps_bytes(message.model_dump(mode="json", by_alias=True, exclude_unset=True)) + b"\n"
