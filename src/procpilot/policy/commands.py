"""Command allowlists and denylists, matched on the programs a command line would really run.

An agent's policy may name the programs it may run (an allowlist) or must not run (a denylist). A
shell command line hides programs in many places: after ``;`` ``&&`` ``|`` ``&`` or a newline, in
``$(...)`` and backticks, behind wrappers (``env``, ``sh -c``, ``xargs``, ``find -exec``, ``timeout``
...), behind quoting (``"r"m``, ``r\\m``) and behind paths (``/bin/rm``, a copy in ``/tmp``). So this
module reads the text the way ``sh`` and ``bash`` would (a small lexer for POSIX sh plus the
bash-isms agents write), finds every command word, unwraps the wrappers, and resolves each program
to the real path of the file that would run (PATH lookup, then every symlink followed). A program
is allowed iff its real path is the real path of an allowlist entry: a copy of ``rm`` named ``ls``
is refused, a symlink to ``/usr/bin/ls`` is allowed.

Where ``sh`` (dash) and ``bash`` read a line differently (``&>``, ``[[ a || b ]]``, ``$'...'``) the
reading that finds more commands wins. What cannot be known before the line runs (a command word
built from a variable, ``eval``, ``source``, a command substitution, a function definition...) is
refused under an allowlist as :class:`UnanalyzableCommand`: when we cannot know what will run,
refusing is the only safe answer. Refusals name what was refused and why, so an agent can rewrite.

An allowlist is not a sandbox. An allowed program that runs other programs runs them unchecked:
allowing a shell (to read a script or stdin), an interpreter (python, node, perl, awk...) or a tool
with its own command hooks (git aliases and hooks, make, npm scripts, vim, less...) allows
everything. Programs that take a command as an argument are unwrapped only for the wrappers listed
in ``_WRAPPERS``; any other (ssh, su, script, unshare, chroot, parallel...) must itself be allowed,
and allowing it allows what it runs. Use isolation (read-only root, no network, a separate user) to
limit what programs can do; use the allowlist to keep an agent to the tools it was meant to use.
"""

from __future__ import annotations

import functools
import itertools
import os
import re
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from procpilot.errors import CommandDenied, InvalidArgument, UnanalyzableCommand

__all__ = ["CommandDenied", "CommandPolicy", "UnanalyzableCommand", "programs_in", "sensitive_variable"]






# ---------------------------------------------------------------------------------------------
# Tokens

_MAX_SUBSTITUTIONS = 100  # $( $( ... ) ): no real command comes near; each level costs stack
_MAX_DEPTH = 12  # sh -c 'sh -c "..."' nesting; deeper is refused rather than followed forever


@dataclass(slots=True)
class _Word:
    """A shell word: ``text`` after quote removal (expansions kept as written), ``raw`` as typed."""

    text: str
    raw: str
    quoted: bool = False  # some part was quoted or escaped: not a reserved word
    expands: bool = False  # a $ or ` expansion outside single quotes: the value is only known at run time
    pattern: bool = False  # an unquoted glob, brace expansion, ~ or zsh =cmd: may become other words
    fd_var: bool = False  # `{NAME}` right before a redirection: bash assigns the new fd to NAME

    @property
    def static(self) -> bool:
        """True when the shell will pass exactly ``text``, one word, whatever the environment."""
        return not (self.expands or self.pattern)


@dataclass(frozen=True, slots=True)
class _Op:
    text: str


@dataclass(frozen=True, slots=True)
class _Redir:
    op: str


_Token = _Word | _Op | _Redir


@dataclass(slots=True)
class _Program:
    word: str  # the command word as the shell (or exec) will look it up
    builtin: bool = False  # a shell builtin that runs no program
    shell_c: bool = False  # a shell running a -c string that was checked here


@dataclass(slots=True)
class _Scan:
    """What reading one command found: its programs in order, and what could not be checked."""

    realpath_of: Callable[[str], str | None]
    interactive: bool = False
    programs: list[_Program] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    cwd_changed: bool = False  # cd / pushd / env -C ...: relative paths no longer mean what they did
    depth: int = 0
    substitutions: int = 0  # $( ) open around the lexer now

    def enter_substitution(self) -> None:
        """One more $( ) deep. Past _MAX_SUBSTITUTIONS the text is malformed input, not a command
        to judge: a typed error long before Python's recursion limit."""
        self.substitutions += 1
        if self.substitutions > _MAX_SUBSTITUTIONS:
            self.substitutions -= 1
            raise InvalidArgument(
                f"command: $( ) nested more than {_MAX_SUBSTITUTIONS} deep",
                field="command",
                hints={"simplify": "Write the inner steps as separate commands or a script file."},
            )

    def problem(self, message: str) -> None:
        message = "".join(c if c.isprintable() or c == " " else repr(c)[1:-1] for c in message)
        if message not in self.problems:
            self.problems.append(message)


def _snippet(text: str, limit: int = 60) -> str:
    """``text`` for a message: control characters escaped (``ls\\r`` shows as such), long text cut."""
    text = "".join(c if c.isprintable() or c == " " else repr(c)[1:-1] for c in text)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _show(words: Sequence[_Word]) -> str:
    return _snippet(" ".join(w.raw for w in words), 80)


