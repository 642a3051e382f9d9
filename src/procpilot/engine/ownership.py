"""Who owns a state directory's sessions: one live server per owner, never two.

A server that adopts what a previous one left (an ``owner`` such as ``serve`` or ``mcp:agent-a``)
first takes ``<state_dir>/owners/<owner>.lock`` with an exclusive ``flock``. The kernel drops the
lock when its holder dies, however it dies, so a lock left by ``kill -9`` is simply free: there is
no stale lock to detect or break. While it is held a second server of the same owner is refused
(:class:`StateDirBusy`), so the same processes are never adopted twice. Servers of different
owners (a daemon and an agent's stdio server) share a state directory as before.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import time
from pathlib import Path

from procpilot.engine.state_files import make_state_dir, open_state_file
from procpilot.errors import StateDirBusy

__all__ = ["OwnerLock"]

_SAFE = re.compile(r"[^A-Za-z0-9_.-]")
_MAX_NAME = 120
_RETRY = 0.05
_PROBE_FD_MIN = 900


def lock_name(owner: str) -> str:
    """A file name for ``owner`` (agent ids are free text): unsafe characters escaped, bounded."""
    name = _SAFE.sub(lambda m: f"%{ord(m.group(0)):02x}", owner)
    return name[:_MAX_NAME] or "default"


class OwnerLock:
    """The exclusive lock of one owner on one state directory, held until :meth:`release`."""

    def __init__(self, state_dir: Path, owner: str, *, wait: float = 0.0) -> None:
        """Take the lock, waiting up to ``wait`` seconds for a server that is stopping (per-call
        stdio servers start the next one while the last is still closing)."""
        directory = state_dir / "owners"
        make_state_dir(directory, "the owner locks")
        self.path = directory / f"{lock_name(owner)}.lock"
        self.owner = owner
        fd = open_state_file(self.path, os.O_RDWR | os.O_CREAT, f"the {owner!r} owner lock")
        deadline = time.monotonic() + wait
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        raise self._busy(fd) from None
                    time.sleep(_RETRY)
            # Who holds it, for the next one's message: the file is ours alone now.
            os.ftruncate(fd, 0)
            os.pwrite(fd, str(os.getpid()).encode(), 0)
            # A second descriptor of the lock at a high, fixed-looking number: a session's shell
            # asks "/proc/<server>/fd/<probe> is still this lock file?" to learn whether its server
            # lives and owns it (false after a crash, a hand-over, as a zombie, or for a reused pid).
            # Under a descriptor limit at or below that number (F_DUPFD says EINVAL) any number
            # does: what the shell compares is the file, and the number stays ours till release.
            try:
                probe = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, _PROBE_FD_MIN)
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise
                probe = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 0)
        except BaseException:
            os.close(fd)
            raise
        self._fd: int | None = fd
        self.probe_fd: int | None = probe

    def _busy(self, fd: int) -> StateDirBusy:
        with contextlib.suppress(OSError, ValueError):
            holder = int(os.pread(fd, 32, 0) or b"0")
            if holder:
                return StateDirBusy(
                    f"another server (pid {holder}) already owns the {self.owner!r} sessions of this state"
                    f" directory ({self.path.parent.parent})",
                    owner=self.owner,
                    pid=holder,
                )
        return StateDirBusy(
            f"another server already owns the {self.owner!r} sessions of this state directory"
            f" ({self.path.parent.parent})",
            owner=self.owner,
        )

    def release(self) -> None:
        if self.probe_fd is not None:
            probe, self.probe_fd = self.probe_fd, None
            os.close(probe)
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)
