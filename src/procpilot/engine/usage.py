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
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil

if TYPE_CHECKING:
    from procpilot.engine.session import Session
    from procpilot.engine.supervisor import Supervisor

__all__ = ["PidSample", "Usage", "UsageTracker", "sample_pid", "sample_tree", "usage_tracker"]

# Sampling cadence while watched trees run: fast while one of them is young (a short-lived
# grandchild is still caught), then once a second.
_FAST_INTERVAL = 0.2
_SLOW_INTERVAL = 1.0
_YOUNG_SEC = 3.0


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
    try:
        text = (root / session_id / "cpu.stat").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == "usage_usec":
            with contextlib.suppress(ValueError):
                return int(value) // 1000
    return None


@dataclass(slots=True)
class _Track:
    last: dict[int, PidSample] = field(default_factory=dict)
    # Counters of processes that vanished with no parent in the tree left to absorb them.
    credit_cpu: float = 0.0
    credit_read: int = 0
    credit_write: int = 0
    leader_last: PidSample | None = None
    best: Usage = field(default_factory=Usage)
    final: Usage | None = None


class UsageTracker:
    """Per-session resource usage over whole trees; one per supervisor (``Supervisor.usage``)."""

    def __init__(self, supervisor: Supervisor) -> None:
        self._sup = weakref.ref(supervisor)
        self._tracks: weakref.WeakKeyDictionary[Session, _Track] = weakref.WeakKeyDictionary()
        self._watched: weakref.WeakSet[Session] = weakref.WeakSet()
        self._task: asyncio.Task[None] | None = None

    def usage(self, session: Session) -> Usage:
        """The session's usage now: sampled if it runs (and watched from now on), final if it ended."""
        if session.finished:
            return self._finalize(session)
        if session.pid is None:  # queued: nothing has run yet
            return Usage()
        self._sample(session)
        self.watch(session)
        return self._track(session).best

    def watch(self, session: Session) -> None:
        """Sample ``session`` periodically until it ends (cheap: one light task for all of them)."""
        if session.finished:
            return
        self._watched.add(session)
        sup = self._sup()
        if sup is None or sup._closed or (self._task is not None and not self._task.done()):
            return
        self._task = sup._spawn_task(self._run())

    def forget(self, session: Session) -> None:
        self._watched.discard(session)
        self._tracks.pop(session, None)

    # -- sampling ------------------------------------------------------------------------------

    def _track(self, session: Session) -> _Track:
        track = self._tracks.get(session)
        if track is None:
            track = self._tracks[session] = _Track()
        return track

    def _sample(self, session: Session) -> None:
        sup = self._sup()
        if sup is None or session.pid is None or session.finished:
            return
        track = self._track(session)
        trees = sup._tree_backend
        found = (sample_pid(pid) for pid in trees.pids(session.id, session.pid))
        samples = {s.pid: s for s in found if s is not None}
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
        cpu = sum(s.cpu_ms for s in samples.values()) + track.credit_cpu
        io_read = sum(s.io_read_bytes for s in samples.values()) + track.credit_read
        io_write = sum(s.io_write_bytes for s in samples.values()) + track.credit_write
        if track.leader_last is not None and session.pid not in samples:
            cpu += track.leader_last.cpu_ms
            io_read += track.leader_last.io_read_bytes
            io_write += track.leader_last.io_write_bytes
        cgroup_cpu = _cgroup_cpu_ms(trees, session.id)
        if cgroup_cpu is not None:
            cpu = max(cpu, cgroup_cpu)
        # The tree's RSS now, or the peak of its largest process if that is more (a lower bound of
        # the tree's peak that also catches a spike between two samples).
        rss = sum(s.rss_bytes for s in samples.values())
        memory = max(rss, max((s.peak_rss_bytes for s in samples.values()), default=0))
        now = Usage(int(cpu), memory, io_read, io_write)
        track.best = track.best.max(now)

    def _finalize(self, session: Session) -> Usage:
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
            for session in running:
                self._sample(session)


def usage_tracker(supervisor: Supervisor) -> UsageTracker:
    """The supervisor's one tracker (``supervisor.usage``)."""
    return supervisor.usage
