"""Segment files: offsets that never move, the head+tail cap with an explicit gap, line lookups."""

from __future__ import annotations

import asyncio
import hashlib
import os
from pathlib import Path

import pytest

from procpilot.engine import segments
from procpilot.engine.capture import SegmentedLog, SessionOutput, Stream, Utf8ChunkDecoder
from procpilot.engine.spawn import SpawnSpec
from procpilot.engine.states import SessionState
from procpilot.engine.supervisor import Supervisor


def test_everything_is_kept_below_the_cap(tmp_path: Path) -> None:
    log = SegmentedLog(tmp_path, "v", cap_bytes=8 * 16 * 1024)
    data = bytes(range(256)) * 400  # 100 KiB, several segments
    for i in range(0, len(data), 777):
        log.write(data[i : i + 777])
    assert log.size == len(data)
    assert log.dropped == 0
    assert log.read().data == data
    assert log.read(1000, 50).data == data[1000:1050]


def test_past_the_cap_head_and_tail_survive_with_a_counted_gap(tmp_path: Path) -> None:
    seg = 16 * 1024
    log = SegmentedLog(tmp_path, "v", cap_bytes=8 * seg)
    chunks = [bytes([i % 251]) * 1000 for i in range(400)]  # 400 KB into a 128 KiB cap
    for chunk in chunks:
        log.write(chunk)
    whole = b"".join(chunks)
    assert log.size == len(whole)
    result = log.read()
    assert result.dropped == log.dropped > 0
    head = whole[: 4 * seg]
    assert result.data.startswith(head)
    assert whole.endswith(result.data[len(head) :])
    assert len(result.data) + result.dropped == len(whole)
    files = sorted(p.name for p in tmp_path.iterdir())
    assert len(files) <= 8  # the disk use is bounded by the cap


def test_lines_are_counted_and_found_across_segments(tmp_path: Path) -> None:
    log = SegmentedLog(tmp_path, "v", cap_bytes=8 * 16 * 1024)
    text = b"".join(b"line %d\n" % i for i in range(20_000))
    for i in range(0, len(text), 4096):
        log.write(text[i : i + 4096])
    assert log.total_lines == 20_000
    window = log.read_lines(12_345, 3)
    # Lines inside the dropped gap are replaced by the first kept ones: ask for tail lines.
    assert window.total == 20_000
    tail = log.read_lines(19_998, None)
    assert tail.lines == [b"line 19998", b"line 19999"]
    head = log.read_lines(0, 2)
    assert head.lines == [b"line 0", b"line 1"]


def test_trailing_partial_line_counts_as_a_line(tmp_path: Path) -> None:
    log = SegmentedLog(tmp_path, "v", cap_bytes=1 << 20)
    log.write(b"a\nb")
    assert log.total_lines == 2
    assert log.read_lines(1, None).lines == [b"b"]


def test_an_empty_slice_has_no_lines(tmp_path: Path) -> None:
    empty = SegmentedLog(tmp_path, "e", cap_bytes=1 << 20)
    assert empty.read_lines(0, None).lines == []
    log = SegmentedLog(tmp_path, "v", cap_bytes=1 << 20)
    log.write(b"a\n\nb\n")
    assert log.read_lines(5, None).lines == []  # offset past the end
    assert log.read_lines(0, 0).lines == []  # limit 0
    assert log.read_lines(1, 1).lines == [b""]  # a real empty line is still one line


def test_utf8_decoder_never_splits_a_character() -> None:
    decoder = Utf8ChunkDecoder()
    data = "héllo wörld ✓".encode()
    out = "".join(decoder.feed(data[i : i + 1]) for i in range(len(data))) + decoder.flush()
    assert out == "héllo wörld ✓"


async def test_listeners_see_every_chunk_in_order(tmp_path: Path) -> None:
    output = SessionOutput(tmp_path, 1 << 20)
    seen: list[tuple[Stream, bytes]] = []
    unsubscribe = output.subscribe(lambda s, d: seen.append((s, d)))
    output.append(Stream.STDOUT, b"a")
    output.append(Stream.STDERR, b"b")
    unsubscribe()
    output.append(Stream.STDOUT, b"c")
    assert seen == [(Stream.STDOUT, b"a"), (Stream.STDERR, b"b")]
    assert output[Stream.COMBINED].read().data == b"abc"
    waiter = asyncio.ensure_future(output.wait_for_change(5))
    await asyncio.sleep(0)
    output.append(Stream.STDOUT, b"d")
    assert await waiter
    output.mark_closed()


