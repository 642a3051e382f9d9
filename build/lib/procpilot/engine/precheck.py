"""Before a spawn: refuse a command whose program does not exist, and one too big for the OS.

``/bin/sh -c`` reports a missing program as exit 127 with a line on stderr, which an agent easily
takes for its script's own failure; a typed ``CommandNotFound`` before anything starts is clearer.
The check reads only the first simple command of the text, the way the shell would, in one pass
over it: quotes, backslashes, comments, ``VAR=value`` prefixes and ``exec``/``command`` are
understood; wherever the shell decides at run time (an expansion, a glob, a keyword, a builtin,
any syntax), the check steps aside and the shell's own error stands.

The size caps are the kernel's: one argv string holds at most 128 KiB (MAX_ARG_STRLEN), and our
shell prelude shares the ``-c`` string with the command.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
from collections.abc import Mapping
from pathlib import Path

from procpilot.errors import CommandNotFound, InvalidArgument, SpawnFailed

__all__ = [
    "MAX_ARGV_BYTES",
    "MAX_ARGV_WORDS",
    "MAX_COMMAND_BYTES",
    "MAX_SUBSTITUTION_DEPTH",
    "MAX_TIMEOUT_S",
    "check_command",
    "check_size",
    "check_timeout",
    "first_program",
]

MAX_ARG_STRLEN = 128 * 1024  # bytes in one argv string, its NUL included (Linux)
MAX_COMMAND_BYTES = MAX_ARG_STRLEN - 8 * 1024  # what is left beside our prelude lines
MAX_ARGV_WORDS = 16_384
MAX_ARGV_BYTES = 1024 * 1024  # of ARG_MAX's 2 MiB, the rest is the environment's
MAX_SUBSTITUTION_DEPTH = 100
MAX_TIMEOUT_S = 365 * 24 * 3600.0  # a year: past it a timeout is an overflow waiting to happen

_TOO_BIG_HINT = {
    "use_a_file": "Write the script to a file in the workspace and run that file (sh script.sh, python3 x.py).",
}

# Words a shell resolves itself: a first word among these is never "not found" up front.
_SHELL_WORDS = frozenset(
    [
        "!",
        "{",
        "}",
        "(",
        "[",
        "[[",
        ".",
        ":",
        "alias",
        "bg",
        "break",
        "case",
        "cd",
        "command",
        "continue",
        "declare",
        "echo",
        "eval",
        "exec",
        "exit",
        "export",
        "false",
        "fc",
        "fg",
        "for",
        "function",
        "getopts",
        "hash",
        "if",
        "jobs",
        "kill",
        "let",
        "local",
        "printf",
        "pwd",
        "read",
        "readonly",
        "return",
        "set",
        "shift",
        "test",
        "times",
        "trap",
        "true",
        "type",
        "typeset",
        "ulimit",
        "umask",
        "unalias",
        "unset",
        "until",
        "wait",
        "while",
        "time",
    ]
)
_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\+?=")
_ENDS_WORD = frozenset(" \t\n;&|()<>")
_PARENS = re.compile(r"\$\(|[()]")


def check_size(command: str | tuple[str, ...]) -> None:
    """Refuse a command the kernel could not pass to ``exec`` (or shell text nested past any
    real use), before anything reads it."""
    if isinstance(command, str):
        # len() first: a 50 MB string is refused without encoding it.
        if len(command) > MAX_COMMAND_BYTES or len(command.encode("utf-8", "surrogatepass")) > MAX_COMMAND_BYTES:
            raise InvalidArgument(
                f"command: longer than {MAX_COMMAND_BYTES} bytes (one argument to /bin/sh -c is at most 128 KiB)",
                field="command",
                hints=_TOO_BIG_HINT,
                limit=MAX_COMMAND_BYTES,
            )
        if _substitution_depth(command) > MAX_SUBSTITUTION_DEPTH:
            raise InvalidArgument(
                f"command: $( ) nested more than {MAX_SUBSTITUTION_DEPTH} deep",
                field="command",
                hints={"simplify": "Write the inner steps as separate commands or a script file."},
                limit=MAX_SUBSTITUTION_DEPTH,
            )
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


_PLAIN_RUN = re.compile(r"[^ \t\n;&|()<>'\"\\$`*?\[\]{}~]+")
_DQ_RUN = re.compile(r'[^"\\$`]+')


def check_timeout(timeout: float | None) -> None:
    """A timeout the event loop can schedule: finite, not negative, at most a year."""
    if timeout is not None and not 0 <= timeout <= MAX_TIMEOUT_S:  # NaN fails both comparisons
        raise InvalidArgument(f"timeout: {timeout!r} is not between 0 and {MAX_TIMEOUT_S:.0f} seconds", field="timeout")


def _substitution_depth(command: str) -> int:
    """How deep ``$( )`` nests, read past quoting: an upper bound (a quoted ``$(`` counts too),
    in one pass. Each level is a subshell the shell forks, all alive at once: 2,000 of them is a
    fork storm in one line, not a command."""
    stack: list[bool] = []  # per open paren: whether it opened a $( )
    depth = deepest = 0
    for found in _PARENS.finditer(command):
        if found.group() == ")":
            if stack and stack.pop():
                depth -= 1
            continue
        subst = found.group() == "$("
        stack.append(subst)
        if subst:
            depth += 1
            deepest = max(deepest, depth)
    return deepest


def _read_word(text: str, pos: int) -> tuple[str | None, int]:
    """The word starting at ``pos`` after quote removal, and where it ends; None for the word when
    the shell would expand it (or the quoting is unfinished). One pass; runs of ordinary
    characters are taken by a regex at a time, so a 100 KB word costs a few regex steps."""
    out: list[str] = []
    n = len(text)
    while pos < n and text[pos] not in _ENDS_WORD:
        c = text[pos]
        if run := _PLAIN_RUN.match(text, pos):
            out.append(run.group())
            pos = run.end()
        elif c == "'":
            end = text.find("'", pos + 1)
            if end < 0:
                return None, n
            out.append(text[pos + 1 : end])
            pos = end + 1
        elif c == '"':
            word, pos = _read_double_quoted(text, pos + 1)
            if word is None:
                return None, n
            out.append(word)
        elif c == "\\":
            if pos + 1 >= n:
                return None, n
            if text[pos + 1] != "\n":  # backslash-newline joins lines, adds nothing
                out.append(text[pos + 1])
            pos += 2
        else:  # unquoted $ ` * ? [ ] { } ~: an expansion or a pattern
            return None, n
    return "".join(out), pos


def _read_double_quoted(text: str, pos: int) -> tuple[str | None, int]:
    """The text of a double-quoted string whose body starts at ``pos``, and the position after
    its closing quote; None if it expands something ($, `) or never closes."""
    out: list[str] = []
    n = len(text)
    while pos < n:
        if run := _DQ_RUN.match(text, pos):
            out.append(run.group())
            pos = run.end()
            continue
        c = text[pos]
        if c == '"':
            return "".join(out), pos + 1
        if c in "$`":
            return None, n
        # A backslash escapes only these inside double quotes; elsewhere it stays.
        if pos + 1 < n and text[pos + 1] in '"\\$`\n':
            if text[pos + 1] != "\n":
                out.append(text[pos + 1])
            pos += 2
        else:
            out.append(c)
            pos += 1
    return None, n


def first_program(command: str) -> str | None:
    """The program the first simple command of ``command`` runs, or None where the shell decides."""
    pos, n = 0, len(command)
    prefix = True  # still among VAR=value words, or after exec/command
    while True:
        while pos < n and (command[pos] in " \t" or command.startswith("\\\n", pos)):
            pos += 2 if command[pos] == "\\" else 1
        if pos >= n or command[pos] in "#\n;&|()<>":
            return None  # no program here (a comment, an empty command) or syntax: the shell's
        start = pos
        word, pos = _read_word(command, pos)
        if word is None:
            return None
        if prefix and _ASSIGNMENT.match(command, start):
            continue
        if word in ("exec", "command"):
            prefix = False  # `exec prog` runs prog; so does `command prog` (options: the shell's)
            continue
        if word in _SHELL_WORDS or word.startswith("-") or not word:
            return None
        return word


def check_command(command: str | tuple[str, ...], env: Mapping[str, str], cwd: Path | None) -> None:
    """Refuse a command whose program does not exist, before anything is started."""
    program = command[0] if isinstance(command, tuple) else first_program(command)
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
