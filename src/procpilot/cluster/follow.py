"""A session's output as the node streams it to the daemon: every byte once, in arrival order.

The engine stores a session's output once, as the combined view, with an ordering index on disk
that says which stream each run came from (engine/stream_index.py). So the node walks the
combined view from where it left off and sends each run once, as a ``("both", stream,
stream_offset, combined_offset, data)`` item that the daemon stores as its own copy's run (both
offsets: where it sits in its stream and in the combined view). The bytes are read from the
node's files when the item is made, so what is in flight is bounded by the stream's
backpressure, never by how fast a command prints, and no note of the order is kept in memory:
however far behind the reader is and however often a command switches between stdout and
stderr, nothing is sent twice.

What the node's cap or a full disk dropped before it was read is left out; the offsets of the
next run say how much of each stream it was. The last item carries no bytes, only where both
views end, so a gap at the very end is known too.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from procpilot.engine.capture import Stream
from procpilot.engine.session import Session

__all__ = ["FOLLOW_CHUNK", "follow_output"]

FOLLOW_CHUNK = 1 << 20  # combined bytes per step: one capture read's worth


async def follow_output(session: Session) -> AsyncIterator[tuple[Any, ...]]:
    """Output items until every byte is sent and the session has finished (the caller adds the end)."""
    output = session.output
    sent = 0  # of the combined view
    while True:
        finished = session.finished  # read before the size: nothing is appended after it is set
        end = output[Stream.COMBINED].size
        if sent < end:
            upto = min(end, sent + FOLLOW_CHUNK)
            for stream, position, offset, data in output.runs(sent, upto - sent):
                yield ("both", stream.value, position, offset, data)
            sent = upto
            continue
        if finished:
            yield ("both", Stream.STDOUT.value, output[Stream.STDOUT].size, end, b"")
            return
        await output.wait_for_change(None)  # woken by output and by the end