def test_the_directory_is_made_by_the_first_byte_and_never_without_one(tmp_path: Path) -> None:
    silent = SessionOutput(tmp_path / "sessions" / "silent", cap_bytes=1 << 20)
    assert silent[Stream.COMBINED].read().data == b""
    assert silent[Stream.COMBINED].read_lines(0, None).lines == []
    silent.mark_closed()
    silent.remove_files()  # a directory that never existed is nothing to remove
    assert not (tmp_path / "sessions").exists()
    loud = SessionOutput(tmp_path / "sessions" / "loud", cap_bytes=1 << 20)
    loud.append(Stream.STDERR, b"x\n")
    assert sorted(p.name for p in loud.directory.iterdir()) == ["combined.000000", "order.000000"]  # stored once
    loud.mark_closed()
    loud.remove_files()
    assert list(loud.directory.iterdir()) == []


async def test_a_session_that_prints_nothing_leaves_no_directory(supervisor: Supervisor) -> None:
    quiet = await supervisor.run(SpawnSpec("true"), scope="a", yield_ms=None)
    assert quiet.state is SessionState.EXITED_OK
    assert not quiet.output.directory.exists()
    assert quiet.log_files == []
    talker = await supervisor.run(SpawnSpec("echo hi"), scope="a", yield_ms=None)
    assert talker.log_files == [str(talker.output.directory / "combined.000000")]
    supervisor.clear("a", quiet.id)
    supervisor.clear("a", talker.id)
    assert not talker.output.directory.exists()


async def test_a_200_mb_burst_loses_nothing(settings, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    tools = settings.tools.model_copy(update={"exec": settings.exec.model_copy(update={"max_log_bytes": 512 << 20})})
    big = settings.model_copy(update={"tools": tools})
    # A deterministic, incompressible-enough pattern: each line carries its own number.
    script = "import sys\nw=sys.stdout.buffer.write\nfor i in range(2_500_000): w(b'%079d\\n' % i)\n"
    (tmp_path / "burst.py").write_text(script)
    expected = hashlib.sha256()
    for i in range(2_500_000):
        expected.update(b"%079d\n" % i)
    async with Supervisor(big) as sup:
        s = await sup.run(SpawnSpec(("python3", str(tmp_path / "burst.py"))), scope="a", yield_ms=None)
        assert s.state is SessionState.EXITED_OK
        view = s.output[Stream.STDOUT]
        assert view.size == 200_000_000
        got = hashlib.sha256()
        pos = 0
        while pos < view.size:
            chunk = view.read(pos, 8 << 20)
            assert chunk.dropped == 0
            got.update(chunk.data)
            pos = chunk.end
        assert got.hexdigest() == expected.hexdigest()
        assert s.output[Stream.COMBINED].size == 200_000_000
        assert view.total_lines == 2_500_000
        sup.clear("a", s.id)


def test_open_log_files_are_bounded_across_sessions(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Sessions that printed once and went quiet hold no output file open: at most the table's
    limit are, the most recently written, and a writer pushed out reopens its file on its next write."""
    monkeypatch.setattr(segments.WRITERS, "limit", 4)

    def open_in(directory: Path) -> int:
        paths = (os.path.realpath(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd"))
        return sum(1 for path in paths if path.startswith(str(directory)))

    outputs = [SessionOutput(tmp_path / str(i), cap_bytes=1 << 20) for i in range(10)]
    for i, output in enumerate(outputs):
        output.append(Stream.STDOUT, b"first %d\n" % i)
    assert open_in(tmp_path) == 4  # two sessions' log and order index
    for i, output in enumerate(outputs):
        output.append(Stream.STDOUT, b"second %d\n" % i)
        output.append(Stream.STDERR, b"err %d\n" % i)
    assert open_in(tmp_path) <= 4
    for i, output in enumerate(outputs):
        assert output[Stream.STDOUT].read().data == b"first %d\nsecond %d\n" % (i, i)
        assert output[Stream.COMBINED].read().data == b"first %d\nsecond %d\nerr %d\n" % (i, i, i)
        assert output[Stream.STDERR].read().data == b"err %d\n" % i
        output.mark_closed()
    assert open_in(tmp_path) == 0
    assert len(segments.WRITERS) == 0
