"""CPU fairness between agents (engine/fairness.py), on this host's real cgroups.

What is checked is the arrangement the scheduler acts on: which cgroup each process is in, and the
weight of each agent's cgroup. What it buys in latency is measured by bench/hostile.py, not here
(docs/performance.md): a timing claim in a test would fail on a busy machine.
"""

from __future__ import annotations

import asyncio
import errno
import fcntl
import os
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from procpilot.config import Settings
from procpilot.engine import cgroup_janitor
from procpilot.engine.capture import Stream
from procpilot.engine.fairness import AgentGroups, group_name
from procpilot.engine.limits import Limits, WatchdogLimits, probe_limits
from procpilot.engine.session import Session
from procpilot.engine.spawn import SpawnSpec
from procpilot.engine.supervisor import Supervisor
from procpilot.engine.trees import instance_name, kill_cgroup_v1, kill_cgroup_v2, reap_stale_instances
from procpilot.errors import InvalidArgument

A, B = "agent-a", "agent-b"
_PROBE = probe_limits()
_HAS_CPU = _PROBE.name in ("cgroup1", "cgroup2")
_PROBE.close()
needs_cpu_controller = pytest.mark.skipif(not _HAS_CPU, reason="no writable cpu controller on this host")


@pytest.fixture
async def cold(settings: Settings) -> AsyncIterator[Supervisor]:
    async with Supervisor(settings, warm_shells=0) as sup:
        yield sup


def _groups(sup: Supervisor) -> AgentGroups:
    groups = sup._groups
    assert groups.active and groups.base is not None, sup.capabilities()["cpu_fairness"]
    return groups


def _members(directory: Path) -> set[int]:
    """Every process in the cgroup ``directory`` and below. An ended session's group may vanish
    while it is walked (the janitor removes it): os.walk skips it, and so does its read, whether
    it is gone before the open (ENOENT) or between the open and the read (cgroup v2: ENODEV)."""
    found: set[int] = set()
    for where, _dirs, _files in os.walk(directory):
        try:
            found.update(int(p) for p in Path(where, "cgroup.procs").read_text().split())
        except OSError as exc:
            if exc.errno not in (errno.ENOENT, errno.ENODEV):
                raise
    return found


def _text(session: Session) -> str:
    view = session.output[Stream.COMBINED]
    return view.read(0).data.decode(errors="replace")


async def _joined(pid: int | None, directory: Path) -> bool:
    """Whether ``pid`` is in ``directory`` (or below) once its first shell line, the join, has run:
    the line runs as the shell starts, which nothing outside it can await, so look until then."""
    for _ in range(500):
        if pid in _members(directory):
            return True
        await asyncio.sleep(0.01)
    return False


def _weight(directory: Path) -> str:
    knob = directory / "cpu.weight"
    return (knob if knob.exists() else directory / "cpu.shares").read_text().strip()


@needs_cpu_controller
async def test_two_agents_sessions_run_in_two_groups_of_equal_weight(settings: Settings) -> None:
    async with Supervisor(settings, warm_shells=2) as sup:
        groups = _groups(sup)
        base = groups.base
        assert base is not None
        # Cold and warm: the first calls take the shells made at start, the later ones shells
        # made for their agent.
        sessions = {
            agent: [await sup.spawn(SpawnSpec(f"sleep 30 # {n}"), scope=agent) for n in range(4)] for agent in (A, B)
        }
        sessions[A].append(await sup.spawn(SpawnSpec("sleep 30", limits=Limits(cpu_fraction=0.5)), scope=A))
        dirs = {agent: base / group_name(agent) for agent in (A, B)}
        assert dirs[A] != dirs[B]
        for agent, mine in sessions.items():
            other = dirs[B if agent == A else A]
            for session in mine:
                assert await _joined(session.pid, dirs[agent]), (agent, session.spec.command)
                assert session.pid not in _members(other)
        assert _weight(dirs[A]) == _weight(dirs[B]) == ("100" if groups.mechanism == "cgroup2" else "1024")
        caps = sup.capabilities()["cpu_fairness"]
        assert caps["between_agents"] is True and caps["mechanism"] == groups.mechanism
        for session in [*sessions[A], *sessions[B]]:
            await sup.kill(session.scope, session.id, wait=None)


