"""Resource usage of a session's whole process tree: CPU, peak memory and I/O.

A tree's processes come and go, so one snapshot is not enough. :class:`UsageTracker` samples each
tree it is asked about (on demand, and every second or so while such a tree runs) and keeps, per
session, running maxima that never go down:

* ``cpu_ms`` — user + system time of every process of the tree, including the time of children
  they have reaped (``/proc/PID/stat`` counts those), plus the last seen time of processes that
  vanished without a parent in the tree to absorb it (orphans re-parented to the supervisor). On a
  cgroup v2 tree backend the cgroup's own ``cpu.stat`` (exact, dead members included) is a floor.
* ``memory_peak_bytes`` — the largest sum of the tree's resident set sizes seen in one sample, or
  the high-water mark (``VmHWM``) of its largest process if that is more; under a memory limit, the
  cgroup's own peak.
* ``io_read_bytes`` / ``io_write_bytes`` — bytes the tree's processes read and wrote through
  system calls (``rchar``/``wchar`` of ``/proc/PID/io``, which also count reaped children), or the
  storage-level counters where those are all that is available.

When the session ends, what the leader left is folded in where it is larger, so a tree too
short-lived to have been sampled still reports its usage: the ``wait4`` rusage (CPU time of the
leader and of every descendant it waited for; ``ru_maxrss``, the largest of theirs, but only when
it is above the supervisor's own high-water mark at spawn, which a vfork'd child inherits), the
I/O counters of the leader read while it was a zombie (its reaped descendants included) and, under
a memory limit, the cgroup's peak. A short tree that stayed below the supervisor's own peak RSS and
was never sampled reports memory 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import weakref
from collections.abc import Callable, Coroutine, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import psutil

from procpilot.engine.limits import LimitReport
from procpilot.engine.trees import MembershipUnknown, TreeBackend

__all__ = ["PidSample", "Tracked", "Usage", "UsageTracker", "sample_pid", "sample_tree", "usage_tracker"]

# Sampling cadence while watched trees run: fast while one of them is young (a short-lived
# grandchild is still caught), then once a second.
_FAST_INTERVAL = 0.2
_SLOW_INTERVAL = 1.0
_YOUNG_SEC = 3.0
# A listing reuses a sample up to this old, and spends at most this much sampling stale trees
# (stalest first, so successive listings cover them all): psutil costs ~0.1 ms a process, and a
# list of a thousand running sessions must answer in milliseconds, not a tenth of a second.
_LIST_SAMPLE_AGE = 2.0
_LIST_SAMPLE_BUDGET = 0.002  # a listing waits this long for fresh figures (the stalest first)


@dataclass(frozen=True, slots=True)
class Usage:
    """Resource consumption of a tree, as spec 000's ``resource_usage`` object."""

    cpu_ms: int = 0
    memory_peak_bytes: int = 0
    io_read_bytes: int = 0
    io_write_bytes: int = 0

    def as_dict(self) -> dict[str, int]:
        return {
            "cpu_ms": self.cpu_ms,
            "memory_peak_bytes": self.memory_peak_bytes,
            "io_read_bytes": self.io_read_bytes,
            "io_write_bytes": self.io_write_bytes,
        }

    def max(self, other: Usage) -> Usage:
        """Field by field, the larger of the two."""
        return Usage(
            max(self.cpu_ms, other.cpu_ms),
            max(self.memory_peak_bytes, other.memory_peak_bytes),
            max(self.io_read_bytes, other.io_read_bytes),
            max(self.io_write_bytes, other.io_write_bytes),
        )


@dataclass(frozen=True, slots=True)
class PidSample:
    """One process at one moment; cumulative counters include its reaped children."""

    pid: int
    ppid: int
    cpu_ms: float
    rss_bytes: int
    peak_rss_bytes: int  # this process's own high-water mark since its exec
    io_read_bytes: int
    io_write_bytes: int


def _memory(pid: int) -> tuple[int, int]:
    """(current RSS, peak RSS since exec) in bytes from /proc/PID/status; zeros for a zombie."""
    rss = hwm = 0
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"VmRSS:"):
                    rss = int(line.split()[1]) * 1024
                elif line.startswith(b"VmHWM:"):
                    hwm = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return rss, hwm


