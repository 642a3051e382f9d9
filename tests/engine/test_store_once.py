"""Output stored once: the combined log plus an ordering index, stdout and stderr read through it.

Disk use is the cap (real files measured), streams read back right however often they alternate
and across the cap's gap, an old per-stream state directory is still read, and output printed
while no server ran is replayed into the new store in arrival order."""

from __future__ import annotations

import asyncio
import random
import re
from itertools import pairwise
from pathlib import Path

from procpilot.config import Settings, load_settings
from procpilot.engine.capture import SegmentedLog, SessionOutput, Stream
from procpilot.engine.spawn import SpawnSpec
from procpilot.engine.states import SessionState
from procpilot.engine.supervisor import Supervisor

A = "agent-a"
OUT, ERR = Stream.STDOUT, Stream.STDERR


def file_bytes(directory: Path, prefix: str) -> int:
    return sum(p.stat().st_size for p in directory.glob(f"{prefix}.*"))


def expected_views(chunks: list[tuple[Stream, bytes]], head_end: int, tail_start: int) -> dict[Stream, bytes]:
    """What each view keeps of ``chunks`` when combined bytes [head_end, tail_start) were dropped."""
    kept: dict[Stream, list[bytes]] = {stream: [] for stream in Stream}
    offset = 0
    for stream, data in chunks:
        for i, byte in enumerate(data):
            if not head_end <= offset + i < tail_start:
                kept[stream].append(bytes([byte]))
                kept[Stream.COMBINED].append(bytes([byte]))
        offset += len(data)
    return {stream: b"".join(parts) for stream, parts in kept.items()}


