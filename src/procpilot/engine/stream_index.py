"""Which stream each byte of a session's combined log came from: the ordering index.

A session's output is stored once, as its combined log in arrival order (engine/segments.py);
stdout and stderr are read through that log. Each combined segment has a companion file
``order.NNNNNN`` of 16-byte records, one where a run of one stream starts: at the segment's first
byte and at every switch between stdout and stderr. A record holds the run's combined offset (its
top bit set for stderr) and the stdout bytes printed before it (stderr's are the offset minus
those). An index file goes when its segment goes, so the cap bounds it with the data.

Memory holds, per kept segment, each stream's bytes and lines before it (four integers, beside
the log's own line index; see SegmentTable); the records, which grow with the number of
switches, stay on disk and are found by binary search. A segment that starts with a record
reads on its own: a reader never needs an earlier segment, which is what lets the cap delete
them.
"""

from __future__ import annotations

import contextlib
import errno
import os
import struct
from collections.abc import Callable, Iterator
from itertools import chain, islice, pairwise
from pathlib import Path

from procpilot.engine.segments import (
    OUT_OF_DESCRIPTORS,
    WRITERS,
    LineReads,
    ReadResult,
    SegmentedLog,
    SegmentTable,
    Stream,
    describe_gaps,
    past_line,
)

__all__ = ["INDEX_NAME", "OrderIndex", "StreamView"]

INDEX_NAME = "order"
_RECORD = struct.Struct("<QQ")  # combined offset (| _STDERR_BIT), stdout bytes before it
_STDERR_BIT = 1 << 63
_OFFSET = _STDERR_BIT - 1
_BATCH = 4096  # records read at once
_STREAMS = (Stream.STDOUT, Stream.STDERR)
_BYTES = {Stream.STDOUT: 0, Stream.STDERR: 1}  # columns of the segment table
_LINES = {Stream.STDOUT: 2, Stream.STDERR: 3}

# (combined offset, stream, stdout bytes before it)
Record = tuple[int, Stream, int]


def _unpack(word: int, stdout_before: int) -> Record:
    stream = Stream.STDERR if word & _STDERR_BIT else Stream.STDOUT
    return word & _OFFSET, stream, stdout_before


def _position(record: Record, stream: Stream) -> int:
    """Bytes of ``stream`` printed before ``record``'s run."""
    offset, _, stdout_before = record
    return stdout_before if stream is Stream.STDOUT else offset - stdout_before


def _spans(stretches: list[tuple[int, int, int, int]], start: int, end: int) -> list[tuple[int, int]]:
    """(offset, length) spans, -1 for a gap, of stream bytes [start, end) from ``stretches``:
    (position, next position, combined offset, bytes of its run there)."""
    if all(size == p2 - p for p, p2, _, size in stretches):  # each stretch one whole run: the usual case
        spans = [(o, p2 - p) for p, p2, o, _ in stretches]
        p, p2, o, _ = stretches[-1]
        if p2 > end:
            spans[-1] = (o, end - p)
        p, _, o, _ = stretches[0]
        if p < start:
            spans[0] = (o + start - p, spans[0][1] - (start - p))
        return spans
    spans = []
    for p, p2, o, size in stretches:
        lo = max(p, start)
        if lo < p + size:
            hi = min(p + size, end)
            spans.append((o + lo - p, hi - lo))
            lo = hi
        if lo < min(p2, end):
            spans.append((-1, min(p2, end) - lo))
    return spans