def sample_pid(pid: int) -> PidSample | None:
    """The counters of one process, or None if it is gone (or not ours to read)."""
    try:
        proc = psutil.Process(pid)
        with proc.oneshot():
            ppid = proc.ppid()
            times = proc.cpu_times()
            cpu = (times.user + times.system + times.children_user + times.children_system) * 1000
            io_read = io_write = 0
            try:
                io = proc.io_counters()
            except (psutil.Error, AttributeError, NotImplementedError):
                pass  # a zombie, or no /proc/PID/io here: its CPU still counts
            else:
                io_read = int(getattr(io, "read_chars", io.read_bytes))
                io_write = int(getattr(io, "write_chars", io.write_bytes))
    except psutil.Error:
        return None
    rss, hwm = _memory(pid)
    return PidSample(pid, ppid, cpu, rss, hwm, io_read, io_write)


def sample_tree(pids: Iterable[int]) -> Usage:
    """One snapshot of a set of processes: summed CPU (with reaped children), RSS and I/O."""
    samples = [s for s in (sample_pid(pid) for pid in pids) if s is not None]
    return Usage(
        cpu_ms=int(sum(s.cpu_ms for s in samples)),
        memory_peak_bytes=max(sum(s.rss_bytes for s in samples), max((s.peak_rss_bytes for s in samples), default=0)),
        io_read_bytes=sum(s.io_read_bytes for s in samples),
        io_write_bytes=sum(s.io_write_bytes for s in samples),
    )


def _cgroup_cpu_ms(trees: Any, session_id: str) -> int | None:
    """Exact CPU time of a session's cgroup (cgroup v2 ``cpu.stat``), if the tree backend has one."""
    root = getattr(trees, "root", None)
    if not isinstance(root, Path):
        return None
    where = getattr(trees, "path", None)  # below its agent's directory, if it is in one (fairness.py)
    directory = where(session_id) if callable(where) else root / session_id
    try:
        text = (directory / "cpu.stat").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == "usage_usec":
            with contextlib.suppress(ValueError):
                return int(value) // 1000
    return None


@dataclass(frozen=True, slots=True)
class _Reading:
    """One look at a running tree, taken off the event loop; folded into its track on the loop."""

    samples: dict[int, PidSample]
    cgroup_cpu_ms: int | None
    known: bool = True  # False: the tree could not be read (no descriptor free); nothing to fold in


@dataclass(slots=True)
class _Track:
    last: dict[int, PidSample] = field(default_factory=dict)
    sampled_at: float | None = None  # time.monotonic() of the last reading
    # Counters of processes that vanished with no parent in the tree left to absorb them.
    credit_cpu: float = 0.0
    credit_read: int = 0
    credit_write: int = 0
    leader_last: PidSample | None = None
    best: Usage = field(default_factory=Usage)
    final: Usage | None = None


class Accounted(Protocol):
    """What a tree leaves to account for once it is over (``session.Accounting``)."""

    @property
    def rusage(self) -> Any: ...
    @property
    def spawner_maxrss_kb(self) -> int: ...
    @property
    def exit_io(self) -> tuple[int, int] | None: ...
    @property
    def limit_report(self) -> LimitReport | None: ...


class Tracked(Protocol):
    """What the tracker reads of a session (a ``Session``; named here so that usage.py, which
    session.py reads for ``Usage``, needs neither session.py nor supervisor.py)."""

    @property
    def id(self) -> str: ...
    @property
    def pid(self) -> int | None: ...
    @property
    def started_at(self) -> float | None: ...
    @property
    def finished(self) -> bool: ...
    @property
    def accounting(self) -> Accounted: ...
    def usage_report(self) -> Usage | None: ...


# The supervisor's tree backend; None once the supervisor is gone.
TreesOf = Callable[[], TreeBackend | None]
# Runs the sampling loop as the supervisor's task; None (and nothing run) once it is ending or gone.
StartTask = Callable[[Callable[[], Coroutine[Any, Any, None]]], "asyncio.Task[None] | None"]


