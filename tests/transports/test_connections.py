"""The daemon's HTTP/1.1 connections (transports/connections.py), through a real uvicorn on a
loopback socket: a client that stops inside a request head is cut off at the deadline (the
first head and each one after a response), and past the cap a new connection gets a 503 with a
typed error before anything is read."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator
from typing import Any

import pytest
import uvicorn

from procpilot.config import ServerSettings
from procpilot.transports.connections import guarded_h11

_REQUEST = b"GET / HTTP/1.1\r\nhost: x\r\n\r\n"


async def _app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    assert scope["type"] == "http"
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


@pytest.fixture
async def port() -> AsyncIterator[int]:
    limits = ServerSettings(header_timeout_sec=0.2, body_timeout_sec=0.2, max_connections=16)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(_app, http=guarded_h11(limits), lifespan="off", log_level="error")
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        await asyncio.sleep(0.01)  # uvicorn offers no event for "listening"
    yield sock.getsockname()[1]
    server.should_exit = True
    await asyncio.wait_for(task, 5)
    sock.close()


async def _answer(reader: asyncio.StreamReader) -> bytes:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    length = int(
        next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length"))
    )
    return head + await reader.readexactly(length)


async def test_a_half_sent_head_is_cut_off_at_the_deadline(port: int) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET / HT")  # and then nothing more
    assert await asyncio.wait_for(reader.read(), 5) == b""  # closed by the server, without an answer
    writer.close()


async def test_an_idle_keep_alive_connection_gets_the_same_deadline_for_its_next_head(port: int) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(_REQUEST)
    assert (await _answer(reader)).endswith(b"ok")  # a whole request is served as usual
    assert await asyncio.wait_for(reader.read(), 5) == b""  # then no next head: closed
    writer.close()


async def test_past_the_cap_a_connection_gets_a_typed_503(port: int) -> None:
    held = []
    for _ in range(16):  # each served once, so the server counts every one as open
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(_REQUEST)
        await _answer(reader)
        held.append(writer)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    answer = await asyncio.wait_for(reader.read(), 5)  # answered and closed before it sends a byte
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 503 ")
    assert b"retry-after: 1" in head
    error = json.loads(body)
    assert error["error"] == "TooManyConnections" and "max_connections" in error["message"]
    assert "retry" in error["hints"]
    for w in (*held, writer):
        w.close()
