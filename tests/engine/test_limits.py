"""Limits on real mechanisms: whatever this host offers is probed; each test says what it needs."""

from __future__ import annotations

import asyncio
import os
import re
import time

import pytest

from procpilot.engine.capture import Stream
from procpilot.engine.limits import Limits, WatchdogLimits, probe_limits
from procpilot.engine.spawn import SpawnSpec
from procpilot.engine.states import SessionState
from procpilot.engine.supervisor import Supervisor

A = "agent-a"
_PROBE = probe_limits()
_MECHANISM = _PROBE.name
_PROBE.close()
needs_cgroups = pytest.mark.skipif(
    _MECHANISM == "watchdog", reason="no writable cgroup controllers on this host: only the watchdog works"
)

HOG = "import time\nchunks=[]\nwhile True:\n    chunks.append(bytearray(8 << 20))\n    time.sleep(0.005)\n"
BUSY = "import time\nend=time.time()+{secs}\nwhile time.time()<end: pass\n"


async def test_memory_hog_is_ended_and_reported(supervisor: Supervisor) -> None:
    spec = SpawnSpec(("python3", "-c", HOG), limits=Limits(memory_bytes=96 << 20), timeout=60)
    s = await supervisor.run(spec, scope=A, yield_ms=None)
    assert s.state is SessionState.LIMIT_EXCEEDED
    assert s.accounting.limit_report is not None
    assert s.accounting.limit_report.oom_killed
    assert s.accounting.limit_report.memory_peak_bytes is not None
    assert s.accounting.limit_report.memory_peak_bytes >= 64 << 20


async def test_memory_hog_is_ended_by_the_watchdog(settings) -> None:  # type: ignore[no-untyped-def]
    async with Supervisor(settings, limits=WatchdogLimits()) as sup:
        spec = SpawnSpec(("python3", "-c", HOG), limits=Limits(memory_bytes=96 << 20), timeout=60)
        s = await sup.run(spec, scope=A, yield_ms=None)
        assert s.state is SessionState.LIMIT_EXCEEDED
        assert s.accounting.limit_report is not None
        assert s.accounting.limit_report.oom_killed


async def test_the_watchdog_holds_cpu_to_its_share_by_stopping_the_tree(settings) -> None:  # type: ignore[no-untyped-def]
    async with Supervisor(settings, limits=WatchdogLimits()) as sup:
        spec = SpawnSpec(("python3", "-c", BUSY.format(secs=1.5)), limits=Limits(cpu_fraction=0.5))
        t0 = time.monotonic()
        s = await sup.run(spec, scope=A, yield_ms=None)
        wall = time.monotonic() - t0
        assert s.state is SessionState.EXITED_OK and s.accounting.rusage is not None
        share = (s.accounting.rusage.ru_utime + s.accounting.rusage.ru_stime) / wall
        # Unthrottled, a busy loop takes ~1.0. The floor is loose: on a loaded machine the loop
        # gets less than its share from the scheduler, which says nothing about the limit.
        assert 0.2 <= share <= 0.7, f"used {share:.2f} of a core"


async def test_the_watchdog_ends_a_fork_bomb_past_its_pids_limit(settings) -> None:  # type: ignore[no-untyped-def]
    async with Supervisor(settings, limits=WatchdogLimits()) as sup:
        bomb = "for i in $(seq 1 200); do sleep 30 & done; echo spawned; sleep 30"
        s = await sup.run(SpawnSpec(bomb, limits=Limits(pids_max=20), timeout=60), scope=A, yield_ms=None)
        assert s.state is SessionState.LIMIT_EXCEEDED
        assert s.accounting.limit_report is not None and s.accounting.limit_report.limit == "pids"