class UsageTracker:
    """Per-session resource usage over whole trees; one per supervisor (``Supervisor.usage``),
    which gives it its tree backend and a way to run its sampling loop (neither keeps the
    supervisor alive)."""

    def __init__(self, trees: TreesOf, start: StartTask) -> None:
        self._trees = trees
        self._start = start
        self._tracks: weakref.WeakKeyDictionary[Tracked, _Track] = weakref.WeakKeyDictionary()
        self._watched: weakref.WeakSet[Tracked] = weakref.WeakSet()
        self._task: asyncio.Task[None] | None = None

    def usage(self, session: Tracked) -> Usage:
        """The session's usage now: sampled if it runs (and watched from now on), final if it ended."""
        reported = session.usage_report()
        if reported is not None:
            return reported
        if session.finished:
            return self._finalize(session)
        if session.pid is None:  # queued: nothing has run yet
            return Usage()
        self._sample(session)
        self.watch(session)
        return self._track(session).best

    def latest(self, session: Tracked) -> Usage:
        """The usage at the last periodic sample, without sampling now (cheap enough to ask of
        every session every second); the session is watched from now on. Zeros until sampled."""
        reported = session.usage_report()
        if reported is not None:
            return reported
        if session.finished:
            return self._finalize(session)
        if session.pid is None:
            return Usage()
        self.watch(session)
        track = self._tracks.get(session)
        return track.best if track is not None else Usage()

    def rss_now(self, session: Tracked) -> int:
        """The tree's resident memory at its last sample (0 once it ended or before one was taken)."""
        if session.finished:
            return 0
        track = self._tracks.get(session)
        return sum(s.rss_bytes for s in track.last.values()) if track is not None else 0

    async def snapshot(
        self, sessions: Sequence[Tracked], budget: float | None = _LIST_SAMPLE_BUDGET
    ) -> dict[str, Usage | None]:
        """Each session's usage, keyed by id, for a listing: an ended one's final usage, a running
        one's best so far if sampled in the last couple of seconds, else sampled afresh in a
        worker thread, stalest first, for as long as ``budget`` seconds allow (None: all of them).
        A running tree not reached and never sampled is None (unknown, not zero); one sampled
        before keeps that value, and the next listing reaches it first. Nothing is watched.

        (Not read after the listing in the background instead: a thread reading a thousand trees
        holds the GIL between its reads, and the next listing's rows then took twice as long.)"""
        found: dict[str, Usage | None] = {}
        stale: list[tuple[float, Tracked]] = []
        now = time.monotonic()
        for session in sessions:
            reported = session.usage_report()
            if reported is not None:
                found[session.id] = reported
                continue
            if session.finished:
                found[session.id] = self._finalize(session)
                continue
            if session.pid is None:
                found[session.id] = Usage()  # queued, or between two runs of a restart
                continue
            track = self._tracks.get(session)
            at = None if track is None else track.sampled_at
            if track is not None and at is not None and now - at <= _LIST_SAMPLE_AGE:
                found[session.id] = track.best
            else:
                stale.append((-1.0 if at is None else at, session))
                found[session.id] = None if track is None or at is None else track.best
        backend = self._trees()
        if stale and backend is not None:
            stale.sort(key=lambda item: item[0])
            order = _trees_of([session for _, session in stale])
            trees = [tree for _, tree in order]
            readings = await asyncio.to_thread(_read_within, backend, trees, budget)
            for (session, _), reading in zip(order, readings, strict=False):
                if not session.finished:
                    found[session.id] = self._apply(session, reading)
            for session, _ in order:
                if session.finished:  # ended while its tree was read: the final figures
                    found[session.id] = self._finalize(session)
        return found

    def watch(self, session: Tracked) -> None:
        """Sample ``session`` periodically until it ends (cheap: one light task for all of them)."""
        if session.finished or session.usage_report() is not None:  # measured where it runs
            return
        self._watched.add(session)
        if self._task is not None and not self._task.done():
            return
        self._task = self._start(self._run)

    def forget(self, session: Tracked) -> None:
        self._watched.discard(session)
        self._tracks.pop(session, None)

    # -- sampling ------------------------------------------------------------------------------

    def _track(self, session: Tracked) -> _Track:
        track = self._tracks.get(session)
        if track is None:
            track = self._tracks[session] = _Track()
        return track

    def _sample(self, session: Tracked) -> None:
        backend = self._trees()
        if backend is None or session.pid is None or session.finished:
            return
        self._apply(session, _read(backend, session.id, session.pid))

    def _apply(self, session: Tracked, reading: _Reading) -> Usage:
        """Fold one reading of a running tree into its track; returns the best usage so far."""
        track = self._track(session)
        if not reading.known:
            return track.best  # not "every process gone": the figures so far stand
        samples = reading.samples
        for pid in track.last.keys() - samples.keys():
            gone = track.last[pid]
            if pid == session.pid:
                track.leader_last = gone  # its final counters come with wait4's rusage
            elif gone.ppid not in samples and gone.ppid not in track.last:
                # An orphan already (its parent was outside the tree): nobody in the tree will reap
                # it into their children's counters, so keep its own. A process whose parent was in
                # the tree is counted through that parent, and at the end through wait4's rusage.
                track.credit_cpu += gone.cpu_ms
                track.credit_read += gone.io_read_bytes
                track.credit_write += gone.io_write_bytes
        track.last = samples
        track.sampled_at = time.monotonic()
        cpu = sum(s.cpu_ms for s in samples.values()) + track.credit_cpu
        io_read = sum(s.io_read_bytes for s in samples.values()) + track.credit_read
        io_write = sum(s.io_write_bytes for s in samples.values()) + track.credit_write
        if track.leader_last is not None and session.pid not in samples:
            cpu += track.leader_last.cpu_ms
            io_read += track.leader_last.io_read_bytes
            io_write += track.leader_last.io_write_bytes
        if reading.cgroup_cpu_ms is not None:
            cpu = max(cpu, reading.cgroup_cpu_ms)
        # The tree's RSS now, or the peak of its largest process if that is more (a lower bound of
        # the tree's peak that also catches a spike between two samples).
        rss = sum(s.rss_bytes for s in samples.values())
        memory = max(rss, max((s.peak_rss_bytes for s in samples.values()), default=0))
        track.best = track.best.max(Usage(int(cpu), memory, io_read, io_write))
        return track.best

    def _finalize(self, session: Tracked) -> Usage:
        track = self._track(session)
        if track.final is not None:
            return track.final
        final = track.best
        account = session.accounting
        rusage = account.rusage
        if rusage is not None:
            leader_cpu = (rusage.ru_utime + rusage.ru_stime) * 1000
            # Above what the child inherited from us at spawn, ru_maxrss is the tree's own peak.
            peak = rusage.ru_maxrss * 1024 if rusage.ru_maxrss > account.spawner_maxrss_kb else 0
            final = final.max(Usage(cpu_ms=int(leader_cpu + track.credit_cpu), memory_peak_bytes=peak))
        if account.exit_io is not None:
            read, write = account.exit_io
            final = final.max(Usage(io_read_bytes=read + track.credit_read, io_write_bytes=write + track.credit_write))
        report = account.limit_report
        if report is not None and report.memory_peak_bytes:
            final = final.max(Usage(memory_peak_bytes=report.memory_peak_bytes))
        track.final = final
        track.last.clear()
        self._watched.discard(session)
        return final

    async def _run(self) -> None:
        while True:
            running = [s for s in list(self._watched) if not s.finished]
            for session in list(self._watched):
                if session.finished:
                    self._finalize(session)
            if not running:
                return
            young = any(s.started_at is not None and time.time() - s.started_at < _YOUNG_SEC for s in running)
            await asyncio.sleep(_FAST_INTERVAL if young else _SLOW_INTERVAL)
            backend = self._trees()
            if backend is None:
                return
            # Read in a worker thread: a console watching a thousand trees would otherwise hold
            # the event loop ~0.1 s every second.
            order = _trees_of(running)
            readings = await asyncio.to_thread(_read_within, backend, [tree for _, tree in order], None)
            for (session, _), reading in zip(order, readings, strict=True):
                if not session.finished:
                    self._apply(session, reading)


