"""The node side: a plain procpilot Supervisor on one Ray node, run as an actor pinned there.

The engine runs unchanged (its own state directory, trees, limits and isolation of this host).
The daemon ran the policy before the spec got here, and this supervisor runs the same spawn filter
again on what it receives: a spec that reaches the actor by another way (any driver of the Ray
cluster can call it) gets the agent's box and checks all the same, never the box it claims. Output
stays in this node's files: ``follow`` reads them forward for the daemon (``follow.py``: each
byte once, in arrival order) and ``page`` reads any part on demand.

Nothing here imports Ray: ``procpilot.cluster.ray_backend`` wraps this class as an actor.
Replies are plain dicts, and errors travel as their code and message (``ProcpilotError``'s
keyword details would not survive Ray's exception wrapping) for the daemon to raise again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import AsyncIterator, Callable
from typing import Any

from procpilot.cluster.follow import FOLLOW_CHUNK, follow_output
from procpilot.cluster.replies import error_reply
from procpilot.config import Settings
from procpilot.engine.capture import Stream
from procpilot.engine.session import Session
from procpilot.engine.spawn import SpawnSpec
from procpilot.engine.supervisor import Supervisor
from procpilot.errors import ProcpilotError, SessionNotFound

__all__ = ["LINES_MAX", "NodeAgent", "dropped_by_view", "session_record"]

LINES_MAX = 16 << 20  # bytes of lines one reply carries: a page, not the whole log
_STATUS_MAX = 10_000  # sessions one status call reports on
_INPUT_CHECKS = 32  # of them, read afresh from /proc (~0.1 ms each, on this node's event loop)
_INPUT_AGE = 5.0  # the rest: an answer this recent, else none
ORPHAN_AFTER = 10.0  # seconds without the daemon's beat (every 2 s) before a node ends its trees
_log = logging.getLogger(__name__)
SpawnFilter = Callable[[str, SpawnSpec, int], SpawnSpec]


def session_record(session: Session) -> dict[str, Any]:
    """What the daemon mirrors of a session besides its output."""
    return {
        "id": session.id,
        "state": session.state.value,
        "pid": session.pid,
        "exit_code": session.exit_code,
        "exit_signal": session.exit_signal,
        "error": session.error,
        "started_at": session.started_at,
        "ended_at": session.ended_at,
        "duration_ms": session.duration_ms,
        "signal_sent": session.signal_sent,
        "timed_out_waiting_for_input": session.timed_out_waiting_for_input,
        "stdin_open": session.stdin_open,
    }


def dropped_by_view(session: Session) -> dict[str, int]:
    """What this node's cap dropped of each view: what the daemon's results report."""
    return {stream.value: session.output[stream].dropped for stream in Stream}


class NodeAgent:
    """One node's supervisor. Every call names the scope, and the engine's scoping applies."""

    def __init__(
        self,
        settings: Settings,
        node_id: str,
        orphan_after: float = ORPHAN_AFTER,
        spawn_filter: SpawnFilter | None = None,
    ) -> None:
        # One state directory per node: on one host (the tests' two-node cluster) two nodes must
        # not share session directories or a journal.
        state_dir = settings.state_dir / "nodes" / node_id[:16]
        self.node_id = node_id
        self._settings = settings.model_copy(update={"state_dir": state_dir})
        self._sup: Supervisor | None = None
        # The daemon's own filter (the policy's), applied here again to every spec received.
        self._spawn_filter = spawn_filter
        self._orphan_after = orphan_after
        self._beaten: asyncio.Event | None = None  # made on the actor's own event loop, by start()
        self._watchdog: asyncio.Task[None] | None = None

    @property
    def sup(self) -> Supervisor:
        if self._sup is None:
            raise RuntimeError("NodeAgent.start() has not been called")
        return self._sup

    async def start(self) -> dict[str, Any]:
        if self._sup is None:
            self._sup = await Supervisor(self._settings, spawn_filter=self._spawn_filter).start()
            self._beaten = asyncio.Event()
            self._watchdog = asyncio.ensure_future(self._watch_daemon())
        return {"node": self.node_id, "pid": os.getpid(), "capabilities": self.sup.capabilities()}

    async def beat(self) -> None:
        """The daemon is there (it calls this every few seconds)."""
        if self._beaten is not None:
            self._beaten.set()

    async def _watch_daemon(self) -> None:
        """End every tree here once the daemon has been silent for ``orphan_after`` seconds.

        The actor outlives its driver (a detached actor): a daemon that died, or one alive but
        gone for this node (frozen, cut off by a partition Ray has not declared yet), would
        leave the trees running with nobody to read, wait on or end them. So the node ends them
        itself, then this actor leaves (its process exits: a daemon that comes back counts the
        node's actor gone and starts a new one)."""
        beaten = self._beaten
        while beaten is not None:
            try:
                await asyncio.wait_for(beaten.wait(), self._orphan_after)
            except TimeoutError:
                break
            beaten.clear()
        _log.warning("no word from the daemon for %.0f s: ending this node's sessions", self._orphan_after)
        await self.close()
        os._exit(0)  # no Ray call to leave by from a background task: the process goes, Ray sees it

    async def sessions(self) -> int:
        return sum(1 for s in self.sup.all_sessions() if not s.finished)

    async def spawn(self, scope: str, spec: SpawnSpec, session_id: str | None = None) -> dict[str, Any]:
        try:
            session = await self.sup.spawn(spec, scope=scope, session_id=session_id)
        except ProcpilotError as exc:
            return error_reply(exc)
        self.sup.usage.watch(session)  # sampled while it runs: the daemon asks for the figures
        return {"record": session_record(session)}

    async def status(self, wanted: list[tuple[str, str]]) -> dict[str, dict[str, Any]]:
        """What the daemon cannot see from its host, per running session: the tree's usage and
        whether it waits on stdin (its /proc read for the first ``_INPUT_CHECKS``, the newest)."""
        found = []
        for scope, session_id in wanted[:_STATUS_MAX]:
            with contextlib.suppress(ProcpilotError):  # removed meanwhile: nothing to say
                found.append(self.sup.get(scope, session_id))
        usages = await self.sup.usage.snapshot(found, budget=None)  # read in a worker thread
        report = {}
        for i, session in enumerate(found):
            usage = usages[session.id]
            waiting = session.waiting_for_input if i < _INPUT_CHECKS else session.last_waiting_for_input(_INPUT_AGE)
            report[session.id] = {
                "usage": None if usage is None else usage.as_dict(),
                "waiting": waiting,
                "dropped": dropped_by_view(session),
            }
        return report

    async def follow(self, scope: str, session_id: str) -> AsyncIterator[tuple[Any, ...]]:
        """The session's output items (``cluster/follow.py``), then ("end", record): the end
        comes only after the last byte ("finished" is reaped *and* drained, as on one host)."""
        try:
            session = self.sup.get(scope, session_id)
        except SessionNotFound as exc:
            yield ("error", error_reply(exc))
            return
        async for item in follow_output(session):
            yield item
        usage = self.sup.usage.usage(session).as_dict()
        yield ("end", session_record(session) | {"usage": usage, "dropped": dropped_by_view(session)})

    async def write(self, scope: str, session_id: str, data: bytes, eof: bool, timeout: float | None) -> dict[str, Any]:
        try:
            session = self.sup.get(scope, session_id)
            return {"written": await session.write(data, eof=eof, timeout=timeout)}
        except ProcpilotError as exc:
            return error_reply(exc)

    async def kill(self, scope: str, session_id: str, sig: int, grace: float | None) -> dict[str, Any]:
        try:
            await self.sup.kill(scope, session_id, signal.Signals(sig), grace=grace, wait=0)
        except ProcpilotError as exc:
            return error_reply(exc)
        return {"ok": True}

    async def page(self, scope: str, session_id: str, stream: str, offset: int, limit: int) -> dict[str, Any]:
        """Bytes of a view as this node's files hold them (the log stays here), 1 MiB at most."""
        try:
            view = self.sup.get(scope, session_id).output[Stream(stream)]
        except ProcpilotError as exc:
            return error_reply(exc)
        chunk = view.read(offset, min(max(0, limit), FOLLOW_CHUNK))
        return {
            "data": chunk.data,
            "start": chunk.start,
            "end": chunk.end,
            "dropped": chunk.dropped,
            "total": chunk.total,
            "view_dropped": view.dropped,
        }

    async def lines(
        self, scope: str, session_id: str, stream: str, first: int, count: int | None, max_bytes: int, keep_end: bool
    ) -> dict[str, Any]:
        """Lines of a view by this node's line index, ``LINES_MAX`` bytes of them at most."""
        try:
            view = self.sup.get(scope, session_id).output[Stream(stream)]
        except ProcpilotError as exc:
            return error_reply(exc)
        found = view.read_lines(first, count, min(max(0, max_bytes), LINES_MAX), keep_end=keep_end)
        return {
            "lines": found.lines,
            "first": found.first,
            "total": found.total,
            "dropped_lines": found.dropped_lines,
            "unread_bytes": found.unread_bytes,
            "view_dropped": view.dropped,
        }

    async def forget(self, scope: str, session_id: str) -> None:
        with contextlib.suppress(ProcpilotError):  # already gone: forgetting is idempotent
            await self.sup.remove(scope, session_id)

    async def close(self) -> None:
        """End every tree this node runs (SIGTERM, SIGKILL after the grace period)."""
        if self._sup is not None:
            await self._sup.aclose()
