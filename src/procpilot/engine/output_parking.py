"""Quiet sessions' output read ends, out of the descriptor table, watched by one epoll.

A running session costs the server its stdout and stderr read ends: 10,000 sessions need 20,000
descriptors for them alone, the hard limit here. Most long-running sessions are quiet most of the
time (a server, a watcher, a ``sleep``), and a quiet pipe needs no descriptor of ours as long as
something tells us when it speaks again. What the kernel does, each checked on Linux 6.18
(``bench/epoll_in_flight.py``; tests/engine/test_output_parking.py covers the whole):

- An epoll registration belongs to the open file (keyed on file and descriptor number), not to
  the descriptor: it stays, and keeps reporting, after the descriptor is closed as long as
  another reference holds the file. Here that reference is an SCM_RIGHTS message in flight in
  our own socket (engine/stash.py), which does not count against RLIMIT_NOFILE.
- With ``EPOLLONESHOT`` a registration reports once (data, or ``EPOLLHUP`` when the last writer
  closes) with the 64-bit token we gave it, then stays silent until re-armed.
- Bytes stay in the pipe meanwhile: a writer that fills it (1 MiB for a session's, engine/
  spawn.py; 64 KiB by default) blocks; nothing is lost.
- A registration can be removed or re-armed only through a descriptor with the number it was
  made with; one taken back at another number cannot reach it, and it stays until the file is
  closed. So every end is registered under one number of our choosing, the table's last
  (:func:`_high_number`, through a copy closed at once): the kernel hands out the lowest free
  number, so that one is free again when an end comes back, and a copy of it there removes the
  registration. One that could not be removed (``left_behind``) has reported already, or
  reports once, to a token nobody has any more (ignored), and goes with the session's pipe.

So: when the live output descriptors pass :meth:`OutputParking.threshold` (half of what the
table holds beside the server's own; a server never near its limit parks nothing), a sweep
every :attr:`OutputParking.sweep_every` seconds parks the sessions whose output has not grown
for a whole sweep: their readers leave the loop, each end is registered in the shared epoll
with a token of its own, and the ends go into the stash. A report (data or EOF), the
leader's exit, or a path that needs the descriptor (a copy for a new holder, the drain after
the exit) takes them back, and they are read as before: every byte in order, the exit after
the output. A session woken by data waits twice as long (up to :data:`_MAX_QUIET_SWEEPS`
sweeps) before it is parked again, so one that prints now and then is not shuttled to and fro.
Terminals (a pty) are never parked: their output drives the terminal-mode scan, and they are few.
The tokens go through ``epoll_ctl`` by ctypes (``select.epoll`` registers a descriptor's number
as its data); before the first parking one token is sent round a pipe to check the struct's
layout on this architecture, and where it does not come back as sent nothing is ever parked.
"""

from __future__ import annotations

import asyncio
import ctypes
import errno
import fcntl
import os
import resource
import select
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from procpilot.engine.descriptors import park_above, reserve
from procpilot.engine.segments import Stream
from procpilot.engine.stash import DescriptorStash

__all__ = ["OutputParking", "Parkable"]

_ADD, _DEL, _MOD = 1, 2, 3  # EPOLL_CTL_*
_ONCE = select.EPOLLIN | select.EPOLLONESHOT
_MAX_EVENTS = 1024
# However often a session was woken before, once quiet it is parked again after at most this many
# sweeps (and the one that first sees it quiet): the doubling stops here. Tests lower it.
_MAX_QUIET_SWEEPS = 64
_RETRY = 0.005  # seconds before exited sessions that found no room are taken back
_TOKENS = 1 << 31
_HIGH = 1 << 16  # select.epoll.poll returns the token as a C int


class _Data(ctypes.Union):
    # The token goes where select.epoll.poll reads it back (the union's int), whatever the
    # byte order.
    _fields_ = (("fd", ctypes.c_int32), ("u64", ctypes.c_uint64))


class _Event(ctypes.Structure):
    # struct epoll_event is packed on x86 only (12 bytes on x86-64); elsewhere its data is at 8.
    if os.uname().machine in ("x86_64", "amd64", "i386", "i686"):
        _pack_ = 1
    _fields_ = (("events", ctypes.c_uint32), ("data", _Data))


_libc = ctypes.CDLL(None, use_errno=True)


def _ctl(epfd: int, op: int, fd: int, token: int) -> None:
    # select.epoll.register sets the event's data to the descriptor's number, which a parked
    # end no longer has (the number is reused): our own token instead.
    event = _Event(_ONCE)
    event.data.fd = token
    if _libc.epoll_ctl(epfd, op, fd, ctypes.byref(event)) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))


