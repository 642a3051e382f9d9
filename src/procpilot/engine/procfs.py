"""Small kernel files (procfs, cgroupfs) read in three system calls.

Python's ``open().read()`` costs nine (a stat, an ioctl, two seeks and another stat besides the
open, read and close), and after an agent's idle gap each system call costs 20-50 µs here: reads
on the path of every call (a leader's I/O counters, its cgroup's members) go through this instead.
"""

from __future__ import annotations

import os

__all__ = ["read_small", "stat_fields"]

_CHUNK = 1 << 16


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
    fields resume after the last ``)``."""
    try:
        raw = read_small(f"/proc/{pid}/stat")
    except OSError:
        return None
    return raw[raw.rfind(b")") + 2 :].split()
