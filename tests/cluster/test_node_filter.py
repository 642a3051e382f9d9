"""A cluster node applies the agent's policy itself (issue 20, finding 6): the NodeAgent a Ray
actor wraps, run here on a real supervisor without Ray, gets a spec that skipped the daemon's
filter (as any driver of the Ray cluster could send it) and still boxes and checks it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from procpilot.cluster.node import NodeAgent
from procpilot.config import load_settings
from procpilot.engine.capture import Stream
from procpilot.engine.spawn import SpawnSpec
from procpilot.policy.spawn_filter import make_spawn_filter


async def test_a_node_boxes_and_checks_the_spec_it_receives(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    config = tmp_path / "procpilot.toml"
    config.write_text('[policy.agents.boxed]\nnetwork = false\ndeny = ["/usr/bin/curl"]\n')
    settings = load_settings(config, env={}, state_dir=tmp_path / "state", workspace_root=workspace)
    # What RayLauncher hands each node: the policy's filter over the nodes' settings.
    node = NodeAgent(settings, "node-" + "0" * 40, orphan_after=3600, spawn_filter=make_spawn_filter(settings))
    await node.start()
    try:
        elevated = await node.spawn("boxed", SpawnSpec("true", elevated=True))
        assert elevated.get("error") == "ElevationDenied", elevated
        if shutil.which("curl") == "/usr/bin/curl":
            denied = await node.spawn("boxed", SpawnSpec("curl --version"))
            assert denied.get("error") == "CommandDenied", denied
        # A bare spec (no isolation): the node gives it the agent's box, network off.
        started = await node.spawn("boxed", SpawnSpec("cat /proc/net/dev | tail -n +3 | wc -l"))
        assert "record" in started, started
        session = node.sup.get("boxed", started["record"]["id"])
        assert session.spec.isolation is not None and not session.spec.isolation.network
        await session.wait_finished()
        if session.state.value == "failed_to_start":
            pytest.skip(f"no network isolation on this host: {session.error}")
        assert session.output[Stream.STDOUT].read().data.strip() == b"1"  # only lo
    finally:
        await node.close()
