"""Shared fixtures. After every test: no process carrying a session marker survives, no fd leaked."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from procpilot.config import Settings, load_settings
from procpilot.engine.supervisor import Supervisor
from procpilot.engine.trees import MARKER_ENV

PROGRAMS = Path(__file__).parent / "programs"
PY = sys.executable


def marked_processes() -> list[int]:
    """Pids of live processes started by any procpilot supervisor (they carry the marker)."""
    found = []
    needle = f"{MARKER_ENV}=".encode()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                env = f.read()
            with open(f"/proc/{name}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue
        if state != b"Z" and any(item.startswith(needle) for item in env.split(b"\0")):
            found.append(int(name))
    return found


def open_fds() -> set[int]:
    return {int(fd) for fd in os.listdir("/proc/self/fd")}


@pytest.fixture(autouse=True)
def _no_leaks() -> Iterator[None]:
    before = open_fds()
    yield
    deadline = time.monotonic() + 5
    while marked_processes() and time.monotonic() < deadline:
        time.sleep(0.05)
    survivors = marked_processes()
    assert not survivors, f"processes outlived the test: {survivors}"
    leaked = open_fds() - before
    # An fd closed by the kernel lags nothing; a leaked one stays: give GC one chance first.
    if leaked:
        import gc

        gc.collect()
        leaked = {fd for fd in open_fds() - before if os.path.exists(f"/proc/self/fd/{fd}")}
    assert not leaked, f"file descriptors leaked: {[(fd, _describe(fd)) for fd in leaked]}"


def _describe(fd: int) -> str:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return "?"


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    return ws


@pytest.fixture
def settings(tmp_path: Path, workspace: Path) -> Settings:
    return load_settings(env={}, state_dir=tmp_path / "state", workspace_root=workspace)


@pytest.fixture
async def supervisor(settings: Settings) -> AsyncIterator[Supervisor]:
    async with Supervisor(settings) as sup:
        yield sup
