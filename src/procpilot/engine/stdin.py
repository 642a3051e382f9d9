"""A session's stdin: the writer end of the current run's stdin, and writes into it.

Writes never block the event loop: a child that does not read fills its pipe, and a write then
waits for room (``add_writer``), up to a deadline. One write at a time (a lock), so two callers'
bytes never interleave. Closing is once: it tells whoever else holds a copy (the holder, across
restarts) to let go first, or the child would never see EOF, and wakes a write waiting for room.
A restart policy's next run brings a new stdin: :meth:`StdinWriter.use` takes it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable

from procpilot.engine.spawn import Spawned
from procpilot.errors import StdinClosed
from procpilot.turns import waiting

__all__ = ["StdinWriter"]


class StdinWriter:
    def __init__(self, session_id: str, *, pty: bool, before_close: Callable[[], None]) -> None:
        self._id = session_id
        self._pty = pty
        self._before_close = before_close
        self._loop = asyncio.get_running_loop()
        self._spawned: Spawned | None = None
        self.open = False  # True iff a write may still reach the child
        self._lock = asyncio.Lock()
        self._waiter: asyncio.Future[None] | None = None

    def use(self, spawned: Spawned) -> None:
        """The stdin of a run that started (or was adopted): its descriptor, if it has one."""
        self._spawned = spawned
        self.open = spawned.stdin_fd is not None

    async def write(self, data: bytes, eof: bool = False, *, timeout: float | None = None) -> int:
        """Write ``data`` (then close stdin if ``eof``); returns the bytes written.

        A child that never reads its stdin fills the pipe: with a ``timeout`` (seconds) the wait
        for room ends at that deadline and the count written so far is returned, so the caller
        can tell the rest was not sent (``eof`` is then not applied either: it would cut the
        unsent part off for good). Without one it waits as long as it takes.
        """
        deadline = None if timeout is None else self._loop.time() + max(0.0, timeout)
        try:
            # Waits for the child (a write before this one, stuck behind a full pipe) give the
            # caller's turn to its agent's next call (procpilot/turns.py).
            async with waiting(), asyncio.timeout_at(deadline):
                await self._lock.acquire()
        except TimeoutError:
            return 0  # another write still holds stdin, stuck behind the same full pipe
        try:
            return await self._write_locked(data, eof, deadline)
        finally:
            self._lock.release()

    async def _write_locked(self, data: bytes, eof: bool, deadline: float | None) -> int:
        spawned = self._spawned
        if spawned is None or spawned.stdin_fd is None or not self.open:
            raise StdinClosed(f"session {self._id} has no open stdin")
        view = memoryview(data)
        written = 0
        while view:
            fd = spawned.stdin_fd
            if fd is None:
                raise StdinClosed(
                    f"session {self._id} ended after reading {written} of {len(data)} bytes", bytes_written=written
                )
            try:
                n = os.write(fd, view)
            except BlockingIOError:
                if not await self._writable(fd, deadline):
                    return written
                continue
            except BrokenPipeError as exc:
                self.close()
                raise StdinClosed(
                    f"session {self._id} closed its stdin after {written} of {len(data)} bytes", bytes_written=written
                ) from exc
            written += n
            view = view[n:]
        if eof and spawned.stdin_fd is not None:
            if self._pty:
                with contextlib.suppress(OSError):
                    os.write(spawned.stdin_fd, b"\x04")
            else:
                self.close()
        return written

    async def _writable(self, fd: int, deadline: float | None) -> bool:
        """Wait until ``fd`` takes more; False at the deadline. Also returns when stdin is closed
        under us (the session ended): the fd is gone then, and no writability event would come."""
        fut: asyncio.Future[None] = self._loop.create_future()

        def ready() -> None:
            if not fut.done():
                fut.set_result(None)

        self._loop.add_writer(fd, ready)
        self._waiter = fut
        try:
            async with waiting(), asyncio.timeout_at(deadline):
                await fut
        except TimeoutError:
            return False
        finally:
            self._waiter = None
            if self._spawned is not None and self._spawned.stdin_fd == fd:
                self._loop.remove_writer(fd)
        return True

    def close(self) -> None:
        """Close our end (the child sees EOF once every other copy is gone too)."""
        spawned = self._spawned
        self.open = False
        if spawned is not None and spawned.stdin_fd is not None:
            self._before_close()
            fd, spawned.stdin_fd = spawned.stdin_fd, None
            self._loop.remove_writer(fd)
            os.close(fd)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def let_go(self) -> None:
        """Close our copy without closing stdin (a hand-over: the holder keeps its own)."""
        spawned = self._spawned
        self.open = False
        if spawned is not None and spawned.stdin_fd is not None:
            fd, spawned.stdin_fd = spawned.stdin_fd, None
            self._loop.remove_writer(fd)
            os.close(fd)
