"""One agent must never stall, exhaust or see through the shared daemon: each finding of the
adversarial review, reproduced against a real `procpilot serve`."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import socket
import struct
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest

from procpilot.errors import InvalidArgument
from tests.daemon import TOKEN_A, TOKEN_B, Served, cleanup, post, start_daemon

PY = sys.executable
# agent-b runs under an allowlist, so its commands go through the policy's shell analysis.
POLICY = """
[policy.agents.agent-b]
allow = ["echo", "ls", "cat", "true"]
"""


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    daemon = start_daemon(tmp_path_factory.mktemp("hardening"), extra=POLICY)
    yield daemon
    assert daemon.stop() == 0, daemon.log_text()


def test_a_huge_command_is_refused_at_once(served: Served) -> None:
    with served.http(TOKEN_A) as c:
        started = time.monotonic()
        refused = post(c, "exec", command="echo " + "A" * 1_000_000)
        assert refused.status_code == 422, refused.text
        body = refused.json()
        assert body["error"] == "InvalidArgument" and "longer than" in body["message"]
        assert time.monotonic() - started < 5  # was 12 s of a stalled event loop


def test_refused_huge_commands_are_not_kept_by_the_audit_trail(served: Served) -> None:
    # Each call's audit event (kept in memory: the console's ring, listeners' queues) held the
    # whole arguments: 80 refused 1 MB commands grew the daemon by 80 MB, never given back.
    with served.http(TOKEN_A) as c:
        post(c, "exec", command="echo " + "A" * 1_000_000)  # the allocator's first growth
        before = rss_mib(served.proc.pid)
        for _ in range(80):
            assert post(c, "exec", command="echo " + "A" * 1_000_000).status_code == 422
        assert rss_mib(served.proc.pid) - before < 40
    audit = served.root / "state" / "audit.jsonl"
    last = json.loads(audit.read_text().splitlines()[-1])
    assert last["arguments"]["command"].endswith("more chars]") and len(json.dumps(last)) < 8192


def test_big_commands_do_not_stall_a_quiet_agent(served: Served) -> None:
    # The largest command the kernel takes, analysed by the allowlist policy over and over, while
    # another agent calls: its calls are answered as they come (generous bound: a shared CI box).
    stop = threading.Event()

    def noisy() -> None:
        with served.http(TOKEN_B) as c:
            while not stop.is_set():
                post(c, "exec", command="echo a" + " | cat" * 20_000)

    threads = [threading.Thread(target=noisy) for _ in range(2)]
    for thread in threads:
        thread.start()
    try:
        time.sleep(0.5)
        with served.http(TOKEN_A) as c:
            for _ in range(5):
                started = time.monotonic()
                assert post(c, "process", action="list").status_code == 200
                assert time.monotonic() - started < 2
    finally:
        stop.set()
        for thread in threads:
            thread.join(60)
        with served.http(TOKEN_B) as c:
            cleanup(c)


@pytest.mark.parametrize("token", [TOKEN_A, TOKEN_B], ids=["no-policy", "allowlist"])
def test_deeply_nested_substitutions_are_invalid_arguments(served: Served, token: str) -> None:
    with served.http(token) as c:
        nested = post(c, "exec", command="echo " + "$(" * 2000 + "echo x" + ")" * 2000)
        assert nested.status_code == 422, nested.text
        assert nested.json()["error"] == "InvalidArgument"
        cleanup(c)


def test_a_command_the_policy_cannot_analyse_is_a_403(served: Served) -> None:
    with served.http(TOKEN_B) as c:
        refused = post(c, "exec", command='x=ls; eval "$x"')
        assert refused.status_code == 403, refused.text
        assert refused.json()["error"] == "UnanalyzableCommand"


def test_assignments_from_substitutions_run(served: Served) -> None:
    with served.http(TOKEN_A) as c:
        done = post(c, "exec", command="x=$(echo a b); echo $x").json()["data"]
        assert (done["status"], done["output"]) == ("done", "a b\n")
        missing = post(c, "exec", command="VAR=$(echo a) nosuchprog-xyz").json()["data"]
        assert missing["exitCode"] == 127 and missing["commandNotFound"] == "nosuchprog-xyz"
        cleanup(c)


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


def never_reading_websocket(served: Served, token: str) -> socket.socket:
    """A WebSocket client as a hostile one writes it: it upgrades, then only ever sends. (A client
    library keeps reading into its own buffers; this one leaves every byte in the kernel.)"""
    host, port = served.url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall(
        f"GET /v1/proc HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\nAuthorization: Bearer {token}\r\n\r\n".encode()
    )
    head = b""
    while b"\r\n\r\n" not in head:
        head += sock.recv(1)
    assert b" 101 " in head.split(b"\r\n")[0], head
    return sock


def masked_text_frame(data: bytes) -> bytes:
    mask = os.urandom(4)
    size = bytes([0x80 | len(data)]) if len(data) < 126 else bytes([0x80 | 126]) + struct.pack("!H", len(data))
    return b"\x81" + size + mask + bytes(byte ^ mask[i % 4] for i, byte in enumerate(data))


def test_a_websocket_that_never_reads_cannot_grow_the_daemon(served: Served) -> None:
    with served.http(TOKEN_A) as c:
        big = post(c, "exec", command="head -c 2097152 /dev/zero | tr '\\0' x").json()["data"]
    before = rss_mib(served.proc.pid)
    for _ in range(3):  # memory must come back after each round, not pile up
        sock = never_reading_websocket(served, TOKEN_A)
        sock.settimeout(2)
        with contextlib.suppress(TimeoutError):  # back-pressure: the daemon stopped reading us
            for n in range(500):
                page = {"type": "proc/log/req", "id": n, "proc_id": big["sessionId"], "stream_type": "stdout"}
                sock.sendall(masked_text_frame(json.dumps({**page, "offset": 0, "limit": 1 << 20}).encode()))
        time.sleep(2)
        assert rss_mib(served.proc.pid) - before < 150  # was +500 MB a round (every answer queued)
        sock.close()
        time.sleep(1)
    assert rss_mib(served.proc.pid) - before < 100  # was 1.5 GB after three rounds, never given back
    with served.http(TOKEN_A) as c:  # and it still serves
        assert post(c, "exec", command="echo alive").json()["data"]["output"] == "alive\n"
        cleanup(c)


# -- bounds on what enters ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def bounded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    server = "mcp_sessions_per_agent = 3\nmcp_session_idle_sec = 2\nwebsockets_per_agent = 2\nrequests_per_agent = 2"
    daemon = start_daemon(tmp_path_factory.mktemp("bounded"), server=server)
    yield daemon
    assert daemon.stop() == 0, daemon.log_text()


def test_a_body_over_the_limit_is_a_413_before_it_is_read(bounded: Served) -> None:
    with bounded.http(TOKEN_A) as c:
        big = c.post("/v1/tools/exec", json={"command": "true", "env": {"X": "y" * 2_000_000}})
        assert big.status_code == 413 and big.json()["error"] == "RequestTooLarge"

        def chunks() -> Iterator[bytes]:  # no Content-Length: the daemon must count for itself
            yield b'{"command": "true", "env": {"X": "'
            for _ in range(40):
                yield b"y" * 65536
            yield b'"}}'

        chunked = c.post("/v1/tools/exec", content=chunks(), headers={"Content-Type": "application/json"})
        assert chunked.status_code == 413 and chunked.json()["error"] == "RequestTooLarge"


def test_a_deeply_nested_body_is_a_json_422(bounded: Served) -> None:
    with bounded.http(TOKEN_A) as c:
        deep = c.post(
            "/v1/tools/exec", content=b"[" * 200_000 + b"]" * 200_000, headers={"Content-Type": "application/json"}
        )
        assert deep.status_code == 422 and deep.json()["error"] == "InvalidArgument"


@pytest.mark.parametrize("host", ["localhost:evil.example", "localhost.evil.example", "127.0.0.1.evil", "evil"])
def test_the_host_check_is_exact(bounded: Served, host: str) -> None:
    with bounded.http(TOKEN_A) as c:
        assert c.get("/v1/tools", headers={"Host": host}).status_code == 403
        assert c.get("/v1/tools", headers={"Host": "localhost:8765"}).status_code == 200


@pytest.mark.parametrize(
    ("tool", "arguments"),
    [
        ("exec", {"command": "true", "timeout": int("9" * 400)}),
        ("exec", {"command": "true", "timeout": 1e308}),
        ("exec", {"command": "true", "workdir": "a\0b"}),
        ("process.run", {"command": "true", "cpu_limit": 1e308}),
        ("process.run", {"command": "true", "working_directory": "a\0b"}),
        ("process", {"action": "log", "sessionId": "x", "offset": int("9" * 400)}),
        ("process", {"action": "wait", "sessionId": "x", "pattern": "a" * 100_000}),
    ],
)
def test_absurd_numbers_and_nul_bytes_are_invalid_arguments(
    bounded: Served, tool: str, arguments: dict[str, object]
) -> None:
    with bounded.http(TOKEN_A) as c:
        refused = post(c, tool, **arguments)
        assert refused.status_code == 422, refused.text
        assert refused.json()["error"] == "InvalidArgument"


async def test_a_nul_in_a_websocket_cwd_is_an_invalid_request(bounded: Served) -> None:
    from procpilot.client import ProcsClient

    async with ProcsClient(bounded.url, TOKEN_A) as procs:
        with pytest.raises(InvalidArgument):
            await procs.spawn(["true"], cwd="a\0b")


def mcp_initialize(served: Served, token: str) -> httpx2.Response:
    message = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
    }
    headers = {**served.headers(token), "Accept": "application/json, text/event-stream"}
    return httpx2.post(served.url + "/mcp", json=message, headers=headers, timeout=30)


def test_mcp_sessions_are_capped_per_agent_and_expire_when_idle(bounded: Served) -> None:
    opened = [mcp_initialize(bounded, TOKEN_A) for _ in range(3)]
    assert all(r.status_code == 200 and r.headers.get("mcp-session-id") for r in opened)
    refused = mcp_initialize(bounded, TOKEN_A)
    assert refused.status_code == 429 and refused.json()["error"] == "TooManyConnections"
    assert mcp_initialize(bounded, TOKEN_B).status_code == 200  # another agent is not held up
    time.sleep(4)  # idle past mcp_session_idle_sec: the SDK closes them, the cap forgets them
    assert mcp_initialize(bounded, TOKEN_A).status_code == 200


async def test_proc_websockets_are_capped_per_agent(bounded: Served) -> None:
    import websockets

    url = bounded.url.replace("http://", "ws://") + "/v1/proc"
    headers = {"Authorization": f"Bearer {TOKEN_A}"}
    async with websockets.connect(url, additional_headers=headers), websockets.connect(url, additional_headers=headers):
        with pytest.raises(websockets.InvalidStatus) as refused:
            await websockets.connect(url, additional_headers=headers)
        assert refused.value.response.status_code == 429
        b_headers = {"Authorization": f"Bearer {TOKEN_B}"}
        async with websockets.connect(url, additional_headers=b_headers):
            pass


def test_a_full_state_disk_is_said_and_the_daemon_serves_on(tmp_path: Path) -> None:
    from tests.engine.test_diskfull import fill, small_tmpfs

    with small_tmpfs(tmp_path / "daemon" / "state") as state:
        daemon = start_daemon(tmp_path / "daemon")
        try:
            filler = fill(state)
            with daemon.http(TOKEN_A) as c:
                small = post(c, "exec", command="echo small").json()
                assert small["data"]["outputDropped"] == 6 and "lost" in small["text"]
                space = c.get("/v1/capabilities").json()["state_dir"]
                assert space["free_bytes"] is not None and space["warning"]
                filler.unlink()
                assert post(c, "exec", command="echo again").json()["data"]["output"] == "again\n"
                cleanup(c)
        finally:
            assert daemon.stop() == 0, daemon.log_text()


# -- an isolated box is a box ------------------------------------------------------------------


@pytest.fixture(scope="module")
def boxed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """agent-b in a box. The daemon's files live outside /tmp (whose box is private anyway), so
    that what hides them is the box's own doing."""
    from procpilot.engine.isolation import isolation_capabilities

    if isolation_capabilities()["private_box"] is None:
        pytest.skip("a private box needs bubblewrap")
    root = Path(tempfile.mkdtemp(prefix="procpilot-box-", dir="/var/tmp"))
    try:
        daemon = start_daemon(root, extra="[policy.agents.agent-b]\nisolate = true\n")
        yield daemon
        assert daemon.stop() == 0, daemon.log_text()
    finally:
        shutil.rmtree(root, ignore_errors=True)


