"""Output capture: pipes → append-only segment files, with byte offsets that never move.

Design (chosen with restarts in mind): every byte a process prints is written, as it arrives, to
plain files under the session's directory, so the files are the truth and memory holds only
counters. Each *view* (``combined`` in arrival order, ``stdout``, ``stderr``) is a
:class:`SegmentedLog`: fixed-size segment files addressed by absolute byte offset. Up to the cap
everything is kept; past it the first half of the cap (the head) is kept forever and the newest
segments (the tail) roll, so a reader sees head + an explicit gap + tail, and offsets stay the
absolute positions they would have had if nothing were dropped.

Memory is bounded per session: a handful of integers per segment, never the output itself.
"""

from __future__ import annotations

import asyncio
import bisect
import codecs
import enum
import errno
import logging
import os
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

__all__ = ["LineSlice", "ReadResult", "SegmentedLog", "SessionOutput", "Stream"]

_HEAD_SEGMENTS = 4
_TAIL_SEGMENTS = 4
_MIN_SEGMENT = 16 * 1024
_SCAN_CHUNK = 1 << 20
_MAX_LOST_RANGES = 64
_OPEN_WRITERS = 512
_log = logging.getLogger(__name__)


class Stream(enum.Enum):
    COMBINED = "combined"
    STDOUT = "stdout"
    STDERR = "stderr"


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


