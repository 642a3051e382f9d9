"""MCP over streamable HTTP: the SDK's server, scoped per agent, with exit notifications."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextvars import ContextVar
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from procpilot import wire
from procpilot.aio import cancel_and_wait
from procpilot.config import Settings
from procpilot.contract import ToolResult, ToolSpec
from procpilot.engine.scopes import conversation_scope
from procpilot.engine.session import ExitInfo
from procpilot.engine.supervisor import Supervisor
from procpilot.errors import SessionNotFound, TooManyConnections
from procpilot.faces.exec_process import session_resource
from procpilot.faces.exit_notices import ExitNotices
from procpilot.transports import mcp_sdk
from procpilot.transports.http.auth import AuthMiddleware, TokenAuth, turns_for
from procpilot.transports.http.common import (
    LOOPBACK_HOSTS,
    PROGRESS_EVERY,
    current_agent,
    header,
    json_response,
    request_agent,
)
from procpilot.transports.http.mcp_fast import FastCalls

# -- MCP ---------------------------------------------------------------------------------------


class _ScopedBus:
    """A subscriptions/listen bus that hears each listener's agent: a session's resource-updated
    event reaches only the listen streams of the agent that owns the session. A new listener is
    first told what its agent missed (``missed(agent)``: exits while no server ran)."""

    def __init__(self, missed: Callable[[str], list[Any]], scope_of: Callable[[], str | None]) -> None:
        self._listeners: dict[object, tuple[str | None, Callable[[Any], None]]] = {}
        self._missed = missed
        self._scope_of = scope_of  # the listener's scope: its agent, or its conversation

    async def publish(self, event: Any) -> None:
        self.publish_to(None, event)

    def publish_to(self, agent: str | None, event: Any) -> None:
        for owner, listener in list(self._listeners.values()):
            if agent is not None and owner != agent:
                continue
            try:
                listener(event)
            except Exception:
                _log.exception("subscription listener failed")

    def listens(self, agent: str) -> bool:
        """Whether an event published to ``agent`` would reach anyone (it is built only then)."""
        return any(owner == agent for owner, _listener in self._listeners.values())

    def subscribe(self, listener: Callable[[Any], None]) -> Callable[[], None]:
        key = object()
        agent = self._scope_of()
        self._listeners[key] = (agent, listener)
        # The SDK buffers what a listener is given before its acknowledgement, and sends it after.
        for event in self._missed(agent) if agent is not None else []:
            try:
                listener(event)
            except Exception:
                _log.exception("subscription listener failed")

        def unsubscribe() -> None:
            self._listeners.pop(key, None)

        return unsubscribe


_log = logging.getLogger(__name__)
_mcp_request: ContextVar[Any] = ContextVar("procpilot_mcp_request", default=None)


class McpFace:
    """The MCP server of the daemon: the same tools as ``procpilot mcp``, plus exit notifications.

    - ``proc://{sessionId}`` is a resource (the session's status as JSON). When a session ends,
      a resource-updated event goes to the owner's ``subscriptions/listen`` streams (2026-07-28)
      and a ``notifications/resources/updated`` to legacy sessions that subscribed to it
      (``resources/subscribe``), or that started it with ``exec`` and saw it backgrounded: they
      hear it on their standalone GET stream without subscribing.
    - A tool call still running after a second sends progress notifications each second (to
      clients that asked for progress).
    - A call the client cancels stops waiting; it never kills a session.
    """

    def __init__(
        self,
        supervisor: Supervisor,
        settings: Settings,
        tools: Sequence[ToolSpec],
        spawn: Callable[[Awaitable[None]], None],
    ) -> None:
        from mcp.server.subscriptions import ListenHandler
        from mcp_types import SubscribeRequestParams, SubscriptionsListenRequestParams, UnsubscribeRequestParams

        from procpilot.transports.mcp import build_mcp_server

        self.sup = supervisor
        self.settings = settings
        self.spawn = spawn  # runs a notification as the daemon's own task (ended at shutdown)
        self.bus = _ScopedBus(self._missed, self._listener_scope)
        self._legacy: dict[str, list[tuple[str, Any]]] = {}
        self._legacy_prune_at = 256
        # Every exit the agent was not told of heads its next result, whatever the client
        # listens to (an SDK client in its default mode listens to nothing unasked).
        self.notices = ExitNotices(supervisor)
        wrapped = [self._wrap(self.notices.wrap(spec)) for spec in tools]
        # The same tools for calls answered without the SDK's dispatch (mcp_fast.py), and the
        # connections of the MCP sessions the SDK has served (their version, their initialisation).
        self.fast_tools = {spec.name: spec for spec in wrapped}
        self._connections: dict[str, Any] = {}
        self._connections_prune_at = 256
        self.fast: FastCalls | None = None
        self.server = build_mcp_server(wrapped, scope=self.request_scope)
        low = mcp_sdk.lowlevel_server(self.server)
        # The SDK's own bus fans out by URI only; ours also checks the listener's agent.
        mcp_sdk.use_subscription_bus(self.server, self.bus)
        low.add_request_handler("subscriptions/listen", SubscriptionsListenRequestParams, ListenHandler(self.bus))
        low.add_request_handler("resources/subscribe", SubscribeRequestParams, self._subscribe)
        low.add_request_handler("resources/unsubscribe", UnsubscribeRequestParams, self._unsubscribe)
        self.server.middleware.append(self._capture_request)
        self._add_resource()
        loopback = settings.server.loopback_only
        self.app = self.server.streamable_http_app(
            host="127.0.0.1" if loopback else "0.0.0.0",  # noqa: S104 - only the security default is chosen here
            transport_security=_transport_security(loopback),
            session_idle_timeout=settings.server.mcp_session_idle_sec,
        )

    # -- requests --

    def request_scope(self, ctx: Any = None) -> str:
        """The scope the current MCP request acts in: its agent's, or with ``[tools]
        isolate_conversations`` its MCP session's own (engine/scopes.py). A request without a
        session id (stateless) acts as the agent: there is no conversation to keep it to."""
        agent = request_agent()
        if not self.settings.tools.isolate_conversations:
            return agent
        request = getattr(ctx if ctx is not None else _mcp_request.get(), "request", None)
        headers = getattr(request, "headers", None)
        return self.scope_for(agent, headers.get("mcp-session-id") if headers is not None else None)

    def scope_for(self, agent: str, conversation: str | None) -> str:
        """The scope of ``agent``'s request in the MCP session ``conversation`` (if any)."""
        if not self.settings.tools.isolate_conversations:
            return agent
        return conversation_scope(agent, conversation) if isinstance(conversation, str) and conversation else agent

    def connection_of(self, session_id: str) -> Any:
        """The SDK's connection of an open MCP session, once it has served a request of it."""
        return self._connections.get(session_id)

    def _listener_scope(self) -> str | None:
        return self.request_scope() if current_agent.get() is not None else None

    async def _capture_request(self, ctx: Any, call_next: Callable[[Any], Awaitable[Any]]) -> Any:
        connection = mcp_sdk.request_connection(ctx)
        if connection.session_id is not None and connection.session_id not in self._connections:
            self._remember(connection)
        token = _mcp_request.set(ctx)
        try:
            return await call_next(ctx)
        finally:
            _mcp_request.reset(token)

    def _remember(self, connection: Any) -> None:
        if len(self._connections) >= self._connections_prune_at:  # pruned when doubled: no walk per call
            live = mcp_sdk.open_sessions(self.server.session_manager)
            for gone in [k for k in self._connections if k not in live]:
                del self._connections[gone]
            self._connections_prune_at = max(256, 2 * len(self._connections))
        self._connections[connection.session_id] = connection

    def _wrap(self, spec: ToolSpec) -> ToolSpec:
        inner = spec.handler

        async def handler(arguments: Mapping[str, Any], scope: str) -> Any:
            ctx = _mcp_request.get()
            if ctx is None:
                return await inner(arguments, scope)
            task = asyncio.ensure_future(inner(arguments, scope))
            started = time.monotonic()
            try:
                while True:
                    done, _ = await asyncio.wait({task}, timeout=PROGRESS_EVERY)
                    if done:
                        break
                    elapsed = time.monotonic() - started
                    with contextlib.suppress(Exception):
                        await ctx.session.report_progress(
                            round(elapsed, 1), None, f"{spec.name}: still running after {elapsed:.0f} s"
                        )
            finally:
                if not task.done():
                    # The client cancelled: stop waiting. The session itself runs on; only an
                    # explicit kill ends it.
                    await cancel_and_wait(task)
            result = task.result()
            self.follow(ctx.protocol_version, mcp_sdk.request_connection(ctx), scope, spec.name, result)
            return result

        return dataclasses.replace(spec, handler=handler)

    def follow(self, version: str | None, connection: Any, agent: str, tool: str, result: ToolResult) -> None:
        """A legacy client (``connection``, speaking ``version``) that just saw a session
        backgrounded hears of its end unasked."""
        from mcp_types.version import MODERN_PROTOCOL_VERSIONS

        data: Mapping[str, Any] = result.data if not result.is_error else {}
        if tool == "process.run":  # spec 000's vocabulary: process_id, and state instead of status
            session_id, running = data.get("process_id"), data.get("state") == "running"
        else:
            session_id, running = data.get("sessionId"), data.get("status") in ("running", "queued")
        if not isinstance(session_id, str) or not running:
            return
        if version in MODERN_PROTOCOL_VERSIONS:
            return
        self._add_legacy(session_id, agent, connection)

    def _add_legacy(self, session_id: str, agent: str, connection: Any) -> None:
        """``connection`` (the SDK's, one per MCP session) hears when ``session_id`` ends."""
        if len(self._legacy) >= self._legacy_prune_at:  # pruned when doubled: no walk per call
            alive = {s.id for s in self.sup.all_sessions()}
            for known in [k for k in self._legacy if k not in alive]:
                del self._legacy[known]
            self._legacy_prune_at = max(256, 2 * len(self._legacy))
        listeners = self._legacy.setdefault(session_id, [])
        if not any(c is connection for _a, c in listeners):
            listeners.append((agent, connection))

    async def _subscribe(self, ctx: Any, params: Any) -> Any:
        from mcp.shared.exceptions import MCPError
        from mcp_types import INVALID_PARAMS, EmptyResult

        agent = self.request_scope(ctx)
        uri = str(params.uri)
        session_id = uri.removeprefix("proc://")
        try:
            session = self.sup.get(agent, session_id) if uri.startswith("proc://") else None
        except SessionNotFound:
            session = None
        if session is None:
            raise MCPError(INVALID_PARAMS, f"Resource not found: {uri}", {"uri": uri})
        if session.finished:
            self.spawn(_notify_legacy(mcp_sdk.request_connection(ctx), uri))
        else:
            self._add_legacy(session_id, agent, mcp_sdk.request_connection(ctx))
        return EmptyResult()

    async def _unsubscribe(self, ctx: Any, params: Any) -> Any:
        from mcp_types import EmptyResult

        session_id = str(params.uri).removeprefix("proc://")
        listeners = self._legacy.get(session_id, [])
        connection = mcp_sdk.request_connection(ctx)
        self._legacy[session_id] = [(a, c) for a, c in listeners if c is not connection]
        return EmptyResult()

    # -- notifications --

    def _missed(self, agent: str) -> list[Any]:
        from mcp.shared.subscriptions import ResourceUpdated

        return [ResourceUpdated(uri=f"proc://{info.session_id}") for info in self.sup.outage_exits(agent)]

    def session_ended(self, info: ExitInfo) -> None:
        uri = f"proc://{info.session_id}"
        if self.bus.listens(info.scope):  # every exit comes here: its event is built for a listener only
            from mcp.shared.subscriptions import ResourceUpdated

            self.bus.publish_to(info.scope, ResourceUpdated(uri=uri))
        for agent, connection in self._legacy.pop(info.session_id, []):
            if agent == info.scope:
                self.spawn(_notify_legacy(connection, uri))

    async def close_sessions(self) -> None:
        """End open MCP sessions (their GET streams would keep the server from stopping)."""
        manager = self.server.session_manager
        for transport in list(mcp_sdk.open_sessions(manager).values()):
            with contextlib.suppress(Exception):
                await transport.terminate()

    def endpoint(self) -> ASGIApp:
        """The ``/mcp`` route: the SDK's app behind the per-agent cap on open sessions."""
        from mcp.server.streamable_http_manager import StreamableHTTPASGIApp

        manager = self.server.session_manager
        # Plain calls of our tools are answered in front of the SDK's app (mcp_fast.py).
        self.fast = FastCalls(StreamableHTTPASGIApp(manager), self, manager)
        return McpSessionCap(self.fast, manager, self.settings.server.mcp_sessions_per_agent)

    # -- the resource --

    def _add_resource(self) -> None:
        from mcp.server.mcpserver.exceptions import ResourceNotFoundError

        sup = self.sup

        @self.server.resource(
            "proc://{sessionId}",
            name="session",
            title="A procpilot session",
            description="A session's status, exit code and the tail of its output; updated when it ends.",
            mime_type="application/json",
        )
        async def read_session(sessionId: str) -> str:  # noqa: N803 - the URI template's variable
            try:
                session = sup.get(self.request_scope(), sessionId)
            except SessionNotFound:
                raise ResourceNotFoundError(f"no session {sessionId!r}") from None
            data = session_resource(sup, session)
            return wire.dumps(data)


