"""The node's stream of a session's output, replayed as the daemon does: the same bytes at the same
offsets in every view, each byte sent once where the order of appends is known. No Ray needed:
a real session of the engine, its stream read by the code the node actor runs."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

import pytest

from procpilot.cluster import follow
from procpilot.cluster.remote import mirror
from procpilot.engine.capture import SessionOutput, Stream
from procpilot.engine.session import Session
from procpilot.engine.spawn import SpawnSpec
from procpilot.engine.supervisor import Supervisor

INTERLEAVED = "for i in $(seq 1 300); do echo out $i; echo err $i >&2; done; head -c 3000000 /dev/zero"


async def replay(session: Session, into: Path, *, pause: float = 0) -> tuple[SessionOutput, Counter[str]]:
    copy = SessionOutput(into, 64 << 20)
    kinds: Counter[str] = Counter()
    async for item in follow.follow_output(session):
        if pause:
            await asyncio.sleep(pause)  # a slow reader: the command runs ahead of it
        kinds[item[0]] += len(item[-1])
        if item[0] == "both":
            mirror(copy, Stream(item[1]), item[2], item[4])
            mirror(copy, Stream.COMBINED, item[3], item[4])
        else:
            mirror(copy, Stream(item[1]), item[2], item[3])
    copy.mark_closed()  # as the daemon's copy is closed at the session's end
    return copy, kinds


def same_views(a: SessionOutput, b: SessionOutput) -> None:
    for view in Stream:
        assert a[view].size == b[view].size, view
        assert a[view].read(0, a[view].size).data == b[view].read(0, b[view].size).data, view


async def test_every_byte_once_in_arrival_order(supervisor: Supervisor, tmp_path: Path) -> None:
    session = await supervisor.spawn(SpawnSpec(INTERLEAVED), scope="t")
    copy, kinds = await replay(session, tmp_path / "copy")
    same_views(session.output, copy)
    # Only what came before the stream began was sent per view; the rest once.
    assert kinds["both"] > 0
    assert kinds["both"] + kinds["out"] < 1.1 * session.output[Stream.COMBINED].size
    await supervisor.remove("t", session.id)


async def test_output_from_before_the_stream_began(supervisor: Supervisor, tmp_path: Path) -> None:
    session = await supervisor.run(SpawnSpec("echo early; echo late >&2"), scope="t", yield_ms=None)
    copy, kinds = await replay(session, tmp_path / "copy")
    same_views(session.output, copy)
    assert kinds["both"] == 0
    await supervisor.remove("t", session.id)


async def test_a_reader_far_behind_falls_back_to_each_view(
    supervisor: Supervisor, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(follow, "_MAX_NOTES", 3)
    # Many small appends, 10 ms apart, against a reader that takes 50 ms an item: its notes of
    # the order of appends overflow whatever the machine's speed.
    paced = "for i in $(seq 1 40); do echo out $i; echo err $i >&2; sleep 0.01; done"
    session = await supervisor.spawn(SpawnSpec(paced), scope="t")
    copy, kinds = await replay(session, tmp_path / "copy", pause=0.05)
    same_views(session.output, copy)
    assert kinds["out"] > 0  # the views, each on its own, from the overflow on
    await supervisor.remove("t", session.id)


async def test_a_stream_followed_again_adds_nothing_twice(supervisor: Supervisor, tmp_path: Path) -> None:
    """After a lost connection the daemon follows the stream again from the start."""
    session = await supervisor.run(SpawnSpec("seq 1 2000; seq 1 500 >&2"), scope="t", yield_ms=None)
    copy = SessionOutput(tmp_path / "copy", 64 << 20)
    heard: list[bytes] = []
    copy.subscribe(lambda stream, data: heard.append(data))
    for _ in range(2):
        async for item in follow.follow_output(session):
            if item[0] == "out":
                mirror(copy, Stream(item[1]), item[2], item[3])
    copy.mark_closed()
    same_views(session.output, copy)
    assert sum(map(len, heard)) == session.output[Stream.COMBINED].size
    await supervisor.remove("t", session.id)
