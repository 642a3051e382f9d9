"""The public surface is deliberate: adding or dropping a name here is a decision, not an accident."""

from __future__ import annotations

import subprocess
import sys

import procpilot

PUBLIC = {
    "UnanalyzableCommand",
    "ProcessNotFound",
    "ProcLimit",
    "PermissionDenied",
    "LimitAboveAllocation",
    "IsolationUnavailable",
    "ElevationDenied",
    "CommandDenied",
    "ApprovalDenied",
    "AsyncClient",
    "Client",
    "CommandNotFound",
    "ConfigError",
    "ExitInfo",
    "FileStore",
    "InternalError",
    "InvalidArgument",
    "InvalidFilter",
    "InvalidPattern",
    "InvalidStream",
    "KillFailed",
    "Limits",
    "NotSupported",
    "PathOutOfScope",
    "ProcessAPI",
    "ProcessAlreadyExited",
    "ProcpilotError",
    "ProcsClient",
    "ProtectedVariable",
    "Session",
    "SessionNotFound",
    "SessionState",
    "SessionStateError",
    "SessionStillRunning",
    "SessionStore",
    "Settings",
    "SpawnError",
    "SpawnFailed",
    "SpawnSpec",
    "StateDirBusy",
    "StateDirDamaged",
    "StateDirIncompatible",
    "StdinClosed",
    "Stream",
    "Supervisor",
    "SyncSupervisor",
    "WaitOutcome",
    "load_settings",
}


def test_all_is_the_public_surface() -> None:
    assert set(procpilot.__all__) == PUBLIC
    assert procpilot.__all__ == sorted(procpilot.__all__)


def test_every_public_name_resolves() -> None:
    for name in procpilot.__all__:
        assert getattr(procpilot, name) is not None, name
    from procpilot.client import Client

    assert procpilot.Client is Client


def test_importing_procpilot_does_not_load_the_clients() -> None:
    code = "import sys, procpilot; print('procpilot.client' in sys.modules, 'websockets' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]
