"""A session's stdin: the writer end of the current run's stdin, and writes into it.

Writes never block the event loop: a child that does not read fills its pipe, and a write then
waits for room (``add_writer``), up to a deadline. One write at a time (a lock), so two callers'
bytes never interleave. Closing is once: it tells whoever else holds a copy (the holder, across
restarts) to let go first, or the child would never see EOF, and wakes a write waiting for room.
A restart policy's next run brings a new stdin: :meth:`StdinWriter.use` takes it.

Most sessions are never written to, yet each one's write end must stay open (its child would see
EOF): with a :class:`StdinParking`, the writer is parked shortly after the start, in flight in
the supervisor's stash (engine/stash.py) instead of its descriptor table, and taken back at the
first write or close. The holder gets its copy before ours is parked (the parking's ``before``),
so neither a crash of the server nor one of the holder ever leaves the child with no writer.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable

from procpilot.engine.spawn import Spawned
from procpilot.engine.stash import DescriptorStash
from procpilot.errors import StdinClosed
from procpilot.turns import waiting

__all__ = ["StdinParking", "StdinWriter"]

_PARK_AFTER = 0.05  # seconds from a start to parking its stdin: a quick command never gets there


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
        self.parking: StdinParking | None = None  # where an unwritten stdin waits (the supervisor's)
        self._token: int | None = None  # in the parking's stash: the descriptor is not in our table

    def use(self, spawned: Spawned) -> None:
        """The stdin of a run that started (or was adopted): its descriptor, if it has one."""
        self._spawned = spawned
        self._token, spawned.stdin_token = spawned.stdin_token, None
        self.open = spawned.stdin_fd is not None or self._token is not None
        if spawned.stdin_fd is not None and self.parking is not None:
            self.parking.request(self)

    def parkable_fd(self) -> int | None:
        """Our descriptor, if it is in the table, open, and no write is using it."""
        spawned = self._spawned
        if not self.open or spawned is None or self._lock.locked() or self._waiter is not None:
            return None
        return spawned.stdin_fd

    def parked(self, token: int) -> None:
        """The parking took our descriptor (closed in the table, open in flight as ``token``)."""
        if self._spawned is not None:
            self._spawned.stdin_fd = None
        self._token = token

    def unpark(self, *, again: bool = False) -> None:
        """Our descriptor back in the table, for a write, a close or (``again``: parked again
        after the holder's next batch) a copy for the holder."""
        token, self._token = self._token, None
        if token is not None and self.parking is not None and self._spawned is not None:
            fd = self.parking.take(token)
            if fd is None:
                self.open = False  # lost while its bucket was open (a full table): as if closed
                return
            self._spawned.stdin_fd = fd
        if again and self.open and self.parking is not None:
            self.parking.request(self)

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
        self.unpark()  # written to once, it stays in the table: a session that is, mostly is again
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

    def close(self, *, ended: bool = False) -> None:
        """Close our end (the child sees EOF once every other copy is gone too). ``ended``: the
        run is over and nothing reads it, so a parked copy may close later, with its bucket."""
        if ended and self._token is not None and self.parking is not None:
            self.parking.discard(self._token)
            self._token = None
        if self.parking is not None:
            self.parking.withdraw(self)
        self.unpark()
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
        if self._token is not None and self.parking is not None:
            self.parking.discard(self._token)
        self._token = None
        spawned = self._spawned
        self.open = False
        if spawned is not None and spawned.stdin_fd is not None:
            fd, spawned.stdin_fd = spawned.stdin_fd, None
            self._loop.remove_writer(fd)
            os.close(fd)


class StdinParking:
    """The supervisor's parked stdin write ends: requested at a run's start, parked together
    :data:`_PARK_AFTER` later, after ``before`` (the holder's batch goes first, with the copies
    still in our table)."""

    def __init__(self, before: Callable[[], None]) -> None:
        self._before = before
        self._stash = DescriptorStash()
        self._due: dict[StdinWriter, None] = {}  # in request order, each once
        self._timer: asyncio.TimerHandle | None = None

    def __len__(self) -> int:
        return len(self._stash)

    def request(self, writer: StdinWriter) -> None:
        self._due[writer] = None
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(_PARK_AFTER, self.park_now)

    def withdraw(self, writer: StdinWriter) -> None:
        """``writer`` closes before it was parked (a quick command): no parking is due for it, and
        none at all once no other writer waits (the timer would fire for nothing, mid-call)."""
        if self._due.pop(writer, 0) is None and not self._due and self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def park_now(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        writers, self._due = list(self._due), {}
        if not any(w.parkable_fd() is not None for w in writers):
            return
        self._before()
        # After the holder's send: what is still open and unused now.
        due = [(w, fd) for w in writers if (fd := w.parkable_fd()) is not None]
        tokens = self._stash.put_many([fd for _, fd in due])
        for (writer, _), token in zip(due, tokens, strict=True):
            if token is not None:
                writer.parked(token)

    def put(self, fd: int) -> int | None:
        """Park ``fd`` now (an adopted run's stdin, as it comes back from the holder): its token,
        or None if it could not be (still the caller's)."""
        return self._stash.put_many([fd])[0]

    def take(self, token: int) -> int | None:
        return self._stash.take(token)

    def discard(self, token: int) -> None:
        self._stash.discard(token)

    def close(self) -> None:
        """Let go of every parked copy (the supervisor is closing: ended, or handed to the holder)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._due.clear()
        self._stash.close()
