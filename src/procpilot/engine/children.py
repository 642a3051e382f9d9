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

And it reaps only what is provably ours. A process that embeds supervisors has children of its
own, and one its code started in a session of its own (``start_new_session=True``, for a group
kill) looks, to a kernel that keeps no record of who forked whom, just like an orphan our trees
left: reaping it would take its exit status from the ``wait`` of the code that started it (its
``Popen.wait()`` would say 0 whatever it exited with). So an orphan is reaped here only if it is in
a session the engine began (every child it starts begins one: ``start_new_session``, and the
orphans of a session's tree stay in it unless they begin their own), or if it was seen in one of
our sessions' trees (a daemon that began a session of its own, :func:`mark_ours`). A session the
engine began is remembered from the fork (:func:`popen`, :func:`own_session`) until its leader is
reaped, and after that while one of our children is still in it, or for ``_SID_GRACE`` seconds
(what its tree orphans as it is ended comes back to us meanwhile); a number is never remembered
for longer, so a pid that comes back as another's is not taken for ours.

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

import contextlib
import ctypes
import os
import subprocess
import threading
import time
from collections.abc import Iterable
from typing import Any

from procpilot.engine.exit_records import write_outcome
from procpilot.engine.procfs import stat_fields

__all__ = [
    "claimed",
    "hold_subreaper",
    "is_subreaper",
    "leave_to_next_server",
    "mark_ours",
    "own_session",
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


# How long a session the engine began is still ours after its leader was reaped, when none of our
# children is in it: longer than a tree's end takes (the kill grace, then SIGKILL), and at most
# _KEPT_MAX of them are remembered (the oldest go first).
_SID_GRACE = 60.0
_KEPT_MAX = 100_000


class _Claims:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.pids: set[int] = set()
        self.forking = 0  # forks under way (popen) whose child is not claimed yet
        # Sessions the engine began (their leaders' pids): the orphans in them are ours. Value:
        # None while the leader is not reaped, else when it was.
        self.sessions: dict[int, float | None] = {}
        self.seen: dict[int, float] = {}  # pids seen in our trees (mark_ours) -> when


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
            if options.get("start_new_session") or options.get("process_group") == 0:
                _claims.sessions[child.pid] = None
        return child
    finally:
        with _claims.lock:
            _claims.forking -= 1


def release(pid: int) -> None:
    """``pid`` was reaped by its owner: the number may come back as anyone's."""
    with _claims.lock:
        _claims.pids.discard(pid)
        if pid in _claims.sessions:
            _claims.sessions[pid] = time.monotonic()


def own_session(pid: int) -> None:
    """The child ``pid`` (started otherwise than by :func:`popen`) began a session of its own,
    whose members are ours to reap once they end, ``pid`` among them (nobody else waits for it)."""
    with _claims.lock:
        _claims.sessions[pid] = time.monotonic()


def mark_ours(pids: Iterable[int]) -> None:
    """``pids`` are in one of our sessions' trees: once our children (orphans), ours to reap."""
    now = time.monotonic()
    with _claims.lock:
        for pid in pids:
            _claims.seen[pid] = now


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
    """This process's children, ended or not, that are no claimed child and provably ours (see
    the module's docstring): the orphans it adopted. None while a fork is under way (nothing can
    be said)."""
    with _claims.lock:  # a child forked after this look is not in it; one forked before is claimed
        if _claims.forking:
            return None
        candidates = _children_of_self() - _claims.pids
    in_session: dict[int, int] = {}
    for pid in candidates:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            in_session[pid] = os.getsid(pid)
    now = time.monotonic()
    with _claims.lock:
        found = [pid for pid, sid in in_session.items() if pid in _claims.seen or sid in _claims.sessions]
        _forget_old(set(in_session.values()), set(in_session), now)
    return found


def _forget_old(sessions_in_use: set[int], children_now: set[int], now: float) -> None:
    """Under the lock: what no child of ours is in any more, past its grace, is forgotten."""
    sessions, seen = _claims.sessions, _claims.seen
    for sid in [s for s, at in sessions.items() if at is not None and now - at > _SID_GRACE]:
        if sid not in sessions_in_use:
            del sessions[sid]
    for pid in [p for p, at in seen.items() if now - at > _SID_GRACE and p not in children_now]:
        del seen[pid]
    for kept in (sessions, seen):
        while len(kept) > _KEPT_MAX:
            del kept[next(iter(kept))]  # the oldest first (insertion order)


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
