"""WS /v1/proc: the proc/* protocol live over a WebSocket, backpressure, and the streaming client."""

from __future__ import annotations

import asyncio
import json
import socket
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from websockets.asyncio.client import ClientConnection, connect, unix_connect
from websockets.exceptions import InvalidStatus

from procpilot.client import ProcsClient, Unauthorized
from procpilot.errors import SessionNotFound
from tests.daemon import TOKEN_A, TOKEN_B, Served, start_daemon

PY = sys.executable


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    daemon = start_daemon(tmp_path_factory.mktemp("ws"))
    yield daemon
    assert daemon.stop() == 0, daemon.log_text()


def ws_url(served: Served) -> str:
    return served.url.replace("http://", "ws://") + "/v1/proc"


async def open_ws(served: Served, token: str | None = TOKEN_A, **kw: Any) -> ClientConnection:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return await connect(ws_url(served), additional_headers=headers, **kw)


async def request(ws: ClientConnection, message: dict[str, Any]) -> dict[str, Any]:
    """Send and read frames until the response with this id (events before it are returned in it)."""
    await ws.send(json.dumps(message))
    events = []
    while True:
        frame = json.loads(await asyncio.wait_for(ws.recv(), 30))
        if frame.get("id") == message.get("id") and not frame["type"].endswith("/event"):
            frame["_events"] = events
            return frame
        events.append(frame)


async def until_exit(ws: ClientConnection, proc_id: str, events: list[dict[str, Any]]) -> dict[str, Any]:
    while True:
        frame = json.loads(await asyncio.wait_for(ws.recv(), 30))
        if frame.get("type") == "proc/exit/event" and frame["proc_id"] == proc_id:
            return frame
        events.append(frame)


async def test_spawn_streams_output_live_and_in_order(served: Served) -> None:
    # One write a line: print() under the PYTHONUNBUFFERED sessions get writes "tick 0" and "\n" apart,
    # and the stream pushes each write as it comes.
    script = "import os,time\nfor i in range(5):\n    os.write(1, f'tick {i}\\n'.encode())\n    time.sleep(0.2)\n"
    async with await open_ws(served) as ws:
        resp = await request(ws, {"type": "proc/spawn/req", "id": "1", "cmd": [PY, "-c", script]})
        assert resp["type"] == "proc/spawn/resp" and resp["state"] == "RUNNING"
        proc_id = resp["proc_id"]
        # The first line arrives while the process is still running: pushed, not polled.
        first = json.loads(await asyncio.wait_for(ws.recv(), 10))
        assert first["type"] == "proc/read/event" and first["data"] == "tick 0\n" and first["offset"] == 0
        status = await request(ws, {"type": "proc/status/req", "id": "2", "proc_id": proc_id})
        assert status["state"] == "RUNNING"
        events = [first, *status["_events"]]
        end = await until_exit(ws, proc_id, events)
        assert end["state"] == "STOPPED" and end["exit_code"] == 0
        reads = [e for e in events if e["type"] == "proc/read/event"]
        assert "".join(e["data"] for e in reads) == "".join(f"tick {i}\n" for i in range(5))
        assert [e["seq"] for e in reads] == list(range(len(reads)))


async def test_write_kill_and_errors(served: Served) -> None:
    async with await open_ws(served) as ws:
        resp = await request(ws, {"type": "proc/spawn/req", "id": "s", "cmd": ["cat"]})
        proc_id = resp["proc_id"]
        wrote = await request(ws, {"type": "proc/write/req", "id": "w", "proc_id": proc_id, "data": "echoed\n"})
        assert wrote["bytes_written"] == 7
        events = list(wrote["_events"])
        while not any(e.get("data") == "echoed\n" for e in events):
            events.append(json.loads(await asyncio.wait_for(ws.recv(), 10)))
        killed = await request(ws, {"type": "proc/kill/req", "id": "k", "proc_id": proc_id, "signal": "SIGKILL"})
        assert killed["state"] == "STOPPED"
        again = await request(ws, {"type": "proc/kill/req", "id": "k2", "proc_id": proc_id})
        assert again["error"]["code"] == "proc_dead"
        missing = await request(ws, {"type": "proc/status/req", "id": "m", "proc_id": "nosuchproc000000"})
        assert missing["error"]["code"] == "unknown_proc"
        bad = await request(ws, {"type": "proc/fly/req", "id": "b"})
        assert bad["error"]["code"] == "invalid_request"
        await ws.send("not json")
        frame = json.loads(await asyncio.wait_for(ws.recv(), 10))
        while frame.get("type") != "proc/error":
            frame = json.loads(await asyncio.wait_for(ws.recv(), 10))
        assert frame["error"]["code"] == "invalid_request"