class _OpenWriters:
    """The segment files held open for writing, across every session: the ``limit`` most recently
    written. A session that printed once and now sleeps would otherwise hold two descriptors
    (its stream's view and the combined one) for as long as it runs, half again the four it needs
    (stdin, stdout, stderr, pidfd): the difference between 10,000 sleeping sessions fitting under a
    descriptor limit or not. A view pushed out reopens its segment on its next write (~5 µs)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._open: OrderedDict[SegmentedLog, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._open)

    def touch(self, log: SegmentedLog) -> None:
        if log in self._open:
            self._open.move_to_end(log)
            return
        self._open[log] = None
        while len(self._open) > self.limit:
            oldest, _ = self._open.popitem(last=False)
            oldest.close()

    def forget(self, log: SegmentedLog) -> None:
        self._open.pop(log, None)


_WRITERS = _OpenWriters(_OPEN_WRITERS)


class SegmentedLog:
    """One append-only view of a session's output, stored as numbered segment files."""

    def __init__(self, directory: Path, name: str, cap_bytes: int) -> None:
        self._dir = directory
        self._name = name
        self.segment_size = max(_MIN_SEGMENT, cap_bytes // (_HEAD_SEGMENTS + _TAIL_SEGMENTS))
        self.size = 0
        self.lines = 0  # count of b"\n" written, so far
        # Per segment index: newline count before the segment starts (for line lookups).
        self._lines_before: list[int] = []
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
    def recover(cls, directory: Path, name: str, cap_bytes: int) -> SegmentedLog:
        """The view as a previous server left it on disk, ready for more writes at its end.

        Sizes and line counts come from the segment files themselves (the files are the truth).
        Segments already rolled out past the cap held lines nobody can count any more: line
        numbers after the gap shift down by that many (byte offsets do not move)."""
        log = cls(directory, name, cap_bytes)
        indexes = sorted(
            int(p.name.rsplit(".", 1)[1]) for p in directory.glob(f"{name}.*") if p.name.rsplit(".", 1)[1].isdigit()
        )
        if not indexes:
            return log
        last = indexes[-1]
        present = set(indexes)
        for index in range(last + 1):
            log._lines_before.append(log.lines)
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
                _WRITERS.touch(self)
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
    def gap_cause(self) -> str:
        """What made the gaps a read skips, for the marker a reader sees in their place."""
        causes = ["the output cap"] if self.dropped else []
        if self.lost:
            causes.append(f"a disk error ({self.lost_reason})")
        return " and ".join(causes) or "the output cap"

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
        # One entry per segment index, even for a segment the disk never let us open.
        while len(self._lines_before) <= index:
            self._lines_before.append(self.lines)
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
                self._tail_start = oldest_kept_tail * self.segment_size
        return fd

    def close(self) -> None:
        _WRITERS.forget(self)  # always: the table's reference must not outlive the session
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
            self._fd_index = -1

    def remove_files(self) -> None:
        self.close()
        if not self._lines_before:
            return  # no segment was ever opened: there is nothing (maybe not even a directory)
        for path in self._dir.glob(f"{self._name}.*"):
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
        index = max(bisect.bisect_right(self._lines_before, line - 1) - 1, 0)
        base = index * self.segment_size
        if self.head_end <= base < self._tail_start:
            return self._tail_start
        seen = self._lines_before[index]
        end = min(self.size, base + self.segment_size)
        pos = base
        while pos < end:
            data = self._pread(index, pos - base, min(_SCAN_CHUNK, end - pos))
            if not data:
                break
            cursor = 0
            while (hit := data.find(b"\n", cursor)) >= 0:
                seen += 1
                cursor = hit + 1
                if seen == line:
                    return pos + cursor
            pos += len(data)
        return self.size

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


OutputListener = Callable[[Stream, bytes], None]


class SessionOutput:
    """The three views of one session plus the means to wait for more."""

    def __init__(self, directory: Path, cap_bytes: int) -> None:
        # Made by the first segment written to it: a session without output has no directory.
        self.directory = directory
        self.views = {
            Stream.COMBINED: SegmentedLog(directory, "combined", cap_bytes),
            Stream.STDOUT: SegmentedLog(directory, "stdout", cap_bytes),
            Stream.STDERR: SegmentedLog(directory, "stderr", cap_bytes),
        }
        self._waiters: list[asyncio.Future[None]] = []
        self._listeners: list[OutputListener] = []
        self.closed = False

    @classmethod
    def recover(cls, directory: Path, cap_bytes: int) -> SessionOutput:
        """A running session's output as a previous server left it (see SegmentedLog.recover)."""
        output = cls(directory, cap_bytes)
        for stream in Stream:
            output.views[stream] = SegmentedLog.recover(directory, stream.value, cap_bytes)
        return output

    def lose(self, stream: Stream, size: int, reason: OSError) -> None:
        """``size`` bytes of ``stream`` that were printed but cannot be stored: a counted gap."""
        for view in (self.views[stream], self.views[Stream.COMBINED]):
            view._lose(size, reason)
            view.size += size

    def __getitem__(self, stream: Stream) -> SegmentedLog:
        return self.views[stream]

    def lost_note(self) -> str | None:
        """What a result showing this output must say when the disk refused some of it."""
        view = self.views[Stream.COMBINED]
        if not view.lost:
            return None
        if view.lost_reason == "EFBIG":  # see adoption.replay_spool
            why = "they were printed while no server ran, past what the holder keeps (the log cap)"
        elif view.lost_reason == "ENOSPC":
            why = "the state directory's disk is full"
        else:
            why = "the disk refused them"
        return f"{view.lost} bytes of output were lost: {why} ({view.lost_reason})"

    def append(self, stream: Stream, data: bytes) -> None:
        newlines = data.count(b"\n")
        self.views[stream].write(data, newlines)
        self.views[Stream.COMBINED].write(data, newlines)
        if self._listeners:
            for listener in list(self._listeners):
                listener(stream, data)
        if self._waiters:
            self._wake()

    def mark_closed(self) -> None:
        """No more output will come: close files, wake every waiter."""
        self.closed = True
        for view in self.views.values():
            view.close()
        self._wake()

    def _wake(self) -> None:
        waiters, self._waiters = self._waiters, []
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)

    async def wait_for_change(self, timeout: float | None) -> bool:
        """Wait until more output arrives or the output closes; False on timeout."""
        if self.closed:
            return True
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            await asyncio.wait_for(fut, timeout)
        except TimeoutError:
            return False
        finally:
            if fut in self._waiters:
                self._waiters.remove(fut)
        return True

    def wake(self) -> None:
        """Wake waiters without new output (e.g. the session changed state)."""
        self._wake()

    def subscribe(self, listener: OutputListener) -> Callable[[], None]:
        """Call ``listener(stream, chunk)`` for every chunk from now on; returns the unsubscriber."""
        self._listeners.append(listener)

        def unsubscribe() -> None:
            if listener in self._listeners:
                self._listeners.remove(listener)

        return unsubscribe

    def remove_files(self) -> None:
        for view in self.views.values():
            view.remove_files()


class Utf8ChunkDecoder:
    """Decode a byte stream chunk by chunk without splitting a character across chunks."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, data: bytes) -> str:
        return self._decoder.decode(data)

    def flush(self) -> str:
        return self._decoder.decode(b"", final=True)