async def test_a_throttled_tree_still_ends_on_sigterm(settings) -> None:  # type: ignore[no-untyped-def]
    async with Supervisor(settings, limits=WatchdogLimits()) as sup:
        spec = SpawnSpec(("python3", "-c", BUSY.format(secs=60)), limits=Limits(cpu_fraction=0.1))
        s = await sup.spawn(spec, scope=A)
        state = b""
        for _ in range(500):  # until the watchdog has it stopped
            with open(f"/proc/{s.pid}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
            if state == b"T":
                break
            await asyncio.sleep(0.01)
        assert state == b"T"
        await sup.kill(A, s.id, wait=None)
        assert s.state is SessionState.KILLED
        assert s.exit_signal == "SIGTERM" and s.signal_sent == "SIGTERM"  # it ran to take it: no SIGKILL needed


@needs_cgroups
async def test_cpu_limit_throttles_to_its_share(supervisor: Supervisor) -> None:
    spec = SpawnSpec(("python3", "-c", BUSY.format(secs=2.0)), limits=Limits(cpu_fraction=0.5))
    t0 = time.monotonic()
    s = await supervisor.run(spec, scope=A, yield_ms=None)
    wall = time.monotonic() - t0
    assert s.state is SessionState.EXITED_OK
    assert s.accounting.rusage is not None
    cpu = s.accounting.rusage.ru_utime + s.accounting.rusage.ru_stime
    share = cpu / wall
    # The ceiling is the limit's (unthrottled, a busy loop takes ~1.0). The floor is loose: on a
    # loaded machine the loop gets less than its share from the scheduler, which says nothing
    # about the limit (a quota set far too low would still fail it).
    assert 0.25 <= share <= 0.5 * 1.15, f"used {share:.2f} of a core"


@needs_cgroups
async def test_fork_bomb_is_contained_by_the_pids_limit(supervisor: Supervisor) -> None:
    bomb = "for i in $(seq 1 200); do sleep 30 & done; echo spawned; sleep 30"
    s = await supervisor.spawn(SpawnSpec(bomb, limits=Limits(pids_max=20)), scope=A)
    peak = 0
    while not s.finished:
        peak = max(peak, len(supervisor._tree_backend.pids(s.id, s.pid)))
        await asyncio.sleep(0.01)
    assert peak <= 20
    assert b"fork" in s.output[Stream.STDERR].read().data.lower()
    assert b"spawned" not in s.output[Stream.STDOUT].read().data  # the shell could not get that far
    assert s.state is SessionState.EXITED_ERROR


async def test_unlimited_sessions_need_no_limit_mechanism(supervisor: Supervisor) -> None:
    s = await supervisor.run(SpawnSpec("echo free"), scope=A, yield_ms=None)
    assert s.accounting.limit_report is None
    assert s.state is SessionState.EXITED_OK
    await asyncio.sleep(0)


async def test_capabilities_name_the_mechanisms_in_use(supervisor: Supervisor) -> None:
    caps = supervisor.capabilities()
    assert caps["tree_kill"] == supervisor.tree_mechanism
    assert caps["limits"]["mechanism"] == supervisor.limit_mechanism == _MECHANISM
    assert set(caps["limits"]["enforced"]) | set(caps["limits"]["not_enforced"]) == {"memory", "cpu", "pids"}
    assert "network_off" in caps["isolation"]
    # Every better mechanism that was not used says why.
    order = ["cgroup2", "cgroup1", "watchdog"]
    passed_over = [line.split(": ", 1) for line in caps["limits"]["passed_over"]]
    assert [name for name, _ in passed_over] == order[: order.index(_MECHANISM)]
    assert all(why for _, why in passed_over)


@pytest.mark.skipif(
    os.environ.get("PROCPILOT_VM") != "cgroup2",
    reason="only in the guest of scripts/cgroup2_vm.py, whose v2 hierarchy holds every controller",
)
def test_a_v2_hierarchy_with_controllers_is_used_and_a_delegated_one_too() -> None:
    assert _MECHANISM == "cgroup2", _PROBE.passed_over
    with open("/proc/self/cgroup") as f:
        own = f.read().split("0::", 1)[1].strip()
    if os.environ.get("PROCPILOT_VM_DELEGATED") == "1":
        # Started alone in a non-root cgroup: we moved into a leaf of our own to pass controllers on.
        assert re.fullmatch(r".*/procpilot-[0-9]+-[0-9a-f]+-supervisor", own), own
    else:
        assert own == "/"


@needs_cgroups
async def test_a_non_root_child_cannot_escape_its_cgroup(supervisor: Supervisor) -> None:
    import shutil

    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to start a non-root child")
    escape = (
        "for f in /sys/fs/cgroup/*/cgroup.procs /sys/fs/cgroup/*/tasks; do"
        " echo $$ > $f 2>/dev/null && echo MOVED $f; done; cat /proc/self/cgroup"
    )
    spec = SpawnSpec(
        ("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "sh", "-c", escape),
        limits=Limits(pids_max=50),
    )
    s = await supervisor.run(spec, scope=A, yield_ms=None)
    out = s.output[Stream.STDOUT].read().data.decode()
    assert "MOVED" not in out
    # Still inside the session's cgroups (below its agent's, where the CPU is shared by agent).
    assert re.search(rf"procpilot-{os.getpid()}-\w+/(agent-[\w.-]+/)?{s.id}", out)


async def test_address_space_limit_only_on_request(supervisor: Supervisor) -> None:
    grab = "x = bytearray(300 << 20); print('got it')"
    capped = await supervisor.run(
        SpawnSpec(("python3", "-c", grab), limits=Limits(address_space_bytes=200 << 20)), scope=A, yield_ms=None
    )
    assert capped.state is SessionState.EXITED_ERROR
    assert b"MemoryError" in capped.output[Stream.STDERR].read().data
    free = await supervisor.run(SpawnSpec(("python3", "-c", grab)), scope=A, yield_ms=None)
    assert free.state is SessionState.EXITED_OK  # no RLIMIT_AS unless asked for
