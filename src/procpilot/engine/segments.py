"""Segment files: one append-only log addressed by absolute byte offsets that never move.

A :class:`SegmentedLog` is fixed-size numbered segment files. Up to the cap everything is kept;
past it the first half of the cap (the head) is kept forever and the newest segments (the tail)
roll, so a reader sees head + an explicit gap + tail, and offsets stay the absolute positions they
would have had if nothing were dropped. Memory holds a few integers per kept segment (a
:class:`SegmentTable`), never the output itself: bounded by the cap, however much is printed.
A session's output is one such log (``combined``, engine/capture.py); its streams are read
through it (engine/stream_index.py).
"""

from __future__ import annotations

import bisect
import enum
import errno
import logging
import os
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

__all__ = [
    "OUT_OF_DESCRIPTORS",
    "WRITERS",
    "LineReads",
    "LineSlice",
    "OpenWriters",
    "OutputView",
    "ReadResult",
    "SegmentTable",
    "SegmentedLog",
    "Stream",
    "describe_gaps",
    "past_line",
]

_HEAD_SEGMENTS = 4
_TAIL_SEGMENTS = 4
_MIN_SEGMENT = 16 * 1024
_SCAN_CHUNK = 1 << 20
_MAX_LOST_RANGES = 64
_WINDOW = 64 * 1024  # bytes read at once when many small ranges are asked for together
_EXTENT = 4 << 20  # ranges spread over at most this many bytes are read in one go
_log = logging.getLogger(__name__)


class _Closable(Protocol):
    def close(self) -> None: ...


class OpenWriters:
    """The output files held open for writing, across every session: the ``limit`` most recently
    written. A session that printed once and now sleeps would otherwise hold its log's and its
    index's descriptors for as long as it runs, twice the two it needs (stdout, stderr): the
    difference between 10,000 sleeping sessions fitting under a descriptor limit or not. A writer
    pushed out reopens its file on its next write (~5 µs)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._open: OrderedDict[_Closable, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._open)

    def touch(self, writer: _Closable) -> None:
        """``writer`` holds a file open and just wrote to it: keep it, close the least recent."""
        if writer in self._open:
            self._open.move_to_end(writer)
            return
        self._open[writer] = None
        while len(self._open) > self.limit:
            oldest, _ = self._open.popitem(last=False)
            oldest.close()

    def forget(self, writer: _Closable) -> None:
        self._open.pop(writer, None)


WRITERS = OpenWriters(512)
# Errors that pass: the process (or the host) is out of descriptors for a moment. A writer told
# one of these would rather leave the bytes where they are (a pipe) and be asked again shortly.
OUT_OF_DESCRIPTORS = frozenset({errno.EMFILE, errno.ENFILE})


class Stream(enum.Enum):
    COMBINED = "combined"
    STDOUT = "stdout"
    STDERR = "stderr"

    # Members are singletons compared by identity: hashing by identity too spares every dict keyed
    # by a stream (each byte counted, each view looked up) Enum's hash, a Python-level call.
    __hash__ = object.__hash__


@dataclass(frozen=True, slots=True)
class ReadResult:
    """Bytes ``[start, end)`` of a view; ``dropped`` bytes inside that range were lost to the cap."""

    data: bytes
    start: int
    end: int
    dropped: int
    total: int


@dataclass(frozen=True, slots=True)
class LineSlice:
    """Lines ``[first, first + len(lines))`` of a view (0-based), ``total`` lines in all."""

    lines: list[bytes]
    first: int
    total: int
    dropped_lines: int
    unread_bytes: int = 0  # bytes of the asked-for range past ``max_bytes``, not read


class SegmentTable:
    """Counters taken at each segment's first byte (one column per counter), found by value.

    Only kept segments have an entry, and the first one the cap deleted (where the gap begins):
    the table holds at most about as many entries as the cap has segments, however much a
    session prints. A segment without an entry reads its covering entry's values."""

    def __init__(self, columns: int) -> None:
        self.numbers: list[int] = []
        self.columns: list[list[int]] = [[] for _ in range(columns)]

    @property
    def reached(self) -> int:
        """The number of the next segment to add."""
        return self.numbers[-1] + 1 if self.numbers else 0

    def add(self, number: int, values: Sequence[int]) -> None:
        self.numbers.append(number)
        for column, value in zip(self.columns, values, strict=True):
            column.append(value)

    def forget(self, lo: int, hi: int) -> None:
        """Drop the entries of segments ``lo`` up to (not including) ``hi``."""
        first, last = bisect.bisect_left(self.numbers, lo), bisect.bisect_left(self.numbers, hi)
        if first < last:
            del self.numbers[first:last]
            for column in self.columns:
                del column[first:last]

    def _entry(self, number: int) -> int:
        return max(0, bisect.bisect_right(self.numbers, number) - 1)

    def value(self, column: int, number: int) -> int:
        return self.columns[column][self._entry(number)]

    def set(self, column: int, number: int, value: int) -> None:
        self.columns[column][self._entry(number)] = value

    def find(self, column: int, value: int) -> int:
        """The segment of the last entry whose ``column`` is at most ``value``."""
        return self.numbers[max(0, bisect.bisect_right(self.columns[column], value) - 1)]

    def following(self, number: int) -> int | None:
        """The next segment after ``number`` that has an entry."""
        at = bisect.bisect_right(self.numbers, number)
        return self.numbers[at] if at < len(self.numbers) else None