async def _notify_legacy(connection: Any, uri: str) -> None:
    with contextlib.suppress(Exception):  # on the session's standalone (GET) stream, if it has one
        await connection.send_resource_updated(uri)


def _transport_security(loopback: bool) -> Any:
    from mcp.server.transport_security import TransportSecuritySettings

    if not loopback:
        # Bearer tokens are required off the loopback: a browser cannot attach them for a page.
        return TransportSecuritySettings(enable_dns_rebinding_protection=False)
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=[*LOOPBACK_HOSTS, *(f"{h}:*" for h in LOOPBACK_HOSTS)],
        allowed_origins=[f"{s}://{h}{p}" for s in ("http", "https") for h in LOOPBACK_HOSTS for p in ("", ":*")],
    )


def guarded_mcp_app(server: Any, settings: Settings, *, open_agent: str) -> ASGIApp:
    """``procpilot mcp --http``: the SDK's streamable HTTP app behind the daemon's own checks.

    Bearer tokens (when configured) decide the agent, and on a loopback binding ``Host`` and
    ``Origin`` must be loopback names: the same rules as ``procpilot serve``, because this app
    runs commands just the same.
    """
    loopback = settings.server.loopback_only
    inner = server.streamable_http_app(
        host="127.0.0.1" if loopback else "0.0.0.0",  # noqa: S104 - only the security default is chosen here
        transport_security=_transport_security(loopback),
    )
    auth = TokenAuth(settings.server.tokens, open_agent)
    return AuthMiddleware(
        inner,
        auth,
        loopback_only=loopback,
        body_timeout=settings.server.body_timeout_sec,
        turns=turns_for(settings.server),
    )


