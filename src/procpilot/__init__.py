"""procpilot: a process supervisor for AI agents.

The engine (``Supervisor``) is the centre; the exec/process tools and the other faces are thin
adapters over it, and transports (MCP, CLI) carry them. ``Client``, ``AsyncClient`` and
``ProcsClient`` (talking to a running daemon) and ``ProcessAPI`` (spec 000 in-process) are imported
on first use, so ``import procpilot`` stays light.
"""

from typing import TYPE_CHECKING, Any

from procpilot.config import Settings, load_settings
from procpilot.engine.capture import Stream
from procpilot.engine.limits import Limits
from procpilot.engine.session import ExitInfo, Session
from procpilot.engine.spawn import SpawnSpec
from procpilot.engine.states import SessionState
from procpilot.engine.store import FileStore, SessionStore
from procpilot.engine.supervisor import Supervisor, WaitOutcome
from procpilot.errors import (
    ApprovalDenied,
    CommandDenied,
    CommandNotFound,
    ConfigError,
    ElevationDenied,
    InternalError,
    InvalidArgument,
    InvalidFilter,
    InvalidPattern,
    InvalidStream,
    IsolationUnavailable,
    KillFailed,
    LimitAboveAllocation,
    NotSupported,
    PathOutOfScope,
    PermissionDenied,
    ProcessAlreadyExited,
    ProcessNotFound,
    ProcLimit,
    ProcpilotError,
    ProtectedVariable,
    SessionNotFound,
    SessionStateError,
    SessionStillRunning,
    SpawnError,
    SpawnFailed,
    StateDirBusy,
    StateDirDamaged,
    StateDirIncompatible,
    StdinClosed,
    UnanalyzableCommand,
)
from procpilot.sync import SyncSupervisor

if TYPE_CHECKING:
    from procpilot.client import AsyncClient, Client, ProcsClient
    from procpilot.faces.capabilities import ProcessAPI

_LAZY = {
    "AsyncClient": "procpilot.client",
    "Client": "procpilot.client",
    "ProcsClient": "procpilot.client",
    "ProcessAPI": "procpilot.faces.capabilities",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'procpilot' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)


__all__ = [
    "ApprovalDenied",
    "AsyncClient",
    "Client",
    "CommandDenied",
    "CommandNotFound",
    "ConfigError",
    "ElevationDenied",
    "ExitInfo",
    "FileStore",
    "InternalError",
    "InvalidArgument",
    "InvalidFilter",
    "InvalidPattern",
    "InvalidStream",
    "IsolationUnavailable",
    "KillFailed",
    "LimitAboveAllocation",
    "Limits",
    "NotSupported",
    "PathOutOfScope",
    "PermissionDenied",
    "ProcLimit",
    "ProcessAPI",
    "ProcessAlreadyExited",
    "ProcessNotFound",
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
    "UnanalyzableCommand",
    "WaitOutcome",
    "load_settings",
]
