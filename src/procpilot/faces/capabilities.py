"""The ``process.*`` capabilities of spec 000: run, monitor, kill, list, logs.

A thin face on the one supervisor: a process started here is the same session the ``exec`` /
``process`` tools and the ``proc/*`` messages see, with the same output and state.

State vocabulary (spec 000), from the engine's :class:`SessionState`:

    QUEUED, RUNNING, RESTARTING -> "running"
    EXITED_OK, EXITED_ERROR     -> "completed"    (exit_code is the process's own; null if a signal
                                                    nobody sent through procpilot ended it)
    FAILED_TO_START             -> "completed"    (listing only; process.run raises SpawnFailed)
    LOST                        -> "completed"    (exit_code null: gone while no server ran, unrecorded)
    KILLED                      -> "killed"       (exit_code null)
    TIMED_OUT                   -> "timed_out"    (exit_code null; partial output kept)
    LIMIT_EXCEEDED              -> "killed"       (listing only; process.run and process.monitor raise
                                                    ResourceLimitExceeded: which limit, the peak)

Errors carry the spec's names and recovery hints: the engine's ``SessionNotFound`` becomes
:class:`ProcessNotFound` at this boundary, and the hints of the other spec errors are the spec's.
``process.run`` and ``process.kill`` are Notify-tier: the policy gate (``policy/gate.py``, the one
audit wrapper, around every face's tools) makes each call an :class:`AuditEvent`.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import signal as signal_module
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from procpilot.contract import (
    AuditEvent,
    PermissionTier,
    ToolResult,
    ToolSpec,
    dumps,
    parse_arguments,
)
from procpilot.engine.capture import Stream
from procpilot.engine.isolation import weaker_box
from procpilot.engine.limits import Limits
from procpilot.engine.restart import restart_policy
from procpilot.engine.session import Session
from procpilot.engine.spawn import SpawnSpec
from procpilot.engine.states import SessionState
from procpilot.engine.supervisor import Supervisor
from procpilot.engine.usage import Usage
from procpilot.errors import (
    InvalidArgument,
    InvalidFilter,
    InvalidStream,
    KillFailed,
    ProcessAlreadyExited,
    ProcessNotFound,
    ProcpilotError,
    ResourceLimitExceeded,
    SessionNotFound,
    SpawnFailed,
)
from procpilot.render import complete_utf8_prefix, for_model, tail_chars

__all__ = [
    "SIGNALS",
    "STATE_FILTERS",
    "AuditEvent",
    "KillInput",
    "KillOutput",
    "ListEntry",
    "ListInput",
    "ListOutput",
    "LogsInput",
    "LogsOutput",
    "MonitorInput",
    "MonitorOutput",
    "ProcessAPI",
    "ProcessCapabilities",
    "ProcessNotFound",
    "ResourceUsage",
    "RunInput",
    "RunOutput",
    "capability_tools",
    "spec_exit_code",
    "spec_state",
]

State = Literal["running", "completed", "killed", "timed_out"]
STATE_FILTERS = ("running", "completed", "killed", "timed_out", "all")
STREAMS = ("stdout", "stderr", "both")
SIGNALS = ("SIGTERM", "SIGKILL", "SIGINT", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2")
MAX_TIMEOUT_SEC = 3600
_MAX_CORES = 4096.0  # bounds past which a number is an overflow waiting to happen, not a limit
_MAX_BYTES = 2**62

_STATES: dict[SessionState, State] = {
    SessionState.QUEUED: "running",
    SessionState.RUNNING: "running",
    SessionState.RESTARTING: "running",
    SessionState.EXITED_OK: "completed",
    SessionState.EXITED_ERROR: "completed",
    SessionState.FAILED_TO_START: "completed",
    SessionState.KILLED: "killed",
    SessionState.TIMED_OUT: "timed_out",
    SessionState.LIMIT_EXCEEDED: "killed",
    SessionState.LOST: "completed",
}
# How long process.kill waits for the tree to be gone once no escalation is due.
_KILL_SETTLE_SEC = 2.0
_SIGKILL_WAIT_SEC = 5.0


def spec_state(session: Session) -> State:
    """The session's state in spec 000's vocabulary."""
    return _STATES[session.state]


def spec_exit_code(session: Session) -> int | None:
    """The exit code, null while running and when killed or timed out (as spec 000 says)."""
    if spec_state(session) != "completed":
        return None
    return session.exit_code


def _iso(timestamp: float) -> str:
    return dt.datetime.fromtimestamp(timestamp, tz=dt.UTC).isoformat(timespec="milliseconds")


# -- errors ------------------------------------------------------------------------------------


# The spec's recovery hints, by error name, replacing the engine's generic ones at this boundary.
_SPEC_HINTS: dict[str, dict[str, str]] = {
    "CommandNotFound": {
        "check_path": "Use process.run(command='which', args=['command_name']) to check if the command is installed.",
        "use_full_path": "Specify the full absolute path to the executable.",
    },
    "PathOutOfScope": {
        "check_scope": "Use a working_directory inside the workspace root, or omit it to run in the root.",
    },
    "SpawnFailed": {
        "check_permissions": "Verify the command is executable and the sandbox has required permissions.",
        "retry": "Retry the operation.",
    },
    "ProcessAlreadyExited": {
        "check_status": "Use process.monitor to see the final state and exit code.",
    },
    "KillFailed": {"force_kill": "Retry with signal='SIGKILL'."},
    "InvalidFilter": {"use_valid_filter": "Use one of: 'running', 'completed', 'killed', 'timed_out', 'all'."},
    "InvalidStream": {"use_valid_stream": "Use one of: 'stdout', 'stderr', 'both'."},
}


@contextlib.contextmanager
def _spec_errors() -> Iterator[None]:
    """Give engine errors the spec's names and hints as they leave this face."""
    try:
        yield
    except ProcessNotFound:
        raise
    except SessionNotFound as exc:
        details = dict(exc.details)
        process_id = details.pop("session_id", None)
        raise ProcessNotFound(
            f"no process {process_id!r}" if process_id is not None else exc.message, process_id=process_id, **details
        ) from None
    except ProcpilotError as exc:
        hints = _SPEC_HINTS.get(exc.code)
        if hints is not None:
            exc.hints = dict(hints)
        raise


