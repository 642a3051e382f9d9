"""The REST routes: tools, capabilities, sessions, approvals, events (SSE), the proc/* WebSocket.
Each reads the daemon's state (``daemon.py``)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.datastructures import QueryParams
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import BaseRoute, Route, WebSocketRoute
from starlette.types import Receive, Scope, Send
from starlette.websockets import WebSocket, WebSocketState

from procpilot import chat_context, wire
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
    header,
    header_values,
    json_body,
    json_object,
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
        # Documents that do not change while the daemon runs (its tools are fixed when it starts;
        # a reload re-executes it): built at the first request, then served as they are. Each
        # was rebuilt per request before, every input model's JSON schema again (8 ms a call).
        self._documents: dict[str, bytes] = {}
        self.tool_call = ToolCall(daemon)  # also served without the router (app.py's call_routes)

    def routes(self) -> list[BaseRoute]:
        return [
            Route("/v1/tools", self.list_tools, methods=["GET"]),
            Route("/v1/tools/{name:path}", self.tool_call, methods=["POST"]),
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
        return self._document("tools", self._tools_document)

    def _tools_document(self) -> Any:
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
        return {"tools": rows}

    def _document(self, name: str, build: Callable[[], Any]) -> Response:
        body = self._documents.get(name)
        if body is None:
            body = self._documents[name] = wire.dumps_bytes(build())
        return Response(body, media_type="application/json")

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
        return self._document("openapi", lambda: build_openapi(list(self.daemon.tools.values()), procpilot_version()))

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


class ToolCall:
    """``POST /v1/tools/{name}`` as a bare ASGI app: the body (already read whole by the auth
    middleware) parsed as the arguments, the tool called in the caller's scope (or an operator's
    ``?agent=``), the result written as JSON. No ``Request``, no ``Response`` object and no
    handler wrapper per call: they were a third of what REST added to a call after idle."""

    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        agent = request_agent()
        name = scope["path_params"]["name"]
        # Either spelling of a dotted name: the CLI says process.logs to a daemon serving process_logs.
        spec = self.daemon.tools.get(name) or self.daemon.tools.get(name.replace(".", "_"))
        if spec is None:
            hints = {"list_tools": "GET /v1/tools lists the tools; the names are those of MCP."}
            await error_response("UnknownTool", f"no tool named {name!r}", hints=hints)(scope, receive, send)
            return
        body = await _whole_body(receive)
        if body is None:
            return  # the client left: nobody to answer
        try:
            what = "the tool's arguments as a JSON object"
            arguments = json_object(body, header(scope, b"content-type") or "", what)
            # An operator may act in another agent's scope: POST /v1/tools/NAME?agent=ID.
            query = scope.get("query_string", b"")
            wanted = QueryParams(query).get("agent") if query else None
            acting = acting_scope(self.daemon.settings.server, agent, wanted)
            chat = chat_context.from_header(header_values(scope, _CONTEXT_HEADER))
        except ProcpilotError as exc:
            await _write_json(send, exc.to_dict(), exc.http_status)
            return
        with chat_context.calling_from(chat):
            result = await spec.call(arguments, acting)
        if result.is_error:
            code = str(result.data.get("error", "ProcpilotError"))
            await _write_json(send, {**result.data, "text": result.text}, status_for_error(code))
        else:
            await _write_json(send, {"text": result.text, "data": result.data}, 200)


_CONTEXT_HEADER = chat_context.HEADER.lower().encode()


async def _whole_body(receive: Receive) -> bytes | None:
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return None
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(chunks)


async def _write_json(send: Send, data: Any, status: int) -> None:
    body = wire.dumps_bytes(data)  # an agent's text echoed back (an env name) must not make it a 500
    headers = [(b"content-length", str(len(body)).encode()), (b"content-type", b"application/json")]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
