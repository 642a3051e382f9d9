"""Session leaders' exits through one SIGCHLD handler per event loop, not a pidfd each.

A pidfd per running session is a descriptor per session in the server: 10,000 sleeping
sessions would hold 10,000 of them for nothing but the moment each ends. Every leader we start
is our own child, so the kernel tells us of each exit anyway (SIGCHLD). One handler, installed
in the loop (``add_signal_handler``), looks for the exited children, each still a zombie
(``WNOWAIT``: its /proc entry is still there to read, its status for the session's own
``wait4``), and calls the callback watching it.

Finding them: ``waitid(P_ALL, WNOWAIT)`` names one zombie child at a time, at once. A zombie
that nobody watches (an orphan of a tree we are subreaper for, a child another thread waits
for) would name itself again and again, and is not ours to reap here, so from the first such
one the pass asks each watched pid instead (``waitid(P_PID)``, ~1 µs each). Signals coalesce:
one pass per loop iteration however many children ended.

Where no handler can be installed (a loop outside the main thread), :meth:`ExitWatcher.of`
says None and the session falls back to a pidfd of its own.

**The handler lives while a supervisor uses the loop** (:meth:`ExitWatcher.hold` at its start,
:meth:`ExitWatcher.release` once it is closed), not until the loop closes: asyncio's loop closes
its wakeup pipe before it removes its signal handlers, so a child ending in between (one of ours,
during teardown) would have the C signal handler write to a closed descriptor, or to whatever
file has its number by then. After the last release the handler is removed, a last sweep finds
the exits up to then, what still runs is polled (:class:`LeaderPoll`, as an adopted leader is),
and the loop's next user installs a new watcher.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import weakref
from collections.abc import Callable

from procpilot.engine.procfs import stat_fields

__all__ = ["ExitWatcher", "LeaderPoll"]

_log = logging.getLogger(__name__)

_WAIT = os.WEXITED | os.WNOHANG | os.WNOWAIT
_WATCHERS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, ExitWatcher | None] = weakref.WeakKeyDictionary()


class ExitWatcher:
    """The exits of the children watched from one event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        # Weakly: the registry's value must not keep its key (the loop) alive once it is closed.
        self._loop = weakref.ref(loop)
        self._watched: dict[int, Callable[[], None]] = {}
        self._due = False  # True iff a pass is scheduled
        self._holders = 0  # supervisors using this loop now (started, not yet closed)

    @classmethod
    def of(cls, loop: asyncio.AbstractEventLoop) -> ExitWatcher | None:
        """The loop's watcher, installed on first use; None where SIGCHLD cannot be handled there."""
        if loop in _WATCHERS:
            return _WATCHERS[loop]
        watcher: ExitWatcher | None = cls(loop)
        try:
            loop.add_signal_handler(signal.SIGCHLD, watcher._signalled)  # type: ignore[union-attr]
        except (NotImplementedError, RuntimeError, ValueError):  # not the main thread, or no Unix loop
            watcher = None
        else:
            # A thousand children ending between two loop iterations fill the loop's wakeup socket
            # (a byte each); the bytes dropped then cost nothing (one pass finds every exit so
            # far), so no warning for each on stderr.
            signal.set_wakeup_fd(signal.set_wakeup_fd(-1), warn_on_full_buffer=False)
        _WATCHERS[loop] = watcher
        return watcher

    @classmethod
    def installed(cls, loop: asyncio.AbstractEventLoop) -> ExitWatcher | None:
        """The loop's watcher if one is installed now, without installing one (to let go of a
        child: after the last supervisor's release there is nothing to unwatch)."""
        return _WATCHERS.get(loop)

    def hold(self) -> None:
        """A supervisor uses this loop from now on: the handler stays until it lets go."""
        self._holders += 1

    def release(self) -> None:
        """A supervisor that held this watcher is closed. After the last one, the handler goes
        and the loop forgets this watcher (see the module's docstring); watched children are
        not lost: the ones that ended are called now, the others are polled until they end."""
        self._holders = max(0, self._holders - 1)
        loop = self._loop()
        if self._holders or loop is None or _WATCHERS.get(loop) is not self:
            return
        del _WATCHERS[loop]
        loop.remove_signal_handler(signal.SIGCHLD)
        # Removed first, then looked at: an exit before this look is found by it, where one after
        # the last pass but before the removal would have been a wakeup byte with no handler left.
        self.sweep()
        left, self._watched = self._watched, {}
        poll = LeaderPoll.of(loop)
        for pid, on_exit in left.items():  # a leader that outlived its supervisor's close
            poll.watch(pid, on_exit)

    def __len__(self) -> int:
        return len(self._watched)

    def watch(self, pid: int, on_exit: Callable[[], None]) -> None:
        """Call ``on_exit`` (on the loop) once child ``pid`` has exited, before it is reaped: the
        callback reaps it. A child that ended before this call is found by a pass now."""
        self._watched[pid] = on_exit
        self._signalled()

    def unwatch(self, pid: int) -> None:
        self._watched.pop(pid, None)

    def _signalled(self) -> None:
        loop = self._loop()
        if not self._due and loop is not None:
            self._due = True
            loop.call_soon(self._pass)

    def _pass(self) -> None:
        self._due = False
        while self._watched:
            try:
                found = os.waitid(os.P_ALL, 0, _WAIT)
            except ChildProcessError:
                break  # no child at all: what we watch was reaped elsewhere, each callback finds out
            if found is None:
                return  # children, none exited
            on_exit = self._watched.pop(found.si_pid, None)
            if on_exit is None:
                break  # a zombie not watched here stands first: ask each of ours
            self._call(on_exit)
        self.sweep()

    def sweep(self) -> None:
        """Ask each watched pid directly (``waitid(P_PID)``, ~1 µs each). A pass after SIGCHLD
        does it only past a zombie nobody watches here; the supervisor's housekeeping does it
        every few seconds too: a leader that other code in the process reaped (an ``os.wait()``
        of a library) sends no second signal, and its session must still end."""
        for pid in list(self._watched):
            try:
                found = os.waitid(os.P_PID, pid, _WAIT)
            except ChildProcessError:
                gone = True  # not (or no longer) our child: its callback finds out
            else:
                gone = found is not None
            if gone and (on_exit := self._watched.pop(pid, None)) is not None:
                self._call(on_exit)

    def _call(self, on_exit: Callable[[], None]) -> None:
        # As the loop would run a callback: one that fails is reported, the others still run.
        try:
            on_exit()
        except Exception as exc:
            loop = self._loop()
            if loop is None:
                raise
            loop.call_exception_handler({"message": "exit callback failed", "exception": exc})