async def _small_buffer_ws(served: Served) -> ClientConnection:
    """A client that takes little into its buffers, so a pause in reading reaches the daemon fast."""
    host, port = served.url.removeprefix("http://").split(":")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect((host, int(port)))
    headers = {"Authorization": f"Bearer {TOKEN_A}"}
    return await connect(ws_url(served), sock=sock, additional_headers=headers, max_queue=1, max_size=2**24)


async def test_slow_reader_is_told_what_it_missed_and_pages_it(served: Served) -> None:
    # Six processes print 1 MB each of random text (WebSocket compression cannot shrink it) in
    # small flushed lines to a client that reads nothing for a while: more than the socket buffers
    # hold. The daemon must not queue the rest: it drops events and says which bytes it dropped.
    script = (
        "import base64, os, sys, time\nfor i in range(10000):\n"
        "    sys.stdout.write(base64.b64encode(os.urandom(74)).decode() + '\\n'); sys.stdout.flush()\n"
        "    time.sleep(0.0002)\n"
    )
    procs = 6
    async with await _small_buffer_ws(served) as ws:
        for n in range(procs):
            await ws.send(json.dumps({"type": "proc/spawn/req", "id": f"s{n}", "cmd": [PY, "-c", script]}))
        ws.transport.pause_reading()  # read nothing: our socket buffer fills, then the daemon's
        await asyncio.sleep(10)  # the processes finish long before we read
        ws.transport.resume_reading()
        frames = []
        exits = set()
        while len(exits) < procs:
            frame = json.loads(await asyncio.wait_for(ws.recv(), 30))
            frames.append(frame)
            if frame["type"] == "proc/exit/event":
                exits.add(frame["proc_id"])
        lags = [f for f in frames if f["type"] == "proc/lagged/event"]
        assert lags, "a reader that fell behind must be told"
        for proc_id in exits:
            # Rebuild each stream: events where we have them, missed byte ranges paged from the log.
            text = ""
            for frame in frames:
                if frame.get("proc_id") != proc_id or frame.get("stream_type") != "stdout":
                    continue
                if frame["type"] == "proc/read/event":
                    assert frame["offset"] == len(text.encode())
                    text += frame["data"]
                elif frame["type"] == "proc/lagged/event":
                    assert frame["offset"] == len(text.encode())
                    text += await _page(ws, proc_id, len(text.encode()), frame["bytes"])
            # What came live plus what was paged is the whole log, in order, nothing twice.
            assert text == await _page(ws, proc_id, 0, 10000 * 101)


async def _page(ws: ClientConnection, proc_id: str, offset: int, need: int) -> str:
    text = ""
    while need > 0:
        message = {
            "type": "proc/log/req",
            "id": f"log{offset}",
            "proc_id": proc_id,
            "stream_type": "stdout",
            "offset": offset,
            "limit": need,
        }
        page = await request(ws, message)
        assert page["offset"] == offset
        got = page["next_offset"] - offset
        assert got > 0
        text += page["data"]
        offset += got
        need -= got
    return text


async def test_other_agents_processes_are_unknown(served: Served) -> None:
    async with await open_ws(served, TOKEN_A) as a, await open_ws(served, TOKEN_B) as b:
        resp = await request(a, {"type": "proc/spawn/req", "id": "1", "cmd": ["sleep", "30"]})
        proc_id = resp["proc_id"]
        for message in (
            {"type": "proc/status/req", "proc_id": proc_id},
            {"type": "proc/write/req", "proc_id": proc_id, "data": "x"},
            {"type": "proc/kill/req", "proc_id": proc_id, "signal": "SIGKILL"},
            {"type": "proc/log/req", "proc_id": proc_id, "stream_type": "stdout", "offset": 0},
        ):
            answer = await request(b, {**message, "id": "x"})
            assert answer["error"]["code"] == "unknown_proc", answer
        status = await request(a, {"type": "proc/status/req", "id": "2", "proc_id": proc_id})
        assert status["state"] == "RUNNING"
        await request(a, {"type": "proc/kill/req", "id": "3", "proc_id": proc_id, "signal": "SIGKILL"})


async def test_websocket_needs_a_token(served: Served) -> None:
    for token in (None, "wrong-token"):
        with pytest.raises(InvalidStatus) as caught:
            await open_ws(served, token)
        assert caught.value.response.status_code == 401
    with pytest.raises(Unauthorized):
        async with ProcsClient(served.url, "wrong-token"):
            pass


