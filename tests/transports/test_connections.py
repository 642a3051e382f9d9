"""The daemon's HTTP/1.1 connections (transports/connections.py), through a real uvicorn on a
loopback socket: a client that stops inside a request head is cut off at the deadline (the
first head and each one after a response), past the cap a new connection gets a 503 with a
typed error before anything is read, and a head (or a trailer) past MAX_HEAD gets a typed 431
whether it comes in one read or in many."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import AsyncIterator
from typing import Any

import pytest
import uvicorn

from procpilot.config import ServerSettings
from procpilot.transports.connections import MAX_HEAD, guarded_http

_REQUEST = b"GET / HTTP/1.1\r\nhost: x\r\n\r\n"


async def _app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    assert scope["type"] == "http"
    if scope["path"] == "/echo":  # the head at once, then the body the client sends once it has the head
        await send({"type": "http.response.start", "status": 200, "headers": []})
        message = await receive()
        await send({"type": "http.response.body", "body": message["body"]})
        return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


@contextlib.asynccontextmanager
async def _serving(limits: ServerSettings, keep_alive: float = 5) -> AsyncIterator[int]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(
        _app,
        http=guarded_http(limits),
        lifespan="off",
        log_level="error",
        timeout_keep_alive=keep_alive,  # type: ignore[arg-type]  # seconds: a float is taken as it is
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        await asyncio.sleep(0.01)  # uvicorn offers no event for "listening"
    yield sock.getsockname()[1]
    server.should_exit = True
    await asyncio.wait_for(task, 5)
    sock.close()


@pytest.fixture
async def port() -> AsyncIterator[int]:
    async with _serving(ServerSettings(header_timeout_sec=0.2, body_timeout_sec=0.2, max_connections=16)) as port:
        yield port


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


async def test_each_next_head_is_timed_from_the_last_answer_not_the_first() -> None:
    # One timer per connection outlives each request (connections.py): when it fires for the
    # first answer's deadline, a later answer has moved it, and the connection stays open.
    async with _serving(ServerSettings(header_timeout_sec=0.3, body_timeout_sec=0.3)) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        loop = asyncio.get_running_loop()
        writer.write(_REQUEST)
        await _answer(reader)
        first = loop.time()
        await asyncio.sleep(0.2)
        writer.write(_REQUEST)
        await _answer(reader)
        await asyncio.sleep(max(0.0, first + 0.4 - loop.time()))  # past the first deadline, within the second
        writer.write(_REQUEST)
        assert (await _answer(reader)).endswith(b"ok")
        assert await asyncio.wait_for(reader.read(), 5) == b""  # and then closed at its own deadline
        writer.close()


async def test_uvicorns_keep_alive_timeout_closes_an_idle_connection_and_a_byte_keeps_it() -> None:
    # uvicorn's keep-alive timeout rides on the connection's deadline timer: a connection silent
    # after its answer is closed then, before its next head's deadline; one whose next head has
    # begun since has until that deadline to finish it.
    async with _serving(ServerSettings(header_timeout_sec=0.6, body_timeout_sec=0.6), keep_alive=0.2) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(_REQUEST)
        await _answer(reader)
        assert await asyncio.wait_for(reader.read(), 0.5) == b""  # closed at the keep-alive timeout
        writer.close()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(_REQUEST)
        await _answer(reader)
        writer.write(_REQUEST[:5])  # the next head begins
        await asyncio.sleep(0.35)  # past the keep-alive timeout, within the head's deadline
        writer.write(_REQUEST[5:])
        assert (await _answer(reader)).endswith(b"ok")
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


def _refused_head(answer: bytes) -> None:
    head, _, body = answer.rpartition(b"HTTP/1.1 431 ")[2].partition(b"\r\n\r\n")
    assert head.startswith(b"Request Header Fields Too Large"), answer[:200]
    error = json.loads(body)
    assert error["error"] == "RequestTooLarge" and str(MAX_HEAD) in error["message"]


async def _dribble(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, pieces: list[bytes]) -> bytes:
    """Each piece in a write of its own, the server's reads apart (the bound counts over reads,
    not only within one), until the server answers; then its answer to the end. (Writing on past
    the server's close would draw a reset, which loses the answer.)"""
    for piece in pieces:
        writer.write(piece)
        await writer.drain()
        try:
            answer = await asyncio.wait_for(reader.read(1 << 16), 0.005)
        except TimeoutError:
            continue
        try:
            while more := await asyncio.wait_for(reader.read(1 << 16), 5):
                answer += more
        except ConnectionError:
            pass
        return answer
    return await asyncio.wait_for(reader.read(), 5)


async def test_a_head_over_the_bound_in_one_write_is_a_typed_431(port: int) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET / HTTP/1.1\r\nhost: x\r\nx-big: " + b"a" * MAX_HEAD + b"\r\n\r\n")
    _refused_head(await asyncio.wait_for(reader.read(), 5))  # answered, then closed
    writer.close()


async def test_a_head_that_never_ends_is_refused_before_the_deadline(port: int) -> None:
    # A header value sent piece by piece faster than the deadline: uvicorn over llhttp would
    # gather it for as long as it comes; it is refused once past the bound.
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET / HTTP/1.1\r\nhost: x\r\nx-big: ")
    await writer.drain()
    _refused_head(await _dribble(reader, writer, [b"a" * 1024] * (MAX_HEAD // 1024 + 2)))
    writer.close()


async def test_a_url_over_the_bound_is_refused(port: int) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /" + b"a" * MAX_HEAD + b" HTTP/1.1\r\nhost: x\r\n\r\n")
    _refused_head(await asyncio.wait_for(reader.read(), 5))
    writer.close()


async def test_a_chunked_bodys_trailer_is_held_to_the_same_bound() -> None:
    # The app answers without reading the body; its trailer then arrives field by field, well
    # within the body's deadline, each field whole (uvicorn adds them to the request's headers).
    async with _serving(ServerSettings(body_timeout_sec=10.0)) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST / HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\n")
        assert (await _answer(reader)).endswith(b"ok")
        fields = [b"x-t%d: " % i + b"a" * 1024 + b"\r\n" for i in range(MAX_HEAD // 1024 + 2)]
        _refused_head(await _dribble(reader, writer, fields))
        writer.close()


async def test_a_head_under_the_bound_is_served(port: int) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET / HTTP/1.1\r\nhost: x\r\nx-big: " + b"a" * (MAX_HEAD - 1024) + b"\r\n\r\n")
    assert (await _answer(reader)).endswith(b"ok")
    writer.close()


async def test_a_head_sent_alone_is_not_held_for_the_body() -> None:
    # A response's writes are joined when they come together; a head whose body waits for the
    # client (a stream, say) must still reach it.
    async with _serving(ServerSettings()) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST /echo HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n")
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        assert head.startswith(b"HTTP/1.1 200 ") and b"transfer-encoding: chunked" in head
        writer.write(b"2\r\nhi\r\n0\r\n\r\n")
        assert await asyncio.wait_for(reader.readuntil(b"0\r\n\r\n"), 5) == b"2\r\nhi\r\n0\r\n\r\n"
        writer.close()