_POLLS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, LeaderPoll] = weakref.WeakKeyDictionary()
_POLL_BASE = 0.05  # seconds between looks with a few leaders: as the single session's poll was
_POLL_EACH = 100e-6  # and this much more per leader: ~1 s for 10,000, a few % of the loop on looks


class LeaderPoll:
    """The exits of leaders that are not our children (adopted from a previous server: SIGCHLD
    goes to whoever is their parent now). A pidfd each would cost a descriptor each, so one timer
    reads each one's /proc stat for all of them; with many, less often. Ended: no entry, a zombie
    (its new parent, a subreaper that does not reap at once, may keep it one for long), or
    another process under its pid (its start time is not the one it had when watched). A stat
    that cannot be read (no descriptor free: a burst of spawns) says nothing: looked at again on
    the next tick, never taken for an end (the session would end, and its tree be killed, under
    a leader still running)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = weakref.ref(loop)
        # Each watched pid's callback, and its start time as /proc said it when watched.
        self._watched: dict[int, tuple[Callable[[], None], bytes | None]] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._unreadable_said = False  # True while looks fail (logged once, not on every tick)

    @classmethod
    def of(cls, loop: asyncio.AbstractEventLoop) -> LeaderPoll:
        poll = _POLLS.get(loop)
        if poll is None:
            poll = _POLLS[loop] = cls(loop)
        return poll

    def __len__(self) -> int:
        return len(self._watched)

    def watch(self, pid: int, on_exit: Callable[[], None]) -> None:
        """Call ``on_exit`` (on the loop) once ``pid`` has ended (see the class)."""
        try:
            started = _start_time(pid)
        except OSError:
            started = None  # unknown for now: its end is still seen (no entry, a zombie)
        self._watched[pid] = (on_exit, started)
        self._schedule()

    def unwatch(self, pid: int) -> None:
        self._watched.pop(pid, None)

    def _schedule(self) -> None:
        loop = self._loop()
        if self._timer is None and self._watched and loop is not None:
            self._timer = loop.call_later(_POLL_BASE + _POLL_EACH * len(self._watched), self._look)

    def _look(self) -> None:
        self._timer = None
        ended = []
        failed: OSError | None = None
        for pid, (_, started) in self._watched.items():
            try:
                if _ended(pid, started):
                    ended.append(pid)
            except OSError as exc:
                failed = exc
        if failed is not None and not self._unreadable_said:
            _log.warning("cannot read leaders' /proc stat (%s): their ends are looked for again", failed.strerror)
        self._unreadable_said = failed is not None  # logged once while it lasts
        for pid in ended:
            watched = self._watched.pop(pid, None)
            if watched is not None:
                watched[0]()
        self._schedule()


def _start_time(pid: int) -> bytes | None:
    fields = stat_fields(pid)
    return fields[19] if fields is not None and len(fields) > 19 else None


def _ended(pid: int, started: bytes | None) -> bool:
    """Whether ``pid`` has ended; OSError when that cannot be told now."""
    fields = stat_fields(pid)
    if fields is None or not fields or fields[0] in (b"Z", b"X"):
        return True
    return started is not None and len(fields) > 19 and fields[19] != started
