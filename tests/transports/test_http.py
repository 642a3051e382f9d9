"""The daemon: REST and OpenAPI on its app in this process (tests/inprocess.py); the Unix socket,
SSE, MCP and shutdown on `procpilot serve` as a real subprocess on a free loopback port."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx2
import jsonschema
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPDeprecationWarning

from tests.conftest import marked_processes, marked_processes_soon
from tests.daemon import (
    PROCPILOT,
    TOKEN_B,
    TOKENS,
    Served,
    cleanup,
    daemon_env,
    post,
    start_daemon,
    write_config,
)
from tests.inprocess import InProcess, in_process_daemon


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcess]:
    with in_process_daemon(tmp_path_factory.mktemp("app")) as inproc:
        yield inproc


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    daemon = start_daemon(tmp_path_factory.mktemp("daemon"))
    yield daemon
    assert daemon.stop() == 0, daemon.log_text()


# -- REST --------------------------------------------------------------------------------------


def test_exec_and_process_over_rest(app: InProcess) -> None:
    with app.http() as c:
        r = post(c, "exec", command="echo hello; echo oops >&2; exit 3")
        assert r.status_code == 200
        body = r.json()
        assert set(body) == {"text", "data"}
        assert body["data"]["status"] == "error"  # a failed command is a result, not an HTTP error
        assert body["data"]["exitCode"] == 3
        assert "hello" in body["data"]["output"] and "oops" in body["data"]["output"]

        bg = post(c, "exec", command="for i in 1 2 3; do echo line$i; sleep 0.1; done", background=True).json()
        sid = bg["data"]["sessionId"]
        assert bg["data"]["status"] == "running"
        waited = post(c, "process", action="wait", sessionId=sid, timeout=10_000).json()["data"]
        assert waited["reason"] == "exited" and waited["status"] == "done"
        log = post(c, "process", action="log", sessionId=sid, offset=0).json()["data"]
        assert log["output"] == "line1\nline2\nline3"
        listed = post(c, "process", action="list").json()["data"]["sessions"]
        assert sid in {s["sessionId"] for s in listed}
        assert c.post("/v1/tools/process", json={"action": "remove", "sessionId": sid}).status_code == 200
        cleanup(c)


def test_audit_events_are_appended_to_the_state_dir(app: InProcess) -> None:
    with app.http() as c:
        done = post(c, "exec", command="echo for-the-record").json()["data"]
        post(c, "process", action="remove", sessionId=done["sessionId"])
    path = app.root / "state" / "audit.jsonl"
    text = path.read_text()
    events = [json.loads(line) for line in text.splitlines()]
    assert any(e["scope"] == "agent-a" and e["tool"] == "exec" and "for-the-record" in e["summary"] for e in events)
    assert not any(token in text for token in TOKENS)  # agent ids, never the tokens that chose them
    assert (path.stat().st_mode & 0o777) == 0o600


def test_empty_body_is_no_arguments(app: InProcess) -> None:
    with app.http() as c:
        r = c.post("/v1/tools/exec")
        assert r.status_code == 422
        assert r.json()["error"] == "InvalidArgument"
        assert "command" in r.json()["message"]


@pytest.mark.parametrize(
    ("arguments", "status", "code"),
    [
        ({"action": "poll", "sessionId": "nosuchsession000"}, 404, "SessionNotFound"),
        ({"action": "fly"}, 422, "InvalidArgument"),
        ({"action": "poll"}, 422, "InvalidArgument"),
        ({"action": "wait", "sessionId": "nosuchsession000", "pattern": "("}, 404, "SessionNotFound"),
        ({"action": "list", "bogus": 1}, 422, "InvalidArgument"),
    ],
)
def test_typed_errors_have_statuses(app: InProcess, arguments: dict[str, Any], status: int, code: str) -> None:
    with app.http() as c:
        r = post(c, "process", **arguments)
        assert r.status_code == status, r.text
        body = r.json()
        assert body["error"] == code
        assert body["message"] and isinstance(body["hints"], dict) and body["hints"]
        assert body["text"].startswith(code)


def test_state_errors_are_409_and_spawn_errors_422(app: InProcess) -> None:
    with app.http() as c:
        done = post(c, "exec", command="true").json()["data"]["sessionId"]
        r = post(c, "process", action="write", sessionId=done, data="x")
        assert (r.status_code, r.json()["error"]) == (409, "ProcessAlreadyExited")
        running = post(c, "exec", command="sleep 30", background=True).json()["data"]["sessionId"]
        r = post(c, "process", action="clear", sessionId=running)
        assert (r.status_code, r.json()["error"]) == (409, "SessionStillRunning")
        bad = post(c, "process", action="wait", sessionId=running, pattern="(")
        assert (bad.status_code, bad.json()["error"]) == (422, "InvalidPattern")
        r = post(c, "exec", command="definitely-not-a-program-xyz --flag")
        assert r.status_code in (200, 422)
        if r.status_code == 422:
            assert r.json()["error"] == "CommandNotFound"
        r = post(c, "exec", command="true", elevated=True)
        assert (r.status_code, r.json()["error"]) in {(501, "NotSupported"), (403, "ElevationDenied")}
        cleanup(c)


def test_bad_requests(app: InProcess) -> None:
    with app.http() as c:
        r = c.post("/v1/tools/nope", json={})
        assert (r.status_code, r.json()["error"]) == (404, "UnknownTool")
        r = c.post("/v1/tools/exec", content=b"command=ls", headers={"Content-Type": "text/plain"})
        assert (r.status_code, r.json()["error"]) == (415, "UnsupportedMediaType")
        r = c.post("/v1/tools/exec", content=b"{nope", headers={"Content-Type": "application/json"})
        assert (r.status_code, r.json()["error"]) == (422, "InvalidArgument")
        r = c.post("/v1/tools/exec", json=["ls"])
        assert (r.status_code, r.json()["error"]) == (422, "InvalidArgument")


def test_dns_rebinding_and_cross_site_requests_are_refused(app: InProcess) -> None:
    with app.http() as c:
        assert c.get("/v1/tools", headers={"Host": "evil.example"}).status_code == 403
        assert c.get("/v1/tools", headers={"Origin": "http://evil.example"}).status_code == 403
        assert c.get("/v1/tools", headers={"Origin": f"{app.url}"}).status_code == 200


def test_unix_socket(served: Served) -> None:
    assert served.unix_socket
    assert (os.stat(served.unix_socket).st_mode & 0o777) == 0o600
    transport = httpx2.HTTPTransport(uds=served.unix_socket)
    with httpx2.Client(transport=transport, base_url="http://localhost", headers=served.headers()) as c:
        r = post(c, "exec", command="echo over-unix")
        assert r.json()["data"]["output"] == "over-unix\n"


# -- OpenAPI -----------------------------------------------------------------------------------


def _validator(doc: dict[str, Any], ref: str) -> jsonschema.protocols.Validator:
    schema = {"$ref": ref, "components": doc["components"]}
    cls = jsonschema.validators.validator_for({"$schema": "https://json-schema.org/draft/2020-12/schema"})
    return cls(schema)


def test_openapi_matches_behaviour(app: InProcess) -> None:
    with app.http() as c:
        doc = c.get("/openapi.json").json()
        tools = c.get("/v1/tools").json()["tools"]
        assert doc["openapi"].startswith("3.1")
        assert {f"/v1/tools/{t['name']}" for t in tools} <= set(doc["paths"])
        for tool in tools:
            op = doc["paths"][f"/v1/tools/{tool['name']}"]["post"]
            ref = op["requestBody"]["content"]["application/json"]["schema"]["$ref"]
            schema = doc["components"]["schemas"][ref.rsplit("/", 1)[1]]
            assert set(schema["properties"]) == set(tool["inputSchema"]["properties"])
            assert schema.get("required", []) == tool["inputSchema"].get("required", [])
        exec_op = doc["paths"]["/v1/tools/exec"]["post"]
        request = _validator(doc, exec_op["requestBody"]["content"]["application/json"]["schema"]["$ref"])
        assert request.is_valid({"command": "ls", "yieldMs": 100})
        assert not request.is_valid({"yieldMs": 100})  # command is required, as the tool says
        assert not request.is_valid({"command": "ls", "nope": 1})  # and nothing unknown

        success = _validator(doc, "#/components/schemas/ToolResult")
        error = _validator(doc, "#/components/schemas/Error")
        calls = [
            ("exec", {"command": "echo ok"}),
            ("exec", {}),
            ("process", {"action": "poll", "sessionId": "nosuchsession000"}),
            ("process", {"action": "list"}),
            ("nope", {}),
        ]
        for name, args in calls:
            r = c.post(f"/v1/tools/{name}", json=args)
            path = doc["paths"].get(f"/v1/tools/{name}", exec_op and {"post": exec_op})["post"]
            assert str(r.status_code) in path["responses"], (name, r.status_code)
            (success if r.status_code == 200 else error).validate(r.json())
        cleanup(c)


def test_refusals_match_the_openapi_document(app: InProcess) -> None:
    """The auth middleware's 401 and 403 bodies validate against the served Error schema, and every
    route's document lists the statuses it really answers."""
    with app.http() as c:
        doc = c.get("/openapi.json").json()
    error = _validator(doc, "#/components/schemas/Error")
    probes = [
        ("GET", "/v1/tools", "get"),
        ("GET", "/v1/events", "get"),
        ("GET", "/openapi.json", "get"),
        ("POST", "/v1/tools/exec", "post"),
        ("POST", "/mcp", "post"),
        ("GET", "/mcp", "get"),
        ("DELETE", "/mcp", "delete"),
    ]
    with app.http(None) as anon, app.http() as c:
        for method, path, op in probes:
            responses = doc["paths"][path][op]["responses"]
            for client, headers, status in [
                (anon, {}, 401),
                (c, {"Host": "evil.example"}, 403),
                (c, {"Origin": "http://evil.example"}, 403),
            ]:
                r = client.request(method, path, headers=headers)
                assert r.status_code == status, (method, path, r.status_code)
                assert str(status) in responses, (method, path, status)
                # On /mcp the typed error is a JSON-RPC error's data, which MCP clients show.
                schema = "/JsonRpcError" if path == "/mcp" else "/Error"
                error.validate(r.json()["error"]["data"] if path == "/mcp" else r.json())
                assert responses[str(status)]["content"]["application/json"]["schema"]["$ref"].endswith(schema)
        assert "403" in doc["paths"]["/v1/proc"]["get"]["responses"]
        # The MCP endpoint's own refusals are JSON-RPC errors, listed with their status.
        rpc = _validator(doc, "#/components/schemas/JsonRpcError")
        mcp_headers = {"content-type": "application/json"}
        init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}}
        for method, headers, status in [
            ("POST", {**mcp_headers, "accept": "text/html"}, 406),
            ("POST", {**mcp_headers, "accept": "application/json, text/event-stream", "mcp-session-id": "x"}, 404),
            ("GET", {"accept": "text/event-stream"}, 400),
        ]:
            r = c.request(method, "/mcp", headers=headers, json=init if method == "POST" else None)
            assert r.status_code == status, (method, headers, r.text)
            assert str(status) in doc["paths"]["/mcp"][method.lower()]["responses"]
            rpc.validate(r.json())


