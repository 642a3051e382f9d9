"""Resource limits per session (memory, CPU, pids) over the whole tree, by the best mechanism here.

Probed once at start-up, in order:

* ``cgroup2`` — a cgroup v2 hierarchy with the memory/cpu/pids controllers delegated to us:
  ``memory.max``, ``cpu.max``, ``pids.max``; OOM kills counted in ``memory.events``.
* ``cgroup1`` — the v1 controllers (this development machine): ``memory.limit_in_bytes`` (and
  ``memsw`` so swap is no way round it), ``cpu.cfs_quota_us``, ``pids.max``; OOM kills counted in
  ``memory.oom_control``.
* ``watchdog`` — no writable controller: the supervisor samples each limited tree's RSS and ends it
  by signal when it passes its memory limit. It cannot throttle CPU or cap forks; ``capabilities()``
  says so.

Every cgroup is created below the supervisor's own, joined by the child's first shell line before
it execs the user's command (never a ``preexec_fn``), and removed when the session ends.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from procpilot.engine.trees import hold_instance, kill_cgroup_v1, reap_stale_instances, release_instance

__all__ = ["LimitBackend", "LimitReport", "Limits", "probe_limits"]

_CPU_PERIOD_US = 100_000


@dataclass(frozen=True, slots=True)
class Limits:
    """Per-session limits; None means "no limit of this kind"."""

    memory_bytes: int | None = None
    cpu_fraction: float | None = None  # of one core
    pids_max: int | None = None
    # RLIMIT_AS of each process (not the tree): only on request, since runtimes that reserve large
    # virtual ranges up front (the JVM, Node, Go) fail under it at sizes they would never touch.
    address_space_bytes: int | None = None

    @property
    def empty(self) -> bool:
        """No limit over the tree (nothing for a cgroup or the watchdog to do)."""
        return self.memory_bytes is None and self.cpu_fraction is None and self.pids_max is None

    def rlimit_lines(self) -> list[str]:
        """Shell lines that set the per-process rlimits, run by the child before the command."""
        if self.address_space_bytes is None:
            return []
        return [f"ulimit -v {max(1, self.address_space_bytes // 1024)} || exit 125"]


@dataclass(frozen=True, slots=True)
class LimitReport:
    """What the kernel (or the watchdog) observed for one session."""

    oom_killed: bool
    memory_peak_bytes: int | None


class LimitBackend(Protocol):
    name: str
    enforces: frozenset[str]  # which of "memory", "cpu", "pids" it really enforces

    def prepare(self, session_id: str, limits: Limits) -> list[str]:
        """Create what the session needs; returns the shell lines that join it."""

    def report(self, session_id: str) -> LimitReport:
        """OOM kills and peak memory so far."""

    def release(self, session_id: str) -> None:
        """Remove what ``prepare`` created (the tree must be gone)."""

    def close(self) -> None: ...


def _write(path: Path, value: str) -> None:
    path.write_text(value)


def _rmdir(path: Path) -> None:
    for _ in range(50):
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.002)  # the kernel lags a moment behind the last exit in the group


def _join_line(procs_files: list[Path]) -> str:
    writes = " && ".join(f'echo $$ > "{p}"' for p in procs_files)
    return f"{{ {writes}; }} || exit 125"


class CgroupV1Limits:
    name = "cgroup1"
    enforces = frozenset({"memory", "cpu", "pids"})

    def __init__(self, roots: dict[str, Path]) -> None:
        self.roots = roots  # controller -> our directory in that hierarchy
        self._holds = [hold_instance(root) for root in roots.values()]

    def _dir(self, controller: str, session_id: str) -> Path:
        return self.roots[controller] / session_id

    def prepare(self, session_id: str, limits: Limits) -> list[str]:
        procs: list[Path] = []
        if limits.memory_bytes is not None:
            d = self._dir("memory", session_id)
            d.mkdir(exist_ok=True)
            _write(d / "memory.limit_in_bytes", str(limits.memory_bytes))
            with contextlib.suppress(OSError):  # absent without swap accounting
                _write(d / "memory.memsw.limit_in_bytes", str(limits.memory_bytes))
            procs.append(d / "cgroup.procs")
        if limits.cpu_fraction is not None:
            d = self._dir("cpu", session_id)
            d.mkdir(exist_ok=True)
            _write(d / "cpu.cfs_period_us", str(_CPU_PERIOD_US))
            _write(d / "cpu.cfs_quota_us", str(max(1000, int(limits.cpu_fraction * _CPU_PERIOD_US))))
            procs.append(d / "cgroup.procs")
        if limits.pids_max is not None:
            d = self._dir("pids", session_id)
            d.mkdir(exist_ok=True)
            _write(d / "pids.max", str(limits.pids_max))
            procs.append(d / "cgroup.procs")
        return [_join_line(procs)] if procs else []

    def report(self, session_id: str) -> LimitReport:
        d = self._dir("memory", session_id)
        oom = False
        peak = None
        with contextlib.suppress(OSError, ValueError):
            fields = dict(line.split() for line in (d / "memory.oom_control").read_text().splitlines())
            oom = int(fields.get("oom_kill", "0")) > 0
        with contextlib.suppress(OSError, ValueError):
            peak = int((d / "memory.max_usage_in_bytes").read_text())
        return LimitReport(oom, peak)

    def release(self, session_id: str) -> None:
        for controller in self.roots:
            d = self._dir(controller, session_id)
            if d.exists():
                _rmdir(d)

    def close(self) -> None:
        for root in self.roots.values():
            if root.exists():
                for child in root.iterdir():
                    if child.is_dir():
                        _rmdir(child)
                _rmdir(root)
        for hold in self._holds:
            release_instance(hold)
        self._holds = []


class CgroupV2Limits:
    name = "cgroup2"
    enforces = frozenset({"memory", "cpu", "pids"})

    def __init__(self, root: Path) -> None:
        self.root = root
        self._hold = hold_instance(root)

    def prepare(self, session_id: str, limits: Limits) -> list[str]:
        d = self.root / session_id
        d.mkdir(exist_ok=True)
        if limits.memory_bytes is not None:
            _write(d / "memory.max", str(limits.memory_bytes))
            with contextlib.suppress(OSError):
                _write(d / "memory.swap.max", "0")
        if limits.cpu_fraction is not None:
            quota = max(1000, int(limits.cpu_fraction * _CPU_PERIOD_US))
            _write(d / "cpu.max", f"{quota} {_CPU_PERIOD_US}")
        if limits.pids_max is not None:
            _write(d / "pids.max", str(limits.pids_max))
        return [_join_line([d / "cgroup.procs"])]

    def report(self, session_id: str) -> LimitReport:
        d = self.root / session_id
        oom = False
        peak = None
        with contextlib.suppress(OSError, ValueError):
            fields = dict(line.split() for line in (d / "memory.events").read_text().splitlines())
            oom = int(fields.get("oom_kill", "0")) > 0
        with contextlib.suppress(OSError, ValueError):
            peak = int((d / "memory.peak").read_text())
        return LimitReport(oom, peak)

    def release(self, session_id: str) -> None:
        d = self.root / session_id
        if d.exists():
            with contextlib.suppress(OSError):
                _write(d / "cgroup.kill", "1")
            _rmdir(d)

    def close(self) -> None:
        if self.root.exists():
            for child in self.root.iterdir():
                if child.is_dir():
                    self.release(child.name)
            _rmdir(self.root)
        release_instance(self._hold)
        self._hold = None


class WatchdogLimits:
    """No controller to write: memory is enforced by sampling, the rest is not enforced."""

    name = "watchdog"
    enforces = frozenset({"memory"})

    def __init__(self) -> None:
        self.peaks: dict[str, int] = {}
        self.killed: set[str] = set()

    def prepare(self, session_id: str, limits: Limits) -> list[str]:
        self.peaks[session_id] = 0
        return []

    def observe(self, session_id: str, rss_bytes: int, limit: int | None) -> bool:
        """Record a sample; True iff the tree is over its memory limit and must be ended."""
        self.peaks[session_id] = max(self.peaks.get(session_id, 0), rss_bytes)
        if limit is not None and rss_bytes > limit:
            self.killed.add(session_id)
            return True
        return False

    def report(self, session_id: str) -> LimitReport:
        return LimitReport(session_id in self.killed, self.peaks.get(session_id))

    def release(self, session_id: str) -> None:
        self.peaks.pop(session_id, None)
        self.killed.discard(session_id)

    def close(self) -> None:
        self.peaks.clear()


def _own_v1_cgroups() -> dict[str, Path]:
    """controller -> the supervisor's own directory in that v1 hierarchy, for memory/cpu/pids."""
    mounts: dict[str, Path] = {}
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                left, _, right = line.partition(" - ")
                fs = right.split()
                if fs and fs[0] == "cgroup":
                    options = fs[-1].split(",")
                    for controller in ("memory", "cpu", "pids"):
                        if controller in options:
                            mounts[controller] = Path(left.split()[4])
        own: dict[str, str] = {}
        with open("/proc/self/cgroup") as f:
            for line in f:
                _, controllers, path = line.strip().split(":", 2)
                for controller in controllers.split(","):
                    own[controller] = path
    except (OSError, ValueError):
        return {}
    return {c: mounts[c] / own[c].lstrip("/") for c in mounts if c in own}