# -- inputs ------------------------------------------------------------------------------------


class RunInput(BaseModel):
    model_config = ConfigDict(extra="forbid", title="process.run")

    command: str = Field(
        min_length=1,
        description="A shell command; with args, a program (no shell).",
    )
    args: list[str] | None = None
    working_directory: str | None = Field(None, description="Default: the workspace.")
    environment: dict[str, str] | None = Field(
        None,
        description="Extra variables (not PATH, HOME, LD_*).",
    )
    timeout: int = Field(
        300,
        ge=1,
        le=MAX_TIMEOUT_SEC,
        description="Foreground seconds (default 300, max 3600).",
    )
    background: bool = Field(
        False,
        description="Return at once.",
    )
    stdin: str | None = Field(None, description="Fed to stdin.")
    cpu_limit: float | None = Field(None, gt=0, le=_MAX_CORES, description="Cores, e.g. 0.5.")
    memory_limit: int | None = Field(None, ge=1, le=_MAX_BYTES, description="Bytes.")
    stdout_lines: int = Field(100, ge=0, description="Summary lines (default 100).")

    restart: Literal["no", "on-failure", "always"] | None = Field(
        None,
        description="Rerun when a background run ends.",
    )
    max_restarts: int | None = Field(None, ge=0, le=10_000, description="Default 10.")
    name: str | None = Field(
        None,
        description="Usable as process_id.",
    )


class MonitorInput(BaseModel):
    model_config = ConfigDict(extra="forbid", title="process.monitor")

    process_id: str = Field(min_length=1, description="The process identifier returned by process.run.")


