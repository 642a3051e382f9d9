"""The layering docs/architecture.md draws, checked: the engine knows nothing of the policy, the faces or the
transports, and no face or policy module reaches up into a transport."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "procpilot"
_ABOVE_THE_ENGINE = ("procpilot.faces", "procpilot.policy", "procpilot.transports", "procpilot.client")
_BESIDE_THE_ENGINE = ("procpilot.config", "procpilot.render", "procpilot.contract", "procpilot.sync")
FORBIDDEN = {
    # the error tree is the root: everything imports it, it imports nothing of ours
    "errors.py": ("procpilot.",),
    # ending tasks without losing the caller's cancellation: used from the engine to the client
    "aio.py": ("procpilot.",),
    # reading shell text sits just above it: the engine, the policy and render all read shell here
    "shell": ("procpilot.engine", *_BESIDE_THE_ENGINE, *_ABOVE_THE_ENGINE),
    # settings and text rendering sit beside the engine and serve every layer
    "config.py": ("procpilot.engine", *_ABOVE_THE_ENGINE),
    "render.py": ("procpilot.engine", *_ABOVE_THE_ENGINE),
    "engine": _ABOVE_THE_ENGINE,
    # the cluster is the engine spread over nodes: it reads the engine and the settings, no layer above
    "cluster": _ABOVE_THE_ENGINE,
    # the policy reads the contract (tool specs, tiers), never a face
    "policy": ("procpilot.faces", "procpilot.transports", "procpilot.client"),
    "contract.py": ("procpilot.engine", *_ABOVE_THE_ENGINE),
    # the synchronous facade wraps the supervisor and nothing above it
    "sync.py": _ABOVE_THE_ENGINE,
    "faces": ("procpilot.transports", "procpilot.client"),
    # the client talks to a daemon over the wire; it never runs the engine itself
    "client.py": ("procpilot.engine", "procpilot.policy", "procpilot.transports"),
    # transports carry bytes: they hold the supervisor and hear its events, and leave what a
    # session's output or state means to the faces (no capture, no states, no render)
    "transports": ("procpilot.engine.", "procpilot.render"),
    # the server side of the transports answers with the error tree, never the client's lookups
    "transports/http": ("procpilot.client",),
    "transports/serve.py": ("procpilot.client",),
    "transports/mcp.py": ("procpilot.client",),
    "transports/mcp_serve.py": ("procpilot.client",),
    "transports/connections.py": ("procpilot.client",),
}


def imported_modules(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "import_module" and node.args:
            first = node.args[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                found.add(first.value)
    return found


# What a layer may import although a rule above forbids its prefix: the engine's front door.
ALLOWED = {
    "transports": {"procpilot.engine.supervisor", "procpilot.engine.events", "procpilot.engine.session"},
}


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_a_layer_imports_nothing_above_it(layer: str) -> None:
    files = sorted((SRC / layer).rglob("*.py")) if (SRC / layer).is_dir() else [SRC / layer]
    assert files
    for path in files:
        for module in imported_modules(path):
            allowed = module in ALLOWED.get(layer, ())
            assert allowed or not module.startswith(FORBIDDEN[layer]), f"{path.relative_to(SRC)} imports {module}"


def test_every_module_is_under_a_rule() -> None:
    """A new module or package is placed in the layering on purpose, not by omission."""
    ruled = [SRC / layer for layer in FORBIDDEN]
    for path in sorted(SRC.rglob("*.py")):
        if path == SRC / "__init__.py":  # the public API: it re-exports every layer
            continue
        assert any(path == rule or rule in path.parents for rule in ruled), f"{path.relative_to(SRC)} has no rule"

