"""engine/procfs.py: a small kernel file read whole, and a big one too, in as few calls as it takes."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from procpilot.engine.procfs import read_small, stat_fields


def test_a_kernel_file_reads_as_open_would() -> None:
    data = read_small(f"/proc/{os.getpid()}/status")
    assert data.startswith(b"Name:\t") and f"\nPid:\t{os.getpid()}\n".encode() in data


def test_a_file_bigger_than_one_read_is_read_whole(tmp_path: Path) -> None:
    big = tmp_path / "big"
    content = os.urandom(200_000)
    big.write_bytes(content)
    assert read_small(str(big)) == content
    exact = tmp_path / "exact"
    exact.write_bytes(content[: 1 << 16])  # one full read, then the end
    assert read_small(str(exact)) == content[: 1 << 16]


def test_a_missing_file_raises_as_open_would(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        read_small(str(tmp_path / "gone"))


def test_stat_fields_start_after_a_name_with_spaces_and_parentheses(tmp_path: Path) -> None:
    """A command name may hold ") (": the fields are those after its last parenthesis, the state
    first; a process that is gone has none."""
    program = tmp_path / "a ) (b"
    program.symlink_to("/bin/sleep")
    child = subprocess.Popen([str(program), "30"])
    try:
        fields = stat_fields(child.pid)
        assert fields is not None and fields[0] in (b"R", b"S") and int(fields[1]) == os.getpid()
    finally:
        child.kill()
        child.wait()
    assert stat_fields(child.pid) is None
