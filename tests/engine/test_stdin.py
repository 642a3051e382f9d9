"""A session's stdin writer over a real pipe (engine/stdin.py): bytes arrive whole, eof closes,
a full pipe ends a write at its deadline, and a parked write end still takes a write."""

from __future__ import annotations

import asyncio
import os

import pytest

from procpilot.engine.spawn import Spawned
from procpilot.engine.stdin import StdinParking, StdinWriter
from procpilot.errors import StdinClosed


def _spawned(write_end: int) -> Spawned:
    # Our own pid stands in for the child: the writer only ever touches the stdin descriptor.
    os.set_blocking(write_end, False)
    return Spawned(popen=None, pid=os.getpid(), pidfd=None, stdin_fd=write_end, stdout_fd=-1, stderr_fd=None)


def _read_all(read_end: int) -> bytes:
    os.set_blocking(read_end, False)
    chunks: list[bytes] = []
    while True:
        try:
            chunk = os.read(read_end, 65536)
        except BlockingIOError:
            return b"".join(chunks)  # a writer is still open
        if not chunk:
            chunks.append(b"<EOF>")
            return b"".join(chunks)
        chunks.append(chunk)


async def test_a_write_arrives_whole_and_eof_closes_once() -> None:
    r, w = os.pipe()
    closes: list[None] = []
    writer = StdinWriter("s1", pty=False, before_close=lambda: closes.append(None))
    writer.use(_spawned(w))
    try:
        assert writer.open
        assert await writer.write(b"hello ") == 6
        assert _read_all(r) == b"hello "  # no EOF yet: stdin stays open between writes
        assert await writer.write(b"world", eof=True) == 5
        assert _read_all(r) == b"world<EOF>"
        assert not writer.open
        assert closes == [None]  # the holder was told once, before our end closed
        with pytest.raises(StdinClosed):
            await writer.write(b"more")
        writer.close()  # closing again is harmless and tells nobody twice
        assert closes == [None]
    finally:
        os.close(r)


async def test_a_full_pipe_ends_the_write_at_its_deadline_without_eof() -> None:
    r, w = os.pipe()
    writer = StdinWriter("s2", pty=False, before_close=lambda: None)
    writer.use(_spawned(w))
    data = b"x" * (4 * 1024 * 1024)  # far more than a pipe holds
    try:
        written = await writer.write(data, eof=True, timeout=0.05)
        assert 0 < written < len(data)
        assert writer.open  # eof not applied: it would cut the unsent part off for good
        received = _read_all(r)
        assert received == data[:written]  # what it counts is exactly what the reader got
    finally:
        writer.close()
        os.close(r)


async def test_a_reader_gone_is_a_typed_error_with_the_count() -> None:
    r, w = os.pipe()
    os.close(r)
    writer = StdinWriter("s3", pty=False, before_close=lambda: None)
    writer.use(_spawned(w))
    with pytest.raises(StdinClosed) as info:
        await writer.write(b"nobody reads this")
    assert info.value.details == {"bytes_written": 0}  # the caller learns nothing was sent
    assert not writer.open


async def test_two_writes_at_once_never_interleave() -> None:
    r, w = os.pipe()
    writer = StdinWriter("s4", pty=False, before_close=lambda: None)
    writer.use(_spawned(w))
    a, b = b"a" * 200_000, b"b" * 200_000  # each bigger than the pipe: both must wait for room
    try:
        tasks = [asyncio.create_task(writer.write(a)), asyncio.create_task(writer.write(b))]
        received = bytearray()
        while not all(t.done() for t in tasks):
            received += _read_all(r)
            await asyncio.sleep(0)  # let the writes refill the pipe we just drained
        received += _read_all(r)
        assert [t.result() for t in tasks] == [len(a), len(b)]
        assert bytes(received) in (a + b, b + a)
    finally:
        writer.close()
        os.close(r)


async def test_a_parked_stdin_keeps_the_pipe_open_and_takes_a_write() -> None:
    r, w = os.pipe()
    befores: list[None] = []
    parking = StdinParking(before=lambda: befores.append(None))
    writer = StdinWriter("s5", pty=False, before_close=lambda: None)
    writer.parking = parking
    spawned = _spawned(w)
    writer.use(spawned)
    try:
        parking.park_now()
        assert befores == [None]  # the holder's batch goes first
        assert spawned.stdin_fd is None and len(parking) == 1  # out of our table, in flight
        assert _read_all(r) == b""  # no EOF: the parked copy still holds the pipe open
        assert await writer.write(b"after parking", eof=True) == len(b"after parking")
        assert _read_all(r) == b"after parking<EOF>"
        assert len(parking) == 0
    finally:
        parking.close()
        os.close(r)