_WORD_END = frozenset(" \t\n;&|()<>")
_PARAM_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|[0-9@*#?$!\-]")
_PARAM = re.compile(r"#?(?:[A-Za-z_][A-Za-z0-9_]*|[0-9]+|[@*#?$!\-])(?:\[(?:[0-9]+|[@*])\])?")
_PARAM_OP = re.compile(r":?[-=+?]|##?|%%?|/|\^|,")
_SUBSTRING = re.compile(r":[\s0-9:+\-]*")
_NUMERIC_ARITH = re.compile(r"[0-9\s+\-*/%()<>=!&|^~?:,]*")
_BRACE_EXPANSION = re.compile(r"\{[^{}]*(?:,|\.\.)[^{}]*\}")
_REDIRECTIONS = ("<<<", "<<-", "<<", "<>", "<&", "<", ">>", ">|", ">&", ">")


def _is_pattern(shape: str) -> bool:
    """Whether the unquoted characters of a word (quoted ones masked as ``_``) expand to other words."""
    if "*" in shape or "?" in shape or re.search(r"\[.*\]", shape):
        return True
    if _BRACE_EXPANSION.search(shape):
        return True
    return shape.startswith("~") or (shape.startswith("=") and len(shape) > 1)


class _Lexer:
    """Splits shell text into words, operators and redirections, noting what runs at expansion time.

    Command substitutions are lexed recursively (their tokens go to ``nested``, to be read as
    commands too); here-doc bodies are skipped, and scanned for expansions when the delimiter is
    unquoted (such a body is expanded like a double-quoted string).
    """

    def __init__(self, text: str, scan: _Scan, nested: list[list[_Token]], pos: int = 0, closing: bool = False) -> None:
        self.text = text
        self.n = len(text)
        self.pos = pos
        self.scan = scan
        self.nested = nested
        self.closing = closing  # inside $( ... ): stop at the unmatched )
        self.closed = False
        self.depth = 0
        self.tokens: list[_Token] = []
        self.pending: list[tuple[str, bool, bool]] = []  # here-docs: delimiter, strip tabs, quoted
        self.want_delimiter: bool | None = None

    def run(self) -> list[_Token]:
        t = self.text
        while self.pos < self.n:
            c = t[self.pos]
            if c in " \t":
                self.pos += 1
            elif c == "\\" and t.startswith("\n", self.pos + 1):
                self.pos += 2
            elif c == "#":
                end = t.find("\n", self.pos)
                self.pos = self.n if end < 0 else end
            elif c == "\n":
                self.tokens.append(_Op("\n"))
                self.pos += 1
                self._heredoc_bodies()
            elif c in ";&|()<>":
                if self._operator():
                    return self.tokens
            else:
                self._word()
        if self.closing:
            self.scan.problem("unterminated $( ... )")
        return self.tokens

    # -- operators ------------------------------------------------------------------------------

    def _operator(self) -> bool:
        """Lex one operator at ``pos``; True when it closes the ``$(`` this lexer was started for."""
        t, p = self.text, self.pos
        c = t[p]
        if c == "(":
            self.depth += 1
            self._emit_op("(", 1)
        elif c == ")":
            if self.closing and self.depth == 0:
                self.pos += 1
                self.closed = True
                return True
            self.depth = max(0, self.depth - 1)
            self._emit_op(")", 1)
        elif c == ";":
            op = next(o for o in (";;&", ";;", ";&", ";") if t.startswith(o, p))
            self._emit_op(op, len(op))
        elif c == "&":
            # `&>file` is bash for "stdout and stderr to file", but dash reads `&` (background) and
            # then `>file`, so `ls &>/dev/null rm x` runs rm under /bin/sh. Reading it as `&` + `>`
            # finds every command either shell would run.
            self._emit_op("&&" if t.startswith("&&", p) else "&", 2 if t.startswith("&&", p) else 1)
        elif c == "|":
            op = "||" if t.startswith("||", p) else "|&" if t.startswith("|&", p) else "|"
            self._emit_op(op, len(op))
        elif t.startswith(("<(", ">("), p):
            self.pos = p + 2
            self._substitution(p, "process substitution")
            raw = t[p : self.pos]
            self.tokens.append(_Word(raw, raw, expands=True))
        else:
            op = next(o for o in _REDIRECTIONS if t.startswith(o, p))
            self.tokens.append(_Redir(op))
            self.pos = p + len(op)
            if op in ("<<", "<<-"):
                self.want_delimiter = op == "<<-"
        return False

    def _emit_op(self, op: str, length: int) -> None:
        self.tokens.append(_Op(op))
        self.pos += length

    # -- words ----------------------------------------------------------------------------------

    def _word(self) -> None:
        t = self.text
        start = self.pos
        out: list[str] = []
        shape: list[str] = []
        w = _Word("", "")
        while self.pos < self.n:
            c = t[self.pos]
            if c in _WORD_END:
                if c in "<>" and shape and not w.quoted and not w.expands and "".join(shape).isdigit():
                    return  # an fd number (2>, 0<): part of the redirection, not a word
                break
            if c == "\\":
                if t.startswith("\n", self.pos + 1):
                    self.pos += 2
                    continue
                out.append(t[self.pos + 1 : self.pos + 2] or "\\")
                shape.append("_")
                w.quoted = True
                self.pos += 2
            elif c == "'":
                end = t.find("'", self.pos + 1)
                if end < 0:
                    self.scan.problem(f"unterminated ' quote in {_snippet(t[start:])}")
                    end = self.n
                out.append(t[self.pos + 1 : end])
                shape.append("_")
                w.quoted = True
                self.pos = end + 1
            elif c == '"':
                self._double_quoted(out, w)
                shape.append("_")
            elif c == "$":
                shape.append("_" if self._dollar(out, w, in_dq=False) else "$")
            elif c == "`":
                self._backtick(out, w, in_dq=False)
                shape.append("_")
            else:
                out.append(c)
                shape.append(c)
                self.pos += 1
        self.pos = min(self.pos, self.n)
        w.text = "".join(out)
        w.raw = t[start : self.pos]
        w.pattern = _is_pattern("".join(shape))
        # bash reads `{b[x]}>file` as "open file, store the fd in b[x]", and a subscript is
        # arithmetic that can run code hidden in x's value (quotes inside the braces do not stop it).
        if t.startswith(("<", ">"), self.pos) and len(w.raw) > 2 and w.raw[0] == "{" and w.raw[-1] == "}":
            w.fd_var = True
        if self.want_delimiter is not None:
            self.pending.append((w.text, self.want_delimiter, w.quoted))
            self.want_delimiter = None
        self.tokens.append(w)

    def _double_quoted(self, out: list[str], w: _Word) -> None:
        t = self.text
        start = self.pos
        self.pos += 1
        w.quoted = True
        while self.pos < self.n:
            c = t[self.pos]
            if c == '"':
                self.pos += 1
                return
            if c == "\\" and self.pos + 1 < self.n:
                nxt = t[self.pos + 1]
                if nxt != "\n":
                    out.append(nxt if nxt in '$`"\\' else "\\" + nxt)
                self.pos += 2
            elif c == "$":
                self._dollar(out, w, in_dq=True)
            elif c == "`":
                self._backtick(out, w, in_dq=True)
            else:
                out.append(c)
                self.pos += 1
        self.scan.problem(f'unterminated " quote in {_snippet(t[start:])}')

    def _dollar(self, out: list[str], w: _Word, *, in_dq: bool) -> bool:
        """Lex the expansion at ``pos`` (a ``$``); False when the ``$`` is just a character."""
        t, p = self.text, self.pos
        nxt = t[p + 1 : p + 2]
        if t.startswith("$((", p):
            end = _arith_end(t, p + 3)
            if end >= 0:
                self.pos = end
                self._arithmetic(t[p + 3 : end - 2], t[p:end])
                out.append(t[p:end])
                w.expands = True
                return True
        if nxt == "(":
            self.pos = p + 2
            self._substitution(p, "command substitution")
        elif nxt == "[":  # $[ ... ]: bash's old arithmetic
            end = t.find("]", p + 2)
            if end < 0:
                self.scan.problem(f"unterminated $[ in {_snippet(t[p:])}")
            self.pos = self.n if end < 0 else end + 1
            self._arithmetic(t[p + 2 : max(end, p + 2)], t[p : self.pos])
        elif nxt == "{":
            self.pos = p + 2
            self._parameter(p, in_dq=in_dq)
        elif nxt == "'" and not in_dq:
            # $'...' (bash, zsh, ksh): backslash escapes, \' does not end it. dash reads `$` and then
            # a plain '...' that \' does end: the two shells see different text after it, so refuse.
            i = p + 2
            while i < self.n and t[i] != "'":
                if t[i] == "\\":
                    if t.startswith("'", i + 1):
                        self.scan.problem(f"{_snippet(t[p:])}: sh and bash split $'...\\'...' differently")
                    i += 1
                i += 1
            if i >= self.n:
                self.scan.problem(f"unterminated $' quote in {_snippet(t[p:])}")
            self.pos = min(i + 1, self.n)
            w.quoted = True
        elif nxt == '"' and not in_dq:
            self.pos = p + 1  # $"...": a translated string; the caller lexes the "..." next
            w.expands = True
            return True
        else:
            m = _PARAM_NAME.match(t, p + 1)
            if m is None:
                out.append("$")
                self.pos = p + 1
                return False
            self.pos = m.end()
        out.append(t[p : self.pos])
        w.expands = True
        return True

    def _arithmetic(self, body: str, whole: str) -> None:
        # bash evaluates a variable's value as an arithmetic expression, and `a[$(cmd)]` in that value
        # runs cmd: only constant arithmetic is safe to allow.
        if not _NUMERIC_ARITH.fullmatch(body):
            self.scan.problem(f"arithmetic {_snippet(whole)} uses variables, which bash can turn into code")

    def _substitution(self, start: int, what: str) -> None:
        """``pos`` is just after ``$(`` / ``<(`` / ``>(``: lex the code up to its closing paren."""
        self.scan.enter_substitution()
        try:
            sub = _Lexer(self.text, self.scan, self.nested, self.pos, closing=True)
            self.nested.append(sub.run())
        finally:
            self.scan.substitutions -= 1
        self.pos = sub.pos
        self.scan.problem(f"{what} {_snippet(self.text[start : self.pos])} runs a command we cannot check")

    def _backtick(self, out: list[str], w: _Word, *, in_dq: bool) -> None:
        t, p = self.text, self.pos
        i = p + 1
        code: list[str] = []
        while i < self.n and t[i] != "`":
            if t[i] == "\\" and i + 1 < self.n:
                nxt = t[i + 1]
                code.append(nxt if nxt in "$`\\" or (in_dq and nxt == '"') else "\\" + nxt)
                i += 2
                continue
            code.append(t[i])
            i += 1
        if i >= self.n:
            self.scan.problem(f"unterminated ` in {_snippet(t[p:])}")
        self.pos = min(i + 1, self.n)
        self.nested.append(_Lexer("".join(code), self.scan, self.nested).run())
        self.scan.problem(f"command substitution {_snippet(t[p : self.pos])} runs a command we cannot check")
        out.append(t[p : self.pos])
        w.expands = True

    def _parameter(self, start: int, *, in_dq: bool) -> None:
        """``pos`` is just after ``${``: find the closing brace, then judge the expansion's form."""
        t = self.text
        scratch = _Word("", "")
        while self.pos < self.n:
            c = t[self.pos]
            if c == "}":
                self.pos += 1
                self._judge_parameter(t[start + 2 : self.pos - 1], t[start : self.pos])
                return
            if c == "\\":
                self.pos += 2
            elif c == "'" and not in_dq:
                end = t.find("'", self.pos + 1)
                self.pos = self.n if end < 0 else end + 1
            elif c == '"':
                self._double_quoted([], scratch)
            elif c == "$":
                if not self._dollar([], scratch, in_dq=in_dq):
                    continue
            elif c == "`":
                self._backtick([], scratch, in_dq=in_dq)
            else:
                self.pos += 1
        self.scan.problem(f"unterminated ${{ in {_snippet(t[start:])}")

    def _judge_parameter(self, content: str, whole: str) -> None:
        # Plain forms only: ${x} ${x:-w} ${#x} ${x%p} ${x/p/r} ${x:1:2}. Indirection ${!x}, ${x@P},
        # substring offsets and subscripts that are expressions, zsh ${(e)x}, ksh ${ cmd;} can all
        # run code hidden in a variable's value.
        m = _PARAM.match(content)
        ok = m is not None and not (content.startswith("!") and content != "!")
        if m is not None and ok:
            rest = content[m.end() :]
            ok = rest == "" or _PARAM_OP.match(rest) is not None or _SUBSTRING.fullmatch(rest) is not None
        if not ok:
            self.scan.problem(f"parameter expansion {_snippet(whole)} can run code or is too complex to check")

    def _heredoc_bodies(self) -> None:
        """Skip the bodies of the here-docs started on the line that just ended.

        A body ends at the first line either shell would take as the delimiter: dash compares each
        physical line, bash first joins backslash-continued lines of an unquoted body (so ``EO\\``
        + ``F`` ends it). Ending early only makes more lines count as commands.
        """
        t = self.text
        for delimiter, strip_tabs, quoted in self.pending:
            start = self.pos
            body_end = self.n
            joined = ""
            while self.pos < self.n:
                nl = t.find("\n", self.pos)
                end = self.n if nl < 0 else nl
                line = t[self.pos : end]
                line = line.lstrip("\t") if strip_tabs else line
                if line == delimiter or joined + line == delimiter:
                    body_end = self.pos
                    self.pos = min(end + 1, self.n)
                    break
                trailing = len(line) - len(line.rstrip("\\"))
                joined = joined + line[:-1] if not quoted and trailing % 2 == 1 else ""
                self.pos = end + 1
            self.pos = min(self.pos, self.n)
            if not quoted:
                self._scan_body(start, body_end)
        self.pending.clear()

    def _scan_body(self, start: int, end: int) -> None:
        """An unquoted here-doc body is expanded like a double-quoted string: find its expansions."""
        resume = self.pos
        self.pos = start
        scratch = _Word("", "")
        while self.pos < end:
            c = self.text[self.pos]
            if c == "\\":
                self.pos += 2
            elif c == "$":
                if not self._dollar([], scratch, in_dq=True):
                    continue
            elif c == "`":
                self._backtick([], scratch, in_dq=True)
            else:
                self.pos += 1
        self.pos = resume


def _arith_end(t: str, i: int) -> int:
    """Index just past the ``))`` closing a ``$((`` whose body starts at ``i``; -1 when it is no arithmetic."""
    depth = 0
    while i < len(t):
        c = t[i]
        if c == "(":
            depth += 1
        elif c == ")":
            if depth == 0:
                return i + 2 if t.startswith("))", i) else -1
            depth -= 1
        i += 1
    return -1


# ---------------------------------------------------------------------------------------------
# Commands

_RESERVED = frozenset({"if", "then", "else", "elif", "fi", "do", "done", "while", "until", "{", "}", "!"})
_CASE_ENDS = frozenset({";;", ";&", ";;&"})
_ASSIGNMENT = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)(\[[^\]]*\])?\+?=")
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