def boxed_run(served: Served, command: str) -> dict[str, Any]:
    with served.http(TOKEN_B) as c:
        data: dict[str, Any] = post(c, "exec", command=command).json()["data"]
        post(c, "process", action="remove", sessionId=data["sessionId"])
        return data


def test_a_box_cannot_read_the_daemons_files(boxed: Served) -> None:
    config = boxed_run(boxed, f"cat {boxed.root}/procpilot.toml")
    assert config["exitCode"] != 0 and TOKEN_A not in config["output"]  # every agent's token is in it
    state = boxed_run(boxed, f"ls -A {boxed.root}/state")
    assert state["exitCode"] == 0 and state["output"] == ""  # no logs, journal, audit or daemon.json
    assert boxed.unix_socket is not None
    unix = boxed_run(boxed, f"{PY} -c \"import socket; socket.socket(socket.AF_UNIX).connect('{boxed.unix_socket}')\"")
    assert unix["exitCode"] != 0


def test_a_box_has_no_route_to_the_daemon(boxed: Served) -> None:
    port = boxed.url.rsplit(":", 1)[1]
    # The system's python: a checkout under /tmp (its .venv) is out of sight in the box's private /tmp.
    py = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else PY
    tcp = boxed_run(boxed, f"{py} -c \"import socket; socket.create_connection(('127.0.0.1', {port}), 2)\"")
    assert tcp["exitCode"] != 0 and "Error" in tcp["output"]


