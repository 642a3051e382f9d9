"""The ``exec`` + ``process`` tool pair (specs 001, 002, 004) as a thin face on the supervisor.

Status vocabulary (spec 002): ``running`` (and ``queued`` while a lane slot is awaited), ``done``
(exited 0), ``error`` (non-zero exit, timed out, failed to start), ``killed`` (ended on request).
Output shown to the model is decoded, stripped of ANSI escapes and progress redraws, and cut with
an explicit count of what was cut; the raw bytes stay on disk and ``log`` pages through them.
"""

from __future__ import annotations

import asyncio
import re
import signal as signal_module
from collections.abc import Mapping
from dataclasses import dataclass, replace
from itertools import islice
from pathlib import Path
from typing import Any, Literal

import regex
from pydantic import BaseModel, ConfigDict, Field

from procpilot import chat_context
from procpilot.config import Settings
from procpilot.contract import PermissionTier, ToolResult, ToolSpec, parse_arguments, rename_field
from procpilot.engine.capture import Stream
from procpilot.engine.isolation import weaker_box
from procpilot.engine.keys import encode_literal, encode_paste
from procpilot.engine.precheck import MAX_TIMEOUT_S
from procpilot.engine.restart import restart_policy
from procpilot.engine.session import ExitInfo, Session, check_inputs
from procpilot.engine.spawn import SpawnSpec
from procpilot.engine.states import SessionState
from procpilot.engine.supervisor import Supervisor
from procpilot.errors import (
    ElevationDenied,
    InvalidArgument,
    InvalidPattern,
    InvalidStream,
    ProcpilotError,
    ProtectedVariable,
    SessionNotFound,
)
from procpilot.faces.budget import WINDOW_FACTOR, Shown, binary_note, log_call, nothing_new, read_budgeted
from procpilot.faces.openclaw_profile import PROCPILOT, Profile, profile_for
from procpilot.policy.script_preflight import check_scripts, might_run_scripts
from procpilot.render import cut_marker, derive_name, for_model, head_chars, tail_chars

__all__ = ["ACTIONS", "CommandOnly", "ExecParams", "ProcessParams", "exec_process_tools", "process_served", "status_of"]

