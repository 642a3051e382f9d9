"""Process trees: knowing every process a session started, and ending all of them.

Two mechanisms, picked once at start-up by probing:

* ``CgroupTrees`` — a cgroup v2 directory per session (on the unified hierarchy, which needs no
  controllers to group processes). The child joins it *before* it execs the user's command (the
  shell line that starts every session writes ``$$`` to ``cgroup.procs``), so nothing it forks,
  setsid'd daemons included, can be outside it. ``cgroup.kill`` ends the lot atomically.
* ``ScanTrees`` — no writable cgroup: while a supervisor is open its process is a child
  subreaper (engine/children.py), so double-forked daemons are re-parented to *us* rather than
  init, and a session's tree is every process whose session or group id is the leader's, their
  descendants, and adopted orphans carrying the session's marker in their environment.

Both also reap adopted orphans (we are their parent now) so no zombie is left behind.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import os
import platform
import re
import secrets
import signal
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Protocol

from procpilot.engine.cgroup_janitor import remove_later, remove_now
from procpilot.engine.children import is_subreaper
from procpilot.engine.procfs import GONE, Spare, read_small, stat_fields

__all__ = [
    "MARKER_ENV",
    "SUPERVISOR_ENV",
    "AdoptedScanTrees",
    "CgroupTrees",
    "MembershipUnknown",
    "ScanTrees",
    "TreeBackend",
    "enable_controllers",
    "hold_instance",
    "instance_name",
    "kill_cgroup_v1",
    "kill_cgroup_v2",
    "probe_trees",
    "reap_stale_instances",
    "release_instance",
]

MARKER_ENV = "PROCPILOT_SESSION"
# Which supervisor started a process (its instance name, see instance_name): lets an operator, or a
# test suite beside a live daemon, tell one supervisor's processes from another's.
SUPERVISOR_ENV = "PROCPILOT_SUPERVISOR"


class MembershipUnknown(OSError):
    """A tree's members could not be read now (no descriptor free, no memory): not "empty". The
    caller looks again later; it never ends a session, or calls a tree gone, on this."""


class TreeBackend(Protocol):
    name: str

    def prepare(self, session_id: str, group: str | None = None) -> str | None:
        """Make room for a session (in ``group``, a directory below ours: its agent's, see
        engine/fairness.py); returns the shell line that joins it, or None."""

    def pids(self, session_id: str, leader: int | None) -> set[int]:
        """Every live process of the session; ``leader`` is its first pid (its session/group id).

        Raises :class:`MembershipUnknown` when they cannot be read now: an empty set always
        means the tree is empty."""

    def signal(self, session_id: str, leader: int | None, sig: int, *, leader_alive: bool) -> int:
        """Deliver ``sig`` to the whole tree; returns how many processes it reached. Never raises
        :class:`MembershipUnknown`: what cannot be found now is signalled on the caller's next try.

        ``leader_alive`` is False once the leader is reaped: its pid may then belong to a
        stranger and must never be signalled directly.
        """

    def release(self, session_id: str, *, later: bool = False) -> None:
        """Forget the session (its tree must be empty). ``later``: its id will not be used again,
        so its directory may go on the cgroup janitor's thread (engine/cgroup_janitor.py)."""

    def close(self) -> None:
        """Forget everything this backend created."""


def _read_stat(pid: int) -> tuple[int, int, int, str] | None:
    """(ppid, pgid, sid, state) of a process, or None if it is gone or hidden from us (/proc
    mounted with hidepid: not ours). OSError when it cannot be read now (no descriptor free)."""
    try:
        rest = stat_fields(pid)
    except PermissionError:
        return None
    if rest is None:
        return None
    return int(rest[1]), int(rest[2]), int(rest[3]), rest[0].decode()


def _all_pids() -> Iterable[int]:
    for name in os.listdir("/proc"):
        if name.isdigit():
            yield int(name)


def _marker_of(pid: int) -> str | None:
    """The session marker in a process's environment: "" if it has none (or we may not read it),
    None if the process is exiting.

    A process in the middle of exiting has already dropped its memory: its environment cannot be
    opened (ESRCH) or reads as empty (older kernels), which says nothing about whose it was, but
    it may still hold its files (a port).
    """
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = f.read()
    except ProcessLookupError:
        return None if os.path.exists(f"/proc/{pid}") else ""
    except OSError as exc:
        if exc.errno in GONE or exc.errno in (errno.EACCES, errno.EPERM):
            return ""  # gone, or not ours to read (so not one of ours)
        raise  # no descriptor, no memory: whose it is is unknown, not "nobody's"
    if not env:
        return None
    prefix = f"{MARKER_ENV}=".encode()
    for item in env.split(b"\0"):
        if item.startswith(prefix):
            return item[len(prefix) :].decode(errors="replace")
    return ""


