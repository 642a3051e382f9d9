"""What the harness profiles (faces/codex_profile.py, faces/claude_profile.py) share: the shell a
harness runs commands with, the exit code it reports, and reading a session's output raw.

Those harnesses hand the model what the process wrote, decoded and nothing else (no escape
stripping, no redraw collapsing): so do the profiles, where the exec face would clean it up.
"""

from __future__ import annotations

import os
import pwd
import signal
from pathlib import Path

from procpilot.engine.capture import Stream
from procpilot.engine.session import Session

__all__ = ["default_shell", "exit_code", "first_log_file", "read_bytes"]

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