async def test_a_capped_sessions_disk_use_is_its_cap(tmp_path: Path) -> None:
    cap = 128 << 10  # 16 KiB segments
    settings = load_settings(env={}, state_dir=tmp_path / "state", workspace_root=tmp_path, exec={"max_log_bytes": cap})
    async with Supervisor(settings) as sup:
        # 40 segments' worth, ending on a segment's last byte: the kept tail is whole.
        session = await sup.run(SpawnSpec(f"head -c {40 * (cap // 8)} /dev/zero"), scope=A, yield_ms=None)
        assert session.state is SessionState.EXITED_OK
        directory = session.output.directory
        assert session.output[Stream.COMBINED].dropped == 32 * (cap // 8)
        assert file_bytes(directory, "combined") == cap  # the data: exactly the cap, not twice it
        assert not list(directory.glob("stdout.*")) and not list(directory.glob("stderr.*"))
        # The index: one 16-byte record per kept segment for a command that prints on one stream.
        assert file_bytes(directory, "order") == 8 * 16
        assert session.output[Stream.STDOUT].size == 40 * (cap // 8)
        assert session.output[Stream.STDOUT].dropped == 32 * (cap // 8)
        sup.clear(A, session.id)


def test_many_alternations_read_back_per_stream_and_combined_in_order(tmp_path: Path) -> None:
    rng = random.Random(11)
    output = SessionOutput(tmp_path / "s", cap_bytes=1 << 30)  # keeps all: 128 MiB segments
    chunks: list[tuple[Stream, bytes]] = []
    for i in range(60_000):  # a switch at almost every chunk, chunks of 1 to 40 bytes
        stream = OUT if rng.random() < 0.55 else ERR
        text = b"%s%d" % (b"o" if stream is OUT else b"e", i)
        data = (text + b"\n") if rng.random() < 0.7 else text[: rng.randint(1, len(text))]
        chunks.append((stream, data))
        output.append(stream, data)
    want = {
        Stream.COMBINED: b"".join(d for _, d in chunks),
        OUT: b"".join(d for s, d in chunks if s is OUT),
        ERR: b"".join(d for s, d in chunks if s is ERR),
    }
    for stream, data in want.items():
        view = output[stream]
        assert view.size == len(data) and view.read().data == data, stream
        for _ in range(200):  # any window reads the same bytes a slice does
            start = rng.randrange(len(data))
            limit = rng.randrange(1, 5000)
            got = view.read(start, limit)
            end = min(len(data), start + limit)
            assert (got.data, got.start, got.end, got.dropped) == (data[start:end], start, end, 0)
        lines = data.split(b"\n")
        if data.endswith(b"\n"):
            lines.pop()
        assert view.total_lines == len(lines)
        for first in (0, 1, 777, len(lines) // 2, len(lines) - 3):
            assert view.read_lines(first, 3).lines == lines[first : first + 3], (stream, first)
            assert view.offset_of_line(first) == len(b"\n".join(lines[:first])) + (1 if first else 0)
    # Memory holds per-segment counters (one segment here), never an entry per alternation.
    assert output._index is not None and output._index._table.numbers == [0]
    output.mark_closed()
    # The records are on disk: one per switch, 16 bytes each.
    switches = 1 + sum(1 for a, b in pairwise(chunks) if a[0] is not b[0])
    assert file_bytes(output.directory, "order") == 16 * switches


def test_a_stream_reads_across_the_caps_gap(tmp_path: Path) -> None:
    rng = random.Random(5)
    cap = 128 << 10
    output = SessionOutput(tmp_path / "s", cap_bytes=cap)
    chunks: list[tuple[Stream, bytes]] = []
    for i in range(20_000):
        stream = OUT if rng.random() < 0.6 else ERR
        data = b"%s line %d\n" % (b"out" if stream is OUT else b"err", i)
        chunks.append((stream, data))
        output.append(stream, data)
    combined = output[Stream.COMBINED]
    assert isinstance(combined, SegmentedLog) and combined.dropped > 0
    want = expected_views(chunks, combined.head_end, combined.tail_start)
    for stream in (OUT, ERR):
        view = output[stream]
        printed = sum(len(d) for s, d in chunks if s is stream)
        whole = view.read()
        assert whole.data == want[stream]  # head, then tail, no marker inside
        assert whole.dropped == view.dropped == printed - len(want[stream]) > 0
        # A window that starts in the stream's head and ends in its tail.
        head = sum(len(d) for s, d in chunks if s is stream and d in want[stream][: 4 * (cap // 8)]) // 2
        window = view.read(head, view.dropped + 1000)
        assert window.dropped > 0 and window.data == whole.data[head : head + len(window.data)]
        assert len(window.data) + window.dropped == window.end - window.start
        # Lines after the gap are found; a line inside it maps to the first kept byte after it.
        last = view.read_lines(view.total_lines - 2, None).lines
        assert last == want[stream].rstrip(b"\n").split(b"\n")[-2:]
        assert view.read_lines(0, 2).lines == want[stream].split(b"\n")[:2]
    # However much is printed past the cap, memory holds counters for the kept segments only.
    for i in range(20_000, 60_000):
        output.append(OUT if i % 3 else ERR, b"more line %d\n" % i)
    assert isinstance(combined, SegmentedLog) and combined.tail_start // combined.segment_size > 40
    assert output._index is not None and len(output._index._table.numbers) <= 10
    assert len(combined._lines_before.numbers) <= 10
    chunks += [(OUT if i % 3 else ERR, b"more line %d\n" % i) for i in range(20_000, 60_000)]
    want = expected_views(chunks, combined.head_end, combined.tail_start)
    for stream in (OUT, ERR):
        assert output[stream].read().data == want[stream]
        assert output[stream].read_lines(output[stream].total_lines - 1, 1).lines == want[stream].split(b"\n")[-2:-1]
    output.mark_closed()
    # Rebuilt from the files (an adoption), the streams read the same.
    rebuilt = SessionOutput.recover(output.directory, cap)
    for stream in Stream:
        assert rebuilt[stream].size == output[stream].size
        assert rebuilt[stream].read().data == want[stream]
    rebuilt.mark_closed()


def test_an_old_per_stream_state_dir_is_read_and_grows_in_its_layout(tmp_path: Path) -> None:
    directory = tmp_path / "old"
    cap = 1 << 20
    # The files an older procpilot wrote: a copy per stream beside the combined view.
    old = {stream: SegmentedLog(directory, stream.value, cap) for stream in Stream}
    for stream, data in ((OUT, b"one\n"), (ERR, b"two\n"), (OUT, b"three\n")):
        old[stream].write(data)
        old[Stream.COMBINED].write(data)
    for log in old.values():
        log.close()
    output = SessionOutput.recover(directory, cap)
    assert output.layout == "per-stream"
    assert output[Stream.COMBINED].read().data == b"one\ntwo\nthree\n"
    assert output[OUT].read().data == b"one\nthree\n" and output[ERR].read_lines(0, None).lines == [b"two"]
    output.append(ERR, b"four\n")
    assert output[ERR].read().data == b"two\nfour\n"
    assert output[Stream.COMBINED].read().data.endswith(b"three\nfour\n")
    assert not list(directory.glob("order.*"))  # never half in one layout, half in the other
    output.mark_closed()
    output.remove_files()
    assert list(directory.iterdir()) == []
    fresh = SessionOutput.recover(tmp_path / "new", cap)  # nothing on disk yet: the new layout
    assert fresh.layout == "once"


async def test_an_old_layout_session_is_adopted_and_read(settings: Settings) -> None:
    first = await Supervisor(settings, owner="t").start()
    session = await first.spawn(SpawnSpec("echo before; echo oops >&2; read x; echo after-$x"), scope=A)
    await first.wait(A, session.id, timeout=10, pattern=re.compile("oops"))
    await first.detach()
    # Rewrite its files as an older procpilot had them: combined plus a copy per stream.
    directory = session.output.directory
    for path in directory.glob("order.*"):
        path.unlink()
    for stream, data in ((OUT, b"before\n"), (ERR, b"oops\n")):
        log = SegmentedLog(directory, stream.value, settings.exec.max_log_bytes)
        log.write(data)
        log.close()
    async with Supervisor(settings, owner="t") as second:
        again = second.get(A, session.id)
        assert again.output.layout == "per-stream"
        assert again.record()["format"] == 1  # a procpilot from before storing once can adopt it again
        await second.write(A, session.id, b"x\n")
        await second.wait(A, session.id, timeout=10)
        assert again.output[Stream.COMBINED].read().data == b"before\noops\nafter-x\n"
        assert again.output[OUT].read().data == b"before\nafter-x\n"
        assert again.output[ERR].read().data == b"oops\n"


async def test_output_printed_while_no_server_ran_is_replayed_into_the_store_in_order(settings: Settings) -> None:
    first = await Supervisor(settings, owner="t").start()
    script = "for i in $(seq 1 60); do echo out $i; echo err $i >&2; sleep 0.01; done"
    talker = await first.spawn(SpawnSpec(script), scope=A)
    await first.wait(A, talker.id, timeout=10, pattern=re.compile("err 3\n"))
    await first.detach()
    await asyncio.sleep(0.3)  # it goes on printing into the holder's spool meanwhile
    async with Supervisor(settings, owner="t") as second:
        await second.wait(A, talker.id, timeout=10)
        done = second.get(A, talker.id)
        assert done.output.layout == "once" and done.record()["format"] == 3  # once, and the whole session
        combined = done.output[Stream.COMBINED].read().data.decode().splitlines()
        assert sorted(combined) == sorted([f"out {i}" for i in range(1, 61)] + [f"err {i}" for i in range(1, 61)])
        # Each stream in its own order, and the combined view never puts a line before its predecessor.
        assert done.output[OUT].read().data.decode().split("\n")[:-1] == [f"out {i}" for i in range(1, 61)]
        assert done.output[ERR].read().data.decode().split("\n")[:-1] == [f"err {i}" for i in range(1, 61)]
        assert [line for line in combined if line.startswith("out")] == [f"out {i}" for i in range(1, 61)]
        assert done.output[ERR].read_lines(59, 1).lines == [b"err 60"]
        assert not list(done.output.directory.glob("stdout.*"))


Model = list[tuple[Stream, int | None]]  # per combined byte: its stream, its value (None: lost)


def check_views(views: SessionOutput, model: Model, rng: random.Random, *, rebuilt: bool = False) -> None:
    """Every view reads, window by window, what ``model`` says it holds. ``rebuilt``: what the
    disk refused is a hole in the files, read as zeros (the ranges were counted in memory only,
    as before storing once)."""
    combined = views[Stream.COMBINED]
    assert isinstance(combined, SegmentedLog)
    for stream in Stream:
        mine = [
            (0 if value is None and rebuilt else value, not combined.head_end <= i < combined.tail_start)
            for i, (owner, value) in enumerate(model)
            if stream in (owner, Stream.COMBINED)
        ]
        view = views[stream]
        assert view.size == len(mine), stream
        assert view.lost == sum(1 for value, _ in mine if value is None), stream
        for _ in range(60):
            start = rng.randrange(len(mine))
            limit = rng.choice((1, 100, 20_000, 300_000))
            got = view.read(start, limit)
            window = mine[start : start + limit]
            want = bytes(value for value, kept in window if kept and value is not None)
            missing = sum(1 for value, kept in window if not kept or value is None)
            assert (got.data, got.dropped) == (want, missing), (stream, start, limit)


def test_every_view_reads_as_a_model_of_it_does(tmp_path: Path) -> None:
    """Random chunks, switches, counted losses and the cap's roll, against a byte-by-byte model:
    every window of every view, before and after a rebuild from the files."""
    rng = random.Random(1729)
    cap = 128 << 10  # 16 KiB segments
    output = SessionOutput(tmp_path / "s", cap)
    model: Model = []
    while len(model) < 400_000:
        stream = OUT if rng.random() < 0.5 else ERR
        if rng.random() < 0.02:
            size = rng.randint(1, 3000)
            output.lose(stream, size, OSError(28, "No space left on device"))
            model += [(stream, None)] * size
            continue
        data = bytes(rng.choice(b"abc\n") for _ in range(rng.choice((1, 7, 100, 5000))))
        output.append(stream, data)
        model += [(stream, byte) for byte in data]
    output.append(OUT, b"end\n")  # a rebuild sizes the log by its last file: end on stored bytes
    model += [(OUT, byte) for byte in b"end\n"]
    combined = output[Stream.COMBINED]
    assert combined.dropped > 0 and combined.lost > 0
    check_views(output, model, rng)
    output.mark_closed()
    rebuilt = SessionOutput.recover(output.directory, cap)
    check_views(rebuilt, model, rng, rebuilt=True)
    rebuilt.mark_closed()


def test_bytes_whose_stream_could_not_be_written_down_are_a_counted_gap(tmp_path: Path) -> None:
    """Never read as the other stream's: a segment whose index file cannot be made (here a
    directory sits in its place) loses its bytes to a gap, counted and said; the next segment
    stores again."""
    rng = random.Random(3)
    output = SessionOutput(tmp_path / "s", cap_bytes=1 << 20)  # 128 KiB segments
    (output.directory / "order.000000").mkdir(parents=True)
    model: Model = []
    segment = (1 << 20) // 8
    while len(model) < 3 * segment:
        stream = OUT if rng.random() < 0.5 else ERR
        data = bytes(rng.choice(b"xyz\n") for _ in range(rng.randint(1, 900)))
        output.append(stream, data)
        model += [(stream, byte if len(model) + i >= segment else None) for i, byte in enumerate(data)]
    assert output[Stream.COMBINED].lost == segment
    assert "bytes of output were lost" in (output.lost_note() or "")
    check_views(output, model, rng)
    output.mark_closed()
