"""From tokens to commands: every command word a line runs, the builtins that run code we cannot
see, and the assignments and variables that change what runs."""

from __future__ import annotations

import itertools
import os
import re
from collections.abc import Sequence

from procpilot.shell import wrappers
from procpilot.shell.lexer import (
    ASSIGNMENT,
    MAX_DEPTH,
    Lexed,
    Op,
    Program,
    Redir,
    Scan,
    Token,
    Word,
    lex,
    show,
    snippet,
)
from procpilot.shell.variables import sensitive_variable

# ---------------------------------------------------------------------------------------------
# Commands

_RESERVED = frozenset({"if", "then", "else", "elif", "fi", "do", "done", "while", "until", "{", "}", "!"})
_CASE_ENDS = frozenset({";;", ";&", ";;&"})
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

_sensitive = sensitive_variable


def analyze_text(text: str, scan: Scan) -> None:
    """Read shell text: every command it runs goes to ``scan.programs``."""
    scan.depth += 1
    try:
        if scan.depth > MAX_DEPTH:
            scan.problem("shell code nested too deeply to check")
            return
        lexed = scan.lex(text) if scan.lex is not None else lex(text)
        for problem in lexed.problems:  # the lexer's findings first, as when it wrote them itself
            scan.problem(problem)
        _parse(lexed.tokens, scan)
        for sub in lexed.nested:
            _parse(sub, scan)
    finally:
        scan.depth -= 1


def _parse(tokens: Sequence[Token], scan: Scan) -> None:
    """Split tokens into simple commands (skipping reserved words, assignments and redirections)."""
    argv: list[Word] = []
    started = False  # an assignment or redirection belongs to the current command already
    case_depth = 0
    case_patterns = False
    i = 0

    def finish() -> None:
        nonlocal argv, started
        if argv:
            analyze_argv(argv, scan, in_shell=True)
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
            if isinstance(tok, Word) or (isinstance(tok, Op) and tok.text in ("|", "(", "\n")):
                continue
            case_patterns = False
            if isinstance(tok, Op) and tok.text == ")":
                continue
        if isinstance(tok, Op):
            if tok.text == "(" and (argv or started):
                if len(argv) == 1 and i < len(tokens) and tokens[i] == Op(")"):
                    scan.problem(f"function definition {argv[0].raw}() makes a command name run other code")
                    argv = []
                    i += 1
                else:
                    scan.problem(f"unexpected ( after {show(argv) or 'an assignment'} (array, extglob or function)")
            finish()
            if tok.text in _CASE_ENDS and case_depth:
                case_patterns = True
            continue
        if isinstance(tok, Redir):
            started = True
            if i < len(tokens) and isinstance(tokens[i], Word):
                i += 1  # the target: a file name, an fd, a here-doc delimiter or a here-string
            else:
                scan.problem(f"redirection {tok.op} without a target")
            continue
        if tok.fd_var:
            inner = tok.text[1:-1] if tok.text.startswith("{") and tok.text.endswith("}") else tok.text
            _check_name(Word(inner, tok.raw, expands=tok.expands), scan, "redirection variable")
            if not argv or os.path.basename(argv[0].text) in wrappers.WRAPPERS:
                # dash has no {NAME}> form: to it this word is an argument, here the command (or
                # the command a wrapper runs); bash reads a redirection and runs the next word.
                scan.problem(f"{snippet(tok.raw)}: sh reads a command word here, bash a redirection")
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
                if i < len(tokens) and isinstance(tokens[i], Word):
                    i += 1  # the subject
                while i < len(tokens) and tokens[i] == Op("\n"):
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
            m = ASSIGNMENT.match(tok.raw)
            if m:
                started = True
                _check_assignment(m.group(1), m.group(2), scan)
                continue
        argv.append(tok)
    finish()


def _skip_for(tokens: Sequence[Token], i: int, scan: Scan) -> int:
    """``for NAME [in WORDS]`` (or ``select``): past the loop head; the body is read as commands."""
    name = tokens[i] if i < len(tokens) else None
    if isinstance(name, Op) and name.text == "(":
        scan.problem("arithmetic for loops are not analyzed")
        return i
    if isinstance(name, Word):
        if not (name.static and _IDENTIFIER.fullmatch(name.text)) or _sensitive(name.text):
            scan.problem(f"for loop variable {name.raw} is not a plain, harmless name")
        i += 1
    while i < len(tokens) and tokens[i] == Op("\n"):
        i += 1
    if i < len(tokens) and _is_word(tokens[i], "in"):
        i += 1
        while i < len(tokens) and isinstance(tokens[i], Word | Redir):
            i += 1
    return i


def _is_word(tok: Token, text: str) -> bool:
    """An unquoted word spelled ``text`` (a reserved word only counts unquoted)."""
    return isinstance(tok, Word) and not tok.quoted and tok.text == text


def _check_assignment(name: str, subscript: str | None, scan: Scan) -> None:
    if subscript and not re.fullmatch(r"\[[0-9]+\]", subscript):
        scan.problem(f"array subscript {name}{subscript}: bash evaluates it as arithmetic, which can run code")
    if _sensitive(name):
        scan.problem(f"assignment to {name} changes which program runs or what it loads")


def _check_name(word: Word, scan: Scan, what: str) -> None:
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


