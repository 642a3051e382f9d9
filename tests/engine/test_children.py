"""The orphan reaper and the children the engine claims (engine/children.py)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from pathlib import Path

from procpilot.config import load_settings
from procpilot.engine.children import claimed, reap_orphans
from procpilot.engine.reaper import ExitWatcher
from procpilot.engine.spawn import SpawnSpec
from procpilot.engine.states import SessionState
from procpilot.engine.supervisor import Supervisor


def _zombie(pid: int) -> bool:
    return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None


async def test_an_orphan_reap_never_takes_another_supervisors_leader(tmp_path: Path) -> None:
    """Found by the benchmarks (a call that never returned, about once in 3,000 starts): with
    two supervisors in one process, one's orphan reaper reaped the other's leader in the moment
    between its exit and that supervisor's exit watcher; the watcher found no zombie then, and
    the session stayed running forever. Here the moment is held open: the loop is blocked while
    the leader ends, then an orphan reap runs first (as another supervisor's housekeeping,
    close or orphan-leaving session does)."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    settings_a = load_settings(env={}, state_dir=tmp_path / "state-a", workspace_root=tmp_path / "a")
    settings_b = load_settings(env={}, state_dir=tmp_path / "state-b", workspace_root=tmp_path / "b")
    async with Supervisor(settings_a), Supervisor(settings_b) as b:
        session = await b.spawn(SpawnSpec("exit 7"), scope="b")
        assert session.pid in claimed()
        deadline = time.monotonic() + 10
        while not _zombie(session.pid) and time.monotonic() < deadline:
            time.sleep(0.005)  # blocking on purpose: the loop must not run b's watcher meanwhile
        assert _zombie(session.pid)
        reap_orphans()
        assert _zombie(session.pid), "the reaper took a leader that a supervisor of this process watches"
        assert await session.wait_finished(10)
        assert session.state is SessionState.EXITED_ERROR
        assert session.exit_code == 7
        assert session.pid not in claimed()


def test_a_child_of_other_code_in_the_process_is_left_to_it() -> None:
    """A library user's own `subprocess` child (in this process's session) keeps its status for
    its own wait, even when it ends before an orphan reap."""
    child = subprocess.Popen(["/bin/sh", "-c", "exit 3"])
    assert os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT) is not None
    assert child.pid not in reap_orphans()
    assert child.wait(5) == 3


def test_an_orphan_in_a_session_of_its_own_is_reaped() -> None:
    """What a session's tree leaves with us (a child in another session than ours, that nobody
    claimed) is reaped: no zombie stays."""
    child = subprocess.Popen(["/bin/sh", "-c", "exit 0"], start_new_session=True)
    assert os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT) is not None
    assert reap_orphans() == [child.pid]
    child.returncode = 0  # reaped above: its Popen must not wait for it
    assert not os.path.exists(f"/proc/{child.pid}")


async def test_a_leader_another_waiter_reaped_ends_lost_not_exited_0(supervisor: Supervisor) -> None:
    """Other code in the process took the leader's status (an `os.waitpid` of its own): the
    session still ends (the housekeeping's sweep finds the leader gone), and says its status is
    unknown rather than reporting exit 0."""
    session = await supervisor.spawn(SpawnSpec("exit 3"), scope="b")
    deadline = time.monotonic() + 10
    while not _zombie(session.pid) and time.monotonic() < deadline:
        time.sleep(0.005)  # blocking on purpose: the loop must not run the exit watcher meanwhile
    os.waitpid(session.pid, 0)  # the other waiter
    watcher = ExitWatcher.of(asyncio.get_running_loop())
    assert watcher is not None
    watcher.sweep()  # what the housekeeping does every 2 s
    assert await session.wait_finished(10)
    assert session.state is SessionState.LOST
    assert session.exit_code is None and session.exit_signal is None
    assert session.error is not None and "exit status is unknown" in session.error
