"""``tools/call`` on the daemon's ``/mcp`` answered without the SDK's dispatch (transports/http/mcp_fast.py):
the same replies the SDK writes, in every protocol version served, cancellation as the SDK does
it, and nothing of auth, bounds or audit skipped. The app runs in this process (real supervisor,
real processes), reached through httpx2's ASGI transport or, for a client that leaves, raw ASGI."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from starlette.applications import Starlette

from procpilot.config import load_settings
from procpilot.transports.http.app import daemon_of
from procpilot.transports.http.mcp_fast import FastCalls
from procpilot.transports.mcp_results import MODERN, SHAPED_ALIKE
from procpilot.transports.serve import daemon_app, make_supervisor
from tests.daemon import TOKEN_A, TOKEN_B, TOKENS, daemon_env, write_config
from tests.transports.test_mcp_direct import _masked

BASE = "http://127.0.0.1:8765"
_CLIENT = {"name": "t", "version": "0"}


@pytest.fixture
async def app(tmp_path: Path) -> AsyncIterator[Starlette]:
    settings = load_settings(write_config(tmp_path, TOKENS), env=daemon_env(tmp_path))
    settings.state_dir.mkdir(parents=True, exist_ok=True)
    async with make_supervisor(settings) as sup, daemon_app(sup, settings) as app:
        yield app  # each test enters the lifespan in its own task (anyio's scopes are per task)


def fast(app: Starlette) -> FastCalls:
    calls = daemon_of(app).mcp.fast
    assert calls is not None
    return calls


def _reply(response: httpx2.Response) -> dict[str, Any]:
    """The JSON-RPC message of a POST's answer: JSON, or the SSE stream's message event."""
    if response.headers["content-type"].startswith("application/json"):
        return dict(response.json())
    data = [line[6:] for line in response.text.splitlines() if line.startswith("data: ")]
    return dict(json.loads(data[-1]))


class Mcp:
    """A bare MCP client over HTTP: the handshake of ``version`` (then a tools/list, as clients
    do), or for 2026-07-28 a server/discover under the envelope every request then carries."""

    def __init__(self, app: Starlette, version: str, token: str = TOKEN_A) -> None:
        transport = httpx2.ASGITransport(app=app, client=("127.0.0.1", 50000))
        self.http = httpx2.AsyncClient(transport=transport, base_url=BASE, timeout=60)
        self.version = version
        self.token = token
        self.session: str | None = None
        self.envelope: dict[str, Any] | None = None
        self._sdk_envelopes = 0

    async def open(self) -> None:
        if self.version == MODERN:
            self.envelope = {
                "io.modelcontextprotocol/protocolVersion": MODERN,
                "io.modelcontextprotocol/clientInfo": _CLIENT,
                "io.modelcontextprotocol/clientCapabilities": {},
            }
            assert "result" in await self.request(0, "server/discover", {"_meta": self.envelope})
            return
        hello = {"protocolVersion": self.version, "capabilities": {}, "clientInfo": _CLIENT}
        response = await self.post({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": hello})
        self.session = response.headers["mcp-session-id"]
        assert _reply(response)["result"]["protocolVersion"] == self.version
        assert (await self.post({"jsonrpc": "2.0", "method": "notifications/initialized"})).status_code == 202
        assert "tools" in (await self.request(1, "tools/list", {}))["result"]

    def headers(self, message: dict[str, Any]) -> dict[str, str]:
        headers = {
            "authorization": f"Bearer {self.token}",
            "content-type": "application/json",
            "accept": "application/json, text/event-stream",
        }
        if self.session is not None:
            headers |= {"mcp-session-id": self.session, "mcp-protocol-version": self.version}
        if self.version == MODERN:
            headers |= {"mcp-protocol-version": MODERN, "mcp-method": message.get("method", "")}
            name = (message.get("params") or {}).get("name")
            if isinstance(name, str):
                headers["mcp-name"] = name
        return headers

    async def post(self, message: dict[str, Any]) -> httpx2.Response:
        return await self.http.post("/mcp", json=message, headers=self.headers(message))

    async def request(self, request_id: object, method: str, params: dict[str, Any]) -> dict[str, Any]:
        return _reply(await self.post({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}))

    def params(self, params: dict[str, Any], *, through_sdk: bool = False) -> dict[str, Any]:
        """A call's params; ``through_sdk``: with a ``_meta`` that keeps it on the SDK's path (an
        envelope the SDK has not answered yet, or a legacy ``_meta``)."""
        if self.envelope is None:
            return params | ({"_meta": {}} if through_sdk else {})
        if through_sdk:
            self._sdk_envelopes += 1
            other = {"io.modelcontextprotocol/clientInfo": {"name": "t", "version": f"sdk-{self._sdk_envelopes}"}}
            return params | {"_meta": self.envelope | other}
        return params | {"_meta": self.envelope}

    async def call(self, request_id: object, params: dict[str, Any]) -> dict[str, Any]:
        return await self.request(request_id, "tools/call", params)


async def opened(app: Starlette, version: str, token: str = TOKEN_A) -> Mcp:
    client = Mcp(app, version, token)
    await client.open()
    return client


@pytest.mark.parametrize("version", [*sorted(SHAPED_ALIKE), MODERN])
@pytest.mark.parametrize(
    "arguments",
    [
        {"command": "printf 'h\\xc3\\xa9\\n'; echo err >&2; exit 3"},  # an exit code, stderr, non-ASCII
        {"comand": "typo"},  # a typed error result
        {"command": "x" * 200_000},  # over the command's bound: the face refuses it, on either path
        {"command": "sleep 5", "yieldMs": 10},  # backgrounded
    ],
    ids=["exit", "typo", "too-long", "background"],
)
async def test_a_fast_reply_is_what_the_sdk_would_have_written(
    app: Starlette, version: str, arguments: dict[str, Any]
) -> None:
    async with app.router.lifespan_context(app):
        client = await opened(app, version)
        before = fast(app).answered
        direct = await client.call(1, client.params({"name": "exec", "arguments": arguments}))
        assert fast(app).answered == before + 1  # answered without the SDK
        through_sdk = await client.call(2, client.params({"name": "exec", "arguments": arguments}, through_sdk=True))
        assert fast(app).answered == before + 1  # and this one by the SDK
        assert direct["id"] == 1 and through_sdk["id"] == 2
        assert _masked(direct["result"]) == _masked(through_sdk["result"])
        assert set(direct) == set(through_sdk) == {"jsonrpc", "id", "result"}


async def test_a_handshake_era_fast_reply_is_one_event_stream_of_a_declared_length(app: Starlette) -> None:
    # Answered at once, the stream is written whole: its length said, no chunk framing.
    async with app.router.lifespan_context(app):
        client = await opened(app, "2025-06-18")
        before = fast(app).answered
        call = {"name": "exec", "arguments": {"command": "true"}}
        response = await client.post({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": call})
        assert fast(app).answered == before + 1
        assert response.headers["content-type"].startswith("text/event-stream")
        assert response.headers["content-length"] == str(len(response.content))
        assert "transfer-encoding" not in response.headers
        assert response.text.startswith("event: message\r\ndata: ") and _reply(response)["id"] == 7


async def _session_started(app: Starlette, count: int) -> None:
    sup = daemon_of(app).sup
    while len(sup.all_sessions()) < count:
        await asyncio.sleep(0.005)


@pytest.mark.parametrize("through_sdk", [False, True], ids=["direct", "sdk"])
async def test_a_cancelled_handshake_era_call_is_answered_as_the_sdk_answers_it(
    app: Starlette, through_sdk: bool
) -> None:
    async with app.router.lifespan_context(app):
        client = await opened(app, "2025-06-18")
        before = fast(app).answered
        call = {"name": "exec", "arguments": {"command": "sleep 5", "yieldMs": 60000}}
        pending = asyncio.ensure_future(client.call("long", client.params(call, through_sdk=through_sdk)))
        await asyncio.wait_for(_session_started(app, 1), 30)
        cancel = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": "long"}}
        assert (await client.post(cancel)).status_code == 202
        reply = await asyncio.wait_for(pending, 3)  # long before the command's 5 s
        assert reply == {"jsonrpc": "2.0", "id": "long", "error": {"code": -32800, "message": "Request cancelled"}}
        assert fast(app).answered == before + (0 if through_sdk else 1)


@pytest.mark.parametrize("through_sdk", [False, True], ids=["direct", "sdk"])
async def test_a_2026_call_whose_client_leaves_is_cancelled_and_never_answered(
    app: Starlette, through_sdk: bool
) -> None:
    async with app.router.lifespan_context(app):
        client = await opened(app, MODERN)
        message = {
            "jsonrpc": "2.0",
            "id": 5,
            "method": "tools/call",
            "params": client.params(
                {"name": "exec", "arguments": {"command": "sleep 5", "yieldMs": 60000}}, through_sdk=through_sdk
            ),
        }
        leave = asyncio.Event()
        sent: list[dict[str, Any]] = []

        async def receive() -> dict[str, Any]:
            if not sent and not leave.is_set() and not hasattr(receive, "done"):
                receive.done = True  # type: ignore[attr-defined]
                return {"type": "http.request", "body": json.dumps(message).encode(), "more_body": False}
            await leave.wait()
            return {"type": "http.disconnect"}

        async def send(event: dict[str, Any]) -> None:
            sent.append(event)

        headers = [(k.encode(), v.encode()) for k, v in client.headers(message).items()]
        body = json.dumps(message).encode()
        headers += [(b"host", b"127.0.0.1:8765"), (b"content-length", str(len(body)).encode())]
        scope = {
            "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
            "path": "/mcp", "raw_path": b"/mcp", "query_string": b"", "root_path": "", "headers": headers,
            "client": ("127.0.0.1", 50000), "server": ("127.0.0.1", 8765), "state": {},
        }  # fmt: skip
        served = asyncio.ensure_future(app(scope, receive, send))
        await asyncio.wait_for(_session_started(app, 1), 30)
        leave.set()
        await asyncio.wait_for(served, 3)  # long before the command's 5 s
        assert sent == []


async def test_another_agents_token_on_a_session_gets_the_sdks_not_found(app: Starlette) -> None:
    async with app.router.lifespan_context(app):
        client = await opened(app, "2025-06-18")
        intruder = Mcp(app, "2025-06-18", TOKEN_B)
        intruder.session = client.session
        before = fast(app).answered
        response = await intruder.post(
            {
                "jsonrpc": "2.0",
                "id": 1,
                "method": "tools/call",
                "params": {"name": "exec", "arguments": {"command": "true"}},
            }
        )
        assert response.status_code == 404
        assert fast(app).answered == before
        assert daemon_of(app).sup.all_sessions() == []


async def test_a_body_over_the_cap_is_refused_before_the_fast_path(app: Starlette) -> None:
    async with app.router.lifespan_context(app):
        client = await opened(app, "2025-06-18")
        before = fast(app).answered
        call = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "tools/call",
            "params": {"name": "exec", "arguments": {"command": "true", "x": "y" * (2 << 20)}},
        }
        response = await client.post(call)
        assert response.status_code == 413
        assert fast(app).answered == before
        assert daemon_of(app).sup.all_sessions() == []


async def test_a_fast_call_is_audited(app: Starlette) -> None:
    async with app.router.lifespan_context(app):
        client = await opened(app, "2025-06-18")
        heard: list[Any] = []
        audit = daemon_of(app).audit
        assert audit is not None
        remove = audit.add_callback(heard.append)
        try:
            before = fast(app).answered
            reply = await client.call(1, {"name": "exec", "arguments": {"command": "true"}})
            assert fast(app).answered == before + 1
        finally:
            remove()
        assert reply["result"]["isError"] is False
        assert [(event.tool, event.outcome) for event in heard] == [("exec", "ok")]


async def test_a_backgrounded_fast_call_tells_a_legacy_client_of_the_exit(app: Starlette) -> None:
    async with app.router.lifespan_context(app):
        client = await opened(app, "2025-06-18")
        face = daemon_of(app).mcp
        before = fast(app).answered
        reply = await client.call(1, {"name": "exec", "arguments": {"command": "sleep 5", "yieldMs": 10}})
        assert fast(app).answered == before + 1
        session_id = reply["result"]["structuredContent"]["sessionId"]
        assert client.session is not None
        assert [c.session_id for _a, c in face._legacy[session_id]] == [client.session]


async def test_unknown_tools_malformed_calls_and_progress_tokens_are_the_sdks(app: Starlette) -> None:
    async with app.router.lifespan_context(app):
        client = await opened(app, "2025-06-18")
        before = fast(app).answered
        unknown = await client.call(1, {"name": "nosuch", "arguments": {}})
        assert unknown["result"]["isError"] is True and "nosuch" in unknown["result"]["content"][0]["text"]
        no_name = await client.call(2, {"arguments": {}})
        assert no_name["error"]["code"] == -32602
        bad_arguments = await client.call(3, {"name": "exec", "arguments": ["not", "an", "object"]})
        assert "error" in bad_arguments
        progress = {"name": "exec", "arguments": {"command": "true"}, "_meta": {"progressToken": "p"}}
        assert (await client.call(4, progress))["result"]["isError"] is False
        for request_id, name in ((6, ["exec"]), (7, {"exec": 1})):  # not a name: the SDK's error, not a crash
            assert "error" in await client.call(request_id, {"name": name, "arguments": {}})
        assert fast(app).answered == before  # every one of them answered by the SDK
        assert (await client.call(5, {"name": "exec", "arguments": {"command": "true"}}))["result"]["isError"] is False
        assert fast(app).answered == before + 1