# -- server-sent events ------------------------------------------------------------------------


async def _next_event(lines: Any, kind: str, timeout: float = 15) -> dict[str, Any]:
    event = None
    with anyio.fail_after(timeout):
        async for line in lines:
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: ") and event == kind:
                data: dict[str, Any] = json.loads(line[6:])
                return data
    raise AssertionError("stream ended")


async def test_events_stream_exits_of_the_callers_scope(served: Served) -> None:
    async with (
        served.ahttp() as a,
        served.ahttp(TOKEN_B) as b,
        a.stream("GET", "/v1/events") as sa,
        b.stream("GET", "/v1/events") as sb,
    ):
        assert sa.headers["content-type"].startswith("text/event-stream")
        la, lb = sa.aiter_lines(), sb.aiter_lines()
        assert (await _next_event(la, "ready"))["agent"] == "agent-a"
        await _next_event(lb, "ready")
        r = await a.post("/v1/tools/exec", json={"command": "sleep 0.2; echo bye; exit 4", "background": True})
        sid = r.json()["data"]["sessionId"]
        event = await _next_event(la, "exit")
        assert event["sessionId"] == sid
        assert (event["status"], event["exitCode"], event["uri"]) == ("error", 4, f"proc://{sid}")
        assert "bye" in event["tail"]
        # Agent B's stream heard nothing of it.
        with pytest.raises(TimeoutError):
            await _next_event(lb, "exit", timeout=1)
        await a.post("/v1/tools/process", json={"action": "remove", "sessionId": sid})


