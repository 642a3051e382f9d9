"""One error tree for every face and transport.

    ProcpilotError                          HTTP  proc/*
    ├── InvalidArgument (ValueError)         422  invalid_request   a field is missing, malformed, out of range
    │   ├── InvalidFilter                    422  invalid_filter    state_filter is not a known state
    │   ├── InvalidStream                    422  invalid_stream    not stdout / stderr / both
    │   ├── InvalidPattern                   422  invalid_pattern   a wait pattern is not a valid regex
    │   ├── AmbiguousSession                 422                    a name or id prefix fits several sessions
    │   ├── SessionNameInUse                 409                    a live session of the agent has that name
    │   ├── ScriptHasShellSyntax             422                    a python/node script holds $VAR (preflight)
    │   └── ScriptNotCheckable               422                    a script fed through a pipe or <(...) (preflight)
    ├── SessionNotFound (LookupError)        404  unknown_proc      no such session in the caller's scope
    │   └── ProcessNotFound                  404  unknown_proc      spec 000's name for it
    ├── ApprovalNotFound (LookupError)       404                    no pending approval request with that id
    ├── SessionStateError                    409                    the session's state forbids the action
    │   ├── ProcessAlreadyExited             409  proc_dead         kill/write on a session that has ended
    │   ├── SessionStillRunning              409                    clear on a session that is still running
    │   └── StdinClosed                      409                    write after eof, or without a stdin pipe
    ├── SpawnError                           500                    the command could not be started
    │   ├── CommandNotFound                  422                    the executable is not on PATH / does not exist
    │   ├── PathOutOfScope                   422                    the working directory is outside the workspace
    │   ├── ProtectedVariable                422                    an env override of a protected variable
    │   └── SpawnFailed                      500                    any other OS refusal
    ├── ResourceLimitExceeded                422                    killed for passing its memory limit
    ├── KillFailed                           500                    the OS refused to deliver a signal
    ├── NotSupported                         501                    the feature is not available (yet) here
    │   └── IsolationUnavailable             501                    no mechanism for the isolation asked for
    ├── InternalError                        500                    a bug in procpilot; the server lives on
    ├── ConfigError (ValueError)             500                    a config file or env var is invalid
    │
    │   policy: what an agent may do
    ├── CommandDenied                        403                    the agent's allowlist refuses a program
    │   └── UnanalyzableCommand              403                    shell text whose programs are unknowable
    ├── PermissionDenied                     403                    the tool is blocked for this agent
    ├── ApprovalDenied                       403                    an approver declined, or nobody answered in time
    ├── ElevationDenied                      403                    elevated asked, the policy says no
    ├── LimitAboveAllocation                 422                    a limit above the agent's allocation
    ├── ProcLimit                            429  proc_limit        the agent runs as many sessions as it may
    │
    │   the daemon and its clients
    ├── Unauthorized                         401                    no token, or a wrong one
    ├── ApprovalForbidden                    403                    only approvers may see and decide approvals
    ├── SelfApprovalDenied                   403                    an agent may not decide its own request
    ├── OperatorForbidden                    403                    only operators may act on other agents' sessions
    ├── CsrfRejected                         403                    a console change without the page's secret
    ├── UnknownTool                          404                    no tool by that name
    ├── RequestTooLarge                      413                    a body over the daemon's limit
    ├── RequestTimeout                       408                    a body not received within its deadline
    ├── TooManyConnections                   429                    the agent holds as many sessions as it may
    ├── TooManyRequests                      429                    the agent has as many calls queued as it may
    ├── UnsupportedMediaType                 415                    a body that is not JSON
    ├── ServeRefused                         500                    the daemon will not start (address, tokens)
    │   ├── StateDirBusy                     409                    another live server owns these sessions
    │   └── StateDirIncompatible             409                    another procpilot version's state directory
    ├── StateDirDamaged                      500                    a state directory file is not what it must be
    ├── SupervisorClosed                     503                    a spawn (or start) after the supervisor closed
    ├── DaemonNotRunning                     503                    the client found no daemon to talk to
    ├── NodeUnavailable                      503                    no live cluster node can run the session
    └── DaemonConnectionLost                 503                    the daemon stopped answering mid-request

Every class carries a stable ``code`` (its name, what agents see), ``hints`` (what to do next),
its HTTP status (``http_status``) and its proc/* error code (``proc_code``: the name in snake
case unless spec 003 names it). Faces and transports read these; they never guess.
"""

