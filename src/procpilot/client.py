"""Talking to a running ``procpilot serve``: ``Client`` (sync), ``AsyncClient``, and ``ProcsClient``.

    from procpilot import Client

    with Client("http://127.0.0.1:8765", token="...") as pp:
        r = pp.exec("pytest -q", yieldMs=2000)
        if r["status"] == "running":
            pp.process("wait", sessionId=r["sessionId"], timeout=60_000)

Every tool has a method (``exec``, ``process``; any other tool by ``call(name, **arguments)`` or
as an attribute, ``process.spawn`` as ``pp.process_spawn``). A tool's typed error comes back as
the same exception class the daemon raised (``SessionNotFound``, ``InvalidArgument``…, with its
``message``, ``hints`` and details); an error class this process does not know is still a
``ProcpilotError`` whose ``code`` is the daemon's name for it. A failed command is a result
(``status: "error"``), never an exception.

The URL is ``http://host:port`` or ``unix:///path/to/socket``; without one the client uses
``PROCPILOT_URL``, then the ``daemon.json`` a daemon writes in its state directory, then
``http://127.0.0.1:8765``. The token defaults to ``PROCPILOT_TOKEN``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2

from procpilot import chat_context
from procpilot.aio import cancel_and_wait
from procpilot.errors import (
    DaemonConnectionLost,
    DaemonNotRunning,
    InvalidArgument,
    ProcpilotError,
    Unauthorized,
    UnknownTool,
    error_class,
    error_for_proc_code,
)

__all__ = [
    "AsyncClient",
    "Client",
    "DaemonConnectionLost",
    "DaemonNotRunning",
    "Proc",
    "ProcExit",
    "ProcsClient",
    "ToolReply",
    "Unauthorized",
    "UnknownTool",
    "WebSocketTransport",
    "error_class",
    "error_from",
    "resolve_url",
]

DEFAULT_URL = "http://127.0.0.1:8765"
# Headers and body leave in two writes: without TCP_NODELAY, Nagle holds the body until the
# daemon's delayed ACK (40 ms) on every request of a kept-alive connection.
_NODELAY = [(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)]
# Long calls (process wait blocks up to 10 minutes) need a long read timeout; connecting does not.
_TIMEOUT = httpx2.Timeout(connect=5.0, read=660.0, write=30.0, pool=30.0)


# -- errors ------------------------------------------------------------------------------------


_unknown: dict[str, type[ProcpilotError]] = {}


def error_from(body: Mapping[str, Any]) -> ProcpilotError:
    """The exception a JSON error result describes, as its own class where this process knows it."""
    code = str(body.get("error") or "ProcpilotError")
    message = str(body.get("message") or code)
    hints = body.get("hints") if isinstance(body.get("hints"), dict) else {}
    details = {k: v for k, v in body.items() if k not in ("error", "message", "hints", "text")}
    cls = error_class(code)
    if cls is not None:
        try:
            exc = cls(message, hints=dict(hints or {}), **details)
        except TypeError:  # a class with its own constructor: fall back to a look-alike
            cls = None
        else:
            # Hints as the daemon sent them (its defaults, not ours, if the versions differ).
            exc.hints = dict(hints or {})
            return exc
    if code not in _unknown:
        _unknown[code] = type(code, (ProcpilotError,), {"__module__": __name__})
    exc = _unknown[code](message, **details)
    exc.hints = dict(hints or {})
    return exc


# -- results -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ToolReply:
    """A tool's result: ``text`` for a model, ``data`` structured; ``reply["status"]`` reads data."""

    text: str
    data: dict[str, Any] = field(default_factory=dict)

    def __getitem__(self, key: str) -> Any:
        return self.data[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self.data.get(key, default)

    def __contains__(self, key: object) -> bool:
        return key in self.data


def _reply(response: httpx2.Response) -> ToolReply:
    body = _body(response)
    return ToolReply(str(body.get("text", "")), dict(body.get("data") or {}))


def _body(response: httpx2.Response) -> dict[str, Any]:
    if response.status_code == 401:
        raise Unauthorized("the daemon refused the token (missing or wrong)")
    try:
        body = response.json()
    except ValueError:
        body = None
    if not isinstance(body, dict):
        raise ProcpilotError(f"unexpected answer from the daemon: HTTP {response.status_code}")
    if response.status_code >= 400 or "error" in body:
        raise error_from(body)
    return body


# -- addresses ---------------------------------------------------------------------------------


def _state_dir() -> Path:
    if os.environ.get("PROCPILOT_STATE_DIR"):
        return Path(os.environ["PROCPILOT_STATE_DIR"])
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "procpilot"


def resolve_url(url: str | None = None) -> str:
    """``url``, else PROCPILOT_URL, else the local daemon's daemon.json, else the default."""
    if url:
        return url.rstrip("/")
    if os.environ.get("PROCPILOT_URL"):
        return os.environ["PROCPILOT_URL"].rstrip("/")
    with contextlib.suppress(OSError, ValueError, AttributeError):
        found = json.loads((_state_dir() / "daemon.json").read_text()).get("url")
        if isinstance(found, str) and found:
            return found.rstrip("/")
    return DEFAULT_URL


def _split(url: str) -> tuple[str, str | None]:
    """(base URL for HTTP, Unix socket path or None)."""
    if url.startswith("unix://"):
        return "http://localhost", url[len("unix://") :]
    return url, None


CHAT_ENV = "PROCPILOT_CHAT"


def _headers(token: str | None, chat: Mapping[str, str] | None = None) -> dict[str, str]:
    token = token if token is not None else os.environ.get("PROCPILOT_TOKEN")
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    # The chat every call of this client comes from (procpilot/chat_context.py): given, or in
    # PROCPILOT_CHAT as the header says it ("provider=telegram session=agent:main:main").
    if chat is not None:
        headers[chat_context.HEADER] = chat_context.header_value(chat)
    elif told := os.environ.get(CHAT_ENV):
        context = chat_context.from_header([told])
        if context is not None:
            headers[chat_context.HEADER] = context.text()
    return headers


def _not_running(url: str, exc: Exception) -> DaemonNotRunning:
    return DaemonNotRunning(f"no procpilot daemon answers at {url} ({type(exc).__name__}: {exc})", url=url)


def _transport_error(url: str, exc: httpx2.TransportError) -> ProcpilotError:
    """Not connecting at all is a daemon that is not running; anything later is a lost connection
    (the daemon died, was restarted, or the network dropped), which the caller should hear as such."""
    if isinstance(exc, (httpx2.ConnectError, httpx2.ConnectTimeout)):
        return _not_running(url, exc)
    reason = str(exc) or type(exc).__name__
    return DaemonConnectionLost(f"lost the connection to the daemon at {url} ({type(exc).__name__}: {reason})", url=url)


def _tool_name(attribute: str) -> str:
    """``process_spawn`` -> ``process.spawn`` (tool names with dots are attributes with underscores)."""
    head, _, rest = attribute.partition("_")
    return f"{head}.{rest.replace('_', '-')}" if rest else head


# -- the sync client ---------------------------------------------------------------------------


def _not_utf8(exc: UnicodeEncodeError) -> InvalidArgument:
    """An argument holds what UTF-8 cannot (bytes a command line could not decode arrive as lone
    surrogates): refused here, as the daemon would, rather than sent changed."""
    return InvalidArgument(
        f"an argument holds text that is not valid UTF-8 ({exc.object[exc.start : exc.end]!r})",
        hints={"fix_text": "Pass commands, ids and paths as UTF-8 text."},
    )


class Client:
    """The daemon's tools over REST, blocking. Use as a context manager, or call ``close()``.

    ``chat``: the chat every call comes from, for a gateway that runs agents for chats
    (``{"provider": "telegram", "session": "agent:main:main"}``): recorded on each call's audit
    event, named by the openclaw profile's elevated refusal; checked here as the daemon checks it."""

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        *,
        timeout: Any = _TIMEOUT,
        chat: Mapping[str, str] | None = None,
    ) -> None:
        headers = _headers(token, chat)
        self.url = resolve_url(url)
        base, uds = _split(self.url)
        transport = httpx2.HTTPTransport(uds=uds) if uds else httpx2.HTTPTransport(socket_options=_NODELAY)
        self._http = httpx2.Client(base_url=base, headers=headers, timeout=timeout, transport=transport)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx2.Response:
        try:
            return self._http.request(method, path, **kwargs)
        except httpx2.TransportError as exc:
            raise _transport_error(self.url, exc) from None
        except UnicodeEncodeError as exc:
            raise _not_utf8(exc) from None

    def call(self, tool: str, /, **arguments: Any) -> ToolReply:
        """Run any tool by name; ``None`` arguments are left out (the tool's default applies)."""
        args = {k: v for k, v in arguments.items() if v is not None}
        return _reply(self._request("POST", f"/v1/tools/{tool}", json=args))

    def exec(self, command: str, **arguments: Any) -> ToolReply:
        """``exec``: run ``command``; see the tool's schema (``yieldMs``, ``background``, ``env``…)."""
        return self.call("exec", command=command, **arguments)

    def process(self, action: str, sessionId: str | None = None, **arguments: Any) -> ToolReply:  # noqa: N803
        """``process``: list, poll, log, write, send-keys, submit, paste, kill, clear, remove, wait."""
        return self.call("process", action=action, sessionId=sessionId, **arguments)

    def tools(self) -> list[dict[str, Any]]:
        tools: list[dict[str, Any]] = _body(self._request("GET", "/v1/tools"))["tools"]
        return tools

    def openapi(self) -> dict[str, Any]:
        return _body(self._request("GET", "/openapi.json"))

    def capabilities(self) -> dict[str, Any]:
        """Which mechanisms the daemon's host offers (tree kill, limits, isolation, pidfd)."""
        return _body(self._request("GET", "/v1/capabilities"))

    def sessions(self, agent: str | None = None) -> list[dict[str, Any]]:
        """Your sessions as ``process`` lists them, each with its ``agent``; another agent's (or every
        agent's: ``"*"``) only for agents in ``[server] approvers``."""
        params = {"agent": agent} if agent else None
        rows: list[dict[str, Any]] = _body(self._request("GET", "/v1/sessions", params=params))["sessions"]
        return rows

    def approvals(self) -> list[dict[str, Any]]:
        """Calls held for approval, of every agent (only for agents in ``[server] approvers``)."""
        pending: list[dict[str, Any]] = _body(self._request("GET", "/v1/approvals"))["approvals"]
        return pending

    def decide(self, request_id: str, approve: bool, reason: str | None = None) -> dict[str, Any]:
        """Approve or deny a held call (never one of your own)."""
        body: dict[str, Any] = {"decision": "approve" if approve else "deny"}
        if reason is not None:
            body["reason"] = reason
        decided: dict[str, Any] = _body(self._request("POST", f"/v1/approvals/{request_id}", json=body))["approval"]
        return decided

    def events(self) -> Iterator[dict[str, Any]]:
        """Exit and audit events of this agent, as they happen (``{"type": "exit", ...}``)."""
        try:
            with self._http.sse("/v1/events", timeout=httpx2.Timeout(5.0, read=None)) as source:
                if source.response.status_code != 200:
                    source.response.read()
                    _body(source.response)
                for event in source:
                    if event.event in ("exit", "audit", "dropped", "ready"):
                        data = json.loads(event.data)
                        yield {"type": event.event, **data} if event.event in ("dropped", "ready") else data
        except httpx2.TransportError as exc:
            raise _transport_error(self.url, exc) from None

    def __getattr__(self, name: str) -> Callable[..., ToolReply]:
        if name.startswith("_"):
            raise AttributeError(name)
        tool = _tool_name(name)
        return lambda **arguments: self.call(tool, **arguments)


