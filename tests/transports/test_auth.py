"""Bearer tokens decide the agent: no token or a wrong one is a bare 401 everywhere, and one agent's
token can never see, poll, write to or kill another agent's session through any endpoint.

REST is tested on the app in this process (tests/inprocess.py); the log, MCP, SSE and WebSocket
on a real daemon."""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterator
from typing import Any

import anyio
import httpx2
import pytest
from mcp import Client

from procpilot.transports.http import TokenAuth
from tests.daemon import TOKEN_A, TOKEN_B, TOKENS, Served, start_daemon
from tests.inprocess import InProcess, in_process_daemon

ENDPOINTS = [
    ("GET", "/v1/tools", None),
    ("POST", "/v1/tools/exec", {"command": "touch /tmp/procpilot-should-not-exist"}),
    ("POST", "/v1/tools/process", {"action": "list"}),
    ("POST", "/v1/tools/nope", {}),
    ("GET", "/openapi.json", None),
    ("GET", "/v1/capabilities", None),
    ("GET", "/v1/events", None),
    ("POST", "/mcp", {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}),
    ("GET", "/v1/nothing-here", None),
]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    daemon = start_daemon(tmp_path_factory.mktemp("auth"))
    yield daemon
    assert daemon.stop() == 0, daemon.log_text()


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcess]:
    with in_process_daemon(tmp_path_factory.mktemp("auth-app")) as inproc:
        yield inproc


@pytest.mark.parametrize(
    "authorization", [None, "", "Bearer", "Bearer wrong", f"Basic {TOKEN_A}", f"Bearer {TOKEN_A}x"]
)
def test_missing_or_wrong_token_is_a_bare_401_everywhere(app: InProcess, authorization: str | None) -> None:
    headers = {"Authorization": authorization} if authorization is not None else {}
    with app.http(None) as c:
        for method, path, body in ENDPOINTS:
            r = c.request(method, path, json=body, headers=headers)
            assert r.status_code == 401, (method, path, r.status_code)
            # A fixed body: nothing about tools, agents or sessions, the same for every failure (on
            # /mcp inside a JSON-RPC error, with the one hint every caller without a token gets).
            fixed = r.json()["error"]["data"] if path == "/mcp" else r.json()
            assert {k: fixed[k] for k in ("error", "message")} == {"error": "Unauthorized", "message": "Unauthorized."}
            assert set(fixed) <= {"error", "message", "hints"}
            assert r.headers["www-authenticate"] == "Bearer"


def test_tokens_never_reach_the_log(served: Served) -> None:
    with served.http() as c:
        c.post("/v1/tools/exec", json={"command": "true"})
    with httpx2.Client(base_url=served.url, headers={"Authorization": "Bearer tok-wrong-secret"}) as c:
        c.get("/v1/tools")
    log = served.log_text()
    for secret in [*TOKENS, "tok-wrong-secret"]:
        assert secret not in log


def test_token_auth_unit() -> None:
    auth = TokenAuth({"alpha": "a", "beta": "b"})
    assert auth.required
    assert auth.agent_for("Bearer alpha") == "a"
    assert auth.agent_for("bearer beta") == "b"
    for wrong in (None, "", "Bearer", "Bearer alph", "Bearer alphaa", "Token alpha", "alpha", "Bearer  gamma"):
        assert auth.agent_for(wrong) is None
    open_ = TokenAuth({}, open_agent="solo")
    assert not open_.required
    assert open_.agent_for(None) == "solo"
    assert "alpha" not in repr(vars(auth))  # only digests are kept


def _post(c: httpx2.Client, tool: str, **args: Any) -> httpx2.Response:
    return c.post(f"/v1/tools/{tool}", json=args)


