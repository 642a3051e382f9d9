"""The console: a web page on the daemon for the people who oversee agents.

    GET  /                                   redirects to /console/
    GET  /console/, /console/static/...      the page and its files (no data: served before login)
    GET  /favicon.ico                        its icon (what browsers ask for whatever the page links)
    POST /console/api/login {"token"}        a console session: its secret in the body, its binding cookie
    POST /console/api/logout                 ends the browser's sessions on the daemon, clears the cookie
    GET  /console/api/me                     who the page speaks for
    GET  /console/api/stream                 SSE: sessions (snapshots), audit events, approvals
    GET  /console/api/sessions/A/ID/log      one page of a session's output (bytes, base64)
    GET  /console/api/sessions/A/ID/output   SSE: a session's output from an offset, live
    POST /console/api/sessions/A/ID/signal   {"signal": "SIGINT"|"SIGTERM"|"SIGKILL"}: the whole tree
    POST /console/api/sessions/A/ID/write    {"data", "eof"?}: to its stdin (or pty), under its policy
    POST /console/api/sessions/A/ID/remove   kill if running, then forget it

What a session looks like and what can be done to it is the face's (``faces/console_view.py``);
this module carries it over HTTP. Approvals are decided through the daemon's own
``POST /v1/approvals/{id}``. Who sees what is ``operators.py``'s rule; how a browser proves who
it is, ``browser_auth.py``'s (every request of the page carries its session's secret as
``X-Procpilot-Session``, the event streams included: the page reads them with ``fetch``). What a
person does here is audited (tool ``console.<action>``, ``decided_by`` the person's agent).

Everything is bounded: a log page is at most 256 KiB, an output event 64 KiB (read from the log
when the reader is ready for it, never buffered for it), a snapshot 500 sessions, the audit ring
2,000 events, and an agent holds at most ``websockets_per_agent`` console streams.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import json
import os
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response, StreamingResponse
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from procpilot import wire
from procpilot.contract import AuditEvent
from procpilot.engine.scopes import agent_of
from procpilot.engine.session import Session
from procpilot.errors import (
    CsrfRejected,
    InvalidArgument,
    ProcpilotError,
    SessionNotFound,
    TooManyConnections,
)
from procpilot.faces import console_view
from procpilot.transports.http.browser_auth import BrowserAuth
from procpilot.transports.http.common import HEARTBEAT_EVERY, json_body, json_response, request_agent
from procpilot.transports.http.events import audit_event, sse
from procpilot.transports.http.operators import acting_scope, is_operator

if TYPE_CHECKING:
    from procpilot.transports.http.auth import TokenAuth
    from procpilot.transports.http.daemon import Daemon

__all__ = ["STATIC_DIR", "Console"]

STATIC_DIR = Path(__file__).with_name("console_static")

_AUDIT_RING = 2000  # audit events kept for the Audit page
_TICK = 1.0  # seconds between snapshots of the session list (exits wake it at once)
_MIN_GAP = 0.25  # seconds at least between two wake-ups of one stream
_AUDIT_TAIL = 512 * 1024  # bytes of the audit file read at start-up, to show what came before
_AUDIT_FIELDS = tuple(f.name for f in dataclasses.fields(AuditEvent))


def _int_param(request: Request, name: str, default: int, low: int, high: int) -> int:
    raw = request.query_params.get(name)
    if raw is None:
        return default
    if not raw.lstrip("-").isdigit() or len(raw) > 20:
        raise InvalidArgument(f"{name}: expected an integer from {low} to {high}", field=name)
    return min(max(int(raw), low), high)


class _Logged:
    """An audit event in the ring, made the page's JSON when a page first reads it: most never
    are, and converting each (a deep copy of its arguments, its names camel-cased) cost ~70 µs of
    every audited call after idle. The event's arguments are the trail's own copy
    (``contract.audit_arguments``), never changed after it is published."""

    __slots__ = ("_row", "event", "seq")

    def __init__(self, seq: int, event: AuditEvent) -> None:
        self.seq = seq
        self.event = event
        self._row: dict[str, Any] | None = None

    def row(self) -> dict[str, Any]:
        if self._row is None:
            self._row = {**audit_event(self.event), "agent": self.event.scope}
        return self._row


class Console:
    """The console's routes and the little state they share (the audit ring, the snapshot cache)."""

    def __init__(self, daemon: Daemon, auth: TokenAuth, browser: BrowserAuth) -> None:
        self.daemon = daemon
        self.auth = auth
        self.browser = browser
        self.audit: deque[_Logged] = deque(maxlen=_AUDIT_RING)
        self._seq = 0
        self._wakeups: set[asyncio.Event] = set()
        self._streams: dict[str, int] = {}
        self._snapshots: dict[str | None, tuple[float, list[dict[str, Any]]]] = {}

    # -- wiring --

    def routes(self) -> list[BaseRoute]:
        base = "/console/api/sessions/{agent}/{session_id}"
        return [
            Route("/", self.to_console, methods=["GET"]),
            Route("/console", self.to_console, methods=["GET"]),
            Route("/favicon.ico", self.favicon, methods=["GET"]),
            Route("/console/", self.page, methods=["GET"]),
            Mount("/console/static", StaticFiles(directory=STATIC_DIR), name="console-static"),
            Route("/console/api/login", self.login, methods=["POST"]),
            Route("/console/api/logout", self.logout, methods=["POST"]),
            Route("/console/api/me", self.me, methods=["GET"]),
            Route("/console/api/stream", self.stream, methods=["GET"]),
            Route(base + "/log", self.log_page, methods=["GET"]),
            Route(base + "/output", self.output, methods=["GET"]),
            Route(base + "/{action}", self.act, methods=["POST"]),
        ]

    @contextlib.asynccontextmanager
    async def attached(self) -> AsyncIterator[None]:
        """Listen to exits and audit events while the app runs."""
        self._load_audit_tail()
        removers: list[Callable[[], None]] = [self.daemon.sup.on_exit(lambda _info: self._wake())]
        if self.daemon.audit is not None:
            removers.append(self.daemon.audit.add_callback(self._on_audit))
        try:
            yield
        finally:
            for remove in removers:
                remove()
            self._wake()

    def _load_audit_tail(self) -> None:
        """The newest events of the audit file (``<state_dir>/audit.jsonl``: this daemon's and its
        predecessors'), so the Audit page does not start empty after a restart. Read once, bounded."""
        path = self.daemon.audit_file
        if path is None:
            return
        try:
            with open(path, "rb") as f:
                size = f.seek(0, os.SEEK_END)
                f.seek(max(0, size - _AUDIT_TAIL))
                lines = f.read(_AUDIT_TAIL).split(b"\n")
        except OSError:
            return
        if size > _AUDIT_TAIL:
            lines = lines[1:]  # the first is cut
        for line in lines[-_AUDIT_RING:]:
            try:
                data = json.loads(line)
                event = AuditEvent(**{f: data[f] for f in _AUDIT_FIELDS if f in data})
            except (ValueError, TypeError, KeyError):
                continue  # a torn or foreign line: the file is the record, this is only a view of it
            self._on_audit(event, wake=False)

    def _wake(self) -> None:
        self._snapshots.clear()
        for event in list(self._wakeups):
            event.set()

    def _on_audit(self, event: Any, *, wake: bool = True) -> None:
        if isinstance(event, AuditEvent):
            self._seq += 1
            self.audit.append(_Logged(self._seq, event))
            if wake:
                self._wake()

    # -- who is asking --

    def _check_change(self, request: Request) -> None:
        """With tokens, the middleware has already required a bearer header or a console session,
        neither of which another page can make a browser send. Without tokens every caller is the
        open agent, so a change must carry the open daemon's secret that only the console's own
        page could read (a bearer header, which no other page can make a browser send, will do)."""
        if self.auth.required or request.headers.get("authorization"):
            return
        if not self.browser.open_secret_ok(request.scope):
            raise CsrfRejected("this change lacks the console page's X-Procpilot-Session header")

    def _session(self, request: Request) -> Session:
        agent = request_agent()
        scope = acting_scope(self.daemon.settings.server, agent, request.path_params["agent"])
        session_id = request.path_params["session_id"]
        if len(session_id) > 64:
            raise SessionNotFound(f"no session {session_id[:64]!r}", session_id=session_id[:64])
        return console_view.find(self.daemon.sup, scope, session_id)

    # -- the page --

    async def to_console(self, request: Request) -> Response:
        return RedirectResponse("/console/", status_code=302)

    async def favicon(self, request: Request) -> Response:
        """Browsers ask for /favicon.ico whatever the page links: the console's icon, not a 404."""
        body = (STATIC_DIR / "favicon.svg").read_bytes()
        return Response(body, media_type="image/svg+xml", headers={"Cache-Control": "max-age=86400"})

    async def page(self, request: Request) -> Response:
        body = (STATIC_DIR / "index.html").read_bytes()  # 4 KiB from the page cache
        headers = {
            "Cache-Control": "no-store",
            # Scripts and styles only from here (the vendored libraries included): no CDN, no inline script.
            "Content-Security-Policy": "default-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:;"
            " frame-ancestors 'none'",
            "X-Frame-Options": "DENY",
        }
        return Response(body, media_type="text/html; charset=utf-8", headers=headers)

    # -- login --

    async def login(self, request: Request) -> Response:
        if not self.browser.same_origin(request.scope):  # nobody logs a browser in from another site
            return json_response({"error": "Forbidden", "message": "Forbidden."}, 403)
        try:
            body = await json_body(request, '{"token": "..."}')
        except ProcpilotError as exc:
            return json_response(exc.to_dict(), exc.http_status)
        token = body.get("token")
        if not isinstance(token, str) or not 0 < len(token) <= 4096:
            return json_response(InvalidArgument("token: a string", field="token").to_dict(), 422)
        agent = self.auth.agent_for(f"Bearer {token}")
        if agent is None or not self.auth.required:
            return json_response({"error": "Unauthorized", "message": "Unauthorized."}, 401)
        secret, binding = self.browser.login(request.scope, agent)
        # The secret only here, in the body: the page keeps it; the cookie alone is nobody.
        response = json_response({**self._me(agent), "session": secret})
        response.headers.append("set-cookie", self.browser.set_cookie(request.scope, binding))
        return response

    async def logout(self, request: Request) -> Response:
        """Public (a page whose session already ended still clears its cookie); it ends sessions
        only for a request that presents one, so no other page can log anyone out by calling it."""
        if not self.browser.same_origin(request.scope):  # nor clear its cookie from another site
            return json_response({"error": "Forbidden", "message": "Forbidden."}, 403)
        ended = self.browser.logout(request.scope)
        response = json_response({"ok": True, "ended": ended})
        response.headers.append("set-cookie", self.browser.clear_cookie(request.scope))
        return response

    async def me(self, request: Request) -> Response:
        me = self._me(request_agent())
        if not self.auth.required:
            me["session"] = self.browser.open_secret  # readable by the daemon's own origin only
        return json_response(me)

    def _me(self, agent: str) -> dict[str, Any]:
        server = self.daemon.settings.server
        return {
            "agent": agent,
            "operator": is_operator(server, agent),
            "approver": agent in server.approvers and self.daemon.gate is not None,
            "tokensRequired": self.auth.required,
        }

    # -- the live stream --

    def _rows(self, scope: str | None) -> list[dict[str, Any]]:
        """``console_view.rows``, computed at most once a second per scope for every open page."""
        cached = self._snapshots.get(scope)
        now = time.monotonic()
        if cached is not None and now - cached[0] < _TICK:
            return cached[1]
        rows = console_view.rows(self.daemon.sup, scope)
        self._snapshots[scope] = (now, rows)
        return rows

    def _approvals(self) -> dict[str, Any]:
        gate = self.daemon.gate
        pending = [r.public() for r in gate.pending()] if gate is not None else []
        decided = [r.public() for r in gate.decided()] if gate is not None else []
        return {"pending": pending, "decided": decided}

    def _check_streams(self, agent: str) -> None:
        if self._streams.get(agent, 0) >= self.daemon.settings.server.websockets_per_agent:
            raise TooManyConnections(f"agent {agent!r} holds as many console streams as it may")

    @contextlib.contextmanager
    def _counted(self, agent: str) -> Iterator[None]:
        """Counts a stream while its body runs (entered inside the generator: one whose client
        left before it started never runs, so it must never have been counted)."""
        self._streams[agent] = self._streams.get(agent, 0) + 1
        try:
            yield
        finally:
            self._streams[agent] -= 1
            if not self._streams[agent]:
                del self._streams[agent]

    async def stream(self, request: Request) -> Response:
        agent = request_agent()
        server = self.daemon.settings.server
        operator = is_operator(server, agent)
        approver = agent in server.approvers and self.daemon.gate is not None
        try:
            self._check_streams(agent)
        except ProcpilotError as exc:
            return json_response(exc.to_dict(), exc.http_status)

        async def events() -> AsyncIterator[bytes]:
            sent_rows = sent_approvals = ""
            seen = max(0, self._seq - 500)  # the newest 500 of the ring on connect
            quiet = 0.0
            wakeup = asyncio.Event()
            self._wakeups.add(wakeup)
            try:
                yield b"retry: 3000\n\n" + sse("ready", {"agent": agent, "operator": operator})
                while not self.daemon.closing.is_set():
                    wakeup.clear()
                    rows = wire.dumps(self._rows(None if operator else agent))
                    if rows != sent_rows:
                        sent_rows = rows
                        yield b"event: sessions\ndata: " + rows.encode() + b"\n\n"  # wire.dumps: encodes
                    fresh = [e.row() for e in self.audit if e.seq > seen and (operator or e.event.scope == agent)]
                    seen = self._seq
                    if fresh:
                        yield sse("audit", {"events": fresh[-500:]})
                    if approver:
                        approvals = wire.dumps(self._approvals())
                        if approvals != sent_approvals:
                            sent_approvals = approvals
                            yield b"event: approvals\ndata: " + approvals.encode() + b"\n\n"
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(wakeup.wait(), _TICK)
                    if wakeup.is_set():
                        # A flood of events (an agent starting a session a millisecond) wakes
                        # this at most this often: the list is rebuilt per wake-up, not per event.
                        await asyncio.sleep(_MIN_GAP)
                    quiet = 0.0 if wakeup.is_set() else quiet + _TICK
                    if quiet >= HEARTBEAT_EVERY:
                        quiet = 0.0
                        yield b": keep-alive\n\n"
            finally:
                self._wakeups.discard(wakeup)

        return self._sse_response(agent, events())

    def _sse_response(self, agent: str, body: AsyncIterator[bytes]) -> Response:
        async def counted() -> AsyncIterator[bytes]:
            with self._counted(agent):
                async for chunk in body:
                    yield chunk

        headers = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}
        return StreamingResponse(counted(), media_type="text/event-stream", headers=headers)

    # -- one session's output --

    async def log_page(self, request: Request) -> Response:
        """``limit`` bytes from ``offset`` (past the end: the last ``limit``), never the whole log."""
        try:
            session = self._session(request)
            limit = _int_param(request, "limit", console_view.CHUNK, 1, console_view.PAGE_MAX)
            offset = _int_param(request, "offset", -1, -1, 1 << 62)
            page = await console_view.log_page(session, request.query_params.get("stream", "combined"), offset, limit)
        except ProcpilotError as exc:
            return json_response(exc.to_dict(), exc.http_status)
        return json_response({**page, "data": base64.b64encode(page["data"]).decode()})

    async def output(self, request: Request) -> Response:
        """SSE of the output from ``from`` (-1: the last 64 KiB) on, until the session ends."""
        try:
            agent = request_agent()
            session = self._session(request)
            stream = request.query_params.get("stream", "combined")
            console_view.view(session, stream)  # a bad name is a 422 now, not a broken stream
            start = _int_param(request, "from", -1, -1, 1 << 62)
            self._check_streams(agent)
        except ProcpilotError as exc:
            return json_response(exc.to_dict(), exc.http_status)

        async def events() -> AsyncIterator[bytes]:
            quiet = 0.0
            async for chunk in console_view.output_chunks(session, stream, start, self.daemon.closing, _TICK):
                if chunk is None:
                    quiet += _TICK
                    if quiet >= HEARTBEAT_EVERY:
                        quiet = 0.0
                        yield b": keep-alive\n\n"
                elif chunk.get("ended"):
                    yield sse("end", {"state": chunk["state"], "exitCode": chunk["exitCode"]})
                else:
                    quiet = 0.0
                    yield sse("data", {**chunk, "data": base64.b64encode(chunk["data"]).decode()})

        return self._sse_response(agent, events())

    # -- acting on a session --

    async def act(self, request: Request) -> Response:
        try:
            self._check_change(request)
            session = self._session(request)
            action = request.path_params["action"]
            body = await json_body(request)
            outcome = await console_view.act(self.daemon.sup, session, action, body)
        except ProcpilotError as exc:
            return json_response(exc.to_dict(), exc.http_status)
        self._audit(session, action, outcome)
        self._wake()
        return json_response({"ok": True, "state": session.state.value, "detail": outcome})

    def _audit(self, session: Session, action: str, outcome: str) -> None:
        if self.daemon.audit is None or action == "write":  # keystrokes are not an audit trail's business
            return
        self.daemon.audit.publish(
            AuditEvent(
                agent_of(session.scope),
                f"console.{action}",
                "operator",
                "ok",
                f"{outcome} {session.command[:200]}",
                decided_by=request_agent(),
                process_id=session.id,
            )
        )