def _try_v1(name: str) -> CgroupV1Limits | None:
    own = _own_v1_cgroups()
    if set(own) != {"memory", "cpu", "pids"}:
        return None
    for parent in own.values():
        # What crashed supervisors left beside ours: their sessions may still run, unlimited now.
        reap_stale_instances(parent, kill_cgroup_v1)
    roots = {c: p / name for c, p in own.items()}
    try:
        for root in roots.values():
            root.mkdir(exist_ok=True)
        probe = roots["memory"] / "probe"
        probe.mkdir(exist_ok=True)
        (probe / "memory.limit_in_bytes").write_text(str(1 << 30))
        _rmdir(probe)
    except OSError:
        for root in roots.values():
            with contextlib.suppress(OSError):
                root.rmdir()
        return None
    return CgroupV1Limits(roots)


def _try_v2(root: Path | None) -> CgroupV2Limits | None:
    """``root``: the directory whose children are the sessions' cgroups (the tree backend's own,
    when it groups by cgroup v2: a process is in one v2 cgroup only, so limits must live there)."""
    if root is None:
        return None
    created = not root.exists()
    try:
        root.mkdir(exist_ok=True)
        available = set((root / "cgroup.controllers").read_text().split())
        if not {"memory", "cpu", "pids"} <= available:
            raise OSError("memory, cpu and pids are not delegated to us")
        (root / "cgroup.subtree_control").write_text("+memory +cpu +pids")
    except OSError:
        if created:
            with contextlib.suppress(OSError):
                root.rmdir()
        return None
    return CgroupV2Limits(root)


def probe_limits(prefer: str = "auto", v2_root: Path | None = None, name: str | None = None) -> LimitBackend:
    """The best limit mechanism available: cgroup v2, then v1, then the watchdog.

    ``v2_root`` is where v2 session cgroups live (default: a directory ``name`` below our own
    cgroup); ``name`` is this supervisor's directory name in every hierarchy.
    """
    from procpilot.engine.trees import instance_name, own_unified_cgroup

    name = name or instance_name()
    if prefer in ("auto", "cgroup2"):
        if v2_root is None:
            base = own_unified_cgroup()
            v2_root = None if base is None else base / name
        backend: LimitBackend | None = _try_v2(v2_root)
        if backend is not None:
            return backend
    if prefer in ("auto", "cgroup1"):
        backend = _try_v1(name)
        if backend is not None:
            return backend
    return WatchdogLimits()