def _signal_pids(pids: Iterable[int], sig: int) -> int:
    reached = 0
    for pid in pids:
        try:
            os.kill(pid, sig)
            reached += 1
        except ProcessLookupError:
            pass
    return reached


class ScanTrees:
    """Tree discovery by walking /proc (no cgroup available)."""

    name = "scan"

    def __init__(self, spare: Spare | None = None) -> None:
        self._me = os.getpid()
        # A walk of /proc takes a descriptor (one at a time: the listing, then each file read).
        # One is kept for it: with the table full (a burst of spawns took the last one, an
        # unprivileged server's parking refused), ending the sessions must still find their trees.
        # ``spare``: another backend's (adopted sessions' beside ours), which that one closes.
        self._own_spare = spare is None
        self.spare = spare or Spare()

    @property
    def subreaper(self) -> bool:
        """True iff orphans come back to us: while a supervisor is open (engine/children.py)."""
        return is_subreaper()

    def prepare(self, session_id: str, group: str | None = None) -> str | None:
        return None

    def pids(self, session_id: str, leader: int | None) -> set[int]:
        try:
            return self.spare.read(lambda: self._members(session_id, leader))
        except OSError as exc:  # the walk failed: a process it could not read may be a member
            raise MembershipUnknown(exc.errno, f"the tree of {session_id} cannot be read now: {exc.strerror}") from exc

    def _members(self, session_id: str, leader: int | None) -> set[int]:
        table: dict[int, tuple[int, int, int, str]] = {}
        for pid in _all_pids():
            stat = _read_stat(pid)
            if stat is not None and stat[3] != "Z":
                table[pid] = stat
        members: set[int] = set()
        if leader is not None:
            members |= {pid for pid, (_, pgid, sid, _) in table.items() if leader in (pgid, sid)}
            if leader in table:
                members.add(leader)
        # Orphans re-parented to us (we are their subreaper) are ours if they carry the marker. One
        # that is exiting cannot say: it counts until it is a zombie (it may still hold a port), and
        # its children, not re-parented yet, are asked instead.
        children: dict[int, list[int]] = {}
        for pid, (ppid, _, _, _) in table.items():
            children.setdefault(ppid, []).append(pid)
        frontier = [pid for pid in children.get(self._me, []) if pid != leader]
        while frontier:
            pid = frontier.pop()
            marker = _marker_of(pid)
            if marker == session_id:
                members.add(pid)
            elif marker is None:
                members.add(pid)
                frontier.extend(children.get(pid, []))
        # Close over parent links: anything descended from a member is a member.
        changed = True
        while changed:
            changed = False
            for pid, (ppid, _, _, _) in table.items():
                if ppid in members and pid not in members:
                    members.add(pid)
                    changed = True
        members.discard(self._me)
        return members

    def signal(self, session_id: str, leader: int | None, sig: int, *, leader_alive: bool) -> int:
        reached = 0
        if leader is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(leader, sig)
                reached += 1
        try:
            members = self.pids(session_id, leader)
        except MembershipUnknown:
            return reached  # the group had it; the rest on the caller's next look
        return reached + _signal_pids(members, sig)

    def release(self, session_id: str, *, later: bool = False) -> None:
        return None

    def detach(self) -> None:
        """Nothing of ours to leave running elsewhere: the kept descriptor goes."""
        self.close()

    def close(self) -> None:
        if self._own_spare:
            self.spare.close()


class AdoptedScanTrees(ScanTrees):
    """:class:`ScanTrees` for sessions a previous supervisor started (engine/adoption.py): what
    their trees orphaned went to whoever was subreaper then (init, most likely), not to us, so
    every process carrying the session's marker counts, wherever it hangs. A full scan of
    /proc environments per call: the fallback's price, paid only for adopted sessions."""

    def _members(self, session_id: str, leader: int | None) -> set[int]:
        members = super()._members(session_id, leader)
        for pid in _all_pids():
            if pid not in members and pid != self._me and _marker_of(pid) == session_id:
                members.add(pid)
        return members


