"""Who is calling: bearer tokens to agents, loopback-only Host and Origin, bounded bodies and calls."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
from collections.abc import Mapping

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from procpilot.errors import (
    RequestTooLarge,
)
from procpilot.transports.http.browser_auth import BrowserAuth, is_public_path
from procpilot.transports.http.common import _LOOPBACK_HOSTS, _MAX_BODY, _header, current_agent

# -- auth --------------------------------------------------------------------------------------


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
    return name in _LOOPBACK_HOSTS


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


class AuthMiddleware:
    """Pure ASGI: resolves the bearer token to an agent, refuses everything else with a bare 401,
    and refuses a body over ``max_body`` bytes (413) before anything reads it."""

    def __init__(
        self,
        app: ASGIApp,
        auth: TokenAuth,
        *,
        loopback_only: bool,
        max_body: int = _MAX_BODY,
        requests_per_agent: int = 16,
        browser: BrowserAuth | None = None,
    ) -> None:
        self.app = app
        self.auth = auth
        # The console's sessions (None: bearer headers only); see browser_auth.py.
        self.browser = browser
        self.loopback_only = loopback_only
        self.max_body = max_body
        # Calls one agent may have running at once (REST and MCP POSTs); past it its own calls
        # wait their turn, so a flood from one agent queues behind itself, not before the others.
        self.requests_per_agent = requests_per_agent
        self.in_flight: dict[str, asyncio.Semaphore] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        if self.loopback_only and (
            not _loopback_host(_header(scope, b"host")) or not _loopback_origin(_header(scope, b"origin"))
        ):
            await self._refuse(scope, receive, send, 403, _FORBIDDEN)
            return
        authorization = _header(scope, b"authorization")
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
            from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
            from mcp.server.auth.provider import AccessToken

            # The MCP SDK binds each MCP session to the principal that opened it: another agent's
            # token presenting that Mcp-Session-Id is answered as if the session did not exist.
            scope["user"] = AuthenticatedUser(AccessToken(token="", client_id=agent, scopes=[]))
        if scope["type"] == "http":
            bounded = await self._bounded_body(scope, receive, send)
            if bounded is None:
                return
            receive = bounded
        token = current_agent.set(agent)
        try:
            if scope["type"] == "http" and scope["method"] == "POST":
                # The console's login page (no agent yet) shares one slot set.
                slots = self.in_flight.setdefault(agent or "", asyncio.Semaphore(self.requests_per_agent))
                async with slots:
                    await self.app(scope, receive, send)
            else:  # event streams and WebSockets are long-lived: bounded per agent elsewhere
                await self.app(scope, receive, send)
        finally:
            current_agent.reset(token)

    async def _bounded_body(self, scope: Scope, receive: Receive, send: Send) -> Receive | None:
        """``receive`` for a body within the cap (a declared length is trusted: the server never
        delivers more), or None once a 413 has been sent. A chunked body is read here, at most
        the cap, and handed on from memory."""
        declared = _header(scope, b"content-length")
        if declared is not None:
            if declared.isdigit() and int(declared) <= self.max_body:
                return receive
            await self._too_large(send)
            return None
        if _header(scope, b"transfer-encoding") is None:
            return receive  # no body at all
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return receive  # the client left; the app sees it as it would have
            size += len(message.get("body", b""))
            if size > self.max_body:
                await self._too_large(send)
                return None
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        replay = [{"type": "http.request", "body": b"".join(chunks), "more_body": False}]

        async def replayed() -> Message:
            return replay.pop() if replay else await receive()

        return replayed

    async def _too_large(self, send: Send) -> None:
        error = RequestTooLarge(f"the request body is larger than {self.max_body} bytes", limit=self.max_body).to_dict()
        body = json.dumps(error).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": 413, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    async def _refuse(self, scope: Scope, receive: Receive, send: Send, status: int, body: bytes) -> None:
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