# -- the async client --------------------------------------------------------------------------


class AsyncClient:
    """The same as :class:`Client`, for asyncio code."""

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        *,
        timeout: Any = _TIMEOUT,
        chat: Mapping[str, str] | None = None,
    ) -> None:
        headers = _headers(token, chat)
        self.url = resolve_url(url)
        self._token = token
        base, uds = _split(self.url)
        transport = httpx2.AsyncHTTPTransport(uds=uds) if uds else httpx2.AsyncHTTPTransport(socket_options=_NODELAY)
        self._http = httpx2.AsyncClient(base_url=base, headers=headers, timeout=timeout, transport=transport)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _request(self, method: str, path: str, **kwargs: Any) -> httpx2.Response:
        try:
            return await self._http.request(method, path, **kwargs)
        except httpx2.TransportError as exc:
            raise _transport_error(self.url, exc) from None
        except UnicodeEncodeError as exc:
            raise _not_utf8(exc) from None

    async def call(self, tool: str, /, **arguments: Any) -> ToolReply:
        args = {k: v for k, v in arguments.items() if v is not None}
        return _reply(await self._request("POST", f"/v1/tools/{tool}", json=args))

    async def exec(self, command: str, **arguments: Any) -> ToolReply:
        return await self.call("exec", command=command, **arguments)

    async def process(self, action: str, sessionId: str | None = None, **arguments: Any) -> ToolReply:  # noqa: N803
        return await self.call("process", action=action, sessionId=sessionId, **arguments)

    async def tools(self) -> list[dict[str, Any]]:
        tools: list[dict[str, Any]] = _body(await self._request("GET", "/v1/tools"))["tools"]
        return tools

    async def openapi(self) -> dict[str, Any]:
        return _body(await self._request("GET", "/openapi.json"))

    async def capabilities(self) -> dict[str, Any]:
        return _body(await self._request("GET", "/v1/capabilities"))

    async def sessions(self, agent: str | None = None) -> list[dict[str, Any]]:
        params = {"agent": agent} if agent else None
        rows: list[dict[str, Any]] = _body(await self._request("GET", "/v1/sessions", params=params))["sessions"]
        return rows

    async def approvals(self) -> list[dict[str, Any]]:
        pending: list[dict[str, Any]] = _body(await self._request("GET", "/v1/approvals"))["approvals"]
        return pending

    async def decide(self, request_id: str, approve: bool, reason: str | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {"decision": "approve" if approve else "deny"}
        if reason is not None:
            body["reason"] = reason
        response = await self._request("POST", f"/v1/approvals/{request_id}", json=body)
        decided: dict[str, Any] = _body(response)["approval"]
        return decided

    async def events(self) -> AsyncIterator[dict[str, Any]]:
        try:
            async with self._http.sse("/v1/events", timeout=httpx2.Timeout(5.0, read=None)) as source:
                if source.response.status_code != 200:
                    await source.response.aread()
                    _body(source.response)
                async for event in source:
                    if event.event in ("exit", "audit", "dropped", "ready"):
                        data = json.loads(event.data)
                        yield {"type": event.event, **data} if event.event in ("dropped", "ready") else data
        except httpx2.TransportError as exc:
            raise _transport_error(self.url, exc) from None

    def procs(self) -> ProcsClient:
        """The streaming client over the WebSocket: ``async with client.procs() as procs: ...``."""
        return ProcsClient(self.url, self._token)

    def __getattr__(self, name: str) -> Callable[..., Awaitable[ToolReply]]:
        if name.startswith("_"):
            raise AttributeError(name)
        tool = _tool_name(name)
        return lambda **arguments: self.call(tool, **arguments)


# -- the streaming client: proc/* over the WebSocket ------------------------------------------

_LOG_PAGE = 1024 * 1024
OutputCallback = Callable[[str, str], Any]  # (stream "stdout" | "stderr", text); may be async


async def _ws_connect(url: str, token: str | None) -> Any:
    from websockets.asyncio.client import connect, unix_connect
    from websockets.exceptions import InvalidStatus

    base, uds = _split(url)
    ws_url = ("wss://" if base.startswith("https://") else "ws://") + base.split("://", 1)[1] + "/v1/proc"
    kwargs: dict[str, Any] = {"additional_headers": _headers(token), "max_size": 16 * _LOG_PAGE}
    try:
        return await (unix_connect(uds, ws_url, **kwargs) if uds else connect(ws_url, **kwargs))
    except InvalidStatus as exc:
        if exc.response.status_code == 401:
            raise Unauthorized("the daemon refused the token (missing or wrong)") from None
        raise ProcpilotError(f"the daemon refused the WebSocket: HTTP {exc.response.status_code}") from None
    except OSError as exc:
        raise _not_running(url, exc) from None


class WebSocketTransport:
    """``WS /v1/proc`` as a ``ProcTransport``, so spec 003's own client runs against the daemon::

        from procpilot.faces.procs_client import ProcsAPI

        async with WebSocketTransport(url, token) as transport:
            procs = ProcsAPI(transport)
            await procs.spawn(["make"], on_output=lambda event: print(event.data, end=""))

    Pushed events reach the callbacks as the daemon sends them; events it dropped for a slow reader
    are announced (``proc/lagged/event``), not replayed: :class:`ProcsClient` pages them back in.
    """

    def __init__(self, url: str | None = None, token: str | None = None) -> None:
        self.url = resolve_url(url)
        self._token = token
        self._ws: Any = None
        self._pending: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self._callbacks: list[Callable[[dict[str, Any]], None]] = []
        self._task: asyncio.Task[None] | None = None
        self._ids = 0
        self.closed_error: Exception | None = None  # why the connection ended, once it has

    async def __aenter__(self) -> WebSocketTransport:
        await self.connect()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def connect(self) -> None:
        self._ws = await _ws_connect(self.url, self._token)
        self._task = asyncio.ensure_future(self._reader())

    async def aclose(self) -> None:
        try:
            if self._task is not None:
                await cancel_and_wait(self._task)
        finally:  # a caller cancelled while it waits still leaves no socket open
            if self._ws is not None:
                await self._ws.close()

    async def send(self, request: dict[str, Any]) -> dict[str, Any]:
        """Send one request (an ``id`` is added if it has none) and return the response to it."""
        if self.closed_error is not None:
            raise self.closed_error
        if request.get("id") is None:
            self._ids += 1
            request = {**request, "id": f"t{self._ids}"}
        rid = str(request["id"])
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[rid] = future
        try:
            await self._ws.send(json.dumps(request))
            return await future
        finally:
            self._pending.pop(rid, None)

    def on_event(self, callback: Callable[[dict[str, Any]], None]) -> Callable[[], None]:
        self._callbacks.append(callback)

        def remove() -> None:
            if callback in self._callbacks:
                self._callbacks.remove(callback)

        return remove

    async def _reader(self) -> None:
        """The connection's one reader: responses to their requests, pushed events to the callbacks."""
        error: Exception = ProcpilotError("the WebSocket to the daemon was closed")
        try:
            async for frame in self._ws:
                message = json.loads(frame)
                rid = message.get("id")
                if rid is not None and str(rid) in self._pending:
                    future = self._pending[str(rid)]
                    if not future.done():
                        future.set_result(message)
                    continue
                for callback in list(self._callbacks):
                    try:
                        callback(message)
                    except Exception:  # one callback's bug must not stop the stream
                        logging.getLogger(__name__).exception("proc event callback failed")
        except Exception as exc:
            error = exc
        finally:
            self.closed_error = error
            for future in self._pending.values():
                if not future.done():
                    future.set_exception(error)


@dataclass(frozen=True, slots=True)
class ProcExit:
    """How a process ended: spec 003's state (STOPPED, CRASHED, TIMEDOUT), exit code or signal."""

    state: str
    exit_code: int | None
    exit_signal: str | None
    duration_ms: int | None


class Proc:
    """One process started by :meth:`ProcsClient.spawn`; its output goes to ``on_output`` in order.

    Output is complete and in order per stream: events the daemon had to drop for a slow reader
    (``proc/lagged/event``), or did not push past its per-process cap, are paged from the log and
    delivered in their place. Without ``on_output`` it is collected in ``stdout`` / ``stderr``.
    """

    def __init__(self, client: ProcsClient, proc_id: str, pid: int | None, on_output: OutputCallback | None) -> None:
        self.id = proc_id
        self.pid = pid
        self._client = client
        self._on_output = on_output
        self._chunks: dict[str, list[str]] = {"stdout": [], "stderr": []}
        self.delivered = {"stdout": 0, "stderr": 0}  # bytes of each stream handed over so far
        self.truncated: set[str] = set()  # streams the daemon stopped pushing (its output cap)
        self.lagged = 0  # events the daemon (or this client) could not queue and paged instead
        self._exit: asyncio.Future[ProcExit] = asyncio.get_running_loop().create_future()

    @property
    def stdout(self) -> str:
        return "".join(self._chunks["stdout"])

    @property
    def stderr(self) -> str:
        return "".join(self._chunks["stderr"])

    @property
    def exited(self) -> ProcExit | None:
        return self._exit.result() if self._exit.done() else None

    async def write(self, data: str, *, eof: bool = False) -> int:
        reply = await self._client.request({"type": "proc/write/req", "proc_id": self.id, "data": data, "eof": eof})
        return int(reply.get("bytes_written") or 0)

    async def kill(self, signal: str = "SIGTERM") -> dict[str, Any]:
        return await self._client.request({"type": "proc/kill/req", "proc_id": self.id, "signal": signal})

    async def status(self) -> dict[str, Any]:
        return await self._client.request({"type": "proc/status/req", "proc_id": self.id})

    async def wait(self, timeout: float | None = None) -> ProcExit:
        """Until the process has ended and all its output was delivered."""
        return await asyncio.wait_for(asyncio.shield(self._exit), timeout)

    async def _deliver(self, stream: str, text: str, offset: int) -> None:
        data = text.encode()
        have = self.delivered[stream]
        if offset > have:  # a gap (dropped for a slow reader): page it from the log first
            await self._client.fill(self, stream, offset)
            have = self.delivered[stream]
        if offset + len(data) <= have:
            return
        if offset < have:
            data = data[have - offset :]
            text = data.decode("utf-8", errors="replace")
        self.delivered[stream] = offset + len(data) if offset >= have else have + len(data)
        if not text:
            return
        if self._on_output is None:
            self._chunks[stream].append(text)
            return
        result = self._on_output(stream, text)
        if asyncio.iscoroutine(result):
            await result


class ProcsClient:
    """The proc/* protocol (spec 003) over ``WS /v1/proc``: spawn, stream, write, kill, status.

        async with ProcsClient("http://127.0.0.1:8765", token) as procs:
            p = await procs.spawn(["pytest", "-q"], on_output=lambda stream, text: print(text, end=""))
            print((await p.wait()).exit_code)

    Memory stays bounded on both ends: the daemon drops what a slow reader cannot take (and says
    so), this client queues at most ``max_queued`` events, and every gap is paged from the log.
    """

    def __init__(self, url: str | None = None, token: str | None = None, *, max_queued: int = 1024) -> None:
        self._transport = WebSocketTransport(url, token)
        self.url = self._transport.url
        self._procs: dict[str, Proc] = {}
        self._early: dict[str, list[dict[str, Any]]] = {}
        self._queue: deque[dict[str, Any]] = deque()
        self._queued_events = 0
        self._max_queued = max_queued
        self._lags: dict[tuple[str, str], dict[str, Any]] = {}
        self._wakeup = asyncio.Event()
        self._dispatch: asyncio.Task[None] | None = None

    async def __aenter__(self) -> ProcsClient:
        await self.connect()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def connect(self) -> None:
        await self._transport.connect()
        self._transport.on_event(self._enqueue)
        self._dispatch = asyncio.ensure_future(self._dispatcher())

    async def aclose(self) -> None:
        try:
            if self._dispatch is not None:
                await cancel_and_wait(self._dispatch)
        finally:
            await self._transport.aclose()

    async def request(self, message: dict[str, Any]) -> dict[str, Any]:
        """Send one proc/* request and return its response; a refused request raises its error."""
        reply = await self._transport.send(message)
        error = reply.get("error")
        if isinstance(error, dict):
            raise _proc_error(error)
        return reply

    async def spawn(
        self,
        cmd: list[str] | str,
        *,
        on_output: OutputCallback | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float | None = None,
        stdin: str = "pipe",
    ) -> Proc:
        """Start ``cmd`` (a list is run as is, no shell; a string through ``/bin/sh -c``)."""
        argv = ["/bin/sh", "-c", cmd] if isinstance(cmd, str) else list(cmd)
        message: dict[str, Any] = {"type": "proc/spawn/req", "cmd": argv, "env": dict(env or {}), "stdin_mode": stdin}
        if cwd is not None:
            message["cwd"] = cwd
        if timeout is not None:
            message["timeout"] = timeout
        reply = await self.request(message)
        proc = Proc(self, str(reply["proc_id"]), reply.get("pid"), on_output)
        self._procs[proc.id] = proc
        for event in self._early.pop(proc.id, []):
            self._enqueue(event)
        return proc

    # -- receiving: the transport's reader hands every pushed event to _enqueue, in order --

    def _enqueue(self, message: dict[str, Any]) -> None:
        if not str(message.get("type", "")).endswith("/event"):
            return
        proc_id = str(message.get("proc_id"))
        if proc_id not in self._procs:  # before its spawn response was read: hold it for spawn()
            self._early.setdefault(proc_id, []).append(message)
            return
        kind = message.get("type")
        if kind == "proc/read/event":
            key = (proc_id, str(message.get("stream_type")))
            if self._queued_events >= self._max_queued or key in self._lags:
                lag = self._lags.setdefault(key, {"type": "local/lag", "proc_id": key[0], "stream_type": key[1]})
                lag["to"] = int(message.get("offset") or 0) + len(str(message.get("data", "")).encode())
                if message.get("truncated"):
                    lag["truncated"] = True
                if self._queued_events < self._max_queued:  # room again: the lag goes in its place
                    self._queue.append(self._lags.pop(key))
                self._wakeup.set()
                return
            self._queued_events += 1
        elif kind == "proc/exit/event":
            for key in [k for k in self._lags if k[0] == proc_id]:
                self._queue.append(self._lags.pop(key))
        self._queue.append(message)
        self._wakeup.set()

    async def _dispatcher(self) -> None:
        while True:
            if not self._queue and self._lags:
                self._queue.append(self._lags.pop(next(iter(self._lags))))
            if not self._queue:
                self._wakeup.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wakeup.wait(), 0.5)
                await self._follow_truncated()
                continue
            message = self._queue.popleft()
            kind = message.get("type")
            proc = self._procs.get(str(message.get("proc_id")))
            if proc is None:
                continue
            stream = str(message.get("stream_type", "stdout"))
            if kind == "proc/read/event":
                self._queued_events -= 1
                if message.get("truncated"):
                    proc.truncated.add(stream)
                await proc._deliver(stream, str(message.get("data", "")), int(message.get("offset") or 0))
            elif kind in ("proc/lagged/event", "local/lag"):
                proc.lagged += int(message.get("events") or 1)
                if message.get("truncated"):
                    proc.truncated.add(stream)
                end = message.get("to")
                if end is None:
                    end = int(message.get("offset") or 0) + int(message.get("bytes") or 0)
                await self.fill(proc, stream, int(end))
            elif kind == "proc/exit/event":
                for name in ("stdout", "stderr"):
                    await self.fill(proc, name, None)  # anything not pushed (the cap) or not yet read
                if not proc._exit.done():
                    proc._exit.set_result(
                        ProcExit(
                            str(message.get("state")),
                            message.get("exit_code"),
                            message.get("exit_signal"),
                            message.get("duration_ms"),
                        )
                    )

    async def _follow_truncated(self) -> None:
        """A running process past the daemon's push cap: page its new output from the log."""
        for proc in list(self._procs.values()):
            if proc.exited is None:
                for stream in list(proc.truncated):
                    await self.fill(proc, stream, None)

    async def fill(self, proc: Proc, stream: str, upto: int | None) -> None:
        """Deliver ``proc``'s ``stream`` from what was delivered to ``upto`` (None: to the end) from the log."""
        while upto is None or proc.delivered[stream] < upto:
            start = proc.delivered[stream]
            limit = _LOG_PAGE if upto is None else min(_LOG_PAGE, upto - start)
            page = await self.request(
                {"type": "proc/log/req", "proc_id": proc.id, "stream_type": stream, "offset": start, "limit": limit}
            )
            text, offset, end = str(page.get("data", "")), int(page["offset"]), int(page["next_offset"])
            if offset > start:  # bytes the log cap dropped: they are gone, go on after them
                proc.delivered[stream] = offset
            if end <= proc.delivered[stream]:
                return
            await proc._deliver(stream, text, offset)
            if upto is None and end >= int(page.get("size") or 0):
                return


def _proc_error(error: Mapping[str, Any]) -> ProcpilotError:
    code = str(error.get("code") or "proc_error")
    cls = error_for_proc_code(code)
    name = cls.__name__ if cls is not None else "".join(part.capitalize() for part in code.split("_"))
    exc = error_from({"error": name, "message": error.get("message", code), "hints": error.get("hints") or {}})
    exc.details.setdefault("proc_code", code)
    return exc