class CgroupTrees:
    """A cgroup v2 directory per session under one directory of our own, or under its agent's
    directory there (``group``: where the agents' CPU weights are, engine/fairness.py)."""

    name = "cgroup2"

    def __init__(self, root: Path, spare: Spare | None = None) -> None:
        self.root = root
        # Session paths are plain strings: every spawn makes, reads and removes one, and pathlib's
        # parsing cost more than the system calls.
        self._root = str(root)
        self._paths: dict[str, str] = {}  # session id -> its directory, when it is in a group
        self._moved: dict[str, str] = {}  # session id -> the directory it left for its group's
        self._hold = hold_instance(root)
        # Reading cgroup.procs takes a descriptor: one is kept for it, as ScanTrees keeps one for
        # its walk, so a full table (a burst of spawns) does not leave a tree's end undecided.
        # ``spare``: another backend's (adopted sessions' beside ours), which that one closes.
        self._own_spare = spare is None
        self.spare = spare or Spare()

    @property
    def subreaper(self) -> bool:
        """True iff orphans come back to us: while a supervisor is open (engine/children.py)."""
        return is_subreaper()

    def _dir(self, session_id: str) -> str:
        return self._paths.get(session_id) or f"{self._root}/{session_id}"

    def prepare(self, session_id: str, group: str | None = None) -> str | None:
        if group is None:
            path = f"{self._root}/{session_id}"
        else:
            with contextlib.suppress(FileExistsError):
                os.mkdir(f"{self._root}/{group}")
            path = f"{self._root}/{group}/{session_id}"
            old = self._dir(session_id)
            if old != path and os.path.isdir(old):
                self._moved[session_id] = old  # a warm shell made before its agent was known
            self._paths[session_id] = path
        with contextlib.suppress(FileExistsError):
            os.mkdir(path)
        return f'echo $$ > "{path}/cgroup.procs" || exit 125'

    def path(self, session_id: str) -> Path:
        """The session's directory (in its group's, if it has one)."""
        return Path(self._dir(session_id))

    def directory(self, session_id: str) -> str:
        """:meth:`path` as a string, without pathlib's parsing (on every spawn's path)."""
        return self._dir(session_id)

    def pids(self, session_id: str, leader: int | None) -> set[int]:
        found: set[int] = set()
        for path in (self._dir(session_id), self._moved.get(session_id)):
            if path is None:
                continue
            procs = f"{path}/cgroup.procs"
            try:
                data = self.spare.read(functools.partial(read_small, procs))
            except OSError as exc:
                if exc.errno in GONE:
                    continue  # no directory: a populated cgroup cannot be removed, so none runs there
                # A live tree may be behind it: "empty" would end the session and orphan it.
                raise MembershipUnknown(exc.errno, f"{procs} cannot be read now: {exc.strerror}") from exc
            found.update(int(line) for line in data.split())
        return found

    def _kill_all(self, session_id: str) -> bool:
        """``cgroup.kill``: every process of the session's directory, atomically."""
        try:
            self.spare.read(lambda: _write_small(f"{self._dir(session_id)}/cgroup.kill", b"1"))
        except OSError:
            return False
        return True

    def signal(self, session_id: str, leader: int | None, sig: int, *, leader_alive: bool) -> int:
        try:
            members = self.pids(session_id, leader)
        except MembershipUnknown:
            # Who is in it is unknown, not that it is empty: cgroup.kill needs no list, and the
            # live leader is known; anything else is signalled on the caller's next look.
            if sig == signal.SIGKILL and session_id not in self._moved and self._kill_all(session_id):
                return 1
            members = set()
        if sig == signal.SIGKILL and members and session_id not in self._moved and self._kill_all(session_id):
            return len(members)
        # The leader first: a shell that outlives its child by a moment reports the child's death
        # ("Terminated") into the output before its own signal arrives.
        first = [leader] if leader_alive and leader is not None else []
        # (The leader may not have joined yet either: killed before its first instruction.)
        return _signal_pids(first, sig) + _signal_pids(members - set(first), sig)

    def release(self, session_id: str, *, later: bool = False) -> None:
        for path in (self._dir(session_id), self._moved.pop(session_id, None)):
            if path is not None:
                (remove_later if later else remove_now)(path)
        self._paths.pop(session_id, None)

    def detach(self) -> None:
        """Forget the directory without ending what runs in it (it is left to the next server)."""
        release_instance(self._hold)
        self._hold = None
        if self._own_spare:
            self.spare.close()

    def close(self) -> None:
        if self._own_spare:
            self.spare.close()
        if not self.root.exists():
            return
        with contextlib.suppress(OSError):
            (self.root / "cgroup.kill").write_text("1")  # what still runs in every group below
        _remove_tree(self.root)
        self._paths.clear()
        self._moved.clear()
        release_instance(self._hold)
        self._hold = None


