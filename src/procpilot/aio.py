"""Ending tasks this code started, without losing a cancellation aimed at the code itself.

``task.cancel()`` followed by ``with suppress(BaseException): await task`` swallows two
different things under one name: the task's own end (the ``CancelledError`` we asked for, or an
error it died of) and a cancellation of the *caller* that lands while it waits, which then
carries on as if nobody had asked it to stop. asyncio hands the caller's cancellation to the
future it is awaiting, so awaiting the task itself turns "stop waiting" into "the task was
cancelled again" and the caller never hears of it. Waiting through ``asyncio.wait`` keeps the two
apart (the pattern trio and anyio document): the tasks' ends are read and dropped here, the
caller's cancellation reaches the caller.
"""

from __future__ import annotations

import asyncio
from typing import Any

__all__ = ["cancel_and_wait"]


def _retrieve(task: asyncio.Future[Any]) -> None:
    """Read a finished task's end so asyncio does not log it as never retrieved: it was ours to drop."""
    if not task.cancelled():
        task.exception()


async def cancel_and_wait(*tasks: asyncio.Future[Any]) -> None:
    """Cancel ``tasks`` and wait until every one has ended, whatever it ended with.

    A cancellation of the caller while it waits propagates at once (the tasks, already told to
    stop, end on their own); nothing the tasks raised does.
    """
    for task in tasks:
        task.cancel()
        task.add_done_callback(_retrieve)
    pending = {task for task in tasks if not task.done()}
    if pending:
        await asyncio.wait(pending)
