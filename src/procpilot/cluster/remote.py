"""A session that runs on another node, as the daemon's faces see it.

It *is* a ``Session`` (so every face, typed against the engine, takes it unchanged): its output
is the daemon's bounded copy of the node's files (``pages.py``), written as the node streams
them, so waits, polls and patterns work exactly as on one host, and a page the copy does not
hold is read from the node; its state, exit code and signal come from the
node's record. What acts on the process (a signal, bytes for stdin) goes to the node.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import Callable
from typing import Any

from procpilot.cluster.pages import Call, node_lines, node_page
from procpilot.cluster.replies import raise_reply
from procpilot.engine.capture import LineSlice, ReadResult, SessionOutput, Stream
from procpilot.engine.session import Session, signal_name
from procpilot.engine.spawn import SpawnSpec
from procpilot.engine.states import SessionState
from procpilot.engine.trees import TreeBackend
from procpilot.engine.usage import Usage
from procpilot.errors import ProcessAlreadyExited, StdinClosed

__all__ = ["NODE_LOST", "RemoteSession", "mirror"]

NODE_LOST = "node_lost"
_log = logging.getLogger(__name__)


def mirror(output: SessionOutput, stream: Stream, position: int, offset: int, data: bytes) -> None:
    """Store one streamed run (bytes of ``stream`` from its ``position``, at ``offset`` in the
    combined view) where the node had it, and wake readers.

    The daemon's copy keeps the node's offsets byte for byte: bytes it already has (a stream
    followed again after a lost connection starts from 0) are skipped, and a range the node's
    cap dropped before it was sent reads as zeros here, each stream's share of it in that
    stream (the node's own log says what was dropped). Listeners hear new bytes once, as from a
    local ``append``."""
    have = output[Stream.COMBINED].size
    if offset > have:
        own = max(0, min(offset - have, position - output[stream].size))
        other = Stream.STDERR if stream is Stream.STDOUT else Stream.STDOUT
        output.pad(other, offset - have - own)
        output.pad(stream, own)
        have = offset
    fresh = data[have - offset :]
    if fresh:
        output.append(stream, fresh)


class RemoteSession(Session):
    """A session on ``node``; ``call(kind, *args)`` sends one action to that node's actor."""

    def __init__(
        self,
        record: dict[str, Any],
        scope: str,
        spec: SpawnSpec,
        output: SessionOutput,
        trees: TreeBackend,
        on_finish: Callable[[Session], None],
        *,
        node: str | None,
        call: Call | None,
        node_dropped: dict[Stream, int] | None = None,
        kill_grace: float = 5.0,
    ) -> None:
        super().__init__(record["id"], scope, spec, output, trees, on_finish, kill_grace=kill_grace)
        self.node = node  # None while it waits on the daemon for a lane slot
        self._call_node = call
        self._calls: set[asyncio.Task[None]] = set()
        self._usage = Usage()  # as the node last reported it
        # What the node's cap dropped of each view, as it last said (its copy's views report it).
        self.node_dropped: dict[Stream, int] = {} if node_dropped is None else node_dropped
        if node is not None and call is not None:
            self.bind(record, node=node, call=call)

    def bind(self, record: dict[str, Any], *, node: str, call: Call) -> None:
        """The session that waited for its lane slot has started on ``node``."""
        self.node = node
        self._call_node = call
        self.pid = record["pid"]
        self.started_at = record["started_at"]
        self.stdin_open = bool(record["stdin_open"])
        if record["state"] in (SessionState.RUNNING.value, SessionState.RESTARTING.value):
            self._set_state(SessionState.RUNNING)

    async def _call(self, kind: str, *args: Any, **options: Any) -> dict[str, Any]:
        if self._call_node is None:  # queued here: no node has it yet
            raise StdinClosed(f"session {self.id} has not started: it waits for a slot in lane {self.spec.lane!r}")
        return await self._call_node(kind, *args, **options)

    @property
    def waiting_for_input(self) -> bool:
        """The node's last answer (its /proc), as ``RayLauncher.observe`` brought it."""
        return self.is_running and self.stdin_open and self._input_check is not None and self._input_check[0]

    def usage_report(self) -> Usage:
        return self._usage  # the node's figures: its tree is not on this host to sample

    def apply_status(self, status: dict[str, Any]) -> None:
        """The node's report on the running tree: its usage so far, whether it waits on stdin."""
        if status.get("usage") is not None:
            self._usage = self._usage.max(Usage(**status["usage"]))
        if status.get("waiting") is not None:
            self._input_check = (bool(status["waiting"]), time.monotonic())
        self._note_dropped(status.get("dropped"))

    @property
    def log_files(self) -> list[str]:
        return sorted(str(p) for p in self.output.directory.glob("combined.*"))

    async def page(self, stream: Stream, offset: int = 0, limit: int | None = None) -> ReadResult:
        return await node_page(self._call, self.scope, self.id, self.output, stream, offset, limit, self.node_dropped)

    async def page_lines(
        self, stream: Stream, first: int, count: int | None, max_bytes: int | None = None, *, keep_end: bool = False
    ) -> LineSlice:
        return await node_lines(
            self._call, self.scope, self.id, self.output, stream, first, count, max_bytes, keep_end, self.node_dropped
        )

    def _note_dropped(self, dropped: dict[str, int] | None) -> None:
        for name, size in (dropped or {}).items():
            self.node_dropped[Stream(name)] = size

    # -- from the node -------------------------------------------------------------------------

    def apply_end(self, record: dict[str, Any]) -> None:
        """The node's record of the end: the state, the exit, and when."""
        if self.finished:
            return
        self.pid = record["pid"]
        self.exit_code = record["exit_code"]
        self.exit_signal = record["exit_signal"]
        self.error = record["error"]
        self.signal_sent = record["signal_sent"] or self.signal_sent
        self.timed_out_waiting_for_input = bool(record["timed_out_waiting_for_input"])
        if record.get("usage") is not None:
            self._usage = self._usage.max(Usage(**record["usage"]))  # the node's final figures
        self._note_dropped(record.get("dropped"))
        self.started_at = record["started_at"] or self.started_at
        self._end(SessionState(record["state"]), duration_ms=record["duration_ms"])

    def lose(self, why: str) -> None:
        """The node is gone: the session ends ``lost`` (never a false ``done``) with the reason."""
        if self.finished:
            return
        self.error = f"{NODE_LOST}: {why}"
        self._end(SessionState.LOST, duration_ms=None)

    def _end(self, state: SessionState, *, duration_ms: int | None) -> None:
        if self.state is SessionState.QUEUED and state not in (SessionState.LOST, SessionState.KILLED):
            self._set_state(SessionState.RUNNING)  # it started and ended between two records
        self._set_state(state)
        now = time.monotonic()
        self._t_end = now if duration_ms is None else self._t0 + duration_ms / 1000
        self.ended_at = time.time()
        self.stdin_open = False
        self.output.mark_closed()
        self._finished.set()
        self._on_finish(self)

    # -- to the node ---------------------------------------------------------------------------

    def fail_to_start(self, message: str, *, end: SessionState = SessionState.FAILED_TO_START) -> None:
        """Killed while it waited for a lane slot: the node, where it waits, must drop it too."""
        if end is SessionState.KILLED:
            self._in_background(self._send("kill", int(signal.SIGTERM), 0))
        super().fail_to_start(message, end=end)

    def _in_background(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._calls.add(task)
        task.add_done_callback(self._calls.discard)

    def terminate(self, end: SessionState, sig: int, grace: float | None) -> None:
        if self.finished or not self.is_running:
            raise ProcessAlreadyExited(f"session {self.id} has already ended ({self.state.value})")
        if self._requested_end is None:
            self._requested_end = end
        self.signal_sent = signal_name(sig)
        self._in_background(self._send("kill", int(sig), grace))

    async def _send(self, kind: str, *args: Any) -> None:
        # The kill's outcome arrives as the session's end, streamed like any other; a node that
        # died on the way ends it `lost` through the same stream.
        with contextlib.suppress(Exception):
            reply = await self._call(kind, self.scope, self.id, *args)
            if "error" in reply and reply["error"] != "ProcessAlreadyExited":
                _log.warning("node %s refused %s of %s: %s", self.node, kind, self.id, reply["message"])

    async def write(self, data: bytes, eof: bool = False, *, timeout: float | None = None) -> int:
        reply = await self._call("write", self.scope, self.id, data, eof, timeout)
        raise_reply(reply)
        written: int = reply["written"]
        return written
