"""The REST routes: tools, capabilities, sessions, approvals, events (SSE), the proc/* WebSocket.
Each reads the daemon's state (``daemon.py``)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import BaseRoute, Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketState

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
from procpilot.transports.http.common import (
    HEARTBEAT_EVERY,
    error_response,
    json_body,
    json_response,
    request_agent,
    status_for_error,
)
from procpilot.transports.http.daemon import Daemon
from procpilot.transports.http.events import EventQueue, sse
from procpilot.transports.http.openapi import build_openapi
from procpilot.transports.http.operators import acting_scope
from procpilot.transports.http.proc_socket import ProcConnection
from procpilot.transports.mcp import procpilot_version

__all__ = ["Rest"]


class Rest:
    """The REST routes over one daemon's state."""

    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon

    def routes(self) -> list[BaseRoute]:
        return [
            Route("/v1/tools", self.list_tools, methods=["GET"]),
            Route("/v1/tools/{name:path}", self.call_tool, methods=["POST"]),
            Route("/v1/events", self.events, methods=["GET"]),
            Route("/openapi.json", self.openapi, methods=["GET"]),
            Route("/v1/capabilities", self.capabilities, methods=["GET"]),
            Route("/v1/sessions", self.sessions, methods=["GET"]),
            Route("/v1/approvals", self.approvals, methods=["GET"]),
            Route("/v1/approvals/{request_id}", self.decide, methods=["POST"]),
            WebSocketRoute("/v1/proc", self.proc_socket),
        ]

    # -- routes --

    async def list_tools(self, request: Request) -> Response:
        request_agent()
        rows = [
            {
                "name": spec.name,
                "description": spec.description,
                "tier": spec.tier.value,
                "inputSchema": spec.input_schema(),
                "meta": spec.meta,
            }
            for spec in self.daemon.tools.values()
        ]
        return json_response({"tools": rows})

    async def call_tool(self, request: Request) -> Response:
        agent = request_agent()
        name = request.path_params["name"]
        # Either spelling of a dotted name: the CLI says process.logs to a daemon serving process_logs.
        spec = self.daemon.tools.get(name) or self.daemon.tools.get(name.replace(".", "_"))
        if spec is None:
            return error_response(
                "UnknownTool",
                f"no tool named {name!r}",
                hints={"list_tools": "GET /v1/tools lists the tools; the names are those of MCP."},
            )
        try:
            arguments = await json_body(request, "the tool's arguments as a JSON object")
        except ProcpilotError as exc:
            return json_response(exc.to_dict(), exc.http_status)
        try:
            # An operator may act in another agent's scope: POST /v1/tools/NAME?agent=ID.
            scope = acting_scope(self.daemon.settings.server, agent, request.query_params.get("agent"))
        except ProcpilotError as exc:
            return json_response(exc.to_dict(), exc.http_status)
        result = await spec.call(arguments, scope)
        if result.is_error:
            code = str(result.data.get("error", "ProcpilotError"))
            return json_response({**result.data, "text": result.text}, status_for_error(code))
        return json_response({"text": result.text, "data": result.data})

    async def capabilities(self, request: Request) -> Response:
        request_agent()
        return json_response(self.daemon.sup.capabilities())

    def _approver(self) -> tuple[str, Any]:
        """The calling approver and the gate, or the error that says why not."""
        agent = request_agent()
        if self.daemon.gate is None:
            raise NotSupported("this build has no policy gate: nothing is ever held for approval")
        if agent not in self.daemon.settings.server.approvers:
            raise ApprovalForbidden(f"agent {agent!r} is not an approver")
        return agent, self.daemon.gate

    async def sessions(self, request: Request) -> Response:
        """``process`` list of an agent (``?agent=``, default the caller), each row naming it; another
        agent's, or every agent's (``agent=*``), only for approvers, who already see every agent's
        held calls. What ``procpilot ps --agent`` shows."""
        try:
            caller = request_agent()
            wanted = request.query_params.get("agent") or caller
            if wanted != caller and caller not in self.daemon.settings.server.approvers:
                raise ApprovalForbidden(
                    f"agent {caller!r} may list only its own sessions",
                    hints={"own_sessions": "Leave agent out; approvers ([server] approvers) may list any agent's."},
                )
            spec = self.daemon.tools.get("process")
            if spec is None:
                raise NotSupported("the process tool is not served by this daemon ([tools] serve)")
            scopes = sorted({s.scope for s in self.daemon.sup.all_sessions()}) if wanted == "*" else [wanted]
            rows: list[dict[str, Any]] = []
            for scope in scopes:
                listed = await spec.call({"action": "list"}, scope)
                rows += [{**row, "agent": scope} for row in listed.data.get("sessions", [])]
        except ProcpilotError as exc:
            return json_response(exc.to_dict(), status_for_error(exc.code))
        return json_response({"sessions": rows})

    async def approvals(self, request: Request) -> Response:
        try:
            _approver, gate = self._approver()
        except ProcpilotError as exc:
            return json_response(exc.to_dict(), status_for_error(exc.code))
        return json_response({"approvals": [r.public() for r in gate.pending()]})

    async def decide(self, request: Request) -> Response:
        try:
            agent, gate = self._approver()
            request_id = request.path_params["request_id"]
            body = await json_body(request)
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
            return json_response(exc.to_dict(), status_for_error(exc.code))
        return json_response({"approval": decided.public()})

    async def openapi(self, request: Request) -> Response:
        request_agent()
        return JSONResponse(build_openapi(list(self.daemon.tools.values()), procpilot_version()))

    async def events(self, request: Request) -> Response:
        try:
            # An operator may follow another agent's stream: GET /v1/events?agent=ID.
            agent = acting_scope(self.daemon.settings.server, request_agent(), request.query_params.get("agent"))
        except ProcpilotError as exc:
            return json_response(exc.to_dict(), exc.http_status)
        queue = EventQueue()
        entry = (agent, queue)
        self.daemon.queues.add(entry)
        # What ended while no server ran was told to nobody: every stream of the agent hears it.
        for info in self.daemon.sup.outage_exits(agent):
            queue.put("exit", exit_event(info, profile_for(self.daemon.settings)))

        async def stream() -> AsyncIterator[bytes]:
            counter = 0
            reported = 0
            try:
                yield b"retry: 3000\n\n" + sse("ready", {"agent": agent})
                while not self.daemon.closing.is_set():
                    if queue.dropped > reported:
                        yield sse("dropped", {"count": queue.dropped - reported})
                        reported = queue.dropped
                    if queue.items:
                        kind, data = queue.items.popleft()
                        counter += 1
                        yield sse(kind, data, counter)
                        continue
                    queue.wakeup.clear()
                    try:
                        await asyncio.wait_for(queue.wakeup.wait(), HEARTBEAT_EVERY)
                    except TimeoutError:
                        yield b": keep-alive\n\n"
            finally:
                self.daemon.queues.discard(entry)

        headers = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}
        return StreamingResponse(stream(), media_type="text/event-stream", headers=headers)

    async def proc_socket(self, ws: WebSocket) -> None:
        agent = request_agent()
        if self.daemon.proc_handler is None:
            await ws.close(1011, "the proc/* protocol is not available in this build")
            return
        try:
            handler = self.daemon.proc_handler(self.daemon.sup, agent)
        except ProcpilotError as exc:
            await ws.close(1011, f"{exc.code}: {exc.message}"[:120])
            return
        open_here = sum(1 for other in self.daemon.sockets if other.scope.get("procpilot.agent") == agent)
        if open_here >= self.daemon.settings.server.websockets_per_agent:
            handler.close()
            error = TooManyConnections(f"agent {agent!r} already has {open_here} proc/* WebSockets open, its limit")
            await ws.send_denial_response(json_response(error.to_dict(), error.http_status))
            return
        await ws.accept()
        ws.scope["procpilot.agent"] = agent
        self.daemon.sockets.add(ws)
        try:
            await ProcConnection(ws, self.daemon.sup, agent, handler, self.daemon.turns).run(self.daemon.closing)
        finally:
            self.daemon.sockets.discard(ws)
            if ws.client_state is WebSocketState.CONNECTED:
                with contextlib.suppress(Exception):
                    await ws.close(1001 if self.daemon.closing.is_set() else 1000)
