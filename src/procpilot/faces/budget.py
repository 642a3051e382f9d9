"""One result's share of a session's output: its head and its tail, within the result budget.

A model reads a tool result whole, so one result must never flood it: Claude Code refuses a
result past 25,000 tokens (and the model then sees none of it), Codex cuts its middle. Every face
that shows output shows it through :func:`read_budgeted`: at most ``limit`` characters, the
first and the last lines of what it covers, and where it cut, one marker line that says how many
lines and characters were left out and the exact ``process log`` call that reads them.

Only a window of ``limit`` times a few bytes is read at each end, however much lies between: a
result after a 200 MB burst costs what one after 200 KB does.
"""

from __future__ import annotations

from dataclasses import dataclass

from procpilot.engine.capture import Stream
from procpilot.engine.session import Session
from procpilot.render import binary_bytes, complete_utf8_prefix, cut_marker, for_model, head_chars, tail_chars

__all__ = ["Shown", "binary_note", "log_call", "nothing_new", "read_budgeted"]

_BIG = 10**15  # a count as long as any a marker will hold, to size the marker
# Bytes read per character wanted: room for 4-byte characters, escapes and redraws stripped.
WINDOW_FACTOR = 8


@dataclass(frozen=True, slots=True)
class Shown:
    """What a result shows of bytes ``[start, end)`` of a view.

    ``text`` holds the head, the marker and the tail (or all of it when it fits); ``cut_chars``
    and ``cut_lines`` count what the marker stands for (bytes never read count one character
    each); ``end`` and ``end_line`` are where the read stopped (a byte offset, and the newlines
    before it), for a follower's next read; ``binary`` counts the bytes read that a model cannot
    read (NUL, not UTF-8)."""

    text: str
    cut_chars: int
    cut_lines: int
    first_cut_line: int
    end: int
    end_line: int
    binary: int
    read_bytes: int


def log_call(session_id: str, stream: Stream, offset: int, limit: int) -> str:
    """The ``process`` call that reads lines ``[offset, offset + limit)`` of ``stream``."""
    which = "" if stream is Stream.COMBINED else f" stream={stream.value}"
    return f"process log sessionId={session_id}{which} offset={offset} limit={limit}"


def binary_note(binary: int, read_bytes: int, where: str) -> str | None:
    """A line for output a model cannot read, so that it is never shown as silently empty."""
    if not binary:
        return None
    share = "" if binary >= read_bytes else f" among {read_bytes:,} bytes"
    what = f"{binary:,} bytes of binary output (NUL, controls or not UTF-8){share}"
    return f"[{what}, not shown; the raw bytes are in {where}]"


async def _text(session: Session, stream: Stream, start: int, end: int, *, mid_char: bool) -> tuple[str, int, int]:
    """Model text of bytes [start, end): (text, end actually used, binary bytes)."""
    result = await session.page(stream, start, end - start)
    data = result.data
    if mid_char:  # ``start`` may fall inside a character: its leftover bytes are skipped
        lead = 0
        while lead < min(3, len(data)) and 0x80 <= data[lead] <= 0xBF:
            lead += 1
        data = data[lead:]
    used_end = result.end
    if not session.finished:
        # Leave a character split across two reads for the next read, whole.
        keep = complete_utf8_prefix(data)
        used_end -= len(data) - keep
        data = data[:keep]
    text = for_model(data)
    if result.dropped:
        text = f"[... {result.dropped} bytes dropped by {session.output[stream].gap_cause} ...]\n" + text
    return text, used_end, binary_bytes(data)


def nothing_new(session: Session, stream: Stream, start: int) -> Shown | None:
    """What ``read_budgeted`` shows from ``start`` when nothing was written past it (most short
    commands print nothing): no read at all, and nothing to await for it; None when there is."""
    view = session.output[stream]
    if view.size != start:
        return None
    return Shown("", 0, 0, 0, start, view.lines, 0, 0)


async def read_budgeted(session: Session, stream: Stream, start: int, start_line: int, limit: int) -> Shown:
    """Bytes ``[start, end of the view)`` as a result shows them: at most ``limit`` characters of
    model text, head and tail, with a marker between them when something was cut.

    ``start_line``: the newlines before ``start`` (0 from the beginning), so the marker can name
    the lines it stands for."""
    nothing = nothing_new(session, stream, start)
    if nothing is not None:
        return nothing
    view = session.output[stream]
    end, end_line = view.size, view.lines  # read together: no await between them
    window = limit * WINDOW_FACTOR
    # The marker counts against the budget; a budget too small to hold it keeps the tail only.
    reserve = len(cut_marker(_BIG, _BIG, log_call(session.id, stream, _BIG, _BIG))) + 2
    room = limit - reserve if limit > 2 * reserve else 0
    half = room // 2
    if end - start <= window:
        text, used_end, binary = await _text(session, stream, start, end, mid_char=False)
        if len(text) <= limit:
            return Shown(text, 0, 0, 0, used_end, end_line, binary, end - start)
        head, _ = head_chars(text, half)
        tail, _ = tail_chars(text[len(head) :], (room or limit) - len(head))
        cut = len(text) - len(head) - len(tail)
    else:
        head_text, _, head_binary = await _text(session, stream, start, start + window // 2, mid_char=False)
        head, _ = head_chars(head_text, half)
        tail_text, used_end, binary = await _text(session, stream, end - window // 2, end, mid_char=True)
        tail, _ = tail_chars(tail_text, (room or limit) - len(head))
        binary += head_binary
        cut = len(head_text) - len(head) + len(tail_text) - len(tail) + (end - start - window)
    first_cut = start_line + head.count("\n")
    if not room:  # no room for a marker: the newest output, counted in the fields only
        return Shown(tail, cut, 0, first_cut, used_end, end_line, binary, min(end - start, window))
    cut_lines = max(0, end_line - tail.count("\n") - first_cut)
    marker = cut_marker(cut_lines, cut, log_call(session.id, stream, first_cut, max(1, cut_lines)))
    text = f"{head}{'' if head.endswith(chr(10)) or not head else chr(10)}{marker}\n{tail}"
    return Shown(text, cut, cut_lines, first_cut, used_end, end_line, binary, min(end - start, window))