# Variables that decide which program runs, what it loads, or what the shell runs by itself.
_SENSITIVE = frozenset({
    "PATH", "ENV", "BASH_ENV", "CDPATH", "SHELLOPTS", "BASHOPTS", "PS0", "PS1", "PS2", "PS3",
    "PS4", "PROMPT_COMMAND", "EXECIGNORE", "FPATH", "ZDOTDIR", "GCONV_PATH", "BASH_LOADABLES_PATH",
})  # fmt: skip
_SENSITIVE_PREFIXES = ("LD_", "DYLD_", "BASH_FUNC_")


def sensitive_variable(name: str) -> bool:
    """Whether setting ``name`` can change which program runs, what it loads or what a shell runs."""
    return name in _SENSITIVE or name.startswith(_SENSITIVE_PREFIXES)


_sensitive = sensitive_variable


def _analyze_text(text: str, scan: _Scan) -> None:
    """Read shell text: every command it runs goes to ``scan.programs``."""
    scan.depth += 1
    try:
        if scan.depth > _MAX_DEPTH:
            scan.problem("shell code nested too deeply to check")
            return
        nested: list[list[_Token]] = []
        tokens = _Lexer(text, scan, nested).run()
        _parse(tokens, scan)
        for sub in nested:  # grows while parsing only through wrappers, which lex their own text
            _parse(sub, scan)
    finally:
        scan.depth -= 1


def _parse(tokens: list[_Token], scan: _Scan) -> None:
    """Split tokens into simple commands (skipping reserved words, assignments and redirections)."""
    argv: list[_Word] = []
    started = False  # an assignment or redirection belongs to the current command already
    case_depth = 0
    case_patterns = False
    i = 0

    def finish() -> None:
        nonlocal argv, started
        if argv:
            _analyze_argv(argv, scan, in_shell=True)
        argv = []
        started = False

    while i < len(tokens):
        tok = tokens[i]
        i += 1
        if case_patterns:  # `pattern | pattern )` of a case item: words, not commands
            if _is_word(tok, "esac"):
                case_depth -= 1
                case_patterns = False
                continue
            if isinstance(tok, _Word) or (isinstance(tok, _Op) and tok.text in ("|", "(", "\n")):
                continue
            case_patterns = False
            if isinstance(tok, _Op) and tok.text == ")":
                continue
        if isinstance(tok, _Op):
            if tok.text == "(" and (argv or started):
                if len(argv) == 1 and i < len(tokens) and tokens[i] == _Op(")"):
                    scan.problem(f"function definition {argv[0].raw}() makes a command name run other code")
                    argv = []
                    i += 1
                else:
                    scan.problem(f"unexpected ( after {_show(argv) or 'an assignment'} (array, extglob or function)")
            finish()
            if tok.text in _CASE_ENDS and case_depth:
                case_patterns = True
            continue
        if isinstance(tok, _Redir):
            started = True
            if i < len(tokens) and isinstance(tokens[i], _Word):
                i += 1  # the target: a file name, an fd, a here-doc delimiter or a here-string
            else:
                scan.problem(f"redirection {tok.op} without a target")
            continue
        if tok.fd_var:
            inner = tok.text[1:-1] if tok.text.startswith("{") and tok.text.endswith("}") else tok.text
            _check_name(_Word(inner, tok.raw, expands=tok.expands), scan, "redirection variable")
            if not argv or os.path.basename(argv[0].text) in _WRAPPERS:
                # dash has no {NAME}> form: to it this word is an argument, here the command (or
                # the command a wrapper runs); bash reads a redirection and runs the next word.
                scan.problem(f"{_snippet(tok.raw)}: sh reads a command word here, bash a redirection")
            started = True
            continue
        if not argv and not started and not tok.quoted:
            if tok.text in _RESERVED:
                continue
            if tok.text in ("for", "select"):
                i = _skip_for(tokens, i, scan)
                continue
            if tok.text == "case":
                scan.problem("case statements are not analyzed")
                if i < len(tokens) and isinstance(tokens[i], _Word):
                    i += 1  # the subject
                while i < len(tokens) and tokens[i] == _Op("\n"):
                    i += 1
                if i < len(tokens) and _is_word(tokens[i], "in"):
                    i += 1
                    case_depth += 1
                    case_patterns = True
                continue
            if tok.text == "esac" and case_depth:
                case_depth -= 1
                continue
        if not argv:
            m = _ASSIGNMENT.match(tok.raw)
            if m:
                started = True
                _check_assignment(m.group(1), m.group(2), scan)
                continue
        argv.append(tok)
    finish()


