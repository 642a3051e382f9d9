"""Small kernel files (procfs, cgroupfs) read in three system calls.

Python's ``open().read()`` costs nine (a stat, an ioctl, two seeks and another stat besides the
open, read and close), and after an agent's idle gap each system call costs 20-50 µs here: reads
on the path of every call (a leader's I/O counters, its cgroup's members) go through this instead.

A read that fails says nothing about what it read: only ENOENT and ESRCH (:data:`GONE`) mean
the process (or cgroup) is no more. EMFILE, ENFILE or ENOMEM (a full descriptor table after a
burst of spawns) mean "not known now", and must never be taken for "gone" or "empty": that is
how a session would end with its tree still running. :class:`Spare` keeps one descriptor back
for the reads that decide it.
"""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Callable
from typing import TypeVar

__all__ = ["GONE", "Spare", "read_small", "stat_fields"]

_CHUNK = 1 << 16
# What a failed read of /proc/PID/... or a cgroup's file may mean "it is no more" by: no such
# entry (never was, or removed), the process exited between the open and the read, the cgroup
# was removed under an open file.
GONE = frozenset({errno.ENOENT, errno.ESRCH, errno.ENODEV})
# A full descriptor table, ours (EMFILE) or the system's (ENFILE): a descriptor freed helps.
_NO_DESCRIPTOR = frozenset({errno.EMFILE, errno.ENFILE})

_T = TypeVar("_T")


def read_small(path: str) -> bytes:
    """The whole of the file at ``path`` (OSError as ``open`` would raise it)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        data = os.read(fd, _CHUNK)
        if len(data) < _CHUNK:  # kernel files give what they have in one read; a short one is all
            return data
        parts = [data]
        while chunk := os.read(fd, _CHUNK):
            parts.append(chunk)
        return b"".join(parts)
    finally:
        os.close(fd)


def stat_fields(pid: int) -> list[bytes] | None:
    """The fields of /proc/PID/stat after the command name (the state first, as ``proc(5)``'s
    field 3), or None if the process is gone. The name may hold spaces and parentheses: the
    fields resume after the last ``)``.

    Raises OSError when the file could not be read for another reason (no descriptor free):
    the process may well be alive."""
    try:
        raw = read_small(f"/proc/{pid}/stat")
    except OSError as exc:
        if exc.errno in GONE:
            return None
        raise
    return raw[raw.rfind(b")") + 2 :].split()


def _open_spare() -> int | None:
    try:
        return os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None


class Spare:
    """One descriptor held back, for reads that must not fail for want of one (a session's tree
    members, read to decide whether it has ended). A read refused with EMFILE or ENFILE is tried
    again once with the spare closed, and the spare is taken again after. Each read through it
    takes one descriptor at a time (a listing, then each file).

    Thread-safe: the usage sampler reads trees from a worker thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._fd = _open_spare()
        self._closed = False  # once closed, never taken again (a backend sharing it may read on)

    def read(self, read: Callable[[], _T]) -> _T:
        """``read()``; if it found no descriptor free, once more with the spare's."""
        try:
            return read()
        except OSError as exc:
            if exc.errno not in _NO_DESCRIPTOR:
                raise
            refused = exc
        with self._lock:
            if self._fd is None:  # none could be kept (the table was full): maybe next time
                self._fd = None if self._closed else _open_spare()
                raise refused
            os.close(self._fd)
            self._fd = None
            try:
                return read()
            finally:
                # The slot just freed, unless another thread took it (then: on a later failure).
                self._fd = None if self._closed else _open_spare()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
