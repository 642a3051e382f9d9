"""What the harness profiles (faces/codex_profile.py, faces/claude_profile.py) share: the shell a
harness runs commands with, the exit code it reports, and reading a session's output raw.

Those harnesses hand the model what the process wrote, decoded and nothing else (no escape
stripping, no redraw collapsing): so do the profiles, where the exec face would clean it up.
"""

from __future__ import annotations

import os
import pwd
import signal
from dataclasses import dataclass
from pathlib import Path

from procpilot.engine.capture import Stream
from procpilot.engine.session import Session

__all__ = ["Chunk", "default_shell", "exit_code", "first_log_file", "read_bytes", "scan"]

_PIECE = 1 << 20  # a read of the log, so a long chunk is never one allocation from a single read


def default_shell() -> str:
    """The user's login shell, as both harnesses use; ``/bin/bash`` (else ``/bin/sh``) where the
    account names none that can run."""
    try:
        shell = pwd.getpwuid(os.getuid()).pw_shell
    except KeyError:
        shell = ""
    if shell and os.path.basename(shell) not in ("nologin", "false") and os.access(shell, os.X_OK):
        return shell
    return "/bin/bash" if os.access("/bin/bash", os.X_OK) else "/bin/sh"


def exit_code(session: Session) -> int | None:
    """The code a shell reports: the exit status, or 128 + the signal for a process a signal ended."""
    if session.exit_code is not None:
        return session.exit_code
    if session.exit_signal is None:
        return None
    try:
        return 128 + signal.Signals[session.exit_signal].value
    except KeyError:
        return None


@dataclass(frozen=True, slots=True)
class Chunk:
    """Bytes ``[start, end)`` of a view as a long result needs them, read once and never held
    whole: the first ``head`` bytes, the last ``tail`` bytes after those, and counts over every
    byte. ``whole``: nothing lies between the two (the bytes are ``head + tail``)."""

    size: int
    newlines: int
    chars: int  # UTF-8 characters: every byte that does not continue one
    head: bytes
    tail: bytes

    @property
    def whole(self) -> bool:
        return len(self.head) + len(self.tail) == self.size


async def scan(session: Session, start: int, end: int, head: int, tail: int) -> Chunk:
    """The combined output's bytes ``[start, end)`` as a :class:`Chunk`: memory stays within
    ``head + tail`` and a piece however much the process wrote (the log may hold 64 MiB)."""
    kept_head = bytearray()
    kept_tail = bytearray()
    newlines = chars = size = 0
    position = start
    while position < end:
        page = await session.page(Stream.COMBINED, position, min(_PIECE, end - position))
        if page.end <= position:
            break
        data = page.data
        position = page.end
        size += len(data)
        newlines += data.count(b"\n")
        chars += len(data) - sum(data.count(bytes([b])) for b in range(0x80, 0xC0))
        room = head - len(kept_head)
        if room > 0:
            kept_head += data[:room]
            data = data[room:]
        if data and tail:
            kept_tail += data
            del kept_tail[: max(0, len(kept_tail) - tail)]
    return Chunk(size, newlines, chars, bytes(kept_head), bytes(kept_tail))


async def read_bytes(session: Session, start: int, end: int, stream: Stream = Stream.COMBINED) -> bytes:
    """Bytes ``[start, end)`` of a view, as the log holds them (bytes the output cap dropped are
    simply absent)."""
    pieces = []
    while start < end:
        page = await session.page(stream, start, min(_PIECE, end - start))
        if page.end <= start:
            break
        pieces.append(page.data)
        start = page.end
    return b"".join(pieces)


def first_log_file(session: Session) -> str:
    """The file that holds the session's combined output: the log's first segment, named before
    its first byte exists (later segments follow it past the segment size)."""
    files = session.log_files
    return files[0] if files else str(Path(session.output.directory) / "combined.000000")
