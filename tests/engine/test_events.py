"""The event bus: every subscriber gets every event in order, a slow one loses only its oldest
events (counted), and a callback's bug reaches neither the publisher nor the other subscribers."""

from __future__ import annotations

import asyncio
import logging

import pytest

from procpilot.engine.events import EventBus


async def test_each_subscriber_gets_every_event_in_order() -> None:
    bus: EventBus[int] = EventBus()
    first, second = bus.subscribe(), bus.subscribe()
    for n in range(5):
        bus.publish(n)
    assert [await first.get(1) for _ in range(5)] == [0, 1, 2, 3, 4]
    assert [await second.get(1) for _ in range(5)] == [0, 1, 2, 3, 4]
    assert await first.get(0.01) is None  # nothing more: a timeout, not a hang


async def test_a_slow_subscriber_keeps_the_newest_and_counts_what_it_lost() -> None:
    bus: EventBus[int] = EventBus()
    slow = bus.subscribe(maxsize=3)
    for n in range(10):
        bus.publish(n)
    assert slow.dropped == 7
    assert [await slow.get(1) for _ in range(3)] == [7, 8, 9]


async def test_a_failing_callback_does_not_stop_delivery(caplog: pytest.LogCaptureFixture) -> None:
    bus: EventBus[str] = EventBus()
    seen: list[str] = []

    def broken(event: str) -> None:
        raise RuntimeError("subscriber bug")

    bus.add_callback(broken)
    remove = bus.add_callback(seen.append)
    with caplog.at_level(logging.ERROR):
        bus.publish("exit")
    assert seen == ["exit"] and "event callback failed" in caplog.text
    remove()
    bus.publish("later")
    assert seen == ["exit"]


async def test_close_ends_every_iteration_and_forgets_the_subscribers() -> None:
    bus: EventBus[int] = EventBus()
    sub = bus.subscribe()
    collected: list[int] = []

    async def collect() -> None:
        async for event in sub:
            collected.append(event)

    task = asyncio.ensure_future(collect())
    bus.publish(1)
    await asyncio.sleep(0)
    bus.close()
    await asyncio.wait_for(task, 5)
    assert collected == [1] and not bus.has_listeners
