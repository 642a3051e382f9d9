"""The cluster's settings and placement, and the promise that one host never loads Ray."""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from procpilot.cluster.placement import NodeView, choose_node
from procpilot.config import load_settings
from procpilot.errors import ConfigError, NodeUnavailable


def test_the_default_is_one_host(tmp_path: Path) -> None:
    settings = load_settings(env={}, state_dir=tmp_path)
    assert (settings.cluster.backend, settings.cluster.address) == ("local", "auto")
    assert settings.policy.for_agent("anyone").placement is None


def test_cluster_and_placement_keys_are_read_from_the_file(tmp_path: Path) -> None:
    config = tmp_path / "procpilot.toml"
    config.write_text(
        '[cluster]\nbackend = "ray"\naddress = "10.0.0.5:6379"\n'
        '[policy.default]\nplacement = "gpu"\n[policy.agents.builder]\nplacement = "ws_builder"\n'
    )
    settings = load_settings(config, env={}, state_dir=tmp_path)
    assert (settings.cluster.backend, settings.cluster.address) == ("ray", "10.0.0.5:6379")
    assert settings.policy.for_agent("builder").placement == "ws_builder"
    assert settings.policy.for_agent("other").placement == "gpu"


def test_an_unknown_backend_names_the_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"cluster\.backend"):
        load_settings(env={}, state_dir=tmp_path, cluster={"backend": "k8s"})


def test_the_ray_backend_without_ray_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    real = importlib.util.find_spec

    def without_ray(name: str, *args: Any) -> Any:
        return None if name == "ray" else real(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", without_ray)
    with pytest.raises(ConfigError) as caught:
        load_settings(env={}, state_dir=tmp_path, cluster={"backend": "ray"})
    assert caught.value.hints["install"] == "pip install 'procpilot[ray]'"
    assert caught.value.details["key"] == "cluster.backend"


def test_the_single_host_daemon_never_imports_ray(tmp_path: Path) -> None:
    """`import procpilot` and everything `procpilot serve` builds for one host leave Ray unloaded."""
    script = f"""
import asyncio, sys
import procpilot
from procpilot.config import load_settings
from procpilot.transports import serve
settings = load_settings(env={{}}, state_dir={str(tmp_path / "state")!r}, workspace_root={str(tmp_path)!r})
async def main():
    async with serve.make_supervisor(settings) as sup, serve.daemon_app(sup, settings):
        pass
asyncio.run(main())
loaded = sorted(m for m in sys.modules if m == "ray" or m.startswith(("ray.", "procpilot.cluster")))
assert not loaded, loaded
print("clean")
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False)
    assert done.stdout.strip() == "clean", done.stderr


def _nodes(*sessions: int, offered: dict[int, dict[str, float]] | None = None) -> list[NodeView]:
    return [NodeView(f"n{i}", (offered or {}).get(i, {"CPU": 1.0}), count) for i, count in enumerate(sessions)]


def test_placement_pins_to_the_nodes_offering_the_resource() -> None:
    nodes = _nodes(0, 5, 7, offered={1: {"ws_b": 1.0}, 2: {"ws_b": 1.0}})
    assert choose_node(nodes, "ws_b") == "n1"  # the less busy of the two that offer it
    assert choose_node(nodes, None) == "n0"


def test_placement_spreads_and_breaks_ties_by_join_order() -> None:
    assert choose_node(_nodes(2, 1, 1), None) == "n1"
    assert choose_node(_nodes(0, 0), None) == "n0"


def test_a_resource_no_node_offers_is_node_unavailable() -> None:
    with pytest.raises(NodeUnavailable) as caught:
        choose_node(_nodes(0, offered={0: {"CPU": 1.0, "ws_a": 1.0, "node:127.0.0.1": 1.0}}), "ws_b")
    assert caught.value.http_status == 503
    assert "ws_a" in caught.value.hints["placement"] and "node:" not in caught.value.hints["placement"]
    with pytest.raises(NodeUnavailable):
        choose_node([], None)


@pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="Ray is not installed (the ray extra)")
def test_serve_refuses_at_once_when_no_cluster_answers(tmp_path: Path) -> None:
    with socket.socket() as probe:  # a loopback port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    config = tmp_path / "procpilot.toml"
    config.write_text(
        f'state_dir = "state"\nworkspace_root = "."\n[cluster]\nbackend = "ray"\naddress = "127.0.0.1:{port}"\n'
        "[server]\nport = 0\n"
    )
    done = subprocess.run(
        [str(Path(sys.executable).parent / "procpilot"), "serve", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "HOME": str(tmp_path)},
    )
    assert done.returncode != 0
    assert "ServeRefused: no Ray cluster answers at" in done.stderr
    assert "ray start --head" in done.stderr and "tokens" not in done.stderr  # its own hint, not the binding's
    assert "Traceback" not in done.stderr