from __future__ import annotations

import re
from typing import Any, ClassVar

__all__ = [
    "AmbiguousSession",
    "ApprovalDenied",
    "ApprovalForbidden",
    "ApprovalNotFound",
    "CommandDenied",
    "CommandNotFound",
    "ConfigError",
    "CsrfRejected",
    "DaemonConnectionLost",
    "DaemonNotRunning",
    "ElevationDenied",
    "InternalError",
    "InvalidArgument",
    "InvalidFilter",
    "InvalidPattern",
    "InvalidStream",
    "IsolationUnavailable",
    "KillFailed",
    "LimitAboveAllocation",
    "NodeUnavailable",
    "NotSupported",
    "OperatorForbidden",
    "PathOutOfScope",
    "PermissionDenied",
    "ProcLimit",
    "ProcessAlreadyExited",
    "ProcessNotFound",
    "ProcpilotError",
    "ProtectedVariable",
    "RequestTimeout",
    "RequestTooLarge",
    "ResourceLimitExceeded",
    "ScriptHasShellSyntax",
    "ScriptNotCheckable",
    "SelfApprovalDenied",
    "ServeRefused",
    "SessionNameInUse",
    "SessionNotFound",
    "SessionStateError",
    "SessionStillRunning",
    "SpawnError",
    "SpawnFailed",
    "StateDirBusy",
    "StateDirDamaged",
    "StateDirIncompatible",
    "StdinClosed",
    "SupervisorClosed",
    "TooManyConnections",
    "TooManyRequests",
    "UnanalyzableCommand",
    "Unauthorized",
    "UnknownTool",
    "UnsupportedMediaType",
    "error_class",
    "error_for_proc_code",
]


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


