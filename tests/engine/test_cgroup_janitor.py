"""Ended sessions' cgroup directories go on the janitor's thread (engine/cgroup_janitor.py)."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest

from procpilot.engine import cgroup_janitor
from procpilot.engine.limits import Limits
from procpilot.engine.spawn import SpawnSpec
from procpilot.engine.supervisor import Supervisor

# Every os.rmdir of this process, with the thread that made it (sys.audit: the real call, seen as
# it happens). A hook cannot be removed: it records only while a test listens.
_RMDIRS: list[tuple[str, str]] = []
_LISTENING = threading.Event()


def _audit(event: str, args: tuple[object, ...]) -> None:
    if event == "os.rmdir" and _LISTENING.is_set():
        _RMDIRS.append((str(args[0]), threading.current_thread().name))


sys.addaudithook(_audit)


async def test_a_sessions_end_removes_its_cgroups_off_the_event_loop(supervisor: Supervisor) -> None:
    """The kernel may hold a cgroup's rmdir for tens of milliseconds (15 ms at the 99th
    percentile, 112 ms at most, measured over 300 `exec true`): a session's end did it on the
    event loop, stalling every agent's calls. Its directories are gone all the same."""
    if supervisor.tree_mechanism != "cgroup2" and supervisor.limit_mechanism not in ("cgroup1", "cgroup2"):
        pytest.skip("no cgroup directories on this host")
    _RMDIRS.clear()
    _LISTENING.set()
    try:
        for _ in range(3):
            await supervisor.run(SpawnSpec("true", limits=Limits(memory_bytes=64 << 20)), scope="a", yield_ms=None)
        assert cgroup_janitor.wait_idle(10)
    finally:
        _LISTENING.clear()
    loop_thread = threading.current_thread().name
    removed = [path for path, _ in _RMDIRS]
    assert removed, "no session directory was removed"
    assert all(Path(path).name for path in removed)
    on_loop = [path for path, thread in _RMDIRS if thread == loop_thread]
    assert not on_loop, f"removed on the event loop: {on_loop}"
    assert not [path for path in removed if Path(path).exists()]


def test_a_directory_kept_again_is_not_removed(tmp_path: Path) -> None:
    """An agent's group queued for removal as its last session left, joined again at once by
    the next: the removal is called off, and the group stays."""
    group = tmp_path / "group"
    group.mkdir()
    blocker = tmp_path / "blocker"
    blocker.mkdir()
    # Hold the janitor on a directory that will not go (it is not empty) while both are queued.
    (blocker / "inside").mkdir()
    cgroup_janitor.remove_later(blocker)
    cgroup_janitor.remove_later(group)
    cgroup_janitor.keep(group)
    (blocker / "inside").rmdir()
    assert cgroup_janitor.wait_idle(10)
    assert group.is_dir()
    assert not blocker.exists()


def test_a_group_queued_again_after_a_keep_goes_after_what_was_queued_in_between(tmp_path: Path) -> None:
    """An agent's group: queued as its last session ended, kept as a new one joined, queued
    again when that one ended, after the new session's own directory (inside it). The first
    request must not act (the group is not empty then, and the second would be skipped): both
    directories are gone at the end."""
    blocker = tmp_path / "blocker"
    (blocker / "inside").mkdir(parents=True)
    group = tmp_path / "group"
    session = group / "session"
    session.mkdir(parents=True)
    cgroup_janitor.remove_later(blocker)  # holds the janitor while the rest is queued
    cgroup_janitor.remove_later(group)
    cgroup_janitor.keep(group)
    cgroup_janitor.remove_later(session)
    cgroup_janitor.remove_later(group)
    (blocker / "inside").rmdir()
    assert cgroup_janitor.wait_idle(10)
    assert not session.exists()
    assert not group.exists()
