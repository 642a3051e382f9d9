"""Who is calling: bearer tokens to agents, loopback-only Host and Origin, bounded bodies and calls."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
from collections.abc import Callable, Mapping
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from procpilot.config import ServerSettings
from procpilot.errors import TooManyRequests, Unauthorized
from procpilot.transports.http.bodies import error_body, is_mcp, read_body, refuse, refuse_oversized, rpc_error
from procpilot.transports.http.browser_auth import BrowserAuth, is_public_path
from procpilot.transports.http.common import LOOPBACK_HOSTS, MAX_BODY, current_agent, header
from procpilot.turns import Turns, current

# -- auth --------------------------------------------------------------------------------------


def turns_for(server: ServerSettings) -> Turns:
    """The places and turns of every agent's calls, as ``[server]`` sets them (procpilot/turns.py)."""
    return Turns(
        places_per_agent=server.requests_per_agent,
        working_per_agent=server.requests_working_per_agent,
        queued_per_agent=server.requests_queued_per_agent,
        short_run=server.requests_short_run_ms / 1000,
    )


class TokenAuth:
    """Bearer tokens -> agent ids, compared in constant time; the tokens themselves are not kept.

    Each presented token is hashed and compared with every configured token's hash with
    ``hmac.compare_digest`` (no early exit), so neither timing nor length tells anything.
    """

    def __init__(self, tokens: Mapping[str, str], open_agent: str | None = None) -> None:
        self._digests = [(hashlib.sha256(t.encode()).digest(), agent) for t, agent in tokens.items()]
        self.open_agent = None if self._digests else open_agent

    @property
    def required(self) -> bool:
        return bool(self._digests)

    def agent_for(self, authorization: str | None) -> str | None:
        if not self._digests:
            return self.open_agent
        if not authorization:
            return None
        scheme, _, presented = authorization.partition(" ")
        if scheme.lower() != "bearer":
            return None
        digest = hashlib.sha256(presented.strip().encode()).digest()
        found = None
        for known, agent in self._digests:
            if hmac.compare_digest(digest, known):
                found = agent
        return found


def _loopback_host(host: str | None) -> bool:
    """``host`` is a loopback name, with or without a port: ``localhost:8765`` is,
    ``localhost:evil.example`` and ``localhost.evil.example`` are not."""
    if not host:
        return False
    name, colon, port = host.rpartition(":") if not host.endswith("]") else ("", "", "")
    if not colon or not port.isdigit():
        name = host
    return name in LOOPBACK_HOSTS


def _loopback_origin(origin: str | None) -> bool:
    if origin is None:
        return True  # not a browser, or same origin
    for scheme in ("http://", "https://"):
        if origin.startswith(scheme):
            return _loopback_host(origin[len(scheme) :])
    return False


# Fixed texts: they satisfy the Error schema (which requires a message) and say nothing about why
# (no "token expired", "unknown agent", "bad host"), so a prober learns nothing from them.
_UNAUTHORIZED = b'{"error":"Unauthorized","message":"Unauthorized."}'
_FORBIDDEN = b'{"error":"Forbidden","message":"Forbidden."}'
# A body sent before any token is known: the console's login ({"token": ...}, a token at most
# 4 KiB) needs a few hundred bytes; anything bigger is nobody's login.
_MAX_ANONYMOUS_BODY = 64 * 1024


