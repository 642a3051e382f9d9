"""engine/stream_index.py: stdout and stderr read through the one combined log, in the order the
bytes came, across segments, past the cap and after a restart."""

from __future__ import annotations

import errno
from collections.abc import Iterator
from pathlib import Path

import pytest

from procpilot.engine.segments import SegmentedLog, Stream
from procpilot.engine.stream_index import INDEX_NAME, OrderIndex, StreamView

CAP = 128 * 1024  # segments of 16 KiB


@pytest.fixture
def stored(tmp_path: Path) -> Iterator[tuple[SegmentedLog, OrderIndex]]:
    log = SegmentedLog(tmp_path, "combined", CAP, companion=INDEX_NAME)
    index = OrderIndex(tmp_path, log)
    yield log, index
    index.close()
    log.close()


def interleave(index: OrderIndex, count: int) -> dict[Stream, bytes]:
    """``count`` lines, every third on stderr; what each stream printed."""
    printed = {Stream.STDOUT: b"", Stream.STDERR: b""}
    for i in range(count):
        stream = Stream.STDERR if i % 3 == 0 else Stream.STDOUT
        data = f"{stream.value} line {i}\n".encode()
        index.append(stream, data)
        printed[stream] += data
    return printed


def views(index: OrderIndex, log: SegmentedLog) -> dict[Stream, StreamView]:
    return {stream: StreamView(stream, index, log) for stream in (Stream.STDOUT, Stream.STDERR)}


def test_each_stream_reads_back_what_it_printed_across_segments(stored: tuple[SegmentedLog, OrderIndex]) -> None:
    log, index = stored
    printed = interleave(index, 3000)  # 50 KiB: four segments
    assert log.size // log.segment_size == 3
    for stream, view in views(index, log).items():
        assert view.read().data == printed[stream]
        newlines = printed[stream].count(b"\n")
        assert (view.size, view.lines, view.total_lines) == (len(printed[stream]), newlines, newlines)
        assert view.read(10, 20).data == printed[stream][10:30]
        fifth = sum(len(line) + 1 for line in printed[stream].split(b"\n")[:5])
        assert view.offset_of_line(5) == fifth
        assert view.dropped == 0 and view.lost == 0


def test_runs_say_whose_bytes_lie_where(stored: tuple[SegmentedLog, OrderIndex]) -> None:
    log, index = stored
    index.append(Stream.STDERR, b"e1\n")
    index.append(Stream.STDOUT, b"o1\no2\n")
    index.append(Stream.STDERR, b"e2")
    assert list(index.runs(0, log.size)) == [
        (Stream.STDERR, 0, 0, 3),
        (Stream.STDOUT, 0, 3, 6),
        (Stream.STDERR, 3, 9, 2),
    ]
    err = views(index, log)[Stream.STDERR]
    assert err.read().data == b"e1\ne2"
    assert (err.lines, err.total_lines) == (1, 2)  # a trailing line without its newline counts


def test_past_the_cap_the_middle_goes_and_each_stream_says_how_much(stored: tuple[SegmentedLog, OrderIndex]) -> None:
    log, index = stored
    printed = interleave(index, 12_000)  # about 200 KiB into a 128 KiB cap
    assert log.dropped > 0
    for stream, view in views(index, log).items():
        result = view.read()
        assert 0 < view.dropped == result.dropped
        assert len(result.data) + result.dropped == len(printed[stream])
        assert printed[stream].endswith(result.data[-1000:])  # the tail is kept whole
        assert printed[stream].startswith(result.data[:1000])  # and the head
        assert view.gap_cause == "the output cap"


def test_bytes_the_disk_refused_are_a_counted_gap_of_their_stream(stored: tuple[SegmentedLog, OrderIndex]) -> None:
    log, index = stored
    index.append(Stream.STDOUT, b"before\n")
    index.skip(Stream.STDERR, 5, OSError(errno.ENOSPC, "full"))
    index.append(Stream.STDOUT, b"after\n")
    out, err = views(index, log).values()
    assert out.read().data == b"before\nafter\n" and out.lost == 0
    assert err.lost == 5 and err.read().dropped == 5 and err.lost_reason == "ENOSPC"


def test_a_restarted_server_reads_the_same_from_the_files(
    tmp_path: Path, stored: tuple[SegmentedLog, OrderIndex]
) -> None:
    log, index = stored
    interleave(index, 3000)
    before = {stream: (view.size, view.lines, view.read().data) for stream, view in views(index, log).items()}
    index.close()
    log.close()
    log = SegmentedLog.recover(tmp_path, "combined", CAP, companion=INDEX_NAME)
    index = OrderIndex.recover(tmp_path, log)
    after = {stream: (view.size, view.lines, view.read().data) for stream, view in views(index, log).items()}
    assert after == before
    index.remove_files()
    assert not list(tmp_path.glob(f"{INDEX_NAME}.*"))
    log.close()
