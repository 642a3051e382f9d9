"""``ProcsAPI``: spec 003's client for proc/* messages — spawn with an output callback, write, kill, status.

The client speaks to a :class:`ProcTransport`: ``send(request) -> response`` plus a way to receive
pushed events. :class:`InProcessTransport` wraps a :class:`ProcHandler` in the same process; a
WebSocket (or any other) transport only has to provide the same two methods.

Every ``proc/read/event`` of a process reaches its ``on_output`` callback once, in order: events that
arrive before the spawn response has told us the process id (possible on a network transport) are
held while a spawn is in flight and replayed as soon as the id is known.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any, Literal, Protocol, TypeVar

from procpilot.faces.proc_protocol import (
    ProcConfig,
    ProcHandler,
    ProcKillRequest,
    ProcKillResponse,
    ProcReadEvent,
    ProcSpawnRequest,
    ProcSpawnResponse,
    ProcState,
    ProcStatusRequest,
    ProcStatusResponse,
    ProcWriteRequest,
    ProcWriteResponse,
)
from procpilot.sync import SyncSupervisor

__all__ = ["InProcessTransport", "OutputCallback", "ProcRequestError", "ProcTransport", "ProcsAPI", "SyncProcsAPI"]

_log = logging.getLogger(__name__)

EventCallback = Callable[[dict[str, Any]], None]
OutputCallback = Callable[[ProcReadEvent], None]
R = TypeVar("R", ProcSpawnResponse, ProcWriteResponse, ProcKillResponse, ProcStatusResponse)


class ProcTransport(Protocol):
    """What ProcsAPI needs from a connection to a proc/* host."""

    async def send(self, request: dict[str, Any]) -> dict[str, Any]:
        """Deliver one request and return its response."""

    def on_event(self, callback: EventCallback) -> Callable[[], None]:
        """Call ``callback`` with every pushed event (in order); returns the remover."""


class InProcessTransport:
    """A :class:`ProcHandler` in this process, as a transport."""

    def __init__(self, handler: ProcHandler) -> None:
        self.handler = handler

    async def send(self, request: dict[str, Any]) -> dict[str, Any]:
        return await self.handler.handle(request)

    def on_event(self, callback: EventCallback) -> Callable[[], None]:
        return self.handler.subscribe(callback)


class ProcRequestError(Exception):
    """The host refused a request: ``code`` is the protocol's (unknown_proc, proc_dead, proc_limit, ...)."""

    def __init__(self, code: str, message: str, hints: Mapping[str, str] | None = None) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.hints = dict(hints or {})


class ProcsAPI:
    """``procs = ProcsAPI(handler); resp = await procs.spawn(["python3", "x.py"], on_output=print)``."""

    def __init__(
        self, transport: ProcTransport | ProcHandler, *, session_id: str = "", max_early_events: int = 100_000
    ) -> None:
        self._transport: ProcTransport = (
            InProcessTransport(transport) if isinstance(transport, ProcHandler) else transport
        )
        self.session_id = session_id
        self._ids = itertools.count(1)
        self._callbacks: dict[str, OutputCallback] = {}
        self._ignored: set[str] = set()
        self._early: dict[str, list[ProcReadEvent]] = {}
        self._early_count = 0
        self._max_early = max_early_events
        self._spawning = 0
        self._remove = self._transport.on_event(self._on_event)

    async def __aenter__(self) -> ProcsAPI:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()

    def forget(self, proc_id: str) -> None:
        """Drop the output callback of a process that has ended (events for it are ignored after)."""
        self._callbacks.pop(proc_id, None)
        self._ignored.add(proc_id)

    def close(self) -> None:
        """Stop receiving events (processes are not touched)."""
        self._remove()
        self._callbacks.clear()
        self._early.clear()

    # -- events --------------------------------------------------------------------------------

    def _on_event(self, message: dict[str, Any]) -> None:
        if message.get("type") != "proc/read/event":
            return
        # A host may add fields of its own (the daemon's byte ``offset``): spec 003's model has none.
        event = ProcReadEvent.model_validate({k: v for k, v in message.items() if k in ProcReadEvent.model_fields})
        callback = self._callbacks.get(event.proc_id)
        if callback is not None:
            self._deliver(callback, event)
        elif event.proc_id not in self._ignored and self._spawning:
            # Maybe a process whose spawn response is still on its way: hold its events until then.
            if self._early_count >= self._max_early:
                _log.warning("dropping early proc/read/event for %s: %d held already", event.proc_id, self._max_early)
                return
            self._early.setdefault(event.proc_id, []).append(event)
            self._early_count += 1

    @staticmethod
    def _deliver(callback: OutputCallback, event: ProcReadEvent) -> None:
        try:
            callback(event)
        except Exception:
            _log.exception("on_output callback failed")

    # -- requests ------------------------------------------------------------------------------

    async def _request(self, request: dict[str, Any], model: type[R]) -> R:
        request = {**request, "id": str(next(self._ids))}
        response = model.model_validate(await self._transport.send(request))
        if response.error is not None:
            raise ProcRequestError(response.error.code, response.error.message, response.error.hints)
        return response

    async def spawn(
        self,
        cmd: list[str],
        on_output: OutputCallback | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin_mode: Literal["pipe", "null"] = "pipe",
        timeout: float | None = None,
    ) -> ProcSpawnResponse:
        """Start ``cmd`` (argv, no shell); ``on_output`` gets every output event of it, in order."""
        request = ProcSpawnRequest(
            session_id=self.session_id,
            cmd=list(cmd),
            cwd=cwd,
            env=dict(env or {}),
            stdin_mode=stdin_mode,
            timeout=timeout,
        ).model_dump(mode="json", exclude={"id"})
        self._spawning += 1
        try:
            response = await self._request(request, ProcSpawnResponse)
            proc_id = response.proc_id or ""
            early = self._early.pop(proc_id, [])
            self._early_count -= len(early)
        finally:
            self._spawning -= 1
            if not self._spawning:  # what is still held belongs to no spawn of ours
                self._early.clear()
                self._early_count = 0
        if on_output is None:
            self._ignored.add(proc_id)
        else:
            # Same step as the response: no event can slip in between the replay and the registration.
            for event in early:
                self._deliver(on_output, event)
            self._callbacks[proc_id] = on_output
        return response

    async def write(self, proc_id: str, data: str, eof: bool = False) -> ProcWriteResponse:
        """Write ``data`` to the process's stdin (then close it if ``eof``)."""
        request = ProcWriteRequest(proc_id=proc_id, data=data, eof=eof).model_dump(mode="json", exclude={"id"})
        return await self._request(request, ProcWriteResponse)

    async def kill(self, proc_id: str, signal: Literal["SIGTERM", "SIGKILL", "SIGINT"] = "SIGTERM") -> ProcKillResponse:
        request = ProcKillRequest(proc_id=proc_id, signal=signal).model_dump(mode="json", exclude={"id"})
        return await self._request(request, ProcKillResponse)

    async def status(self, proc_id: str) -> ProcStatusResponse:
        request = ProcStatusRequest(proc_id=proc_id).model_dump(mode="json", exclude={"id"})
        return await self._request(request, ProcStatusResponse)

    async def wait(self, proc_id: str, timeout: float | None = None, interval: float = 0.05) -> ProcStatusResponse:
        """Poll ``status`` until the process is no longer RUNNING (or ``timeout``); the last status.

        On the in-process transport every output event has been delivered by the time this returns
        an ended state.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            status = await self.status(proc_id)
            if status.state is not ProcState.RUNNING:
                return status
            if deadline is not None and time.monotonic() >= deadline:
                return status
            await asyncio.sleep(interval)


class SyncProcsAPI:
    """Spec 003's client as its example calls it, without ``await``::

        with SyncSupervisor() as sup, SyncProcsAPI(sup, "me") as procs:
            resp = procs.spawn(["python3", "-c", "print('hello')"], on_output=lambda e: print(e.data))
            print(procs.wait(resp.proc_id).state)

    A thin wrapper, as :class:`SyncSupervisor` is one over the supervisor: a :class:`ProcsAPI` over
    a :class:`ProcHandler` for ``scope``, both on the supervisor's loop. ``on_output`` callbacks
    run on that loop's thread, so they must not block (a slow one holds every process's output).
    """

    def __init__(self, supervisor: SyncSupervisor, scope: str, config: ProcConfig | None = None) -> None:
        self._sup = supervisor

        async def make() -> tuple[ProcHandler, ProcsAPI]:
            handler = ProcHandler(supervisor.supervisor, scope, config)
            return handler, ProcsAPI(handler)

        self._handler, self._api = supervisor.call(make())

    def __enter__(self) -> SyncProcsAPI:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop receiving events (processes are not touched)."""

        async def close() -> None:
            self._api.close()
            self._handler.close()

        self._sup.call(close())

    def spawn(
        self,
        cmd: list[str],
        on_output: OutputCallback | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin_mode: Literal["pipe", "null"] = "pipe",
        timeout: float | None = None,
    ) -> ProcSpawnResponse:
        return self._sup.call(self._api.spawn(cmd, on_output, cwd, env, stdin_mode, timeout))

    def write(self, proc_id: str, data: str, eof: bool = False) -> ProcWriteResponse:
        return self._sup.call(self._api.write(proc_id, data, eof))

    def kill(self, proc_id: str, signal: Literal["SIGTERM", "SIGKILL", "SIGINT"] = "SIGTERM") -> ProcKillResponse:
        return self._sup.call(self._api.kill(proc_id, signal))

    def status(self, proc_id: str) -> ProcStatusResponse:
        return self._sup.call(self._api.status(proc_id))

    def wait(self, proc_id: str, timeout: float | None = None) -> ProcStatusResponse:
        return self._sup.call(self._api.wait(proc_id, timeout))
