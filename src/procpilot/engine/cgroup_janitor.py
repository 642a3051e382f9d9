"""Ended sessions' cgroup directories removed on a thread of their own, off the event loop.

Removing a cgroup whose last process has just exited usually takes tens of microseconds, but the
kernel sometimes holds the ``rmdir`` while it tears the group down: measured here over 300
``exec true`` in a row, 36 µs at the median, 15 ms at the 99th percentile, up to 112 ms. Every
session's end removed its directories (its v2 tree, its v1 controllers' limits) on the event
loop, so that wait stalled every agent's calls, and came before the ending call's own answer.

Here they are queued (never blocking: past the queue's bound the caller removes it itself, the
old way) and one daemon thread per process removes them, retrying while the kernel reports the
group busy. A directory is only queued when its session's name will not be used again (a
session that restarts keeps its directories' names: its limits are removed inline, before the
next run makes them anew), and a backend that closes removes its whole tree itself whatever is
still queued (the janitor then finds it gone).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import queue
import threading
import time

__all__ = ["keep", "remove_later", "remove_now", "wait_idle"]

_BOUND = 10_000  # directories waiting at most; past it the caller removes its own
_TRIES = 50
_PAUSE = 0.002  # seconds between tries: the kernel lags a moment behind the last exit in the group

_queue: queue.Queue[tuple[str, int]] = queue.Queue(maxsize=_BOUND)
_start_lock = threading.Lock()
_threads: list[threading.Thread] = []


class _Removals:
    """What is queued and not called off, and what the thread is removing now. Each request is
    numbered: only a path's newest counts (one queued before a ``keep`` and queued again after
    it would otherwise go first, before the directories queued in between)."""

    def __init__(self) -> None:
        self.changed = threading.Condition()
        self.pending: dict[str, int] = {}  # path: the number of its newest request
        self.removing: str | None = None
        self.numbers = itertools.count()


_removals = _Removals()


def remove_now(path: str | os.PathLike[str]) -> bool:
    """rmdir ``path`` (retrying while busy, up to 0.1 s); True once it is gone."""
    for _ in range(_TRIES):
        try:
            os.rmdir(path)
            return True
        except FileNotFoundError:
            return True
        except OSError:
            time.sleep(_PAUSE)
    return False


def remove_later(path: str | os.PathLike[str]) -> None:
    """Remove the emptied cgroup directory ``path`` on the janitor's thread, soon (after what
    was queued before it: a session's directory before its agent's group)."""
    name = os.fspath(path)
    with _removals.changed:
        number = _removals.pending[name] = next(_removals.numbers)
    try:
        _queue.put_nowait((name, number))
    except queue.Full:
        with _removals.changed:
            if _removals.pending.get(name) == number:
                del _removals.pending[name]
        remove_now(name)  # back-pressure: this caller pays, as every caller did before
        return
    if not _threads:
        with _start_lock:
            if not _threads:
                thread = threading.Thread(target=_work, name="procpilot-cgroup-janitor", daemon=True)
                thread.start()
                _threads.append(thread)


def keep(path: str | os.PathLike[str]) -> None:
    """``path`` is to be used again (an agent's group a new session joins): a removal queued for
    it is cancelled, and one under way is waited for (the caller then makes it anew)."""
    name = os.fspath(path)
    with _removals.changed:
        _removals.pending.pop(name, None)
        while _removals.removing == name:
            _removals.changed.wait()


def wait_idle(timeout: float) -> bool:
    """Wait until everything queued so far is removed (or ``timeout`` seconds); True if it was."""
    deadline = time.monotonic() + timeout
    while _queue.unfinished_tasks:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


def _work() -> None:
    while True:
        path, number = _queue.get()
        try:
            with _removals.changed:
                if _removals.pending.get(path) != number:
                    continue  # kept meanwhile, or asked again since (that request does it)
                del _removals.pending[path]
                _removals.removing = path
            try:
                with contextlib.suppress(OSError):
                    remove_now(path)
            finally:
                with _removals.changed:
                    _removals.removing = None
                    _removals.changed.notify_all()
        finally:
            _queue.task_done()