# -- MCP ---------------------------------------------------------------------------------------


async def _call(client: Client, tool: str, **args: Any) -> dict[str, Any]:
    result = await client.call_tool(tool, args)
    return result.structured_content or {}


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_mcp_same_tools_and_results_as_rest(served: Served, mode: str) -> None:
    async with served.mcp(mode=mode) as client, served.ahttp() as http:
        names = {t.name for t in (await client.list_tools()).tools}
        rest = {t["name"] for t in (await http.get("/v1/tools")).json()["tools"]}
        assert names == rest
        done = await _call(client, "exec", command="echo via-mcp")
        assert done["output"] == "via-mcp\n"
        err = await client.call_tool("process", {"action": "poll", "sessionId": "nosuchsession000"})
        assert err.is_error and (err.structured_content or {})["error"] == "SessionNotFound"
        # Sessions started over MCP are the agent's sessions over REST too (a list names only
        # backgrounded ones, spec 004: a background run there, and a poll of the foreground one).
        polled = (await http.post("/v1/tools/process", json={"action": "poll", "sessionId": done["sessionId"]})).json()
        assert polled["data"]["status"] == "done"
        running = await _call(client, "exec", command="sleep 30", background=True)
        listed = (await http.post("/v1/tools/process", json={"action": "list"})).json()["data"]["sessions"]
        assert running["sessionId"] in {s["sessionId"] for s in listed}
        await http.post("/v1/tools/process", json={"action": "remove", "sessionId": running["sessionId"]})
        await http.post("/v1/tools/process", json={"action": "remove", "sessionId": done["sessionId"]})


