"""Both tree mechanisms end setsid'd daemons: the cgroup one (where writable) and the /proc-scan one."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from procpilot.config import Settings
from procpilot.engine.spawn import SpawnSpec
from procpilot.engine.states import SessionState
from procpilot.engine.supervisor import Supervisor
from procpilot.engine.trees import ScanTrees, probe_trees
from tests.conftest import PROGRAMS, PY
from tests.engine.test_supervisor import alive

A = "agent-a"


@pytest.fixture(params=["probed", "scan"])
async def sup(request: pytest.FixtureRequest, settings: Settings) -> AsyncIterator[Supervisor]:
    trees = probe_trees() if request.param == "probed" else ScanTrees()
    async with Supervisor(settings, trees=trees) as s:
        yield s


async def wait_for_pid(pid_file: Path) -> int:
    for _ in range(200):
        if pid_file.exists():
            return int(pid_file.read_text())
        await asyncio.sleep(0.01)
    raise AssertionError("the daemon never wrote its pid")


async def test_kill_reaches_a_double_forked_setsid_daemon(sup: Supervisor, tmp_path: Path) -> None:
    pid_file = tmp_path / "d.pid"
    s = await sup.spawn(SpawnSpec((PY, str(PROGRAMS / "daemonize.py"), str(pid_file), "stay")), scope=A)
    await sup.wait(A, s.id, timeout=10, pattern=re.compile("staying"))
    daemon = await wait_for_pid(pid_file)
    assert daemon in sup._tree_backend.pids(s.id, s.pid)
    await sup.kill(A, s.id, wait=None)
    assert s.state is SessionState.KILLED
    assert not alive(daemon)


async def test_a_daemon_left_by_a_finished_command_is_ended(sup: Supervisor, tmp_path: Path) -> None:
    pid_file = tmp_path / "d.pid"
    s = await sup.run(SpawnSpec((PY, str(PROGRAMS / "daemonize.py"), str(pid_file))), scope=A, yield_ms=None)
    daemon = int(pid_file.read_text())
    assert s.state is SessionState.EXITED_OK
    assert not alive(daemon)


async def test_trees_of_two_sessions_are_told_apart(sup: Supervisor) -> None:
    one = await sup.spawn(SpawnSpec("sleep 30 & sleep 30"), scope=A)
    two = await sup.spawn(SpawnSpec("sleep 31"), scope=A)
    await asyncio.sleep(0.2)
    first, second = sup._tree_backend.pids(one.id, one.pid), sup._tree_backend.pids(two.id, two.pid)
    assert len(first) == 3  # the shell and both sleeps
    assert second
    assert one.pid not in second
    assert not first & second
    await sup.kill(A, one.id, wait=None)
    assert two.is_running
    await sup.kill(A, two.id, wait=None)