class AuthMiddleware:
    """Pure ASGI: resolves the bearer token to an agent, refuses everything else with a bare 401,
    refuses a body over ``max_body`` bytes (413) before anything reads it, and gives the rest
    ``body_timeout`` seconds to arrive (bodies.py)."""

    def __init__(
        self,
        app: ASGIApp,
        auth: TokenAuth,
        *,
        loopback_only: bool,
        max_body: int = MAX_BODY,
        requests_per_agent: int = 16,
        body_timeout: float = 10.0,
        browser: BrowserAuth | None = None,
        turns: Turns | None = None,
        calls: Callable[[Scope], ASGIApp | None] | None = None,
    ) -> None:
        self.app = app
        # The app of an agent's POST whose route its path alone names (a REST tool call, an MCP
        # message), or None: it is served from here, without the router and the exception layer,
        # which have nothing to do for it (app.py's call_routes says which).
        self.calls = calls
        self.auth = auth
        # The console's sessions (None: bearer headers only); see browser_auth.py.
        self.browser = browser
        self.loopback_only = loopback_only
        self.max_body = max_body
        # Each agent's calls (REST and MCP POSTs) hold one of its places and are worked on in its
        # turns (procpilot/turns.py), shared with its proc/* requests: a flood from one agent
        # queues behind itself, never before the others.
        self.turns = turns if turns is not None else Turns(places_per_agent=requests_per_agent)
        # The calls of requests with no agent yet (the console's login): a set of their own, so
        # they never take an agent's, and held only while the call runs, never while a body arrives.
        self.anonymous = asyncio.Semaphore(requests_per_agent)
        self.body_timeout = body_timeout
        self._principals: dict[str, Any] = {}  # agent -> the SDK's user for it (agents are few)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        if self.loopback_only and (
            not _loopback_host(header(scope, b"host")) or not _loopback_origin(header(scope, b"origin"))
        ):
            await self._refuse(scope, receive, send, 403, _FORBIDDEN)
            return
        authorization = header(scope, b"authorization")
        if authorization is None and self.browser is not None and self.auth.required:
            # The console's session: the page's secret header and its browser's binding cookie
            # together (browser_auth.py); a cookie alone is nobody.
            agent = self.browser.agent_of(scope)
            if agent is not None and not self.browser.same_origin(scope):
                await self._refuse(scope, receive, send, 403, _FORBIDDEN)
                return
        else:
            agent = self.auth.agent_for(authorization)
        public = self.browser is not None and is_public_path(scope.get("path", ""))
        if agent is None and not public:
            await self._refuse(scope, receive, send, 401, _UNAUTHORIZED)
            return
        if agent is not None:
            # The MCP SDK binds each MCP session to the principal that opened it: another agent's
            # token presenting that Mcp-Session-Id is answered as if the session did not exist.
            scope["user"] = self._principal(agent)
        token = current_agent.set(agent)
        try:
            if scope["type"] == "http":
                await self._serve_http(scope, receive, send, agent)
            else:  # WebSockets are long-lived: bounded per agent elsewhere
                await self.app(scope, receive, send)
        finally:
            current_agent.reset(token)

    def _principal(self, agent: str) -> Any:
        """The agent as the MCP SDK's authenticated user: made once per agent (two pydantic
        models, ~0.1 ms a request after idle when made for each)."""
        user = self._principals.get(agent)
        if user is None:
            from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
            from mcp.server.auth.provider import AccessToken

            user = self._principals[agent] = AuthenticatedUser(AccessToken(token="", client_id=agent, scopes=[]))
        return user

    async def _serve_http(self, scope: Scope, receive: Receive, send: Send, agent: str | None) -> None:
        """Serve a request with its whole body read first, within ``body_timeout``; each POST
        (a call) while holding one of its agent's slots, or of the anonymous set's."""
        limit = self.max_body if agent is not None else _MAX_ANONYMOUS_BODY
        if agent is not None and scope["method"] == "POST":
            if await refuse_oversized(scope, send, max_bytes=limit):
                return
            # The place first, then the body: until its place uvicorn stops reading it past 64 KiB,
            # so an agent holds at most requests_per_agent whole bodies in memory, and a slow one
            # holds only that agent's own place, and only for body_timeout. The turn after the
            # body: a body on its way is a wait for the client, not work.
            try:
                call = self.turns.admit_now(agent) or await self.turns.admit(agent)
            except TooManyRequests as exc:
                await refuse(scope, send, exc)
                return
            call.enter()
            try:
                body = await read_body(scope, receive, send, max_bytes=limit, timeout=self.body_timeout)
                if body is not None:
                    # MCP's SDK runs the tool in a context copied from this one: the same call.
                    if not call.work_now():
                        await call.work()
                    route = self.calls(scope) if self.calls is not None else None
                    await (route or self.app)(scope, body, _sending_waits(send))
            finally:
                call.end()
            return
        # Nobody yet (the console's login, its page) or no call: the body is read before any slot
        # is taken, so however many clients send theirs slowly, none of them holds a slot.
        body = await read_body(scope, receive, send, max_bytes=limit, timeout=self.body_timeout)
        if body is None:
            return
        if scope["method"] == "POST":
            async with self.anonymous:
                await self.app(scope, body, send)
        else:
            await self.app(scope, body, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send, status: int, body: bytes) -> None:
        if is_mcp(scope):
            # An MCP client shows a JSON-RPC error's message; the text still says nothing of why.
            if status == 401:
                body = error_body(scope, Unauthorized("Unauthorized."))
            else:
                body = rpc_error("Forbidden.", {"error": "Forbidden", "message": "Forbidden."})
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        if status == 401:
            headers.append((b"www-authenticate", b"Bearer"))
        if scope["type"] == "http":
            await send({"type": "http.response.start", "status": status, "headers": headers})
            await send({"type": "http.response.body", "body": body})
            return
        message = await receive()  # websocket.connect
        if message["type"] != "websocket.connect":
            return
        if "websocket.http.response" in scope.get("extensions", {}):
            await send({"type": "websocket.http.response.start", "status": status, "headers": headers})
            await send({"type": "websocket.http.response.body", "body": body})
        else:
            await send({"type": "websocket.close", "code": 1008})


def _sending_waits(send: Send) -> Send:
    """``send`` that gives the current call's turn back while the client takes the bytes (as
    ``waiting()`` does, without its awaits when a turn is free again at once): a client that
    reads its answer slowly holds its call's place, never its agent's turn."""

    async def sending(message: Message) -> None:
        call = current()
        if call is None or not call.pause():
            await send(message)
            return
        cancelled = False
        try:
            await send(message)
        except asyncio.CancelledError:
            cancelled = True  # the call is going: no turn to take again
            raise
        finally:
            if not cancelled and not call.work_now():
                await call.resume()

    return sending
