"""Text prepared for a language model from raw process output.

The raw bytes stay on disk untouched; everything here is for display only, so it may drop
information (colours, cursor movement, progress redraws) that a model cannot use and that
would otherwise crowd its context.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from procpilot.errors import InvalidArgument
from procpilot.shell.lexer import simple_commands
from procpilot.shell.reading import ShellText

__all__ = [
    "MAX_NAME_CHARS",
    "binary_bytes",
    "collapse_cr",
    "complete_utf8_prefix",
    "cut_marker",
    "derive_name",
    "for_model",
    "head_chars",
    "plain_words",
    "strip_ansi",
    "tail_chars",
]

_ANSI = re.compile(
    # OSC, DCS, SOS, PM and APC strings, ended by BEL or ST (ESC \). An unterminated one (a
    # chunk cut mid-sequence) stops at the next ESC or newline so it cannot swallow real output.
    r"\x1b[\]PX^_][^\x07\x1b\n]*(?:\x07|\x1b\\)?"
    # CSI: parameters (including private ones such as ?25), intermediates, final byte; a CSI
    # cut off at the very end of the text is dropped rather than leaving its digits behind.
    r"|\x1b\[[0-?]*[ -/]*(?:[@-~]|\Z)"
    # The remaining escapes: ESC, optional intermediates (charset selection ESC ( B), final byte.
    r"|\x1b[ -/]*[0-~]"
    # C0 controls other than \t \n \r (\r is for collapse_cr), DEL, and C1 controls, which have
    # no glyph and which UTF-8 output only contains by accident.
    r"|[\x00-\x08\x0b-\x0c\x0e-\x1f\x7f-\x9f]"
)


def strip_ansi(text: str) -> str:
    """Remove terminal escape sequences and invisible control characters from ``text``.

    Removes CSI sequences (SGR colours, cursor movement, private modes like ``ESC[?25l``),
    OSC strings terminated by BEL or ST (titles, OSC 8 hyperlinks, whose link text is kept),
    DCS/APC/PM/SOS strings, other ESC sequences, and C0/C1 controls except ``\\n``, ``\\t``
    and ``\\r``.
    """
    return _ANSI.sub("", text)


def _last_redraw(line: str) -> str:
    # Trailing \r belong to the line ending ("\r\n", or "\r\r\n" from a PTY translating a
    # "\r\n" the program already wrote); stripping them first also keeps a final "50%\r".
    return line.rstrip("\r").rpartition("\r")[2]


def collapse_cr(text: str) -> str:
    """Keep only the last redraw of each carriage-return-updated line.

    Within every ``\\n``-separated line the text after the last ``\\r`` wins, as a progress bar
    rewriting itself in place would leave it. ``\\r\\n`` is an ordinary newline, and a trailing
    partial line ending in ``\\r`` keeps the text it last drew.
    """
    if "\r" not in text:
        return text
    return "\n".join(_last_redraw(line) for line in text.split("\n"))


def for_model(raw: bytes | str) -> str:
    """Process output as a model should read it: decoded, escapes stripped, redraws collapsed."""
    text = raw.decode("utf-8", errors="replace") if isinstance(raw, bytes) else raw
    return collapse_cr(strip_ansi(text))


def _check_limit(limit: int) -> None:
    if limit < 0:
        raise InvalidArgument(
            f"limit must be 0 or more, got {limit}",
            hints={"use_positive_limit": "Pass a character count of 0 or more."},
            limit=limit,
        )


def tail_chars(text: str, limit: int) -> tuple[str, int]:
    """The last ``limit`` characters of ``text`` and how many characters were cut before them.

    When the cut falls mid-line and a newline lies in the first 10% of the window (the part next
    to the cut), the tail starts just after that newline, so the model never sees half a line
    at the top; the tail may then be up to 10% shorter than ``limit``.
    """
    _check_limit(limit)
    if len(text) <= limit:
        return text, 0
    start = len(text) - limit
    if limit and text[start - 1] != "\n":
        newline = text.find("\n", start, start + limit // 10)
        if newline != -1:
            start = newline + 1
    return text[start:], start


def head_chars(text: str, limit: int) -> tuple[str, int]:
    """The first ``limit`` characters of ``text`` and how many characters were cut after them.

    Mirror of :func:`tail_chars`: when the cut falls mid-line and a newline lies in the last
    10% of the window, the head ends with that newline so it holds whole lines only.
    """
    _check_limit(limit)
    if len(text) <= limit:
        return text, 0
    end = limit
    if limit and text[end - 1] != "\n" and text[end] != "\n":
        newline = text.rfind("\n", end - limit // 10, end)
        if newline != -1:
            end = newline + 1
    return text[:end], len(text) - end


def cut_marker(lines: int, chars: int, call: str) -> str:
    """The line that stands where output was cut: how much, and the exact call that reads it."""
    what = f"{lines:,} lines, {chars:,} characters" if lines else f"{chars:,} characters"
    return f"…[{what} cut here; {call} reads them]…"


# Control bytes no text holds, not even a terminal's: C0 controls but BEL, BS, \t, \n, VT, FF,
# \r, SO, SI (a terminal's own) and ESC (which starts the escapes strip_ansi removes).
_BINARY_CONTROLS = bytes([*range(0x00, 0x07), *range(0x10, 0x1B), *range(0x1C, 0x20)])


def binary_bytes(raw: bytes) -> int:
    """Bytes of ``raw`` a model cannot read: control bytes no text holds (NUL...) and bytes that
    are not UTF-8 (counted as the replacement characters decoding makes of them)."""
    controls = len(raw) - len(raw.translate(None, _BINARY_CONTROLS))
    if raw.isascii():
        return controls
    decoded = raw.decode("utf-8", errors="replace")
    return controls + decoded.count("\ufffd") - raw.decode("utf-8", errors="ignore").count("\ufffd")


def _utf8_length(lead: int) -> int:
    """Bytes in the sequence that ``lead`` starts; 0 for ASCII, continuation and invalid bytes."""
    if 0xC2 <= lead <= 0xDF:
        return 2
    if 0xE0 <= lead <= 0xEF:
        return 3
    if 0xF0 <= lead <= 0xF4:
        return 4
    return 0


# The second byte is narrower than 80-BF after these leads: the other values would encode an
# overlong form, a UTF-16 surrogate or a code point above U+10FFFF, so no later byte can help.
_SECOND_BYTE_RANGE = {0xE0: (0xA0, 0xBF), 0xED: (0x80, 0x9F), 0xF0: (0x90, 0xBF), 0xF4: (0x80, 0x8F)}


def complete_utf8_prefix(data: bytes) -> int:
    """Length of the longest prefix of ``data`` that does not end inside a UTF-8 sequence.

    An incomplete multi-byte sequence at the end (at most 3 bytes: a lead byte and the
    continuation bytes valid for it so far) is left out, so a reader can decode the prefix now
    and prepend the rest to the next chunk. Invalid bytes count as complete: waiting for more
    data would not make them valid.
    """
    size = len(data)
    # Only the last 3 bytes can belong to an incomplete sequence; walk back over continuation
    # bytes to the lead that would own them.
    for back in range(1, min(3, size) + 1):
        byte = data[size - back]
        if 0x80 <= byte <= 0xBF:
            continue
        if _utf8_length(byte) <= back:
            return size
        if back >= 2:
            low, high = _SECOND_BYTE_RANGE.get(byte, (0x80, 0xBF))
            if not low <= data[size - back + 1] <= high:
                return size
        return size - back
    return size


# --- derive_name -----------------------------------------------------------------------------

MAX_NAME_CHARS = 40

_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")

# Commands that only prepare the environment for the one that matters in "cd app && make".
_SETUP_VERBS = frozenset(
    {
        "cd", "pushd", "popd", "export", "set", "unset", "source", ".",
        "umask", "ulimit", "shopt", "trap", "alias",
    }
)  # fmt: skip

# Prefixes that run the rest of the line as a command: their options that take a value, and
# how many positional arguments they take before the command starts.
_WRAPPERS: dict[str, tuple[frozenset[str], int]] = {
    "sudo": (frozenset({"-u", "-g", "-C", "-D", "-h", "-p", "-r", "-t", "-U", "-T"}), 0),
    "doas": (frozenset({"-u", "-C"}), 0),
    "env": (frozenset({"-u", "-C", "-S", "--unset", "--chdir"}), 0),
    "nohup": (frozenset(), 0),
    "time": (frozenset({"-f", "-o", "--format", "--output"}), 0),
    "exec": (frozenset({"-a"}), 0),
    "command": (frozenset(), 0),
    "nice": (frozenset({"-n", "--adjustment"}), 0),
    "timeout": (frozenset({"-s", "-k", "--signal", "--kill-after"}), 1),
    "npx": (frozenset({"-p", "--package"}), 0),
    "bunx": (frozenset({"-p", "--package"}), 0),
    "pnpx": (frozenset(), 0),
}

# "<tool> <subcommand> CMD" runs CMD, so CMD names the session: "uv run pytest" -> "pytest".
_RUNNER_SUBCOMMANDS: dict[str, str] = {
    "uv": "run",
    "poetry": "run",
    "pipenv": "run",
    "pdm": "run",
    "rye": "run",
    "bundle": "exec",
    "pnpm": "exec",
    "npm": "exec",
}
_RUNNER_VALUE_OPTIONS = frozenset(
    {"--with", "--python", "-p", "--project", "--directory", "--package", "--extra", "--group", "--env-file"}
)

# Package managers whose "run" only introduces a script name: "npm run build" -> "npm build".
_SCRIPT_RUNNERS = frozenset({"npm", "yarn", "pnpm", "bun", "deno"})

# Options that take a separate value, per verb, so the value is not mistaken for the target.
_VALUE_OPTIONS: dict[str, frozenset[str]] = {
    "make": frozenset({"-C", "-f", "-l", "-o", "-W", "-I", "--directory", "--file", "--makefile"}),
    "gmake": frozenset({"-C", "-f", "-l", "-o", "-W", "-I", "--directory", "--file", "--makefile"}),
    "git": frozenset({"-C", "-c", "--git-dir", "--work-tree", "--namespace"}),
    "npm": frozenset({"--prefix", "-w", "--workspace"}),
    "pnpm": frozenset({"-C", "--dir", "--filter", "-F"}),
    "yarn": frozenset({"--cwd"}),
    "cargo": frozenset({"-C", "--config", "-Z"}),
    "docker": frozenset({"-H", "--host", "--context", "-c", "--config", "--log-level"}),
    "pytest": frozenset({"-k", "-m", "-p", "-c", "-o", "--rootdir", "--basetemp"}),
    "go": frozenset({"-C"}),
}

_PYTHON = re.compile(r"(?:python|pypy)[\d.]*")
_PYTHON_VALUE_OPTIONS = frozenset({"-W", "-X", "-Q"})
_SHELLS = frozenset({"sh", "bash", "zsh", "dash", "ksh", "fish"})
_SHELL_VALUE_OPTIONS = frozenset({"-o", "-O", "+o", "+O"})
# Script interpreters: their inline-code flags (no script to name) and value-taking options.
_INTERPRETERS: dict[str, tuple[frozenset[str], frozenset[str]]] = {
    "node": (frozenset({"-e", "--eval", "-p", "--print"}), frozenset({"-r", "--require", "--import"})),
    "ruby": (frozenset({"-e"}), frozenset({"-r", "-I"})),
    "perl": (frozenset({"-e", "-E"}), frozenset({"-M", "-I"})),
    "php": (frozenset({"-r"}), frozenset({"-c", "-d"})),
}

_MAX_DEPTH = 4


def _basename(word: str) -> str:
    stripped = word.rstrip("/")
    return stripped.rpartition("/")[2] or word


def _is_option(word: str) -> bool:
    return len(word) > 1 and word.startswith("-")


def _skip_options(words: Sequence[str], start: int, value_options: frozenset[str]) -> int:
    """Index of the first word at or after ``start`` that is not an option or an option's value."""
    index = start
    while index < len(words):
        word = words[index]
        if word == "--":
            return index + 1
        if not _is_option(word):
            return index
        index += 2 if word in value_options else 1
    return index


def _first_positional(verb: str, args: Sequence[str]) -> int | None:
    value_options = _VALUE_OPTIONS.get(verb, frozenset())
    index = 0
    while index < len(args):
        word = args[index]
        if word == "--":
            index += 1
        elif _is_option(word):
            # A bare number after an option is that option's value ("make -j 4", "head -n 5").
            takes_value = word in value_options or (index + 1 < len(args) and args[index + 1].isdigit())
            index += 2 if takes_value else 1
        elif word.startswith("+") and verb in {"cargo", "rustup"}:
            index += 1  # toolchain selector: "cargo +nightly build"
        else:
            return index
    return None


def _short_target(word: str) -> str:
    if "://" in word:
        host = word.partition("://")[2].partition("/")[0]
        return host or word
    if word.startswith("./") and len(word) > 2:
        word = word[2:]
    return word.rstrip("/") or word


def _target(verb: str, args: Sequence[str]) -> str | None:
    index = _first_positional(verb, args)
    return None if index is None else _short_target(args[index])


def _name_interpreted(verb: str, args: Sequence[str], depth: int) -> tuple[str, str | None] | None:
    """Name for interpreter invocations (``python -m x``, ``bash -c '...'``, ``node app.js``)."""
    if _PYTHON.fullmatch(verb):
        inline, value_options = frozenset({"-c"}), _PYTHON_VALUE_OPTIONS
    elif verb in _SHELLS:
        inline, value_options = frozenset({"-c"}), _SHELL_VALUE_OPTIONS
    elif verb in _INTERPRETERS:
        inline, value_options = _INTERPRETERS[verb]
    else:
        return None
    index = 0
    while index < len(args):
        word = args[index]
        if word == "--":
            index += 1
            break
        if _PYTHON.fullmatch(verb) and word.startswith("-m"):
            module = word[2:] or (args[index + 1] if index + 1 < len(args) else "")
            rest = args[index + 1 :] if word[2:] else args[index + 2 :]
            return (module, _target(module, rest)) if module else (verb, None)
        # Shells take -c inside combined flags too: "bash -lc '...'", "sh -ec '...'".
        shell_inline = verb in _SHELLS and not word.startswith("--") and word.startswith("-") and "c" in word
        if word in inline or shell_inline:
            if verb in _SHELLS and index + 1 < len(args) and depth < _MAX_DEPTH:
                return _name_command(args[index + 1], depth + 1) or (verb, None)
            return verb, None
        if not _is_option(word):
            break
        index += 2 if word in value_options else 1
    if index >= len(args):
        return verb, None
    script = _basename(args[index])
    return script, _target(script, args[index + 1 :])


def _name_segment(words: Sequence[str], depth: int) -> tuple[str, str | None] | None:
    index = 0
    while index < len(words):
        word = words[index]
        if _ASSIGNMENT.match(word):
            index += 1
            continue
        wrapper = _WRAPPERS.get(_basename(word))
        if wrapper is None:
            break
        value_options, positionals = wrapper
        index = _skip_options(words, index + 1, value_options) + positionals
    if index >= len(words):
        # Only assignments or a bare wrapper ("FOO=1", "sudo"): name it by what is there.
        return (_basename(words[0]), None) if words else None
    verb = _basename(words[index])
    args = words[index + 1 :]

    interpreted = _name_interpreted(verb, args, depth)
    if interpreted is not None:
        return interpreted

    if verb in _RUNNER_SUBCOMMANDS and depth < _MAX_DEPTH:
        subcommand_index = _skip_options(args, 0, _RUNNER_VALUE_OPTIONS)
        if subcommand_index < len(args) and args[subcommand_index] == _RUNNER_SUBCOMMANDS[verb]:
            command_start = _skip_options(args, subcommand_index + 1, _RUNNER_VALUE_OPTIONS)
            return _name_segment(args[command_start:], depth + 1) or (verb, args[subcommand_index])

    if verb in _SCRIPT_RUNNERS:
        index_of_first = _first_positional(verb, args)
        if index_of_first is not None and args[index_of_first] in {"run", "run-script"}:
            return verb, _target(verb, args[index_of_first + 1 :])

    return verb, _target(verb, args)


# Plain words parted by spaces: no quote, expansion, glob, brace, comment, operator or
# redirection character, nothing but ASCII.
_PLAIN_WORDS = re.compile(r"[A-Za-z0-9_./:,@%+=-]+(?: +[A-Za-z0-9_./:,@%+=-]+)*")


def plain_words(text: str) -> list[str] | None:
    """The words of shell ``text`` that is plain words only, else None: what the lexer's
    ``simple_commands`` gives for it (one simple command), without the lexer. The common
    ``true``, ``ls -la``, ``npm test`` is named in a few µs so, where the lexer's first run
    after an agent's idle gap costs 50-100 µs."""
    return text.split() if _PLAIN_WORDS.fullmatch(text) else None


def _name_command(command: ShellText | str | Sequence[str], depth: int) -> tuple[str, str | None] | None:
    # An argv is not shell syntax: "&&" in it is an argument, not an operator.
    segments: list[list[str]]
    if isinstance(command, ShellText | str):
        text = command.text if isinstance(command, ShellText) else command
        if (words := plain_words(text)) is not None:
            if len(words) == 1:  # one word (true, ls, make): no wrapper, interpreter or target to read
                return _basename(words[0]), None
            segments = [words]
        elif isinstance(command, ShellText):  # a spec's: its lexing if a check made one, else its text
            segments = simple_commands(command.lexed_already() or text)
        else:
            segments = simple_commands(text)
    else:
        segments = [list(command)]
    first: tuple[str, str | None] | None = None
    for segment in segments:
        named = _name_segment(segment, depth)
        if named is None:
            continue
        if named[0] not in _SETUP_VERBS:
            return named
        first = first or named
    return first


def derive_name(command: ShellText | str | Sequence[str]) -> str:
    """A short display name for a command: its verb plus its target, at most 40 characters.

    The rule, in order:

    1. A string is split like a shell would (quotes, ``&&``, ``||``, ``;``, ``|``, ``&``,
       parentheses, redirections); an argv list is taken as one command, no shell syntax.
    2. The name comes from the first command that is not set-up (``cd``, ``export``, ``source``,
       ...), or from the first command when all of them are.
    3. Leading ``VAR=value`` assignments and the wrappers ``sudo``, ``doas``, ``env``, ``nohup``,
       ``time``, ``exec``, ``command``, ``nice``, ``timeout``, ``npx``, ``bunx``, ``pnpx`` (with their
       options) are skipped; so are runner subcommands (``uv run``, ``poetry run``, ``pipenv run``,
       ``pdm run``, ``rye run``, ``bundle exec``, ``pnpm exec``, ``npm exec``).
    4. The verb is the basename of the executable. Interpreters are looked through:
       ``python -m mod`` -> ``mod``, ``python script.py`` / ``node app.js`` / ``bash x.sh`` -> the
       script's basename, ``bash -c '...'`` -> the name of the inner command; inline code
       (``python -c``, ``node -e``) leaves just the interpreter.
    5. The target is the first argument after the verb that is not an option or an option's
       value; ``npm``/``yarn``/``pnpm``/``bun``/``deno`` drop a leading ``run``. A URL target is
       shortened to its host; a path loses a leading ``./`` and trailing ``/``, and is cut to
       its last component if the name would otherwise be too long.
    6. The result is ``"verb target"`` (or ``"verb"``), cut to 40 characters with a trailing ``…``.
       A command of only assignments or a bare wrapper (``FOO=1``, ``sudo``) is named by its
       first word.

    Examples::

        "python -m pytest -q tests"   -> "pytest tests"
        "npm run build"               -> "npm build"
        "sleep 5 && echo done"        -> "sleep 5"
        "cd app && make test"         -> "make test"
        "./scripts/deploy.sh prod"    -> "deploy.sh prod"
        "make -C dir test"            -> "make test"
        "git commit -m x"             -> "git commit"
        "FOO=1 sudo -u me cargo test" -> "cargo test"
        "bash -c 'yarn run lint'"     -> "yarn lint"

    Raises :class:`InvalidArgument` when the command has no words at all.
    """
    named = _name_command(command, 0)
    if named is None:
        raise InvalidArgument(
            "command is empty; there is nothing to name",
            hints={"give_command": "Pass the command line (or argv) the session runs."},
        )
    verb, target = named
    name = f"{verb} {target}" if target else verb
    if len(name) > MAX_NAME_CHARS and target and "/" in target:
        # The end of a long path says more than a truncated beginning would.
        name = f"{verb} {_basename(target)}"
    if len(name) > MAX_NAME_CHARS:
        name = name[: MAX_NAME_CHARS - 1] + "…"
    return name
