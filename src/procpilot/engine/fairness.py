"""CPU fairness between agents: one cgroup per agent, of equal weight, above its sessions' cgroups.

Without it the scheduler weighs processes, not agents: an agent running eight busy processes gets
eight times the CPU of one running a single process, and a flood of short commands takes the
cores from every other agent's calls. With it, each agent that has something running gets an
equal share of what the supervisor's sessions get together, however many processes it starts
(the share only counts under contention: an agent alone on the machine may use all of it).

The mechanism follows the limits backend (engine/limits.py), since the weight is a CPU
controller's:

* ``cgroup2``: ``<ours>/agent-<name>/<session>``, the agent's directory with ``cpu.weight`` 100
  and the controllers passed on to its sessions (their own limits live there). The session's tree
  directory is that same directory (engine/trees.py): a process is in one v2 cgroup only.
* ``cgroup1``: ``<ours in the cpu hierarchy>/agent-<name>`` with ``cpu.shares`` 1024, which
  every process of the agent's sessions joins; a session with a CPU limit has its own directory
  below it. Memory and pids limits are each session's own, as before (v1 hierarchies are
  separate, so nothing there needs the extra level).
* none (the watchdog, or a v2 hierarchy without the cpu controller): no fairness, and
  ``capabilities()`` says so.

An agent's directory is made on its first session and removed when it has none left (warm shells
made for it count, engine/warm.py). Its name is derived from the agent's id, never the id itself:
at most 24 characters of ``[A-Za-z0-9_.-]`` for people to read, then a hash of the whole id, so
no id (``..``, ``a/b``, an empty one) can name a path outside ours, and two ids cannot share one.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path

from procpilot.engine.cgroup_janitor import keep, remove_later, remove_now
from procpilot.engine.limits import CgroupV1Limits, CgroupV2Limits, LimitBackend
from procpilot.engine.trees import CgroupTrees, TreeBackend

__all__ = ["AgentGroups", "Placement", "group_name", "probe_fairness"]

_V1_SHARES = "1024"  # the default of a v1 cgroup, written anyway: equal whatever the host's defaults
_V2_WEIGHT = "100"
_CONTROLLERS = "+cpu +memory +pids"
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")
_NAMES_KEPT = 1024  # agents whose group's name is kept (past it the cache starts again)


def group_name(agent: str) -> str:
    """The directory name of ``agent``'s group: readable where the id is, unique by its hash."""
    readable = _UNSAFE.sub("_", agent)[:24].strip(".")
    digest = hashlib.sha256(agent.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    return f"agent-{readable}-{digest}" if readable else f"agent-{digest}"


@dataclass(frozen=True, slots=True)
class Placement:
    """Where one session of an agent goes."""

    group: str | None  # the agent's directory name (for the limits backend), None: no fairness
    tree_group: str | None  # the same, when the session's tree directory must be inside it (v2)
    lines: list[str] = field(default_factory=list)  # shell lines that join it (v1), run first


_NONE = Placement(None, None)


class AgentGroups:
    """The agents' groups of one supervisor, made when needed and removed when unused."""

    def __init__(self, mechanism: str | None, base: Path | None, why_not: str | None = None) -> None:
        self.mechanism = mechanism  # "cgroup2" (cpu.weight), "cgroup1" (cpu.shares) or None
        self.base = base  # where the agents' directories are made
        self.why_not = why_not
        self._members: dict[str, set[str]] = {}  # group -> its sessions (and warm shells)
        self._group_of: dict[str, str] = {}  # session id -> group
        self._names: dict[str, str] = {}  # agent -> its group's name (group_name, kept)

    @property
    def active(self) -> bool:
        return self.mechanism is not None

    def describe(self) -> dict[str, object]:
        """For ``capabilities()`` and ``doctor``."""
        if self.mechanism is None:
            return {"between_agents": False, "why": self.why_not}
        knob = "cpu.weight 100" if self.mechanism == "cgroup2" else "cpu.shares 1024"
        return {"between_agents": True, "mechanism": self.mechanism, "weight": knob, "agents": len(self._members)}

    def enter(self, agent: str, session_id: str) -> Placement:
        """Put ``session_id`` in ``agent``'s group (made now if it is the agent's first): what the
        session's backends and its first shell line need. Raises OSError if it cannot be made."""
        if self.mechanism is None or self.base is None:
            return _NONE
        group = self._names.get(agent)
        if group is None:
            group = group_name(agent)  # a hash: named once per agent, not per session
            if len(self._names) >= _NAMES_KEPT:
                self._names.clear()
            self._names[agent] = group
        if group not in self._members:
            path = self.base / group
            keep(path)  # its removal, if its last session just left, is called off
            self._make(path)
            self._members[group] = set()
        self._members[group].add(session_id)
        self._group_of[session_id] = group
        if self.mechanism == "cgroup2":
            return Placement(group, group)
        return Placement(group, None, [f'echo $$ > "{self.base / group}/cgroup.procs" || exit 125'])

    def has(self, session_id: str) -> bool:
        """Whether ``session_id`` is in a group (``group_of`` without building its path)."""
        return session_id in self._group_of

    def group_of(self, session_id: str) -> Path | None:
        """The directory of the group ``session_id`` is in, if any."""
        group = self._group_of.get(session_id)
        return None if group is None or self.base is None else self.base / group

    def _make(self, path: Path) -> None:
        with contextlib.suppress(FileExistsError):
            path.mkdir()
        if self.mechanism == "cgroup2":
            (path / "cpu.weight").write_text(_V2_WEIGHT)
            # Its sessions' limits (memory.max, cpu.max, pids.max) are written in their directories.
            (path / "cgroup.subtree_control").write_text(_CONTROLLERS)
        else:
            (path / "cpu.shares").write_text(_V1_SHARES)

    def leave(self, session_id: str) -> None:
        """``session_id`` has ended (its tree is gone): its agent's group goes with its last one."""
        group = self._group_of.pop(session_id, None)
        if group is None:
            return
        members = self._members.get(group)
        if members is None:
            return
        members.discard(session_id)
        if not members and self.base is not None:
            del self._members[group]
            # After its last session's own directories, which that session's end queued first.
            remove_later(self.base / group)

    def close(self) -> None:
        """Remove every group left (the supervisor's trees are gone)."""
        for group in list(self._members):
            if self.base is not None:
                remove_now(self.base / group)
        self._members.clear()
        self._group_of.clear()


def probe_fairness(trees: TreeBackend, limits: LimitBackend) -> AgentGroups:
    """Agents' groups by the CPU controller the limits backend writes, if it has one."""
    if isinstance(limits, CgroupV2Limits):
        if not isinstance(trees, CgroupTrees) or trees.root != limits.root:
            return AgentGroups(None, None, "the sessions' cgroup v2 trees are not where their limits are")
        try:
            enabled = set((limits.root / "cgroup.subtree_control").read_text().split())
        except OSError as exc:
            return AgentGroups(None, None, f"{limits.root} cannot be read: {exc.strerror}")
        if "cpu" not in enabled:
            return AgentGroups(None, None, f"the cpu controller is not enabled in {limits.root}")
        return AgentGroups("cgroup2", limits.root)
    if isinstance(limits, CgroupV1Limits) and "cpu" in limits.roots:
        return AgentGroups("cgroup1", limits.roots["cpu"])
    why = f"no writable cpu controller (limits by {limits.name})"
    if limits.passed_over:
        why += ": " + "; ".join(f"{name}: {reason}" for name, reason in limits.passed_over.items())
    return AgentGroups(None, None, why)
