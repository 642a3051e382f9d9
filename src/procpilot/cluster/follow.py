"""A session's output as the node streams it to the daemon: every byte once, in arrival order.

The engine appends each chunk a pipe gives to its stream's view *and* to ``combined``. Sending
both views would move every byte twice; instead the node notes the order of appends (which
stream, how many bytes: numbers only, adjacent appends of one stream merged) and sends each
stretch once, as a ``("both", stream, stream_offset, combined_offset, data)`` item that the
daemon writes into both of its views. The bytes themselves are read from the node's files when
the item is made, so what is in flight is bounded by the stream's backpressure, never by how
fast a command prints.

Where the notes cannot tell the story, each view is sent on its own from the offsets reached
(``("out", view, offset, data)``: complete, at twice the bytes): for what was printed before
the stream started, when the notes would pass their bound (a reader far behind a command that
interleaves stdout and stderr), and when a read comes back short (the cap or a full disk
dropped bytes the daemon had not read yet).
"""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncIterator
from typing import Any

from procpilot.engine.capture import Stream
from procpilot.engine.session import Session

__all__ = ["FOLLOW_CHUNK", "follow_output"]

FOLLOW_CHUNK = 1 << 20  # bytes per streamed item: one capture read's worth
_MAX_NOTES = 4096  # appends noted ahead of the reader; past this, each view is sent on its own
_VIEWS = (Stream.COMBINED, Stream.STDOUT, Stream.STDERR)


class _Notes:
    """The order of appends not sent yet: [stream, bytes] runs, oldest first (a listener)."""

    def __init__(self) -> None:
        self.runs: deque[list[Any]] = deque()
        self.overflowed = False

    def __call__(self, stream: Stream, data: bytes) -> None:
        if self.runs and self.runs[-1][0] is stream:
            self.runs[-1][1] += len(data)
        elif len(self.runs) < _MAX_NOTES:
            self.runs.append([stream, len(data)])
        else:
            self.overflowed = True


async def follow_output(session: Session) -> AsyncIterator[tuple[Any, ...]]:
    """Output items until every byte is sent and the session has finished (the caller adds the end)."""
    notes = _Notes()
    unsubscribe = session.output.subscribe(notes)
    try:
        # What came before the listener: its order is only in the node's combined view.
        sent = {view: 0 for view in _VIEWS}
        before = {view: session.output[view].size for view in _VIEWS}
        for view in _VIEWS:
            async for item in _per_view(session, sent, view, before[view]):
                yield item
        # The notes begin where that ended, unless a gap cut it short.
        aligned = sent == before
        while aligned and not notes.overflowed:
            finished = session.finished  # read before the notes: nothing is appended after it is set
            if not notes.runs:
                if finished:
                    return
                await session.output.wait_for_change(None)  # woken by output and by the end
                continue
            stream, size = notes.runs[0]
            take = min(size, FOLLOW_CHUNK)
            chunk = session.output[stream].read(sent[stream], take)
            if chunk.start != sent[stream] or len(chunk.data) != take:
                break  # bytes dropped before we read them: the views, each on its own, say where
            yield ("both", stream.value, sent[stream], sent[Stream.COMBINED], chunk.data)
            sent[stream] += take
            sent[Stream.COMBINED] += take
            notes.runs[0][1] -= take
            if not notes.runs[0][1]:
                notes.runs.popleft()
    finally:
        unsubscribe()
    # The fallback: every view from where it was left, until the session is over.
    while True:
        finished = session.finished
        moved = False
        for view in _VIEWS:
            async for item in _per_view(session, sent, view, session.output[view].size):
                moved = True
                yield item
        if finished and not moved:
            return
        if not moved:
            await session.output.wait_for_change(None)


async def _per_view(
    session: Session, sent: dict[Stream, int], view: Stream, upto: int
) -> AsyncIterator[tuple[Any, ...]]:
    log = session.output[view]
    while sent[view] < upto:
        chunk = log.read(sent[view], min(FOLLOW_CHUNK, upto - sent[view]))
        if chunk.end <= sent[view]:
            return
        sent[view] = chunk.end
        yield ("out", view.value, chunk.start, chunk.data)