def _write_small(path: str, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def own_unified_cgroup() -> Path | None:
    """The cgroup v2 directory this process was given, where its supervisors make theirs: our
    current cgroup, or its parent when we sit in a supervisor's leaf (:func:`enable_controllers`),
    ours or, in a process it started, our parent's: a leaf is for processes, not directories."""
    current = _current_unified_cgroup()
    if current is not None:
        match = _INSTANCE.fullmatch(current.name)
        if match is not None and match.group(2):
            return current.parent
    return current


def _current_unified_cgroup() -> Path | None:
    mounts: dict[str, Path] = {}
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                left, _, right = line.partition(" - ")
                if right.startswith("cgroup2 "):
                    mounts[left.split()[3]] = Path(left.split()[4])
    except OSError:
        return None
    if not mounts:
        return None
    try:
        with open("/proc/self/cgroup") as f:
            own = next((ln.split(":", 2)[2].strip() for ln in f if ln.startswith("0::")), None)
    except OSError:
        return None
    if own is None:
        return None
    for root_in_fs, mount_point in mounts.items():
        if own.startswith(root_in_fs):
            return mount_point / own[len(root_in_fs) :].lstrip("/")
    return None


# Locks on the leaves we moved into (see enable_controllers): held for the life of the process,
# since we stay in a leaf until we exit.
_leaf_holds: list[int | None] = []


def enable_controllers(base: Path, wanted: Iterable[str]) -> str | None:
    """Hand the ``wanted`` v2 controllers down to the cgroups we make below ``base``, our own
    cgroup (:func:`own_unified_cgroup`). None when done, else why not, in words for ``doctor``.

    A cgroup other than the root cannot both hold processes and give controllers to its children
    (the "no internal processes" rule). A supervisor started in a cgroup delegated to it (systemd's
    ``Delegate=yes``) is in just that position, so, as systemd asks of a delegated manager, it first
    moves itself into a leaf of its own below ``base``. Only when it is alone there: other
    processes in ``base`` are not ours to move.
    """
    wanted = sorted(set(wanted))
    try:
        available = set((base / "cgroup.controllers").read_text().split())
        enabled = set((base / "cgroup.subtree_control").read_text().split())
    except OSError as exc:
        return f"{base} cannot be read: {exc.strerror}"
    missing = [c for c in wanted if c not in available]
    if missing:
        return f"{', '.join(missing)} not delegated to {base}"
    if enabled.issuperset(wanted):
        return None
    line = " ".join(f"+{c}" for c in wanted)
    try:
        (base / "cgroup.subtree_control").write_text(line)
        return None
    except OSError as exc:
        if exc.errno != errno.EBUSY:
            return f"cannot enable {', '.join(wanted)} in {base}: {exc.strerror}"
    try:
        others = {int(p) for p in (base / "cgroup.procs").read_text().split()} - {os.getpid()}
    except (OSError, ValueError) as exc:
        return f"{base} cannot be read: {exc}"
    if others:
        return (
            f"{base} holds {len(others)} other process(es), so its controllers cannot be passed on;"
            " run procpilot alone in a cgroup delegated to it (systemd: Delegate=yes)"
        )
    leaf = base / f"{instance_name()}-supervisor"
    try:
        leaf.mkdir()
        hold = hold_instance(leaf)
        try:
            (leaf / "cgroup.procs").write_text(str(os.getpid()))
        except OSError:
            release_instance(hold)
            leaf.rmdir()
            raise
        _leaf_holds.append(hold)
        (base / "cgroup.subtree_control").write_text(line)
    except OSError as exc:
        return f"cannot move into a leaf of {base} to enable {', '.join(wanted)}: {exc.strerror}"
    return None


def instance_name() -> str:
    """A cgroup directory name of one supervisor: its pid (for finding a crashed one's leftovers)
    and a random part, so two supervisors in one process never share (or remove) a directory."""
    return f"procpilot-{os.getpid()}-{secrets.token_hex(3)}"


# A supervisor's directory, or (with "-supervisor") the leaf it moved itself into.
_INSTANCE = re.compile(r"procpilot-([0-9]+)-[0-9a-f]+(-supervisor)?")
# A directory younger than this may belong to a supervisor between its mkdir and its lock.
_STALE_AFTER_S = 1.0


def hold_instance(path: Path) -> int | None:
    """Mark ``path``, one of this supervisor's cgroup directories, as in use: a shared lock that the
    kernel drops when we exit, however we exit. Release it with :func:`release_instance`."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
    except OSError:
        os.close(fd)
        return None
    return fd


def release_instance(fd: int | None) -> None:
    if fd is not None:
        with contextlib.suppress(OSError):
            os.close(fd)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def reap_stale_instances(parent: Path, kill: Callable[[Path], None]) -> list[Path]:
    """End what crashed supervisors left in ``parent``: each ``procpilot-<pid>-<hex>`` directory whose
    supervisor is gone has ``kill`` applied to it (it must leave it without processes) and is then
    removed with everything below it. Returns the directories removed.

    The pid in the name only counts in the pid namespace that supervisor lived in; parallel
    supervisors in other namespaces share these hierarchies. So a directory is stale only if its
    lock (:func:`hold_instance`) is free too: the kernel frees it when its holder dies.
    """
    removed: list[Path] = []
    try:
        entries = sorted(parent.iterdir())
    except OSError:
        return removed
    for path in entries:
        match = _INSTANCE.fullmatch(path.name)
        if match is None or _pid_alive(int(match.group(1))):
            continue
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            if time.time() - os.fstat(fd).st_mtime < _STALE_AFTER_S:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                continue  # held: its supervisor lives
            if _group_held(path):
                continue  # a holder keeps one agent's sessions there for the next server
            kill(path)
            if _remove_tree(path):
                removed.append(path)
        finally:
            os.close(fd)
    return removed


def _group_held(path: Path) -> bool:
    """Whether a directory just below ``path`` (an agent's group, engine/fairness.py) is locked."""
    try:
        children = [child for child in path.iterdir() if child.is_dir()]
    except OSError:
        return False
    for child in children:
        try:
            fd = os.open(child, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return True
        finally:
            os.close(fd)
    return False


def _remove_tree(path: Path) -> bool:
    """rmdir ``path`` and the cgroups below it, deepest first; False if one would not go."""
    with contextlib.suppress(OSError):
        for child in path.iterdir():
            if child.is_dir() and not _remove_tree(child):
                return False
    for _ in range(250):
        try:
            path.rmdir()
            return True
        except FileNotFoundError:
            return True
        except OSError:
            time.sleep(0.004)  # the kernel lags a moment behind the last exit in the group
    return False


def kill_cgroup_v2(path: Path) -> None:
    """End every process in the v2 cgroup ``path`` and below (``cgroup.kill``), and wait for them."""
    with contextlib.suppress(OSError):
        (path / "cgroup.kill").write_text("1")
    for _ in range(500):
        try:
            events = dict(line.split() for line in (path / "cgroup.events").read_text().splitlines())
        except (OSError, ValueError):
            return
        if events.get("populated") == "0":
            return
        time.sleep(0.004)


def kill_cgroup_v1(path: Path) -> None:
    """SIGKILL every process in the v1 cgroup ``path`` and below, until none is left (a fork racing
    the first round joins the cgroup too, and is caught by the next)."""
    for _ in range(500):
        pids: set[int] = set()
        for procs in [path / "cgroup.procs", *path.rglob("*/cgroup.procs")]:
            with contextlib.suppress(OSError, ValueError):
                pids.update(int(p) for p in procs.read_text().split())
        pids.discard(0)
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.004)


def probe_trees(prefer: str = "auto", name: str | None = None) -> TreeBackend:
    """The best tree mechanism this host offers: cgroup v2 grouping if writable, else /proc scans.

    Before taking its own directory, it ends what crashed supervisors left beside it.
    """
    if prefer in ("auto", "cgroup2"):
        base = own_unified_cgroup()
        if base is not None:
            reap_stale_instances(base, kill_cgroup_v2)
            root = base / (name or instance_name())
            try:
                root.mkdir(exist_ok=True)
                probe = root / "probe"
                probe.mkdir(exist_ok=True)
                ok = (probe / "cgroup.kill").exists()
                probe.rmdir()
                if ok:
                    return CgroupTrees(root)
                root.rmdir()
            except OSError:
                pass
    return ScanTrees()


def _read_syscall_nr() -> int:
    # The number of read(2): /proc/PID/syscall reports the syscall a blocked task sleeps in.
    return {"x86_64": 0, "aarch64": 63, "riscv64": 63}.get(platform.machine(), -1)


_READ_NR = _read_syscall_nr()


def waiting_for_input(pids: Iterable[int], stdin_target: str | None) -> bool:
    """Best effort: is any of ``pids`` blocked in read(0) on the session's own stdin?"""
    if stdin_target is None or _READ_NR < 0:
        return False
    for pid in pids:
        try:
            with open(f"/proc/{pid}/syscall") as f:
                fields = f.read().split()
            if len(fields) < 2 or fields[0] != str(_READ_NR):
                continue
            fd = int(fields[1], 16)
            if os.readlink(f"/proc/{pid}/fd/{fd}") == stdin_target:
                return True
        except (OSError, ValueError):
            continue
    return False