@needs_cpu_controller
async def test_an_agent_id_names_no_path_outside_the_supervisors_directory(cold: Supervisor) -> None:
    ids = ["..", ".", "../..", "/", "a/../../b", "../../../sys/fs/cgroup/cpu", "", "a\0b", "é" * 40]
    names = [group_name(agent) for agent in ids]
    assert len(set(names)) == len(ids)  # no two agents share a group
    for name in names:
        assert "/" not in name and "\0" not in name and name not in (".", "..") and name.startswith("agent-")
    base = _groups(cold).base
    assert base is not None
    hostile = "../../../x"
    session = await cold.spawn(SpawnSpec("sleep 30"), scope=hostile)
    assert await _joined(session.pid, base / group_name(hostile))
    assert [p.name for p in base.iterdir() if p.is_dir()] == [group_name(hostile)]
    for up in (base.parent, base.parent.parent, base.parent.parent.parent):
        assert not (up / "x").exists()
    await cold.kill(hostile, session.id, wait=None)


@needs_cpu_controller
async def test_an_agents_group_goes_with_its_last_session(cold: Supervisor) -> None:
    base = _groups(cold).base
    assert base is not None
    group = base / group_name(A)
    first = await cold.spawn(SpawnSpec("sleep 30"), scope=A)
    second = await cold.run(SpawnSpec("true", limits=Limits(cpu_fraction=0.5)), scope=A, yield_ms=None)
    assert second.finished and group.is_dir()  # the first still runs there
    await cold.kill(A, first.id, wait=None)
    assert cgroup_janitor.wait_idle(10)  # removed off the loop, after its sessions' directories
    assert not group.exists()
    again = await cold.run(SpawnSpec("true"), scope=A, yield_ms=None)  # made again when needed
    assert cgroup_janitor.wait_idle(10)
    assert again.finished and not group.exists()


@needs_cpu_controller
async def test_the_warm_shells_of_an_agent_wait_in_its_group_and_no_other_agent_gets_them(settings: Settings) -> None:
    async with Supervisor(settings, warm_shells=2) as sup:
        base, pool = _groups(sup).base, sup._warm
        assert base is not None and pool is not None
        await sup.run(SpawnSpec("true"), scope=A, yield_ms=None)
        pool.fill()
        mine = list(pool._ready)
        assert [shell.agent for shell in mine] == [A, A]
        for shell in mine:
            assert await _joined(shell.pid, base / group_name(A))
        taken_by_b = await sup.spawn(SpawnSpec("sleep 30"), scope=B)
        assert taken_by_b.pid not in {shell.pid for shell in mine}  # started cold: none was B's
        pool.fill()  # B has a share now: one of A's two makes room for one of B's
        assert sorted(str(shell.agent) for shell in pool._ready) == [A, B]
        await sup.kill(B, taken_by_b.id, wait=None)
    assert not (base / group_name(A)).exists() and not base.exists()


@needs_cpu_controller
async def test_a_warm_start_refused_before_its_command_leaves_its_shell_in_the_agents_group(
    settings: Settings, tmp_path: Path
) -> None:
    # A shell made before any agent was known joins the agent that takes it, with its command.
    # Refused before that (no such workdir), it waits on for that agent: its group must stay,
    # or the agent's next command, the one it runs, finds its group removed and fails.
    async with Supervisor(settings, warm_shells=1) as sup:
        base, pool = _groups(sup).base, sup._warm
        assert base is not None and pool is not None
        pool.fill()
        assert [shell.agent for shell in pool._ready] == [None]
        with pytest.raises(InvalidArgument):
            await sup.run(SpawnSpec("true", cwd=tmp_path / "nowhere"), scope=A, yield_ms=None)
        assert [shell.agent for shell in pool._ready] == [A]  # given back, for A now
        assert cgroup_janitor.wait_idle(10)  # any removal queued has run
        ran = await sup.run(SpawnSpec("echo ran"), scope=A, yield_ms=None)
        assert (ran.exit_code, _text(ran)) == (0, "ran\n"), _text(ran)