ACTIONS = (
    "list",
    "poll",
    "log",
    "write",
    "send-keys",
    "submit",
    "paste",
    "kill",
    "clear",
    "remove",
    "wait",
)
# The actions that change a session (its input, its life, its record): each call is audited.
STATE_CHANGING_ACTIONS = frozenset({"write", "send-keys", "submit", "paste", "kill", "clear", "remove"})
_POLL_MAX_WAIT_MS = 30_000
# yieldMs as OpenClaw applies it: a shorter wait is made 10 ms (said in the result: yieldMsApplied);
# a longer one is refused by the schema, which says so, rather than cut short in silence.
_YIELD_MIN_MS = 10
_YIELD_MAX_MS = 120_000
_WAIT_MAX_MS = 600_000
# Bounds on numbers an agent sends: past them a value means nothing but an overflow later.
_MAX_COUNT = 2**53  # JSON's exact integers
_MAX_PATTERN = 4096  # characters of a wait regex: it is compiled, and matched, on the event loop
_WAIT_DEFAULT_MS = 30_000
_WRITE_DEFAULT_MS = 5_000
_LOG_DEFAULT_LINES = 200
_TAIL_CHARS = 2000  # spec 001: a status response's tail, "Last 2000 chars (quick preview)"
# Spec 002: past this much output, results name the file that holds it, for the agent's file tools.
_OFFLOAD_BYTES = 10 * 1024
# Bytes read per character wanted: room for 4-byte characters, escapes and redraws stripped.
_TAIL_WINDOW_FACTOR = WINDOW_FACTOR
# The engine's fields an exec argument is called otherwise (errors name what the agent sent).
_EXEC_FIELDS = {"working_directory": "workdir"}
_SIGNALS = {"SIGTERM", "SIGKILL", "SIGINT", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2"}


def status_of(session: Session) -> str:
    """The session's status in our own vocabulary (spec 002)."""
    return PROCPILOT.of(session)


def exit_event(info: ExitInfo, profile: Profile = PROCPILOT) -> dict[str, Any]:
    """A session's end as the exec/process vocabulary tells it (the daemon's SSE ``exit`` event)."""
    return {
        "type": "exit",
        "sessionId": info.session_id,
        "status": profile.status(info.state, info.exit_code, info.exit_signal),
        "state": info.state.value,
        "exitCode": info.exit_code,
        "exitSignal": info.exit_signal,
        "durationMs": info.duration_ms,
        "backgrounded": info.backgrounded,
        "command": info.command,
        "tail": info.tail,
        "uri": f"proc://{info.session_id}",
    } | _node(info.node)


def _node(node: str | None) -> dict[str, Any]:
    """On a cluster, where the session runs (the Ray node id); nothing on one host."""
    return {} if node is None else {"node": node}


def session_resource(supervisor: Supervisor, session: Session) -> dict[str, Any]:
    """What ``proc://{sessionId}`` holds: the session's status, exit code and the tail of its output."""
    return {
        "sessionId": session.id,
        "status": profile_for(supervisor.settings).of(session),
        "state": session.state.value,
        "exitCode": session.exit_code,
        "exitSignal": session.exit_signal,
        "durationMs": session.duration_ms,
        "command": session.command,
        "pid": session.pid,
        "tail": supervisor.tail_text(session),
    } | _node(session.node)


class ExecParams(BaseModel):
    model_config = ConfigDict(extra="forbid", title="exec")

    command: str = Field(min_length=1)  # "a shell command" (sh -c) in the tool description
    workdir: str | None = None  # the workspace unless given
    env: dict[str, str] | None = Field(None, description="Extra variables.")
    yieldMs: int | None = Field(  # noqa: N815 - the specs' parameter name
        None,
        ge=0,
        le=_YIELD_MAX_MS,
        description="ms before backgrounding (default 10000; null: never).",
    )
    background: bool = False
    timeout: float | None = Field(
        None,
        ge=0,
        le=MAX_TIMEOUT_S,
        description="Seconds before the tree is killed (default 1800; 0: none).",
    )
    pty: bool = False
    elevated: bool = Field(False, description="Outside the sandbox if allowed.")
    notifyOnExit: bool | None = Field(  # noqa: N815
        None, description="Announce its exit (default true)."
    )
    lane: str | None = Field(None, description="main, subagent or cron[:job].")
    restart: Literal["no", "on-failure", "always"] | None = Field(
        None,
        description="Rerun when it ends on its own.",
    )
    maxRestarts: int | None = Field(  # noqa: N815
        None, ge=0, le=10_000
    )  # 10 unless given ([exec] max_restarts)
    name: str | None = Field(
        None,
        max_length=64,
        description="Usable as sessionId.",
    )


@dataclass(slots=True)  # not frozen: a frozen dataclass's __init__ sets each field by a call
class CommandOnly:
    """An exec call that gave only its command (``{"command": "true"}``, the most common call),
    read without pydantic: ExecParams's fields with its defaults (a test holds the two together).
    Validating the arguments costs ~40 µs more after an agent's idle gap, for a check whose
    answer is known: a non-empty string is a valid command, and every other field is absent."""

    command: str
    workdir: str | None = None
    env: dict[str, str] | None = None
    yieldMs: int | None = None  # noqa: N815 - ExecParams's names
    background: bool = False
    timeout: float | None = None
    pty: bool = False
    elevated: bool = False
    notifyOnExit: bool | None = None  # noqa: N815
    lane: str | None = None
    restart: Literal["no", "on-failure", "always"] | None = None
    maxRestarts: int | None = None  # noqa: N815
    name: str | None = None


def exec_params(arguments: Mapping[str, Any]) -> ExecParams | CommandOnly:
    """The arguments of an exec call, validated: a lone non-empty string command as it is (the
    same values ExecParams would hold), anything else by ExecParams (whose errors say what is wrong)."""
    if len(arguments) == 1:
        command = arguments.get("command")
        if type(command) is str and command:  # exactly str: a subclass pydantic would convert
            return CommandOnly(command)
    params: ExecParams = parse_arguments(ExecParams, arguments)
    return params


class ProcessParams(BaseModel):
    model_config = ConfigDict(extra="forbid", title="process")

    action: str  # the tool description names each action and what it does
    sessionId: str | None = Field(  # noqa: N815
        None, max_length=256, description="Id, prefix or name."
    )
    data: str | None = None
    eof: bool = False
    keys: list[str] | None = Field(None, description="send-keys: e.g. C-c.")
    hex: list[str] | None = None  # send-keys: bytes as hex (the tool description says so)
    literal: str | None = None
    text: str | None = None
    pattern: str | None = Field(None, max_length=_MAX_PATTERN, description="wait: a regex.")
    stream: Literal["combined", "both", "stdout", "stderr"] | None = Field(
        None, description="Default both (arrival order)."
    )
    offset: int | None = Field(
        None,
        ge=0,
        le=_MAX_COUNT,
        description="log: first line; list: rows to skip; wait: from byte.",
    )
    limit: int | None = Field(None, ge=0, le=_MAX_COUNT, description="log: lines; poll: most characters.")
    timeout: int | None = Field(
        None,
        ge=0,
        le=_WAIT_MAX_MS,  # wait's and write's most; poll's is less, and its result says what it applied
        description="ms to block (poll, wait, write; default 5000).",
    )
    signal: str | None = Field(None, description="kill: signal (default SIGTERM).")


def _stream(name: str | None) -> Stream:
    if name in (None, "combined", "both"):
        return Stream.COMBINED
    try:
        return Stream(name)
    except ValueError:
        raise InvalidStream(f"stream must be stdout, stderr or both, not {name!r}") from None


class ExecProcessFace:
    def __init__(self, supervisor: Supervisor, *, notifies_exit: bool | None = None) -> None:
        self.sup = supervisor
        self.cfg = supervisor.settings.exec
        # Every way the openclaw profile differs from ours is a member of this (openclaw_profile.py).
        self.profile = profile_for(supervisor.settings)
        self._preflight = (
            self.profile.script_preflight if self.cfg.script_preflight is None else self.cfg.script_preflight
        )
        self._notifies_exit = notifies_exit
        # Spec 004: "If the process tool is disallowed, exec runs synchronously and ignores
        # yieldMs/background": turned off ([tools.process]) or left out of what is served
        # (--tools exec,process.run), where a sessionId would name a run nothing can manage.
        self.process_served = process_served(supervisor.settings)
        self._empty_polls: dict[str, int] = {}
        # Per session and stream: the byte offset after the last reported pattern match.
        self._wait_cursors: dict[str, dict[Stream, int]] = {}
        # Per session and view: where the last poll stopped, as a byte offset and the newlines
        # before it (face state, not the engine's).
        self._poll_cursors: dict[str, dict[Stream, tuple[int, int]]] = {}
        # Per session: its display name, derived once (reading a 100 KB command line takes tens
        # of ms, and list and poll show the name on every call).
        self._names: dict[str, str] = {}
        # The tables are pruned when they have doubled since the last pruning: a walk over every
        # session kept on each call would make a call's cost grow with the sessions kept.
        self._prune_at = _PRUNE_MIN

    def _exit_is_announced(self, session: Session) -> bool:
        """Whether anything will tell the caller this session ended: the transport says so, or,
        when it did not say, whether anything listens for exit events (the daemon does; a stdio
        MCP server has nobody to push to)."""
        if not session.spec.notify_on_exit:
            return False
        if self._notifies_exit is not None:
            return self._notifies_exit
        return self.sup.exits.has_listeners

    # -- shared pieces -------------------------------------------------------------------------

    def _name(self, session: Session) -> str:
        name = self._names.get(session.id)
        if name is None:
            name = self._names[session.id] = derive_name(session.spec.shell or session.command)
        return name

    def _summary(self, session: Session, *, input_check: bool = True) -> dict[str, Any]:
        """What every result says of a session. ``input_check=False`` reuses a recent answer for
        ``waitingForInput`` (a list of many sessions) and leaves it out when there is none."""
        data: dict[str, Any] = {
            "sessionId": session.id,
            "status": self.profile.of(session),
            "state": session.state.value,
            "pid": session.pid,
            "exitCode": session.exit_code,
            "exitSignal": session.exit_signal,
            "durationMs": session.duration_ms,
            "cwd": str(session.spec.cwd) if session.spec.cwd else None,
            "command": session.command,
            "name": session.name or self._name(session),
            "sessionName": session.name,
        }
        if session.spec.restart is not None:
            data["restarts"] = session.restarts
        data |= _node(session.node)
        if (weaker := weaker_box(session.spec.isolation)) is not None:
            data["weakerBox"] = weaker  # the operator allowed a fallback, and it serves this session
        if session.error:
            data["error"] = session.error
        if lost := session.output[Stream.COMBINED].lost:
            data["outputDropped"] = lost
        if session.exit_code == 127 and (missing := _shell_not_found(session)) is not None:
            data["commandNotFound"] = missing
        if session.is_running:
            waiting = session.waiting_for_input if input_check else session.last_waiting_for_input(_INPUT_CHECK_AGE)
            if waiting is not None:
                data["waitingForInput"] = waiting
        elif session.timed_out_waiting_for_input:
            data["timedOutWaitingForInput"] = True
        if session.is_running and session.custody.not_held is not None:
            # The holder refused its copies (its table was full): it ends with this server.
            data["survive"] = False
            data["surviveWhy"] = session.custody.not_held
        if session.signals_sent:
            data["signalsSent"] = [{"signal": name, "atMs": ms} for name, ms in session.signals_sent]
        return data

    def _ending(self, session: Session) -> str:
        if session.state is SessionState.TIMED_OUT:
            why = "; it was waiting for input on stdin" if session.timed_out_waiting_for_input else ""
            limit = f"{session.spec.timeout:g} s" if session.spec.timeout else "its"
            return f"timed out at the {limit} limit{why}; the process tree was ended{_signals(session)}"
        if session.state is SessionState.KILLED:
            # The status word already says "killed": the ending says how, not "killed" again.
            sent = _signals(session) or f" ({session.exit_signal})"
            return f"ended after {session.duration_ms} ms{sent}"
        if session.state is SessionState.LIMIT_EXCEEDED:
            return f"ended by its memory limit after {session.duration_ms} ms"
        if session.state is SessionState.FAILED_TO_START:
            return f"failed to start: {session.error}"
        if session.state is SessionState.LOST:
            return f"lost: {session.error}"
        how = f"exit code {session.exit_code}" if session.exit_code is not None else f"{session.exit_signal}"
        missing = _shell_not_found(session)
        if missing is not None:
            how += f": the shell found no command {missing!r} (check the name; `command -v {missing}`)"
        return f"{how} after {session.duration_ms} ms"

    async def _show(self, session: Session, stream: Stream, start: int, start_line: int, limit: int) -> Shown:
        """What a result shows of the output from ``start`` on: head and tail within ``limit``
        characters (faces/budget.py), and a line for binary output it cannot show."""
        shown = await read_budgeted(session, stream, start, start_line, limit)
        if not shown.binary:  # the common case: no note, so no listing of the log's files for one
            return shown
        note = binary_note(shown.binary, shown.read_bytes, self._where(session))
        if note is None:
            return shown
        return replace(shown, text=f"{note}\n{shown.text}" if shown.text.strip() else note)

    @staticmethod
    def _cut_call(session: Session, stream: Stream, shown: Shown) -> str:
        """The call that reads what ``shown`` left out."""
        return log_call(session.id, stream, shown.first_cut_line, max(1, shown.cut_lines))

    def _next_for_running(self, session: Session) -> str:
        """What an agent does next about a session still running (the ``next`` field)."""
        if session.is_running and session.last_waiting_for_input(_INPUT_CHECK_AGE):
            return f"process write sessionId={session.id} data=..."
        return f"process wait sessionId={session.id}"

    def _where(self, session: Session) -> str:
        files = session.log_files
        return files[0] if len(files) == 1 else str(session.output.directory)

    # -- exec ----------------------------------------------------------------------------------

    async def exec(self, arguments: Mapping[str, Any], scope: str) -> ToolResult:
        params = exec_params(arguments)
        # Specs 001/002/004: the default timeout bounds every run, background ones too (a dev
        # server asks for timeout 0); so does OpenClaw's exec since its background-abort test
        # says "background exec without explicit timeout applies default timeout".
        timeout = self.cfg.timeout_sec if params.timeout is None else params.timeout
        # Without the process tool nothing could ever write to a stdin pipe: a prompt would hang
        # until the timeout. /dev/null makes it read EOF at once instead (as the openclaw profile
        # has it for every command without a terminal).
        stdin = ("pipe" if params.pty else self.profile.stdin_without_pty) if self.process_served else "null"
        # The engine's fences, as for every face: a workdir outside the workspace (.., absolute,
        # a symlink out) is PathOutOfScope, an override of PATH/LD_*/... is ProtectedVariable.
        try:
            spec = SpawnSpec(
                command=params.command,
                cwd=Path(params.workdir) if params.workdir else None,
                workspace=self.sup.settings.workspace_root,
                env={**(params.env or {}), **self.profile.env},
                elevated=params.elevated,  # the agent's policy decides (spawn filter)
                timeout=timeout or None,
                pty=params.pty,
                pty_size=(self.cfg.pty_cols, self.cfg.pty_rows),
                lane=params.lane,
                name=params.name,
                restart=restart_policy(
                    params.restart,
                    params.maxRestarts,
                    background=params.background,
                    default_mode=self.cfg.restart,
                    default_max_restarts=self.cfg.max_restarts,
                    backoff=self.cfg.restart_backoff_ms / 1000,
                ),
                notify_on_exit=self.cfg.notify_on_exit if params.notifyOnExit is None else params.notifyOnExit,
                stdin=stdin,
            )
        except ProcpilotError as exc:
            rename_field(exc, _EXEC_FIELDS)
            raise
        if self._preflight and spec.shell is not None and might_run_scripts(params.command):
            # A shell reading and a few file reads: off the loop, where no other agent waits on them.
            await asyncio.to_thread(
                check_scripts,
                spec.shell,
                spec.cwd or self.sup.settings.workspace_root,
                fail_closed=self.profile.preflight_fails_closed,
            )
        if not self.process_served:
            yield_ms: int | None = None  # no process tool to come back with: stay in the foreground
        elif params.background:
            yield_ms = 0
        elif "yieldMs" in arguments and arguments["yieldMs"] is None:
            # Spec 001: an explicit null stays in the foreground (the timeout still bounds it);
            # parse_arguments reads a null as "the default", so the raw arguments tell.
            yield_ms = None
        else:
            yield_ms = self.cfg.background_ms if params.yieldMs is None else max(params.yieldMs, _YIELD_MIN_MS)
        try:
            session = await self.sup.run(spec, scope=scope, yield_ms=yield_ms)
        except ProtectedVariable as exc:  # the environment's check, in the engine's start
            raise self.profile.refused_env(exc) from None
        except ElevationDenied as exc:  # the spawn filter's, on the way in
            raise self.profile.refused_elevation(exc, chat_context.current()) from None
        data = self._summary(session)
        if params.yieldMs is not None and yield_ms != params.yieldMs:
            data["yieldMsApplied"] = yield_ms  # what was accepted is what was applied, or it is said
        if session.finished:
            view = session.output[Stream.COMBINED]
            shown = nothing_new(session, Stream.COMBINED, 0)  # no output: no coroutines to read none
            if shown is None:
                shown = await self._show(session, Stream.COMBINED, 0, 0, self.cfg.result_max_chars)
            self._poll_cursors.setdefault(session.id, {})[Stream.COMBINED] = (shown.end, shown.end_line)
            data |= {"output": shown.text, "outputCutChars": shown.cut_chars, "outputBytes": view.size}
            ending = self._ending(session)
            header = ""
            if shown.cut_chars:
                data |= {"outputCutLines": shown.cut_lines, "next": self._cut_call(session, Stream.COMBINED, shown)}
            if view.size > _OFFLOAD_BYTES:
                header += f"\n[{view.size} bytes of output, also in the file {self._where(session)}]"
            if shown.cut_chars or view.size > _OFFLOAD_BYTES:
                data["logPath"] = self._where(session)
            data["note"] = f"{self.profile.of(session)}: {ending}"
            text = self.profile.finished_text(session, shown.text, ending, poll=False)
            return _noting_loss(session, ToolResult(text + header + _weaker_note(data), data))
        tail = self.sup.tail_text(session, _TAIL_CHARS)
        announced = self._exit_is_announced(session)
        data |= {
            "tail": tail,
            "logPath": self._where(session),
            "note": f"{self.profile.of(session)} in the background; "
            + ("its exit will be announced" if announced else "wait or poll to learn when it ends"),
            "next": self._next_for_running(session),
        }
        if data.get("waitingForInput"):
            # A command stopped at a prompt never ends on its own: say so where the model reads.
            data["note"] += "; it is waiting for input on stdin (use process write)"
        elif not tail and session.is_running:
            data["note"] += _NO_OUTPUT_YET
        text = self.profile.backgrounded_text(session, tail, announced=announced)
        if data.get("waitingForInput"):
            text += f"\n[waiting for input on stdin: process write sessionId={session.id} data=...]"
        return _noting_loss(session, ToolResult(text + _weaker_note(data), data))

    # -- process -------------------------------------------------------------------------------

    async def process(self, arguments: Mapping[str, Any], scope: str) -> ToolResult:
        params: ProcessParams = parse_arguments(ProcessParams, arguments)
        if params.action not in ACTIONS:
            raise InvalidArgument(
                f"unknown action {params.action!r}",
                hints={"use_valid_action": "Use one of: " + ", ".join(ACTIONS) + "."},
                field="action",
            )
        if params.action == "list":
            return await self._list(scope, params.offset or 0)
        if not params.sessionId:
            raise InvalidArgument(
                f"sessionId is required for action {params.action!r}",
                hints={"see_your_sessions": "Call process with action='list' to see your session ids."},
                field="sessionId",
            )
        try:
            session = self.sup.get(scope, params.sessionId)
        except SessionNotFound:
            answer = self.profile.unknown_session(params.sessionId)
            if answer is None:
                raise
            return ToolResult(*answer)
        handler = getattr(self, "_" + params.action.replace("-", "_"))
        result: ToolResult = await handler(session, params, scope)
        if params.action in ("remove", "clear"):
            self._prune(session.id)
        self._prune()
        return _noting_loss(session, result)

    def _prune(self, gone: str | None = None) -> None:
        """Forget per-session state of sessions that are gone: ``gone`` (removed or cleared by this
        face) at once, the rest (expired, removed elsewhere) once the tables have doubled."""
        tables: tuple[dict[str, Any], ...] = (self._empty_polls, self._wait_cursors, self._poll_cursors, self._names)
        if gone is not None:
            for table in tables:
                table.pop(gone, None)
            return
        if sum(map(len, tables)) < self._prune_at:
            return
        live = {s.id for s in self.sup.all_sessions()}
        for table in tables:
            for session_id in [k for k in table if k not in live]:
                del table[session_id]
        self._prune_at = max(_PRUNE_MIN, 2 * sum(map(len, tables)))

    async def _list(self, scope: str, offset: int) -> ToolResult:
        rows = []
        lines = []
        # Spec 004: "Only backgrounded sessions are listed": a run that ended in the foreground
        # already gave its whole result (its sessionId still works for log and poll).
        every = [s for s in self.sup.list(scope) if s.backgrounded]  # newest first
        # offset: the rows already seen (a page of a long list), bounded by the field itself
        sessions = _within_budget(every[offset:], self.cfg.result_max_chars) if offset < len(every) else []
        await self.sup.observe(sessions)  # on a cluster: the nodes' figures and stdin waits
        # waitingForInput: a recent answer, else a fresh one for the newest sessions only, read
        # off the loop beside the usage figures
        unchecked = (s for s in sessions if s.is_running and s.last_waiting_for_input(_INPUT_CHECK_AGE) is None)
        usages, _ = await asyncio.gather(
            self.sup.usage.snapshot(sessions), check_inputs(list(islice(unchecked, _LIST_INPUT_CHECKS)))
        )
        for s in sessions:
            usage = usages[s.id]  # None: running, not sampled yet (unknown, never a false zero)
            row = self._summary(s, input_check=False)
            row |= {
                "command": _clipped(s.command),  # poll shows it whole: a list is for finding sessions
                "runtimeMs": row["durationMs"],
                "backgrounded": s.backgrounded,
                "startedAt": s.created_at,
                "cpuMs": None if usage is None else usage.cpu_ms,
                "memoryBytes": None if usage is None else usage.memory_peak_bytes or None,  # 0: not measured
            }
            rows.append(row)
            lines.append(self.profile.list_line(s, row))
        data: dict[str, Any] = {"sessions": rows, "total": len(every)}
        if offset:
            data["offset"] = offset
        if not sessions:
            empty = "No sessions." if not every else f"No sessions past offset {offset} ({len(every)} in all)."
            return ToolResult(empty, data)
        if omitted := len(every) - len(sessions):
            end = min(offset, len(every)) + len(sessions)
            older = len(every) - end
            # Every row not shown is named: the newer ones skipped by offset, the older ones by
            # the budget, with the call that lists those (poll, log and wait take any id anyway).
            parts = [f"{min(offset, len(every))} newer sessions skipped (offset)"] if offset else []
            if older:
                parts.append(f"{older} older sessions not listed, to keep this result within its budget")
                data["next"] = f"process list offset={end}"
            note = "; ".join(parts) + "; poll, log, wait and remove take any sessionId"
            if older:
                note += f"; {data['next']} lists the next ones"
            lines.append(f"[{note}]")
            data |= {"omitted": omitted, "note": note}
        return ToolResult("\n".join(lines), data)

    async def _poll(self, session: Session, params: ProcessParams, scope: str) -> ToolResult:
        stream = _stream(params.stream)
        view = session.output[stream]
        cursor, cursor_line = self._poll_cursors.get(session.id, {}).get(stream, (0, 0))
        repeated = session.finished and self.profile.finished_poll_repeats
        if repeated:
            cursor, cursor_line = 0, 0
        blocked_ms = min(params.timeout or 0, _POLL_MAX_WAIT_MS)
        if blocked_ms and view.size <= cursor and not session.finished:
            await session.output.wait_for_change(blocked_ms / 1000)
        # A finished session has nothing more to come: hand over all that is unread (up to the
        # result budget), head and tail, so the last poll never hides the ending nor the start.
        default = self.cfg.result_max_chars if session.finished else self.cfg.max_output_chars
        wanted = default if params.limit is None else params.limit
        limit = min(wanted, self.cfg.pending_max_chars, self.cfg.result_max_chars)
        shown = await self._show(session, stream, cursor, cursor_line, limit)
        await self.sup.observe([session])
        self._poll_cursors.setdefault(session.id, {})[stream] = (shown.end, shown.end_line)
        data = self._summary(session) | {"output": shown.text, "cutChars": shown.cut_chars, "stream": stream.value}
        if params.timeout and blocked_ms != params.timeout:
            data["timeoutApplied"] = blocked_ms  # poll blocks at most 30 s: wait is the long block
        steps = self.profile.retry_steps_ms
        empty = not (shown.text or shown.cut_chars or session.finished)
        if not empty:
            self._empty_polls.pop(session.id, None)
            if self.profile.retry_after_output and not session.finished:
                data["retryInMs"] = steps[0]
        else:
            n = self._empty_polls.get(session.id, 0)
            self._empty_polls[session.id] = n + 1
            data["retryInMs"] = steps[min(n, len(steps) - 1)]
        if self.profile.aggregated:
            data["aggregated"] = await self._aggregated(session)
        head = ""
        if view.size > _OFFLOAD_BYTES:
            data["logPath"] = self._where(session)
        if shown.cut_chars:
            data |= {"cutLines": shown.cut_lines, "next": self._cut_call(session, stream, shown)}
            if "logPath" in data:
                head = f"[{view.size} bytes of output in all, also in the file {data['logPath']}]\n"
        if session.finished:
            ending = self._ending(session)
            data["note"] = f"{self.profile.of(session)}: {ending}"
            text = self.profile.finished_text(session, shown.text, ending, poll=True, repeated=repeated)
            return ToolResult(head + text, data)
        note = "running"
        if data.get("waitingForInput"):
            note += "; waiting for input on stdin (use process write)"
        if empty:
            note += f"; no new output, poll again in {data['retryInMs']} ms or use process wait"
        data["note"] = note
        data.setdefault("next", self._next_for_running(session))
        return ToolResult(head + self.profile.running_text(shown.text, f"[{note}]"), data)

    async def _aggregated(self, session: Session) -> str:
        """The output so far as OpenClaw's ``aggregated`` holds it: its newest ``resultMaxChars``."""
        return (await self._show(session, Stream.COMBINED, 0, 0, self.cfg.result_max_chars)).text

    async def _log(self, session: Session, params: ProcessParams, scope: str) -> ToolResult:
        stream = _stream(params.stream)
        view = session.output[stream]
        total = view.total_lines
        note = None
        count: int | None
        if params.offset is not None:
            first, count = params.offset, params.limit
        elif params.limit is not None:
            first, count = max(0, total - params.limit), params.limit
        else:
            first, count = max(0, total - _LOG_DEFAULT_LINES), _LOG_DEFAULT_LINES
            note = self.profile.log_note(min(total, count), total)
        if first >= total > 0:
            note = f"offset {first} is past the end: there are {total} lines (offsets 0 to {max(0, total - 1)})"
        # Reading stops a little past what one result can show: the rest is counted, not loaded.
        # A range too long for one result keeps its first and its last lines, with a marker for
        # the lines between them and the call that reads them.
        budget = self.cfg.result_max_chars
        window = budget * _TAIL_WINDOW_FACTOR // 2
        head_slice = await session.page_lines(stream, first, count, max_bytes=window)
        text = for_model(b"\n".join(head_slice.lines))
        lines_shown, dropped_lines = len(head_slice.lines), head_slice.dropped_lines
        cut = cut_lines = 0
        marker = None
        if len(text) > budget or head_slice.unread_bytes:
            head, _ = head_chars(text, budget // 2)
            head_lines = head.count("\n")  # a line the head cuts is not shown: the marker covers it
            last = min(head_slice.total, head_slice.first + (head_slice.total if count is None else count))
            rest = max(0, last - head_slice.first - head_lines)
            tail_slice = await session.page_lines(stream, last - rest, rest, max_bytes=window, keep_end=True)
            tail_text = for_model(b"\n".join(tail_slice.lines))
            tail, _ = tail_chars(tail_text, budget - len(head))
            tail_lines = tail.count("\n") + 1 if tail else 0
            cut_lines = max(0, rest - tail_lines)
            cut = len(tail_text) + tail_slice.unread_bytes - len(tail)
            first_cut = head_slice.first + head_lines
            call = log_call(session.id, stream, first_cut, max(1, cut_lines))
            marker = cut_marker(cut_lines, cut, call)
            text = f"{head.rstrip(chr(10))}\n{marker}\n{tail}"
            lines_shown = head_lines + tail_lines
            dropped_lines += tail_slice.dropped_lines
        data = self._summary(session) | {
            "output": text,
            "offset": head_slice.first,
            "lines": lines_shown,
            "totalLines": total,
            "completeLines": view.lines,  # lines ended by a newline: a follower holds back only the rest
            "totalBytes": view.size,
            "totalChars": len(text) if marker is None and head_slice.first == 0 and lines_shown >= total else None,
            "droppedBytes": view.dropped,
            "logPath": self._where(session),
            "stream": stream.value,
        }
        if marker is not None:
            data |= {"cutChars": cut, "cutLines": cut_lines, "next": call}
        if self.profile.aggregated:
            data["aggregated"] = await self._aggregated(session)
        parts = [text] if text else []
        if dropped_lines:
            parts.append(f"[{dropped_lines} lines in this range were dropped by {view.gap_cause}]")
        if note:
            parts.append(f"[{note}]")
            data["note"] = note
        return ToolResult("\n".join(parts) if parts else "[no output]", data)

    async def _write(self, session: Session, params: ProcessParams, scope: str) -> ToolResult:
        if params.data is None and not params.eof:
            raise InvalidArgument("write needs data (or eof=true)", field="data")
        payload = encode_literal(params.data or "", "data")
        return await self._send(session, params, scope, payload, eof=params.eof)

    async def _send(
        self, session: Session, params: ProcessParams, scope: str, payload: bytes, eof: bool = False
    ) -> ToolResult:
        timeout_ms = _WRITE_DEFAULT_MS if params.timeout is None else params.timeout  # the schema bounds it
        written = await self.sup.write(scope, session.id, payload, eof=eof, timeout=timeout_ms / 1000)
        data = self._summary(session) | {
            "bytesWritten": written,
            "bytesNotWritten": len(payload) - written,
            "stdinClosed": not session.stdin_open,
        }
        if written == len(payload):
            text = f"wrote {written} bytes to session {session.id}" + (" and closed stdin" if eof else "")
            return ToolResult(text, data)
        # The pipe stayed full: say exactly what did not go, never drop it quietly.
        text = (
            f"wrote only {written} of {len(payload)} bytes to session {session.id}: it did not read its stdin "
            f"within {timeout_ms} ms, so the other {len(payload) - written} bytes were NOT sent"
            + (" and stdin was left open (eof not applied)" if eof else "")
            + ".\nWhat to do next:\n- check_output: poll or log the session to see whether it is waiting for "
            "something else.\n- resend_rest: write the unsent part again (a larger timeout waits longer), or kill "
            "the session if it will never read it."
        )
        return ToolResult(text, data)

    async def _send_keys(self, session: Session, params: ProcessParams, scope: str) -> ToolResult:
        if not (params.keys or params.hex or params.literal):
            raise InvalidArgument("send-keys needs keys, hex or literal", field="keys")
        refusal = self.profile.keys_refusal(session, params.keys)
        if refusal is not None:
            return ToolResult(*refusal)
        # Text first, then raw bytes, then keys: {"literal": "ls", "keys": ["Enter"]} types ls and
        # presses Enter (OpenClaw's order, the one an agent expects).
        payload, warnings = self.profile.encode_input(
            params.literal, params.hex, params.keys, app_cursor=session.terminal.app_cursor_keys
        )
        result = await self._send(session, params, scope, payload)
        complete = result.data["bytesNotWritten"] == 0
        text = self.profile.keys_text(result.text, len(payload), session.id, warnings, complete=complete)
        return ToolResult(text, result.data | ({"warnings": warnings} if warnings else {}))

    async def _submit(self, session: Session, params: ProcessParams, scope: str) -> ToolResult:
        # A terminal's Enter is CR; a pipe reader wants LF.
        end = b"\r" if session.spec.pty else b"\n"
        return await self._send(session, params, scope, encode_literal(params.text or "", "text") + end)

    async def _paste(self, session: Session, params: ProcessParams, scope: str) -> ToolResult:
        if params.text is None:
            raise InvalidArgument("paste needs text", field="text")
        # Markers reach a program that never enabled bracketed paste as literal ESC[200~ text.
        payload = encode_paste(params.text, bracketed=session.spec.pty and session.terminal.bracketed_paste)
        return await self._send(session, params, scope, payload)

    async def _kill(self, session: Session, params: ProcessParams, scope: str) -> ToolResult:
        name = (params.signal or "SIGTERM").upper()
        name = name if name.startswith("SIG") else "SIG" + name
        if name not in _SIGNALS:
            raise InvalidArgument(
                f"unsupported signal {params.signal!r}",
                hints={"use_valid_signal": "Use one of: " + ", ".join(sorted(_SIGNALS)) + "."},
                field="signal",
            )
        grace = self.cfg.kill_grace_sec
        if name == "SIGTERM" and not grace:
            name = "SIGKILL"  # killGraceSec 0: spec 001's kill, SIGKILL at once
        await self.sup.kill(scope, session.id, signal_module.Signals[name], grace=grace, wait=grace + 2)
        note = f"{self.profile.of(session)}: {self._ending(session)}"
        data = self._summary(session) | {"signalSent": session.signal_sent, "note": note}
        return ToolResult(f"[{note}]", data)

    async def _clear(self, session: Session, params: ProcessParams, scope: str) -> ToolResult:
        self.sup.clear(scope, session.id)
        data = {"sessionId": session.id, "cleared": True} | _node(session.node)
        return ToolResult(f"cleared session {session.id}", data)

    async def _remove(self, session: Session, params: ProcessParams, scope: str) -> ToolResult:
        was_running = not session.finished
        await self.sup.remove(scope, session.id)
        text = f"{'killed and ' if was_running else ''}removed session {session.id}"
        data = {"sessionId": session.id, "removed": True, "wasRunning": was_running} | _node(session.node)
        return ToolResult(text, data)

    async def _wait(self, session: Session, params: ProcessParams, scope: str) -> ToolResult:
        pattern = None
        if params.pattern is not None:
            try:
                # MULTILINE: ^ and $ match at each line's start and end (a REPL's "42" line),
                # as an agent reading a log line by line expects.
                pattern = regex.compile(params.pattern, regex.MULTILINE)
            except regex.error as exc:
                raise InvalidPattern(f"pattern is not a valid regular expression: {exc}", field="pattern") from None
        timeout_ms = _WAIT_DEFAULT_MS if params.timeout is None else params.timeout  # the schema bounds it
        stream = _stream(params.stream)
        # Each pattern wait scans on from where the last match was reported, so waiting twice for
        # READY waits for the next READY instead of returning the old one; offset (bytes) resets.
        cursors = self._wait_cursors.setdefault(session.id, {})
        since = params.offset if params.offset is not None else cursors.get(stream, 0)
        outcome = await self.sup.wait(
            scope, session.id, timeout=timeout_ms / 1000, pattern=pattern, stream=stream, since=since
        )
        if outcome.reason == "pattern" and outcome.match_offset is not None:
            cursors[stream] = outcome.match_offset
        tail = self.sup.tail_text(session, _TAIL_CHARS)
        data = self._summary(session) | {
            "reason": outcome.reason,
            "match": outcome.match,
            "matchOffset": outcome.match_offset,
            "scannedFrom": since,
            "tail": tail,
        }
        if outcome.reason == "exited":
            ending = self._ending(session)
            data["note"] = f"{self.profile.of(session)}: {ending}"
            if session.output[Stream.COMBINED].size > len(tail.encode()):
                data["next"] = f"process log sessionId={session.id}"
            return ToolResult(self.profile.finished_text(session, tail, ending, poll=True), data)
        if outcome.reason == "pattern":
            head = f"[pattern matched: {outcome.match!r}; session still {self.profile.of(session)}]"
        else:
            quiet = "" if tail or session.output[Stream.COMBINED].size else _NO_OUTPUT_YET
            head = f"[still running after {timeout_ms} ms{quiet}; wait again or poll]"
        data |= {"note": head[1:-1], "next": self._next_for_running(session)}
        return ToolResult(f"{tail}\n{head}" if tail else head, data)


# process list: answers of waitingForInput reused up to this many seconds, and at most this many
# checked afresh per call (each reads /proc for a whole tree): 1,000 sessions list in a few ms.
_INPUT_CHECK_AGE = 2.0
_LIST_INPUT_CHECKS = 16
_PRUNE_MIN = 256  # entries in the face's per-session tables before they are first pruned

# dash's and bash's words for a command word that is no program: "/bin/sh: 1: foo: not found"
# ("1: eval: foo" from a warm shell, which runs the command through eval: engine/warm.py).
_NOT_FOUND = re.compile(
    rb"^(?:/bin/)?(?:sh|bash|dash): (?:line )?\d+: (?:eval: )?(.{1,200}?): (?:command )?not found$", re.M
)


# Said when a running session has printed nothing yet: the likeliest cause is a program that
# buffers its output when it is not writing to a terminal (C stdio, python without -u).
_NO_OUTPUT_YET = (
    "; no output yet: the program may be buffering its output because it is not writing to a"
    " terminal (try python3 -u, stdbuf -oL, or a tty)"
)


def _signals(session: Session) -> str:
    """The signals procpilot sent the session's tree and when, for an ending's text."""
    if not session.signals_sent:
        return ""
    return " (" + ", then ".join(f"{name} sent at {ms} ms" for name, ms in session.signals_sent) + ")"


def _weaker_note(data: Mapping[str, Any]) -> str:
    return f"\n[weaker box: {data['weakerBox']}]" if "weakerBox" in data else ""


_ROW_CHARS = 600  # a list row's structured fields but its command and cwd, as JSON


_LIST_COMMAND_CHARS = 200  # of a command in a list row; poll and log show the whole of it


def _clipped(command: str) -> str:
    if len(command) <= _LIST_COMMAND_CHARS:
        return command
    return f"{command[:_LIST_COMMAND_CHARS]}…[{len(command) - _LIST_COMMAND_CHARS:,} more chars]"


def _within_budget(sessions: list[Session], budget: int) -> list[Session]:
    """The first of ``sessions`` whose list rows fit one result's budget (at least one): a row is
    counted by its (clipped) command and cwd, without rendering it."""
    spent = 0
    for count, session in enumerate(sessions):
        command = min(len(session.command), _LIST_COMMAND_CHARS + 24)
        spent += _ROW_CHARS + command + len(str(session.spec.cwd or ""))
        if spent > budget and count:
            return sessions[:count]
    return sessions


def _noting_loss(session: Session, result: ToolResult) -> ToolResult:
    """``result``, saying so in its text when the disk refused some of the session's output."""
    note = session.output.lost_note()
    if note is None or result.is_error:
        return result
    return ToolResult(f"{result.text}\n[{note}]", result.data)


def _shell_not_found(session: Session) -> str | None:
    """The command the shell itself could not find, when that is why a shell command ended with
    127. The pre-check refuses a missing program before the start where it can read the command;
    where only the shell can (``VAR=$(...) prog``), its 127 is named here instead of being left
    for the agent to take for the script's own failure. A script that exits 127 for its own
    reasons is left alone: it has no such line at the end of its stderr."""
    if session.exit_code != 127 or not isinstance(session.spec.command, str):
        return None
    view = session.output[Stream.COMBINED]
    tail = view.read(max(0, view.size - 512)).data.rstrip(b"\n").rsplit(b"\n", 1)[-1]
    found = _NOT_FOUND.match(tail)
    return None if found is None else found.group(1).decode(errors="replace")


def process_served(settings: Settings) -> bool:
    """Whether the ``process`` tool is offered beside ``exec``: on, and among the served tools."""
    wanted = settings.served_tools
    return settings.process.enabled and (wanted is None or "process" in wanted)


def exec_process_tools(supervisor: Supervisor, *, notifies_exit: bool | None = None) -> list[ToolSpec]:
    """``exec`` and ``process``; only ``exec`` (always synchronous) when ``[tools.process]`` is off.

    ``notifies_exit``: whether the transport tells the client when a backgrounded session ends
    (the HTTP daemon does, stdio MCP does not), so exec promises a notification only when one
    will come. None decides per call: true iff something listens for the supervisor's exit events.
    """
    face = ExecProcessFace(supervisor, notifies_exit=notifies_exit)
    profile = face.profile
    if not face.process_served:
        return [ToolSpec("exec", profile.exec_sync_description, ExecParams, face.exec, PermissionTier.NOTIFY)]
    return [
        ToolSpec("exec", profile.exec_description, ExecParams, face.exec, PermissionTier.NOTIFY),
        ToolSpec(
            "process",
            profile.process_description,
            ProcessParams,
            face.process,
            PermissionTier.AUTONOMOUS,
            audited_actions=STATE_CHANGING_ACTIONS,
        ),
    ]