class KillInput(BaseModel):
    model_config = ConfigDict(extra="forbid", title="process.kill")

    process_id: str = Field(min_length=1, description="The process identifier returned by process.run.")
    signal: str = Field(
        "SIGTERM",
        description="Signal to send: SIGTERM (default, graceful), SIGKILL (forced), SIGINT, SIGHUP, SIGQUIT, "
        "SIGUSR1 or SIGUSR2.",
        json_schema_extra={"enum": list(SIGNALS)},
    )
    force_after: int = Field(
        10,
        ge=0,
        description="Seconds to wait after SIGTERM before sending SIGKILL (SIGTERM only; 0 = no escalation).",
    )


class ListInput(BaseModel):
    model_config = ConfigDict(extra="forbid", title="process.list")

    state_filter: str = Field(
        "all",
        description="Filter by state: 'running', 'completed', 'killed', 'timed_out', or 'all' (default).",
        json_schema_extra={"enum": list(STATE_FILTERS)},
    )
    limit: int = Field(50, ge=0, description="Maximum number of processes to return, most recent first.")
    offset: int = Field(0, ge=0, le=_MAX_BYTES, description="Processes to skip (a later page).")


class LogsInput(BaseModel):
    model_config = ConfigDict(extra="forbid", title="process.logs")

    process_id: str = Field(min_length=1, description="The process identifier returned by process.run.")
    stream: str = Field(
        "both",
        description="Which output stream: 'stdout', 'stderr', or 'both' (default).",
        json_schema_extra={"enum": list(STREAMS)},
    )
    offset: int | None = Field(
        None, ge=0, le=_MAX_BYTES, description="Byte offset to start reading from (in each stream read). Default 0."
    )
    limit: int | None = Field(
        None,
        ge=0,
        le=_MAX_BYTES,
        description="Maximum bytes to return per stream. Default and most: the result budget "
        "(resultMaxChars, shared by the streams read); next offsets say where to go on.",
    )


# -- outputs -----------------------------------------------------------------------------------


class ResourceUsage(BaseModel):
    cpu_ms: int
    # None: not measured (a tree too short to sample, below the supervisor's own peak RSS). A live
    # process always has resident memory, so the engine's 0 never means "used none".
    memory_peak_bytes: int | None
    io_read_bytes: int
    io_write_bytes: int

    @classmethod
    def of(cls, usage: Usage) -> ResourceUsage:
        figures = usage.as_dict()
        return cls(**figures | {"memory_peak_bytes": figures["memory_peak_bytes"] or None})


class RunOutput(BaseModel):
    exit_code: int | None
    stdout_summary: str
    stderr_summary: str
    duration_ms: int
    process_id: str
    state: State
    resource_usage: ResourceUsage
    # Beyond spec 000: bytes of output the disk refused (ENOSPC...), and what to tell the model.
    output_dropped: int = 0
    output_note: str | None = None
    # Beyond spec 000: on a cluster, the Ray node id the process runs on (absent on one host).
    node: str | None = None
    # Beyond spec 000: what the process's box lacks, when a weaker one the operator allowed
    # (isolation_fallback) served it (absent: the full box, or none asked for).
    weaker_box: str | None = None


class MonitorOutput(BaseModel):
    process_id: str
    command: str
    state: State
    exit_code: int | None
    duration_ms: int
    resource_usage: ResourceUsage
    started_at: str
    # Beyond spec 000: bytes of output the disk refused (ENOSPC...), and what to tell the model;
    # the name given at process.run, and how often a restart policy restarted it.
    output_dropped: int = 0
    output_note: str | None = None
    node: str | None = None  # as RunOutput.node
    name: str | None = None
    restarts: int | None = None  # None: no restart policy


class KillOutput(BaseModel):
    killed: bool
    signal_sent: str
    process_id: str
    state: State | Literal["running"]
    node: str | None = None  # as RunOutput.node


class ListEntry(BaseModel):
    process_id: str
    command: str
    state: State
    exit_code: int | None
    started_at: str
    duration_ms: int
    resource_usage: ResourceUsage
    # Beyond spec 000: the name given at process.run, and how often a restart policy restarted it.
    name: str | None = None
    restarts: int | None = None  # None: no restart policy
    node: str | None = None  # as RunOutput.node