def _skip_for(tokens: list[_Token], i: int, scan: _Scan) -> int:
    """``for NAME [in WORDS]`` (or ``select``): past the loop head; the body is read as commands."""
    name = tokens[i] if i < len(tokens) else None
    if isinstance(name, _Op) and name.text == "(":
        scan.problem("arithmetic for loops are not analyzed")
        return i
    if isinstance(name, _Word):
        if not (name.static and _IDENTIFIER.fullmatch(name.text)) or _sensitive(name.text):
            scan.problem(f"for loop variable {name.raw} is not a plain, harmless name")
        i += 1
    while i < len(tokens) and tokens[i] == _Op("\n"):
        i += 1
    if i < len(tokens) and _is_word(tokens[i], "in"):
        i += 1
        while i < len(tokens) and isinstance(tokens[i], _Word | _Redir):
            i += 1
    return i


def _is_word(tok: _Token, text: str) -> bool:
    """An unquoted word spelled ``text`` (a reserved word only counts unquoted)."""
    return isinstance(tok, _Word) and not tok.quoted and tok.text == text


def _check_assignment(name: str, subscript: str | None, scan: _Scan) -> None:
    if subscript and not re.fullmatch(r"\[[0-9]+\]", subscript):
        scan.problem(f"array subscript {name}{subscript}: bash evaluates it as arithmetic, which can run code")
    if _sensitive(name):
        scan.problem(f"assignment to {name} changes which program runs or what it loads")


def _check_name(word: _Word, scan: _Scan, what: str) -> None:
    """A variable-name operand (read NAME, printf -v NAME, unset NAME...) must be a plain name."""
    if not (word.static and _IDENTIFIER.fullmatch(word.text)):
        scan.problem(f"{what} {word.raw}: a variable name that is not a plain identifier can run code in bash")
    elif _sensitive(word.text):
        scan.problem(f"{what} {word.raw} changes which program runs or what it loads")


# Builtins that run no program and no code. They need no allowlist entry.
_SAFE_BUILTINS = frozenset({
    ":", "true", "false", "cd", "pushd", "popd", "dirs", "pwd", "echo", "printf", "test", "[", "[[",
    "exit", "return", "break", "continue", "shift", "wait", "set", "unset", "export", "readonly",
    "local", "declare", "typeset", "read", "umask", "ulimit", "getopts", "type", "jobs", "times",
})  # fmt: skip

# Builtins that run code we cannot see, or change what a later command word means.
_CODE_BUILTINS = {
    "eval": "runs its arguments as shell code",
    "source": "runs a file's code in this shell",
    ".": "runs a file's code in this shell",
    "alias": "makes a command name run other code",
    "unalias": "changes what command names mean",
    "function": "defines a function: a command name that runs other code",
    "trap": "runs code later, on a signal or at exit",
    "builtin": "runs a builtin by name, past these checks",
    "enable": "can load a builtin from a shared library",
    "let": "evaluates arithmetic, which bash can turn into code",
    "coproc": "runs a command in a coprocess",
    "fc": "re-runs commands from the history (or runs an editor)",
    "bind": "can bind keys to shell commands",
    "complete": "can run commands on completion",
    "compgen": "can run commands",
    "mapfile": "can run a callback (-C)",
    "readarray": "can run a callback (-C)",
    "hash": "can change which file a command name runs (-p)",
    "shopt": "changes how later lines are read",
}

_SAFE_SET_OPTIONS = frozenset("euxvfCETabhmBP")
_SAFE_SET_LONG = frozenset({
    "errexit", "nounset", "xtrace", "verbose", "noglob", "noclobber", "errtrace", "functrace",
    "pipefail", "allexport", "notify", "hashall", "monitor", "braceexpand", "physical", "vi", "emacs",
})  # fmt: skip


def _analyze_argv(words: list[_Word], scan: _Scan, *, in_shell: bool) -> None:
    """One simple command: record its program and unwrap what it runs in turn.

    ``in_shell``: the words are read by a shell (builtins apply); otherwise they are an argv that
    some program will exec directly (``env``, ``xargs``, ``find -exec``...).
    """
    if not words:
        return
    head, args = words[0], words[1:]
    if not head.static:
        scan.problem(f"the command word {head.raw} is only known at run time (variable, glob, brace or ~)")
        return
    name = head.text
    if in_shell and "/" not in name:
        if name in _CODE_BUILTINS:
            scan.problem(f"{_show(words)}: {name} {_CODE_BUILTINS[name]}")
            scan.programs.append(_Program(name, builtin=True))
            if name == "eval" and all(a.static for a in args):
                _analyze_text(" ".join(a.text for a in args), scan)  # best effort, for denylists
            return
        if name == "exec":
            rest = _skip_exec_options(args)
            if rest:
                scan.problem(f"{_show(words)}: exec with a command replaces the shell")
                _analyze_argv(rest, scan, in_shell=False)
            return
        if name == "time" and not head.quoted:  # the bash/zsh/ksh keyword (dash runs /usr/bin/time)
            rest = list(args)
            while rest and rest[0].text in ("-p", "--"):
                rest = rest[1:]
            _analyze_argv(rest, scan, in_shell=True)
            return
        if name == "command":
            _command_builtin(words, scan)
            return
        if name in _SAFE_BUILTINS:
            scan.programs.append(_Program(name, builtin=True))
            _check_builtin(name, args, scan)
            return
    program = _Program(name)
    scan.programs.append(program)
    kinds = {os.path.basename(name)}
    real = scan.realpath_of(name)
    if real:
        kinds.add(os.path.basename(real))
    # Unwrap by the name it is called and by the name of the file it really is (a symlink named
    # `foo` to env is env). A multi-call binary (busybox) runs the applet argv[0] names, though.
    handlers = dict.fromkeys(
        _WRAPPERS[kind]
        for kind in sorted(kinds)
        if kind in _WRAPPERS and not (kind in _MULTICALL and kind != os.path.basename(name))
    )
    for handler in handlers:
        handler(program, args, scan)


def _skip_exec_options(args: list[_Word]) -> list[_Word]:
    i = 0
    while i < len(args) and args[i].text.startswith("-"):
        if args[i].text == "--":
            return args[i + 1 :]
        i += 2 if args[i].text == "-a" else 1
    return args[i:]


def _command_builtin(words: list[_Word], scan: _Scan) -> None:
    args = words[1:]
    i = 0
    while i < len(args) and args[i].text.startswith("-") and args[i].text != "-":
        flags = args[i].text
        i += 1
        if flags == "--":
            break
        if "p" in flags:
            scan.problem(f"{_show(words)}: command -p looks the program up on another PATH")
        if "v" in flags or "V" in flags:
            scan.programs.append(_Program("command", builtin=True))
            return  # a lookup: prints, runs nothing
    scan.programs.append(_Program("command", builtin=True))
    _analyze_argv(args[i:], scan, in_shell=True)


def _after_unknown_words(name: str, args: list[_Word], scan: _Scan) -> None:
    """A word only known at run time may turn out to be an option (``-p``, ``-v``) that makes the
    next word a variable name: that word must then be harmless as a name too."""
    for before, word in itertools.pairwise(args):
        if before.static:
            continue
        if not word.static or "[" in word.text or _sensitive(word.text):
            scan.problem(
                f"{name} {before.raw} {word.raw}: if {before.raw} expands to an option, "
                f"{word.raw} is a variable name that can run code in bash"
            )


