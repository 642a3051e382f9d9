"""A remote session's log: the node keeps it, the daemon keeps a bounded copy for live views.

The node's files are the truth and hold everything its cap keeps (``maxLogBytes``). The daemon
stores what the node streams in an engine ``SessionOutput`` of its own under a small cap
(``COPY_CAP``): at most the first ``COPY_CAP / 2`` and the last ``COPY_CAP / 2`` bytes of the
combined output (stdout and stderr are read through it, as on one host), with the node's offsets
and line numbers. What reads the newest output (poll, wait patterns, exit tails, exec results,
the console's live view) is served from that copy; a page it does not hold whole is read from
the node, one actor call per MiB, each bounded by ``PAGE_TIMEOUT``. A node that is gone leaves
what the copy holds: a page inside it is still served, any other is a ``NodeUnavailable`` that
names what is held.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from procpilot.cluster.follow import FOLLOW_CHUNK
from procpilot.cluster.replies import raise_reply
from procpilot.engine.capture import LineSlice, OutputView, ReadResult, SegmentedLog, SessionOutput, Stream
from procpilot.errors import NodeUnavailable

__all__ = ["COPY_CAP", "PAGE_TIMEOUT", "CopyView", "copy_output", "node_lines", "node_page"]

COPY_CAP = 4 << 20  # the first 2 MiB and the last 1.5 to 2 MiB of the output (whole 512 KiB segments)
PAGE_TIMEOUT = 10.0  # seconds for one page from a node before it counts as not answering
Call = Callable[..., Awaitable[dict[str, Any]]]


class CopyView:
    """One view of the daemon's copy: the engine's view of it, but ``dropped`` (what results
    report) is what the node's own cap dropped, as the node last said, not what the copy let go."""

    def __init__(self, view: OutputView, stream: Stream, node_dropped: dict[Stream, int]) -> None:
        self._view = view
        self._stream = stream
        self._node_dropped = node_dropped

    @property
    def dropped(self) -> int:
        return self._node_dropped.get(self._stream, 0)

    @property
    def size(self) -> int:
        return self._view.size

    @property
    def lines(self) -> int:
        return self._view.lines

    @property
    def lost(self) -> int:
        return self._view.lost

    @property
    def lost_reason(self) -> str | None:
        return self._view.lost_reason

    @property
    def gap_cause(self) -> str:
        return self._view.gap_cause

    @property
    def total_lines(self) -> int:
        return self._view.total_lines

    def offset_of_line(self, line: int) -> int:
        return self._view.offset_of_line(line)

    def read(self, offset: int = 0, limit: int | None = None) -> ReadResult:
        return self._view.read(offset, limit)

    def read_lines(
        self, first: int, count: int | None, max_bytes: int | None = None, *, keep_end: bool = False
    ) -> LineSlice:
        return self._view.read_lines(first, count, max_bytes, keep_end=keep_end)


def copy_output(directory: Path, node_cap: int, node_dropped: dict[Stream, int]) -> SessionOutput:
    """A remote session's output on the daemon: the bounded copy, its views as :class:`CopyView` s."""
    output = SessionOutput(directory, min(COPY_CAP, node_cap))
    output.views = {stream: CopyView(view, stream, node_dropped) for stream, view in output.views.items()}
    return output


def _held(log: SegmentedLog) -> str:
    if not log.dropped and not log.lost:
        return f"[0, {log.size})"
    return f"[0, {log.head_end}) and [{log.tail_start}, {log.size})"


def _whole(log: SegmentedLog) -> bool:
    """The copy still has every byte the node sent: its views and line numbers are the node's."""
    return not log.dropped and not log.lost


def _holds_lines(output: SessionOutput, stream: Stream, first: int, count: int | None) -> bool:
    """Whether lines ``[first, first + count)`` lie wholly in what the copy holds: any lines while
    it holds everything; else only the combined view's, past its gap (a line in the gap maps to
    ``tail_start``, so only a start past it is surely the tail's) or before it."""
    log = output.combined
    if _whole(log):
        return True
    if stream is not Stream.COMBINED:
        return False
    total = log.total_lines
    first = min(max(0, first), total)
    lo = log.offset_of_line(first)
    hi = log.offset_of_line(total if count is None else min(total, first + max(0, count)))
    return log.kept(lo, hi) == ([(lo, hi)] if hi > lo else []) and (hi <= log.head_end or lo > log.tail_start)


def _gone(output: SessionOutput, session_id: str, exc: NodeUnavailable) -> NodeUnavailable:
    held = _held(output.combined)
    return NodeUnavailable(
        f"session {session_id}'s log is on a node that is gone or not answering: {exc.message}",
        hints={"page_what_is_held": f"The daemon still holds bytes {held} of its combined output: page inside them."},
        **exc.details,
    )


async def node_page(
    call: Call,
    scope: str,
    session_id: str,
    output: SessionOutput,
    stream: Stream,
    offset: int,
    limit: int | None,
    node_dropped: dict[Stream, int],
) -> ReadResult:
    """Bytes ``[offset, offset + limit)`` of a view (``limit`` None: to its end): from the copy
    when it holds them all (no call made), else from the node a page at a time."""
    copy = output[stream].read(offset, limit)
    if not copy.dropped:
        return copy
    pos = max(0, offset)
    stop = None if limit is None else pos + max(0, limit)
    pieces: list[bytes] = []
    start, dropped = -1, 0
    while True:
        want = FOLLOW_CHUNK if stop is None else min(FOLLOW_CHUNK, stop - pos)
        try:
            reply = await call("page", scope, session_id, stream.value, pos, want, timeout=PAGE_TIMEOUT)
        except NodeUnavailable as exc:
            raise _gone(output, session_id, exc) from None
        raise_reply(reply)
        node_dropped[stream] = reply["view_dropped"]
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
    output: SessionOutput,
    stream: Stream,
    first: int,
    count: int | None,
    max_bytes: int | None,
    keep_end: bool,
    node_dropped: dict[Stream, int],
) -> LineSlice:
    """Lines of a view: from the copy when it holds them all (its line numbers are the node's),
    else by the node's line index."""
    if _holds_lines(output, stream, first, count):
        return output[stream].read_lines(first, count, max_bytes, keep_end=keep_end)
    budget = 1 << 62 if max_bytes is None else max_bytes
    try:
        reply = await call(
            "lines", scope, session_id, stream.value, first, count, budget, keep_end, timeout=PAGE_TIMEOUT
        )
    except NodeUnavailable as exc:
        raise _gone(output, session_id, exc) from None
    raise_reply(reply)
    node_dropped[stream] = reply["view_dropped"]
    return LineSlice(reply["lines"], reply["first"], reply["total"], reply["dropped_lines"], reply["unread_bytes"])