class ListOutput(BaseModel):
    processes: list[ListEntry]
    total: int
    # Beyond spec 000: the call that lists the rest, when more match than were shown.
    next: str | None = None


class LogsOutput(BaseModel):
    stdout: str
    stderr: str
    stdout_size: int
    stderr_size: int
    truncated: bool
    process_id: str
    state: State
    # Beyond spec 000: the exact byte offset to ask for next (``stdout_size`` is that only when
    # nothing was cut, and a cut never splits a UTF-8 character); None for a stream not read.
    stdout_next_offset: int | None = None
    stderr_next_offset: int | None = None
    output_dropped: int = 0
    output_note: str | None = None
    node: str | None = None  # as RunOutput.node


# -- the capabilities --------------------------------------------------------------------------


class ProcessCapabilities:
    """The five capabilities over one supervisor; every call names the caller's scope."""

    def __init__(self, supervisor: Supervisor) -> None:
        self.sup = supervisor
        self.usage = supervisor.usage

    def _get(self, scope: str, process_id: str) -> Session:
        return self.sup.get(scope, process_id)

    def _resource_usage(self, session: Session) -> ResourceUsage:
        return ResourceUsage.of(self.usage.usage(session))

    async def _summary(self, session: Session, stream: Stream, lines: int) -> str:
        """The last ``lines`` lines of a stream, as a model should read them."""
        if lines <= 0:
            return ""
        view = session.output[stream]
        limit = self.sup.settings.exec.result_max_chars // 2  # two streams share one result's budget
        start = max(view.offset_of_line(max(0, view.total_lines - lines)), view.size - 4 * limit)
        result = await session.page(stream, start)
        text, _ = tail_chars(for_model(result.data), limit)
        if result.dropped:
            text = f"[... {result.dropped} bytes dropped by {view.gap_cause} ...]\n" + text
        return text

    async def run(self, params: RunInput, scope: str) -> RunOutput:
        with _spec_errors():
            settings = self.sup.settings
            cwd = Path(params.working_directory) if params.working_directory else None
            env = params.environment or {}
            command: str | tuple[str, ...] = (
                (params.command, *params.args) if params.args is not None else params.command
            )
            limits = None
            if params.cpu_limit is not None or params.memory_limit is not None:
                limits = Limits(memory_bytes=params.memory_limit, cpu_fraction=params.cpu_limit)
            if params.background:
                spec = SpawnSpec(
                    command,
                    cwd=cwd,
                    env=env,
                    name=params.name,
                    stdin="pipe",
                    limits=limits,
                    workspace=settings.workspace_root,
                    restart=restart_policy(
                        params.restart,
                        params.max_restarts,
                        background=True,
                        default_mode=settings.exec.restart,
                        default_max_restarts=settings.exec.max_restarts,
                        backoff=settings.exec.restart_backoff_ms / 1000,
                    ),
                )
            else:
                stdin_data = None if params.stdin is None else params.stdin.encode()
                spec = SpawnSpec(
                    command,
                    cwd=cwd,
                    workspace=settings.workspace_root,
                    env=env,
                    name=params.name,
                    timeout=params.timeout,
                    stdin="null" if stdin_data is None else "pipe",
                    stdin_data=stdin_data,
                    limits=limits,
                )
            if params.background:
                session = await self.sup.run(spec, scope=scope, yield_ms=0)  # handed over at once
                self.usage.watch(session)
            else:
                session = await self.sup.spawn(spec, scope=scope)
                self.usage.watch(session)
                try:
                    await session.wait_finished()
                except asyncio.CancelledError:
                    # The caller gave up on a foreground run: do not leave its tree behind.
                    with contextlib.suppress(ProcpilotError, OSError):
                        session.terminate(SessionState.KILLED, signal_module.SIGTERM, session.kill_grace)
                    raise
            if session.state is SessionState.FAILED_TO_START:
                raise SpawnFailed(f"could not start {session.command!r}: {session.error}", process_id=session.id)
            _raise_if_limit_exceeded(session)
            return RunOutput(
                exit_code=spec_exit_code(session),
                stdout_summary=await self._summary(session, Stream.STDOUT, params.stdout_lines),
                stderr_summary=await self._summary(session, Stream.STDERR, params.stdout_lines),
                duration_ms=session.duration_ms,
                process_id=session.id,
                state=spec_state(session),
                resource_usage=self._resource_usage(session),
                node=session.node,
                weaker_box=weaker_box(session.spec.isolation),
                **_loss(session),
            )

    def _started_at(self, session: Session) -> str:
        return _iso(session.started_at if session.started_at is not None else session.created_at)

    async def monitor(self, params: MonitorInput, scope: str) -> MonitorOutput:
        with _spec_errors():
            session = self._get(scope, params.process_id)
            _raise_if_limit_exceeded(session)
            await self.sup.observe([session])
            return MonitorOutput(
                process_id=session.id,
                command=session.command,
                state=spec_state(session),
                exit_code=spec_exit_code(session),
                duration_ms=session.duration_ms,
                resource_usage=self._resource_usage(session),
                started_at=self._started_at(session),
                **_extras(session),
                **_loss(session),
            )

    async def kill(self, params: KillInput, scope: str) -> KillOutput:
        with _spec_errors():
            name = params.signal.strip().upper()
            name = name if name.startswith("SIG") else "SIG" + name
            if name not in SIGNALS:
                raise InvalidArgument(
                    f"unsupported signal {params.signal!r}",
                    hints={"use_valid_signal": "Use one of: " + ", ".join(SIGNALS) + "."},
                    field="signal",
                )
            sig = signal_module.Signals[name]
            session = self._get(scope, params.process_id)
            if session.finished:
                raise ProcessAlreadyExited(
                    f"process {session.id} has already ended ({spec_state(session)})",
                    process_id=session.id,
                    state=spec_state(session),
                )
            escalate = sig == signal_module.SIGTERM and params.force_after > 0
            grace = float(params.force_after) if escalate else 0.0
            try:
                await self.sup.kill(scope, session.id, sig, grace=grace, wait=0)
            except ProcessAlreadyExited:
                pass  # it ended between our look and the signal: killed=false, state as it ended
            except OSError as exc:
                raise KillFailed(
                    f"the OS refused to deliver {name} to {session.id}: {exc}", process_id=session.id
                ) from exc
            if sig == signal_module.SIGKILL:
                settle = _SIGKILL_WAIT_SEC
            elif escalate:
                settle = grace + _SIGKILL_WAIT_SEC
            else:
                settle = _KILL_SETTLE_SEC
            await session.wait_finished(settle)
            return KillOutput(
                killed=session.finished and session.state in (SessionState.KILLED, SessionState.LIMIT_EXCEEDED),
                signal_sent=session.signal_sent or name,
                process_id=session.id,
                state=spec_state(session),
                node=session.node,
            )

    async def list(self, params: ListInput, scope: str) -> ListOutput:
        with _spec_errors():
            if params.state_filter not in STATE_FILTERS:
                raise InvalidFilter(
                    f"state_filter must be one of {', '.join(STATE_FILTERS)}, not {params.state_filter!r}",
                    field="state_filter",
                )
            matching = [
                s for s in self.sup.list(scope) if params.state_filter == "all" or spec_state(s) == params.state_filter
            ]
            shown = matching[params.offset : params.offset + params.limit]
            # Every tree read in a worker thread (a sample up to 2 s old reused): the spec's rows
            # carry usage, and a long list must not hold the event loop while it is read.
            await self.sup.observe(shown)  # on a cluster: the nodes' figures
            usages = await self.usage.snapshot(shown, budget=None)
            entries = [
                ListEntry(
                    process_id=s.id,
                    command=s.command,
                    state=spec_state(s),
                    exit_code=spec_exit_code(s),
                    started_at=self._started_at(s),
                    duration_ms=s.duration_ms,
                    resource_usage=ResourceUsage.of(usages[s.id] or Usage()),
                    **_extras(s),
                )
                for s in shown
            ]
            end = min(params.offset, len(matching)) + len(shown)
            following = None
            if end < len(matching):
                # the same call, one page on: the filter and limit it was made with kept
                narrowed = "" if params.state_filter == "all" else f" state_filter={params.state_filter}"
                sized = "" if params.limit == 50 else f" limit={params.limit}"
                following = f"process.list{narrowed}{sized} offset={end}"
            return ListOutput(processes=entries, total=len(matching), next=following)

    async def logs(self, params: LogsInput, scope: str) -> tuple[LogsOutput, dict[str, Any]]:
        """The output, and paging notes (next offsets, dropped bytes) for the text rendering."""
        with _spec_errors():
            if params.stream not in STREAMS:
                raise InvalidStream(
                    f"stream must be one of {', '.join(STREAMS)}, not {params.stream!r}", field="stream"
                )
            session = self._get(scope, params.process_id)
            offset = params.offset or 0
            texts = {"stdout": "", "stderr": ""}
            sizes = {"stdout": session.output[Stream.STDOUT].size, "stderr": session.output[Stream.STDERR].size}
            notes: dict[str, Any] = {}
            next_offsets: dict[str, int | None] = {"stdout": None, "stderr": None}
            truncated = False
            # One result stays within the budget: a model reads it whole (faces/budget.py).
            budget = self.sup.settings.exec.result_max_chars // (2 if params.stream == "both" else 1)
            limit = budget if params.limit is None else min(params.limit, budget)
            for name in ("stdout", "stderr"):
                if params.stream not in (name, "both"):
                    continue
                result = await session.page(Stream(name), offset, limit)
                sizes[name] = result.total
                data = result.data
                next_offsets[name] = result.end
                if result.end < result.total:
                    truncated = True
                    data = data[: complete_utf8_prefix(data)]  # a character cut by limit waits for the next page
                    next_offsets[name] = notes[f"{name}_next_offset"] = result.end - (len(result.data) - len(data))
                if result.dropped:
                    notes[f"{name}_dropped_bytes"] = result.dropped
                    notes[f"{name}_gap_cause"] = session.output[Stream(name)].gap_cause
                texts[name] = data.decode("utf-8", errors="replace")
            output = LogsOutput(
                stdout=texts["stdout"],
                stderr=texts["stderr"],
                stdout_size=sizes["stdout"],
                stderr_size=sizes["stderr"],
                truncated=truncated,
                process_id=session.id,
                state=spec_state(session),
                stdout_next_offset=next_offsets["stdout"],
                stderr_next_offset=next_offsets["stderr"],
                node=session.node,
                **_loss(session),
            )
            return output, notes