def _builtin_options(args: list[_Word], with_value: str) -> tuple[list[tuple[str, _Word]], int]:
    """A builtin's options the way bash's getopt reads them (clusters, ``-pNAME`` or ``-p NAME``):
    the (letter, value) of each option in ``with_value``, and the index of the first operand."""
    found: list[tuple[str, _Word]] = []
    i = 0
    while i < len(args) and args[i].text.startswith("-") and args[i].text != "-":
        word = args[i]
        i += 1
        if word.text == "--":
            break
        for j in range(1, len(word.text)):
            if word.text[j] not in with_value:
                continue
            value = _Word(word.text[j + 1 :], word.text[j + 1 :], expands=word.expands)
            if not value.text:
                value = args[i] if i < len(args) else _Word("", "")
                i += 1
            found.append((word.text[j], value))
            break
    return found, min(i, len(args))


def _check_builtin(name: str, args: list[_Word], scan: _Scan) -> None:
    """Builtins that run nothing can still assign variables; bash evaluates some names as code."""
    if name in ("cd", "pushd", "popd"):
        scan.cwd_changed = True
    elif name == "read":
        options, i = _builtin_options(args, "adinNptu")
        for letter, value in options:
            if letter == "a":
                _check_name(value, scan, "read -a")
        for word in args[i:]:
            _check_name(word, scan, "read")
    elif name == "wait":
        # `wait -p NAME` stores the pid of the job that ended in NAME.
        options, _ = _builtin_options(args, "p")
        for letter, value in options:
            if letter == "p":
                _check_name(value, scan, "wait -p")
        _after_unknown_words(name, args, scan)
    elif name == "printf" and args:
        if args[0].static and args[0].text.startswith("-v"):
            target = args[0].text[2:]
            if target:
                _check_name(_Word(target, target, expands=args[0].expands), scan, "printf -v")
            elif len(args) > 1:
                _check_name(args[1], scan, "printf -v")
        else:
            _after_unknown_words(name, args[:2], scan)
    elif name in ("declare", "typeset", "local", "export", "readonly"):
        for word in args:
            if word.text.startswith(("-", "+")) and word.static:
                if word.text.startswith("-") and name not in ("export", "readonly") and set(word.text) & {"i", "n"}:
                    scan.problem(f"{name} {word.raw}: integer and nameref variables can run code in bash")
                continue
            m = _ASSIGNMENT.match(word.raw)
            if m:
                _check_assignment(m.group(1), m.group(2), scan)
            elif not (word.static and _IDENTIFIER.fullmatch(word.text)):
                scan.problem(f"{name} {word.raw}: a variable name that is not a plain identifier can run code")
    elif name == "unset":
        for word in args:
            if not word.text.startswith("-"):
                _check_name(word, scan, "unset")
    elif name == "getopts" and len(args) >= 2:
        _check_name(args[1], scan, "getopts")
    elif name in ("test", "[", "[["):
        if name != "[[":  # [[ reads its operators before expansion; test and [ after
            _after_unknown_words(name, args, scan)
        for word in args:
            if word.text in ("-v", "-R"):
                scan.problem(f"{name} {word.raw}: the variable name is evaluated, which can run code in bash")
            if name == "[[" and word.text in ("-eq", "-ne", "-lt", "-le", "-gt", "-ge"):
                scan.problem(f"[[ {word.raw} ]] evaluates its operands as arithmetic, which can run code in bash")
    elif name == "set":
        _check_set(args, scan)


def _check_set(args: list[_Word], scan: _Scan) -> None:
    """``set -k`` (assignments anywhere), ``+o interactive-comments`` and the like change how later
    words are read: only options that make a shell stricter or louder pass."""
    i = 0
    while i < len(args):
        word = args[i]
        i += 1
        if word.text == "--" or not word.text.startswith(("-", "+")) or word.text in ("-", "+"):
            return  # positional parameters follow
        if not word.static:
            scan.problem(f"set {word.raw}: options only known at run time")
            return
        for letter in word.text[1:]:
            if letter == "o":
                if i < len(args) and args[i].text not in _SAFE_SET_LONG:
                    scan.problem(f"set {word.raw} {args[i].raw} changes how later lines are read")
                i += 1
            elif letter not in _SAFE_SET_OPTIONS:
                scan.problem(f"set {word.raw} changes how later commands are read or run")


# ---------------------------------------------------------------------------------------------
# Wrappers: programs whose arguments name another program to run


@dataclass(frozen=True, slots=True)
class _Opts:
    """A getopt-style option table. Anything not in it is refused: an option we do not know might
    take a value, and then we would mistake the wrong word for the command."""

    short_flag: str = ""
    short_arg: str = ""  # value: rest of the cluster, or the next word
    short_opt: str = ""  # optional value, only attached (xargs -i{})
    long_flag: frozenset[str] = frozenset()
    long_arg: frozenset[str] = frozenset()
    long_opt: frozenset[str] = frozenset()  # optional value, only with =


def _options(spec: _Opts, args: list[_Word], prog: str, scan: _Scan) -> tuple[list[tuple[str, str]], int] | None:
    """Options as (name, value) and the index of the first operand (stops there, like getopt's '+'),
    or None (a problem is noted) when an option is unknown or a word before the operand is not static."""
    found: list[tuple[str, str]] = []
    i = 0
    while i < len(args):
        word = args[i]
        a = word.text
        if a == "--":
            i += 1
            break
        if not a.startswith("-") or a == "-":
            break
        if not word.static:
            scan.problem(f"{prog}: option {word.raw} is only known at run time")
            return None
        i += 1
        if a.startswith("--"):
            name, eq, value = a[2:].partition("=")
            known = spec.long_flag | spec.long_arg | spec.long_opt
            matches = sorted(o for o in known if o.startswith(name))
            full = name if name in known else matches[0] if len(matches) == 1 else None
            if full is None:
                scan.problem(f"{prog}: unknown option {word.raw}")
                return None
            if full in spec.long_arg and not eq:
                if i >= len(args) or not args[i].static:
                    scan.problem(f"{prog}: the value of {word.raw} is missing or only known at run time")
                    return None
                value = args[i].text
                i += 1
            found.append(("--" + full, value))
            continue
        for j in range(1, len(a)):
            ch = a[j]
            if ch in spec.short_arg:
                value = a[j + 1 :]
                if not value:
                    if i >= len(args) or not args[i].static:
                        scan.problem(f"{prog}: the value of -{ch} is missing or only known at run time")
                        return None
                    value = args[i].text
                    i += 1
                found.append(("-" + ch, value))
                break
            if ch in spec.short_opt:
                found.append(("-" + ch, a[j + 1 :]))
                break
            if ch not in spec.short_flag:
                scan.problem(f"{prog}: unknown option -{ch} in {word.raw}")
                return None
            found.append(("-" + ch, ""))
    return found, i


def _has(opts: list[tuple[str, str]], *names: str) -> bool:
    return any(o in names for o, _ in opts)


def _wrapped(prog: _Program, args: list[_Word], scan: _Scan) -> None:
    """The wrapped command starts at ``args[0]``: its word must be static; it runs via exec."""
    if args:
        _analyze_argv(args, scan, in_shell=False)


def _standard(spec: _Opts, operands_before: int = 0) -> Callable[[_Program, list[_Word], _Scan], None]:
    """A wrapper ``prog [options] [N operands] command [args]``."""

    def handler(prog: _Program, args: list[_Word], scan: _Scan) -> None:
        parsed = _options(spec, args, prog.word, scan)
        if parsed is None:
            return
        opts, i = parsed
        if _has(opts, "--help", "--version", "-h", "-V"):
            return
        for word in args[i : i + operands_before]:
            if not word.static:
                scan.problem(f"{prog.word}: argument {word.raw} is only known at run time")
                return
        _wrapped(prog, args[i + operands_before :], scan)

    return handler


_TIMEOUT = _Opts(
    short_flag="v",
    short_arg="sk",
    long_flag=frozenset({"preserve-status", "foreground", "verbose", "help", "version"}),
    long_arg=frozenset({"signal", "kill-after"}),
)
_HELP = frozenset({"help", "version"})