def _read(trees: Any, session_id: str, leader: int) -> _Reading:
    """The counters of a session's tree now (file reads only: safe in a worker thread)."""
    try:
        pids = trees.pids(session_id, leader)
    except MembershipUnknown:
        return _Reading({}, None, known=False)
    found = (sample_pid(pid) for pid in pids)
    return _Reading({s.pid: s for s in found if s is not None}, _cgroup_cpu_ms(trees, session_id))


def _read_within(trees: Any, trees_of: Sequence[tuple[str, int]], budget: float | None) -> list[_Reading]:
    """Readings of the (session id, leader pid) trees in order, stopping once ``budget`` seconds
    are spent (None: read them all)."""
    deadline = None if budget is None else time.monotonic() + budget
    readings: list[_Reading] = []
    for session_id, leader in trees_of:
        if deadline is not None and time.monotonic() >= deadline:
            break
        readings.append(_read(trees, session_id, leader))
    return readings


def _trees_of(sessions: Sequence[Tracked]) -> list[tuple[Tracked, tuple[str, int]]]:
    """What a worker thread needs of each running session, taken on the event loop."""
    return [(s, (s.id, s.pid)) for s in sessions if s.pid is not None and not s.finished]


class HasUsage(Protocol):
    @property
    def usage(self) -> UsageTracker: ...


def usage_tracker(supervisor: HasUsage) -> UsageTracker:
    """The supervisor's one tracker (``supervisor.usage``)."""
    return supervisor.usage
