"""Resource usage of whole trees: sampled while they run, completed from the kernel's own
accounting when they end (so even a tree never sampled reports its memory peak and I/O)."""

from __future__ import annotations

import asyncio
import os
import re

from procpilot.engine.spawn import SpawnSpec
from procpilot.engine.supervisor import Supervisor
from procpilot.engine.usage import Usage, sample_tree, usage_tracker
from tests.conftest import PY


async def test_a_tree_never_sampled_still_reports_its_memory_and_io(supervisor: Supervisor) -> None:
    import resource

    ours = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    size = ours + (200 << 20)  # above our own peak: a vfork'd child's ru_maxrss starts from ours
    touch = f"x = bytearray({size}); x[::4096] = bytes(len(x[::4096]))"
    script = f"head -c 3000000 /dev/zero > /dev/null; {PY} -c '{touch}'"
    session = await supervisor.run(SpawnSpec(script), scope="a", yield_ms=None)
    usage = usage_tracker(supervisor).usage(session)  # first asked after the end: nothing sampled
    assert usage.memory_peak_bytes >= size, usage
    assert usage.io_read_bytes >= 3_000_000 and usage.io_write_bytes >= 3_000_000, usage
    assert usage.cpu_ms > 0


async def test_a_tree_never_sampled_tells_its_reads_from_its_writes(supervisor: Supervisor, tmp_path: object) -> None:
    # The leader's I/O counters, read from its zombie at the exit: what was read is not counted
    # as written, nor the other way round.
    big = f"{tmp_path}/big"
    with open(big, "wb") as f:
        f.write(bytes(3_000_000))
    session = await supervisor.run(SpawnSpec(f"wc -l < {big}"), scope="a", yield_ms=None)
    usage = usage_tracker(supervisor).usage(session)  # first asked after the end: nothing sampled
    assert usage.io_read_bytes >= 3_000_000 and usage.io_write_bytes < 1_000_000, usage


def test_sample_tree_of_this_process() -> None:
    usage = sample_tree([os.getpid(), 999_999_999])
    assert usage.cpu_ms > 0 and usage.memory_peak_bytes > 0 and usage.io_read_bytes > 0


async def test_tracker_watch_task_ends_with_the_sessions(supervisor: Supervisor) -> None:
    session = await supervisor.spawn(SpawnSpec("sleep 0.3"), scope="a")
    tracker = usage_tracker(supervisor)
    assert tracker is usage_tracker(supervisor)
    tracker.watch(session)
    task = tracker._task
    assert task is not None and not task.done()
    await session.wait_finished(10)
    await asyncio.wait_for(asyncio.shield(task), 5)
    assert tracker.usage(session).memory_peak_bytes > 0  # the final figures: the kernel's accounting


async def test_latest_reads_the_periodic_samples_and_rss_now_is_the_trees_memory_now(supervisor: Supervisor) -> None:
    # What the console shows each second of every session: no sampling of its own, memory now.
    touch = "x = bytearray(40 << 20); x[::4096] = bytes(len(x[::4096])); print(1, flush=True); time.sleep(30)"
    session = await supervisor.spawn(SpawnSpec(f"{PY} -c 'import time; {touch}'"), scope="a")
    tracker = usage_tracker(supervisor)
    assert tracker.latest(session) == Usage()  # nothing sampled yet; and it is watched from now on
    await supervisor.wait("a", session.id, pattern=re.compile("1"), timeout=30)
    for _ in range(100):
        if tracker.rss_now(session) >= 40 << 20 and tracker.latest(session).memory_peak_bytes >= 40 << 20:
            break
        await asyncio.sleep(0.1)  # the tracker's own cadence fills it in
    assert tracker.rss_now(session) >= 40 << 20
    await supervisor.kill("a", session.id, wait=None)
    assert tracker.rss_now(session) == 0  # ended: nothing resident
    assert tracker.latest(session).memory_peak_bytes >= 40 << 20  # the peak stays


async def test_a_listing_samples_within_its_budget_and_says_unknown_rather_than_zero(
    supervisor: Supervisor,
) -> None:
    # A list of a thousand running sessions must answer in milliseconds: it reuses recent samples
    # and reads stale trees, stalest first, only while its budget lasts. A tree it did not reach
    # and never sampled is None: a 0 there would say "idle, no memory", which is false.
    tracker = usage_tracker(supervisor)
    touch = "x = bytearray(30 << 20); x[::4096] = bytes(len(x[::4096])); print(1, flush=True); time.sleep(30)"
    busy = f"{PY} -c 'import time; {touch}'"
    running = await supervisor.spawn(SpawnSpec(busy), scope="a")
    ended = await supervisor.run(SpawnSpec("true"), scope="a", yield_ms=None)
    await supervisor.wait("a", running.id, pattern=re.compile("1"), timeout=30)
    first = await tracker.snapshot([running, ended], budget=0)  # no time at all to sample
    assert first[running.id] is None and first[ended.id] == tracker.usage(ended)
    second = await tracker.snapshot([running, ended])  # the default budget
    sampled = second[running.id]
    assert sampled is not None and sampled.memory_peak_bytes >= 30 << 20
    again = await tracker.snapshot([running], budget=0)  # within the reuse window: no reading needed
    assert again[running.id] == sampled
    await supervisor.kill("a", running.id, wait=None)
