"""The daemon's state and its REST routes: tools, capabilities, approvals, events, the WebSocket."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.websockets import WebSocket, WebSocketState

from procpilot.aio import cancel_and_wait
from procpilot.config import Settings
from procpilot.contract import ToolSpec
from procpilot.engine.events import EventBus
from procpilot.engine.session import ExitInfo
from procpilot.engine.supervisor import Supervisor
from procpilot.errors import (
    ApprovalForbidden,
    InvalidArgument,
    NotSupported,
    ProcpilotError,
    SelfApprovalDenied,
    TooManyConnections,
)
from procpilot.faces.exec_process import exit_event
from procpilot.faces.openclaw_profile import profile_for
from procpilot.transports.http.common import _HEARTBEAT_EVERY, _agent, _error, _json, _json_body, status_for_error
from procpilot.transports.http.events import _EventQueue, _sse, audit_event, audit_scope
from procpilot.transports.http.mcp_http import _McpFace
from procpilot.transports.http.openapi import build_openapi
from procpilot.transports.http.operators import acting_scope
from procpilot.transports.http.proc_socket import ProcConnection

# -- the daemon --------------------------------------------------------------------------------


ProcHandlerFactory = Callable[[Supervisor, str], Any]  # (supervisor, agent) -> a proc/* handler


class Daemon:
    """Everything behind the app: the tools, the MCP server and its notifications, the streams."""

    def __init__(
        self,
        supervisor: Supervisor,
        tools: Sequence[ToolSpec],
        settings: Settings,
        *,
        audit: EventBus[Any] | None = None,
        proc_handler: ProcHandlerFactory | None = None,
        gate: Any | None = None,
    ) -> None:
        self.sup = supervisor
        self.settings = settings
        self.gate = gate
        self.tools = {spec.name: spec for spec in tools}
        self.audit = audit
        self.proc_handler = proc_handler
        self.closing = asyncio.Event()
        self._queues: set[tuple[str, _EventQueue]] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._sockets: set[WebSocket] = set()
        self.mcp = _McpFace(self, tools)

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
        for _agent_id, queue in list(self._queues):
            queue.wakeup.set()
        for ws in list(self._sockets):
            with contextlib.suppress(Exception):
                await ws.close(1001)
        await self.mcp.close_sessions()

    def spawn(self, coro: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- events --

    def _on_exit(self, info: ExitInfo) -> None:
        event = exit_event(info, profile_for(self.settings))
        for agent, queue in list(self._queues):
            if agent == info.scope:
                queue.put("exit", event)
        self.mcp.session_ended(info)

    def _on_audit(self, event: Any) -> None:
        scope = audit_scope(event)
        if scope is None:
            return
        data = audit_event(event)
        for agent, queue in list(self._queues):
            if agent == scope:
                queue.put("audit", data)

    # -- routes --

    async def list_tools(self, request: Request) -> Response:
        _agent()
        rows = [
            {
                "name": spec.name,
                "description": spec.description,
                "tier": spec.tier.value,
                "inputSchema": spec.input_schema(),
                "meta": spec.meta,
            }
            for spec in self.tools.values()
        ]
        return _json({"tools": rows})

    async def call_tool(self, request: Request) -> Response:
        agent = _agent()
        name = request.path_params["name"]
        spec = self.tools.get(name)
        if spec is None:
            return _error(
                "UnknownTool",
                f"no tool named {name!r}",
                hints={"list_tools": "GET /v1/tools lists the tools; the names are those of MCP."},
            )
        try:
            arguments = await _json_body(request, "the tool's arguments as a JSON object")
        except ProcpilotError as exc:
            return _json(exc.to_dict(), exc.http_status)
        try:
            # An operator may act in another agent's scope: POST /v1/tools/NAME?agent=ID.
            scope = acting_scope(self.settings.server, agent, request.query_params.get("agent"))
        except ProcpilotError as exc:
            return _json(exc.to_dict(), exc.http_status)
        result = await spec.call(arguments, scope)
        if result.is_error:
            code = str(result.data.get("error", "ProcpilotError"))
            return _json({**result.data, "text": result.text}, status_for_error(code))
        return _json({"text": result.text, "data": result.data})

    async def capabilities(self, request: Request) -> Response:
        _agent()
        return _json(self.sup.capabilities())

    def _approver(self) -> tuple[str, Any]:
        """The calling approver and the gate, or the error that says why not."""
        agent = _agent()
        if self.gate is None:
            raise NotSupported("this build has no policy gate: nothing is ever held for approval")
        if agent not in self.settings.server.approvers:
            raise ApprovalForbidden(f"agent {agent!r} is not an approver")
        return agent, self.gate

    async def sessions(self, request: Request) -> Response:
        """``process`` list of an agent (``?agent=``, default the caller), each row naming it; another
        agent's, or every agent's (``agent=*``), only for approvers, who already see every agent's
        held calls. What ``procpilot ps --agent`` shows."""
        try:
            caller = _agent()
            wanted = request.query_params.get("agent") or caller
            if wanted != caller and caller not in self.settings.server.approvers:
                raise ApprovalForbidden(
                    f"agent {caller!r} may list only its own sessions",
                    hints={"own_sessions": "Leave agent out; approvers ([server] approvers) may list any agent's."},
                )
            spec = self.tools.get("process")
            if spec is None:
                raise NotSupported("the process tool is not served by this daemon ([tools] serve)")
            scopes = sorted({s.scope for s in self.sup.all_sessions()}) if wanted == "*" else [wanted]
            rows: list[dict[str, Any]] = []
            for scope in scopes:
                listed = await spec.call({"action": "list"}, scope)
                rows += [{**row, "agent": scope} for row in listed.data.get("sessions", [])]
        except ProcpilotError as exc:
            return _json(exc.to_dict(), status_for_error(exc.code))
        return _json({"sessions": rows})

    async def approvals(self, request: Request) -> Response:
        try:
            _approver, gate = self._approver()
        except ProcpilotError as exc:
            return _json(exc.to_dict(), status_for_error(exc.code))
        return _json({"approvals": [r.public() for r in gate.pending()]})

    async def decide(self, request: Request) -> Response:
        try:
            agent, gate = self._approver()
            request_id = request.path_params["request_id"]
            body = await _json_body(request)
            decision, reason = body.get("decision"), body.get("reason")
            if decision not in ("approve", "deny") or not (reason is None or isinstance(reason, str)):
                raise InvalidArgument('send {"decision": "approve" | "deny", "reason": "..."}', field="decision")
            if set(body) - {"decision", "reason"}:
                raise InvalidArgument(f"unknown fields: {sorted(set(body) - {'decision', 'reason'})}")
            held = next((r for r in gate.pending() if r.id == request_id), None)
            if held is not None and held.scope == agent:
                # Four eyes: an approver who could wave through its own calls would need no approval.
                raise SelfApprovalDenied(f"agent {agent!r} cannot decide its own request {request_id}")
            decided = gate.decide(request_id, decision == "approve", approver=agent, reason=reason)
        except ProcpilotError as exc:
            return _json(exc.to_dict(), status_for_error(exc.code))
        return _json({"approval": decided.public()})

    async def openapi(self, request: Request) -> Response:
        _agent()
        from procpilot.transports.mcp import _version

        return JSONResponse(build_openapi(list(self.tools.values()), _version()))

    async def events(self, request: Request) -> Response:
        try:
            # An operator may follow another agent's stream: GET /v1/events?agent=ID.
            agent = acting_scope(self.settings.server, _agent(), request.query_params.get("agent"))
        except ProcpilotError as exc:
            return _json(exc.to_dict(), exc.http_status)
        queue = _EventQueue()
        entry = (agent, queue)
        self._queues.add(entry)
        # What ended while no server ran was told to nobody: every stream of the agent hears it.
        for info in self.sup.outage_exits(agent):
            queue.put("exit", exit_event(info, profile_for(self.settings)))

        async def stream() -> AsyncIterator[bytes]:
            counter = 0
            reported = 0
            try:
                yield b"retry: 3000\n\n" + _sse("ready", {"agent": agent})
                while not self.closing.is_set():
                    if queue.dropped > reported:
                        yield _sse("dropped", {"count": queue.dropped - reported})
                        reported = queue.dropped
                    if queue.items:
                        kind, data = queue.items.popleft()
                        counter += 1
                        yield _sse(kind, data, counter)
                        continue
                    queue.wakeup.clear()
                    try:
                        await asyncio.wait_for(queue.wakeup.wait(), _HEARTBEAT_EVERY)
                    except TimeoutError:
                        yield b": keep-alive\n\n"
            finally:
                self._queues.discard(entry)

        headers = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}
        return StreamingResponse(stream(), media_type="text/event-stream", headers=headers)

    async def proc_socket(self, ws: WebSocket) -> None:
        agent = _agent()
        if self.proc_handler is None:
            await ws.close(1011, "the proc/* protocol is not available in this build")
            return
        try:
            handler = self.proc_handler(self.sup, agent)
        except ProcpilotError as exc:
            await ws.close(1011, f"{exc.code}: {exc.message}"[:120])
            return
        open_here = sum(1 for other in self._sockets if other.scope.get("procpilot.agent") == agent)
        if open_here >= self.settings.server.websockets_per_agent:
            handler.close()
            error = TooManyConnections(f"agent {agent!r} already has {open_here} proc/* WebSockets open, its limit")
            await ws.send_denial_response(_json(error.to_dict(), error.http_status))
            return
        await ws.accept()
        ws.scope["procpilot.agent"] = agent
        self._sockets.add(ws)
        try:
            await ProcConnection(ws, self, agent, handler).run(self.closing)
        finally:
            self._sockets.discard(ws)
            if ws.client_state is WebSocketState.CONNECTED:
                with contextlib.suppress(Exception):
                    await ws.close(1001 if self.closing.is_set() else 1000)
