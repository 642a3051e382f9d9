"""Output capture: a session's pipes → its output, stored once, read as three views.

Design (chosen with restarts in mind): every byte a process prints is written once, as it
arrives, to plain files under the session's directory, so the files are the truth and memory
holds only counters. The bytes go to one :class:`SegmentedLog`, ``combined``, in arrival order
(engine/segments.py: the cap's head + gap + tail, absolute offsets, line lookups); beside each of
its segments an ordering index says which stream each run came from (engine/stream_index.py), and
``stdout`` and ``stderr`` are read through it. Why this way round and not per-stream files plus
an ordering index: the combined view is what most reads want (exec, poll, log, the console), and
the cap's promise (the first and the newest ``maxLogBytes`` / 2 of what was printed) is a promise
about arrival order, which per-stream files could keep only by coordinating two caps.

A state directory from before (a ``stdout.*`` and ``stderr.*`` copy beside ``combined.*``) is
still read: a session adopted from it keeps that layout until it ends.
"""

from __future__ import annotations

import asyncio
import codecs
from collections.abc import Callable, Iterator
from itertools import islice
from pathlib import Path

from procpilot.engine.segments import LineSlice, OutputView, ReadResult, SegmentedLog, Stream
from procpilot.engine.stream_index import INDEX_NAME, OrderIndex, StreamView
from procpilot.turns import waiting

__all__ = ["LineSlice", "OutputView", "ReadResult", "SegmentedLog", "SessionOutput", "Stream", "Utf8ChunkDecoder"]

_PAD = 1 << 20  # zeros written at once where a mirror fills a range its source no longer has
_RUN_BATCH = 4096  # runs read from the log at once

OutputListener = Callable[[Stream, bytes], None]


class SessionOutput:
    """One session's output (stored once, read as three views) plus the means to wait for more."""

    def __init__(self, directory: Path, cap_bytes: int) -> None:
        # Made by the first segment written to it: a session without output has no directory.
        self.directory = directory
        self._combined = SegmentedLog(directory, "combined", cap_bytes, companion=INDEX_NAME)
        self._index: OrderIndex | None = OrderIndex(directory, self._combined)
        self.views: dict[Stream, OutputView] = self._views(self._index)
        self._legacy: dict[Stream, SegmentedLog] = {}
        self._waiters: list[asyncio.Future[None]] = []
        self._listeners: list[OutputListener] = []
        self.closed = False

    def _views(self, index: OrderIndex) -> dict[Stream, OutputView]:
        return {
            Stream.COMBINED: self._combined,
            Stream.STDOUT: StreamView(Stream.STDOUT, index, self._combined),
            Stream.STDERR: StreamView(Stream.STDERR, index, self._combined),
        }

    @classmethod
    def recover(cls, directory: Path, cap_bytes: int) -> SessionOutput:
        """A running session's output as a previous server left it: from the files (see
        SegmentedLog.recover and OrderIndex.recover), in either layout."""
        output = cls(directory, cap_bytes)
        if any(directory.glob("stdout.0*")) or any(directory.glob("stderr.0*")):
            # Written by a procpilot that kept a copy per stream: go on in that layout, which
            # nothing can turn into this one (the copies do not say how they interleaved).
            output._index = None
            output._legacy = {stream: SegmentedLog.recover(directory, stream.value, cap_bytes) for stream in Stream}
            output._combined = output._legacy[Stream.COMBINED]
            output.views = dict(output._legacy)
            return output
        output._combined = SegmentedLog.recover(directory, "combined", cap_bytes, companion=INDEX_NAME)
        output._index = OrderIndex.recover(directory, output._combined)
        output.views = output._views(output._index)
        return output

    @property
    def layout(self) -> str:
        """``"once"``, or ``"per-stream"`` for a session adopted from an older state directory."""
        return "once" if self._index is not None else "per-stream"

    def store(self, stream: Stream, data: bytes) -> None:
        """Write ``data`` of ``stream`` without telling listeners or waiters (see ``append``)."""
        if self._index is not None:
            self._index.append(stream, data)
            return
        newlines = data.count(b"\n")
        self._legacy[stream].write(data, newlines)
        self._combined.write(data, newlines)

    @property
    def is_open(self) -> bool:
        """Whether the files the next bytes go to are open (then ``ready`` is True at no cost)."""
        if self._index is not None:
            return self._index.is_open
        return all(log.is_open for log in self._legacy.values())

    def ready(self) -> bool:
        """Whether bytes stored now would reach the disk: False while the process is out of
        descriptors for the files (SegmentedLog.ready), when the reader should wait, not read."""
        if self._index is not None:
            return self._index.ready()
        return all(log.ready() for log in self._legacy.values())

    def lose(self, stream: Stream, size: int, reason: OSError) -> None:
        """``size`` bytes of ``stream`` that were printed but cannot be stored: a counted gap."""
        if self._index is not None:
            self._index.skip(stream, size, reason)
            return
        self._legacy[stream].skip(size, reason)
        self._combined.skip(size, reason)

    def runs(self, offset: int, limit: int) -> Iterator[tuple[Stream, int, int, bytes]]:
        """The stored bytes of combined [offset, offset + limit) as ``(stream, stream offset,
        combined offset, data)`` runs, in arrival order; gaps are left out (their size is the
        difference of the offsets)."""
        if self._index is None:
            raise RuntimeError("a session in the per-stream layout has no ordering index")
        end = min(self._combined.size, offset + max(0, limit))
        log = self._combined
        parts = (
            (stream, position + lo - start, lo, hi - lo)
            for stream, position, start, length in self._index.runs(offset, end)
            for lo, hi in log.kept(start, start + length)
        )
        # A batch at a time: many short runs share the reads of the window around them.
        while batch := list(islice(parts, _RUN_BATCH)):
            pieces, _ = log.read_spans([(lo, size) for _, _, lo, size in batch])
            for (stream, position, lo, _), data in zip(batch, pieces, strict=True):
                yield stream, position, lo, data

    def pad(self, stream: Stream, size: int) -> None:
        """``size`` zeros for ``stream``, unheard: a copy filling what its source no longer has."""
        while size > 0:
            self.store(stream, bytes(min(size, _PAD)))
            size -= _PAD

    def __getitem__(self, stream: Stream) -> OutputView:
        return self.views[stream]

    @property
    def combined(self) -> SegmentedLog:
        return self._combined

    def lost_note(self) -> str | None:
        """What a result showing this output must say when the disk refused some of it."""
        view = self._combined
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
        self.store(stream, data)
        if self._listeners:
            for listener in list(self._listeners):
                listener(stream, data)
        if self._waiters:
            self._wake()

    def mark_closed(self) -> None:
        """No more output will come: close files, wake every waiter."""
        self.closed = True
        self._combined.close()
        for log in self._legacy.values():
            log.close()
        if self._index is not None:
            self._index.close()
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
            async with waiting():  # the caller's call gives its turn to its agent's next one
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
        self._combined.remove_files()
        for log in self._legacy.values():
            log.remove_files()
        if self._index is not None:
            self._index.remove_files()


class Utf8ChunkDecoder:
    """Decode a byte stream chunk by chunk without splitting a character across chunks."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, data: bytes) -> str:
        return self._decoder.decode(data)

    def flush(self) -> str:
        return self._decoder.decode(b"", final=True)