def test_agent_b_cannot_touch_agent_a_sessions_over_rest(app: InProcess) -> None:
    with app.http(TOKEN_A) as a, app.http(TOKEN_B) as b:
        sid = _post(a, "exec", command="cat", background=True).json()["data"]["sessionId"]
        ghost = "aaaaaaaaaaaaaaaa"
        for action, extra in [
            ("poll", {}),
            ("log", {}),
            ("write", {"data": "x"}),
            ("send-keys", {"keys": ["C-c"]}),
            ("submit", {"text": "x"}),
            ("paste", {"text": "x"}),
            ("kill", {"signal": "SIGKILL"}),
            ("wait", {"timeout": 100}),
            ("clear", {}),
            ("remove", {}),
        ]:
            theirs = _post(b, "process", action=action, sessionId=sid, **extra)
            missing = _post(b, "process", action=action, sessionId=ghost, **extra)
            assert theirs.status_code == missing.status_code == 404, (action, theirs.text)
            # Indistinguishable from a session that does not exist (but for the id itself).
            assert theirs.json()["error"] == missing.json()["error"] == "SessionNotFound"
            assert theirs.text.replace(sid, ghost) == missing.text
        assert sid not in _post(b, "process", action="list").text
        # The process.* face, where it is served, keeps scopes apart the same way.
        tools = {t["name"] for t in b.get("/v1/tools").json()["tools"]}
        if "process.monitor" in tools:
            r = _post(b, "process.monitor", process_id=sid)
            assert r.status_code == 404
            assert sid not in _post(b, "process.list").text
        if "process.kill" in tools:
            assert _post(b, "process.kill", process_id=sid).status_code == 404
        if "process.logs" in tools:
            assert _post(b, "process.logs", process_id=sid).status_code == 404
        # A's session is untouched by all that.
        polled = _post(a, "process", action="poll", sessionId=sid).json()["data"]
        assert polled["status"] == "running"
        assert _post(a, "process", action="remove", sessionId=sid).status_code == 200


async def test_agent_b_cannot_touch_agent_a_sessions_over_mcp(served: Served) -> None:
    async with served.mcp(TOKEN_A, mode="legacy") as a, served.mcp(TOKEN_B, mode="legacy") as b:
        started = await a.call_tool("exec", {"command": "sleep 30", "background": True})
        sid = (started.structured_content or {})["sessionId"]
        for args in (
            {"action": "poll", "sessionId": sid},
            {"action": "write", "sessionId": sid, "data": "x"},
            {"action": "kill", "sessionId": sid},
        ):
            result = await b.call_tool("process", args)
            assert result.is_error and (result.structured_content or {})["error"] == "SessionNotFound"
        listed = await b.call_tool("process", {"action": "list"})
        assert sid not in json.dumps(listed.structured_content)
        with pytest.raises(Exception, match=r"(?i)not found|no session"):
            await b.read_resource(f"proc://{sid}")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # resources/subscribe is the legacy era's: deprecated
            with pytest.raises(Exception, match=r"(?i)not found"):
                await b.session.subscribe_resource(f"proc://{sid}")
        polled = await a.call_tool("process", {"action": "poll", "sessionId": sid})
        assert (polled.structured_content or {})["status"] == "running"
        await a.call_tool("process", {"action": "remove", "sessionId": sid})


async def test_listen_streams_hear_only_their_own_agent(served: Served) -> None:
    async with served.mcp(TOKEN_A, mode="auto") as a, served.mcp(TOKEN_B, mode="auto") as b:
        if a.protocol_version.startswith("2025"):
            pytest.skip("the SDK negotiated a legacy version")
        started = await a.call_tool("exec", {"command": "sleep 1", "background": True})
        uri = f"proc://{(started.structured_content or {})['sessionId']}"
        heard_b: list[Any] = []
        async with a.listen(resource_subscriptions=[uri]) as sub_a, b.listen(resource_subscriptions=[uri]) as sub_b:

            async def drain_b() -> None:
                async for event in sub_b:
                    heard_b.append(event)

            async with anyio.create_task_group() as tg:
                tg.start_soon(drain_b)
                with anyio.fail_after(15):
                    async for event in sub_a:
                        assert getattr(event, "uri", None) == uri
                        break
                await anyio.sleep(0.5)
                tg.cancel_scope.cancel()
        assert heard_b == []  # B named A's session's URI and still heard nothing
        await a.call_tool("process", {"action": "remove", "sessionId": uri.removeprefix("proc://")})


