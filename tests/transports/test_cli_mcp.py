"""`procpilot mcp` as a real subprocess: stdio with the SDK's client, streamable HTTP, shutdown by signal."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from tests.conftest import marked_processes, marked_processes_soon
from tests.daemon import cli_env

PROCPILOT = str(Path(sys.executable).parent / "procpilot")


def server_env(tmp_path: Path) -> dict[str, str]:
    return cli_env(HOME=str(tmp_path), PROCPILOT_STATE_DIR=str(tmp_path / "state"), PROCPILOT_WORKSPACE=str(tmp_path))


async def call(client: Client, tool: str, **args: Any) -> dict[str, Any]:
    result = await client.call_tool(tool, args)
    return result.structured_content or {}


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_stdio_server_runs_tools(tmp_path: Path, mode: str) -> None:
    params = StdioServerParameters(command=PROCPILOT, args=["mcp", "--agent", "a1"], env=server_env(tmp_path))
    async with Client(params, mode=mode) as client:
        names = {t.name for t in (await client.list_tools()).tools}
        assert {"exec", "process"} <= names
        done = await call(client, "exec", command="echo via-stdio")
        assert done["status"] == "done"
        assert done["output"] == "via-stdio\n"
        bg = await call(client, "exec", command="sleep 30", background=True)
        listing = await call(client, "process", action="list")
        assert bg["sessionId"] in {s["sessionId"] for s in listing["sessions"]}
    # The client closed stdin: the server shut down and ended the background tree with it.
    deadline = time.monotonic() + 10
    while marked_processes() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not marked_processes()


async def test_workspace_option_beats_the_environment(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    args = ["mcp", "--agent", "a1", "--workspace", str(project)]
    async with Client(StdioServerParameters(command=PROCPILOT, args=args, env=server_env(tmp_path))) as client:
        assert (await call(client, "exec", command="pwd"))["output"] == f"{project}\n"
        escaped = await client.call_tool("exec", {"command": "pwd", "workdir": str(tmp_path)})
        assert escaped.is_error  # the workspace is also the bound: its parent is outside


def start_http(tmp_path: Path, *options: str) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [PROCPILOT, "mcp", "--http", "--port", "0", "--agent", "h1", *options],
        env=server_env(tmp_path),
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stderr is not None
    for _ in range(200):
        line = proc.stderr.readline()
        found = re.search(r"(http://127\.0\.0\.1:\d+/mcp)", line)
        if found:
            return proc, found.group(1)
    proc.kill()
    proc.wait()
    raise AssertionError("server did not print its URL")


def stop_http(proc: subprocess.Popen[str], sig: int = signal.SIGTERM) -> int:
    """Signal the server and wait for it (killed if it outlives 20 s); its exit code."""
    try:
        proc.send_signal(sig)
        return proc.wait(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        assert proc.stderr is not None
        proc.stderr.close()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGQUIT])
async def test_http_server_and_shutdown_by_signal_end_every_tree(tmp_path: Path, sig: int) -> None:
    proc, url = start_http(tmp_path)
    try:
        async with Client(url) as client:
            done = await call(client, "exec", command="echo via-http")
            assert done["output"] == "via-http\n"
            bg = await call(client, "exec", command="sleep 60 & sleep 60", background=True)
            assert bg["status"] == "running"
        assert marked_processes_soon()
    finally:
        code = stop_http(proc, sig)
    assert code == 0
    assert not marked_processes()


async def test_http_server_keeps_each_conversation_to_itself_when_told(tmp_path: Path) -> None:
    """Issue 23: `procpilot mcp --http` ignored `[tools] isolate_conversations`: a second MCP
    session of the same agent listed, polled and killed the first one's sessions."""
    config = tmp_path / "isolated.toml"
    config.write_text("[tools]\nisolate_conversations = true\n")
    proc, url = start_http(tmp_path, "--config", str(config))
    try:
        async with Client(url, mode="legacy") as a, Client(url, mode="legacy") as b:
            sid = (await call(a, "exec", command="sleep 30", background=True))["sessionId"]
            assert sid not in json.dumps(await call(b, "process", action="list"))
            for action in ("poll", "kill"):
                refused = await b.call_tool("process", {"action": action, "sessionId": sid})
                assert refused.is_error and (refused.structured_content or {})["error"] == "SessionNotFound"
            assert (await call(a, "process", action="poll", sessionId=sid))["status"] == "running"
            assert sid in json.dumps(await call(a, "process", action="list"))
            await a.call_tool("process", {"action": "remove", "sessionId": sid})
    finally:
        stop_http(proc)