async def test_mcp_wait_sends_progress(served: Served) -> None:
    progress: list[tuple[float, str | None]] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append((value, message))

    async with served.mcp(mode="legacy") as client:
        # One notification a second: a 6 s wait leaves room for at least 2 even on a loaded machine.
        bg = await _call(client, "exec", command="sleep 6", background=True)
        arguments = {"action": "wait", "sessionId": bg["sessionId"], "timeout": 60_000}
        result = await client.call_tool("process", arguments, progress_callback=on_progress)
        assert (result.structured_content or {})["reason"] == "exited"
        assert len(progress) >= 2
        assert [p for p, _ in progress] == sorted(p for p, _ in progress)
        await _call(client, "process", action="remove", sessionId=bg["sessionId"])


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_cancelled_call_never_kills_a_backgrounded_session(served: Served, mode: str) -> None:
    async with served.mcp(mode=mode) as client:
        bg = await _call(client, "exec", command="sleep 30", background=True)
        sid = bg["sessionId"]
        with anyio.move_on_after(1.0):
            await client.call_tool("process", {"action": "wait", "sessionId": sid, "timeout": 60_000})
        await asyncio.sleep(0.5)
        polled = await _call(client, "process", action="poll", sessionId=sid)
        assert polled["status"] == "running"
        await _call(client, "process", action="remove", sessionId=sid)


async def test_mcp_resource_and_listen_notification(served: Served) -> None:
    async with served.mcp(mode="auto") as client:
        if client.protocol_version.startswith("2025"):
            pytest.skip("the SDK negotiated a legacy version")
        bg = await _call(client, "exec", command="sleep 0.5; echo fin", background=True)
        uri = f"proc://{bg['sessionId']}"
        async with client.listen(resource_subscriptions=[uri]) as sub:
            with anyio.fail_after(15):
                async for event in sub:
                    assert getattr(event, "uri", None) == uri
                    break
        read = await client.read_resource(uri)
        data = json.loads(read.contents[0].text)  # type: ignore[union-attr]
        assert data["status"] == "done" and "fin" in data["tail"]
        await _call(client, "process", action="remove", sessionId=bg["sessionId"])


async def test_mcp_legacy_clients_hear_of_exits_without_polling(served: Served) -> None:
    heard: list[str] = []
    got = anyio.Event()

    async def on_message(message: Any) -> None:
        params = getattr(getattr(message, "params", None), "uri", None)
        if params is not None:
            heard.append(str(params))
            got.set()

    async with served.mcp(mode="legacy", message_handler=on_message) as client:
        # Started with exec and backgrounded: this session is told of its end unasked.
        bg = await _call(client, "exec", command="sleep 0.5", background=True)
        with anyio.fail_after(15):
            await got.wait()
        assert heard == [f"proc://{bg['sessionId']}"]
        # An explicit resources/subscribe works too (and on a finished session answers at once).
        got = anyio.Event()
        with pytest.warns(MCPDeprecationWarning, match="resources/subscribe"):
            await client.session.subscribe_resource(f"proc://{bg['sessionId']}")
        with anyio.fail_after(15):
            await got.wait()
        await _call(client, "process", action="remove", sessionId=bg["sessionId"])


