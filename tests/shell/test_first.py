"""The first simple command's program, read the way /bin/sh would, in one pass, or None where
only the shell can tell."""

from __future__ import annotations

import time

import pytest

from procpilot.shell.first import first_program, substitution_depth

# Shared with tests/shell/test_reading.py: the reading from tokens must answer the same.
PROGRAMS = [
    ("ls -l", "ls"),
    ("  ls", "ls"),
    ("A=1 B='2 3' make -j2", "make"),  # assignments before the program
    ("exec python3 x.py", "python3"),
    ("a=b exec ls", "ls"),
    ('"my prog" arg', "my prog"),  # quote removal
    ("'ls' -l", "ls"),
    ("l\\s", "ls"),
    ('"a\\"b" c', 'a"b'),
    ("nosuch; ls", "nosuch"),  # the first simple command
    ("ls|wc", "ls"),
    ("./run.sh", "./run.sh"),
]


@pytest.mark.parametrize(("command", "program"), PROGRAMS)
def test_the_program_of_the_first_simple_command(command: str, program: str) -> None:
    assert first_program(command) == program


SHELL_DECIDES = [
    "x=$(echo a b); echo $x",  # an assignment alone, its value a substitution
    "VAR=$(cmd args) other",  # only the shell knows where $( ) ends its word
    "FOO=bar",
    "$HOME/bin/tool",
    "`which ls`",
    "*.sh",
    "echo hi",  # builtins and keywords are the shell's
    "if true; then x; fi",
    "command -v ls",
    "# a comment",
    "",
    "'unterminated",
    "(cd src && make)",
]


@pytest.mark.parametrize("command", SHELL_DECIDES)
def test_where_the_shell_decides_the_check_steps_aside(command: str) -> None:
    assert first_program(command) is None


def test_a_long_word_is_read_in_linear_time() -> None:
    started = time.process_time()
    for command in ("A" * 2_000_000, '"' + "A" * 2_000_000 + '" x', "x=" + "A" * 2_000_000 + " y"):
        first_program(command)
    assert time.process_time() - started < 2  # it took 47 s for one 2 MB word with shlex


def test_substitution_depth_counts_nested_command_substitutions_only() -> None:
    assert substitution_depth("echo $(a $(b $(c)))") == 3
    assert substitution_depth("(cd x && (make))") == 0  # subshells are not substitutions
    assert substitution_depth("echo $(a) $(b)") == 1
