"""The daemon's state behind every route: the supervisor, the tools, the MCP face, the open
streams, and the one lifespan that hears exits and audit events and ends every stream at shutdown.

Route modules (rest, console, mcp_http, proc_socket) read this state; it imports none of them but
the MCP face it owns, so no route module reaches into the composition root (serve.py) or into
another route module.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.websockets import WebSocket

from procpilot.aio import cancel_and_wait
from procpilot.config import Settings
from procpilot.contract import ToolSpec
from procpilot.engine.events import EventBus
from procpilot.engine.session import ExitInfo
from procpilot.engine.supervisor import Supervisor
from procpilot.faces.exec_process import exit_event
from procpilot.faces.openclaw_profile import profile_for
from procpilot.transports.http.auth import turns_for
from procpilot.transports.http.events import EventQueue, audit_event, audit_scope
from procpilot.transports.http.mcp_http import McpFace
from procpilot.turns import Turns

__all__ = ["Daemon", "ProcHandlerFactory"]

ProcHandlerFactory = Callable[[Supervisor, str], Any]  # (supervisor, agent) -> a proc/* handler


class Daemon:
    """Everything behind the app: the tools, the MCP server and its notifications, the streams.

    ``audit_file`` is where the daemon's audit events are written (the console reads its tail);
    None when nothing writes one."""

    def __init__(
        self,
        supervisor: Supervisor,
        tools: Sequence[ToolSpec],
        settings: Settings,
        *,
        audit: EventBus[Any] | None = None,
        audit_file: Path | None = None,
        proc_handler: ProcHandlerFactory | None = None,
        gate: Any | None = None,
    ) -> None:
        self.sup = supervisor
        self.settings = settings
        self.gate = gate
        self.tools = {spec.name: spec for spec in tools}
        self.audit = audit
        self.audit_file = audit_file
        self.proc_handler = proc_handler
        self.closing = asyncio.Event()
        self.queues: set[tuple[str, EventQueue]] = set()  # (agent, queue) of each open SSE stream
        self.sockets: set[WebSocket] = set()  # the open proc/* WebSockets
        self._tasks: set[asyncio.Task[None]] = set()
        self.mcp = McpFace(supervisor, settings, tools, self.spawn)
        # Every agent call of every face (REST, MCP, proc/*) takes its place and its turns here.
        self.turns: Turns = turns_for(settings.server)

    # -- lifecycle --

    @contextlib.asynccontextmanager
    async def lifespan(self, _app: Starlette) -> AsyncIterator[None]:
        removers = [self.sup.on_exit(self._on_exit)]
        if self.audit is not None:
            removers.append(self.audit.add_callback(self._on_audit))
        async with self.mcp.server.session_manager.run():
            try:
                yield
            finally:
                for remove in removers:
                    remove()
                await self.begin_shutdown()
                await cancel_and_wait(*self._tasks)

    async def begin_shutdown(self) -> None:
        """End every stream a client holds open (SSE, WebSocket, MCP), so the server can stop."""
        if self.closing.is_set():
            return
        self.closing.set()
        for _agent_id, queue in list(self.queues):
            queue.wakeup.set()
        for ws in list(self.sockets):
            with contextlib.suppress(Exception):
                await ws.close(1001)
        await self.mcp.close_sessions()

    def spawn(self, coro: Awaitable[None]) -> None:
        """Run ``coro`` as the daemon's own task: cancelled and waited for at shutdown."""
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- events --

    def _on_exit(self, info: ExitInfo) -> None:
        # Called as every session ends, an exec's within its call: converted only for a stream
        # that follows its agent.
        listening = [queue for agent, queue in self.queues if agent == info.scope]
        if listening:
            event = exit_event(info, profile_for(self.settings))
            for queue in listening:
                queue.put("exit", event)
        self.mcp.session_ended(info)

    def _on_audit(self, event: Any) -> None:
        scope = audit_scope(event)
        listening = [queue for agent, queue in self.queues if agent == scope]
        if not listening:
            return  # nobody follows this agent's events: nothing to convert (on every audited call)
        data = audit_event(event)
        for queue in listening:
            queue.put("audit", data)
