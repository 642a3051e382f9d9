"""The Launcher seam (engine/launcher.py): the Supervisor is composed with where sessions run,
never subclassed, and nothing passes parameters to it out of band."""

from __future__ import annotations

import ast
import importlib
import pkgutil
from pathlib import Path

import pytest

import procpilot
from procpilot.engine.supervisor import Supervisor

SRC = Path(procpilot.__file__).parent


def test_no_class_subclasses_the_supervisor() -> None:
    """A cluster (or any other place to run sessions) is a Launcher given to the Supervisor."""
    pytest.importorskip("ray")
    import procpilot.cluster

    for module in pkgutil.iter_modules(procpilot.cluster.__path__, "procpilot.cluster."):
        importlib.import_module(module.name)
    launcher = importlib.import_module("procpilot.cluster.launcher")
    assert Supervisor.__subclasses__() == []
    assert not issubclass(launcher.RayLauncher, Supervisor)


def test_no_context_variable_carries_parameters_in_the_engine() -> None:
    found = []
    for path in sorted((SRC / "engine").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""
            if name == "ContextVar":
                found.append(f"{path.name}:{node.lineno}")
    assert found == []
