"""The pre-check looks up the program of the first simple command (procpilot.shell.first reads it)
or steps aside; and nothing bigger than the kernel can take reaches the policy or the spawn."""

from __future__ import annotations

import pytest

from procpilot.engine.capture import Stream
from procpilot.engine.precheck import MAX_COMMAND_BYTES, check_size
from procpilot.engine.spawn import SpawnSpec
from procpilot.engine.supervisor import Supervisor
from procpilot.errors import CommandNotFound, InvalidArgument

A = "agent-a"


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


@pytest.mark.parametrize("char", ["é", "€", "😀"])
def test_a_command_of_wide_characters_is_measured_in_bytes_however_few_its_characters(char: str) -> None:
    """Text short enough that even 4 bytes a character fit is let through unencoded; anything
    longer is measured in bytes: a command of 2-, 3- or 4-byte characters just past the limit
    is refused, one just within it runs."""
    width = len(char.encode())
    fits = MAX_COMMAND_BYTES // width
    check_size(char * fits)
    with pytest.raises(InvalidArgument, match="longer than"):
        check_size(char * (fits + 1))
    with pytest.raises(InvalidArgument, match="nested"):
        check_size(char + "$(" * 101 + ")" * 101)  # a deep nest however short the text


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
