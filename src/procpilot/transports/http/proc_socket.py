"""``WS /v1/proc``: the proc/* protocol (spec 003) for one client, bounded both ways."""

from __future__ import annotations

import asyncio
import json
import logging
from collections import deque
from typing import Any

from starlette.websockets import WebSocket, WebSocketDisconnect

from procpilot import wire
from procpilot.aio import cancel_and_wait
from procpilot.engine.session import ExitInfo
from procpilot.engine.supervisor import Supervisor
from procpilot.turns import Turns

_log = logging.getLogger(__name__)


# -- WebSocket: the proc/* protocol ------------------------------------------------------------

_WS_QUEUE = 256  # pushed output events one client may lag behind before it is told what it missed
# Requests one connection may have running or answered-but-unsent at once; past it the connection
# is not read from (TCP back-pressure), so at most this many answers (a log page: 1 MiB) wait for it.
_WS_IN_FLIGHT = 16


class ProcConnection:
    """One WebSocket client of the proc/* protocol (spec 003), for one agent.

    Requests are handled concurrently (a slow ``proc/kill`` does not hold up a ``proc/write``), at
    most ``_WS_IN_FLIGHT`` at once, counting answers not yet sent: a client that never reads is
    not read from either. Responses and pushes leave through one writer, in order.
    Memory is bounded: past ``_WS_QUEUE`` queued output events, further ``proc/read/event`` of a
    process's stream are dropped and folded into one ``proc/lagged/event`` naming the seq and byte
    range missed (sent before anything newer of that stream); ``proc/log/req`` pages any byte range
    from the session's log. Responses, lag notices and exit events are never dropped.

    The daemon adds to spec 003's messages:

        proc/log/req {proc_id, stream_type, offset, limit} -> proc/log/resp {data, offset, next_offset, size}
        proc/exit/event {proc_id, state, exit_code, exit_signal, duration_ms}   after its last read event
        proc/lagged/event {proc_id, stream_type, first_seq, last_seq, events, offset, bytes}
    """

    def __init__(
        self, ws: WebSocket, supervisor: Supervisor, agent: str, handler: Any, turns: Turns | None = None
    ) -> None:
        self.ws = ws
        self.sup = supervisor
        self.agent = agent
        self.handler = handler
        # Each request is a call of the agent, as its REST and MCP calls are (the daemon's Turns).
        self.turns = turns if turns is not None else Turns()
        # (message, whether it answers a request): an answer holds its request's slot until it
        # is on the wire, so a client that sends and never reads stops being read from.
        self.outbox: deque[tuple[dict[str, Any], bool]] = deque()
        self.queued_events = 0
        self.lagged: dict[tuple[str, str], dict[str, Any]] = {}
        self.offsets: dict[tuple[str, str], int] = {}  # bytes of each stream pushed or dropped so far
        self.mine: set[str] = set()  # processes spawned on this connection: their exits are pushed
        self.wakeup = asyncio.Event()
        self.slots = asyncio.Semaphore(_WS_IN_FLIGHT)
        self.tasks: set[asyncio.Task[None]] = set()

    # -- out --

    def _queue(self, message: dict[str, Any], *, droppable: bool = False, answer: bool = False) -> None:
        self.outbox.append((message, answer))
        if droppable:
            self.queued_events += 1
        self.wakeup.set()

    def _flush_lag(self, key: tuple[str, str]) -> None:
        notice = self.lagged.pop(key, None)
        if notice is not None:
            self._queue(notice)

    def push(self, event: dict[str, Any]) -> None:
        """From the handler, synchronously, in the order the process printed."""
        if event.get("type") != "proc/read/event":
            self._queue(event)
            return
        key = (str(event.get("proc_id")), str(event.get("stream_type")))
        start = self.offsets.get(key, 0)
        size = len(str(event.get("data", "")).encode())
        self.offsets[key] = start + size
        event["offset"] = start  # byte offset in the stream (exact for valid UTF-8)
        if self.queued_events >= _WS_QUEUE:
            notice = self.lagged.get(key)
            if notice is None:
                notice = self.lagged[key] = {
                    "type": "proc/lagged/event",
                    "proc_id": key[0],
                    "stream_type": key[1],
                    "first_seq": event.get("seq"),
                    "offset": start,
                    "events": 0,
                    "bytes": 0,
                    "hint": "page the missed bytes with proc/log/req (offset, limit=bytes)",
                }
            notice["last_seq"] = event.get("seq")
            notice["events"] += 1
            notice["bytes"] += size
            self.wakeup.set()
            return
        self._flush_lag(key)
        self._queue(event, droppable=True)

    def on_exit(self, info: ExitInfo) -> None:
        if info.session_id not in self.mine:
            return
        self.mine.discard(info.session_id)
        for key in [k for k in self.lagged if k[0] == info.session_id]:
            self._flush_lag(key)
        self._queue(self.handler.exit_event(info))

    async def writer(self) -> None:
        while True:
            while self.outbox or self.lagged:
                answer = False
                if self.outbox:
                    message, answer = self.outbox.popleft()
                    if message.get("type") == "proc/read/event":
                        self.queued_events -= 1
                else:
                    message = self.lagged.pop(next(iter(self.lagged)))
                text = wire.dumps(message)  # total: one frame's text never ends the writer
                del message  # a 1 MiB log page is held once, as text, while the socket drains
                try:
                    await self.ws.send_text(text)
                finally:
                    # A failed send's traceback keeps this frame alive until the cycle collector
                    # runs, which an idle daemon may not do for a long time: keep nothing big in it.
                    del text
                if answer:
                    self.slots.release()
            self.wakeup.clear()
            await self.wakeup.wait()

    # -- in --

    async def reader(self) -> None:
        while True:
            await self.slots.acquire()
            try:
                text = await self.ws.receive_text()
            except (WebSocketDisconnect, RuntimeError, KeyError):
                return
            try:
                request = json.loads(text)
            except (ValueError, RecursionError):  # nested past the parser's bound: answered as bad JSON
                request = None
            if not isinstance(request, dict):
                self._queue(_proc_error(None, "invalid_request", "each frame must be one JSON object"), answer=True)
                continue
            task = asyncio.ensure_future(self._handle(request))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def _handle(self, request: dict[str, Any]) -> None:
        try:
            # Its turns, not a place: the connection's slots bound its requests already.
            async with await self.turns.admit(self.agent, place=False) as call:
                await call.work()
                response = await self._answer(request)
        except Exception as exc:  # a bug must answer the request, not end the connection
            _log.exception("proc request failed")
            response = _proc_error(request.get("id"), "internal_error", f"{type(exc).__name__}: {exc}")
        except BaseException:
            self.slots.release()  # cancelled (the connection is closing): no answer will hold it
            raise
        self._queue(response, answer=True)

    async def _answer(self, request: dict[str, Any]) -> dict[str, Any]:
        if request.get("type") == "proc/log/req":
            response: dict[str, Any] = await self.handler.log_page(request)
            return response
        response = await self.handler.handle(request)
        if response.get("type") == "proc/spawn/resp" and response.get("proc_id") and not response.get("error"):
            self.mine.add(str(response["proc_id"]))
            ended = self.handler.exited_already(str(response["proc_id"]))
            if ended is not None:
                self.on_exit(ended)
        return response

    async def run(self, closing: asyncio.Event) -> None:
        unsubscribe = self.handler.subscribe(self.push)
        remove_exit = self.sup.on_exit(self.on_exit)  # after the handler's: its last events go first
        # Exits of the agent's sessions that ended while no server ran: told to nobody yet, so to
        # every connection (a client that spawned them on a connection of the last server).
        for info in self.sup.outage_exits(self.agent):
            self._queue(self.handler.exit_event(info))
        read_task = asyncio.ensure_future(self.reader())
        write_task = asyncio.ensure_future(self.writer())
        close_task = asyncio.ensure_future(closing.wait())
        try:
            await asyncio.wait({read_task, write_task, close_task}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            unsubscribe()
            remove_exit()
            try:
                await cancel_and_wait(read_task, write_task, close_task, *self.tasks)
            finally:
                self.handler.close()  # stops pushing; the processes run on (the supervisor owns them)
                self.outbox.clear()  # what a client that left never read goes now, not at the next GC
                self.lagged.clear()


def _proc_error(rid: Any, code: str, message: str, kind: str = "proc/error") -> dict[str, Any]:
    return {"type": kind, "id": rid, "error": {"code": code, "message": message, "hints": {}}}
