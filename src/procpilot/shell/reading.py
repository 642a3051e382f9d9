"""One call's shell text, lexed once and read by every check that needs it.

A command line is read before it runs by up to three checks: the script preflight (which python
or node scripts it runs), the policy's allow and deny lists (every program it runs) and the
spawn's pre-check (whether its first program exists). The ``SpawnSpec`` of the call carries one
``ShellText``; each check reads the line through it, so the text (and any text a wrapper hands
on: ``sh -c '...'``) is lexed at most once per call, by whichever check comes first, and the
others walk the tokens it left.

The pre-check comes last and needs only the first program: where no check lexed the line, it
takes the first simple command in its own fast pass (``shell/first.py``: microseconds however
long the line, where a full lexing of 120 KiB takes a third of a second on the event loop).
After the pre-check, a line's lexing stays only if the line is short (at most 4 KiB): the
session keeps its spec as long as it lives, and the name a result shows (``render.derive_name``)
reads the kept tokens; a long line's tokens (megabytes for 120 KiB) are let go.
"""

from __future__ import annotations

import re
import threading
from typing import Any

from procpilot.shell import first
from procpilot.shell.analysis import analyze_text
from procpilot.shell.lexer import Lexed, Scan, Word, lex

__all__ = ["ShellText"]

# A line this long or shorter keeps its tokens after the pre-check, for the session's name.
_KEPT_CHARS = 4096
# first.py's assignment prefix (no subscripts: `a[1]=x` is a pattern to it, and so here).
_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\+?=")


class ShellText:
    """A command line and what reading it found so far. Safe to share between threads (the
    policy and the preflight read a big line in worker threads); pickled as its text alone."""

    __slots__ = ("_commands", "_lexed", "_lock", "text")

    def __init__(self, text: str) -> None:
        self.text = text
        self._lexed: dict[str, Lexed] = {}  # this line's lexing, and that of texts its wrappers run
        self._commands: list[tuple[str, tuple[str | None, ...]]] | None = None
        self._lock = threading.RLock()

    def __repr__(self) -> str:
        return f"ShellText({self.text[:60]!r}{'...' if len(self.text) > 60 else ''})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (ShellText, (self.text,))

    def lexed(self, text: str | None = None) -> Lexed:
        """``text`` (default: the line) lexed, the first time it is asked for."""
        text = self.text if text is None else text
        with self._lock:
            found = self._lexed.get(text)
            if found is None:
                found = self._lexed[text] = lex(text)
            return found

    def lexed_already(self) -> Lexed | None:
        """The line's lexing if a reader made it (and it was kept), else None: never lexes."""
        with self._lock:
            return self._lexed.get(self.text)

    def analyze(self, scan: Scan) -> None:
        """Read the line into ``scan`` (its programs and problems), lexing nothing twice."""
        scan.lex = self.lexed
        analyze_text(self.text, scan)

    def commands(self) -> list[tuple[str, tuple[str | None, ...]]]:
        """Best effort, as ``shell.commands_in``: each program the line runs with its arguments."""
        with self._lock:
            if self._commands is None:
                scan = Scan(realpath_of=lambda _word: None)
                self.analyze(scan)
                self._commands = [(p.word, p.args) for p in scan.programs if not p.builtin]
            return self._commands

    def first_program(self) -> str | None:
        """The program of the first simple command, or None where only the shell can tell.

        The pre-check's question, asked last, right before the start: so what the checks lexed
        is let go here, but for a short line's own tokens (a session keeps its spec, and this
        with it, as long as it lives)."""
        with self._lock:
            lexed = self._lexed.get(self.text)
            self._lexed.clear()
            if lexed is not None and len(self.text) <= _KEPT_CHARS:
                self._lexed[self.text] = lexed
            self._commands = None
        if lexed is None:
            return first.first_program(self.text)
        return _first_of(lexed)


def _first_of(lexed: Lexed) -> str | None:
    """``first.first_program``'s answer, read from tokens: as conservative, stepping aside at
    anything the shell decides when it runs the line (an expansion, a pattern, a keyword or
    builtin, syntax), and at unfinished quoting anywhere in the line (the shell refuses the
    line's syntax before it runs anything)."""
    if any(problem.startswith("unterminated") for problem in lexed.problems):
        return None  # the shell refuses the line's syntax, whatever its first word
    prefix = True  # still among VAR=value words, or after exec/command
    for tok in lexed.tokens:
        if not isinstance(tok, Word) or not tok.static or tok.fd_var:
            return None  # an operator or redirection first, or a word only known at run time
        if "$" in tok.raw or "`" in tok.raw or tok.raw.endswith("\\"):
            return None  # $'...', $"...", or a backslash escaping what follows the word
        if prefix and _ASSIGNMENT.match(tok.raw):
            continue
        if tok.text in ("exec", "command"):
            prefix = False
            continue
        if tok.text in first.SHELL_WORDS or tok.text.startswith("-") or not tok.text:
            return None
        return tok.text
    return None
