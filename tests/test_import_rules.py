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
    # so is the one serialisation of agent-supplied text: every writer imports it
    "wire.py": ("procpilot.",),
    # ending tasks without losing the caller's cancellation: used from the engine to the client
    "aio.py": ("procpilot.",),
    # agents taking turns at the daemon: the transports hold the calls, the engine and the policy
    # give a call's turn back while they wait; it reads only the error tree (TooManyRequests)
    "turns.py": (
        "procpilot.engine",
        "procpilot.shell",
        "procpilot.cluster",
        "procpilot.wire",
        "procpilot.aio",
        *_BESIDE_THE_ENGINE,
        *_ABOVE_THE_ENGINE,
    ),
    # the chat a call comes from, as its caller says: the transports set it, the policy and the
    # faces read it; it reads only the error tree (InvalidArgument)
    "chat_context.py": (
        "procpilot.engine",
        "procpilot.shell",
        "procpilot.cluster",
        "procpilot.wire",
        "procpilot.aio",
        "procpilot.turns",
        *_BESIDE_THE_ENGINE,
        *_ABOVE_THE_ENGINE,
    ),
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
    # the server side of the transports answers with the error tree, never the client's lookups;
    # a route reads the daemon's state (http/daemon.py), never the composition root that built it
    "transports/http": ("procpilot.client", "procpilot.transports.serve", "procpilot.transports.mcp_serve"),
    # MCP over stdio shares nothing with the daemon's HTTP app (the SDK's internals: mcp_sdk.py)
    "transports/mcp_stdio.py": ("procpilot.client", "procpilot.transports.http"),
    "transports/mcp_direct.py": ("procpilot.client", "procpilot.transports.http"),
    "transports/mcp_results.py": ("procpilot.client", "procpilot.transports.http"),
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
    # state_files: daemon.json and audit.jsonl live in the state directory, under its rules of damage.
    "transports": {
        "procpilot.engine.supervisor",
        "procpilot.engine.events",
        "procpilot.engine.session",
        "procpilot.engine.state_files",
        # scopes: which agent a conversation's scope belongs to (the console groups sessions by agent)
        "procpilot.engine.scopes",
    },
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


# -- one graph: no circle, no private name across modules ----------------------------------------


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(path): path for path in SRC.rglob("*.py")}


def _absolute(module: str, node: ast.ImportFrom) -> str:
    """The module an ``from X import ...`` names, relative imports resolved."""
    if not node.level:
        return node.module or ""
    package = module if MODULES[module].name == "__init__.py" else module.rpartition(".")[0]
    base = package.split(".")[: len(package.split(".")) - node.level + 1]
    return ".".join([*base, *([node.module] if node.module else [])])


def _imports(module: str) -> tuple[set[str], list[str]]:
    """What ``module`` imports of procpilot, every import counted (under TYPE_CHECKING, inside a
    function), and each private name it takes from another module (``from m import _x`` or
    ``m._x`` on a module it imported)."""
    tree = ast.parse(MODULES[module].read_text(), str(MODULES[module]))
    edges: set[str] = set()
    private: list[str] = []
    aliases: dict[str, str] = {}  # a local name bound to one of our modules
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in MODULES:
                    edges.add(alias.name)
                    if alias.asname:
                        aliases[alias.asname] = alias.name
        elif isinstance(node, ast.ImportFrom):
            source = _absolute(module, node)
            if not source.startswith("procpilot"):
                continue
            for alias in node.names:
                submodule = f"{source}.{alias.name}"
                if submodule in MODULES:  # from a package import one of its modules
                    edges.add(submodule)
                    aliases[alias.asname or alias.name] = submodule
                    continue
                if source in MODULES:
                    edges.add(source)
                if alias.name.startswith("_"):
                    private.append(f"{module} imports {alias.name} from {source}")
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases):
            continue
        if node.attr.startswith("_") and not node.attr.startswith("__"):
            private.append(f"{module} reads {aliases[node.value.id]}.{node.attr}")
    edges.discard(module)
    return edges, private


def _circles(edges: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.add(member)
                    if member == node:
                        break
                if len(group) > 1:
                    found.append(frozenset(group))
    return found


# What remains in modules another branch owns, each named so it can be cleared there (issue 22).
CIRCLES_ALLOWED: dict[str, frozenset[str]] = {}
PRIVATE_ALLOWED: dict[str, str] = {}  # name -> "module imports _x from source" / "module reads source._x"


def test_the_import_graph_has_no_circle() -> None:
    """Type-only imports count too: a circle is one module that cannot be read without the other."""
    edges = {module: _imports(module)[0] & MODULES.keys() for module in MODULES}
    circles = _circles(edges)
    allowed = set(CIRCLES_ALLOWED.values())
    assert [sorted(c) for c in circles if c not in allowed] == []
    stale = [name for name, group in CIRCLES_ALLOWED.items() if group not in circles]
    assert stale == [], f"{stale} no longer form a circle: take them off CIRCLES_ALLOWED"


def test_no_private_name_is_used_across_modules() -> None:
    found = [line for module in sorted(MODULES) for line in _imports(module)[1]]
    assert [line for line in found if line not in PRIVATE_ALLOWED.values()] == []
    stale = [name for name, line in PRIVATE_ALLOWED.items() if line not in found]
    assert stale == [], f"{stale} are gone: take them off PRIVATE_ALLOWED"


def test_the_checks_see_what_they_look_for() -> None:
    """The walker finds a circle when there is one, and none where there is none."""
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [frozenset("abc")]
    assert _circles({"a": {"b"}, "b": set()}) == []