class ProcpilotError(Exception):
    """Base of every error procpilot raises on purpose. Raised bare only while the supervisor
    shuts down (503: try again on the next one)."""

    default_hints: ClassVar[dict[str, str]] = {}
    http_status: ClassVar[int] = 503
    _proc_code: ClassVar[str | None] = None  # spec 003's name where it has one; else snake case

    def __init__(self, message: str, *, hints: dict[str, str] | None = None, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.hints: dict[str, str] = dict(self.default_hints) | (hints or {})
        self.details: dict[str, Any] = details

    @property
    def code(self) -> str:
        """The error's name as agents see it, e.g. ``CommandNotFound``."""
        return type(self).__name__

    @classmethod
    def proc_code(cls) -> str:
        """The error's code in proc/* responses (spec 003): ``unknown_proc``, ``command_not_found``..."""
        return cls.__dict__.get("_proc_code") or _snake(cls.__name__)

    def to_dict(self) -> dict[str, Any]:
        return {"error": self.code, "message": self.message, "hints": self.hints, **self.details}

    def __repr__(self) -> str:
        return f"{self.code}({self.message!r})"


class InvalidArgument(ProcpilotError, ValueError):
    http_status: ClassVar[int] = 422
    _proc_code = "invalid_request"
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


class AmbiguousSession(InvalidArgument):
    """A session reference (an id prefix) fits more than one of the caller's sessions."""

    default_hints: ClassVar[dict[str, str]] = {
        "be_specific": "Give more characters of the id, the whole id, or the session's name (the error lists them).",
    }


class SessionNameInUse(InvalidArgument):
    """A name asked for is held by a live session of the same agent (names are unique among those)."""

    http_status: ClassVar[int] = 409
    default_hints: ClassVar[dict[str, str]] = {
        "pick_another": "Choose another name, or kill or wait for the session that holds it.",
    }


class ScriptHasShellSyntax(InvalidArgument):
    """A Python or Node script about to run holds shell syntax ($VAR, ${...}, $(...)) in its code."""

    default_hints: ClassVar[dict[str, str]] = {
        "fix_script": "Read variables inside the script (os.environ, process.env) instead of writing $NAME.",
    }


class ScriptNotCheckable(InvalidArgument):
    """The script preflight cannot read the script a command runs: it reaches the interpreter through
    a pipe (``cat x.py | python``) or a process substitution (``python <(cat x.py)``)."""

    default_hints: ClassVar[dict[str, str]] = {
        "run_directly": "Run the file directly: python <file>.py or node <file>.js.",
    }


class SessionNotFound(ProcpilotError, LookupError):
    http_status: ClassVar[int] = 404
    _proc_code = "unknown_proc"
    default_hints: ClassVar[dict[str, str]] = {
        "see_your_sessions": "List your sessions (process list / process.list) to see the ids that exist.",
    }


class ProcessNotFound(SessionNotFound):
    """Spec 000's name for SessionNotFound."""

    _proc_code = "unknown_proc"
    default_hints: ClassVar[dict[str, str]] = {
        "see_your_sessions": "Use process.list to see all tracked processes.",
    }


class ApprovalNotFound(ProcpilotError, LookupError):
    http_status: ClassVar[int] = 404
    default_hints: ClassVar[dict[str, str]] = {
        "list_approvals": "`procpilot approvals` (GET /v1/approvals) lists the requests still pending.",
    }


class SessionStateError(ProcpilotError):
    http_status: ClassVar[int] = 409


class ProcessAlreadyExited(SessionStateError):
    _proc_code = "proc_dead"
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
    http_status: ClassVar[int] = 500


class CommandNotFound(SpawnError):
    http_status: ClassVar[int] = 422
    default_hints: ClassVar[dict[str, str]] = {
        "check_path": "Run `which <command>` to check if the command is installed.",
        "use_full_path": "Specify the full absolute path to the executable.",
    }


class PathOutOfScope(SpawnError):
    http_status: ClassVar[int] = 422
    default_hints: ClassVar[dict[str, str]] = {
        "check_scope": "Use a working directory inside the workspace root, or omit it to use the root.",
    }


class ProtectedVariable(SpawnError):
    http_status: ClassVar[int] = 422
    default_hints: ClassVar[dict[str, str]] = {
        "drop_variable": "Remove the protected variable from the environment overrides.",
    }


class SpawnFailed(SpawnError):
    default_hints: ClassVar[dict[str, str]] = {
        "check_permissions": "Verify the command is executable and the sandbox has required permissions.",
        "retry": "Retry the operation.",
    }


class ResourceLimitExceeded(ProcpilotError):
    http_status: ClassVar[int] = 422  # the process outgrew the limits it ran under: not a server fault
    """The process was killed because it passed a limit; details say which (``limit``) and the peak."""

    default_hints: ClassVar[dict[str, str]] = {
        "increase_limits": "Retry with higher cpu_limit or memory_limit if within agent allocation.",
        "optimize": "Modify the command or script to use fewer resources.",
    }


class KillFailed(ProcpilotError):
    http_status: ClassVar[int] = 500
    default_hints: ClassVar[dict[str, str]] = {
        "force_kill": "Retry with signal='SIGKILL'.",
    }


class NotSupported(ProcpilotError):
    http_status: ClassVar[int] = 501
    default_hints: ClassVar[dict[str, str]] = {
        "drop_option": "Call again without this option.",
    }


class IsolationUnavailable(NotSupported):
    default_hints: ClassVar[dict[str, str]] = {
        "install_bubblewrap": "Install bubblewrap (apt-get install bubblewrap) or run the server as root.",
        "kernel": "Or run on a kernel with Landlock (5.13+, in CONFIG_LSM) and libseccomp installed.",
        "drop_option": "Run without the isolation option if your policy allows it.",
    }


class InternalError(ProcpilotError):
    http_status: ClassVar[int] = 500
    default_hints: ClassVar[dict[str, str]] = {
        "retry": "Retry once; if it fails again, try a simpler request (another command, fewer options).",
        "report": "This is a procpilot bug, not a problem with your command: the server log has the details.",
    }


class ConfigError(ProcpilotError, ValueError):
    http_status: ClassVar[int] = 500
    default_hints: ClassVar[dict[str, str]] = {
        "fix_config": "Correct the named key in the config file or environment variable.",
    }


# -- policy: what an agent may do ----------------------------------------------------------------


class CommandDenied(ProcpilotError):
    """The command would run a program the agent's policy refuses (or one that does not exist).

    Raised before anything is started, so a refused command has no side effect at all.
    """

    http_status: ClassVar[int] = 403
    default_hints: ClassVar[dict[str, str]] = {
        "allowed_programs": "Run only the programs this agent's policy allows (the refusal lists them).",
        "resolved_match": (
            "Allowlists are matched on the resolved program (its real path after PATH lookup and "
            "symlinks), so another path to, a copy of, or a wrapper around a refused program "
            "(env, sh -c, xargs, find -exec, timeout, nohup...) is refused too."
        ),
    }


class UnanalyzableCommand(CommandDenied):
    """The shell text uses something whose effect we cannot check statically under an allowlist.

    A command substitution, ``eval``, ``source``, a variable as a command name, a function
    definition...: what runs is only known when the line runs, so the only safe answer is no.
    """

    default_hints: ClassVar[dict[str, str]] = {
        **CommandDenied.default_hints,
        "write_it_plainly": (
            "Name every program literally: no $(...), backticks, eval, source, aliases, functions, "
            "or variables and globs as command names. Split the work into separate plain commands."
        ),
    }


class PermissionDenied(ProcpilotError):
    http_status: ClassVar[int] = 403
    default_hints: ClassVar[dict[str, str]] = {
        "ask_operator": "This capability is blocked for your agent; ask the operator to change the policy.",
    }


class ApprovalDenied(ProcpilotError):
    http_status: ClassVar[int] = 403
    default_hints: ClassVar[dict[str, str]] = {
        "rethink": "An approver declined (or did not answer in time); change the request or ask first.",
    }


class ElevationDenied(ProcpilotError):
    http_status: ClassVar[int] = 403
    default_hints: ClassVar[dict[str, str]] = {
        "drop_elevated": "Run without elevated: this agent's policy does not allow leaving its sandbox.",
    }


class LimitAboveAllocation(ProcpilotError):
    http_status: ClassVar[int] = 422
    default_hints: ClassVar[dict[str, str]] = {
        "lower_limit": "Ask for at most the agent's allocation, or omit the limit to get the allocation.",
    }


class ProcLimit(ProcpilotError):
    """The agent already runs as many sessions as its policy allows."""

    http_status: ClassVar[int] = 429
    _proc_code = "proc_limit"
    default_hints: ClassVar[dict[str, str]] = {
        "wait_or_kill": "Wait for a running session to end, or kill one you no longer need.",
    }


# -- the daemon and its clients ------------------------------------------------------------------


class Unauthorized(ProcpilotError):
    http_status: ClassVar[int] = 401
    default_hints: ClassVar[dict[str, str]] = {
        "set_token": "Pass the bearer token your agent was given: --token or PROCPILOT_TOKEN.",
    }


class ApprovalForbidden(ProcpilotError):
    http_status: ClassVar[int] = 403
    default_hints: ClassVar[dict[str, str]] = {
        "approvers": "Only the agents in [server] approvers may see and decide approval requests.",
    }


class SelfApprovalDenied(ProcpilotError):
    http_status: ClassVar[int] = 403
    default_hints: ClassVar[dict[str, str]] = {
        "other_approver": "Another approver has to decide this request.",
    }


class OperatorForbidden(ProcpilotError):
    http_status: ClassVar[int] = 403
    default_hints: ClassVar[dict[str, str]] = {
        "operators": "Only the agents in [server] operators may see and act on other agents' sessions.",
    }


class CsrfRejected(ProcpilotError):
    http_status: ClassVar[int] = 403
    default_hints: ClassVar[dict[str, str]] = {
        "reload": "Reload the console page: GET /console/api/me gives the value to send as X-Procpilot-Session.",
    }


class UnknownTool(ProcpilotError):
    http_status: ClassVar[int] = 404
    default_hints: ClassVar[dict[str, str]] = {
        "list_tools": "`procpilot tools` (GET /v1/tools) lists the tools this daemon serves.",
    }


class UnsupportedMediaType(ProcpilotError):
    http_status: ClassVar[int] = 415


class TooManyConnections(ProcpilotError):
    """The agent already holds as many MCP sessions (or proc/* WebSockets) as the daemon allows it."""

    http_status: ClassVar[int] = 429
    default_hints: ClassVar[dict[str, str]] = {
        "reuse": "Reuse an open session or connection, or close one you no longer need (MCP: DELETE /mcp).",
    }


class TooManyRequests(ProcpilotError):
    """The agent has as many calls open (``[server] requests_per_agent``) and as many more queued
    behind them (``requests_queued_per_agent``) as the daemon allows it (procpilot/turns.py)."""

    http_status: ClassVar[int] = 429
    default_hints: ClassVar[dict[str, str]] = {
        "wait": "Wait for some of your calls to return before sending more; other agents are not affected.",
    }


class RequestTooLarge(ProcpilotError):
    http_status: ClassVar[int] = 413
    default_hints: ClassVar[dict[str, str]] = {
        "smaller": "Send less at once: write big inputs to a file in the workspace, or in several writes.",
    }


class RequestTimeout(ProcpilotError):
    """A request's body did not arrive within ``[server] body_timeout_sec`` of its head; the
    connection is closed after this answer."""

    http_status: ClassVar[int] = 408
    default_hints: ClassVar[dict[str, str]] = {
        "send_at_once": "Send the whole body right after the head; a body this slow is taken for a stalled client.",
    }


class ServeRefused(ProcpilotError):
    """The server will not start as configured; each raise says what to change."""

    http_status: ClassVar[int] = 500
    default_hints: ClassVar[dict[str, str]] = {
        "check_config": "The message names the setting or the process in the way: change that, then start again.",
    }


class StateDirBusy(ServeRefused):
    """A live server already owns the sessions of this state directory (for this server kind
    and agent): a second one would adopt the same processes twice, so it is refused."""

    http_status: ClassVar[int] = 409
    default_hints: ClassVar[dict[str, str]] = {
        "use_it": "Talk to the running server (procpilot ps / daemon.json), or stop it first.",
        "separate": "Or give this server a state_dir of its own.",
    }


class StateDirIncompatible(ServeRefused):
    """The state directory was written in a format this procpilot cannot read (a newer release,
    or one too old): reading it anyway could misread logs or adopt processes it cannot serve."""

    http_status: ClassVar[int] = 409
    default_hints: ClassVar[dict[str, str]] = {
        "separate": "Give this server a state_dir of its own (state_dir in the config, or PROCPILOT_STATE_DIR).",
    }


class StateDirDamaged(ProcpilotError):
    """A file or directory of the state directory is not what procpilot left there (a directory
    where the journal or a lock goes, a file that cannot be read or holds garbage), or the state
    directory is no longer the one the server started with (moved or replaced): raised at start,
    before anything is adopted, and at a spawn, before any file is made. ``path`` names it."""

    http_status: ClassVar[int] = 500
    default_hints: ClassVar[dict[str, str]] = {
        "look": "Look at the named path: procpilot made it a plain file (or directory) and never replaces it.",
    }


class SupervisorClosed(ProcpilotError):
    """A spawn, a run or a ``start`` on a supervisor that is closing or closed (engine/lifecycle.py),
    also one that was closed before it ever started: nothing was started. ``state`` names where
    the supervisor is. A server that is shutting down answers this to calls still on their way."""

    http_status: ClassVar[int] = 503
    default_hints: ClassVar[dict[str, str]] = {
        "retry": "Call again on the next server (or, in a library, a new Supervisor): this one takes no new work.",
    }


class DaemonNotRunning(ProcpilotError):
    default_hints: ClassVar[dict[str, str]] = {
        "start_daemon": "Start it with `procpilot serve` (or `make run` in a procpilot checkout).",
        "other_address": "Point at another daemon with --url or PROCPILOT_URL (http://HOST:PORT or unix:///PATH).",
    }


class NodeUnavailable(ProcpilotError):
    """On a cluster: no live node offers the agent's placement resource, or the node went away
    while the call was on its way to it. Nothing was started."""

    http_status: ClassVar[int] = 503
    default_hints: ClassVar[dict[str, str]] = {
        "check_nodes": "See the nodes and their resources with `procpilot doctor` (or GET /v1/capabilities).",
        "retry": "Call again once a node offering the resource has joined the cluster.",
    }


class DaemonConnectionLost(ProcpilotError):
    default_hints: ClassVar[dict[str, str]] = {
        "check_daemon": "The daemon stopped answering mid-request: see if it still runs (`procpilot ps`).",
        "sessions": "A restarted daemon does not re-adopt running sessions; they ended with the old one.",
    }


# -- lookups -------------------------------------------------------------------------------------


def _tree(cls: type[ProcpilotError]) -> list[type[ProcpilotError]]:
    return [cls, *(sub for child in cls.__subclasses__() for sub in _tree(child))]


def error_class(code: str) -> type[ProcpilotError] | None:
    """The class an error's ``code`` names (the tree above), or None for a name it does not hold."""
    return next((cls for cls in _tree(ProcpilotError) if cls.__name__ == code and cls.__module__ == __name__), None)


def error_for_proc_code(code: str) -> type[ProcpilotError] | None:
    """The class a proc/* error code stands for (``unknown_proc`` is SessionNotFound)."""
    return next((cls for cls in _tree(ProcpilotError) if cls.proc_code() == code and cls.__module__ == __name__), None)
