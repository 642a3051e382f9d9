"""Lanes: named concurrency caps. A session that names no lane never waits.

``main`` and ``subagent`` are single lanes; every ``cron`` lane (``cron`` or ``cron:<job>``) has its
own cap, so each job runs one at a time without holding up other jobs. Waiters are served in
arrival order.

Slots belong to a scope (an agent): one agent's ``main`` lane never queues another agent's work.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Mapping

__all__ = ["LaneScheduler"]


class _Lane:
    def __init__(self, cap: int) -> None:
        self.cap = max(1, cap)
        self.active = 0
        self.waiters: deque[asyncio.Future[None]] = deque()


class LaneScheduler:
    def __init__(self, caps: Mapping[str, int], default_cap: int = 1) -> None:
        self._caps = dict(caps)
        self._default = default_cap
        self._lanes: dict[tuple[str, str], _Lane] = {}

    def _cap_for(self, name: str) -> int:
        if name in self._caps:
            return self._caps[name]
        family = name.split(":", 1)[0]
        return self._caps.get(family, self._default)

    def _lane(self, name: str, scope: str) -> _Lane:
        lane = self._lanes.get((scope, name))
        if lane is None:
            lane = self._lanes[(scope, name)] = _Lane(self._cap_for(name))
        return lane

    def try_acquire(self, name: str, scope: str = "") -> bool:
        lane = self._lane(name, scope)
        if lane.active < lane.cap and not lane.waiters:
            lane.active += 1
            return True
        return False

    def take(self, name: str, scope: str = "") -> None:
        """Count a slot as held whatever the cap: a session a previous server started in this lane
        runs (or waits between runs) already, and gives its slot back when it ends."""
        self._lane(name, scope).active += 1

    async def acquire(self, name: str, scope: str = "") -> None:
        if self.try_acquire(name, scope):
            return
        lane = self._lane(name, scope)
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        lane.waiters.append(fut)
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self.release(name, scope)  # the slot was handed over just as we gave up: pass it on
            elif fut in lane.waiters:
                lane.waiters.remove(fut)
            raise

    def release(self, name: str, scope: str = "") -> None:
        lane = self._lane(name, scope)
        while lane.waiters:
            fut = lane.waiters.popleft()
            if not fut.done():
                fut.set_result(None)  # the slot moves to the waiter: active stays the same
                return
        lane.active = max(0, lane.active - 1)
        if not lane.active and not lane.waiters:
            del self._lanes[(scope, name)]  # idle: one entry per scope ever seen would only grow

    def usage(self, scope: str | None = None) -> dict[str, tuple[int, int, int]]:
        """Per lane in use: (active, waiting, cap); those of ``scope`` only, or of every scope
        (then keyed ``scope/lane``)."""
        return {
            (name if scope is not None else f"{owner}/{name}"): (lane.active, len(lane.waiters), lane.cap)
            for (owner, name), lane in self._lanes.items()
            if scope is None or owner == scope
        }
