"""Script preflight: refuse to run a Python or Node script that holds shell syntax.

A common agent mistake is to write a script as if it were shell text: ``payload = $DM_JSON`` in
a ``.py`` file, expecting the shell to fill the value in. The interpreter never expands it, so the
run fails with a confusing SyntaxError (or, in JavaScript, quietly reads an undefined name). Before
``python x.py`` / ``node x.js`` runs (directly, in a pipeline, behind ``env``/``timeout``, or inside
``sh -c``), the script is read, and so are Node's preload modules (``-r``/``--require``/``--import``,
even beside ``-e``). Any ``$NAME``, ``${...}`` or ``$(...)`` outside strings and comments, or a
``$NAME`` anywhere on the script's first line of code (``NODE "$TMPDIR/x.json"``: a shell line saved
as a script), is refused with OpenClaw's words ("exec preflight: detected likely shell variable
injection ($DM_JSON) in python script: bad.py:3.").

A script the preflight cannot read because it reaches the interpreter some other way (``cat x.py |
python``, ``python <(cat x.py)``) fails closed: "exec preflight: complex interpreter invocation
detected". Only files inside the working directory are read (a script elsewhere runs unchecked, as
in OpenClaw): the preflight never becomes a way to probe files outside it.

Reading the command line is ``procpilot.shell``'s job (the spec's ``ShellText``, lexed once per
call whoever reads it first); this module only reads the scripts. It is a help, not a guard: what
cannot be read (a missing file, a script named by a variable) is left for the interpreter to report.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path

from procpilot.errors import ScriptHasShellSyntax, ScriptNotCheckable
from procpilot.shell import control_flow_in
from procpilot.shell.reading import ShellText

__all__ = ["check_scripts", "might_run_scripts", "shell_syntax_in"]

_MAX_SCRIPT_BYTES = 512 << 10  # read at most this much of a script (OpenClaw's bound)
_MAX_SCRIPTS = 4  # scripts read per command (a command line naming more is unusual)
_PYTHON = re.compile(r"python(?:[23](?:\.\d+)?)?")
_NODE = frozenset({"node", "nodejs"})
# Options that take the next word as their value, so it is not the script.
_PYTHON_VALUE_OPTIONS = frozenset({"-W", "-X", "-Q"})
_NODE_VALUE_OPTIONS = frozenset({"--loader", "--experimental-loader", "--env-file"})
# Node options whose value is a module loaded before the entry script: read like the script.
_NODE_PRELOADS = frozenset({"-r", "--require", "--import"})
# Options after which no script file follows (the code is inline, or a module is run).
_PYTHON_NO_FILE = frozenset({"-c", "-m"})
_NODE_NO_FILE = frozenset({"-e", "--eval", "-p", "--print"})
# Options that only print something (or, node -c, check syntax): the interpreter runs no script.
_PYTHON_INFO_ONLY = frozenset({"-V", "--version", "-h", "--help"})
_NODE_INFO_ONLY = frozenset({"-v", "--version", "-h", "--help", "-c", "--check"})
_SCRIPT_HINT = re.compile(r"\.(?:py|js|mjs|cjs)$")
_SHELLS = frozenset({"sh", "bash", "dash", "ash", "ksh", "zsh"})
_COMMAND_MODE = re.compile(r"-[A-Za-z]*c[A-Za-z]*")  # -c, -xc, -ceu: the next operand is shell code

_COMPLEX = (
    "exec preflight: complex interpreter invocation detected; refusing to run without script preflight "
    "validation. Use a direct `python <file>.py` or `node <file>.js` command."
)

# Python: `$` is never valid outside a string, so any $NAME, ${ or $( is shell text.
_PY_SHELL = re.compile(r"\$(?:[A-Za-z_][A-Za-z0-9_]*|\{[A-Za-z_]?[A-Za-z0-9_]*|\()")
# JavaScript: `$` is an identifier character ($, $el, jQuery's $()), so only what reads as an
# environment variable is flagged: $UPPER_CASE (two characters or more) or ${ outside a template.
_JS_SHELL = re.compile(r"(?<![\w$\\])\$(?:[A-Z][A-Z0-9_]+\b|\{[A-Za-z_]?[A-Za-z0-9_]*)")
# On a script's first line of code, even inside a string: the line is a shell command saved as a script.
_ENV_VAR = re.compile(r"\$[A-Z_][A-Z0-9_]+")


@dataclass(slots=True)
class _Run:
    """What one interpreter invocation would read: its language, the files, and whether the script
    reaches it in a way the preflight cannot read."""

    language: str
    files: list[str] = field(default_factory=list)
    unknown_script: bool = False  # the script word is known only at run time ($x, <(...))
    reads_stdin: bool = False  # no script, no inline code: the program comes on stdin


def _run_of(program: str, args: tuple[str | None, ...]) -> _Run | None:
    """What ``program args`` reads when it is a Python or Node interpreter."""
    name = os.path.basename(program)
    if _PYTHON.fullmatch(name):
        run, value_options, no_file, info_only = (
            _Run("python"),
            _PYTHON_VALUE_OPTIONS,
            _PYTHON_NO_FILE,
            _PYTHON_INFO_ONLY,
        )
    elif name in _NODE:
        run, value_options, no_file, info_only = _Run("node"), _NODE_VALUE_OPTIONS, _NODE_NO_FILE, _NODE_INFO_ONLY
    else:
        return None
    i = 0
    while i < len(args):
        arg = args[i]
        i += 1
        if arg is None:
            run.unknown_script = True
            return run
        if arg in info_only:
            run.files.clear()  # prints a version or checks syntax: runs nothing
            return run
        option, eq, value = arg.partition("=")
        if run.language == "node" and option in _NODE_PRELOADS:
            module = value if eq else (args[i] if i < len(args) else None)
            i += 0 if eq else 1
            if module is not None:
                run.files.append(module)
            continue
        if arg in no_file or (run.language == "python" and arg[:2] in no_file):
            return run  # inline code or a module: the preloads read so far are all there is
        if arg == "-":
            run.reads_stdin = True
            return run
        if arg == "--":
            continue
        if arg.startswith("-"):
            i += 1 if arg in value_options else 0
            continue
        run.files.append(arg)
        return run
    run.reads_stdin = not run.files
    return run


# Comments and strings, each matched whole (an unterminated one runs to the end of its line, or of
# the text for a triple-quoted string, a block comment or a template literal). A lone CR ends a line
# as LF does (Python reads it so); a backslash before a line end continues the string.
_PY_SKIP = re.compile(
    "|".join(
        (
            r"#[^\n\r]*",
            r'"""[\s\S]*?(?:"""|\Z)',
            r"'''[\s\S]*?(?:'''|\Z)",
            r'"(?:\\(?:\r\n|[\s\S])|[^"\\\n\r])*"?',
            r"'(?:\\(?:\r\n|[\s\S])|[^'\\\n\r])*'?",
        )
    )
)
_JS_SKIP = re.compile(
    "|".join(
        (
            r"//[^\n\r]*",
            r"/\*[\s\S]*?(?:\*/|\Z)",
            r"`(?:\\[\s\S]|[^`\\])*`?",
            r'"(?:\\(?:\r\n|[\s\S])|[^"\\\n\r])*"?',
            r"'(?:\\(?:\r\n|[\s\S])|[^'\\\n\r])*'?",
        )
    )
)


def _blank(found: re.Match[str]) -> str:
    return "".join("\n" if c == "\n" else " " for c in found.group(0))


def _code_outside_strings(source: str, language: str) -> str:
    """``source`` with every string and comment blanked out (newlines kept, so lines still count)."""
    return (_PY_SKIP if language == "python" else _JS_SKIP).sub(_blank, source)


def shell_syntax_in(source: str, language: str) -> tuple[int, str] | None:
    """(line number, the line) of the first shell expansion outside strings and comments."""
    code = _code_outside_strings(source, language)
    found = (_PY_SHELL if language == "python" else _JS_SHELL).search(code)
    if found is None:
        return None
    line = code.count("\n", 0, found.start()) + 1
    return line, source.splitlines()[line - 1].strip()


_MENTIONS = re.compile(r"python|node")


def might_run_scripts(command: str) -> bool:
    """Whether ``command`` could run a Python or Node script at all: one search, so the common
    command costs no shell reading and no file read."""
    return _MENTIONS.search(command) is not None


def _inside(path: Path, root: Path) -> bool:
    real, top = os.path.realpath(path), os.path.realpath(root)
    return real == top or real.startswith(top.rstrip(os.sep) + os.sep)


def _read(path: Path) -> str | None:
    """The start of a regular file, or None. Opened without blocking, so a FIFO put in a script's
    place cannot stall the call."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return os.read(fd, _MAX_SCRIPT_BYTES).decode("utf-8", errors="replace")
    except OSError:
        return None
    finally:
        os.close(fd)


def _first_line_env_var(source: str, language: str) -> tuple[int, str] | None:
    """(line number, the token) of a $NAME on the first line of code, strings included."""
    comment = "#" if language == "python" else "//"
    for number, line in enumerate(source.splitlines(), 1):
        text = line.strip()
        if not text or text.startswith(comment):
            continue
        found = _ENV_VAR.search(text)
        return (number, found.group(0)) if found else None
    return None


def _injection(source: str, language: str) -> tuple[int, str] | None:
    """(line number, the token as written) of the first shell expansion the preflight refuses."""
    code = _code_outside_strings(source, language)
    found = (_PY_SHELL if language == "python" else _JS_SHELL).search(code)
    if found is not None:
        token = found.group(0)
        if token.startswith("${") and len(token) > 2:
            token += "}"
        return code.count("\n", 0, found.start()) + 1, token
    return _first_line_env_var(source, language)


def _refusal(token: str, language: str, script: Path, line: int) -> ScriptHasShellSyntax:
    name = token.strip("${}")
    if language == "python":
        read = f'os.environ.get("{name}")' if name and name != "(" else "os.environ"
        advice = f"In Python, use {read} instead of raw {token}."
    else:
        read = f'process.env["{name}"]' if name and name != "(" else "process.env"
        advice = f"In Node.js, use {read} instead of raw {token}."
    return ScriptHasShellSyntax(
        "\n".join(
            (
                f"exec preflight: detected likely shell variable injection ({token}) in {language} script: "
                f"{script.name}:{line}.",
                advice,
                "(If this is inside a string literal on purpose, escape it or restructure the code.)",
            )
        ),
        hints={
            "fix_script": "Read variables inside the script (os.environ, process.env) or write the value into it; "
            "$NAME, ${...} and $(...) only mean something to a shell.",
        },
        script=str(script),
        line=line,
    )


def check_scripts(command: ShellText | str, cwd: Path, *, fail_closed: bool = False) -> None:
    """Raise :class:`ScriptHasShellSyntax` when ``command`` would run a Python or Node script (or
    Node preload module) inside ``cwd`` whose code holds shell syntax, and :class:`ScriptNotCheckable`
    when the script reaches the interpreter through a pipe or a process substitution.

    ``fail_closed`` (OpenClaw's letter): a script run by a line that also has a ``sh -c`` string or
    runs commands under shell control flow (``if``, ``while``, ``for``...) is refused unread, as
    OpenClaw refuses it, whatever the script holds; without it the shell reading sees through
    both and the script is checked like a direct one.

    It reads the command line and up to a few script files: a caller on an event loop runs it in
    a worker thread (see ``might_run_scripts`` for the cheap test first)."""
    shell = ShellText(command) if isinstance(command, str) else command
    command = shell.text
    if not might_run_scripts(command):
        return
    programs = shell.commands()
    wrapped = fail_closed and (_runs_shell_code(programs) or control_flow_in(shell.lexed()))
    checked = 0
    for index, (program, args) in enumerate(programs):
        run = _run_of(program, args)
        if run is None:
            continue
        # Fail closed where the script is real but unread: `python <(cat x.py)`, `cat x.py | python`.
        fed_by_substitution = run.unknown_script and "<(" in command
        fed_by_pipe = (
            run.reads_stdin
            and index > 0
            and "|" in command
            and any(a is not None and _SCRIPT_HINT.search(a) for _, before in programs[:index] for a in before)
        )
        if fed_by_substitution or fed_by_pipe or (wrapped and (run.files or run.unknown_script)):
            raise ScriptNotCheckable(_COMPLEX)
        for script in run.files:
            path = cwd / script
            if not _inside(path, cwd):
                continue  # outside the working directory: not ours to read (OpenClaw's rule too)
            source = _read(path)
            if source is None:
                continue  # missing, unreadable or no regular file: the interpreter says so itself
            checked += 1
            hit = _injection(source, run.language)
            if hit is not None:
                raise _refusal(hit[1], run.language, path, hit[0])
            if checked >= _MAX_SCRIPTS:
                return


def _runs_shell_code(programs: list[tuple[str, tuple[str | None, ...]]]) -> bool:
    """Whether one of ``programs`` is a shell given code to run (``bash -c``, ``sh -xc``...)."""
    return any(
        os.path.basename(program) in _SHELLS and any(a is not None and _COMMAND_MODE.fullmatch(a) for a in args)
        for program, args in programs
    )