def test_a_box_writes_only_its_workspace_and_tmp(boxed: Served) -> None:
    outside = boxed.root / "written-from-the-box"
    refused = boxed_run(boxed, f"touch {outside}")
    assert refused["exitCode"] != 0 and not outside.exists()
    assert boxed_run(boxed, "touch in-the-workspace && touch /tmp/mine")["exitCode"] == 0
    assert (boxed.root / "ws" / "in-the-workspace").exists()


def test_a_box_cannot_see_or_signal_another_agents_sessions(boxed: Served) -> None:
    with boxed.http(TOKEN_A) as a:
        sleeper = post(a, "exec", command="sleep 60", background=True).json()["data"]
        try:
            killed = boxed_run(boxed, f"kill -9 {sleeper['pid']}")
            assert killed["exitCode"] != 0
            seen = boxed_run(boxed, "ps -eo args")
            assert "sleep 60" not in seen["output"]
            still = post(a, "process", action="poll", sessionId=sleeper["sessionId"]).json()["data"]
            assert still["status"] == "running"
        finally:
            cleanup(a)


def test_one_agents_calls_queue_behind_its_own_not_before_others(bounded: Served) -> None:
    # requests_per_agent = 2: two blocking calls of agent-a fill its share; its third waits for
    # one of them, while agent-b is answered at once.
    with bounded.http(TOKEN_A) as a:
        sleeper = post(a, "exec", command="sleep 3", background=True).json()["data"]

        def wait_for_it() -> None:
            with bounded.http(TOKEN_A) as c:
                post(c, "process", action="wait", sessionId=sleeper["sessionId"], timeout=10_000)

        waits = [threading.Thread(target=wait_for_it) for _ in range(2)]
        for thread in waits:
            thread.start()
        time.sleep(0.5)
        started = time.monotonic()
        with bounded.http(TOKEN_B) as b:
            assert post(b, "process", action="list").status_code == 200
        assert time.monotonic() - started < 1  # agent-b is not behind agent-a's calls
        started = time.monotonic()
        assert post(a, "process", action="list").status_code == 200
        assert time.monotonic() - started > 1  # agent-a's third call waited for one of its own
        for thread in waits:
            thread.join(30)
        cleanup(a)