def _env(prog: _Program, args: list[_Word], scan: _Scan) -> None:
    spec = _Opts(
        short_flag="i0v",
        short_arg="uCS",
        long_flag=frozenset({"ignore-environment", "null", "debug", "list-signal-handling"}) | _HELP,
        long_arg=frozenset({"unset", "chdir", "split-string"}),
        long_opt=frozenset({"block-signal", "default-signal", "ignore-signal"}),
    )
    parsed = _options(spec, args, prog.word, scan)
    if parsed is None:
        return
    opts, i = parsed
    for opt, value in opts:
        if opt in ("-C", "--chdir"):
            scan.cwd_changed = True
        if opt in ("-S", "--split-string"):
            scan.problem(f"{prog.word} {opt} {_snippet(value)}: env splits a string into a command")
            try:
                split = [_Word(s, s) for s in shlex.split(value)]
            except ValueError:
                split = []
            _analyze_argv(split + args[i:], scan, in_shell=False)
            return
    if i < len(args) and args[i].text == "-":
        i += 1
    while i < len(args) and "=" in args[i].text:
        word = args[i]
        if not word.static:
            scan.problem(f"{prog.word}: argument {word.raw} is only known at run time")
            return
        if _sensitive(word.text.partition("=")[0]):
            scan.problem(f"{prog.word} {word.raw} changes which program runs or what it loads")
        i += 1
    _wrapped(prog, args[i:], scan)


def _nice(prog: _Program, args: list[_Word], scan: _Scan) -> None:
    if args and args[0].static and re.fullmatch(r"-[+-]?[0-9]+", args[0].text):
        args = args[1:]  # the old `nice -5 cmd`
    _standard(_Opts(short_arg="n", long_arg=frozenset({"adjustment"}), long_flag=_HELP))(prog, args, scan)


def _chrt(prog: _Program, args: list[_Word], scan: _Scan) -> None:
    spec = _Opts(
        short_flag="bdfiorRampvhV",
        short_arg="TPD",
        long_flag=frozenset({"batch", "deadline", "fifo", "idle", "other", "rr", "reset-on-fork", "all-tasks",
                             "max", "pid", "verbose"}) | _HELP,
        long_arg=frozenset({"sched-runtime", "sched-period", "sched-deadline"}),
    )  # fmt: skip
    parsed = _options(spec, args, prog.word, scan)
    if parsed is None:
        return
    opts, i = parsed
    if _has(opts, "-p", "--pid", "-m", "--max", "-h", "--help", "-V", "--version"):
        return
    if i < len(args) and not args[i].static:
        scan.problem(f"{prog.word}: argument {args[i].raw} is only known at run time")
        return
    if i < len(args) and args[i].text.isdigit():
        i += 1  # the priority
    _wrapped(prog, args[i:], scan)


def _ionice(prog: _Program, args: list[_Word], scan: _Scan) -> None:
    spec = _Opts(
        short_flag="thV",
        short_arg="cnpPu",
        long_flag=frozenset({"ignore"}) | _HELP,
        long_arg=frozenset({"class", "classdata", "pid", "pgid", "uid"}),
    )
    parsed = _options(spec, args, prog.word, scan)
    if parsed is None:
        return
    opts, i = parsed
    if not _has(opts, "-p", "-P", "-u", "--pid", "--pgid", "--uid", "-h", "--help", "-V", "--version"):
        _wrapped(prog, args[i:], scan)


def _flock(prog: _Program, args: list[_Word], scan: _Scan) -> None:
    spec = _Opts(
        short_flag="sexunoFvhV",
        short_arg="wEc",
        long_flag=frozenset({"shared", "exclusive", "unlock", "nonblock", "nb", "close", "no-fork", "verbose"}) | _HELP,
        long_arg=frozenset({"timeout", "wait", "conflict-exit-code", "command"}),
    )
    parsed = _options(spec, args, prog.word, scan)
    if parsed is None:
        return
    opts, i = parsed
    strings = [v for o, v in opts if o in ("-c", "--command")]
    rest = args[i + 1 :]  # after the lock file (or fd)
    if i < len(args) and not args[i].static:
        scan.problem(f"{prog.word}: argument {args[i].raw} is only known at run time")
        return
    if rest and rest[0].text in ("-c", "--command"):
        if len(rest) < 2 or not rest[1].static:
            scan.problem(f"{prog.word}: the -c command is missing or only known at run time")
            return
        strings.append(rest[1].text)
        rest = []
    for s in strings:  # flock runs these with /bin/sh -c
        _analyze_text(s, scan)
    if not strings:
        _wrapped(prog, rest, scan)


def _watch(prog: _Program, args: list[_Word], scan: _Scan) -> None:
    spec = _Opts(
        short_flag="bceCgprtwxhv",
        short_arg="nqs",
        short_opt="d",
        long_flag=frozenset({"beep", "color", "no-color", "errexit", "chgexit", "precise", "no-rerun",
                             "no-title", "no-wrap", "exec"}) | _HELP,
        long_arg=frozenset({"interval", "equexit", "shotsdir"}),
        long_opt=frozenset({"differences"}),
    )  # fmt: skip
    parsed = _options(spec, args, prog.word, scan)
    if parsed is None:
        return
    opts, i = parsed
    if _has(opts, "-x", "--exec"):
        _wrapped(prog, args[i:], scan)
        return
    rest = args[i:]
    if not all(w.static for w in rest):
        scan.problem(f"{_show([*args])}: watch runs a command line that is only known at run time")
        return
    if rest:
        _analyze_text(" ".join(w.text for w in rest), scan)  # watch runs it with sh -c


def _sudo(prog: _Program, args: list[_Word], scan: _Scan) -> None:
    spec = _Opts(
        short_flag="AbEeHiKklnPSsVvh",
        short_arg="CDgprRtTUu",
        long_flag=frozenset({"askpass", "background", "edit", "set-home", "login", "remove-timestamp",
                             "reset-timestamp", "list", "non-interactive", "preserve-groups", "stdin", "shell",
                             "validate", "bell"}) | _HELP,
        long_arg=frozenset({"close-from", "chdir", "group", "host", "prompt", "chroot", "role", "type",
                            "command-timeout", "other-user", "user"}),
        long_opt=frozenset({"preserve-env"}),
    )  # fmt: skip
    parsed = _options(spec, args, prog.word, scan)
    if parsed is None:
        return
    opts, i = parsed
    if _has(opts, "-e", "--edit"):
        scan.problem(f"{_show([*args])}: sudo -e runs an editor")
    if _has(opts, "-s", "--shell", "-i", "--login"):
        scan.problem(f"{prog.word} -s/-i runs a shell that reads its startup files")
    if _has(opts, "-R", "--chroot"):
        scan.problem(f"{prog.word} -R: the command is looked up in another root")
    if _has(opts, "-D", "--chdir"):
        scan.cwd_changed = True
    while i < len(args) and _ASSIGNMENT.match(args[i].raw):
        if not args[i].static:
            scan.problem(f"{prog.word}: argument {args[i].raw} is only known at run time")
            return
        if _sensitive(args[i].text.partition("=")[0]):
            scan.problem(f"{prog.word} {args[i].raw} changes which program runs or what it loads")
        i += 1
    _wrapped(prog, args[i:], scan)


def _doas(prog: _Program, args: list[_Word], scan: _Scan) -> None:
    parsed = _options(_Opts(short_flag="nsL", short_arg="Cu"), args, prog.word, scan)
    if parsed is None:
        return
    opts, i = parsed
    if _has(opts, "-s"):
        scan.problem(f"{prog.word} -s runs a shell")
    if not _has(opts, "-C"):
        _wrapped(prog, args[i:], scan)


def _xargs(prog: _Program, args: list[_Word], scan: _Scan) -> None:
    spec = _Opts(
        short_flag="0oprtx",
        short_arg="adEILnPs",
        short_opt="eil",
        long_flag=frozenset({"null", "open-tty", "interactive", "no-run-if-empty", "verbose", "exit",
                             "show-limits"}) | _HELP,
        long_arg=frozenset({"arg-file", "delimiter", "max-args", "max-procs", "max-chars", "process-slot-var"}),
        long_opt=frozenset({"eof", "replace", "max-lines"}),
    )  # fmt: skip
    parsed = _options(spec, args, prog.word, scan)
    if parsed is None:
        return
    opts, i = parsed
    if _has(opts, "--help", "--version", "--show-limits"):
        return
    rest = args[i:] or [_Word("echo", "echo")]  # no command: xargs runs echo
    replace = [v or "{}" for o, v in opts if o in ("-I", "-i", "--replace")]
    if any(r and r in rest[0].text for r in replace):
        scan.problem(f"{_show([*args])}: xargs would run programs named in its input")
        return
    _wrapped(prog, rest, scan)