def test_bad_config_is_a_clear_error_not_a_traceback(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[tools.exec]\nbackgroundMS = 5\n")
    argv = [PROCPILOT, "mcp", "--config", str(bad)]
    result = subprocess.run(argv, env=server_env(tmp_path), capture_output=True, text=True, timeout=30, check=False)
    assert result.returncode == 2
    assert "ConfigError" in result.stderr
    assert "backgroundMS" in result.stderr
    assert "Traceback" not in result.stderr


def test_http_off_the_loopback_without_tokens_refuses_to_start(tmp_path: Path) -> None:
    argv = [PROCPILOT, "mcp", "--http", "--host", "0.0.0.0", "--port", "0"]  # noqa: S104
    result = subprocess.run(argv, env=server_env(tmp_path), capture_output=True, text=True, timeout=30, check=False)
    assert result.returncode == 2
    assert "ServeRefused" in result.stderr and "tokens" in result.stderr
    assert "Traceback" not in result.stderr


_INIT = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
}
_MCP_HEADERS = {"accept": "application/json, text/event-stream", "content-type": "application/json"}


def test_http_checks_host_and_origin_on_the_loopback(tmp_path: Path) -> None:
    import httpx2

    proc, url = start_http(tmp_path)
    try:
        with httpx2.Client(timeout=30) as http:
            port = url.split(":")[2].split("/")[0]
            rebound = http.post(url, json=_INIT, headers={**_MCP_HEADERS, "Host": f"evil.example:{port}"})
            assert rebound.status_code == 403
            cross_site = http.post(url, json=_INIT, headers={**_MCP_HEADERS, "Origin": "http://evil.example"})
            assert cross_site.status_code == 403
            assert http.post(url, json=_INIT, headers=_MCP_HEADERS).status_code == 200
    finally:
        assert stop_http(proc) == 0