# -- connections -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    daemon = start_daemon(tmp_path_factory.mktemp("guarded"), server="header_timeout_sec = 1\nmax_connections = 16")
    yield daemon
    assert daemon.stop() == 0, daemon.log_text()


def _connect(served: Served) -> socket.socket:
    host, port = served.url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=15)  # a hang fails the test, late


def _read_response(sock: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536) or b"!eof"
        assert not data.endswith(b"!eof"), data
    head, _, body = data.partition(b"\r\n\r\n")
    fields = dict(line.partition(b": ")[::2] for line in head.lower().split(b"\r\n")[1:])
    length = int(fields[b"content-length"])
    while len(body) < length:
        body += sock.recv(65536)
    return head + b"\r\n\r\n" + body


def test_a_request_head_never_finished_is_closed_by_the_daemon(guarded: Served) -> None:
    # Half a request line, then nothing: without a deadline the connection (and its descriptor)
    # would be held for as long as the client likes. The same for the next head on a kept-alive one.
    host = guarded.url.removeprefix("http://")
    with _connect(guarded) as half:
        half.sendall(f"GET /v1/tools HTTP/1.1\r\nHost: {host}".encode())
        assert half.recv(100) == b""
    with _connect(guarded) as kept:
        kept.sendall(f"GET /v1/tools HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
        assert _read_response(kept).startswith(b"HTTP/1.1 401")  # a whole response: kept alive
        kept.sendall(b"GET /v1/tools HTTP/1.1\r\n")
        assert kept.recv(100) == b""


def test_past_max_connections_a_new_one_is_told_and_closed(guarded: Served) -> None:
    held = [_connect(guarded) for _ in range(16)]
    try:
        with _connect(guarded) as extra:
            refused = _read_response(extra)
        assert refused.startswith(b"HTTP/1.1 503")
        body = json.loads(refused.partition(b"\r\n\r\n")[2])
        assert body["error"] == "TooManyConnections" and "max_connections" in body["message"]
    finally:
        for sock in held:
            sock.close()
    with guarded.http(TOKEN_A) as c:  # the held ones gone, it serves again
        assert post(c, "exec", command="echo back").json()["data"]["output"] == "back\n"
        cleanup(c)