class Parkable(Protocol):
    """What the parking needs of a session (engine/session.py)."""

    def output_size(self) -> int:
        """Bytes of output so far: unchanged over a sweep means quiet."""
        ...

    def parkable_streams(self) -> list[tuple[Stream, int]]:
        """Its output descriptors the loop reads now, if they may be parked now; else []."""
        ...

    def streams_parked(self, streams: list[tuple[Stream, int]]) -> None:
        """``streams`` leave the loop's readers (their descriptors are closed by the parking)."""
        ...

    def streams_back(self, fds: dict[Stream, int | None]) -> None:
        """Parked streams back in the table, to be read again (None: lost, as if at EOF)."""
        ...


@dataclass(slots=True)
class _Quiet:
    size: int = -1  # output size at the last sweep
    sweeps: int = 0  # sweeps in a row it did not grow
    need: int = 1  # sweeps of quiet before it is parked


@dataclass(slots=True)
class _Parked:
    need: int
    # Per stream: its stash token, its epoll token, the number it was registered under.
    ends: list[tuple[Stream, int, int, int]] = field(default_factory=list)


class OutputParking:
    """One supervisor's parked output ends: one epoll, one stash, one sweep timer."""

    def __init__(self, before: Callable[[], None]) -> None:
        self._before = before  # the holder's pending copies go first, from our table
        self._park_above: int | None = None  # live output descriptors past which to park; None: half the table
        self.sweep_every = 1.0  # seconds
        self._stash = DescriptorStash()  # made again at the first parking, its buckets sized to the limit
        self._epoll: select.epoll | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._live: dict[Parkable, _Quiet] = {}  # read by the loop, candidates
        self._parked: dict[Parkable, _Parked] = {}
        self._tokens: dict[int, Parkable] = {}  # epoll token -> its session, while parked
        self._next_token = 1
        self._due: dict[Parkable, None] = {}  # to take back at the next turn of the loop
        self._deferred: dict[Parkable, None] = {}  # woken by data while the table was too full
        self._timer: asyncio.TimerHandle | None = None
        self._flush: asyncio.Handle | None = None
        self._broken = False  # True iff this host's epoll gave back a token other than ours
        self.left_behind = 0  # registrations that could not be removed (see the module's docstring)
        self.sweeps = 0  # sweeps so far: a quiet spell counted in sweeps, not seconds (the tests)

    def __len__(self) -> int:
        """Sessions parked now."""
        return len(self._parked)

    @property
    def descriptors(self) -> int:
        """Descriptors the parking itself holds in the table: its epoll, the stash's sockets,
        and parked ends the kernel would not take back in flight (stash.py: ``kept``)."""
        return (self._epoll is not None) + self._stash.sockets + self._stash.kept

    @property
    def park_above(self) -> int | None:
        """Output descriptors read by the loop past which quiet sessions are parked; None: half
        the table (descriptors.park_above). 0: every quiet session."""
        return self._park_above

    @park_above.setter
    def park_above(self, value: int | None) -> None:
        self._park_above = value
        if self._live:  # sessions run, so does their loop: a sweep if it is now due
            self._schedule()

    def threshold(self) -> int:
        return park_above() if self._park_above is None else self._park_above

    # -- the sessions' side --------------------------------------------------------------------

    def watch(self, session: Parkable) -> None:
        """``session``'s output is read by the loop: a candidate from now on."""
        if session not in self._parked:
            self._live.setdefault(session, _Quiet())
            self._schedule()

    def forget(self, session: Parkable) -> None:
        """No more of it (detached, ended): parked ends are closed with the stash's next look."""
        self._live.pop(session, None)
        self._due.pop(session, None)
        self._deferred.pop(session, None)
        parked = self._parked.pop(session, None)
        if parked is not None:
            for _, stash_token, epoll_token, _ in parked.ends:
                self._tokens.pop(epoll_token, None)
                self._stash.discard(stash_token)

    def is_parked(self, session: Parkable) -> bool:
        return session in self._parked

    def wake(self, session: Parkable) -> None:
        """Take ``session``'s ends back soon (its leader exited): batched per turn of the loop,
        so a thousand exits open each of the stash's buckets once."""
        if session in self._parked:
            self._due[session] = None
            if self._flush is None:
                self._flush = asyncio.get_running_loop().call_soon(self._take_due)

    def take_back(self, session: Parkable) -> None:
        """Now (a copy for a new holder, the drain after an exit)."""
        self._due.pop(session, None)
        self._deferred.pop(session, None)
        self._unpark([session])

    def close(self) -> None:
        for handle in (self._timer, self._flush):
            if handle is not None:
                handle.cancel()
        self._timer = self._flush = None
        self._live.clear()
        self._parked.clear()
        self._tokens.clear()
        self._due.clear()
        self._deferred.clear()
        self._stash.close()  # our copies go: the holder keeps its own
        if self._epoll is not None:
            if self._loop is not None and not self._loop.is_closed():
                self._loop.remove_reader(self._epoll.fileno())
            self._epoll.close()
            self._epoll = None

    # -- the sweep -----------------------------------------------------------------------------

    def _schedule(self) -> None:
        # Only while there is something to do: a server under the threshold never sweeps (no
        # wake-up a second for nothing); it can only cross it by a session starting or waking.
        if self._timer is None and (self._deferred or self._over()):
            self._timer = asyncio.get_running_loop().call_later(self.sweep_every, self._sweep)

    def _over(self) -> bool:
        return 2 * len(self._live) > self.threshold()

    def _sweep(self) -> None:
        self._timer = None
        self.sweeps += 1
        try:
            if self._deferred:
                self._take_deferred()
            # Sessions waiting for room to be read make the room themselves: the quiet are parked
            # whatever the threshold says.
            if self._deferred or self._over():
                self._park(self._quiet())
        finally:
            self._schedule()

    def _quiet(self) -> list[Parkable]:
        found = []
        for session, quiet in self._live.items():
            size = session.output_size()
            if size != quiet.size:
                quiet.size, quiet.sweeps = size, 0
                continue
            quiet.sweeps += 1
            if quiet.sweeps >= quiet.need:
                found.append(session)
        return found

    def _park(self, sessions: list[Parkable]) -> None:
        due = [(session, streams) for session in sessions if (streams := session.parkable_streams())]
        if not due:
            return
        self._before()
        try:
            epoll = self._open_epoll()
        except OSError:
            return  # no descriptor for the epoll (EMFILE): nothing parked, nothing changed
        high = _high_number()
        ends: list[tuple[Parkable, Stream, int, int, int]] = []  # session, stream, fd, epoll token, number
        for session, streams in due:
            session.streams_parked(streams)  # out of the loop's epoll before the number is closed
            for stream, fd in streams:
                token = self._token()
                try:
                    number = _register(epoll.fileno(), fd, token, high)
                except OSError:
                    token = number = -1  # not watched, so not parked: still read by the loop
                ends.append((session, stream, fd, token, number))
        watched = [fd for _, _, fd, token, _ in ends if token >= 0]
        stashed = iter(self._stash.put_many(watched))
        given_back: dict[Parkable, dict[Stream, int | None]] = {}
        for session, stream, fd, token, number in ends:
            stash_token = next(stashed) if token >= 0 else None
            if stash_token is None:  # the kernel would not keep it in flight: ours, as before
                given_back.setdefault(session, {})[stream] = fd if token < 0 else self._unregister(fd, number)
                continue
            quiet = self._live.get(session) or _Quiet()
            parked = self._parked.setdefault(session, _Parked(quiet.need))
            parked.ends.append((stream, stash_token, token, number))
            self._tokens[token] = session
        for session in {s: None for s, *_ in ends}:
            if session in self._parked:
                self._live.pop(session, None)
            if session in given_back:
                session.streams_back(given_back[session])

    def _token(self) -> int:
        token = self._next_token
        self._next_token = token % (_TOKENS - 1) + 1
        return token

    def _open_epoll(self) -> select.epoll:
        if self._epoll is None:
            if self._broken:
                raise OSError(errno.ENOSYS, "epoll tokens do not come back here")
            epoll = select.epoll()
            if not _tokens_come_back(epoll):
                epoll.close()
                self._broken = True  # never park: a report we cannot read would strand a session
                raise OSError(errno.ENOSYS, "epoll tokens do not come back here")
            self._epoll = epoll
            self._loop = asyncio.get_running_loop()
            self._loop.add_reader(self._epoll.fileno(), self._on_events)
            # A bucket taken out comes into the table whole: a sixteenth of a small limit at most.
            self._stash = DescriptorStash(bucket=_soft() // 16)
        return self._epoll

    # -- taking back ---------------------------------------------------------------------------

    def _on_events(self) -> None:
        epoll = self._epoll
        if epoll is None:
            return
        while True:
            events = epoll.poll(0, _MAX_EVENTS)
            for token, _ in events:
                session = self._tokens.pop(token, None)  # None: a registration left behind
                if session is not None and session in self._parked:
                    self._deferred[session] = None
            if len(events) < _MAX_EVENTS:
                break
        self._take_deferred()

    def _take_deferred(self) -> None:
        """Take back what spoke, as far as the table has room: a table too full to take them
        leaves the bytes in their pipes (their writers wait) until a sweep has made room."""
        room = max(0, self._room())
        sessions = list(self._deferred)[: room // 2]
        for session in sessions:
            del self._deferred[session]
        self._unpark(sessions, woken=True)
        self._schedule()

    def _room(self) -> int:
        """Descriptors the table can take for ends coming back: what is free now, less a bucket
        (taking one out brings it all into the table for a moment; a message that does not fit
        loses its descriptors) and half the server's reserve (its files, connections, spawns)."""
        soft = _soft()
        used = _open_descriptors()
        if used is None:  # a kernel before 6.2: as estimated
            used = reserve(soft) + 2 * len(self._live)
        return soft - used - self._stash.bucket - reserve(soft) // 2

    def _take_due(self) -> None:
        """Take back the ends of sessions whose leader exited, as many as the table has room
        for: a kill of 10,000 parked sessions must not bring 20,000 ends back at once (a message
        that does not fit loses its descriptors). The rest follow once the first are read to EOF."""
        self._flush = None
        sessions = list(self._due)[: max(0, self._room()) // 2]
        for session in sessions:
            del self._due[session]
            self._deferred.pop(session, None)
        self._unpark(sessions)
        if self._due:
            self._flush = asyncio.get_running_loop().call_later(_RETRY, self._take_due)

    def _unpark(self, sessions: list[Parkable], *, woken: bool = False) -> None:
        parked = [(session, p) for session in sessions if (p := self._parked.pop(session, None)) is not None]
        if not parked:
            return
        found = self._stash.take_many([stash_token for _, p in parked for _, stash_token, _, _ in p.ends])
        for session, p in parked:
            back: dict[Stream, int | None] = {}
            for stream, stash_token, epoll_token, number in p.ends:
                self._tokens.pop(epoll_token, None)
                fd = found.get(stash_token)
                back[stream] = None if fd is None else self._unregister(fd, number)
            # Spoke after a quiet spell: the next quiet spell must be twice as long.
            need = min(2 * p.need, _MAX_QUIET_SWEEPS) if woken else p.need
            self._live[session] = _Quiet(need=need)
            session.streams_back(back)
        self._schedule()

    def _unregister(self, fd: int, number: int) -> int:
        """``fd`` (a parked end back in the table), its registration removed through a copy under
        the number it was registered with, if that number is free (it nearly always is)."""
        epoll = self._epoll
        if epoll is None:
            return fd
        through = fd
        if fd != number:
            try:
                through = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, number)  # the lowest free one >= number
            except OSError:
                through = -1
            if through != number:
                if through >= 0:
                    os.close(through)
                self.left_behind += 1
                return fd
        try:
            _ctl(epoll.fileno(), _DEL, through, 0)
        except OSError:
            self.left_behind += 1
        finally:
            if through != fd:
                os.close(through)
        return fd


def _tokens_come_back(epoll: select.epoll) -> bool:
    """Whether a token registered through our struct comes back as registered (its layout is
    this architecture's): a pipe, one byte, one report."""
    r, w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
    try:
        _ctl(epoll.fileno(), _ADD, r, 0x5A17)
        os.write(w, b"x")
        found = epoll.poll(0)
        _ctl(epoll.fileno(), _DEL, r, 0)
    except OSError:
        return False
    finally:
        os.close(r)
        os.close(w)
    return found == [(0x5A17, select.EPOLLIN)]


def _soft() -> int:
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return _HIGH if soft == resource.RLIM_INFINITY else soft


def _open_descriptors() -> int | None:
    """Descriptors open in this process: the size /proc gives its fd directory (Linux 6.2 on;
    ~40 µs with 15,000 open, where listing them takes 15 ms), or None where it gives 0."""
    try:
        return os.stat("/proc/self/fd").st_size or None
    except OSError:
        return None


def _high_number() -> int:
    """The number every parked end is registered under: the table's last, which the kernel
    (lowest free first) hands out only once every other is taken, so it is free again when the
    end comes back, and its registration can be removed through it. Past 65,535 the table
    would grow for it alone (8 bytes a slot)."""
    return min(_soft(), _HIGH) - 1


def _register(epfd: int, fd: int, token: int, high: int) -> int:
    """Register ``fd`` under ``high`` (a copy, closed after), or under its own number if that
    cannot be had; returns the number it is registered under."""
    try:
        number = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, high)
    except OSError:
        number = fd
    try:
        try:
            _ctl(epfd, _ADD, number, token)
        except OSError as exc:
            if exc.errno != errno.EEXIST:
                raise
            # Left behind by an earlier parking of this very end under this number: re-armed for us.
            _ctl(epfd, _MOD, number, token)
    finally:
        if number != fd:
            os.close(number)
    return number