def describe_gaps(dropped: int, lost: int, lost_reason: str | None) -> str:
    """What made the gaps a read skips, for the marker a reader sees in their place."""
    causes = ["the output cap"] if dropped else []
    if lost:
        causes.append(f"a disk error ({lost_reason})")
    return " and ".join(causes) or "the output cap"


class OutputView(Protocol):
    """What every view of a session's output reads like (a log of its own, or a stream of one)."""

    @property
    def size(self) -> int: ...
    @property
    def lines(self) -> int: ...
    @property
    def dropped(self) -> int: ...
    @property
    def lost(self) -> int: ...
    @property
    def lost_reason(self) -> str | None: ...
    @property
    def gap_cause(self) -> str: ...
    @property
    def total_lines(self) -> int: ...
    def offset_of_line(self, line: int) -> int: ...
    def read(self, offset: int = 0, limit: int | None = None) -> ReadResult: ...
    def read_lines(
        self, first: int, count: int | None, max_bytes: int | None = None, *, keep_end: bool = False
    ) -> LineSlice: ...


class LineReads:
    """Reading whole lines, for any view that can find where a line starts and read bytes."""

    @property
    def total_lines(self) -> int:
        raise NotImplementedError

    def offset_of_line(self, line: int) -> int:
        raise NotImplementedError

    def read(self, offset: int = 0, limit: int | None = None) -> ReadResult:
        raise NotImplementedError

    def read_lines(
        self, first: int, count: int | None, max_bytes: int | None = None, *, keep_end: bool = False
    ) -> LineSlice:
        """Lines ``[first, first + count)`` (``count`` None: to the end), reading at most
        ``max_bytes`` of them: the first ones (the last line may then be partial), or with
        ``keep_end`` the last ones (the first line may be partial). ``unread_bytes`` counts the rest."""
        total = self.total_lines
        first = min(max(0, first), total)
        last = total if count is None else min(total, first + max(0, count))
        start = self.offset_of_line(first)
        end = self.offset_of_line(last)
        unread = 0 if max_bytes is None else max(0, end - start - max(0, max_bytes))
        result = self.read(start + unread, end - start - unread) if keep_end else self.read(start, end - start - unread)
        # b"".split() is [b""]: an empty range must be no lines, not one empty line.
        lines = result.data.split(b"\n") if result.data else []
        if lines and lines[-1] == b"" and result.data.endswith(b"\n"):
            lines.pop()
        dropped_lines = max(0, (last - first) - len(lines)) if result.dropped and not unread else 0
        return LineSlice(lines, first, total, dropped_lines, unread)


def past_line(data: bytes, seen: int, line: int) -> tuple[int, int | None]:
    """Count ``data``'s newlines on from ``seen`` (newlines before it): the count after them and
    None, or, if one of them is newline number ``line``, ``line`` and the offset just past it."""
    cursor = 0
    while (hit := data.find(b"\n", cursor)) >= 0:
        seen += 1
        cursor = hit + 1
        if seen == line:
            return seen, cursor
    return seen, None


