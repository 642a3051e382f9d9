"""A full disk under the state directory: output that cannot be stored is counted and said, never
silently missing; the session runs on, the supervisor serves on, and storing resumes with room."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from procpilot.config import load_settings
from procpilot.engine.capture import Stream
from procpilot.engine.spawn import SpawnSpec
from procpilot.engine.supervisor import Supervisor
from procpilot.faces.capabilities import capability_tools
from procpilot.faces.exec_process import exec_process_tools

A = "agent-a"


@contextlib.contextmanager
def small_tmpfs(path: Path, size: str = "1m") -> Iterator[Path]:
    """A real filesystem of ``size`` at ``path`` (root only: skipped where mount is refused)."""
    path.mkdir(parents=True, exist_ok=True)
    mount = ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)]
    mounted = subprocess.run(mount, check=False, capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def fill(directory: Path) -> Path:
    filler = directory / "filler"
    subprocess.run(["sh", "-c", f"head -c 4000000 /dev/zero > {filler}"], check=False, capture_output=True)
    return filler


@pytest.fixture
def full_state(tmp_path: Path) -> Iterator[Path]:
    with small_tmpfs(tmp_path / "state") as state:
        yield state


async def test_output_the_disk_refuses_is_counted_and_said(full_state: Path, tmp_path: Path) -> None:
    settings = load_settings(env={}, state_dir=full_state, workspace_root=tmp_path)
    async with Supervisor(settings) as sup:
        exec_tool, process_tool = exec_process_tools(sup)
        filler = fill(full_state)

        small = await exec_tool.call({"command": "echo small"}, A)
        assert small.data["status"] == "done"  # the command itself was fine
        assert small.data["outputDropped"] == 6
        assert "6 bytes of output were lost" in small.text and "ENOSPC" in small.text

        # A 50 MB burst: the child is never blocked or killed by our full disk, and says it finished.
        burst = await exec_tool.call({"command": "head -c 50000000 /dev/zero; echo END >&2"}, A)
        assert burst.data["exitCode"] == 0 and burst.data["outputDropped"] >= 50_000_000
        log = await process_tool.call({"action": "log", "sessionId": burst.data["sessionId"]}, A)
        assert log.data["outputDropped"] >= 50_000_000 and "lost" in log.text

        filler.unlink()  # room again: what comes now is stored
        again = await exec_tool.call({"command": "echo again"}, A)
        assert again.data["output"] == "again\n" and "outputDropped" not in again.data

        space = sup.capabilities()["state_dir"]
        assert space["path"] == str(full_state) and space["free_bytes"] > 0 and space["warning"]


async def test_a_running_session_stores_again_when_room_returns(full_state: Path, tmp_path: Path) -> None:
    settings = load_settings(env={}, state_dir=full_state, workspace_root=tmp_path)
    async with Supervisor(settings) as sup:
        filler = fill(full_state)
        session = await sup.spawn(SpawnSpec("echo before; read go; echo after"), scope=A)
        await session.output.wait_for_change(10)
        filler.unlink()
        await sup.write(A, session.id, b"go\n")
        await sup.wait(A, session.id, timeout=10)
        view = session.output[Stream.STDOUT]
        assert view.lost == len(b"before\n")
        read = view.read()
        assert read.data == b"after\n" and read.dropped == len(b"before\n")  # the gap is a gap
        assert read.start == 0 and read.end == len(b"before\nafter\n")  # offsets stay truthful


async def test_spec_000_results_carry_the_loss(full_state: Path, tmp_path: Path) -> None:
    settings = load_settings(env={}, state_dir=full_state, workspace_root=tmp_path)
    async with Supervisor(settings) as sup:
        tools = {spec.name: spec for spec in capability_tools(sup)}
        fill(full_state)
        run = await tools["process.run"].call({"command": "echo", "args": ["lost"]}, A)
        assert run.data["output_dropped"] == 5 and "lost" in run.text


async def test_proc_status_carries_the_loss(full_state: Path, tmp_path: Path) -> None:
    from procpilot.faces.proc_protocol import ProcConfig, ProcHandler

    settings = load_settings(env={}, state_dir=full_state, workspace_root=tmp_path)
    async with Supervisor(settings) as sup:
        handler = ProcHandler(sup, A, ProcConfig())
        fill(full_state)
        spawned = await handler.handle({"type": "proc/spawn/req", "id": "1", "cmd": ["echo", "lost"]})
        await sup.wait(A, spawned["proc_id"], timeout=10)
        status = await handler.handle({"type": "proc/status/req", "id": "2", "proc_id": spawned["proc_id"]})
        assert status["output_dropped"] == 5
        handler.close()