def test_http_off_the_loopback_needs_a_token(tmp_path: Path) -> None:
    import httpx2

    config = tmp_path / "tokens.toml"
    config.write_text('[server.tokens]\n"tok-remote-0123456789" = "remote"\n')
    proc = subprocess.Popen(
        [PROCPILOT, "mcp", "--http", "--host", "0.0.0.0", "--port", "0", "--config", str(config)],  # noqa: S104
        env=server_env(tmp_path),
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stderr is not None
        port = None
        for _ in range(200):
            found = re.search(r"http://0\.0\.0\.0:(\d+)/mcp", proc.stderr.readline())
            if found:
                port = found.group(1)
                break
        assert port, "server did not print its URL"
        url = f"http://127.0.0.1:{port}/mcp"
        with httpx2.Client(timeout=30) as http:
            assert http.post(url, json=_INIT, headers=_MCP_HEADERS).status_code == 401
            wrong = {**_MCP_HEADERS, "Authorization": "Bearer nope"}
            assert http.post(url, json=_INIT, headers=wrong).status_code == 401
            right = {**_MCP_HEADERS, "Authorization": "Bearer tok-remote-0123456789"}
            assert http.post(url, json=_INIT, headers=right).status_code == 200
    finally:
        assert stop_http(proc) == 0


async def test_stdio_server_keeps_the_audit_trail(tmp_path: Path) -> None:
    import json

    params = StdioServerParameters(command=PROCPILOT, args=["mcp", "--agent", "auditor"], env=server_env(tmp_path))
    async with Client(params, mode="legacy") as client:
        await call(client, "exec", command="echo audited")
    lines = (tmp_path / "state" / "audit.jsonl").read_text().splitlines()
    events = [json.loads(line) for line in lines]
    assert any(e["scope"] == "auditor" and e["tool"] == "exec" and e["outcome"] == "ok" for e in events), events
    assert ((tmp_path / "state" / "audit.jsonl").stat().st_mode & 0o777) == 0o600


async def test_tool_names_and_sets_for_every_model_api(tmp_path: Path) -> None:
    # OpenAI's function names allow no dots; and two overlapping tool sets cost schema per request.
    args = ["mcp", "--agent", "a1", "--tool-names", "underscore", "--tools", "exec,process.*"]
    async with Client(StdioServerParameters(command=PROCPILOT, args=args, env=server_env(tmp_path))) as client:
        names = {t.name for t in (await client.list_tools()).tools}
        assert names == {"exec", "process_run", "process_monitor", "process_kill", "process_list", "process_logs"}
        run = await call(client, "process_run", command="echo", args=["renamed"])
        assert run["stdout_summary"] == "renamed\n"


async def test_the_process_tool_switched_off_leaves_exec_alone_in_the_foreground(tmp_path: Path) -> None:
    # docs/tools.md: with [tools.process] enabled = false exec runs every command to its end and
    # no process tool is offered (the default tool set asked for one, and the server refused to start).
    config = tmp_path / "procpilot.toml"
    config.write_text("[tools.process]\nenabled = false\n")
    args = ["mcp", "--agent", "a1", "--config", str(config)]
    async with Client(StdioServerParameters(command=PROCPILOT, args=args, env=server_env(tmp_path))) as client:
        assert {t.name for t in (await client.list_tools()).tools} == {"exec"}
        done = await call(client, "exec", command="sleep 0.3; echo waited", background=True)
        assert done["status"] == "done" and done["output"] == "waited\n"


def test_an_unknown_tool_set_is_a_clean_config_error(tmp_path: Path) -> None:
    done = subprocess.run(
        [PROCPILOT, "mcp", "--tools", "exec,nosuch"],
        env=server_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode != 0 and "nosuch" in done.stderr and "Traceback" not in done.stderr


def test_stdio_reads_messages_however_the_client_writes_them(tmp_path: Path) -> None:
    # A bare client on pipes (the server reads them on its event loop): two requests in one write,
    # one request split over three, a line that is no JSON (answered with a parse error, and the
    # server serves on), then stdin closed: the server ends.
    server = subprocess.Popen(
        [PROCPILOT, "mcp", "--agent", "bare"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=server_env(tmp_path),
    )
    assert server.stdin is not None and server.stdout is not None

    def send(raw: bytes) -> None:
        assert server.stdin is not None
        server.stdin.write(raw)
        server.stdin.flush()

    def reply() -> dict[str, Any]:
        assert server.stdout is not None
        return dict(json.loads(server.stdout.readline()))

    try:
        hello = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}
        send(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": hello}).encode() + b"\n")
        assert reply()["id"] == 1
        send(b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n')
        send(b'{"jsonrpc":"2.0","id":2,"method":"ping"}\n{"jsonrpc":"2.0","id":3,"method":"ping"}\n')
        assert [reply()["id"], reply()["id"]] == [2, 3]
        send(b"this is not json\n")
        refused = reply()
        assert refused["id"] is None and refused["error"]["code"] == -32700, refused
        call = {"jsonrpc": "2.0", "id": 4, "method": "tools/call"}
        call["params"] = {"name": "exec", "arguments": {"command": "printf 'a\\nb'"}}
        raw = json.dumps(call).encode() + b"\n"
        for part in (raw[:5], raw[5:40], raw[40:]):
            send(part)
            time.sleep(0.05)
        done = reply()
        assert done["id"] == 4 and done["result"]["structuredContent"]["output"] == "a\nb"
    finally:
        server.stdin.close()
        assert server.wait(timeout=30) == 0
        server.stdout.close()
