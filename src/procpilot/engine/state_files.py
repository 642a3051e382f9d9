"""The state directory's own files, opened so that damage is a typed refusal, never a traceback.

What a server reads and writes in ``<state_dir>`` (the journal, the owner locks, ``format.json``,
``daemon.json``, the audit log, the ``sessions/`` and ``owners/`` directories) is procpilot's
alone. A hand, a disk or a crash can still leave something else at one of those paths: a
directory where a file goes, a FIFO (an open for reading would wait forever), a file that
cannot be read. Each is :class:`StateDirDamaged`, naming the path, what it is for and what to
do, so that a daemon under ``Restart=always`` stops with a distinct exit code (the CLI's 3)
instead of crashing in a loop.

:class:`StateDirIdentity` remembers which directory the server started on (device and inode):
a state directory that was moved or replaced meanwhile is refused before a session's files are
made, rather than re-created empty at the old path (where whoever moved it could read the next
sessions' output and plant files of their own).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from procpilot.errors import StateDirDamaged

__all__ = [
    "StateDirDamaged",
    "StateDirIdentity",
    "check_state_file",
    "damaged",
    "make_state_dir",
    "open_state_file",
]

# O_NONBLOCK: a FIFO planted at a file's path must not hang the open (it means nothing for a
# regular file, which is all that is accepted).
_OPEN = os.O_CLOEXEC | os.O_NONBLOCK


def damaged(path: Path | str, what: str, why: str) -> StateDirDamaged:
    """The refusal for ``path`` (``what`` it is for) that ``why`` explains."""
    return StateDirDamaged(
        f"{path} ({what}) {why}",
        hints={
            "move_aside": (
                f"Move {path} aside (mv {path} {path}.damaged) and start again: a new one is made. "
                "Or point state_dir (PROCPILOT_STATE_DIR) at a fresh directory."
            ),
        },
        path=str(path),
    )


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISREG(mode):
        return "a file"
    return "a device or other special file"


def make_state_dir(path: Path, what: str) -> None:
    """``path`` as a directory (made with its parents if missing), else :class:`StateDirDamaged`."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        # exist_ok covers an existing directory only: something else holds the name.
        raise damaged(path, what, f"is {_kind(os.stat(path).st_mode)}, not a directory") from None
    except OSError as exc:
        raise damaged(path, what, f"cannot be made: {exc.strerror or exc}") from None


def open_state_file(path: Path | str, flags: int, what: str, mode: int = 0o600) -> int:
    """``os.open`` of a regular file of the state directory; anything else there (a directory, a
    FIFO, a file that cannot be opened) is :class:`StateDirDamaged`. Without ``O_CREAT`` a missing
    file is still ``FileNotFoundError``: the caller knows what its absence means."""
    try:
        fd = os.open(path, flags | _OPEN, mode)
    except FileNotFoundError:
        if flags & os.O_CREAT:
            raise damaged(path, what, "cannot be made: its directory is gone") from None
        raise
    except OSError as exc:
        raise damaged(path, what, f"cannot be opened: {exc.strerror or exc}") from None
    try:
        kind = os.fstat(fd).st_mode
    except OSError as exc:
        os.close(fd)
        raise damaged(path, what, f"cannot be read: {exc.strerror or exc}") from None
    if not stat.S_ISREG(kind):
        os.close(fd)
        raise damaged(path, what, f"is {_kind(kind)}, not a file")
    if not flags & os.O_NONBLOCK:
        os.set_blocking(fd, True)
    return fd


def check_state_file(path: Path, what: str) -> None:
    """Refuse what is at ``path`` unless it is a regular file or nothing (before replacing it)."""
    try:
        kind = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    except OSError as exc:
        raise damaged(path, what, f"cannot be examined: {exc.strerror or exc}") from None
    if not stat.S_ISREG(kind) and not stat.S_ISLNK(kind):
        raise damaged(path, what, f"is {_kind(kind)}, not a file")


class StateDirIdentity:
    """The state directory a server started on, by device and inode."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._str = str(path)
        found = os.stat(self._str)
        self._id = (found.st_dev, found.st_ino)

    def check(self) -> None:
        """One stat (~1 µs: this is on the spawn path): :class:`StateDirDamaged` unless the
        directory at the path is still the one the server started on."""
        try:
            found = os.stat(self._str)
        except OSError:
            now = "is gone"
        else:
            if (found.st_dev, found.st_ino) == self._id:
                return
            now = "is another directory now"
        raise StateDirDamaged(
            f"the state directory {self.path} {now}: it was moved or replaced while this server ran,"
            " so no session's files are made there",
            hints={
                "restart": (
                    f"Put the directory back at {self.path} (or remove what replaced it) and restart the"
                    " server: it checks the directory again at start."
                ),
            },
            path=self._str,
        )