class OrderIndex:
    """The stream of every byte of ``log``, written as bytes are appended through it."""

    def __init__(self, directory: Path, log: SegmentedLog) -> None:
        self._dir = directory
        self._log = log
        self.size = dict.fromkeys(_STREAMS, 0)  # bytes per stream, stored or not
        self.lines = dict.fromkeys(_STREAMS, 0)  # stored newlines per stream
        self.lost = dict.fromkeys(_STREAMS, 0)
        self.ends_with_newline = dict.fromkeys(_STREAMS, True)
        # Per kept segment: each stream's bytes and newlines before its first byte (_BYTES, _LINES).
        self._table = SegmentTable(4)
        self._fd: int | None = None
        self._fd_index = -1
        self._fd_size = 0  # whole records in the open file: the next one goes there
        self._run: Stream | None = None  # the stream of the open file's last record
        self._opened = False

    # -- writing -------------------------------------------------------------------------------

    def append(self, stream: Stream, data: bytes) -> None:
        """Store ``data`` of ``stream`` at the end of the log and note whose it is."""
        pos = 0
        size = self._log.segment_size
        while pos < len(data):
            take = min(len(data) - pos, size - self._log.size % size)
            self._piece(stream, data if take == len(data) else data[pos : pos + take], take, None)
            pos += take
        if data:
            self.ends_with_newline[stream] = data[-1] == 10

    @property
    def is_open(self) -> bool:
        """Whether the log's and this index's files for the next byte are open."""
        log = self._log
        return log.is_open and self._fd is not None and self._fd_index == log.size // log.segment_size

    def ready(self) -> bool:
        """Whether the log's and this index's files for the next byte are open (SegmentedLog.ready)."""
        log = self._log
        if not log.ready():
            return False
        if self.is_open:
            return True
        try:
            self._open(log.size // log.segment_size)
        except OSError as exc:
            return exc.errno not in OUT_OF_DESCRIPTORS
        WRITERS.touch(self)
        return True

    def skip(self, stream: Stream, size: int, reason: OSError) -> None:
        """``size`` bytes of ``stream`` that were printed but cannot be stored: a counted gap."""
        segment = self._log.segment_size
        while size > 0:
            take = min(size, segment - self._log.size % segment)
            self._piece(stream, None, take, reason)
            size -= take

    def _piece(self, stream: Stream, data: bytes | None, size: int, reason: OSError | None) -> None:
        """One piece inside one segment: its record first (if it starts a run), then its bytes."""
        log = self._log
        index = log.size // log.segment_size
        self._reach(index)
        if self._run is not stream or self._fd_index != index:
            refused = self._record(index, log.size, stream)
            if refused is not None and data is not None:
                # Bytes whose stream is not written down would be read as the other stream's:
                # they become a gap instead, counted and said like any the disk refuses.
                data, reason = None, refused
        lines, lost = log.lines, log.lost
        if data is None:
            log.skip(size, reason or OSError(errno.EIO, "not stored"))
        else:
            log.write(data)
        self.size[stream] += size
        self.lines[stream] += log.lines - lines
        self.lost[stream] += log.lost - lost

    def _reach(self, index: int) -> None:
        """The counters of segment ``index``, taken at its first byte; the entries of segments
        the cap deleted since go (bar the first: where the gap begins)."""
        table = self._table
        if table.reached <= index:
            sizes, lines = self.size, self.lines
            table.add(index, (sizes[Stream.STDOUT], sizes[Stream.STDERR], lines[Stream.STDOUT], lines[Stream.STDERR]))
            log = self._log
            table.forget(log.head_end // log.segment_size + 1, log.tail_start // log.segment_size)

    def _record(self, index: int, offset: int, stream: Stream) -> OSError | None:
        word = offset | (_STDERR_BIT if stream is Stream.STDERR else 0)
        try:
            fd = self._fd if self._fd is not None and self._fd_index == index else self._open(index)
            WRITERS.touch(self)
            # At its own place, not appended: a record torn by a full disk is overwritten by the next.
            written = os.pwrite(fd, _RECORD.pack(word, self.size[Stream.STDOUT]), self._fd_size)
            if written != _RECORD.size:
                raise OSError(errno.ENOSPC, "a short write of an index record")
        except OSError as exc:
            self._run = None  # the next piece tries again
            if exc.errno in (errno.EBADF, errno.EIO):
                self.close()
            return exc
        self._fd_size += _RECORD.size
        self._run = stream
        return None

    def _open(self, index: int) -> int:
        self.close()
        path = self._path(index)
        flags = os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC
        try:
            fd = os.open(path, flags, 0o600)
        except FileNotFoundError:  # the session's first byte: its directory is made only now
            self._dir.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, flags, 0o600)
        self._opened = True
        self._fd, self._fd_index = fd, index
        size = os.fstat(fd).st_size
        self._fd_size = size - size % _RECORD.size
        self._run = None
        return fd

    def close(self) -> None:
        WRITERS.forget(self)
        if self._fd is not None:
            os.close(self._fd)
        self._fd, self._fd_index, self._run = None, -1, None

    def remove_files(self) -> None:
        self.close()
        if self._opened:
            for path in self._dir.glob(f"{INDEX_NAME}.*"):
                path.unlink(missing_ok=True)

    def _path(self, index: int) -> Path:
        return self._dir / f"{INDEX_NAME}.{index:06d}"

    # -- reading -------------------------------------------------------------------------------

    def before(self, stream: Stream, index: int) -> int:
        """Bytes of ``stream`` before segment ``index``."""
        return self._table.value(_BYTES[stream], index)

    def _records(self, index: int, first: int = 0) -> Iterator[Record]:
        """The records of segment ``index`` from number ``first`` on: none if its file is gone
        (or cannot be read: its bytes then read as a gap, never as another stream's)."""
        for raw in self._raw_batches(index, first):
            for word, stdout_before in _RECORD.iter_unpack(raw):
                yield _unpack(word, stdout_before)

    def _raw_batches(self, index: int, first: int) -> Iterator[bytes]:
        """Whole records of segment ``index`` from number ``first`` on, ``_BATCH`` at a time."""
        fd = self._open_for_reading(index)
        if fd is None:
            return
        try:
            at = first * _RECORD.size
            while True:
                try:
                    buf = os.pread(fd, _RECORD.size * _BATCH, at)
                except OSError:
                    return
                whole = len(buf) - len(buf) % _RECORD.size
                if not whole:
                    return
                yield buf[:whole] if whole < len(buf) else buf
                at += whole
        finally:
            os.close(fd)

    def _points(self, index: int, first: int, stream: Stream) -> Iterator[list[tuple[int, bool, int]]]:
        """Segment ``index``'s records from number ``first`` on as ``stream`` reads them, a batch
        at a time: (combined offset, whether the run is the stream's, the stream's bytes before)."""
        for raw in self._raw_batches(index, first):
            records = _RECORD.iter_unpack(raw)
            if stream is Stream.STDERR:
                yield [(w & _OFFSET, bool(w & _STDERR_BIT), (w & _OFFSET) - out) for w, out in records]
            else:
                yield [(w & _OFFSET, not w & _STDERR_BIT, out) for w, out in records]

    def _open_for_reading(self, index: int) -> int | None:
        try:
            fd = os.open(self._path(index), os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            os.pread(fd, 0, 0)  # a directory, say, opens but does not read
        except OSError:
            os.close(fd)
            return None
        return fd

    def _find(self, index: int, key: Callable[[Record], int], pos: int) -> int:
        """The number of the last record of segment ``index`` whose ``key`` is at most ``pos``
        (0 if none is): a binary search over the file, a read per step."""
        fd = self._open_for_reading(index)
        if fd is None:
            return 0
        try:
            lo, hi = 0, os.fstat(fd).st_size // _RECORD.size
            while lo < hi:
                mid = (lo + hi) // 2
                raw = os.pread(fd, _RECORD.size, mid * _RECORD.size)
                if len(raw) < _RECORD.size:  # cut short meanwhile (a rebuild's trim): search below
                    hi = mid
                elif key(_unpack(*_RECORD.unpack(raw))) <= pos:
                    lo = mid + 1
                else:
                    hi = mid
            return max(0, lo - 1)
        except OSError:
            return 0
        finally:
            os.close(fd)

    def _segment_end(self, stream: Stream, index: int) -> int:
        """Bytes of ``stream`` before the next segment with an entry (all of them after the last)."""
        following = self._table.following(index)
        return self.size[stream] if following is None else self.before(stream, following)

    def spans(self, stream: Stream, start: int, end: int) -> Iterator[list[tuple[int, int]]]:
        """``(combined offset, length)`` for bytes [start, end) of ``stream``, in order, in
        batches; an offset of -1 is a gap: bytes of the stream that no kept segment holds."""
        pos = start
        index = self._table.find(_BYTES[stream], pos) if self._table.numbers else None
        while pos < end and index is not None:
            upto = min(end, self._segment_end(stream, index))
            if pos < upto:
                yield from self._segment_spans(stream, index, pos, upto)
                pos = upto
            index = self._table.following(index)
        if pos < end:
            yield [(-1, end - pos)]

    def _segment_spans(self, stream: Stream, index: int, start: int, end: int) -> Iterator[list[tuple[int, int]]]:
        """``spans`` for bytes [start, end) of ``stream``, all inside segment ``index``, a batch
        at a time.

        A run of the stream ends where the next record begins; bytes of the stream that no run
        holds (a record the disk refused, a file the cap deleted) are a gap up to where the next
        record places them. Built by comprehensions over a batch of records, not a loop: a
        command that switches streams at every line makes a record per line, and a page of its
        stdout walks thousands of them."""
        log = self._log
        first = self._find(index, lambda record: _position(record, stream), start)
        # Where the segment's bytes of the stream begin (a gap up to its first record, if that
        # one is missing) and where they end.
        previous = (index * log.segment_size, False, self.before(stream, index)) if first == 0 else None
        last = (min((index + 1) * log.segment_size, log.size), False, self._segment_end(stream, index))
        pos = start
        for batch in chain(self._points(index, first, stream), [[last]]):
            points = batch if previous is None else [previous, *batch]
            previous = points[-1]
            # (position, next position, offset, bytes of the run) for each stretch that meets [pos, end)
            stretches = [
                (p, p2, o, min(o2 - o, p2 - p) if mine else 0)
                for (o, mine, p), (o2, _, p2) in pairwise(points)
                if p < p2 and pos < p2 and p < end
            ]
            if stretches:
                yield _spans(stretches, pos, end)
                pos = min(end, stretches[-1][1])
            if pos >= end:
                return

    def runs(self, start: int, end: int) -> Iterator[tuple[Stream, int, int, int]]:
        """``(stream, stream offset, combined offset, length)`` for every run in combined bytes
        [start, end), in order; what no kept segment's index covers is left out."""
        log = self._log
        pos = start
        while pos < end:
            index = pos // log.segment_size
            upto = min(end, (index + 1) * log.segment_size, log.size)
            records = self._records(index, self._find(index, lambda record: record[0], pos))
            record = next(records, None)
            while record is not None:
                following = next(records, None)
                run_end = upto if following is None else min(upto, following[0])
                lo = max(pos, record[0])
                if lo < run_end:
                    yield record[1], _position(record, record[1]) + lo - record[0], lo, run_end - lo
                if run_end >= upto:
                    break
                record = following
            pos = upto

    def offset_of_line(self, stream: Stream, line: int) -> int:
        """Where 0-based ``line`` of ``stream`` starts (see SegmentedLog.offset_of_line)."""
        if line <= 0:
            return 0
        if line > self.lines[stream]:
            return self.size[stream]
        log = self._log
        index = self._table.find(_LINES[stream], line - 1)
        if log.head_end <= index * log.segment_size < log.tail_start:
            return self.before(stream, log.tail_start // log.segment_size)
        seen = self._table.value(_LINES[stream], index)
        pos = self.before(stream, index)
        for batch in self._segment_spans(stream, index, pos, self._segment_end(stream, index)):
            pieces = log.read_spans([span for span in batch if span[0] >= 0], raw=True)[0]
            found = sum(piece.count(b"\n") for piece in pieces)
            if seen + found < line:  # not in this batch: count it whole
                seen += found
                pos += sum(length for _, length in batch)
                continue
            held = iter(pieces)
            for offset, length in batch:
                piece = next(held) if offset >= 0 else b""
                seen, past = past_line(piece, seen, line)
                if past is not None:
                    return pos + past
                pos += length
        return self.size[stream]

    # -- a previous server's files -------------------------------------------------------------

    @classmethod
    def recover(cls, directory: Path, log: SegmentedLog) -> OrderIndex:
        """The index of ``log`` (already recovered) as its files hold it. A segment the cap
        deleted took its records along: the bytes and lines of each stream in it are counted
        at the first kept segment after it (lines printed there are not counted: see
        SegmentedLog.recover)."""
        index = cls(directory, log)
        index._opened = True  # its files, if any, are the previous server's: remove_files takes them too
        segment = log.segment_size
        last_byte: dict[Stream, int] = {}
        for number in range(-(-log.size // segment)):
            index._reach(number)
            lo, hi = number * segment, min((number + 1) * segment, log.size)
            index._trim(number)
            records = list(islice(index._records(number), 1))
            if not records:
                continue  # deleted for the cap: counted at the next segment that has records
            if records[0][0] == lo:
                for stream in _STREAMS:
                    index._table.set(_BYTES[stream], number, _position(records[0], stream))
            stdout_spans: list[tuple[int, int]] = []
            stdout_end = index.before(Stream.STDOUT, number)
            for stream, position, offset, length in index.runs(lo, hi):
                last_byte[stream] = offset + length - 1
                if stream is Stream.STDOUT:
                    stdout_spans.append((offset, length))
                    stdout_end = position + length
            newlines = sum(piece.count(b"\n") for piece in log.read_spans(stdout_spans, raw=True)[0])
            segment_lines = log.lines_in_segment(number)
            index.lines[Stream.STDOUT] += newlines
            index.lines[Stream.STDERR] += max(0, segment_lines - newlines)
            index.size[Stream.STDOUT] = stdout_end
            index.size[Stream.STDERR] = hi - stdout_end
        for stream, at in last_byte.items():
            index.ends_with_newline[stream] = log.read_spans([(at, 1)], raw=True)[0] == [b"\n"]
        return index

    def _trim(self, number: int) -> None:
        """Cut a record torn by a crash off the end of segment ``number``'s index."""
        with contextlib.suppress(OSError):  # gone, or unreadable: its bytes read as a gap anyway
            size = self._path(number).stat().st_size
            if size % _RECORD.size:
                os.truncate(self._path(number), size - size % _RECORD.size)


class StreamView(LineReads):
    """stdout or stderr of a session, read through its combined log and ordering index.

    The same reads as a log of its own (offsets of the stream alone, the cap's gap, the disk's
    gaps, line lookups), with no copy of the bytes."""

    def __init__(self, stream: Stream, index: OrderIndex, log: SegmentedLog) -> None:
        self._stream = stream
        self._index = index
        self._log = log

    @property
    def size(self) -> int:
        return self._index.size[self._stream]

    @property
    def lines(self) -> int:
        return self._index.lines[self._stream]

    @property
    def lost(self) -> int:
        return self._index.lost[self._stream]

    @property
    def lost_reason(self) -> str | None:
        return self._log.lost_reason

    @property
    def dropped(self) -> int:
        """Bytes of this stream in the segments deleted for the cap."""
        log = self._log
        if not log.dropped:
            return 0
        segment = log.segment_size
        return self._index.before(self._stream, log.tail_start // segment) - self._index.before(
            self._stream, log.head_end // segment
        )

    @property
    def gap_cause(self) -> str:
        return describe_gaps(self.dropped, self.lost, self.lost_reason)

    @property
    def total_lines(self) -> int:
        """Lines in the stream: newlines, plus one for a trailing unterminated line."""
        ends = self._index.ends_with_newline[self._stream]
        return self.lines + (0 if ends or self.size == 0 else 1)

    def offset_of_line(self, line: int) -> int:
        return self._index.offset_of_line(self._stream, line)

    def read(self, offset: int = 0, limit: int | None = None) -> ReadResult:
        """Bytes of the stream from ``offset``, at most ``limit``; as SegmentedLog.read."""
        total = self.size
        start = min(max(0, offset), total)
        end = total if limit is None else min(total, start + max(0, limit))
        pieces: list[bytes] = []
        dropped = 0
        for batch in self._index.spans(self._stream, start, end):
            dropped += sum(length for offset, length in batch if offset < 0)
            got, lost = self._log.read_spans([span for span in batch if span[0] >= 0])
            pieces.extend(got)
            dropped += lost
        return ReadResult(b"".join(pieces), start, end, dropped, total)
