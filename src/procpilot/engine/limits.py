"""Resource limits per session (memory, CPU, pids) over the whole tree, by the best mechanism here.

Probed once at start-up, in order:

* ``cgroup2`` — a cgroup v2 hierarchy with the memory/cpu/pids controllers delegated to us:
  ``memory.max``, ``cpu.max``, ``pids.max``; OOM kills counted in ``memory.events``.
* ``cgroup1`` — the v1 controllers (this development machine): ``memory.limit_in_bytes`` (and
  ``memsw`` so swap is no way round it), ``cpu.cfs_quota_us``, ``pids.max``; OOM kills counted in
  ``memory.oom_control``.
* ``watchdog`` — no writable controller: the supervisor samples each limited tree every 100 ms and
  enforces by signal: past its memory or pids limit the tree is ended, and CPU is held to its share
  by stopping (SIGSTOP) and continuing (SIGCONT) the tree. A fork bomb can outrun a 100 ms look;
  ``capabilities()`` says which mechanism is in use.

Every cgroup is created below the supervisor's own, joined by the child's first shell line before
it execs the user's command (never a ``preexec_fn``), and removed when the session ends.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

from procpilot.engine.cgroup_janitor import remove_later, remove_now
from procpilot.engine.trees import (
    enable_controllers,
    hold_instance,
    kill_cgroup_v1,
    reap_stale_instances,
    release_instance,
)

__all__ = ["LimitBackend", "LimitReport", "Limits", "TreeSample", "WatchdogLimits", "probe_limits"]

_CPU_PERIOD_US = 100_000
_CONTROLLERS = ("cpu", "memory", "pids")


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

    oom_killed: bool  # ended for passing a limit (the kernel's OOM killer, or the watchdog)
    memory_peak_bytes: int | None
    limit: str | None = None  # which: "memory" or "pids" (the watchdog's); None if none was passed


class LimitBackend(Protocol):
    name: str
    enforces: frozenset[str]  # which of "memory", "cpu", "pids" it really enforces
    passed_over: dict[str, str]  # better mechanisms probed and not used -> why not

    def prepare(self, session_id: str, limits: Limits, group: str | None = None) -> list[str]:
        """Create what the session needs (its CPU cgroup below ``group``, its agent's directory,
        engine/fairness.py); returns the shell lines that join it."""

    def report(self, session_id: str) -> LimitReport:
        """OOM kills and peak memory so far."""

    def release(self, session_id: str, *, later: bool = False) -> None:
        """Remove what ``prepare`` created (the tree must be gone). ``later``: its id will not be
        used again, so its directories may go on the cgroup janitor's thread."""

    def close(self) -> None: ...


def _write(path: Path, value: str) -> None:
    path.write_text(value)


def _rmdir_tree(path: Path) -> None:
    """rmdir ``path`` and the cgroups below it (an agent's group, its sessions'), deepest first."""
    with contextlib.suppress(OSError):
        for child in path.iterdir():
            if child.is_dir():
                _rmdir_tree(child)
    remove_now(path)


def _join_line(procs_files: list[Path]) -> str:
    writes = " && ".join(f'echo $$ > "{p}"' for p in procs_files)
    return f"{{ {writes}; }} || exit 125"


class CgroupV1Limits:
    name = "cgroup1"
    enforces = frozenset({"memory", "cpu", "pids"})

    def __init__(self, roots: dict[str, Path]) -> None:
        self.passed_over: dict[str, str] = {}
        self.roots = roots  # controller -> our directory in that hierarchy
        self._holds = [hold_instance(root) for root in roots.values()]
        # session id -> its agent's directory in the cpu hierarchy: only CPU is shared out by
        # agent (engine/fairness.py); memory and pids limits are each session's own.
        self._cpu_groups: dict[str, str] = {}

    def _dir(self, controller: str, session_id: str) -> Path:
        group = self._cpu_groups.get(session_id) if controller == "cpu" else None
        return self.roots[controller] / group / session_id if group else self.roots[controller] / session_id

    def prepare(self, session_id: str, limits: Limits, group: str | None = None) -> list[str]:
        procs: list[Path] = []
        if group is not None:
            self._cpu_groups[session_id] = group
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

    def roots_of(self, session_id: str) -> dict[str, Path]:
        """controller -> the directory holding the session's (its agent's, for cpu)."""
        return {c: self._dir(c, session_id).parent for c in self.roots}

    def report(self, session_id: str) -> LimitReport:
        d = self._dir("memory", session_id)
        oom = False
        peak = None
        with contextlib.suppress(OSError, ValueError):
            fields = dict(line.split() for line in (d / "memory.oom_control").read_text().splitlines())
            oom = int(fields.get("oom_kill", "0")) > 0
        with contextlib.suppress(OSError, ValueError):
            peak = int((d / "memory.max_usage_in_bytes").read_text())
        return LimitReport(oom, peak, "memory" if oom else None)

    def release(self, session_id: str, *, later: bool = False) -> None:
        for controller in self.roots:
            d = self._dir(controller, session_id)
            if d.exists():
                (remove_later if later else remove_now)(d)
        self._cpu_groups.pop(session_id, None)

    def detach(self) -> None:
        """Forget the directories without ending what runs in them (left to the next server)."""
        for hold in self._holds:
            release_instance(hold)
        self._holds = []

    def close(self) -> None:
        for root in self.roots.values():
            if root.exists():
                _rmdir_tree(root)
        self._cpu_groups.clear()
        for hold in self._holds:
            release_instance(hold)
        self._holds = []