def _find(prog: _Program, args: list[_Word], scan: _Scan) -> None:
    for word in args:
        if not word.static:
            scan.problem(f"{prog.word}: argument {word.raw} is only known at run time (it could be -exec)")
            return
    i = 0
    while i < len(args):
        action = args[i].text
        i += 1
        if action not in ("-exec", "-execdir", "-ok", "-okdir"):
            continue
        command: list[_Word] = []
        while i < len(args):
            text = args[i].text
            if text == ";" or (text == "+" and command and command[-1].text == "{}"):
                break
            command.append(args[i])
            i += 1
        i += 1
        if not command:
            continue
        head = command[0].text
        if "{}" in head:
            scan.problem(f"{prog.word} {action} {command[0].raw}: find would run the files it finds")
            continue
        if action in ("-execdir", "-okdir") and "/" in head and not head.startswith("/"):
            scan.problem(f"{prog.word} {action} {head}: a relative path, run from each file's directory")
        _analyze_argv(command, scan, in_shell=False)


def _strace(prog: _Program, args: list[_Word], scan: _Scan) -> None:
    spec = _Opts(
        short_flag="cCdDfFhiknqrtTvVwxyzZ",
        short_arg="abeEIoOpPsSuUX",
        long_flag=frozenset({"follow-forks", "output-separately", "summary-only", "summary", "no-abbrev"}) | _HELP,
        long_arg=frozenset({"output", "trace", "env", "user", "attach", "string-limit", "signal", "status"}),
    )
    parsed = _options(spec, args, prog.word, scan)
    if parsed is None:
        return
    opts, i = parsed
    for opt, value in opts:
        if opt in ("-o", "--output") and value.startswith(("|", "!")):
            scan.problem(f"{prog.word} -o {value}: strace pipes its output to a shell command")
            _analyze_text(value[1:], scan)
        if opt in ("-E", "--env") and _sensitive(value.partition("=")[0]):
            scan.problem(f"{prog.word} -E {value} changes which program runs or what it loads")
    if not _has(opts, "-h", "--help", "-V", "--version"):
        _wrapped(prog, args[i:], scan)


def _multicall(prog: _Program, args: list[_Word], scan: _Scan) -> None:
    """``busybox APPLET args``: the applet is the command (looked up by name, as an approximation)."""
    if not args:
        return
    first = args[0]
    if not first.static:
        scan.problem(f"{prog.word}: applet {first.raw} is only known at run time")
        return
    if first.text.startswith("--coreutils-prog="):
        applet = first.text.partition("=")[2]
        _analyze_argv([_Word(applet, applet), *args[1:]], scan, in_shell=False)
    elif not first.text.startswith("-"):
        _analyze_argv(args, scan, in_shell=False)


_SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh", "ksh93", "mksh", "lksh", "pdksh", "ash", "yash", "posh",
                     "rbash"})  # fmt: skip
_SHELL_LONG_SAFE = frozenset({"--norc", "--noprofile", "--posix", "--restricted", "--verbose", "--noediting",
                              "--help", "--version"})  # fmt: skip


def _shell(prog: _Program, args: list[_Word], scan: _Scan) -> None:
    """``sh -c STRING``: the string is read as shell code too. Anything else (a script, stdin, -i,
    --rcfile, a login shell) runs code we cannot see: the shell itself must then be allowed."""
    command_mode = False
    reads_files = False
    i = 0
    while i < len(args):
        word = args[i]
        a = word.text
        if not word.static:
            if a.startswith(("-", "+")):
                scan.problem(f"{prog.word}: option {word.raw} is only known at run time")
                return
            break
        if a in ("--", "-"):
            i += 1
            break
        if a.startswith("--"):
            if a in ("--rcfile", "--init-file"):
                i += 1
            reads_files = reads_files or a not in _SHELL_LONG_SAFE
            i += 1
            continue
        if not a.startswith(("-", "+")) or len(a) == 1:
            break
        i += 1
        for ch in a[1:]:
            if ch == "c" and a[0] == "-":
                command_mode = True
            elif ch in "oO":
                i += 1  # the option's name
            elif ch in "il":
                reads_files = True
    if not command_mode:
        return
    if i >= len(args):
        return
    string = args[i]
    if not string.static:
        scan.problem(f"{prog.word} -c {string.raw}: the command string is only known at run time")
        return
    prog.shell_c = not reads_files
    _analyze_text(string.text, scan)


_MULTICALL = frozenset({"busybox", "toybox", "coreutils"})

_WRAPPERS: dict[str, Callable[[_Program, list[_Word], _Scan], None]] = {
    "env": _env,
    "nohup": _standard(_Opts(long_flag=_HELP)),
    "nice": _nice,
    "timeout": _standard(_TIMEOUT, operands_before=1),
    "stdbuf": _standard(_Opts(short_arg="ioe", long_arg=frozenset({"input", "output", "error"}), long_flag=_HELP)),
    "setsid": _standard(_Opts(short_flag="cfwhV", long_flag=frozenset({"ctty", "fork", "wait"}) | _HELP)),
    "time": _standard(
        _Opts(
            short_flag="apqvV",
            short_arg="fo",
            long_flag=frozenset({"append", "portability", "quiet", "verbose"}) | _HELP,
            long_arg=frozenset({"format", "output"}),
        )
    ),
    "chrt": _chrt,
    "ionice": _ionice,
    "flock": _flock,
    "watch": _watch,
    "sudo": _sudo,
    "doas": _doas,
    "xargs": _xargs,
    "find": _find,
    "strace": _strace,
    **dict.fromkeys(_MULTICALL, _multicall),
    **dict.fromkeys(_SHELLS, _shell),
}


# ---------------------------------------------------------------------------------------------
# The policy


def _executable(path: str) -> str | None:
    if "\0" in path:
        return None
    if os.path.isfile(path) and os.access(path, os.X_OK):
        return os.path.realpath(path)
    return None


def _lookup(word: str, path: str, cwd: str) -> str | None:
    """The real path of the file ``word`` runs: a name is searched on ``path`` (relative entries
    against ``cwd``, as the shell does), a name with a slash is taken as is (relative to ``cwd``)."""
    if not word or "\0" in word:
        return None
    if "/" in word:
        return _executable(os.path.join(cwd, word))
    for entry in path.split(os.pathsep):
        found = _executable(os.path.join(cwd, entry or ".", word))
        if found:
            return found
    return None


def _system_path() -> str:
    try:
        return os.confstr("CS_PATH") or "/bin:/usr/bin"
    except (ValueError, OSError, AttributeError):
        return "/bin:/usr/bin"


def _interactive_problems(text: str) -> list[str]:
    """What an interactive shell (a terminal, readline) does to input before it is a command line."""
    found: list[str] = []
    control = sorted({c for c in text if c not in "\n " and not c.isprintable()})
    if control:
        shown = ", ".join(f"U+{ord(c):04X}" for c in control)
        found.append(f"control characters ({shown}): line editing and completion change what a terminal runs")
    if re.search(r"!(?![\s=(]|$)", text):
        found.append("history expansion (!...) re-runs earlier commands in an interactive shell")
    if re.search(r"(?m)^[ \t]*\^", text):
        found.append("^old^new re-runs the previous command in an interactive shell")
    stripped = text[:-1] if text.endswith("\n") else text
    if (len(stripped) - len(stripped.rstrip("\\"))) % 2 == 1:
        found.append("the line continues (trailing \\) into a later write, which is checked on its own")
    return found


