"""The node's stream of a session's output, replayed as the daemon does: the same bytes at the same
offsets in every view, each byte sent once (the node's ordering index knows every run's stream).
No Ray needed: a real session of the engine, its stream read by the code the node actor runs."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

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
        mirror(copy, Stream(item[1]), item[2], item[3], item[4])
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
    # Every byte once, as runs of one stream.
    assert kinds["both"] > 0
    assert kinds["both"] + kinds["out"] < 1.1 * session.output[Stream.COMBINED].size
    assert kinds == {"both": session.output[Stream.COMBINED].size}
    await supervisor.remove("t", session.id)


async def test_output_from_before_the_stream_began(supervisor: Supervisor, tmp_path: Path) -> None:
    session = await supervisor.run(SpawnSpec("echo early; echo late >&2"), scope="t", yield_ms=None)
    copy, kinds = await replay(session, tmp_path / "copy")
    same_views(session.output, copy)
    assert kinds == {"both": session.output[Stream.COMBINED].size}  # the index knew their order
    await supervisor.remove("t", session.id)


async def test_a_reader_far_behind_still_gets_every_byte_once(supervisor: Supervisor, tmp_path: Path) -> None:
    # Many small appends, 10 ms apart, against a reader that takes 50 ms an item: nothing is
    # noted in memory, the runs are read back from the node's index however far behind it is.
    paced = "for i in $(seq 1 40); do echo out $i; echo err $i >&2; sleep 0.01; done"
    session = await supervisor.spawn(SpawnSpec(paced), scope="t")
    copy, kinds = await replay(session, tmp_path / "copy", pause=0.05)
    same_views(session.output, copy)
    assert kinds == {"both": session.output[Stream.COMBINED].size}
    await supervisor.remove("t", session.id)


async def test_a_capped_nodes_gap_lands_in_each_stream_at_its_offsets(settings, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """What the node's cap dropped before it was read is zeros in the copy, each stream's share
    in that stream: every view keeps the node's sizes, and what the node kept reads the same."""
    tools = settings.tools.model_copy(update={"exec": settings.exec.model_copy(update={"max_log_bytes": 128 << 10})})
    capped = settings.model_copy(update={"tools": tools})
    async with Supervisor(capped) as sup:
        # The pause lets both pipes drain first, so "last" is the newest byte read, in the kept tail
        # (read with both pipes' rest at once, stdout's tail could all fall in the dropped part).
        script = "for i in $(seq 1 20000); do echo out $i; echo err $i >&2; done; sleep 0.3; echo last"
        session = await sup.run(SpawnSpec(script), scope="t", yield_ms=None)
        assert session.output[Stream.COMBINED].dropped > 0
        copy, _ = await replay(session, tmp_path / "copy")
        for view in Stream:
            node, mine = session.output[view], copy[view]
            assert mine.size == node.size, view
            kept = node.read(node.size - 5000)
            # Where the node's cap cut inside these last 5000 bytes (how much lands where is the
            # run's interleaving), the node reads only what it kept after the cut, the copy zeros.
            assert mine.read(kept.start).data == b"\0" * kept.dropped + kept.data, view
        # The copy's gap is zeros, newlines included: a last line that begins in it starts with them.
        (line,) = copy[Stream.STDOUT].read_lines(copy[Stream.STDOUT].total_lines - 1, 1).lines
        assert line == b"last" or line.endswith(b"\0last"), line[-40:]
        await sup.remove("t", session.id)


async def test_a_stream_followed_again_adds_nothing_twice(supervisor: Supervisor, tmp_path: Path) -> None:
    """After a lost connection the daemon follows the stream again from the start."""
    session = await supervisor.run(SpawnSpec("seq 1 2000; seq 1 500 >&2"), scope="t", yield_ms=None)
    copy = SessionOutput(tmp_path / "copy", 64 << 20)
    heard: list[bytes] = []
    copy.subscribe(lambda stream, data: heard.append(data))
    for _ in range(2):
        async for item in follow.follow_output(session):
            mirror(copy, Stream(item[1]), item[2], item[3], item[4])
    copy.mark_closed()
    same_views(session.output, copy)
    assert sum(map(len, heard)) == session.output[Stream.COMBINED].size
    await supervisor.remove("t", session.id)