async def test_an_mcp_session_belongs_to_the_token_that_opened_it(served: Served) -> None:
    async with served.mcp(TOKEN_A, mode="legacy") as a:
        await a.list_tools()
        session_id = _mcp_session_id(a)
        assert session_id
        body = {"jsonrpc": "2.0", "id": 7, "method": "tools/list"}
        headers = {
            "Mcp-Session-Id": session_id,
            "Accept": "application/json, text/event-stream",
            "Mcp-Protocol-Version": a.protocol_version,
        }
        async with served.ahttp(TOKEN_B) as b:
            r = await b.post("/mcp", json=body, headers=headers)
            assert r.status_code == 404  # as if the session did not exist
        async with served.ahttp(None) as nobody:
            assert (await nobody.post("/mcp", json=body, headers=headers)).status_code == 401


def _mcp_session_id(client: Client) -> str | None:
    """The Mcp-Session-Id the SDK's transport holds (found by walking its objects)."""
    import gc

    from mcp.client.streamable_http import StreamableHTTPTransport

    for obj in gc.get_objects():
        if isinstance(obj, StreamableHTTPTransport) and getattr(obj, "session_id", None):
            return str(obj.session_id)
    return None


async def test_sse_and_websocket_hear_only_their_own_agent(served: Served) -> None:
    from procpilot.client import ProcsClient

    async with ProcsClient(served.url, TOKEN_A) as procs_a, ProcsClient(served.url, TOKEN_B) as procs_b:
        proc = await procs_a.spawn(["sleep", "30"])
        with pytest.raises(Exception, match=r"no session|unknown_proc|no process"):
            await procs_b.request({"type": "proc/kill/req", "proc_id": proc.id, "signal": "SIGKILL"})
        assert (await proc.status())["state"] == "RUNNING"
        with httpx2.Client(base_url=served.url, headers=served.headers(TOKEN_B)) as b:
            assert _post(b, "process", action="kill", sessionId=proc.id).status_code == 404
        await proc.kill("SIGKILL")
        await proc.wait(30)


async def test_sse_audit_events_are_scoped_per_agent(served: Served) -> None:
    """exec is a notify-tier tool: each call is an audit event, heard only on its own agent's stream."""

    async def audits_until(lines: Any, marker: str, seen: list[str]) -> None:
        kind = None
        with anyio.fail_after(30):
            async for line in lines:
                if line.startswith("event: "):
                    kind = line[7:]
                elif line.startswith("data: ") and kind == "audit":
                    seen.append(json.loads(line[6:])["summary"])
                    if marker in seen[-1]:
                        return

    async with (
        served.ahttp(TOKEN_A) as a,
        served.ahttp(TOKEN_B) as b,
        a.stream("GET", "/v1/events") as events_a,
        b.stream("GET", "/v1/events") as events_b,
    ):
        lines_a, lines_b = events_a.aiter_lines(), events_b.aiter_lines()
        ran = []
        for client, command in ((a, "echo only-for-a"), (b, "echo only-for-b"), (a, "echo a-again")):
            r = await client.post("/v1/tools/exec", json={"command": command})
            ran.append((client, r.json()["data"]["sessionId"]))
        seen_a: list[str] = []
        seen_b: list[str] = []
        await audits_until(lines_a, "a-again", seen_a)  # after B's call: B's event would be here by now
        await audits_until(lines_b, "only-for-b", seen_b)
        assert any("only-for-a" in s for s in seen_a)
        assert not any("only-for-b" in s for s in seen_a)
        assert not any("only-for-a" in s or "a-again" in s for s in seen_b)
        for client, sid in ran:
            await client.post("/v1/tools/process", json={"action": "remove", "sessionId": sid})
