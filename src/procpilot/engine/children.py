"""This process's children: the ones the engine reaps itself, and the orphans nobody else will.

A supervisor is its process's subreaper, so what a session's tree leaves running (a daemon that
double-forked, a job whose shell exited) becomes our child, and a zombie once it ends, unless
someone reaps it: :func:`reap_orphans` does. But a process may hold several supervisors (a
library embedding, the test suite, the benchmarks), each watching its own leaders' exits
(engine/reaper.py reads a leader's status as a zombie, then reaps it). An orphan reaper that
spared only its own supervisor's leaders reaped another's leader in the moment between its exit
and that watcher's pass; the watcher then found no zombie, and the session never ended. So the
children the engine starts are **claimed** for the whole process from their fork
(:func:`popen`) until their owner reaps them (:func:`release`), and the orphan reaper leaves
every claimed child alone, whichever supervisor it belongs to.

It also leaves alone the children that share this process's session: every child the engine
starts begins a session of its own (``start_new_session``), and so do the orphans of its
sessions' trees (they are in a session's, or one they began), while a child of other code in
the process (``subprocess.run`` on a thread) stays in ours, and is its caller's to wait for. (The
engine's own short-lived children, the isolation probes, begin a session of their own too, so what
they orphan, bubblewrap's first process in a pid namespace say, is reaped here as well.)

**The subreaper role is held only while a supervisor is open** (:func:`hold_subreaper` at its
start, :func:`release_subreaper` once it is closed): a process that embeds supervisors and closes
the last one is no longer where the orphans of the host's other code end up, and nothing of ours
is left to reap them. The role is given back only if we took it (``PR_GET_CHILD_SUBREAPER`` said
0): a process made subreaper by its own code keeps it. Giving it back does not give back what was
adopted by then, so the last close reaps the ended ones, and a thread (:func:`_after_close`)
reaps the rest as they end: the daemons a detached session's tree left with us, orphans still
dying after their tree was killed.

**A leader of a session detached for a next server** (:func:`leave_to_next_server`) is still
our child: only we can ``wait`` for it, and its exit status is what the next server must report.
A next server in this process (a re-exec, a second supervisor of the owner) takes it back
(:func:`take_back`) and waits for it itself. Until then, the same thread reaps it when it ends,
and writes its status where the holder writes the kernel's record of it
(``sessions/<id>.exit.json``, engine/exit_records.py), which the next server reads wherever it
runs: the status is kept exact, and no zombie waits for a server that may never come.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import threading
import time
from typing import Any

from procpilot.engine.exit_records import write_outcome
from procpilot.engine.procfs import stat_fields

__all__ = [
    "claimed",
    "hold_subreaper",
    "is_subreaper",
    "leave_to_next_server",
    "popen",
    "reap_orphans",
    "release",
    "release_subreaper",
    "take_back",
]

_PR_SET_CHILD_SUBREAPER, _PR_GET_CHILD_SUBREAPER = 36, 37
# How often the thread that reaps after the last close looks: soon after something ended, then
# less and less often while nothing does (what it waits for may run for days: a holder, a detached
# session's daemon), and with many detached leaders (a waitpid each) less often, as LeaderPoll does.
_AFTER_CLOSE_BASE = 0.1
_AFTER_CLOSE_MAX = 1.0
_AFTER_CLOSE_EACH = 20e-6


class _Claims:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.pids: set[int] = set()
        self.forking = 0  # forks under way (popen) whose child is not claimed yet


_claims = _Claims()


def popen(argv: list[str], **options: Any) -> subprocess.Popen[bytes]:
    """``subprocess.Popen(argv, **options)``, its child claimed from the start: no orphan reaper
    of this process reaps it (its owner does, then calls :func:`release`)."""
    with _claims.lock:
        _claims.forking += 1
    try:
        child: subprocess.Popen[bytes] = subprocess.Popen(argv, **options)
        with _claims.lock:
            _claims.pids.add(child.pid)
        return child
    finally:
        with _claims.lock:
            _claims.forking -= 1


def release(pid: int) -> None:
    """``pid`` was reaped by its owner: the number may come back as anyone's."""
    with _claims.lock:
        _claims.pids.discard(pid)


def claimed() -> frozenset[int]:
    with _claims.lock:
        return frozenset(_claims.pids)


def reap_orphans() -> list[int]:
    """Reap this process's ended children that nobody claimed and that are not of its own
    session; the pids reaped. While a fork is under way (on another thread) its child is not
    claimed yet: this pass leaves everything to the next."""
    reaped: list[int] = []
    for pid in _orphans() or ():
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            continue
        if done:
            reaped.append(pid)
    return reaped


def _orphans() -> list[int] | None:
    """This process's children, ended or not, that are no claimed child and not of its own
    session: the orphans it adopted. None while a fork is under way (nothing can be said)."""
    own_session = os.getsid(0)
    with _claims.lock:  # a child forked after this look is not in it; one forked before is claimed
        if _claims.forking:
            return None
        candidates = _children_of_self() - _claims.pids
    found = []
    for pid in candidates:
        try:
            if os.getsid(pid) != own_session:
                found.append(pid)
        except (ProcessLookupError, PermissionError):
            continue
    return found


