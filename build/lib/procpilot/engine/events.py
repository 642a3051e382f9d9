"""Fan-out of engine events to callbacks and async iterators, each with a bounded queue.

A slow subscriber never grows memory without bound: past ``maxsize`` the oldest event is
dropped and the subscriber's ``dropped`` count says how many it missed.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import Generic, TypeVar

__all__ = ["EventBus", "Subscription"]

T = TypeVar("T")
_log = logging.getLogger(__name__)


class Subscription(Generic[T]):
    """One subscriber's queue; iterate it with ``async for``; ``close()`` ends the iteration."""

    def __init__(self, bus: EventBus[T], maxsize: int) -> None:
        self._bus = bus
        self._queue: deque[T] = deque()
        self._maxsize = maxsize
        self._wakeup = asyncio.Event()
        self._closed = False
        self.dropped = 0

    def _put(self, event: T) -> None:
        if len(self._queue) >= self._maxsize:
            self._queue.popleft()
            self.dropped += 1
        self._queue.append(event)
        self._wakeup.set()

    def close(self) -> None:
        self._closed = True
        self._bus._remove(self)
        self._wakeup.set()

    def __aiter__(self) -> AsyncIterator[T]:
        return self

    async def __anext__(self) -> T:
        while not self._queue:
            if self._closed:
                raise StopAsyncIteration
            self._wakeup.clear()
            await self._wakeup.wait()
        return self._queue.popleft()

    async def get(self, timeout: float | None = None) -> T | None:
        """The next event, or None after ``timeout`` seconds (or once closed and empty)."""
        try:
            return await asyncio.wait_for(self.__anext__(), timeout)
        except (TimeoutError, StopAsyncIteration):
            return None


class EventBus(Generic[T]):
    def __init__(self) -> None:
        self._subs: list[Subscription[T]] = []
        self._callbacks: list[Callable[[T], None]] = []

    @property
    def has_listeners(self) -> bool:
        """True iff an event published now would reach anyone (so callers may skip building it)."""
        return bool(self._subs or self._callbacks)

    def publish(self, event: T) -> None:
        for sub in list(self._subs):
            sub._put(event)
        for callback in list(self._callbacks):
            try:
                callback(event)
            except Exception:
                # A subscriber's bug must not stop delivery to the others, nor the engine.
                _log.exception("event callback failed")

    def subscribe(self, maxsize: int = 1000) -> Subscription[T]:
        sub = Subscription(self, maxsize)
        self._subs.append(sub)
        return sub

    def add_callback(self, callback: Callable[[T], None]) -> Callable[[], None]:
        self._callbacks.append(callback)

        def remove() -> None:
            if callback in self._callbacks:
                self._callbacks.remove(callback)

        return remove

    def _remove(self, sub: Subscription[T]) -> None:
        if sub in self._subs:
            self._subs.remove(sub)

    def close(self) -> None:
        for sub in list(self._subs):
            sub.close()