@dataclass(frozen=True)
class CommandPolicy:
    """An agent's command allowlist and denylist.

    ``allow``: program names or paths the agent may run; ``None`` allows everything. Each entry is
    resolved once, here, the way a command word is (a bare name: looked up on ``path``, then its
    real path; a path: its real path), and a program is allowed iff its real path is one of these.
    An entry that is not found is kept as a bare name, which no real path ever equals: it allows
    nothing (until the policy is built again on a PATH where it exists).

    ``deny``: refused programs, resolved the same way (a bare entry also refuses any program of that
    name). A denylist alone is always bypassable (copy the binary under another name, or use an
    interpreter that is not denied): it is advisory, a guard against mistakes, not against intent.
    An allowlist is not a sandbox either: see the module docstring.

    ``path``: the PATH the session will run with, used to resolve names.
    """

    allow: tuple[str, ...] | None = None
    deny: tuple[str, ...] = ()
    path: str = os.defpath
    _allowed: frozenset[str] = field(init=False, repr=False, compare=False, default=frozenset())
    _allowed_applets: dict[str, set[str]] = field(init=False, repr=False, compare=False, default_factory=dict)
    _denied: frozenset[str] = field(init=False, repr=False, compare=False, default=frozenset())
    _denied_applets: dict[str, set[str]] = field(init=False, repr=False, compare=False, default_factory=dict)
    _denied_names: frozenset[str] = field(init=False, repr=False, compare=False, default=frozenset())
    _shells: frozenset[str] = field(init=False, repr=False, compare=False, default=frozenset())

    def __post_init__(self) -> None:
        try:
            cwd = os.getcwd()
        except OSError:
            cwd = "/"
        allowed, allowed_applets = self._resolve_entries(self.allow or (), cwd)
        denied, denied_applets = self._resolve_entries(self.deny, cwd)
        object.__setattr__(self, "_allowed", allowed)
        object.__setattr__(self, "_allowed_applets", allowed_applets)
        object.__setattr__(self, "_denied", denied)
        object.__setattr__(self, "_denied_applets", denied_applets)
        object.__setattr__(self, "_denied_names", frozenset(e for e in self.deny if "/" not in e))
        # Shells trusted to run a checked -c string without being allowed themselves: only those in
        # the system's own directories, never whatever a session PATH (maybe writable) finds first.
        system = _system_path()
        shells = {found for name in _SHELLS if (found := _lookup(name, system, "/"))}
        object.__setattr__(self, "_shells", frozenset(shells))

    def _resolve_entries(self, entries: Sequence[str], cwd: str) -> tuple[frozenset[str], dict[str, set[str]]]:
        reals: set[str] = set()
        applets: dict[str, set[str]] = {}
        for entry in entries:
            real = _lookup(entry, self.path, cwd)
            if real is None:
                # Kept as written: a bare name never equals a real path; a missing absolute path
                # matches only if that very file appears later.
                reals.add(os.path.normpath(entry) if entry.startswith("/") else entry)
                continue
            reals.add(real)
            if os.path.basename(real) in _MULTICALL:
                # busybox & co.: every applet has the same real path; argv[0] picks the applet.
                applets.setdefault(real, set()).add(os.path.basename(entry))
        return frozenset(reals), applets

    # -- public ---------------------------------------------------------------------------------

    def check(self, command: str | Sequence[str], cwd: Path | None = None) -> list[str]:
        """Refuse ``command`` unless every program it would run passes the policy.

        A ``str`` is shell text (it will run through ``/bin/sh -c``); a sequence is an argv that is
        exec'd directly. Returns the real paths of the programs it will run, in order (shell
        builtins, which run no program, are not listed). Raises :class:`UnanalyzableCommand` (under
        an allowlist) when the text hides what it runs, :class:`CommandDenied` when a program is
        refused or does not exist.
        """
        base = str(cwd) if cwd is not None else os.getcwd()
        scan = self._scan(base, interactive=False)
        if isinstance(command, str):
            _analyze_text(command, scan)
        else:
            argv = list(command)
            if not argv:
                raise CommandDenied("the command is empty", hints=self._hints())
            _analyze_argv([_Word(a, a) for a in argv], scan, in_shell=False)
        return self._decide(scan)

    def check_input(self, data: str, cwd: Path | None = None) -> None:
        """Check text written to an interactive shell's stdin: each line is a command line.

        Same rules as :meth:`check`, plus what a terminal does to input: carriage returns end
        lines, a trailing partial line is checked as it stands (the words it has must pass already),
        and under an allowlist control characters (line editing, completion), history expansion,
        ``^old^new`` and a line continued into a later write are refused. The shell's working
        directory is not known here (it may have run ``cd``), so relative program paths are refused.
        """
        text = data.replace("\r\n", "\n").replace("\r", "\n")
        base = str(cwd) if cwd is not None else os.getcwd()
        scan = self._scan(base, interactive=True)
        if self.allow is not None:
            for found in _interactive_problems(text):
                scan.problem(found)
        _analyze_text(text, scan)
        self._decide(scan)

    # -- internals ------------------------------------------------------------------------------

    def _scan(self, base: str, *, interactive: bool) -> _Scan:
        # One lookup per distinct word and check: a line of 20,000 `| cat` resolves cat once.
        @functools.cache
        def realpath_of(word: str) -> str | None:
            return _lookup(word, self.path, base)

        return _Scan(realpath_of=realpath_of, interactive=interactive)

    def _is_allowed(self, word: str, real: str) -> bool:
        if real not in self._allowed:
            return False
        applets = self._allowed_applets.get(real)
        return applets is None or os.path.basename(word) in applets

    def _is_denied(self, word: str, real: str) -> bool:
        if os.path.basename(word) in self._denied_names or os.path.basename(real) in self._denied_names:
            return True
        if real not in self._denied:
            return False
        applets = self._denied_applets.get(real)
        return applets is None or os.path.basename(word) in applets

    def _hints(self) -> dict[str, str]:
        hints: dict[str, str] = {}
        if self.allow is not None:
            hints["allowed"] = "Allowed here: " + (", ".join(self.allow) or "nothing") + " (and shell builtins)."
        if self.deny:
            hints["denied"] = "Denied here: " + ", ".join(self.deny) + "."
        return hints

    def _decide(self, scan: _Scan) -> list[str]:
        # Each distinct reason once (dicts keep their order): a refusal names a program once,
        # however often the line runs it.
        problems = dict.fromkeys(scan.problems)
        cwd_unknown = scan.cwd_changed or scan.interactive
        relative_path = any(not os.path.isabs(entry) for entry in self.path.split(os.pathsep))
        refusals: dict[str, None] = {}
        resolved: dict[str, None] = {}
        for prog in scan.programs:
            word = prog.word
            if prog.builtin:
                if word in self._denied_names:
                    refusals[f"{word} (a shell builtin) is denied"] = None
                continue
            relative = ("/" in word and not word.startswith("/")) or ("/" not in word and relative_path)
            if cwd_unknown and relative:
                why = "the shell may have changed directory" if scan.cwd_changed else "the shell's directory is unknown"
                problems[f"{_snippet(word)}: a relative program path, and {why}"] = None
            real = scan.realpath_of(word)
            if real is None:
                if self.allow is not None:
                    refusals[f"{_snippet(word)}: not found"] = None
                continue
            if self._is_denied(word, real):
                refusals[f"{_snippet(word)} ({real}) is denied"] = None
                continue
            exempt = prog.shell_c and real in self._shells
            if self.allow is not None and not exempt and not self._is_allowed(word, real):
                refusals[f"{_snippet(word)} ({real}) is not allowed"] = None
                continue
            resolved[real] = None
        return self._verdict(list(problems), list(refusals), list(resolved))

    def _verdict(self, problems: list[str], refused: list[str], resolved: list[str]) -> list[str]:
        if self.allow is not None and problems:
            message = "cannot check this command before it runs: " + "; ".join(problems)
            if refused:
                message += "; refused: " + "; ".join(refused)
            raise UnanalyzableCommand(message, hints=self._hints(), problems=problems, refused=refused)
        if refused:
            raise CommandDenied("command refused: " + "; ".join(refused), hints=self._hints(), refused=refused)
        return resolved


def programs_in(command: str) -> list[str]:
    """The command words a shell would run for ``command``, in order, after quote removal.

    Wrapped commands are included after their wrapper (``env rm x`` -> ``["env", "rm"]``,
    ``sh -c 'ls | wc'`` -> ``["sh", "ls", "wc"]``), and so are shell builtins. Raises
    :class:`UnanalyzableCommand` when the text hides what it runs (the same rules as an allowlist).
    """
    scan = _Scan(realpath_of=lambda _word: None)
    _analyze_text(command, scan)
    if scan.problems:
        raise UnanalyzableCommand("cannot tell what this command runs: " + "; ".join(scan.problems))
    return [p.word for p in scan.programs]
