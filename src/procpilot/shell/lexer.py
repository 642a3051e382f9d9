"""Reading shell text: words (with their quoting and expansions), operators, redirections,
here-documents and substitutions, the way ``sh`` and ``bash`` would, in one pass; and the scan
that collects what a command line runs."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from procpilot.errors import InvalidArgument
from procpilot.shell.first import MAX_SUBSTITUTION_DEPTH, nested_too_deep

# ---------------------------------------------------------------------------------------------
# Tokens

# A shell assignment word (NAME=, NAME+=, NAME[i]=): group 1 the name, group 2 the subscript.
ASSIGNMENT = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)(\[[^\]]*\])?\+?=")
MAX_DEPTH = 12  # sh -c 'sh -c "..."' nesting; deeper is refused rather than followed forever


@dataclass(slots=True)
class Word:
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
class Op:
    text: str


@dataclass(frozen=True, slots=True)
class Redir:
    op: str


Token = Word | Op | Redir


@dataclass(slots=True)
class Program:
    word: str  # the command word as the shell (or exec) will look it up
    builtin: bool = False  # a shell builtin that runs no program
    shell_c: bool = False  # a shell running a -c string that was checked here
    # Its arguments after quote removal; None where one is known only at run time ($x, a glob).
    args: tuple[str | None, ...] = ()


@dataclass(slots=True)
class Scan:
    """What reading one command found: its programs in order, and what could not be checked."""

    realpath_of: Callable[[str], str | None]
    interactive: bool = False
    programs: list[Program] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    cwd_changed: bool = False  # cd / pushd / env -C ...: relative paths no longer mean what they did
    depth: int = 0
    substitutions: int = 0  # $( ) open around the lexer now
    # Where each text read in this scan is lexed: None lexes afresh; a call's ShellText
    # (shell/reading.py) hands out the lexing it already made, so no text is lexed twice per call.
    lex: Callable[[str], Lexed] | None = None

    def enter_substitution(self) -> None:
        """One more $( ) deep. Past MAX_SUBSTITUTION_DEPTH the text is malformed input, not a command
        to judge: a typed error long before Python's recursion limit."""
        self.substitutions += 1
        if self.substitutions > MAX_SUBSTITUTION_DEPTH:
            self.substitutions -= 1
            raise nested_too_deep()

    def problem(self, message: str) -> None:
        message = "".join(c if c.isprintable() or c == " " else repr(c)[1:-1] for c in message)
        if message not in self.problems:
            self.problems.append(message)


def snippet(text: str, limit: int = 60) -> str:
    """``text`` for a message: control characters escaped (``ls\\r`` shows as such), long text cut."""
    text = "".join(c if c.isprintable() or c == " " else repr(c)[1:-1] for c in text)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def show(words: Sequence[Word]) -> str:
    return snippet(" ".join(w.raw for w in words), 80)


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


