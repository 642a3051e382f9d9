"""This process's descriptor limit (RLIMIT_NOFILE) against the sessions it is to hold.

A running session holds :data:`PER_SESSION` descriptors in the supervisor: its stdout and stderr
pipes. Its exit comes through the loop's one SIGCHLD watcher (engine/reaper.py), not a pidfd,
and its stdin, until its first write, waits in flight out of the table (engine/stdin.py); output
files are shared (``segments.OpenWriters``). A session written to holds its stdin too (3), and
one on a loop with no watcher (off the main thread) a pidfd. So a limit of 20,000 holds about
9,000 sessions beside the reserve below, and 10,000 need about 22,000, unless they are quiet:
past half the table (:func:`park_above`) a quiet session's output ends are parked out of it
too (engine/output_parking.py), and it holds none. A server raises its own soft limit
to what it needs, up to the hard limit, and with CAP_SYS_RESOURCE (root) the hard limit too, up
to ``/proc/sys/fs/nr_open``. Only this process's limit: nothing host-wide, and what was done is
logged and reported (``capabilities()["descriptors"]``). Past the limit a spawn is refused
(``SpawnFailed``, EMFILE): nothing crashes.

Sessions get back the soft limit the process started with (:func:`child_lines`): a program that
walks every possible descriptor (a ``close`` loop up to the limit) must not pay for the server's.
"""

from __future__ import annotations

import logging
import resource
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "PER_SESSION",
    "DescriptorLimit",
    "child_lines",
    "needed_for",
    "park_above",
    "raise_for",
    "report",
    "reserve",
]

PER_SESSION = 2
# The server's own: its clients' sockets, the journal, warm shells, the log files open for writing.
_RESERVE = 2048
_NR_OPEN = Path("/proc/sys/fs/nr_open")
_log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class DescriptorLimit:
    """What :func:`raise_for` found and did."""

    started_with: tuple[int, int]  # (soft, hard) before
    soft: int
    hard: int
    sessions: int  # the running sessions it was asked to make room for
    others: int  # and the other descriptors (a daemon's connections)
    note: str | None  # why it is short of what the sessions need, if it is


@dataclass(slots=True)
class _Process:
    """The limit is the process's, not a supervisor's: so is what was done to it."""

    started_soft: int | None = None  # before raise_for changed it: what sessions get back
    raised: DescriptorLimit | None = None


_PROCESS = _Process()


def needed_for(sessions: int, others: int = 0) -> int:
    """Descriptors for ``sessions`` running sessions and ``others`` more (a daemon's connections)."""
    return sessions * PER_SESSION + others + _RESERVE


def _nr_open() -> int:
    try:
        return int(_NR_OPEN.read_text())
    except (OSError, ValueError):
        return 1 << 20  # the kernel's default


def _finite(limit: int) -> bool:
    return limit != resource.RLIM_INFINITY


def raise_for(sessions: int, others: int = 0) -> DescriptorLimit:
    """Raise this process's limit to what ``sessions`` running sessions and ``others`` more
    descriptors need, as far as allowed."""
    before = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = needed_for(sessions, others)
    soft, hard = before
    note = None
    if _finite(hard) and hard < wanted:
        ceiling = min(wanted, _nr_open())
        try:  # only with CAP_SYS_RESOURCE; the soft limit is set below
            resource.setrlimit(resource.RLIMIT_NOFILE, (min(soft, ceiling), ceiling))
        except (PermissionError, ValueError) as exc:
            note = f"the hard limit {hard} cannot be raised here ({exc})"
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if note is None and hard < wanted:
            note = f"/proc/sys/fs/nr_open caps it at {hard}"
    target = min(wanted, hard) if _finite(hard) else wanted
    if _finite(soft) and soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if (soft, hard) != before and _PROCESS.started_soft is None:
        _PROCESS.started_soft = before[0]
    if note is not None:
        note += f": about {allows(soft - others)} running sessions fit, not {sessions}"
    raised = _PROCESS.raised = DescriptorLimit(before, soft, hard, sessions, others, note)
    if (soft, hard) != before:
        _log.info("descriptor limit raised from %s to %s for %d running sessions", before, (soft, hard), sessions)
    if note is not None:
        # Said where an operator looks (doctor, /v1/capabilities), not on every start: most hosts
        # allow far fewer than the default 10,000 sessions and run well, and a stdio server's
        # stderr goes into its client's log at each call.
        _log.info("descriptor limit: %s", note)
    return raised


def reserve(soft: int) -> int:
    """Descriptors kept for the server's own under soft limit ``soft`` (a quarter of a small one)."""
    return min(_RESERVE, soft // 4)


def park_above(soft: int | None = None) -> int:
    """Live output descriptors past which quiet sessions' are parked (engine/output_parking.py):
    half of what the table holds beside the server's own, so a server far from its limit parks
    nothing, and one near it has room for a spell of sessions waking at once."""
    if soft is None:
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if not _finite(soft):
        return 1 << 30
    return max(0, (soft - reserve(soft)) // 2)


def allows(soft: int) -> int:
    """About how many running sessions a soft limit holds."""
    return max(0, (soft - _RESERVE) // PER_SESSION)


def child_lines() -> list[str]:
    """Shell lines a session runs first: the soft limit back to the one this process started with."""
    started = _PROCESS.started_soft
    if started is None or not _finite(started):
        return []
    return [f"ulimit -S -n {started}"]


def report() -> dict[str, Any]:
    """For ``doctor`` and ``/v1/capabilities``: the limit now, the sessions it holds, what was raised."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    raised = _PROCESS.raised
    others = 0 if raised is None else raised.others
    found: dict[str, Any] = {
        "soft": soft,
        "hard": hard,
        "running_sessions_it_holds": allows(soft - others) if _finite(soft) else None,
        "per_session": PER_SESSION,
        # Output descriptors read by the loop past which quiet sessions' are parked (0 each).
        "quiet_parked_above": park_above(soft),
    }
    if raised is not None:
        if raised.started_with != (soft, hard):
            found["raised_from"] = list(raised.started_with)
        found["raised_for_sessions"] = raised.sessions
        if raised.note:
            found["note"] = raised.note
    return found
