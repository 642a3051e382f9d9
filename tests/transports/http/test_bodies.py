"""transports/http/bodies.py: a body is read whole, at most a cap, within a deadline, then replayed."""

from __future__ import annotations

import asyncio
import json

from starlette.types import Message

from procpilot.transports.http.bodies import read_body, refuse_oversized


class Channel:
    """The server's side of one ASGI request: what the client sends, what the app answers."""

    def __init__(self, *chunks: bytes, length: int | None = None) -> None:
        self.incoming: asyncio.Queue[Message] = asyncio.Queue()
        for i, chunk in enumerate(chunks):
            self.incoming.put_nowait({"type": "http.request", "body": chunk, "more_body": i < len(chunks) - 1})
        declared = [(b"content-length", str(length).encode())] if length is not None else []
        self.scope = {"type": "http", "headers": declared or [(b"transfer-encoding", b"chunked")]}
        self.sent: list[Message] = []

    async def receive(self) -> Message:
        return await self.incoming.get()

    async def send(self, message: Message) -> None:
        self.sent.append(message)

    def answer(self) -> tuple[int, dict[str, object]]:
        return self.sent[0]["status"], json.loads(self.sent[1]["body"])


async def test_a_body_is_replayed_whole() -> None:
    channel = Channel(b'{"a":', b"1}", length=7)
    receive = await read_body(channel.scope, channel.receive, channel.send, max_bytes=100, timeout=5)
    assert receive is not None
    assert await receive() == {"type": "http.request", "body": b'{"a":1}', "more_body": False}
    assert channel.sent == []


async def test_a_declared_length_over_the_cap_is_refused_before_reading() -> None:
    channel = Channel(b"x" * 200, length=200)
    assert await refuse_oversized(channel.scope, channel.send, max_bytes=100)
    assert channel.answer()[0] == 413
    assert channel.incoming.qsize() == 1  # not a byte read


async def test_a_chunked_body_over_the_cap_is_refused() -> None:
    channel = Channel(b"x" * 60, b"x" * 60)
    assert await read_body(channel.scope, channel.receive, channel.send, max_bytes=100, timeout=5) is None
    status, body = channel.answer()
    assert status == 413 and body["error"] == "RequestTooLarge"


async def test_a_body_that_does_not_arrive_in_time_is_a_408_and_a_closed_connection() -> None:
    channel = Channel(length=10)  # declared, never sent
    assert await read_body(channel.scope, channel.receive, channel.send, max_bytes=100, timeout=0.05) is None
    status, body = channel.answer()
    assert status == 408 and body["error"] == "RequestTimeout"
    assert (b"connection", b"close") in channel.sent[0]["headers"]


async def test_a_client_that_leaves_gets_no_answer() -> None:
    channel = Channel(length=10)
    channel.incoming.put_nowait({"type": "http.disconnect"})
    assert await read_body(channel.scope, channel.receive, channel.send, max_bytes=100, timeout=5) is None
    assert channel.sent == []
