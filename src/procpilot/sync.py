"""A thin synchronous facade: the async Supervisor on an event loop in a background thread."""

from __future__ import annotations

import asyncio
import builtins
import re
import signal
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from procpilot.config import Settings
from procpilot.engine.capture import Stream
from procpilot.engine.session import Session
from procpilot.engine.spawn import SpawnSpec
from procpilot.engine.supervisor import Supervisor, WaitOutcome

__all__ = ["SyncSupervisor"]

T = TypeVar("T")


class SyncSupervisor:
    """``with SyncSupervisor() as sup: sup.run(SpawnSpec("make"), scope="me", yield_ms=None)``."""

    def __init__(self, settings: Settings | None = None) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="procpilot-loop", daemon=True)
        self._thread.start()
        self.supervisor = self._call(self._make(settings))

    async def _make(self, settings: Settings | None) -> Supervisor:
        return await Supervisor(settings).start()

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the supervisor's loop and return its result: for synchronous wrappers
        of what runs over the supervisor (``procpilot.faces.procs_client.SyncProcsAPI``)."""
        return self._call(coro)

    def __enter__(self) -> SyncSupervisor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if not self._loop.is_running():
            return
        self._call(self.supervisor.aclose())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    def spawn(self, spec: SpawnSpec, *, scope: str) -> Session:
        return self._call(self.supervisor.spawn(spec, scope=scope))

    def run(self, spec: SpawnSpec, *, scope: str, yield_ms: int | None = None) -> Session:
        return self._call(self.supervisor.run(spec, scope=scope, yield_ms=yield_ms))

    def wait(
        self,
        scope: str,
        session_id: str,
        *,
        timeout: float | None,
        pattern: re.Pattern[str] | None = None,
        stream: Stream = Stream.COMBINED,
    ) -> WaitOutcome:
        return self._call(self.supervisor.wait(scope, session_id, timeout=timeout, pattern=pattern, stream=stream))

    def write(self, scope: str, session_id: str, data: bytes, *, eof: bool = False) -> int:
        return self._call(self.supervisor.write(scope, session_id, data, eof=eof))

    def kill(self, scope: str, session_id: str, sig: int = signal.SIGTERM, *, wait: float | None = None) -> Session:
        return self._call(self.supervisor.kill(scope, session_id, sig, wait=wait))

    def list(self, scope: str) -> builtins.list[Session]:
        return self._loop_call(lambda: self.supervisor.list(scope))

    def get(self, scope: str, session_id: str) -> Session:
        return self._loop_call(lambda: self.supervisor.get(scope, session_id))

    def remove(self, scope: str, session_id: str) -> Session:
        return self._call(self.supervisor.remove(scope, session_id))

    def _loop_call(self, fn: Callable[[], T]) -> T:
        # Sessions are owned by the loop thread: read them there, not from this one.
        async def call() -> T:
            return fn()

        return self._call(call())