def analyze_argv(words: list[Word], scan: Scan, *, in_shell: bool) -> None:
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
            scan.problem(f"{show(words)}: {name} {_CODE_BUILTINS[name]}")
            scan.programs.append(Program(name, builtin=True))
            if name == "eval" and all(a.static for a in args):
                analyze_text(" ".join(a.text for a in args), scan)  # best effort, for denylists
            return
        if name == "exec":
            rest = _skip_exec_options(args)
            if rest:
                scan.problem(f"{show(words)}: exec with a command replaces the shell")
                analyze_argv(rest, scan, in_shell=False)
            return
        if name == "time" and not head.quoted:  # the bash/zsh/ksh keyword (dash runs /usr/bin/time)
            rest = list(args)
            while rest and rest[0].text in ("-p", "--"):
                rest = rest[1:]
            analyze_argv(rest, scan, in_shell=True)
            return
        if name == "command":
            _command_builtin(words, scan)
            return
        if name in _SAFE_BUILTINS:
            scan.programs.append(Program(name, builtin=True))
            _check_builtin(name, args, scan)
            return
    program = Program(name, args=tuple(a.text if a.static else None for a in args))
    scan.programs.append(program)
    kinds = {os.path.basename(name)}
    real = scan.realpath_of(name)
    if real:
        kinds.add(os.path.basename(real))
    # Unwrap by the name it is called and by the name of the file it really is (a symlink named
    # `foo` to env is env). A multi-call binary (busybox) runs the applet argv[0] names, though.
    handlers = dict.fromkeys(
        wrappers.WRAPPERS[kind]
        for kind in sorted(kinds)
        if kind in wrappers.WRAPPERS and not (kind in wrappers.MULTICALL and kind != os.path.basename(name))
    )
    for handler in handlers:
        handler(program, args, scan, _READER)


def _exec_argv(words: list[Word], scan: Scan) -> None:
    analyze_argv(words, scan, in_shell=False)


# What the wrappers hand the commands they run back to (they are called from here, never import this).
_READER = wrappers.Reader(argv=_exec_argv, text=analyze_text)


def _skip_exec_options(args: list[Word]) -> list[Word]:
    i = 0
    while i < len(args) and args[i].text.startswith("-"):
        if args[i].text == "--":
            return args[i + 1 :]
        i += 2 if args[i].text == "-a" else 1
    return args[i:]


def _command_builtin(words: list[Word], scan: Scan) -> None:
    args = words[1:]
    i = 0
    while i < len(args) and args[i].text.startswith("-") and args[i].text != "-":
        flags = args[i].text
        i += 1
        if flags == "--":
            break
        if "p" in flags:
            scan.problem(f"{show(words)}: command -p looks the program up on another PATH")
        if "v" in flags or "V" in flags:
            scan.programs.append(Program("command", builtin=True))
            return  # a lookup: prints, runs nothing
    scan.programs.append(Program("command", builtin=True))
    analyze_argv(args[i:], scan, in_shell=True)


def _after_unknown_words(name: str, args: list[Word], scan: Scan) -> None:
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


def _builtin_options(args: list[Word], with_value: str) -> tuple[list[tuple[str, Word]], int]:
    """A builtin's options the way bash's getopt reads them (clusters, ``-pNAME`` or ``-p NAME``):
    the (letter, value) of each option in ``with_value``, and the index of the first operand."""
    found: list[tuple[str, Word]] = []
    i = 0
    while i < len(args) and args[i].text.startswith("-") and args[i].text != "-":
        word = args[i]
        i += 1
        if word.text == "--":
            break
        for j in range(1, len(word.text)):
            if word.text[j] not in with_value:
                continue
            value = Word(word.text[j + 1 :], word.text[j + 1 :], expands=word.expands)
            if not value.text:
                value = args[i] if i < len(args) else Word("", "")
                i += 1
            found.append((word.text[j], value))
            break
    return found, min(i, len(args))


def _check_builtin(name: str, args: list[Word], scan: Scan) -> None:
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
                _check_name(Word(target, target, expands=args[0].expands), scan, "printf -v")
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
            m = ASSIGNMENT.match(word.raw)
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


def _check_set(args: list[Word], scan: Scan) -> None:
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


# Reserved words that run the commands after them under a condition or a loop.
_CONTROL = frozenset({"if", "while", "until", "for", "select", "case"})


def control_flow_in(command: str | Lexed) -> bool:
    """True when ``command``'s own top level (or its lexing, already made) runs commands under
    shell control flow (``if``, ``while``, ``until``, ``for``, ``select``, ``case``). Only a
    reserved word in command position counts: ``echo if`` or a quoted ``'while'`` is an argument."""
    at_start, target = True, False
    for tok in (lex(command) if isinstance(command, str) else command).tokens:
        if isinstance(tok, Op):
            at_start, target = True, False
        elif isinstance(tok, Redir):
            target = True  # the next word is the redirection's file, not a command
        elif target:
            target = False
        elif at_start and not tok.quoted and tok.text in _CONTROL:
            return True
        else:
            # After `then`, `do`, `!`...: still where a command starts.
            at_start = not tok.quoted and tok.text in _RESERVED
    return False


def commands_in(command: str) -> list[tuple[str, tuple[str | None, ...]]]:
    """Best effort: each program ``command`` runs with its arguments (None where an argument is
    known only at run time), wrapped ones included (``sh -c 'cat x | python3 y.py'`` gives
    ``python3`` with ``("y.py",)``). What the text hides is left out rather than refused: this
    reading serves checks that help an agent, not a policy that must be sure."""
    scan = Scan(realpath_of=lambda _word: None)
    analyze_text(command, scan)
    return [(p.word, p.args) for p in scan.programs if not p.builtin]
