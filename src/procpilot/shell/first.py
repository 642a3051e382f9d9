"""The first simple command of a shell line, read in one pass: what the spawn's pre-check needs.

``/bin/sh -c`` reports a missing program as exit 127, which an agent easily takes for its
script's own failure, so the engine looks the program up before anything starts. This reads only
the first simple command, the way the shell would: quotes, backslashes, comments, ``VAR=value``
prefixes and ``exec``/``command`` are understood; wherever the shell decides at run time (an
expansion, a glob, a keyword, a builtin, any syntax), it answers None and the shell's own error
stands. Runs of ordinary characters are taken by a regex at a time, so a 2 MB word costs
milliseconds: this runs on the event loop for every spawn.
"""

from __future__ import annotations

import re

from procpilot.errors import InvalidArgument

__all__ = ["MAX_SUBSTITUTION_DEPTH", "SHELL_WORDS", "first_program", "nested_too_deep", "substitution_depth"]

# $( $( ... ) ) past this is malformed input, not a command: each level is a live subshell.
MAX_SUBSTITUTION_DEPTH = 100


def nested_too_deep() -> InvalidArgument:
    """The refusal of a command whose $( ) nest deeper than MAX_SUBSTITUTION_DEPTH, wherever it is read."""
    return InvalidArgument(
        f"command: $( ) nested more than {MAX_SUBSTITUTION_DEPTH} deep",
        field="command",
        hints={"simplify": "Write the inner steps as separate commands or a script file."},
        limit=MAX_SUBSTITUTION_DEPTH,
    )


# Words a shell resolves itself: a first word among these is never "not found" up front.
SHELL_WORDS = frozenset(
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


_PLAIN_RUN = re.compile(r"[^ \t\n;&|()<>'\"\\$`*?\[\]{}~]+")
_DQ_RUN = re.compile(r'[^"\\$`]+')


def substitution_depth(command: str) -> int:
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
        if word in SHELL_WORDS or word.startswith("-") or not word:
            return None
        return word
