"""Script preflight: refuse to run a Python or Node script that holds shell syntax.

A common agent mistake is to write a script as if it were shell text: ``payload = $DM_JSON`` in
a ``.py`` file, expecting the shell to fill the value in. The interpreter never expands it, so the
run fails with a confusing SyntaxError (or, in JavaScript, quietly reads an undefined name). Before
``python x.py`` / ``node x.js`` runs (directly, in a pipeline, behind ``env``/``timeout``, or inside
``sh -c``), the script is read and any ``$NAME``, ``${...}`` or ``$(...)`` outside strings and
comments is refused with a typed error that says where and what to write instead.

Reading the command line is ``procpilot.shell``'s job (``commands_in``); this module only reads the
scripts. It is a help, not a guard: what cannot be read (a missing file, a script named by a
variable) is left for the interpreter to report.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from procpilot.errors import ScriptHasShellSyntax
from procpilot.shell import commands_in

__all__ = ["check_scripts", "might_run_scripts", "shell_syntax_in"]

_MAX_SCRIPT_BYTES = 256 << 10  # read at most this much of a script: enough for any hand-written one
_MAX_SCRIPTS = 4  # scripts read per command (a command line naming more is unusual)
_PYTHON = re.compile(r"python(?:[23](?:\.\d+)?)?")
_NODE = frozenset({"node", "nodejs"})
# Options that take the next word as their value, so it is not the script.
_PYTHON_VALUE_OPTIONS = frozenset({"-W", "-X", "-Q"})
_NODE_VALUE_OPTIONS = frozenset({"-r", "--require", "--import", "--loader", "--experimental-loader", "--env-file"})
# Options after which no script file follows (the code is inline, or a module is run).
_PYTHON_NO_FILE = frozenset({"-c", "-m", "-"})
_NODE_NO_FILE = frozenset({"-e", "--eval", "-p", "--print", "-"})

# Python: `$` is never valid outside a string, so any $NAME, ${ or $( is shell text.
_PY_SHELL = re.compile(r"\$(?:[A-Za-z_][A-Za-z0-9_]*|\{|\()")
# JavaScript: `$` is an identifier character ($, $el, jQuery's $()), so only what reads as an
# environment variable is flagged: $UPPER_CASE (two characters or more) or ${ outside a template.
_JS_SHELL = re.compile(r"(?<![\w$\\])\$(?:[A-Z][A-Z0-9_]+\b|\{)")


def _script_of(program: str, args: tuple[str | None, ...]) -> tuple[str, str] | None:
    """(language, script path) when ``program args`` runs a Python or Node script file."""
    name = os.path.basename(program)
    if _PYTHON.fullmatch(name):
        language, value_options, no_file = "python", _PYTHON_VALUE_OPTIONS, _PYTHON_NO_FILE
    elif name in _NODE:
        language, value_options, no_file = "node", _NODE_VALUE_OPTIONS, _NODE_NO_FILE
    else:
        return None
    skip = False
    for arg in args:
        if arg is None:
            return None  # a word known only at run time: cannot tell which file
        if skip:
            skip = False
            continue
        if arg in no_file:
            return None
        if arg == "--":
            continue
        if arg.startswith("-"):
            skip = arg in value_options
            continue
        return language, arg
    return None


# Comments and strings, each matched whole (an unterminated one runs to the end of its line, or of
# the text for a triple-quoted string, a block comment or a template literal).
_PY_SKIP = re.compile(
    "|".join(
        (
            r"#[^\n]*",
            r'"""[\s\S]*?(?:"""|\Z)',
            r"'''[\s\S]*?(?:'''|\Z)",
            r'"(?:\\.|[^"\\\n])*"?',
            r"'(?:\\.|[^'\\\n])*'?",
        )
    )
)
_JS_SKIP = re.compile(
    "|".join(
        (
            r"//[^\n]*",
            r"/\*[\s\S]*?(?:\*/|\Z)",
            r"`(?:\\[\s\S]|[^`\\])*`?",
            r'"(?:\\.|[^"\\\n])*"?',
            r"'(?:\\.|[^'\\\n])*'?",
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


def check_scripts(command: str, cwd: Path) -> None:
    """Raise :class:`ScriptHasShellSyntax` when ``command`` would run a Python or Node script
    (relative paths from ``cwd``) whose code holds shell syntax outside its strings.

    It reads the command line and up to a few script files: a caller on an event loop runs it in
    a worker thread (see ``might_run_scripts`` for the cheap test first)."""
    if not might_run_scripts(command):
        return
    checked = 0
    for program, args in commands_in(command):
        found = _script_of(program, args)
        if found is None:
            continue
        language, script = found
        path = cwd / script
        try:
            with open(path, "rb") as f:
                source = f.read(_MAX_SCRIPT_BYTES).decode("utf-8", errors="replace")
        except OSError:
            continue  # missing or unreadable: the interpreter says so itself
        checked += 1
        hit = shell_syntax_in(source, language)
        if hit is not None:
            line, text = hit
            where = "os.environ['NAME']" if language == "python" else "process.env.NAME"
            raise ScriptHasShellSyntax(
                f"{script} line {line} holds shell syntax that {program} will not expand: {text[:200]}",
                hints={
                    "fix_script": f"Read variables inside the script ({where}) or write the value into it; "
                    "$NAME, ${...} and $(...) only mean something to a shell.",
                },
                script=str(path),
                line=line,
            )
        if checked >= _MAX_SCRIPTS:
            return
