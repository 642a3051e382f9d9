"""Both tree mechanisms end setsid'd daemons: the cgroup one (where writable) and the /proc-scan one."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from procpilot.config import Settings
from procpilot.engine.limits import Limits
from procpilot.engine.spawn import SpawnSpec
from procpilot.engine.states import SessionState
from procpilot.engine.supervisor import Supervisor
from procpilot.engine.trees import (
    CgroupTrees,
    ScanTrees,
    hold_instance,
    kill_cgroup_v2,
    probe_trees,
    reap_stale_instances,
    release_instance,
)
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
    # Until both shells have started their sleeps (slow in an emulated guest on a busy host).
    for _ in range(200):
        first, second = sup._tree_backend.pids(one.id, one.pid), sup._tree_backend.pids(two.id, two.pid)
        if len(first) == 3 and second:
            break
        await asyncio.sleep(0.05)
    assert len(first) == 3  # the shell and both sleeps
    assert second
    assert one.pid not in second
    assert not first & second
    await sup.kill(A, one.id, wait=None)
    assert two.is_running
    await sup.kill(A, two.id, wait=None)


CRASHING_SUPERVISOR = """
import asyncio, json, sys
from pathlib import Path
from procpilot.config import load_settings
from procpilot.engine.limits import Limits
from procpilot.engine.spawn import SpawnSpec
from procpilot.engine.supervisor import Supervisor

async def main():
    settings = load_settings(env={}, state_dir=Path(sys.argv[1]), workspace_root=Path(sys.argv[2]))
    sup = await Supervisor(settings).start()
    limits = Limits(memory_bytes=256 << 20, cpu_fraction=0.5, pids_max=50)
    s = await sup.spawn(SpawnSpec("setsid sleep 60 & sleep 60", limits=limits), scope="a")
    trees, caps = sup._tree_backend, sup._limit_backend
    while len(trees.pids(s.id, s.pid)) < 3:
        await asyncio.sleep(0.01)
    dirs = [str(getattr(trees, "root", ""))]
    dirs += [str(p) for p in getattr(caps, "roots", {}).values()] + [str(getattr(caps, "root", ""))]
    print(json.dumps({"trees": trees.name, "limits": caps.name, "dirs": [d for d in dirs if d],
                      "pids": sorted(trees.pids(s.id, s.pid))}), flush=True)
    await asyncio.sleep(600)

asyncio.run(main())
"""


async def test_a_crashed_supervisors_cgroups_and_processes_are_ended_at_start_up(
    settings: Settings, tmp_path: Path
) -> None:
    script = tmp_path / "crash.py"
    script.write_text(CRASHING_SUPERVISOR)
    child = subprocess.Popen(
        [PY, str(script), str(tmp_path / "state-crashed"), str(settings.workspace_root)], stdout=subprocess.PIPE
    )
    try:
        assert child.stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(child.stdout.readline), 30)
        left = json.loads(line)
    finally:
        child.kill()  # SIGKILL: no clean-up of any kind
        child.wait()
        if child.stdout is not None:
            child.stdout.close()
    if left["trees"] != "cgroup2" and left["limits"] not in ("cgroup1", "cgroup2"):
        pytest.skip("no writable cgroup hierarchy here: nothing is left behind to end")
    dirs = [Path(d) for d in left["dirs"]]
    assert dirs and all(d.is_dir() for d in dirs)
    assert all(alive(pid) for pid in left["pids"])  # the crash left its session running, daemon included
    await asyncio.sleep(1.2)  # past the grace a just-created directory gets

    async with Supervisor(settings) as sup:
        assert not [d for d in dirs if d.exists()]
        assert not [pid for pid in left["pids"] if alive(pid)]
        s = await sup.run(SpawnSpec("echo fine", limits=Limits(memory_bytes=64 << 20)), scope=A, yield_ms=None)
        assert s.state is SessionState.EXITED_OK  # and its own directories work


async def test_a_live_supervisors_directories_are_left_alone(settings: Settings) -> None:
    async with Supervisor(settings) as first:
        s = await first.spawn(SpawnSpec("sleep 30"), scope=A)
        backend = first._tree_backend
        if not isinstance(backend, CgroupTrees):
            pytest.skip("the tree backend here is not cgroup v2")
        # Its pid may mean nothing in another pid namespace: only its lock says it lives.
        fake = backend.root.parent / f"procpilot-{2**22 + 1}-abcdef"
        fake.mkdir()
        try:
            hold = hold_instance(fake)
            os.utime(fake, (0, 0))  # old enough to be a crash's leftover
            assert reap_stale_instances(backend.root.parent, kill_cgroup_v2) == []
            assert fake.exists() and s.is_running
            release_instance(hold)
            assert reap_stale_instances(backend.root.parent, kill_cgroup_v2) == [fake]
        finally:
            with contextlib.suppress(OSError):
                fake.rmdir()
        assert s.is_running and backend.root.exists()
        await first.kill(A, s.id, wait=None)