class CgroupV2Limits:
    name = "cgroup2"
    enforces = frozenset({"memory", "cpu", "pids"})

    def __init__(self, root: Path) -> None:
        self.passed_over: dict[str, str] = {}
        self.root = root
        self._hold = hold_instance(root)
        self._groups: dict[str, str] = {}  # session id -> its agent's directory (engine/fairness.py)

    def _dir(self, session_id: str) -> Path:
        group = self._groups.get(session_id)
        return self.root / group / session_id if group else self.root / session_id

    def prepare(self, session_id: str, limits: Limits, group: str | None = None) -> list[str]:
        if group is not None:
            self._groups[session_id] = group
        d = self._dir(session_id)
        d.mkdir(parents=True, exist_ok=True)
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

    def roots_of(self, session_id: str) -> dict[str, Path]:
        """The directory holding the session's (its agent's, if it is in one)."""
        return {"v2": self._dir(session_id).parent}

    def report(self, session_id: str) -> LimitReport:
        d = self._dir(session_id)
        oom = False
        peak = None
        with contextlib.suppress(OSError, ValueError):
            fields = dict(line.split() for line in (d / "memory.events").read_text().splitlines())
            oom = int(fields.get("oom_kill", "0")) > 0
        with contextlib.suppress(OSError, ValueError):
            peak = int((d / "memory.peak").read_text())
        return LimitReport(oom, peak, "memory" if oom else None)

    def release(self, session_id: str, *, later: bool = False) -> None:
        d = self._dir(session_id)
        if d.exists():
            with contextlib.suppress(OSError):
                _write(d / "cgroup.kill", "1")
            (remove_later if later else remove_now)(d)
        self._groups.pop(session_id, None)

    def detach(self) -> None:
        """Forget the directory without ending what runs in it (left to the next server)."""
        release_instance(self._hold)
        self._hold = None

    def close(self) -> None:
        if self.root.exists():
            with contextlib.suppress(OSError):
                _write(self.root / "cgroup.kill", "1")  # what still runs in every group below
            _rmdir_tree(self.root)
        self._groups.clear()
        release_instance(self._hold)
        self._hold = None


@dataclass(frozen=True, slots=True)
class TreeSample:
    """One look at a tree: what the watchdog decides on."""

    rss_bytes: int
    cpu_seconds: float  # user + system of its live processes, with the children they reaped
    processes: int


@dataclass(slots=True)
class _CpuBucket:
    cpu_seconds: float
    at: float
    stopped_until: float | None = None


Verdict = Literal["kill", "stop", "continue"] | None


