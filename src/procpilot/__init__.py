"""procpilot: a process supervisor for AI agents.

The engine (``Supervisor``) is the centre; the exec/process tools and the other faces are thin
adapters over it, and transports (MCP, CLI) carry them. Every public name is imported on first
use, so ``import procpilot`` stays light.
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from procpilot.client import AsyncClient, Client, ProcsClient
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
    from procpilot.faces.capabilities import ProcessAPI
    from procpilot.sync import SyncSupervisor

# Every name is imported on first use: ``import procpilot`` (and so every ``procpilot.x`` module,
# the command line's included) loads no engine, no pydantic model and no client until one is
# used. ``procpilot mcp`` answers a client's handshake before the engine is loaded
# (transports/mcp_handshake.py), so this costs nothing the first call does not need anyway.
# Where each public name that is not an error type lives; every other name in __all__ is one of
# procpilot.errors' (kept in one list, __all__, which type checkers read).
_LAZY = {
    "Settings": "procpilot.config",
    "load_settings": "procpilot.config",
    "Stream": "procpilot.engine.capture",
    "Limits": "procpilot.engine.limits",
    "ExitInfo": "procpilot.engine.session",
    "Session": "procpilot.engine.session",
    "SpawnSpec": "procpilot.engine.spawn",
    "SessionState": "procpilot.engine.states",
    "FileStore": "procpilot.engine.store",
    "SessionStore": "procpilot.engine.store",
    "Supervisor": "procpilot.engine.supervisor",
    "WaitOutcome": "procpilot.engine.supervisor",
    "SyncSupervisor": "procpilot.sync",
    "AsyncClient": "procpilot.client",
    "Client": "procpilot.client",
    "ProcsClient": "procpilot.client",
    "ProcessAPI": "procpilot.faces.capabilities",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name) or ("procpilot.errors" if name in __all__ else None)
    if module is None:
        raise AttributeError(f"module 'procpilot' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # once: later reads are plain attribute reads
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


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