def _loss(session: Session) -> dict[str, Any]:
    """The output_dropped / output_note fields: what of the session's output the disk refused."""
    return {"output_dropped": session.output[Stream.COMBINED].lost, "output_note": session.output.lost_note()}


def _extras(session: Session) -> dict[str, Any]:
    """Fields beyond spec 000 that only some processes have: a name, a restart count, and on a
    cluster the node it runs on."""
    restarts = session.restarts if session.spec.restart is not None else None
    return {"name": session.name, "restarts": restarts, "node": session.node}


def _spec_shaped(data: dict[str, Any]) -> dict[str, Any]:
    """A result as spec 000 draws it: the extras a process does not have are left out."""
    for key in ("name", "restarts", "node", "weaker_box"):
        if key in data and data[key] is None:
            del data[key]
    return data


def _dump(out: RunOutput | MonitorOutput | LogsOutput | KillOutput) -> dict[str, Any]:
    """The result as spec 000 draws it, plus the loss fields only when something was lost."""
    lost = getattr(out, "output_dropped", 0)
    return _spec_shaped(out.model_dump(exclude={"output_dropped", "output_note"} if not lost else set()))


class ProcessAPI:
    """The capabilities as Python calls for one scope: ``await api.run("make", args=["test"])``."""

    def __init__(self, supervisor: Supervisor, scope: str = "default") -> None:
        self.caps = ProcessCapabilities(supervisor)
        self.scope = scope

    async def run(self, command: str, **kwargs: Any) -> RunOutput:
        params: RunInput = parse_arguments(RunInput, {"command": command, **kwargs})
        return await self.caps.run(params, self.scope)

    async def monitor(self, process_id: str) -> MonitorOutput:
        return await self.caps.monitor(MonitorInput(process_id=process_id), self.scope)

    async def kill(self, process_id: str, signal: str = "SIGTERM", force_after: int = 10) -> KillOutput:
        params: KillInput = parse_arguments(
            KillInput, {"process_id": process_id, "signal": signal, "force_after": force_after}
        )
        return await self.caps.kill(params, self.scope)

    async def list(self, state_filter: str = "all", limit: int = 50, offset: int = 0) -> ListOutput:
        params: ListInput = parse_arguments(ListInput, {"state_filter": state_filter, "limit": limit, "offset": offset})
        return await self.caps.list(params, self.scope)

    async def logs(
        self, process_id: str, stream: str = "both", offset: int | None = None, limit: int | None = None
    ) -> LogsOutput:
        params: LogsInput = parse_arguments(
            LogsInput, {"process_id": process_id, "stream": stream, "offset": offset, "limit": limit}
        )
        return (await self.caps.logs(params, self.scope))[0]