async def test_streaming_client(served: Served) -> None:
    seen: list[tuple[str, str]] = []
    async with ProcsClient(served.url, TOKEN_A) as procs:
        proc = await procs.spawn(
            "for i in 1 2 3; do echo out$i; echo err$i >&2; sleep 0.05; done; exit 5",
            on_output=lambda stream, text: seen.append((stream, text)),
        )
        end = await proc.wait(30)
        assert (end.state, end.exit_code) == ("CRASHED", 5)
        assert "".join(t for s, t in seen if s == "stdout") == "out1\nout2\nout3\n"
        assert "".join(t for s, t in seen if s == "stderr") == "err1\nerr2\nerr3\n"

        cat = await procs.spawn(["cat"])
        assert await cat.write("hello\n", eof=True) == 6
        await cat.wait(30)
        assert cat.stdout == "hello\n"

        sleeper = await procs.spawn(["sleep", "30"])
        assert (await sleeper.status())["state"] == "RUNNING"
        await sleeper.kill("SIGKILL")
        assert (await sleeper.wait(30)).state == "STOPPED"
        with pytest.raises(SessionNotFound):
            await procs.request({"type": "proc/status/req", "proc_id": "nosuchproc000000"})


async def test_streaming_client_gets_everything_from_a_flood(served: Served) -> None:
    # More than the daemon pushes (1 MiB) and faster than a slow consumer takes it: still complete.
    script = "import sys\nfor i in range(30000):\n    sys.stdout.write(f'{i:07d} ' + 'y' * 56 + '\\n')\n"
    expected = "".join(f"{i:07d} " + "y" * 56 + "\n" for i in range(30000))
    chunks: list[str] = []

    async def slow(stream: str, text: str) -> None:
        chunks.append(text)
        if len(chunks) % 50 == 0:
            await asyncio.sleep(0.01)

    async with ProcsClient(served.url, TOKEN_A, max_queued=64) as procs:
        proc = await procs.spawn([PY, "-c", script], on_output=slow)
        await proc.wait(60)
    assert "".join(chunks) == expected


async def test_streaming_client_over_the_unix_socket(served: Served) -> None:
    assert served.unix_socket
    async with ProcsClient(f"unix://{served.unix_socket}", TOKEN_A) as procs:
        proc = await procs.spawn(["echo", "via-unix"])
        await proc.wait(30)
        assert proc.stdout == "via-unix\n"
    headers = {"Authorization": f"Bearer {TOKEN_B}"}
    async with await unix_connect(served.unix_socket, "ws://localhost/v1/proc", additional_headers=headers) as ws:
        resp = await request(ws, {"type": "proc/spawn/req", "id": "1", "cmd": ["true"]})
        assert resp["state"] in ("RUNNING", "STOPPED")


async def test_spec_003_procs_api_over_the_websocket(served: Served) -> None:
    from procpilot.client import WebSocketTransport
    from procpilot.faces.procs_client import ProcsAPI

    seen: list[str] = []
    both = asyncio.Event()

    def on_output(event: Any) -> None:
        seen.append(event.data)
        if "".join(seen) == "a\nb\n":
            both.set()

    async with WebSocketTransport(served.url, TOKEN_A) as transport:
        procs = ProcsAPI(transport)
        started = await procs.spawn(["sh", "-c", "echo a; sleep 0.2; echo b"], on_output=on_output)
        status = await procs.wait(started.proc_id or "", timeout=20)
        assert status.state.value == "STOPPED"
        await asyncio.wait_for(both.wait(), 10)  # the events travel beside the status responses
        assert "".join(seen) == "a\nb\n"
        procs.close()


async def test_proc_section_configures_the_websocket_handler(tmp_path_factory: pytest.TempPathFactory) -> None:
    """[proc] reaches each connection's handler: here a 1 s default timeout, one process at a time,
    and an allowlist (spec 003's defaults would give 30 s, 10 processes, any command)."""
    extra = '[proc]\ntimeout = 1\nmax_procs = 1\nallowed_commands = ["sleep", "cat"]\n'
    daemon = await asyncio.to_thread(start_daemon, tmp_path_factory.mktemp("wsproc"), extra=extra)
    try:
        async with await open_ws(daemon) as ws:
            first = await request(ws, {"type": "proc/spawn/req", "id": "1", "cmd": ["sleep", "20"]})
            assert first["state"] == "RUNNING", first
            second = await request(ws, {"type": "proc/spawn/req", "id": "2", "cmd": ["cat"]})
            assert second["error"]["code"] == "proc_limit", second
            end = await asyncio.wait_for(until_exit(ws, first["proc_id"], []), 20)
            assert end["state"] == "TIMEDOUT"  # the configured 1 s, not 30 s (the wait is 30 s at most)
            refused = await request(ws, {"type": "proc/spawn/req", "id": "3", "cmd": ["echo", "x"]})
            assert refused.get("error"), refused
    finally:
        assert await asyncio.to_thread(daemon.stop) == 0, daemon.log_text()