async def test_mcp_legacy_clients_hear_of_backgrounded_process_run_exits(served: Served) -> None:
    heard: list[str] = []
    got = anyio.Event()

    async def on_message(message: Any) -> None:
        uri = getattr(getattr(message, "params", None), "uri", None)
        if uri is not None:
            heard.append(str(uri))
            got.set()

    async with served.mcp(mode="legacy", message_handler=on_message) as client:
        names = {t.name for t in (await client.list_tools()).tools}
        if "process.run" not in names:
            pytest.skip("this build has no process.* face")
        bg = await _call(client, "process.run", command="sleep", args=["0.5"], background=True)
        assert bg["state"] == "running"
        with anyio.fail_after(15):
            await got.wait()
        assert heard == [f"proc://{bg['process_id']}"]
        await _call(client, "process", action="remove", sessionId=bg["process_id"])


# -- start-up and shutdown ---------------------------------------------------------------------


def test_refuses_non_loopback_without_tokens(tmp_path: Path) -> None:
    config = write_config(tmp_path, None, host="0.0.0.0")  # noqa: S104 - refused before binding
    argv = [PROCPILOT, "serve", "--config", str(config)]
    result = subprocess.run(argv, env=daemon_env(tmp_path), capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 2
    assert "ServeRefused" in result.stderr and "tokens" in result.stderr
    assert "Traceback" not in result.stderr


def test_no_tokens_on_loopback_is_one_open_agent(tmp_path: Path) -> None:
    daemon = start_daemon(tmp_path, None, "--agent", "solo")
    try:
        with daemon.http(None) as c:
            assert post(c, "exec", command="echo open").json()["data"]["output"] == "open\n"
    finally:
        assert daemon.stop() == 0


# SIGHUP re-execs the daemon instead, unless its terminal hung up: see test_restarts.py.
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGQUIT])
async def test_shutdown_ends_every_tree_and_open_stream(tmp_path: Path, sig: int) -> None:
    daemon = start_daemon(tmp_path)
    try:
        async with daemon.ahttp() as http, daemon.mcp(mode="legacy") as client:
            await http.post("/v1/tools/exec", json={"command": "sleep 60 & sleep 60", "background": True})
            await _call(client, "exec", command="sleep 60", background=True)
            trap = "trap 'echo got-term; exit 0' TERM; while :; do sleep 0.1; done"
            await http.post("/v1/tools/exec", json={"command": trap, "background": True})
            async with http.stream("GET", "/v1/events") as events:
                lines = events.aiter_lines()
                await _next_event(lines, "ready")
                assert marked_processes_soon()
                daemon.proc.send_signal(sig)
                # Bounded by the grace period (2 s) plus slack for a loaded machine: the stream
                # ends when the daemon stops.
                with anyio.fail_after(60):
                    async for _line in lines:
                        pass
            rc = await asyncio.to_thread(daemon.proc.wait, 60)
            assert rc == 0
    finally:
        daemon.stop()
    assert not marked_processes()
    if sig == signal.SIGTERM:  # the signal itself was forwarded to the trees (then SIGKILL after grace)
        logs = [p.read_bytes() for p in (tmp_path / "state").rglob("*") if p.is_file()]
        assert any(b"got-term" in data for data in logs)
    assert not (tmp_path / "state" / "daemon.json").exists()
    assert not (tmp_path / "daemon.sock").exists()
    assert "Traceback" not in daemon.log_text()


# -- units -------------------------------------------------------------------------------------


def test_error_statuses() -> None:
    from procpilot.transports.http import status_for_error

    expected = {
        "SessionNotFound": 404,
        "UnknownTool": 404,
        "InvalidArgument": 422,
        "InvalidPattern": 422,
        "InvalidStream": 422,
        "CommandNotFound": 422,
        "PathOutOfScope": 422,
        "ProtectedVariable": 422,
        "ProcessAlreadyExited": 409,
        "SessionStillRunning": 409,
        "StdinClosed": 409,
        "NotSupported": 501,
        "PermissionDenied": 403,
        "ApprovalDenied": 403,
        "ElevationDenied": 403,
        "ProcLimit": 429,
        "ResourceLimitExceeded": 422,
        "SpawnFailed": 500,
        "KillFailed": 500,
        "ProcpilotError": 503,
        "SomethingNew": 500,
    }
    assert {code: status_for_error(code) for code in expected} == expected


async def test_event_queue_is_bounded_and_counts_what_it_dropped() -> None:
    from procpilot.transports.http.events import EventQueue

    queue = EventQueue(maxsize=3)
    for n in range(10):
        queue.put("exit", {"n": n})
    assert [data["n"] for _kind, data in queue.items] == [7, 8, 9]
    assert queue.dropped == 7