class McpSessionCap:
    """At most ``per_agent`` open MCP sessions per agent: past it, opening one more is a 429.

    The SDK caps sessions only in total, so one agent could fill the daemon for everyone. The
    sessions each agent opened are recorded from the ``mcp-session-id`` of the response that
    opened them, and forgotten once the SDK no longer holds them (closed, or idle past
    ``[server] mcp_session_idle_sec``). The SDK's table of open sessions is private: read
    through ``mcp_sdk``.
    """

    def __init__(self, app: ASGIApp, manager: Any, per_agent: int) -> None:
        self.app = app
        self.manager = manager
        self.per_agent = per_agent
        self.opened: dict[str, set[str]] = {}

    def open_sessions(self, agent: str) -> set[str]:
        live = mcp_sdk.open_sessions(self.manager)
        mine = self.opened.get(agent, set())
        mine.intersection_update(live)
        return mine

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or header(scope, b"mcp-session-id") is not None or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        agent = request_agent()
        mine = self.open_sessions(agent)
        if len(mine) >= self.per_agent:
            error = TooManyConnections(
                f"agent {agent!r} already has {len(mine)} MCP sessions open, its limit", limit=self.per_agent
            )
            await json_response(error.to_dict(), error.http_status)(scope, receive, send)
            return

        async def recorded(message: Message) -> None:
            if message["type"] == "http.response.start":
                session = dict(message.get("headers", [])).get(b"mcp-session-id")
                if session:
                    self.opened.setdefault(agent, set()).add(session.decode("latin-1"))
            await send(message)

        await self.app(scope, receive, recorded)
