"""Before a spawn: refuse a command whose program does not exist, and one too big for the OS.

``/bin/sh -c`` reports a missing program as exit 127 with a line on stderr, which an agent easily
takes for its script's own failure; a typed ``CommandNotFound`` before anything starts is clearer.
The program is the first simple command's, as ``procpilot.shell.first`` reads it; where only the
shell can tell, the check steps aside and the shell's own error stands.

The size caps are the kernel's: one argv string holds at most 128 KiB (MAX_ARG_STRLEN), and our
shell prelude shares the ``-c`` string with the command.
"""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Mapping
from pathlib import Path

from procpilot.errors import CommandNotFound, InvalidArgument, SpawnFailed
from procpilot.shell.first import MAX_SUBSTITUTION_DEPTH, nested_too_deep, substitution_depth
from procpilot.shell.reading import ShellText

__all__ = [
    "MAX_ARGV_BYTES",
    "MAX_ARGV_WORDS",
    "MAX_COMMAND_BYTES",
    "MAX_SUBSTITUTION_DEPTH",
    "MAX_TIMEOUT_S",
    "check_command",
    "check_size",
    "check_timeout",
]

MAX_ARG_STRLEN = 128 * 1024  # bytes in one argv string, its NUL included (Linux)
MAX_COMMAND_BYTES = MAX_ARG_STRLEN - 8 * 1024  # what is left beside our prelude lines
MAX_ARGV_WORDS = 16_384
MAX_ARGV_BYTES = 1024 * 1024  # of ARG_MAX's 2 MiB, the rest is the environment's
MAX_TIMEOUT_S = 365 * 24 * 3600.0  # a year: past it a timeout is an overflow waiting to happen

_TOO_BIG_HINT = {
    "use_a_file": "Write the script to a file in the workspace and run that file (sh script.sh, python3 x.py).",
}


def check_size(command: str | tuple[str, ...]) -> None:
    """Refuse a command the kernel could not pass to ``exec`` (or shell text nested past any
    real use), before anything reads it."""
    if isinstance(command, str):
        # len() first: a 50 MB string is refused without encoding it, and one short enough that
        # even 4 bytes a character fit is let through without encoding it either.
        size = len(command)
        if size > MAX_COMMAND_BYTES or (
            size * 4 > MAX_COMMAND_BYTES and len(command.encode("utf-8", "surrogatepass")) > MAX_COMMAND_BYTES
        ):
            raise InvalidArgument(
                f"command: longer than {MAX_COMMAND_BYTES} bytes (one argument to /bin/sh -c is at most 128 KiB)",
                field="command",
                hints=_TOO_BIG_HINT,
                limit=MAX_COMMAND_BYTES,
            )
        # Only a "$(" opens a level: text without one (most commands) is not scanned for them.
        if "$(" in command and substitution_depth(command) > MAX_SUBSTITUTION_DEPTH:
            raise nested_too_deep()
        return
    if len(command) > MAX_ARGV_WORDS:
        raise InvalidArgument(
            f"command: more than {MAX_ARGV_WORDS} words", field="command", hints=_TOO_BIG_HINT, limit=MAX_ARGV_WORDS
        )
    total = 0
    for index, word in enumerate(command):
        size = len(word.encode("utf-8", "surrogatepass")) + 1
        if size > MAX_ARG_STRLEN:
            raise InvalidArgument(
                f"command[{index}]: longer than {MAX_ARG_STRLEN - 1} bytes (the kernel's limit for one argument)",
                field="command",
                hints=_TOO_BIG_HINT,
                limit=MAX_ARG_STRLEN - 1,
            )
        total += size
        if total > MAX_ARGV_BYTES:
            raise InvalidArgument(
                f"command: its words add up to more than {MAX_ARGV_BYTES} bytes",
                field="command",
                hints=_TOO_BIG_HINT,
                limit=MAX_ARGV_BYTES,
            )


def check_timeout(timeout: float | None) -> None:
    """A timeout the event loop can schedule: finite, not negative, at most a year."""
    if timeout is not None and not 0 <= timeout <= MAX_TIMEOUT_S:  # NaN fails both comparisons
        raise InvalidArgument(f"timeout: {timeout!r} is not between 0 and {MAX_TIMEOUT_S:.0f} seconds", field="timeout")


def check_command(command: ShellText | str | tuple[str, ...], env: Mapping[str, str], cwd: Path | None) -> None:
    """Refuse a command whose program does not exist, before anything is started. Shell text is
    read through its spec's ``ShellText``: from the tokens the policy or the preflight left, or
    else in the first command's own fast pass."""
    if isinstance(command, str):
        command = ShellText(command)
    program = command[0] if isinstance(command, tuple) else command.first_program()
    if not program:
        if isinstance(command, tuple):
            raise InvalidArgument("command: the argv list is empty", field="command")
        return
    if "/" in program:
        path = Path(program) if os.path.isabs(program) else (cwd or Path.cwd()) / program
        if not path.exists():
            raise CommandNotFound(f"command not found: {program}", command=program)
        if not path.is_file() or not os.access(path, os.X_OK):
            what = "a directory" if path.is_dir() else "not executable"
            raise SpawnFailed(
                f"cannot run {program}: {what}",
                errno=errno.EISDIR if path.is_dir() else errno.EACCES,
                hints={"check_permissions": f"Make it executable (chmod +x {program}) or run it with its interpreter."},
            )
        return
    if shutil.which(program, path=env.get("PATH", os.defpath)) is None:
        raise CommandNotFound(f"command not found: {program}", command=program)