class SegmentedLog(LineReads):
    """One append-only log, stored as numbered segment files."""

    def __init__(self, directory: Path, name: str, cap_bytes: int, companion: str | None = None) -> None:
        self._dir = directory
        self._name = name
        # Files numbered like the segments (an index of them) that go when their segment goes.
        self._companion = companion
        self.segment_size = max(_MIN_SEGMENT, cap_bytes // (_HEAD_SEGMENTS + _TAIL_SEGMENTS))
        self.size = 0
        self.lines = 0  # count of b"\n" written, so far
        # Per kept segment: newline count before it starts (for line lookups).
        self._lines_before = SegmentTable(1)
        # True iff bytes [head_end, tail_start) have been deleted to honour the cap.
        self._tail_start = 0
        self._fd: int | None = None
        self._fd_index = -1
        self._last_byte_newline = True
        # Bytes the disk refused (ENOSPC, EIO...): [start, end) ranges of the view, merged, at most
        # _MAX_LOST_RANGES of them (past it the last range grows over what lies between).
        self._lost: list[list[int]] = []
        self.lost = 0
        self.lost_reason: str | None = None  # the errno name of the last refusal, e.g. "ENOSPC"

    @classmethod
    def recover(cls, directory: Path, name: str, cap_bytes: int, companion: str | None = None) -> SegmentedLog:
        """The view as a previous server left it on disk, ready for more writes at its end.

        Sizes and line counts come from the segment files themselves (the files are the truth).
        Segments already rolled out past the cap held lines nobody can count any more: line
        numbers after the gap shift down by that many (byte offsets do not move)."""
        log = cls(directory, name, cap_bytes, companion)
        indexes = sorted(
            int(p.name.rsplit(".", 1)[1]) for p in directory.glob(f"{name}.*") if p.name.rsplit(".", 1)[1].isdigit()
        )
        if not indexes:
            return log
        last = indexes[-1]
        present = set(indexes)
        for index in range(last + 1):
            if index in present or index == _HEAD_SEGMENTS:  # the first deleted one: where the gap begins
                log._lines_before.add(index, [log.lines])
            if index in present:
                log.lines += log._count_newlines(index)
        last_size = (directory / f"{name}.{last:06d}").stat().st_size
        log.size = last * log.segment_size + last_size
        oldest_kept_tail = last - _TAIL_SEGMENTS + 1
        if oldest_kept_tail > _HEAD_SEGMENTS:
            log._tail_start = oldest_kept_tail * log.segment_size
        log._last_byte_newline = last_size == 0 or log._pread(last, last_size - 1, 1) == b"\n"
        return log

    def _count_newlines(self, index: int) -> int:
        count = 0
        within = 0
        while chunk := self._pread(index, within, _SCAN_CHUNK):
            count += chunk.count(b"\n")
            within += len(chunk)
        return count

    # -- writing -------------------------------------------------------------------------------

    def _path(self, index: int) -> Path:
        return self._dir / f"{self._name}.{index:06d}"

    @property
    def head_end(self) -> int:
        return _HEAD_SEGMENTS * self.segment_size

    @property
    def tail_start(self) -> int:
        """Where the kept tail begins: bytes [head_end, tail_start) were deleted for the cap."""
        return self._tail_start

    @property
    def dropped(self) -> int:
        """Bytes deleted between the head and the first kept tail segment."""
        return max(0, self._tail_start - self.head_end)

    def write(self, data: bytes, newlines: int | None = None) -> None:
        """Append ``data``; ``newlines`` is its count of b"\\n" if the caller has it already
        (counting is most of the CPU a big burst costs, and two views hold the same bytes).

        Never raises for the disk's sake: bytes the disk refuses are counted as lost (``lost``,
        ``lost_reason``) and their range becomes a gap that reads skip and report, exactly like
        the cap's; the offsets of everything after stay the ones it was printed at, and once
        the disk takes bytes again they are stored again."""
        if not data:
            return
        pos = 0
        while pos < len(data):
            index, within = divmod(self.size, self.segment_size)
            room = self.segment_size - within
            part = data if pos == 0 and len(data) <= room else data[pos : pos + room]
            try:
                if index != self._fd_index or self._fd is None:
                    self._fd = self._open_segment(index)
                WRITERS.touch(self)
                # At its own offset, not appended: after a refused range the file has a hole
                # there (the lost range), and later bytes still land where their offset says.
                written = os.pwrite(self._fd, part, within)
            except OSError as exc:
                self._lose(len(part), exc)
                written = len(part)
            else:
                whole = part is data and written == len(data)
                self.lines += newlines if whole and newlines is not None else part.count(b"\n", 0, written)
                if not written:  # a disk that takes nothing without saying why: lose it, go on
                    self._lose(len(part), OSError(errno.EIO, "write returned 0"))
                    written = len(part)
            self.size += written
            pos += written
        self._last_byte_newline = data[-1] == 10

    @property
    def is_open(self) -> bool:
        """Whether the file the next byte goes to is open."""
        return self._fd is not None and self._fd_index == self.size // self.segment_size

    def ready(self) -> bool:
        """Whether the file the next byte goes to is open (opening it if need be). False only
        while no descriptor can be had (``OUT_OF_DESCRIPTORS``): then bytes written now would be
        lost, and the caller should leave them in their pipe and ask again shortly. Any other
        refusal is True: ``write`` counts what it loses, and waiting would not mend a full disk."""
        if self.is_open:
            return True
        try:
            self._fd = self._open_segment(self.size // self.segment_size)
        except OSError as exc:
            return exc.errno not in OUT_OF_DESCRIPTORS
        WRITERS.touch(self)
        return True

    def skip(self, size: int, reason: OSError) -> None:
        """``size`` bytes that were printed but cannot be stored: a counted gap at the end."""
        self._lose(size, reason)
        self.size += size

    @property
    def gap_cause(self) -> str:
        return describe_gaps(self.dropped, self.lost, self.lost_reason)

    def _lose(self, size: int, exc: OSError) -> None:
        """Bytes [size, size + n) could not be stored; their newlines are not counted (reads skip
        them, so line numbers stay those of the bytes a reader gets)."""
        start, end = self.size, self.size + size
        if self._lost and self._lost[-1][1] == start:
            self._lost[-1][1] = end
        elif len(self._lost) < _MAX_LOST_RANGES:
            self._lost.append([start, end])
        else:
            self._lost[-1][1] = end  # bounded memory: the last range swallows what lies between
        if not self.lost:  # once per view, not per chunk: a full disk stays full for a while
            _log.warning("%s: could not store output (%s); counting what is lost", self._path(0).parent, exc)
        self.lost += size
        self.lost_reason = errno.errorcode.get(exc.errno or 0, type(exc).__name__)
        if self._fd is not None and exc.errno in (errno.EBADF, errno.EIO):
            self.close()  # reopen the segment on the next write

    def _open_segment(self, index: int) -> int:
        self.close()
        # Segments skipped (the disk refused all their bytes) are covered by the entry before.
        if self._lines_before.reached <= index:
            self._lines_before.add(index, [self.lines])
        flags = os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC  # no O_APPEND: Linux's pwrite would ignore the offset
        try:
            fd = os.open(self._path(index), flags, 0o600)
        except FileNotFoundError:
            # The session's first byte: its directory is made only now, so a session that prints
            # nothing (most short commands) costs no mkdir and no rmdir.
            self._dir.mkdir(parents=True, exist_ok=True)
            fd = os.open(self._path(index), flags, 0o600)
        self._fd_index = index
        oldest_kept_tail = index - _TAIL_SEGMENTS + 1
        if oldest_kept_tail > _HEAD_SEGMENTS:
            victim = oldest_kept_tail - 1
            if victim >= _HEAD_SEGMENTS:
                self._path(victim).unlink(missing_ok=True)
                if self._companion is not None:
                    (self._dir / f"{self._companion}.{victim:06d}").unlink(missing_ok=True)
                self._tail_start = oldest_kept_tail * self.segment_size
                self._lines_before.forget(_HEAD_SEGMENTS + 1, oldest_kept_tail)
        return fd

    def close(self) -> None:
        WRITERS.forget(self)  # always: the table's reference must not outlive the session
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
            self._fd_index = -1

    def remove_files(self) -> None:
        self.close()
        if not self._lines_before.numbers:
            return  # no segment was ever opened: there is nothing (maybe not even a directory)
        for name in (self._name, self._companion):
            for path in self._dir.glob(f"{name}.*") if name else ():
                path.unlink(missing_ok=True)

    # -- reading -------------------------------------------------------------------------------

    def read(self, offset: int = 0, limit: int | None = None) -> ReadResult:
        """Bytes from ``offset`` (clamped to what exists), at most ``limit`` of them.

        A range that crosses the dropped gap returns head bytes, then tail bytes, and counts
        the gap in ``dropped`` (the data itself holds no marker: callers render one).
        """
        total = self.size
        start = min(max(0, offset), total)
        end = total if limit is None else min(total, start + max(0, limit))
        gaps = self._gaps(start, end)
        pieces: list[bytes] = []
        dropped = 0
        pos = start
        for gap_lo, gap_hi in [*gaps, (end, end)]:
            while pos < min(gap_lo, end):
                index, within = divmod(pos, self.segment_size)
                want = min(gap_lo, end) - pos
                want = min(want, self.segment_size - within)
                pieces.append(self._pread(index, within, want))
                pos += want
            if gap_hi > pos:
                skip_to = min(gap_hi, end)
                dropped += skip_to - pos
                pos = skip_to
        return ReadResult(b"".join(pieces), start, end, dropped, total)

    def kept(self, start: int, end: int) -> list[tuple[int, int]]:
        """The ranges in [start, end) that hold bytes: what ``_gaps`` leaves."""
        ranges: list[tuple[int, int]] = []
        pos = start
        for lo, hi in [*self._gaps(start, end), (end, end)]:
            if pos < lo:
                ranges.append((pos, lo))
            pos = max(pos, hi)
        return ranges

    def _gaps(self, start: int, end: int) -> list[tuple[int, int]]:
        """The ranges in [start, end) with no bytes to read: the cap's gap and what the disk
        refused, sorted and merged."""
        found = sorted(
            (max(lo, start), min(hi, end))
            for lo, hi in [(self.head_end, self._tail_start), *self._lost]
            if lo < end and hi > start and lo < hi
        )
        merged: list[tuple[int, int]] = []
        for lo, hi in found:
            if merged and lo <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(hi, merged[-1][1]))
            else:
                merged.append((lo, hi))
        return merged

    def _pread(self, index: int, within: int, length: int) -> bytes:
        try:
            fd = os.open(self._path(index), os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return b""
        try:
            return os.pread(fd, length, within)
        finally:
            os.close(fd)

    def lines_in_segment(self, index: int) -> int:
        """Newlines counted in segment ``index``."""
        table = self._lines_before
        if index >= table.reached:
            return 0
        following = table.following(index)
        after = self.lines if following is None else table.value(0, following)
        return after - table.value(0, index)

    @property
    def total_lines(self) -> int:
        """Lines in the view: newlines, plus one for a trailing unterminated line."""
        return self.lines + (0 if self._last_byte_newline or self.size == 0 else 1)

    def offset_of_line(self, line: int) -> int:
        """Byte offset where 0-based ``line`` starts (``size`` if past the end).

        Lines inside the dropped gap map to the first kept byte after it.
        """
        if line <= 0:
            return 0
        if line > self.lines:
            return self.size
        # The newline ending line - 1 lies in the segment whose first line is the last <= line - 1.
        index = self._lines_before.find(0, line - 1)
        base = index * self.segment_size
        if self.head_end <= base < self._tail_start:
            return self._tail_start
        seen = self._lines_before.value(0, index)
        end = min(self.size, base + self.segment_size)
        pos = base
        while pos < end:
            data = self._pread(index, pos - base, min(_SCAN_CHUNK, end - pos))
            if not data:
                break
            seen, past = past_line(data, seen, line)
            if past is not None:
                return pos + past
            pos += len(data)
        return self.size

    def read_spans(self, spans: Sequence[tuple[int, int]], *, raw: bool = False) -> tuple[list[bytes], int]:
        """The bytes of each ``(offset, length)`` range, one piece per range, and how many of them
        lay in a gap (the cap's or the disk's). Gap bytes are left out of the pieces, or with
        ``raw`` read as the zeros a gap holds, so a piece keeps its range's length.

        Many small ranges close together (a stream's runs between the other stream's) cost one
        read of the window around them, not one per range."""
        pieces: list[bytes] = []
        dropped = 0
        window_lo, window_hi, window = 0, 0, b""
        # The gaps are looked up once for the whole batch, and per range only if it has any.
        extent = (min(start for start, _ in spans), max(start + length for start, length in spans)) if spans else (0, 0)
        any_gaps = bool(self._gaps(*extent))
        if not any_gaps and extent[1] - extent[0] <= _EXTENT and extent[1] <= self.size:
            # Close together and all stored (a page of a stream that switches often): one read.
            window = self._raw(extent[0], extent[1] - extent[0])
            return [window[start - extent[0] : start - extent[0] + length] for start, length in spans], 0
        for start, length in spans:
            end = min(start + length, self.size)
            if not start <= end:
                pieces.append(b"")
                continue
            if not (window_lo <= start and end <= window_hi):
                window_lo = start
                window = self._raw(start, max(end - start, _WINDOW))
                window_hi = start + len(window)
            piece = window[start - window_lo : end - window_lo]
            for lo, hi in reversed(self._gaps(start, end)) if any_gaps else ():
                dropped += hi - lo
                if not raw:
                    piece = piece[: lo - start] + piece[hi - start :]
            pieces.append(piece)
        return pieces, dropped

    def _raw(self, start: int, length: int) -> bytes:
        """Bytes [start, start + length) as the segment files hold them, clipped to the log's
        size; what no file holds (a deleted segment, a hole) reads as zeros."""
        end = min(start + length, self.size)
        parts: list[bytes] = []
        pos = start
        while pos < end:
            index, within = divmod(pos, self.segment_size)
            want = min(end - pos, self.segment_size - within)
            data = self._pread(index, within, want)
            parts.append(data if len(data) == want else data + bytes(want - len(data)))
            pos += want
        return b"".join(parts)
