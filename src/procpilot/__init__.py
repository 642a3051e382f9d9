"""procpilot: a process supervisor for AI agents.

The engine (``Supervisor``) is the centre; the exec/process tools and the other faces are thin
adapters over it, and transports (MCP, CLI) carry them.
"""

from procpilot.config import Settings, load_settings
from procpilot.engine.capture import Stream
from procpilot.engine.session import ExitInfo, Session
from procpilot.engine.spawn import SpawnSpec
from procpilot.engine.states import SessionState
from procpilot.engine.supervisor import Supervisor, WaitOutcome
from procpilot.errors import (
    CommandNotFound,
    ConfigError,
    InvalidArgument,
    InvalidFilter,
    InvalidPattern,
    InvalidStream,
    KillFailed,
    NotSupported,
    PathOutOfScope,
    ProcessAlreadyExited,
    ProcpilotError,
    ProtectedVariable,
    SessionNotFound,
    SessionStateError,
    SessionStillRunning,
    SpawnError,
    SpawnFailed,
    StdinClosed,
)
from procpilot.sync import SyncSupervisor

__all__ = [
    "CommandNotFound",
    "ConfigError",
    "ExitInfo",
    "InvalidArgument",
    "InvalidFilter",
    "InvalidPattern",
    "InvalidStream",
    "KillFailed",
    "NotSupported",
    "PathOutOfScope",
    "ProcessAlreadyExited",
    "ProcpilotError",
    "ProtectedVariable",
    "Session",
    "SessionNotFound",
    "SessionState",
    "SessionStateError",
    "SessionStillRunning",
    "Settings",
    "SpawnError",
    "SpawnFailed",
    "SpawnSpec",
    "StdinClosed",
    "Stream",
    "Supervisor",
    "SyncSupervisor",
    "WaitOutcome",
    "load_settings",
]