# -- tools -------------------------------------------------------------------------------------

RUN_DESCRIPTION = (
    "Execute a command in the sandbox; returns exit_code, output summaries, process_id, "
    "state and resource_usage. A timeout is a state, not an error."
)
MONITOR_DESCRIPTION = (
    "Current state ('running', 'completed', 'killed', 'timed_out'), exit_code, runtime and resource_usage of a "
    "process started with process.run. Use process.logs for its output."
)
KILL_DESCRIPTION = (
    "Send a signal (default SIGTERM) to a running process and its whole tree; after force_after seconds (default "
    "10, 0 = never) SIGTERM escalates to SIGKILL. Returns killed, signal_sent and the final state."
)
LIST_DESCRIPTION = (
    "List this agent's processes, most recent first: running, completed, killed and timed out. state_filter "
    "narrows the list; total counts all matches."
)
LOGS_DESCRIPTION = (
    "Full stdout and/or stderr of a running or completed process, by byte offset/limit. For a running process, "
    "pass the previous stdout_size as the next offset to read only new output."
)


def _meta(tier: PermissionTier) -> dict[str, Any]:
    return {"procpilot/permission": tier.value}


def _raise_if_limit_exceeded(session: Session) -> None:
    """Spec 000: a process killed for passing its memory limit (or, under the watchdog, its pids
    limit) is a ResourceLimitExceeded error, not a plain "killed" (a CPU limit throttles)."""
    if session.state is not SessionState.LIMIT_EXCEEDED:
        return
    limits = session.spec.limits
    report = session.accounting.limit_report
    peak = report.memory_peak_bytes if report is not None else None
    which = (report.limit if report is not None else None) or "memory"
    hints = {"read_output": f"process.logs with process_id={session.id} has its output up to the kill."}
    if which == "pids":
        pids_max = limits.pids_max if limits is not None else None
        raise ResourceLimitExceeded(
            f"process {session.id} was killed for starting more processes than its limit of {pids_max}",
            hints=hints,
            process_id=session.id,
            limit="pids",
            pids_max=pids_max,
            memory_peak_bytes=peak,
        )
    limit_bytes = limits.memory_bytes if limits is not None else None
    raise ResourceLimitExceeded(
        f"process {session.id} was killed for exceeding its memory limit"
        + (f" of {limit_bytes} bytes" if limit_bytes is not None else "")
        + (f" (peak {peak} bytes)" if peak is not None else ""),
        hints=hints,
        process_id=session.id,
        limit="memory",
        limit_bytes=limit_bytes,
        memory_peak_bytes=peak,
    )