class WatchdogLimits:
    """No controller to write: the supervisor samples each limited tree (every 100 ms) and this
    decides, and the supervisor enforces by signal. Memory or process count past the limit: the tree
    is ended. CPU: a token bucket; a tree that used more than its share since the last look is
    stopped (SIGSTOP) just long enough to bring it back to its share, then continued (SIGCONT)."""

    name = "watchdog"
    enforces = frozenset({"memory", "cpu", "pids"})

    def __init__(self) -> None:
        self.passed_over: dict[str, str] = {}
        self.peaks: dict[str, int] = {}
        self.exceeded: dict[str, str] = {}
        self._cpu: dict[str, _CpuBucket] = {}

    def prepare(self, session_id: str, limits: Limits, group: str | None = None) -> list[str]:
        self.peaks[session_id] = 0
        return []

    def observe(self, session_id: str, sample: TreeSample, limits: Limits, now: float) -> Verdict:
        """Record a sample and say what the tree needs: ``kill`` (over its memory or pids limit),
        ``stop`` (ahead of its CPU share), ``continue`` (its stop is over), or nothing."""
        self.peaks[session_id] = max(self.peaks.get(session_id, 0), sample.rss_bytes)
        for limit, value, cap in (
            ("memory", sample.rss_bytes, limits.memory_bytes),
            ("pids", sample.processes, limits.pids_max),
        ):
            if cap is not None and value > cap:
                self.exceeded[session_id] = limit
                return "kill"
        if limits.cpu_fraction is None:
            return None
        bucket = self._cpu.get(session_id)
        if bucket is None:
            self._cpu[session_id] = _CpuBucket(sample.cpu_seconds, now)
            return None
        if bucket.stopped_until is not None:
            if now < bucket.stopped_until:
                return None
            # The stop paid the debt: the share earned while stopped is what was overspent.
            bucket.stopped_until, bucket.cpu_seconds, bucket.at = None, sample.cpu_seconds, now
            return "continue"
        used = sample.cpu_seconds - bucket.cpu_seconds
        allowed = limits.cpu_fraction * (now - bucket.at)
        bucket.cpu_seconds, bucket.at = sample.cpu_seconds, now
        if used <= allowed:
            return None
        bucket.stopped_until = now + (used - allowed) / limits.cpu_fraction
        return "stop"

    def resume(self, session_id: str) -> bool:
        """Forget a stop (the tree is being ended: it must run to receive its signal); True iff it was stopped."""
        bucket = self._cpu.get(session_id)
        if bucket is None or bucket.stopped_until is None:
            return False
        bucket.stopped_until = None
        return True

    def report(self, session_id: str) -> LimitReport:
        limit = self.exceeded.get(session_id)
        return LimitReport(limit is not None, self.peaks.get(session_id), limit)

    def release(self, session_id: str, *, later: bool = False) -> None:
        self.peaks.pop(session_id, None)
        self.exceeded.pop(session_id, None)
        self._cpu.pop(session_id, None)

    def close(self) -> None:
        self.peaks.clear()
        self._cpu.clear()


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


def _try_v1(name: str) -> CgroupV1Limits | str:
    """The v1 backend, or why not."""
    own = _own_v1_cgroups()
    if set(own) != {"memory", "cpu", "pids"}:
        absent = sorted({"memory", "cpu", "pids"} - set(own))
        return f"no v1 hierarchy mounted for {', '.join(absent)}"
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
        remove_now(probe)
    except OSError as exc:
        for root in roots.values():
            with contextlib.suppress(OSError):
                root.rmdir()
        return f"cannot write below {own['memory']}: {exc.strerror}"
    return CgroupV1Limits(roots)


def _try_v2(root: Path | None) -> CgroupV2Limits | str:
    """``root``: the directory whose children are the sessions' cgroups (the tree backend's own,
    when it groups by cgroup v2: a process is in one v2 cgroup only, so limits must live there).
    Returns the backend, or why not."""
    if root is None:
        return "no writable cgroup v2 hierarchy"
    reason = enable_controllers(root.parent, _CONTROLLERS)
    if reason is not None:
        return reason
    created = not root.exists()
    try:
        root.mkdir(exist_ok=True)
        (root / "cgroup.subtree_control").write_text(" ".join(f"+{c}" for c in _CONTROLLERS))
    except OSError as exc:
        if created:
            with contextlib.suppress(OSError):
                root.rmdir()
        return f"cannot enable {', '.join(_CONTROLLERS)} in {root}: {exc.strerror}"
    return CgroupV2Limits(root)


def probe_limits(prefer: str = "auto", v2_root: Path | None = None, name: str | None = None) -> LimitBackend:
    """The best limit mechanism available: cgroup v2, then v1, then the watchdog. The backend's
    ``passed_over`` says why each better one was not used.

    ``v2_root`` is where v2 session cgroups live (default: a directory ``name`` below our own
    cgroup); ``name`` is this supervisor's directory name in every hierarchy.
    """
    from procpilot.engine.trees import instance_name, own_unified_cgroup

    name = name or instance_name()
    passed_over: dict[str, str] = {}
    if prefer in ("auto", "cgroup2"):
        if v2_root is None:
            base = own_unified_cgroup()
            v2_root = None if base is None else base / name
        v2 = _try_v2(v2_root)
        if not isinstance(v2, str):
            return v2
        passed_over["cgroup2"] = v2
    if prefer in ("auto", "cgroup1"):
        v1 = _try_v1(name)
        if not isinstance(v1, str):
            v1.passed_over = passed_over
            return v1
        passed_over["cgroup1"] = v1
    watchdog = WatchdogLimits()
    watchdog.passed_over = passed_over
    return watchdog
