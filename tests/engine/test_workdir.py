"""The working directory a command runs in is the one that was checked: a path swapped for a symlink
between the check and the spawn cannot lead a command out of the workspace."""

from __future__ import annotations

from pathlib import Path

import pytest

from procpilot.config import Settings
from procpilot.engine.capture import Stream
from procpilot.engine.spawn import SpawnSpec
from procpilot.engine.supervisor import Supervisor
from procpilot.errors import PathOutOfScope
from procpilot.faces.exec_process import exec_process_tools


def swap_for_symlink(directory: Path, target: Path) -> None:
    directory.rename(directory.with_name(directory.name + "-moved"))
    directory.symlink_to(target)


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    path = tmp_path / "outside"
    path.mkdir()
    return path


@pytest.mark.parametrize("target", ["outside", "sibling"])
async def test_a_workdir_swapped_after_the_check_is_refused(
    settings: Settings, workspace: Path, outside: Path, target: str
) -> None:
    # sibling: <root>-evil begins with the root's text but is not under it; the check where the
    # child enters its directory compares whole path components.
    if target == "sibling":
        outside = workspace.with_name(workspace.name + "-evil")
        outside.mkdir()
    sub = workspace / "sub"
    sub.mkdir()

    def swap_then_allow(scope: str, spec: SpawnSpec, running: int) -> SpawnSpec:
        swap_for_symlink(sub, outside)  # the race, made certain: after the face's check, before the spawn
        return spec

    async with Supervisor(settings, spawn_filter=swap_then_allow) as sup:
        (exec_tool, *_) = exec_process_tools(sup)
        result = await exec_tool.call({"command": "touch escaped; pwd", "workdir": "sub"}, "me")
    assert result.is_error and result.data["error"] == "PathOutOfScope"
    assert not (outside / "escaped").exists()


async def test_a_symlink_inside_the_workspace_still_works(supervisor: Supervisor, workspace: Path) -> None:
    (workspace / "real").mkdir()
    (workspace / "link").symlink_to(workspace / "real")
    spec = SpawnSpec("pwd", cwd=workspace / "link", workspace=workspace)
    session = await supervisor.run(spec, scope="me", yield_ms=None)
    assert session.output[Stream.STDOUT].read().data.decode().strip() == str(workspace / "real")


async def test_engine_refuses_a_workdir_that_leads_out(supervisor: Supervisor, workspace: Path, outside: Path) -> None:
    (workspace / "out").symlink_to(outside)
    with pytest.raises(PathOutOfScope):
        await supervisor.run(SpawnSpec("true", cwd=workspace / "out", workspace=workspace), scope="me", yield_ms=None)


@pytest.mark.parametrize("warm_shells", [0, 2])
async def test_a_workspace_of_root_runs_in_any_directory(settings: Settings, tmp_path: Path, warm_shells: int) -> None:
    # Every absolute path lies under /: the check where the child enters its directory must not
    # ask for a "//" prefix. Cold and warm starts check it each their own way.
    async with Supervisor(settings, warm_shells=warm_shells) as sup:
        spec = SpawnSpec("pwd", cwd=tmp_path, workspace=Path("/"))
        session = await sup.run(spec, scope="me", yield_ms=None)
    assert session.exit_code == 0
    assert session.output[Stream.STDOUT].read().data.decode().strip() == str(tmp_path.resolve())
