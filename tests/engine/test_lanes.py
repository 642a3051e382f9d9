"""Lanes: named concurrency caps per agent, first the scheduler alone, then sessions queued on it."""

from __future__ import annotations

import asyncio

import pytest

from procpilot.engine.capture import Stream
from procpilot.engine.lanes import LaneScheduler
from procpilot.engine.spawn import SpawnSpec
from procpilot.engine.states import SessionState
from procpilot.engine.supervisor import Supervisor

A = "agent-a"


async def test_waiters_are_served_in_arrival_order_and_slots_move_to_them() -> None:
    lanes = LaneScheduler({"main": 1})
    await lanes.acquire("main", "a")
    served: list[int] = []

    async def wait_for_slot(n: int) -> None:
        await lanes.acquire("main", "a")
        served.append(n)

    waiters = [asyncio.ensure_future(wait_for_slot(n)) for n in range(3)]
    await asyncio.sleep(0)
    assert lanes.usage("a") == {"main": (1, 3, 1)}
    for expected in range(3):
        lanes.release("main", "a")
        await asyncio.sleep(0)
        assert served == list(range(expected + 1))
    await asyncio.gather(*waiters)
    lanes.release("main", "a")
    assert lanes.usage() == {}  # idle lanes are forgotten


async def test_a_waiter_that_gives_up_passes_its_slot_on() -> None:
    lanes = LaneScheduler({"main": 1})
    await lanes.acquire("main")
    quitter = asyncio.ensure_future(lanes.acquire("main"))
    patient = asyncio.ensure_future(lanes.acquire("main"))
    await asyncio.sleep(0)
    lanes.release("main")  # the slot is handed to the quitter ...
    quitter.cancel()  # ... who gives up before it runs: the slot must not be lost
    with pytest.raises(asyncio.CancelledError):
        await quitter
    await asyncio.wait_for(patient, 5)
    assert lanes.usage("") == {"main": (1, 0, 1)}  # the patient one holds it; nobody waits


def test_cron_jobs_each_get_the_family_cap_and_unknown_lanes_the_default() -> None:
    lanes = LaneScheduler({"cron": 1, "subagent": 2}, default_cap=3)
    assert lanes.try_acquire("cron:nightly") and not lanes.try_acquire("cron:nightly")
    assert lanes.try_acquire("cron:hourly")  # another job, its own lane
    assert lanes.try_acquire("subagent") and lanes.try_acquire("subagent") and not lanes.try_acquire("subagent")
    assert all(lanes.try_acquire("other") for _ in range(3)) and not lanes.try_acquire("other")


async def test_lanes_queue_beyond_their_cap(supervisor: Supervisor) -> None:
    first = await supervisor.spawn(SpawnSpec("sleep 5", lane="main"), scope=A)
    second = await supervisor.spawn(SpawnSpec("echo second", lane="main"), scope=A)
    free = await supervisor.spawn(SpawnSpec("echo free"), scope=A)
    assert first.is_running and second.state is SessionState.QUEUED
    await supervisor.wait(A, free.id, timeout=5)
    assert free.state is SessionState.EXITED_OK
    await supervisor.kill(A, first.id, wait=None)
    assert (await supervisor.wait(A, second.id, timeout=10)).reason == "exited"
    assert second.output[Stream.STDOUT].read().data == b"second\n"


async def test_killing_a_queued_session_ends_it_as_killed(supervisor: Supervisor) -> None:
    first = await supervisor.spawn(SpawnSpec("sleep 5", lane="cron:nightly"), scope=A)
    queued = await supervisor.spawn(SpawnSpec("echo never", lane="cron:nightly"), scope=A)
    other_job = await supervisor.spawn(SpawnSpec("echo other", lane="cron:hourly"), scope=A)
    assert queued.state is SessionState.QUEUED
    assert other_job.state is not SessionState.QUEUED  # cron caps are per job
    await supervisor.kill(A, queued.id)
    assert queued.state is SessionState.KILLED
    assert queued.pid is None
    await supervisor.remove(A, first.id)
    await supervisor.wait(A, other_job.id, timeout=5)


async def test_lanes_are_per_scope(supervisor: Supervisor) -> None:
    mine = await supervisor.spawn(SpawnSpec("sleep 5", lane="main"), scope=A)
    theirs = await supervisor.spawn(SpawnSpec("sleep 5", lane="main"), scope="agent-b")
    queued = await supervisor.spawn(SpawnSpec("echo later", lane="main"), scope=A)
    assert mine.is_running and theirs.is_running  # another agent's main lane is not ours
    assert queued.state is SessionState.QUEUED  # our own cap still holds
    await asyncio.sleep(0.05)  # the queued session's task starts waiting for its slot
    assert supervisor.lane_usage(A) == {"main": (1, 1, 1)}
    assert supervisor.lane_usage()["agent-b/main"] == (1, 0, 1)
    await supervisor.remove("agent-b", theirs.id)
    assert queued.state is SessionState.QUEUED
    await supervisor.kill(A, mine.id, wait=None)
    assert (await supervisor.wait(A, queued.id, timeout=10)).reason == "exited"
    assert supervisor.lane_usage(A) == {}  # idle lanes are not kept
