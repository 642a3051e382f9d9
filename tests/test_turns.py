"""Places and turns of agents' calls (procpilot/turns.py), on a real event loop."""

from __future__ import annotations

import asyncio

import pytest

from procpilot.errors import TooManyRequests
from procpilot.turns import Turns, short_run, waiting


async def test_a_call_back_from_a_wait_goes_before_its_agents_calls_not_yet_started() -> None:
    turns = Turns(places_per_agent=4, working_per_agent=1)
    order: list[str] = []
    back = asyncio.Event()

    async def first() -> None:
        async with await turns.admit("a") as call:
            await call.work()
            async with waiting():  # its process runs: the turn goes to "second"...
                await back.wait()
            order.append("first resumed")  # ...and comes back before "third" starts

    async def queued(name: str) -> None:
        async with await turns.admit("a") as call:
            await call.work()
            order.append(name)
            if name == "second":
                back.set()
                await asyncio.sleep(0)  # still its turn: "first" and "third" both queue for it

    await asyncio.gather(first(), queued("second"), queued("third"))
    assert order == ["second", "first resumed", "third"]
    assert turns.counts("a") == (0, 0, 0)


async def test_another_agent_never_waits_for_a_busy_one() -> None:
    turns = Turns(places_per_agent=2, working_per_agent=1, queued_per_agent=1)
    held = await turns.admit("flood")
    async with held:
        await held.work()
        queued = asyncio.ensure_future(_work(turns, "flood"))
        await asyncio.sleep(0)
        assert turns.counts("flood") == (2, 1, 0) and not queued.done()
        assert await asyncio.wait_for(_work(turns, "quiet"), 1) == "quiet"
    assert await asyncio.wait_for(queued, 1) == "flood"


async def test_past_the_queue_a_call_is_refused_and_a_cancelled_one_gives_all_back() -> None:
    turns = Turns(places_per_agent=1, working_per_agent=1, queued_per_agent=1)
    held = await turns.admit("a")
    async with held:
        waiter = asyncio.ensure_future(turns.admit("a"))
        await asyncio.sleep(0)
        with pytest.raises(TooManyRequests) as refused:
            await turns.admit("a")
        assert refused.value.http_status == 429 and refused.value.hints
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert turns.counts("a") == (1, 0, 0)
    assert turns.counts("a") == (0, 0, 0)


async def test_a_call_without_a_place_takes_turns_but_leaves_the_places_alone() -> None:
    # A proc/* request: bounded by its WebSocket, it must never hold the place of the REST call
    # that would end what it waits for.
    turns = Turns(places_per_agent=1, working_per_agent=1, queued_per_agent=0)
    async with await turns.admit("a", place=False) as request:
        await request.work()
        async with await turns.admit("a") as rest:  # the one place is free
            assert turns.counts("a") == (1, 1, 0)
            with pytest.raises(TooManyRequests):
                await turns.admit("a")
            assert not rest.working
    assert turns.counts("a") == (0, 0, 0)


async def test_outside_a_call_waiting_does_nothing_and_no_run_is_held() -> None:
    assert short_run() == 0.0
    async with waiting():
        pass
    turns = Turns(short_run=0.25)
    async with await turns.admit("a") as call:
        assert short_run() == 0.0  # no turn yet
        await call.work()
        assert short_run() == 0.25


async def _work(turns: Turns, agent: str) -> str:
    async with await turns.admit(agent) as call:
        await call.work()
        return agent


async def test_a_place_or_a_turn_taken_at_once_never_goes_before_a_queued_call() -> None:
    # What the HTTP middleware takes without awaiting (admit_now, work_now) is what admit and
    # work would give at once, and nothing more: a queued call keeps its place in line.
    turns = Turns(places_per_agent=1, working_per_agent=1)
    first = turns.admit_now("a")
    assert first is not None and turns.counts("a") == (1, 0, 0)
    first.enter()
    assert first.work_now() and first.working
    waiter = asyncio.ensure_future(turns.admit("a"))
    await asyncio.sleep(0)
    assert turns.admit_now("a") is None  # the place is held and a call queues for it
    assert turns.counts("a") == (1, 1, 1)
    first.end()
    second = await waiter  # the place went to the queued call, not to a later admit_now
    assert turns.admit_now("a") is None and turns.counts("a") == (1, 0, 0)
    async with second:
        resumed = asyncio.ensure_future(_work(turns, "a"))  # queues for the place
        assert second.work_now()
        assert second.pause() and not second.working
        other = Turns(places_per_agent=2, working_per_agent=1)
        async with await other.admit("b") as holder, await other.admit("b") as later:
            await holder.work()
            assert not later.work_now() and not later.working  # the agent's one turn is taken
            queued = asyncio.ensure_future(later.work())
            await asyncio.sleep(0)
            holder.pause()
            assert not holder.work_now()  # the turn went to the call queued for it
            await queued
            assert later.working
    assert await asyncio.wait_for(resumed, 1) == "a"
    assert turns.counts("a") == (0, 0, 0) and other.counts("b") == (0, 0, 0)
