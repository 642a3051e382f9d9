"""The pre-check reads a command the way /bin/sh would, in one pass, or steps aside; and nothing
bigger than the kernel can take reaches the policy or the spawn."""

from __future__ import annotations

import time

import pytest

from procpilot.engine.capture import Stream
from procpilot.engine.precheck import MAX_COMMAND_BYTES, check_size, first_program
from procpilot.engine.spawn import SpawnSpec
from procpilot.engine.supervisor import Supervisor
from procpilot.errors import CommandNotFound, InvalidArgument

A = "agent-a"


@pytest.mark.parametrize(
    ("command", "program"),
    [
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
    ],
)
def test_the_program_of_the_first_simple_command(command: str, program: str) -> None:
    assert first_program(command) == program


@pytest.mark.parametrize(
    "command",
    [
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
    ],
)
def test_where_the_shell_decides_the_check_steps_aside(command: str) -> None:
    assert first_program(command) is None


def test_a_long_word_is_read_in_linear_time() -> None:
    started = time.process_time()
    for command in ("A" * 2_000_000, '"' + "A" * 2_000_000 + '" x', "x=" + "A" * 2_000_000 + " y"):
        first_program(command)
    assert time.process_time() - started < 2  # it took 47 s for one 2 MB word with shlex


def test_sizes_past_the_kernels_limits_are_invalid_arguments() -> None:
    check_size("echo " + "A" * (MAX_COMMAND_BYTES - 5))
    with pytest.raises(InvalidArgument, match="longer than") as raised:
        check_size("echo " + "A" * 1_000_000)
    assert "file" in " ".join(raised.value.hints.values())
    with pytest.raises(InvalidArgument, match="command\\[1\\]"):
        check_size(("echo", "A" * 200_000))
    with pytest.raises(InvalidArgument, match="more than"):
        check_size(("true",) * 20_000)
    with pytest.raises(InvalidArgument, match="add up"):
        check_size(("echo", *["A" * 100_000] * 12))
    with pytest.raises(InvalidArgument):
        SpawnSpec("echo " + "é" * 70_000)  # bytes, not characters, count
    with pytest.raises(InvalidArgument, match="nested"):
        check_size("echo " + "$(" * 2000 + "echo x" + ")" * 2000)  # 2,000 subshells alive at once
    check_size("echo $(date) $(echo $(pwd)) (cd src && $(echo make))")


async def test_an_assignment_from_a_substitution_runs(supervisor: Supervisor) -> None:
    session = await supervisor.run(SpawnSpec("x=$(echo a b); echo $x"), scope=A, yield_ms=None)
    assert session.exit_code == 0
    assert session.output[Stream.STDOUT].read().data == b"a b\n"
    session = await supervisor.run(SpawnSpec("VAR=$(echo a b) printenv VAR"), scope=A, yield_ms=None)
    assert session.output[Stream.STDOUT].read().data == b"a b\n"


@pytest.mark.parametrize(
    "command", ["exec nosuchprog-xyz", "nosuchprog-xyz --flag", '"nosuch prog" a', "A=1 nosuchprog-xyz"]
)
async def test_a_missing_program_is_still_command_not_found(supervisor: Supervisor, command: str) -> None:
    with pytest.raises(CommandNotFound):
        await supervisor.run(SpawnSpec(command), scope=A, yield_ms=None)


async def test_an_oversized_command_is_refused_before_anything_starts(supervisor: Supervisor) -> None:
    with pytest.raises(InvalidArgument, match="longer than"):
        await supervisor.run(SpawnSpec("echo " + "A" * 1_000_000), scope=A, yield_ms=None)
    assert supervisor.list(A) == []
