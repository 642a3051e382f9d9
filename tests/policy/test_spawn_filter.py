"""The per-agent spawn filter applied by the supervisor: every face gets the same box."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from procpilot.config import load_settings
from procpilot.engine.capture import Stream
from procpilot.engine.limits import Limits
from procpilot.engine.spawn import SpawnSpec
from procpilot.engine.states import SessionState
from procpilot.engine.supervisor import Supervisor
from procpilot.policy.commands import CommandDenied
from procpilot.policy.spawn_filter import ElevationDenied, LimitAboveAllocation, ProcLimit, make_spawn_filter


def settings_with(tmp_path: Path, workspace: Path, toml: str) -> Any:
    cfg = tmp_path / "policy.toml"
    cfg.write_text(toml)
    return load_settings(cfg, env={}, state_dir=tmp_path / "state", workspace_root=workspace)


async def test_allowlist_max_procs_and_elevation(tmp_path: Path, workspace: Path) -> None:
    settings = settings_with(
        tmp_path, workspace, '[policy.agents.a1]\nallow = ["sleep", "echo"]\nmax_procs = 1\n'
    )
    async with Supervisor(settings, spawn_filter=make_spawn_filter(settings)) as sup:
        with pytest.raises(CommandDenied):
            await sup.spawn(SpawnSpec("echo hi; rm -rf /tmp/nothing"), scope="a1")
        first = await sup.spawn(SpawnSpec("sleep 5"), scope="a1")
        with pytest.raises(ProcLimit):
            await sup.spawn(SpawnSpec("echo two"), scope="a1")
        other = await sup.run(SpawnSpec("rm --version"), scope="unrestricted", yield_ms=None)
        assert other.state is SessionState.EXITED_OK
        with pytest.raises(ElevationDenied):
            await sup.spawn(SpawnSpec("echo hi", elevated=True), scope="unrestricted")
        await sup.remove("a1", first.id)


async def test_the_agents_allocation_caps_and_defaults_limits(tmp_path: Path, workspace: Path) -> None:
    settings = settings_with(tmp_path, workspace, "[policy.default]\nmemory_limit = 268435456\npids_max = 64\n")
    async with Supervisor(settings, spawn_filter=make_spawn_filter(settings)) as sup:
        with pytest.raises(LimitAboveAllocation):
            await sup.spawn(SpawnSpec("true", limits=Limits(memory_bytes=1 << 30)), scope="a")
        s = await sup.run(SpawnSpec("true"), scope="a", yield_ms=None)
        assert s.spec.limits == Limits(memory_bytes=268435456, pids_max=64)


async def test_network_off_policy_applies_to_every_spawn(tmp_path: Path, workspace: Path) -> None:
    from procpilot.engine.isolation import isolation_capabilities

    if isolation_capabilities()["network_off"] is None:
        pytest.skip("no network namespace mechanism on this host")
    settings = settings_with(tmp_path, workspace, "[policy.agents.offline]\nnetwork = false\n")
    async with Supervisor(settings, spawn_filter=make_spawn_filter(settings)) as sup:
        s = await sup.run(SpawnSpec("cat /proc/net/dev | tail -n +3 | cut -d: -f1"), scope="offline", yield_ms=None)
        assert s.output[Stream.STDOUT].read().data.split() == [b"lo"]
        s = await sup.run(SpawnSpec("cat /proc/net/dev | tail -n +3 | wc -l"), scope="online", yield_ms=None)
        assert int(s.output[Stream.STDOUT].read().data) >= 1
