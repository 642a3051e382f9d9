"""The Launcher seam (engine/launcher.py): the Supervisor is composed with where sessions run,
never subclassed, and nothing passes parameters to it out of band."""

from __future__ import annotations

import ast
import importlib
import pkgutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

import procpilot
from procpilot.config import Settings
from procpilot.engine.launcher import LaunchHost
from procpilot.engine.session import Session
from procpilot.engine.spawn import SpawnSpec
from procpilot.engine.supervisor import Supervisor
from procpilot.errors import ProcpilotError, SpawnError

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


class _Recording:
    """A launcher that runs nothing (a cluster with no node): it records what the supervisor asks.
    (``Supervisor(launcher=...)`` is typed as the ``Launcher`` protocol: mypy checks its shape.)"""

    def __init__(self, *, fail_open: bool = False) -> None:
        self.calls: list[str] = []
        self.host: LaunchHost | None = None
        self.launched: list[tuple[SpawnSpec, str, str | None]] = []
        self.fail_open = fail_open
        self.grace: float | None = None

    def bind(self, host: LaunchHost) -> None:
        self.calls.append("bind")
        self.host = host

    async def open(self) -> None:
        self.calls.append("open")
        if self.fail_open:
            raise SpawnError("the cluster cannot be reached")

    async def launch(self, spec: SpawnSpec, scope: str, session_id: str | None) -> Session:
        self.launched.append((spec, scope, session_id))
        raise SpawnError("no node can run it")

    async def launch_queued(self, session: Session) -> None:
        raise AssertionError("nothing is ever queued here")

    def finished(self, session: Session) -> None:
        self.calls.append("finished")

    def forgotten(self, session: Session) -> None:
        self.calls.append("forgotten")

    async def close(self, grace: float) -> None:
        self.calls.append("close")
        self.grace = grace

    async def observe(self, sessions: Sequence[Session]) -> None:
        self.calls.append("observe")

    def capabilities(self) -> dict[str, Any]:
        return {"cluster": {"nodes": 0}}


async def test_a_launcher_is_bound_opened_asked_and_closed_by_its_supervisor(settings: Settings) -> None:
    launcher = _Recording()
    sup = Supervisor(settings, launcher=launcher)
    assert launcher.calls == ["bind"]  # bound once, as the supervisor is made
    assert launcher.host is not None and launcher.host.settings is settings
    async with sup:
        assert launcher.calls == ["bind", "open"]
        assert sup.capabilities()["cluster"] == {"nodes": 0}  # what it adds is reported
        assert launcher.host.sessions() == []
        for _ in range(2):  # a failed launch gives its name back: the second try reaches it too
            with pytest.raises(SpawnError, match="no node"):
                await sup.run(SpawnSpec("echo hi", name="job"), scope="a", yield_ms=None)
        assert [(spec.command, scope) for spec, scope, _ in launcher.launched] == [("echo hi", "a")] * 2
    assert launcher.calls[-1] == "close"
    assert launcher.grace == settings.engine.kill_grace_sec


async def test_a_launcher_that_cannot_open_closes_its_supervisor(settings: Settings) -> None:
    launcher = _Recording(fail_open=True)
    sup = Supervisor(settings, launcher=launcher)
    with pytest.raises(SpawnError, match="cannot be reached"):
        await sup.__aenter__()
    assert launcher.calls == ["bind", "open", "close"]  # not left half started
    with pytest.raises(ProcpilotError):
        await sup.run(SpawnSpec("echo hi"), scope="a", yield_ms=None)
