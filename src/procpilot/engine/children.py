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
the process (``subprocess.run`` on a thread) stays in ours, and is its caller's to wait for.
"""

from __future__ import annotations

import os
import subprocess
import threading
from typing import Any

__all__ = ["claimed", "popen", "reap_orphans", "release"]


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
    own_session = os.getsid(0)
    with _claims.lock:  # a child forked after this look is not in it; one forked before is claimed
        if _claims.forking:
            return reaped
        candidates = _children_of_self() - _claims.pids
    for pid in candidates:
        try:
            if os.getsid(pid) == own_session:
                continue
            done, _ = os.waitpid(pid, os.WNOHANG)
        except (ChildProcessError, ProcessLookupError, PermissionError):
            continue
        if done:
            reaped.append(pid)
    return reaped


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
