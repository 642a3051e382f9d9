"""One error tree for every face.

    ProcpilotError
    ├── InvalidArgument (ValueError)      a request field is missing, malformed or out of range
    │   ├── InvalidFilter                 process.list state_filter is not a known state
    │   ├── InvalidStream                 a stream name is not stdout / stderr / both / combined
    │   └── InvalidPattern                a wait pattern is not a valid regular expression
    ├── SessionNotFound (LookupError)     no session with that id in the caller's scope
    ├── SessionStateError                 the session is in the wrong state for the action
    │   ├── ProcessAlreadyExited          kill/write on a session that has ended
    │   ├── SessionStillRunning           clear on a session that is still running
    │   └── StdinClosed                   write after eof, or on a session without a stdin pipe
    ├── SpawnError (OSError-like)         the command could not be started
    │   ├── CommandNotFound               the executable is not on PATH / does not exist
    │   ├── PathOutOfScope                the working directory is outside the workspace
    │   ├── ProtectedVariable             an env override of a protected variable
    │   └── SpawnFailed                   any other OS refusal (permissions, limits)
    ├── ResourceLimitExceeded             the process was killed for passing its memory limit
    ├── KillFailed                        the OS refused to deliver a signal
    ├── NotSupported                      the feature is not available (yet) here
    ├── InternalError                     a bug in procpilot: the call failed, the server lives on
    └── ConfigError (ValueError)          a configuration file or env var is invalid

Every class carries a stable ``code`` (the name agents see) and ``hints``: what to do next.
Faces render these; they never show a traceback.
"""

from __future__ import annotations

from typing import Any, ClassVar

__all__ = [
    "CommandNotFound",
    "ConfigError",
    "InternalError",
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
    "ResourceLimitExceeded",
    "SessionNotFound",
    "SessionStateError",
    "SessionStillRunning",
    "SpawnError",
    "SpawnFailed",
    "StdinClosed",
]


class ProcpilotError(Exception):
    """Base of every error procpilot raises on purpose."""

    default_hints: ClassVar[dict[str, str]] = {}

    def __init__(self, message: str, *, hints: dict[str, str] | None = None, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.hints: dict[str, str] = dict(self.default_hints) | (hints or {})
        self.details: dict[str, Any] = details

    @property
    def code(self) -> str:
        """The error's name as agents see it, e.g. ``CommandNotFound``."""
        return type(self).__name__

    def to_dict(self) -> dict[str, Any]:
        return {"error": self.code, "message": self.message, "hints": self.hints, **self.details}

    def __repr__(self) -> str:
        return f"{self.code}({self.message!r})"


class InvalidArgument(ProcpilotError, ValueError):
    default_hints: ClassVar[dict[str, str]] = {
        "fix_arguments": "Correct the named field and call again; the tool's input schema lists every field.",
    }


class InvalidFilter(InvalidArgument):
    default_hints: ClassVar[dict[str, str]] = {
        "use_valid_filter": "Use one of: 'running', 'completed', 'killed', 'timed_out', 'all'.",
    }


class InvalidStream(InvalidArgument):
    default_hints: ClassVar[dict[str, str]] = {
        "use_valid_stream": "Use one of: 'stdout', 'stderr', 'both'.",
    }


class InvalidPattern(InvalidArgument):
    default_hints: ClassVar[dict[str, str]] = {
        "fix_pattern": "Pass a Python regular expression; escape literal characters such as ( [ . * +.",
    }


class SessionNotFound(ProcpilotError, LookupError):
    default_hints: ClassVar[dict[str, str]] = {
        "list_processes": "List your sessions (process list / process.list) to see the ids that exist.",
    }


class SessionStateError(ProcpilotError):
    pass


class ProcessAlreadyExited(SessionStateError):
    default_hints: ClassVar[dict[str, str]] = {
        "check_status": "Poll or monitor the session to see its final state and exit code.",
    }


class SessionStillRunning(SessionStateError):
    default_hints: ClassVar[dict[str, str]] = {
        "kill_first": "Kill the session first, or use remove, which kills and then clears.",
    }


class StdinClosed(SessionStateError):
    default_hints: ClassVar[dict[str, str]] = {
        "start_again": "Stdin was closed (eof) or never opened; start a new session to send more input.",
    }


class SpawnError(ProcpilotError):
    pass


class CommandNotFound(SpawnError):
    default_hints: ClassVar[dict[str, str]] = {
        "check_path": "Run `which <command>` to check if the command is installed.",
        "use_full_path": "Specify the full absolute path to the executable.",
    }


class PathOutOfScope(SpawnError):
    default_hints: ClassVar[dict[str, str]] = {
        "check_scope": "Use a working directory inside the workspace root, or omit it to use the root.",
    }


class ProtectedVariable(SpawnError):
    default_hints: ClassVar[dict[str, str]] = {
        "drop_variable": "Remove the protected variable from the environment overrides.",
    }


class SpawnFailed(SpawnError):
    default_hints: ClassVar[dict[str, str]] = {
        "check_permissions": "Verify the command is executable and the sandbox has required permissions.",
        "retry": "Retry the operation.",
    }


class ResourceLimitExceeded(ProcpilotError):
    """The process was killed because it passed a limit; details say which (``limit``) and the peak."""

    default_hints: ClassVar[dict[str, str]] = {
        "increase_limits": "Retry with higher cpu_limit or memory_limit if within agent allocation.",
        "optimize": "Modify the command or script to use fewer resources.",
    }


class KillFailed(ProcpilotError):
    default_hints: ClassVar[dict[str, str]] = {
        "force_kill": "Retry with signal='SIGKILL'.",
    }


class NotSupported(ProcpilotError):
    default_hints: ClassVar[dict[str, str]] = {
        "drop_option": "Call again without this option.",
    }


class InternalError(ProcpilotError):
    default_hints: ClassVar[dict[str, str]] = {
        "retry": "Retry once; if it fails again, try a simpler request (another command, fewer options).",
        "report": "This is a procpilot bug, not a problem with your command: the server log has the details.",
    }


class ConfigError(ProcpilotError, ValueError):
    default_hints: ClassVar[dict[str, str]] = {
        "fix_config": "Correct the named key in the config file or environment variable.",
    }
