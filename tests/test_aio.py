"""cancel_and_wait: the tasks end, their ends are dropped, and the caller's own cancellation is not."""

from __future__ import annotations

import asyncio

import pytest

from procpilot.aio import cancel_and_wait


async def _slow_to_stop(told: asyncio.Event, release: asyncio.Event) -> None:
    """A task whose cleanup takes a while after it is cancelled (a socket closing, a child reaped)."""
    try:
        await asyncio.Event().wait()
    except asyncio.CancelledError:
        told.set()
        await release.wait()
        raise


async def test_the_tasks_end_and_what_they_raised_is_dropped() -> None:
    async def fails() -> None:
        raise OSError("the task's own end")

    failing = asyncio.ensure_future(fails())
    told, release = asyncio.Event(), asyncio.Event()
    release.set()
    waiting = asyncio.ensure_future(_slow_to_stop(told, release))
    await asyncio.wait({failing})
    await cancel_and_wait(failing, waiting)
    assert waiting.cancelled() and told.is_set()
    assert isinstance(failing.exception(), OSError)


async def test_a_cancelled_caller_stops_waiting_and_ends_cancelled() -> None:
    told, release = asyncio.Event(), asyncio.Event()
    slow = asyncio.ensure_future(_slow_to_stop(told, release))
    caller = asyncio.ensure_future(cancel_and_wait(slow))
    await told.wait()  # the caller is waiting for the slow task's cleanup now
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    assert not slow.done()  # told to stop, ending on its own
    release.set()
    await asyncio.wait({slow})
    assert slow.cancelled()


async def test_nothing_to_wait_for() -> None:
    done = asyncio.ensure_future(asyncio.sleep(0))
    await asyncio.wait({done})
    await cancel_and_wait(done)
    await cancel_and_wait()
    assert done.done() and not done.cancelled()
