"""Every code example in the docs runs: a Python block as a program against a real daemon, a TOML
block through the config loader, a JSON block as JSON naming real tools and arguments."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from procpilot.config import load_settings
from procpilot.faces.all_tools import definitions_json
from tests.daemon import TOKEN_A, Served, cli_env, start_daemon

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
_FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.M | re.S)


def examples(language: str) -> list[Any]:
    """Each ``language`` block of the docs, named ``file:line`` for the test id."""
    found = []
    for doc in DOCS:
        text = doc.read_text()
        for match in _FENCE.finditer(text):
            if match[1] == language:
                line = text.count("\n", 0, match.start()) + 1
                found.append(pytest.param(match[2], id=f"{doc.relative_to(ROOT)}:{line}"))
    return found


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    daemon = start_daemon(tmp_path_factory.mktemp("docs"))
    yield daemon
    assert daemon.stop() == 0, daemon.log_text()


@pytest.mark.parametrize("code", examples("python"))
def test_python_example_runs(code: str, served: Served, tmp_path: Path) -> None:
    # The examples reach the daemon the way a reader's program would: PROCPILOT_URL/TOKEN; an
    # in-process Supervisor keeps its state in a directory of its own.
    env = cli_env(
        PROCPILOT_URL=served.url,
        PROCPILOT_TOKEN=TOKEN_A,
        PROCPILOT_STATE_DIR=str(tmp_path / "state"),
        PROCPILOT_WORKSPACE=str(tmp_path),
    )
    script = tmp_path / "example.py"
    script.write_text(code)
    done = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert "b'" not in done.stdout  # text for people, not bytes


@pytest.mark.parametrize("code", examples("toml"))
def test_toml_example_loads(code: str, tmp_path: Path) -> None:
    config = tmp_path / "procpilot.toml"
    config.write_text(code)
    load_settings(config, env={})  # a ConfigError names the key the docs got wrong


_TOOLS = {definition["name"]: definition for definition in json.loads(definitions_json("mcp"))}


@pytest.mark.parametrize("code", examples("json"))
def test_json_example_parses_and_names_real_tools(code: str) -> None:
    try:
        values = [json.loads(code)]
    except json.JSONDecodeError:
        values = [json.loads(line) for line in code.splitlines() if line.strip()]  # one call per line
    for value in values:
        if "tool" not in value:
            continue
        arguments = {key: item for key, item in value.items() if key != "tool"}
        schema = _TOOLS[value["tool"]]["inputSchema"]
        unknown = set(arguments) - set(schema["properties"])
        assert not unknown, f"{value['tool']} has no argument {unknown}"
        if "action" in arguments:
            actions = re.findall(r"[\w-]+", _TOOLS[value["tool"]]["description"])  # it names every action
            assert arguments["action"] in actions, f"{value['tool']} has no action {arguments['action']}"


def test_every_test_security_md_names_exists() -> None:
    # docs/security.md pairs each promise with the test that attacks it: a renamed or deleted
    # test would leave a promise that reads as checked and is not.
    table = (ROOT / "docs" / "security.md").read_text().split("## Every promise, and the test that attacks it")[1]
    named, current = [], None
    for ref in re.findall(r"`(tests/[\w/]+\.py)?(?:::(\w+))?`", table):
        current = ref[0] or current
        assert current is not None
        named.append((current, ref[1]))
    assert len(named) > 40
    missing = [
        f"{path}::{name}"
        for path, name in named
        if not (ROOT / path).is_file() or (name and not re.search(rf"def {name}\b", (ROOT / path).read_text()))
    ]
    assert not missing, missing


def _defined(path: Path, name: str) -> bool:
    """Whether ``name`` (a function or class, or ``Class.method``) is defined at the top of ``path``."""
    tree = ast.parse(path.read_text())
    outer, _, inner = name.partition(".")
    kinds = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    for node in tree.body:
        if isinstance(node, kinds) and node.name == outer:
            if not inner:
                return True
            return isinstance(node, ast.ClassDef) and any(
                isinstance(item, kinds) and item.name == inner for item in node.body
            )
    return False


def test_the_walk_of_one_call_names_real_files_and_functions() -> None:
    # docs/architecture.md walks one exec call through the files it crosses, naming each
    # function: a reader checks it against the code, and so does this, so a rename shows here.
    text = (ROOT / "docs" / "architecture.md").read_text()
    walk = text.split("## One call, walked through")[1].split("\n## ")[0]
    src = ROOT / "src" / "procpilot"
    stops = re.findall(r"^\d+\. \*\*`([\w/]+\.py)`\*\* — (.*?):", walk, re.M | re.S)
    named = [(file, name) for file, chain in stops for name in re.findall(r"`([\w.]+)`", chain)]
    named += re.findall(r"`([\w/]+\.py)`'s `([\w.]+)`", walk)  # a helper's function, named in passing
    files = [file for file, _ in stops]
    assert len(files) == len(set(files)) <= 12, files  # at most 12 files, each one stop
    assert len(named) > 25
    paths = set(re.findall(r"`([\w/]+\.py)`", walk))
    missing = [p for p in paths if not (ROOT / p if p.startswith("tests/") else src / p).is_file()]
    assert not missing, missing
    undefined = [f"{file}: {name}" for file, name in named if not _defined(src / file, name)]
    assert not undefined, undefined
