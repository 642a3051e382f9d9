"""What a server needs to outlive itself: its owner lock, its holder link, the exit status its
sessions' shells record while no server runs, and the cgroups of servers gone before it.

A supervisor with an ``owner`` (``procpilot serve``: "serve"; ``procpilot mcp --agent A``:
"mcp:A") keeps its sessions across a crash or a restart:

* at spawn, the session's descriptors go to the holder (engine/holder.py), and a shell
  session's first lines include :func:`status_line`: an EXIT trap that writes ``$?`` to
  ``sessions/<id>.exit`` only if the server that started it is gone by then (while it lives, it
  reaps the leader itself and nothing is written);
* once that server is gone, the holder takes the kernel's exit record of the leader
  (engine/exit_records.py) and writes it beside the session's spool: exact for every session
  (argv, boxed, a script ending in ``exec``, a signal), where the host lets it (root);
* at start, the next server of the same owner takes the lock (:class:`OwnerLock`), takes back the
  descriptors, and adopts every session its journal says is running (Supervisor._adopt).

A supervisor without an owner (the library's default) does none of this: nothing changes for it.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import shlex
from pathlib import Path
from typing import Any

from procpilot.engine.capture import SessionOutput, Stream
from procpilot.engine.exit_records import probe, read_outcome, record_path
from procpilot.engine.holder import SPOOL_NAME
from procpilot.engine.holder_client import HeldSession, HolderLink, read_spool
from procpilot.engine.limits import CgroupV1Limits, CgroupV2Limits, LimitBackend
from procpilot.engine.ownership import OwnerLock
from procpilot.engine.state_files import make_state_dir
from procpilot.engine.trees import AdoptedScanTrees, CgroupTrees, ScanTrees, TreeBackend

__all__ = [
    "Restarts",
    "leader_status",
    "outage_exits",
    "read_status",
    "replay_spool",
    "status_line",
]

_EXIT_SUFFIX = ".exit"
_LOCK_WAIT = 3.0


def status_line(exit_file: Path, server_pid: int, probe_fd: int, lock: Path) -> str:
    """The shell line that records the leader's exit status for a server that is not there.

    "There" means: the server that started it still holds its owner lock at ``probe_fd`` (see
    OwnerLock). That is false after a crash, a hand-over, while it is a zombie nobody reaped, and
    for a stranger that got its pid. The test is two stats in the shell (~µs); a file is written
    only then, so a spawn while the server lives costs nothing more on disk. An ``exec`` in the
    user's script replaces the shell and its trap: such a session's exit in an outage is unknown
    (LOST), never guessed."""
    q = shlex.quote
    # $s first: the test itself would overwrite $?. The trap leaves the shell's own status as it was.
    action = f"s=$?; [ {q(f'/proc/{server_pid}/fd/{probe_fd}')} -ef {q(str(lock))} ] || echo $s > {q(str(exit_file))}"
    return f"trap {q(action)} EXIT"


def leader_status(pid: int, exit_file: Path, record: Path, *, own_child: bool, recorded: bool) -> int | str | None:
    """How an adopted session's leader ended, as ``os.waitstatus_to_exitcode`` says it (negative:
    the signal): from ``wait`` where it is our own child (a supervisor that detached and one that
    adopted in the same process), else from the kernel's record the holder wrote, else from what
    its shell recorded. A str says why nobody knows; None: not yet, the holder (``recorded``:
    it watches this leader) writes its record as soon as it sees the pidfd we saw."""
    if own_child:
        with contextlib.suppress(ChildProcessError):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                return os.waitstatus_to_exitcode(status)
    held = read_outcome(str(record))
    if isinstance(held, int):
        with contextlib.suppress(OSError):
            exit_file.unlink()  # the shell's $? too, if it wrote one: the kernel's is exact
        return held
    shell = read_status(exit_file)
    if shell is not None:
        return shell
    if held is None and recorded:
        return None
    return held or "no exit record: the holder did not keep it (or is gone) and its shell recorded nothing"


def outage_exits(said: dict[str, str] | None = None) -> dict[str, str]:
    """Which mechanism records how a session ended while no server could wait for it (doctor):
    as the holder ``said`` it, else as this process finds it (the holder a server starts has the
    server's privileges)."""
    mechanism, why = (said.get("mechanism"), said.get("why")) if said else _probed()
    if mechanism is not None:
        return {"mechanism": f"{mechanism}: the holder keeps the kernel's exit record of every session"}
    return {
        "mechanism": "the shell's EXIT trap only: shell commands that do not end in exec; the rest end lost",
        "why": why or "unknown",
    }


@functools.cache
def _probed() -> tuple[str | None, str | None]:
    return probe()


def read_status(exit_file: Path) -> int | None:
    try:
        text = exit_file.read_text()
    except OSError:
        return None
    with contextlib.suppress(OSError):
        exit_file.unlink()
    try:
        return int(text.strip())
    except ValueError:
        return None


def replay_spool(output: SessionOutput, directory: Path) -> int:
    """Append what the holder kept during an outage, in its arrival order; returns the bytes."""
    path = directory / SPOOL_NAME
    total = 0
    for tag, item in read_spool(path):
        if isinstance(item, int):
            output.lose(Stream.STDOUT, item, OSError(errno.EFBIG, "past the outage spool's cap"))
            continue
        output.append(Stream.STDOUT if tag == b"o" else Stream.STDERR, item)
        total += len(item)
    with contextlib.suppress(OSError):
        path.unlink()
    return total


def _instance_dir(path: object, beside: Path | None = None) -> bool:
    """True iff ``path`` (read from a record) can be a supervisor's cgroup directory, or an agent's
    group directly inside one: absolute, without ``..``, named as instance_name() (and the agent
    groups) name them, and (``beside``) next to ours. Anything else is never signalled
    (``cgroup.kill``) nor removed."""
    if not isinstance(path, str) or not path.startswith("/") or ".." in Path(path).parts:
        return False
    found = Path(path)
    if found.name.startswith("agent-"):  # an agent's group inside one (engine/fairness.py)
        found = found.parent
    if not found.name.startswith("procpilot-"):
        return False
    return beside is None or found.parent == beside.parent


class Restarts:
    """One owner's restart machinery on one state directory."""

    def __init__(self, state_dir: Path, owner: str) -> None:
        self.state_dir = state_dir
        self.owner = owner
        self.sessions_root = state_dir / "sessions"
        self._lock: OwnerLock | None = None
        self.link = HolderLink(state_dir, owner)
        self._trees: dict[str, CgroupTrees] = {}
        self._scan: AdoptedScanTrees | None = None
        self._limits: dict[tuple[str, ...], LimitBackend] = {}

    def begin(self) -> list[HeldSession]:
        """Take the owner's lock (StateDirBusy if a live server has it), then the holder's copies."""
        make_state_dir(self.sessions_root, "the sessions' output")
        self._lock = OwnerLock(self.state_dir, self.owner, wait=_LOCK_WAIT)
        return self.link.connect()

    def status_line(self, session_id: str) -> str | None:
        """The exit-recording shell line for a new session, None when we hold no lock."""
        lock = self._lock
        if lock is None or lock.probe_fd is None:
            return None
        return status_line(self.exit_file(session_id), os.getpid(), lock.probe_fd, lock.path)

    def outage_exits(self) -> dict[str, str]:
        return outage_exits(self.link.records if self.link.connected else None)

    def exit_file(self, session_id: str) -> Path:
        return self.sessions_root / f"{session_id}{_EXIT_SUFFIX}"

    def record_file(self, session_id: str) -> Path:
        """Where the holder writes the kernel's record of how the session's leader ended."""
        return Path(record_path(str(self.sessions_root / session_id / SPOOL_NAME)))

    def trees_for(self, root: str | None, current: TreeBackend) -> TreeBackend:
        """The tree backend of an adopted session: ours if it lives in our cgroup directory (or no
        cgroup), else one over the directory of the server that started it."""
        if not root and isinstance(current, ScanTrees):
            if self._scan is None:
                self._scan = AdoptedScanTrees(current.spare)  # one spare descriptor for both
            return self._scan
        if not root or (isinstance(current, CgroupTrees) and str(current.root) == root):
            return current
        ours = current.root if isinstance(current, CgroupTrees) else None
        if not Path(root).is_dir() or not _instance_dir(root, ours):
            return current
        if root not in self._trees:
            spare = current.spare if isinstance(current, CgroupTrees | ScanTrees) else None
            self._trees[root] = CgroupTrees(Path(root), spare)  # one spare descriptor for all
        return self._trees[root]

    def limits_for(self, record: dict[str, Any]) -> LimitBackend | None:
        roots = record.get("limit_roots")
        if not isinstance(roots, dict) or not roots or not all(_instance_dir(p) for p in roots.values()):
            return None
        key = tuple(sorted(f"{c}={p}" for c, p in roots.items()))
        if key not in self._limits:
            paths = {str(c): Path(p) for c, p in roots.items()}
            if record.get("limit_mechanism") == "cgroup2":
                self._limits[key] = CgroupV2Limits(next(iter(paths.values())))
            else:
                self._limits[key] = CgroupV1Limits(paths)
        return self._limits[key]

    def close(self, *, detach: bool = False) -> None:
        """The server is done: every session it held has ended, or (``detach``) is left to the
        holder, running, in the cgroups it was in."""
        for trees in self._trees.values():
            trees.detach() if detach else trees.close()
        for limits in self._limits.values():
            detach_limits = getattr(limits, "detach", None)
            if detach and detach_limits is not None:
                detach_limits()
            elif not detach:
                limits.close()
        self._trees.clear()
        self._limits.clear()
        if self._scan is not None:
            self._scan.close()
            self._scan = None
        if not detach:
            self.link.flush()  # every session ended: the holder forgets them all, keeps nothing
        self.link.close()
        if self._lock is not None:
            self._lock.release()
            self._lock = None