class Lexer:
    """Splits shell text into words, operators and redirections, noting what runs at expansion time.

    Command substitutions are lexed recursively (their tokens go to ``nested``, to be read as
    commands too); here-doc bodies are skipped, and scanned for expansions when the delimiter is
    unquoted (such a body is expanded like a double-quoted string).
    """

    def __init__(self, text: str, scan: Scan, nested: list[list[Token]], pos: int = 0, closing: bool = False) -> None:
        self.text = text
        self.n = len(text)
        self.pos = pos
        self.scan = scan
        self.nested = nested
        self.closing = closing  # inside $( ... ): stop at the unmatched )
        self.closed = False
        self.depth = 0
        self.tokens: list[Token] = []
        self.pending: list[tuple[str, bool, bool]] = []  # here-docs: delimiter, strip tabs, quoted
        self.want_delimiter: bool | None = None

    def run(self) -> list[Token]:
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
                self.tokens.append(Op("\n"))
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
            self.tokens.append(Word(raw, raw, expands=True))
        else:
            op = next(o for o in _REDIRECTIONS if t.startswith(o, p))
            self.tokens.append(Redir(op))
            self.pos = p + len(op)
            if op in ("<<", "<<-"):
                self.want_delimiter = op == "<<-"
        return False

    def _emit_op(self, op: str, length: int) -> None:
        self.tokens.append(Op(op))
        self.pos += length

    # -- words ----------------------------------------------------------------------------------

    def _word(self) -> None:
        t = self.text
        start = self.pos
        out: list[str] = []
        shape: list[str] = []
        w = Word("", "")
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
                    self.scan.problem(f"unterminated ' quote in {snippet(t[start:])}")
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

    def _double_quoted(self, out: list[str], w: Word) -> None:
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
        self.scan.problem(f'unterminated " quote in {snippet(t[start:])}')

    def _dollar(self, out: list[str], w: Word, *, in_dq: bool) -> bool:
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
                self.scan.problem(f"unterminated $[ in {snippet(t[p:])}")
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
                        self.scan.problem(f"{snippet(t[p:])}: sh and bash split $'...\\'...' differently")
                    i += 1
                i += 1
            if i >= self.n:
                self.scan.problem(f"unterminated $' quote in {snippet(t[p:])}")
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
            self.scan.problem(f"arithmetic {snippet(whole)} uses variables, which bash can turn into code")

    def _substitution(self, start: int, what: str) -> None:
        """``pos`` is just after ``$(`` / ``<(`` / ``>(``: lex the code up to its closing paren."""
        self.scan.enter_substitution()
        try:
            sub = Lexer(self.text, self.scan, self.nested, self.pos, closing=True)
            self.nested.append(sub.run())
        finally:
            self.scan.substitutions -= 1
        self.pos = sub.pos
        self.scan.problem(f"{what} {snippet(self.text[start : self.pos])} runs a command we cannot check")

    def _backtick(self, out: list[str], w: Word, *, in_dq: bool) -> None:
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
            self.scan.problem(f"unterminated ` in {snippet(t[p:])}")
        self.pos = min(i + 1, self.n)
        self.nested.append(Lexer("".join(code), self.scan, self.nested).run())
        self.scan.problem(f"command substitution {snippet(t[p : self.pos])} runs a command we cannot check")
        out.append(t[p : self.pos])
        w.expands = True

    def _parameter(self, start: int, *, in_dq: bool) -> None:
        """``pos`` is just after ``${``: find the closing brace, then judge the expansion's form."""
        t = self.text
        scratch = Word("", "")
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
        self.scan.problem(f"unterminated ${{ in {snippet(t[start:])}")

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
            self.scan.problem(f"parameter expansion {snippet(whole)} can run code or is too complex to check")

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
        scratch = Word("", "")
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


@dataclass(frozen=True, slots=True)
class Lexed:
    """One text lexed: its tokens, those of its substitutions, and what the lexer could not
    check. A pure function of the text (the lexer starts with no substitution open and records
    only into a scan of its own), so one lexing serves every scan that reads the text."""

    tokens: tuple[Token, ...]
    nested: tuple[tuple[Token, ...], ...]
    problems: tuple[str, ...]


def lex(text: str) -> Lexed:
    """Lex ``text`` once. Raises InvalidArgument for $( ) nested past MAX_SUBSTITUTION_DEPTH."""
    scan = Scan(realpath_of=lambda _word: None)
    nested: list[list[Token]] = []
    tokens = Lexer(text, scan, nested).run()
    return Lexed(tuple(tokens), tuple(tuple(sub) for sub in nested), tuple(scan.problems))


def simple_commands(text: str | Lexed) -> list[list[str]]:
    """The words of each simple command in ``text`` (or in its lexing, already made), after quote
    removal, in order: operators
    (``;`` ``&&`` ``||`` ``|`` ``&`` newline, parentheses) separate commands, and redirections are
    dropped with their targets (``make > log`` is ``make``). Substitutions are not entered; a word
    that expands keeps its text as written. For naming and display, not for deciding anything:
    text the shell would refuse (an unfinished quote) still gives its words, as typed."""
    if isinstance(text, str):
        try:
            text = lex(text)
        except InvalidArgument:  # nested past the bound: there is nothing sensible to show
            return []
    tokens = text.tokens
    as_typed = bool(text.problems)  # the agent may have quoted for another layer: show it as sent
    commands: list[list[str]] = [[]]
    redirected = False
    for tok in tokens:
        if isinstance(tok, Redir):
            redirected = True
        elif isinstance(tok, Op):
            commands.append([])
            redirected = False
        elif redirected:
            redirected = False  # the redirection's target, not an argument
        elif not tok.fd_var:
            commands[-1].append(tok.raw if as_typed else tok.text)
    return [words for words in commands if words]
