"""A remote session's log: the node keeps it, the daemon keeps a bounded copy for live views.

The node's files are the truth and hold everything its cap keeps (``maxLogBytes`` per view).
The daemon writes what the node streams into a :class:`CopyLog`: the engine's own segmented
log under a small cap (``COPY_CAP``), so it keeps at most the first ``COPY_CAP / 2`` and the
last ``COPY_CAP / 2`` bytes of each view, with the node's offsets and line counts. What reads
the newest output (poll, wait patterns, exit tails, exec results, the console's live view) is
served from that copy; a page it does not hold whole is read from the node, one actor call per
MiB, each bounded by ``PAGE_TIMEOUT``. A node that is gone leaves what the copy holds: a page
inside it is still served, any other is a ``NodeUnavailable`` that names what is held.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from procpilot.cluster.follow import FOLLOW_CHUNK
from procpilot.cluster.replies import raise_reply
from procpilot.engine.capture import LineSlice, ReadResult, SegmentedLog, SessionOutput, Stream, rolled_gap
from procpilot.errors import NodeUnavailable

__all__ = ["COPY_CAP", "PAGE_TIMEOUT", "CopyLog", "copy_output", "node_lines", "node_page"]

COPY_CAP = 4 << 20  # per view: the first 2 MiB and the last 1.5 to 2 MiB (whole 512 KiB segments)
PAGE_TIMEOUT = 10.0  # seconds for one page from a node before it counts as not answering
Call = Callable[..., Awaitable[dict[str, Any]]]


class CopyLog(SegmentedLog):
    """The daemon's copy of one view of a node's log: what the node sent, under ``COPY_CAP``.

    Its reads, offsets and line numbers are the node's wherever it holds the bytes; ``dropped``
    (what the results report) is what the node's own cap dropped, not what this copy let go."""

    def __init__(self, directory: Path, name: str, node_cap: int) -> None:
        super().__init__(directory, name, min(COPY_CAP, node_cap))
        self.node_cap = node_cap

    @property
    def dropped(self) -> int:
        return rolled_gap(self.size, self.node_cap)

    def held(self) -> str:
        """The byte ranges this copy holds, as a hint reads them."""
        if self.holds(0, self.size):
            return f"[0, {self.size})"
        return f"[0, {self.head_end}) and [{self.tail_start}, {self.size})"

    def holds_lines(self, first: int, count: int | None) -> bool:
        """Whether lines ``[first, first + count)`` lie wholly in bytes this copy holds (a line
        in its gap maps to ``tail_start``, so only a start past it is surely the tail's)."""
        if self.holds(0, self.size):
            return True
        total = self.total_lines
        first = min(max(0, first), total)
        lo = self.offset_of_line(first)
        hi = self.offset_of_line(total if count is None else min(total, first + max(0, count)))
        return self.holds(lo, hi) and (hi <= self.head_end or lo > self.tail_start)


def copy_output(directory: Path, node_cap: int) -> SessionOutput:
    """A session's output on the daemon: its three views as :class:`CopyLog` s."""
    output = SessionOutput(directory, node_cap)
    output.views = {stream: CopyLog(directory, stream.value, node_cap) for stream in Stream}
    return output


def _gone(view: SegmentedLog, session_id: str, exc: NodeUnavailable) -> NodeUnavailable:
    held = view.held() if isinstance(view, CopyLog) else "none"
    return NodeUnavailable(
        f"session {session_id}'s log is on a node that is gone or not answering: {exc.message}",
        hints={"page_what_is_held": f"The daemon still holds bytes {held} of this view: page inside them."},
        **exc.details,
    )


async def node_page(
    call: Call, scope: str, session_id: str, view: SegmentedLog, stream: Stream, offset: int, limit: int | None
) -> ReadResult:
    """Bytes ``[offset, offset + limit)`` of a view (``limit`` None: to its end) from the node,
    a page at a time; served by the copy instead when it holds them all (no call made)."""
    start = min(max(0, offset), view.size)
    if view.holds(start, view.size if limit is None else min(view.size, start + max(0, limit))):
        return view.read(offset, limit)
    pos = max(0, offset)
    stop = None if limit is None else pos + max(0, limit)
    pieces: list[bytes] = []
    start, dropped = -1, 0
    while True:
        want = FOLLOW_CHUNK if stop is None else min(FOLLOW_CHUNK, stop - pos)
        try:
            reply = await call("page", scope, session_id, stream.value, pos, want, timeout=PAGE_TIMEOUT)
        except NodeUnavailable as exc:
            raise _gone(view, session_id, exc) from None
        raise_reply(reply)
        start = reply["start"] if start < 0 else start
        pieces.append(reply["data"])
        dropped += reply["dropped"]
        if reply["end"] <= pos or reply["end"] >= reply["total"] or want < FOLLOW_CHUNK:
            return ReadResult(b"".join(pieces), start, reply["end"], dropped, reply["total"])
        pos = reply["end"]


async def node_lines(
    call: Call,
    scope: str,
    session_id: str,
    view: SegmentedLog,
    stream: Stream,
    first: int,
    count: int | None,
    max_bytes: int | None,
    keep_end: bool,
) -> LineSlice:
    """Lines of a view by the node's line index; by the copy's when it holds them all (its
    offsets and line numbers are the node's)."""
    if view.holds(0, view.size) or (isinstance(view, CopyLog) and view.holds_lines(first, count)):
        return view.read_lines(first, count, max_bytes, keep_end=keep_end)
    budget = 1 << 62 if max_bytes is None else max_bytes
    try:
        reply = await call(
            "lines", scope, session_id, stream.value, first, count, budget, keep_end, timeout=PAGE_TIMEOUT
        )
    except NodeUnavailable as exc:
        raise _gone(view, session_id, exc) from None
    raise_reply(reply)
    return LineSlice(reply["lines"], reply["first"], reply["total"], reply["dropped_lines"], reply["unread_bytes"])