@needs_cpu_controller
async def test_a_sessions_memory_and_pids_limits_hold_under_its_agents_group(cold: Supervisor) -> None:
    limits = Limits(memory_bytes=64 << 20, cpu_fraction=0.25, pids_max=30)
    session = await cold.spawn(SpawnSpec("sleep 30", limits=limits), scope=A)
    backend = cold._limit_backend
    groups = _groups(cold)
    assert groups.base is not None
    group = groups.base / group_name(A)
    if groups.mechanism == "cgroup1":
        roots = backend.roots  # type: ignore[attr-defined]
        memory, pids, cpu = roots["memory"] / session.id, roots["pids"] / session.id, group / session.id
        assert int((memory / "memory.limit_in_bytes").read_text()) == 64 << 20
        swap = memory / "memory.memsw.limit_in_bytes"
        assert not swap.exists() or int(swap.read_text()) == 64 << 20
        assert (pids / "pids.max").read_text().strip() == "30"
        assert (cpu / "cpu.cfs_quota_us").read_text().strip() == "25000"
        for directory in (memory, pids, cpu):
            assert await _joined(session.pid, directory)
    else:
        own = group / session.id
        assert int((own / "memory.max").read_text()) == 64 << 20
        assert (own / "pids.max").read_text().strip() == "30"
        assert (own / "cpu.max").read_text().split() == ["25000", "100000"]
        assert await _joined(session.pid, own)
    await cold.kill(A, session.id, wait=None)


async def test_without_a_cpu_controller_capabilities_say_there_is_no_fairness(settings: Settings) -> None:
    async with Supervisor(settings, limits=WatchdogLimits(), warm_shells=0) as sup:
        found = sup.capabilities()["cpu_fairness"]
        assert found["between_agents"] is False and "no writable cpu controller" in found["why"]
        session = await sup.run(SpawnSpec("true"), scope=A, yield_ms=None)
        assert session.finished


@needs_cpu_controller
def test_a_crashed_supervisors_agent_group_a_holder_keeps_is_spared_by_the_sweep(tmp_path: Path) -> None:
    """The next server sweeps what a crashed one left, unless a holder keeps a session there: the
    holder locks the agent's directory its session is in, below the dead server's own."""
    backend = probe_limits()
    try:
        if backend.name == "cgroup1":
            parent, kill = backend.roots["cpu"].parent, kill_cgroup_v1  # type: ignore[attr-defined]
        else:
            parent, kill = backend.root.parent, kill_cgroup_v2  # type: ignore[attr-defined]
    finally:
        backend.close()
    dead = subprocess.Popen(["true"])
    dead.wait()  # a pid that names no live process: its supervisor is gone
    stale = parent / instance_name().replace(f"-{os.getpid()}-", f"-{dead.pid}-")
    group = stale / group_name(A)
    group.mkdir(parents=True)
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        (group / "cgroup.procs").write_text(str(sleeper.pid))
        os.utime(stale, (1, 1))  # old enough to be stale, not a supervisor between mkdir and lock
        held = os.open(group, os.O_RDONLY | os.O_DIRECTORY)
        fcntl.flock(held, fcntl.LOCK_SH)
        assert stale not in reap_stale_instances(parent, kill)
        assert sleeper.poll() is None and group.is_dir()
        os.close(held)
        assert stale in reap_stale_instances(parent, kill)
        assert sleeper.wait(5) == -9 and not stale.exists()
    finally:
        sleeper.kill()
        sleeper.wait()
        for directory in (group, stale):
            if directory.exists():
                directory.rmdir()