def capability_tools(supervisor: Supervisor) -> list[ToolSpec]:
    """The process.* tools over ``supervisor``: run and kill are Notify (the gate audits them),
    the rest Autonomous."""
    caps = ProcessCapabilities(supervisor)

    def rendered(data: dict[str, Any], notes: list[str] | None = None) -> ToolResult:
        text = dumps(data)
        if notes:
            text += "\n" + "\n".join(notes)
        return ToolResult(text, data)

    async def run(arguments: Mapping[str, Any], scope: str) -> ToolResult:
        try:
            params: RunInput = parse_arguments(RunInput, arguments)
        except InvalidArgument as exc:
            if "timeout" in exc.details.get("fields", []):
                exc.hints["use_background"] = (
                    f"timeout is 1 to {MAX_TIMEOUT_SEC} seconds; for longer commands pass background=true."
                )
            raise
        out = await caps.run(params, scope)
        notes = []
        if out.state == "timed_out":
            notes.append(
                f"[timed out after {params.timeout} s; the process tree was ended. Rerun with a higher timeout "
                f"(max {MAX_TIMEOUT_SEC}) or background=true.]"
            )
        elif out.state == "running":
            notes.append(
                f"[running in the background: process.monitor / process.logs / process.kill "
                f"with process_id={out.process_id}]"
            )
        if out.output_note:
            notes.append(f"[{out.output_note}]")
        if out.weaker_box:
            notes.append(f"[weaker box: {out.weaker_box}]")
        return rendered(_dump(out), notes)

    async def monitor(arguments: Mapping[str, Any], scope: str) -> ToolResult:
        out = await caps.monitor(parse_arguments(MonitorInput, arguments), scope)
        return rendered(_dump(out), [f"[{out.output_note}]"] if out.output_note else [])

    async def kill(arguments: Mapping[str, Any], scope: str) -> ToolResult:
        return rendered(_dump(await caps.kill(parse_arguments(KillInput, arguments), scope)))

    async def list_(arguments: Mapping[str, Any], scope: str) -> ToolResult:
        listing = (await caps.list(parse_arguments(ListInput, arguments), scope)).model_dump()
        listing["processes"] = [_spec_shaped(entry) for entry in listing["processes"]]
        if listing["next"] is None:
            del listing["next"]  # all of them shown: spec 000's two fields only
            return rendered(listing)
        more = listing["total"] - len(listing["processes"])
        return rendered(listing, [f"[{more} more not shown here: {listing['next']}]"])

    async def logs(arguments: Mapping[str, Any], scope: str) -> ToolResult:
        out, notes = await caps.logs(parse_arguments(LogsInput, arguments), scope)
        lines = []
        for name in ("stdout", "stderr"):
            if f"{name}_next_offset" in notes:
                lines.append(
                    f"[{name} truncated by limit: next offset {notes[f'{name}_next_offset']} "
                    f"of {getattr(out, name + '_size')} bytes]"
                )
            if f"{name}_dropped_bytes" in notes:
                lines.append(
                    f"[{notes[f'{name}_dropped_bytes']} bytes of {name} in this range were dropped by "
                    f"{notes[f'{name}_gap_cause']}]"
                )
        if out.output_note:
            lines.append(f"[{out.output_note}]")
        return rendered(_dump(out), lines)

    notify, autonomous = PermissionTier.NOTIFY, PermissionTier.AUTONOMOUS
    tools = [
        ToolSpec("process.run", RUN_DESCRIPTION, RunInput, run, notify, _meta(notify)),
        ToolSpec("process.monitor", MONITOR_DESCRIPTION, MonitorInput, monitor, autonomous, _meta(autonomous)),
        ToolSpec("process.kill", KILL_DESCRIPTION, KillInput, kill, notify, _meta(notify)),
        ToolSpec("process.list", LIST_DESCRIPTION, ListInput, list_, autonomous, _meta(autonomous)),
        ToolSpec("process.logs", LOGS_DESCRIPTION, LogsInput, logs, autonomous, _meta(autonomous)),
    ]
    return tools