class _Reaping:
    """Who holds the subreaper role in this process, and what is reaped after the last close."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.holders = 0  # supervisors open now (started, not yet closed)
        self.ours = False  # True iff we made this process a subreaper (so we give it back)
        self.detached: dict[int, str] = {}  # a detached session's leader -> where its status goes
        self.recorded: set[int] = set()  # detached leaders reaped here, their status in their record
        self.thread: threading.Thread | None = None


_reaping = _Reaping()


def _prctl(option: int, arg: object) -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(option, arg, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def is_subreaper() -> bool:
    """True iff this process is a child subreaper now (whoever made it one)."""
    flag = ctypes.c_int(0)
    return _prctl(_PR_GET_CHILD_SUBREAPER, ctypes.byref(flag)) and flag.value != 0


def hold_subreaper() -> None:
    """A supervisor opens: the process is a subreaper while any is open (if the kernel lets it)."""
    with _reaping.lock:
        if _reaping.holders == 0 and not is_subreaper():
            _reaping.ours = _prctl(_PR_SET_CHILD_SUBREAPER, 1)
        _reaping.holders += 1


def release_subreaper() -> None:
    """A supervisor is closed. After the last one, the role goes back (if we took it), what was
    adopted and has ended is reaped now, and the rest as it ends (see the module's docstring)."""
    with _reaping.lock:
        _reaping.holders = max(0, _reaping.holders - 1)
        if _reaping.holders or not _reaping.ours:
            last = _reaping.holders == 0
        else:
            _reaping.ours = not _prctl(_PR_SET_CHILD_SUBREAPER, 0)
            last = True
    if last:
        reap_orphans()
        _reap_detached()
    _watch_soon()


def leave_to_next_server(pid: int, record: str) -> None:
    """The leader ``pid`` of a session detached for a next server, if it is still our child:
    reaped when it ends (even with no supervisor open), its wait status written to ``record``
    (its ``sessions/<id>.exit.json``), unless a next server here takes it back first."""
    if _parent_of(pid) != os.getpid():
        return  # not ours to wait for (adopted from a server before): its parent reaps it
    with _reaping.lock:
        _reaping.detached[pid] = record
        _reaping.recorded.discard(pid)  # a number reused since: this one is not reaped
    _watch_soon()


def take_back(pid: int) -> bool:
    """A next server in this process adopts the detached leader ``pid``: False if it was reaped
    here already (its status is in its record, written before it was let go; its pid may be
    anyone's by now), else True: the next server waits for it itself from now on."""
    with _reaping.lock:
        _reaping.detached.pop(pid, None)
        if pid in _reaping.recorded:
            _reaping.recorded.discard(pid)
            return False
        return True


def _reap_detached() -> int:
    """Reap the detached leaders that ended, each one's status written first; how many."""
    reaped = 0
    with _reaping.lock:  # held through the write: a take_back after this finds the record there
        for pid, record in list(_reaping.detached.items()):
            try:
                done, status = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                done, status = -1, None  # reaped by other code: its status went with it
            if done == 0:
                continue
            if status is not None:
                write_outcome(record, {"status": status, "by": "wait"})
            del _reaping.detached[pid]
            _reaping.recorded.add(pid)
            release(pid)
            reaped += 1
    return reaped


def _watch_soon() -> None:
    """Start the thread that reaps after the last close, if it has anything to do."""
    with _reaping.lock:
        if _reaping.thread is not None or not _work_left():
            return
        _reaping.thread = threading.Thread(target=_after_close, name="procpilot-reaper", daemon=True)
        _reaping.thread.start()


def _work_left() -> bool:
    """Under the lock: a detached leader to wait for, or, with no supervisor open (whose
    housekeeping reaps orphans), an adopted orphan still to end."""
    if _reaping.detached:
        return True
    if _reaping.holders:
        return False
    orphans = _orphans()
    return orphans is None or bool(orphans)


def _after_close() -> None:
    pause = _AFTER_CLOSE_BASE
    while True:
        with _reaping.lock:
            each = _AFTER_CLOSE_EACH * len(_reaping.detached)
        time.sleep(pause + each)
        reaped = _reap_detached()
        with _reaping.lock:
            if not _reaping.holders:
                reaped += len(reap_orphans())
            if not _work_left():
                _reaping.thread = None
                return
        pause = _AFTER_CLOSE_BASE if reaped else min(_AFTER_CLOSE_MAX, pause * 2)


def _parent_of(pid: int) -> int | None:
    try:
        fields = stat_fields(pid)
    except OSError:
        return None  # cannot tell now: as before, not waited for here (its parent, if not us, reaps it)
    return int(fields[1]) if fields is not None and len(fields) > 1 else None


def _children_of_self() -> set[int]:
    pids: set[int] = set()
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return pids
    for tid in tasks:
        try:
            with open(f"/proc/self/task/{tid}/children") as f:
                pids.update(int(p) for p in f.read().split())
        except OSError:
            continue
    return pids
