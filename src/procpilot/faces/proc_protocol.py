"""The ``proc/*`` messages of spec 003, answered by an in-process handler over the one supervisor.

Messages (``type`` strings as in the spec)::

    proc/spawn/req   ProcSpawnRequest    -> proc/spawn/resp   ProcSpawnResponse
    proc/write/req   ProcWriteRequest    -> proc/write/resp   ProcWriteResponse
    proc/kill/req    ProcKillRequest     -> proc/kill/resp    ProcKillResponse
    proc/status/req  ProcStatusRequest   -> proc/status/resp  ProcStatusResponse
                                            proc/read/event   ProcReadEvent (pushed, per stream, in order)

Every request may carry an ``id``; its response echoes it. A refused request is its response type
with ``error: {code, message, hints}``; the codes are ``unknown_proc`` (no such process in this
scope), ``proc_dead`` (write/kill on a process that has ended), ``proc_limit`` (``max_procs``
running already), ``command_not_allowed`` (not in ``allowed_commands``) and, for the rest, the
engine error's name in snake case (``command_not_found``, ``path_out_of_scope``,
``protected_variable``, ``invalid_request``, ...).

``ProcState`` from the engine's :class:`SessionState`:

    QUEUED, RUNNING   -> RUNNING
    EXITED_OK         -> STOPPED     (exited 0)
    KILLED            -> STOPPED     (ended on request: proc/kill, or any other face's kill)
    EXITED_ERROR      -> CRASHED     (non-zero exit, or death by a signal nobody asked for)
    FAILED_TO_START   -> CRASHED
    LIMIT_EXCEEDED    -> CRASHED     (ended by its memory limit)
    LOST              -> CRASHED     (gone while no server ran, with no recorded exit)
    TIMED_OUT         -> TIMEDOUT

Output events carry raw text (decoded UTF-8, a character split across reads kept whole; nothing
stripped) for each stream in the order it was read, numbered by ``seq`` per process. Past
``max_output_bytes`` per process no more output is pushed; one last event with
``truncated: true`` says so. The output itself is still captured in full (``process.logs``).
"""

from __future__ import annotations

import enum
import logging
import signal as signal_module
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pydantic
from pydantic import BaseModel, ConfigDict, Field

from procpilot.engine.capture import Stream, Utf8ChunkDecoder
from procpilot.engine.isolation import Isolation
from procpilot.engine.precheck import MAX_TIMEOUT_S
from procpilot.engine.session import ExitInfo, Session
from procpilot.engine.spawn import SpawnSpec
from procpilot.engine.states import SessionState
from procpilot.engine.supervisor import Supervisor
from procpilot.errors import (
    ProcessAlreadyExited,
    ProcpilotError,
    SessionNotFound,
    StdinClosed,
)
from procpilot.policy.commands import CommandDenied, CommandPolicy, UnanalyzableCommand
from procpilot.render import complete_utf8_prefix

__all__ = [
    "PROC_STATE_OF",
    "ProcConfig",
    "ProcError",
    "ProcHandler",
    "ProcKillRequest",
    "ProcKillResponse",
    "ProcReadEvent",
    "ProcSpawnRequest",
    "ProcSpawnResponse",
    "ProcState",
    "ProcStatusRequest",
    "ProcStatusResponse",
    "ProcWriteRequest",
    "ProcWriteResponse",
    "proc_state",
]

_log = logging.getLogger(__name__)
_MIB = 1024 * 1024
_KILL_WAIT_SEC = 5.0  # after SIGKILL, or after SIGTERM's escalation
_SIGINT_WAIT_SEC = 2.0  # SIGINT does not escalate: a program that handles it may well live on


class ProcState(enum.Enum):
    RUNNING = "RUNNING"
    STOPPED = "STOPPED"
    CRASHED = "CRASHED"
    TIMEDOUT = "TIMEDOUT"


PROC_STATE_OF: dict[SessionState, ProcState] = {
    SessionState.QUEUED: ProcState.RUNNING,
    SessionState.RUNNING: ProcState.RUNNING,
    SessionState.RESTARTING: ProcState.RUNNING,
    SessionState.EXITED_OK: ProcState.STOPPED,
    SessionState.KILLED: ProcState.STOPPED,
    SessionState.EXITED_ERROR: ProcState.CRASHED,
    SessionState.FAILED_TO_START: ProcState.CRASHED,
    SessionState.LIMIT_EXCEEDED: ProcState.CRASHED,
    SessionState.TIMED_OUT: ProcState.TIMEDOUT,
    SessionState.LOST: ProcState.CRASHED,  # a server outage or a dead cluster node: its end is unknown
}


def proc_state(session: Session) -> ProcState:
    return PROC_STATE_OF[session.state]


# -- messages ----------------------------------------------------------------------------------


class _Message(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str | None = Field(None, description="Request id; the response echoes it.")


class ProcError(BaseModel):
    code: str
    message: str
    hints: dict[str, str] = Field(default_factory=dict)


class _Response(_Message):
    error: ProcError | None = None
    # Beyond spec 003: on a cluster, the Ray node id the process runs on (absent on one host).
    node: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


class ProcSpawnRequest(_Message):
    type: Literal["proc/spawn/req"] = "proc/spawn/req"
    session_id: str = Field("", description="The agent session this process belongs to (recorded, echoed).")
    cmd: list[str] = Field(min_length=1, description='Command + args, e.g. ["python3", "script.py"]; no shell.')
    cwd: str | None = Field(None, description="Working directory inside the workspace (default: its root).")
    env: dict[str, str] = Field(default_factory=dict, description="Variables merged onto the base environment.")
    stdin_mode: Literal["pipe", "null"] = Field("pipe", description="pipe: proc/write feeds stdin; null: EOF.")
    timeout: float | None = Field(
        None, gt=0, le=MAX_TIMEOUT_S, description="Seconds before the tree is ended (default: config)."
    )


class ProcSpawnResponse(_Response):
    type: Literal["proc/spawn/resp"] = "proc/spawn/resp"
    session_id: str = ""
    proc_id: str | None = None
    pid: int | None = None
    state: ProcState | None = None


class ProcWriteRequest(_Message):
    type: Literal["proc/write/req"] = "proc/write/req"
    proc_id: str
    data: str = ""
    eof: bool = Field(False, description="Close stdin after the data.")


class ProcWriteResponse(_Response):
    type: Literal["proc/write/resp"] = "proc/write/resp"
    proc_id: str | None = None
    bytes_written: int = 0
    stdin_closed: bool = False


class ProcReadEvent(_Message):
    type: Literal["proc/read/event"] = "proc/read/event"
    proc_id: str
    stream_type: Literal["stdout", "stderr"]
    data: str = Field(description="Raw text, not JSON-encoded.")
    seq: int = Field(description="Position of this event among the process's events, from 0.")
    truncated: bool = Field(False, description="True on the one last event pushed past max_output_bytes.")


class ProcKillRequest(_Message):
    type: Literal["proc/kill/req"] = "proc/kill/req"
    proc_id: str
    signal: Literal["SIGTERM", "SIGKILL", "SIGINT"] = "SIGTERM"


class ProcKillResponse(_Response):
    type: Literal["proc/kill/resp"] = "proc/kill/resp"
    proc_id: str | None = None
    signal_sent: str | None = None
    state: ProcState | None = None
    exit_code: int | None = None


class ProcStatusRequest(_Message):
    type: Literal["proc/status/req"] = "proc/status/req"
    proc_id: str


class ProcStatusResponse(_Response):
    type: Literal["proc/status/resp"] = "proc/status/resp"
    proc_id: str | None = None
    state: ProcState | None = None
    pid: int | None = None
    exit_code: int | None = None
    exit_signal: str | None = None
    duration_ms: int | None = None
    reason: str | None = Field(None, description="Why it could not start, if it could not.")
    output_dropped: int = Field(0, description="Bytes of its output the disk refused (ENOSPC...): lost.")


_REQUESTS: dict[str, tuple[type[_Message], type[_Response]]] = {
    "proc/spawn/req": (ProcSpawnRequest, ProcSpawnResponse),
    "proc/write/req": (ProcWriteRequest, ProcWriteResponse),
    "proc/kill/req": (ProcKillRequest, ProcKillResponse),
    "proc/status/req": (ProcStatusRequest, ProcStatusResponse),
}


class ProcConfig(BaseModel):
    """The proc capability's configuration (spec 003's plugin metadata)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    allowed_commands: list[str] | None = None  # None: every command (the agent's policy still applies)
    timeout: float | None = Field(30.0, gt=0)  # default per process; a request's own timeout wins
    max_output_bytes: int = Field(_MIB, ge=0)  # pushed per process; the rest stays on disk only
    max_procs: int = Field(10, ge=1)  # running processes spawned over proc/* per agent (see ProcHandler)
    network_disabled: bool = False  # only a private loopback; refused (fails closed) where no mechanism works


# -- the handler -------------------------------------------------------------------------------

# One proc/log/resp at most: a page is read, decoded and serialised on the event loop.
LOG_PAGE = 256 * 1024


def _log_error(rid: Any, code: str, message: str, hints: dict[str, str] | None = None) -> dict[str, Any]:
    return {"type": "proc/log/resp", "id": rid, "error": {"code": code, "message": message, "hints": hints or {}}}


EventCallback = Callable[[dict[str, Any]], None]


def _node(node: str | None) -> dict[str, Any]:
    return {} if node is None else {"node": node}


def _error(code: str, message: str, hints: dict[str, str] | None = None) -> ProcError:
    return ProcError(code=code, message=message, hints=hints or {})


def _from_exception(exc: ProcpilotError) -> ProcError:
    return _error(exc.proc_code(), exc.message, exc.hints)


@dataclass(slots=True)
class _Pump:
    """Pushes one process's output as events: per stream decoded, in arrival order, capped."""

    proc_id: str
    budget: int
    streams: dict[Stream, Utf8ChunkDecoder]
    seq: int = 0
    sent_bytes: int = 0
    stopped: bool = False
    unsubscribe: Callable[[], None] | None = None


class ProcHandler:
    """Answers proc/* requests for one scope and pushes proc/read/event to its subscribers."""

    def __init__(
        self,
        supervisor: Supervisor,
        scope: str,
        config: ProcConfig | None = None,
        spawned: dict[str, set[str]] | None = None,
    ) -> None:
        """``spawned``: per agent, the processes started over proc/* and maybe still running,
        shared by every handler of one server so ``max_procs`` holds per agent, not per
        connection (one agent on two WebSockets once ran 6 with ``max_procs = 3``). Without it
        the handler counts its own."""
        self.sup = supervisor
        self.scope = scope
        self.config = config or ProcConfig()
        allowed = self.config.allowed_commands
        self._allowed = None if allowed is None else CommandPolicy(allow=tuple(allowed))
        self._subscribers: list[EventCallback] = []
        self._pumps: dict[str, _Pump] = {}
        self._spawned = {} if spawned is None else spawned
        self._remove_exit_callback = supervisor.on_exit(self._on_exit)
        self._closed = False

    # -- subscribers ---------------------------------------------------------------------------

    def subscribe(self, callback: EventCallback) -> Callable[[], None]:
        """Call ``callback(event_dict)`` for every pushed event; returns the unsubscriber."""
        self._subscribers.append(callback)

        def unsubscribe() -> None:
            if callback in self._subscribers:
                self._subscribers.remove(callback)

        return unsubscribe

    def _push(self, event: ProcReadEvent) -> None:
        message = event.model_dump(mode="json", exclude={"id"})
        for callback in list(self._subscribers):
            try:
                callback(message)
            except Exception:
                # A subscriber's bug must not stop the others, nor the engine that is reading output.
                _log.exception("proc/read/event subscriber failed")

    # -- the daemon's additions to spec 003 (plain dicts: the spec has no models for them) --------

    async def log_page(self, request: Mapping[str, Any]) -> dict[str, Any]:
        """``proc/log/req {proc_id, stream_type, offset, limit}``: a byte range of a process's
        output from its log (at most ``LOG_PAGE`` bytes, never ending inside a character)."""
        rid = request.get("id")
        proc_id = str(request.get("proc_id", ""))
        name = request.get("stream_type", "stdout")
        offset, limit = request.get("offset", 0), request.get("limit", LOG_PAGE)
        if name not in ("stdout", "stderr") or not isinstance(offset, int) or not isinstance(limit, int):
            problem = "proc/log/req wants stream_type stdout|stderr and int offset, limit"
            return _log_error(rid, "invalid_request", problem)
        try:
            session = self.sup.get(self.scope, proc_id)
        except SessionNotFound:
            return _log_error(rid, "unknown_proc", f"no process {proc_id!r}")
        try:
            result = await session.page(Stream(name), max(0, offset), max(0, min(limit, LOG_PAGE)))
        except ProcpilotError as exc:  # on a cluster: the node holding the log is gone
            return _log_error(rid, exc.proc_code(), exc.message, exc.hints)
        data = result.data
        if result.end < result.total:
            data = data[: complete_utf8_prefix(data)]
        return {
            "type": "proc/log/resp",
            "id": rid,
            "proc_id": proc_id,
            "stream_type": name,
            "data": data.decode("utf-8", errors="replace"),
            "offset": result.end - len(result.data),
            "next_offset": result.end - (len(result.data) - len(data)),
            "size": result.total,
            "dropped_bytes": result.dropped,
            "finished": session.finished,
        } | _node(session.node)

    def exit_event(self, info: ExitInfo) -> dict[str, Any]:
        """``proc/exit/event``: how a process ended, after its last output event."""
        return {
            "type": "proc/exit/event",
            "proc_id": info.session_id,
            "state": PROC_STATE_OF[info.state].value,
            "exit_code": info.exit_code,
            "exit_signal": info.exit_signal,
            "duration_ms": info.duration_ms,
        } | _node(info.node)

    def exited_already(self, proc_id: str) -> ExitInfo | None:
        """The exit of a process that ended before anyone listened (an instant failure), if so."""
        session = self.sup.get(self.scope, proc_id)
        return session.exit_info("") if session.finished else None

    def close(self) -> None:
        """Stop pushing events (the processes keep running: the supervisor owns them)."""
        self._closed = True
        self._remove_exit_callback()
        for pump in self._pumps.values():
            if pump.unsubscribe is not None:
                pump.unsubscribe()
        self._pumps.clear()
        self._subscribers.clear()

    # -- dispatch ------------------------------------------------------------------------------

    async def handle(self, request: dict[str, Any]) -> dict[str, Any]:
        """Answer one request dict with its response dict (errors included, never raised)."""
        kind = request.get("type") if isinstance(request, dict) else None
        request_id = request.get("id") if isinstance(request, dict) else None
        pair = _REQUESTS.get(kind) if isinstance(kind, str) else None
        if pair is None:
            resp_type = (
                kind[: -len("/req")] + "/resp" if isinstance(kind, str) and kind.endswith("/req") else "proc/error"
            )
            return {
                "type": resp_type,
                "id": request_id if isinstance(request_id, str) else None,
                "error": _error(
                    "invalid_request",
                    f"unknown message type {kind!r}",
                    {"use_known_type": "Send one of: " + ", ".join(_REQUESTS) + "."},
                ).model_dump(),
            }
        req_model, resp_model = pair
        try:
            parsed = req_model.model_validate(request)
        except pydantic.ValidationError as exc:
            problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors())
            resp = resp_model(id=request_id if isinstance(request_id, str) else None)
            resp.error = _error("invalid_request", f"invalid {kind}: {problems}")
            return resp.model_dump(mode="json", exclude={"node"})
        response = await self.dispatch(parsed)
        return response.model_dump(mode="json", exclude=None if response.node else {"node"})

    async def dispatch(self, request: _Message) -> _Response:
        """Answer a parsed request (the typed entry point; :meth:`handle` is the dict one)."""
        try:
            if isinstance(request, ProcSpawnRequest):
                return await self._spawn(request)
            if isinstance(request, ProcWriteRequest):
                return await self._write(request)
            if isinstance(request, ProcKillRequest):
                return await self._kill(request)
            if isinstance(request, ProcStatusRequest):
                return self._status(request)
        except ProcpilotError as exc:
            resp_model = _REQUESTS[getattr(request, "type", "")][1]
            return resp_model(id=request.id, error=_from_exception(exc))
        raise TypeError(f"not a proc/* request: {request!r}")

    # -- requests ------------------------------------------------------------------------------

    def _check_allowed(self, argv: list[str]) -> ProcError | None:
        """The host's ``allowed_commands``, matched by the command policy (real paths, wrappers
        unwrapped) like an agent's own allowlist; the agent's policy still applies after it."""
        if self._allowed is None:
            return None
        try:
            self._allowed.check(tuple(argv), None)
        except (CommandDenied, UnanalyzableCommand) as exc:
            allowed = self.config.allowed_commands or []
            return _error(
                "command_not_allowed",
                f"command {argv[0]!r} is not in this host's allowed_commands ({', '.join(allowed) or 'none'}): "
                + exc.message,
                {"use_allowed_command": "Run one of: " + (", ".join(allowed) or "(none)") + "."},
            )
        return None

    async def _spawn(self, req: ProcSpawnRequest) -> ProcSpawnResponse:
        refused = self._check_allowed(req.cmd)
        if refused is not None:
            return ProcSpawnResponse(id=req.id, session_id=req.session_id, error=refused)
        mine = self._spawned[self.scope] = {p for p in self._spawned.get(self.scope, ()) if self._running(p)}
        running = len(mine)
        if running >= self.config.max_procs:
            return ProcSpawnResponse(
                id=req.id,
                session_id=req.session_id,
                error=_error(
                    "proc_limit",
                    f"{running} processes are running already; max_procs is {self.config.max_procs}",
                    {"wait_or_kill": "Wait for a process to end (proc/status), or end one with proc/kill."},
                ),
            )
        settings = self.sup.settings
        timeout = req.timeout if req.timeout is not None else self.config.timeout
        isolation = Isolation(network=False) if self.config.network_disabled else None
        spec = SpawnSpec(
            tuple(req.cmd),
            cwd=Path(req.cwd) if req.cwd else None,
            workspace=settings.workspace_root,
            env=req.env or {},
            timeout=timeout,
            stdin=req.stdin_mode,
            isolation=isolation,
        )
        session = await self.sup.spawn(spec, scope=self.scope)
        # No await from here to the return: output is appended by the event loop's reader callbacks,
        # which cannot run before this step ends, so the snapshot + subscription miss and repeat nothing.
        mine.add(session.id)
        self._attach(session)
        return ProcSpawnResponse(
            id=req.id,
            session_id=req.session_id,
            proc_id=session.id,
            pid=session.pid,
            state=proc_state(session),
            node=session.node,
        )

    def _running(self, proc_id: str) -> bool:
        try:
            return not self.sup.get(self.scope, proc_id).finished
        except SessionNotFound:
            return False

    def _attach(self, session: Session) -> None:
        if self._closed:
            return
        pump = _Pump(
            session.id,
            self.config.max_output_bytes,
            {Stream.STDOUT: Utf8ChunkDecoder(), Stream.STDERR: Utf8ChunkDecoder()},
        )
        self._pumps[session.id] = pump
        # Whatever is there already (nothing, as spawn returns before the loop reads a pipe; but a
        # queued session, or a future engine change, may differ): per stream, from offset 0 ...
        # At most the pump's budget of each: past it nothing more is pushed anyway, and reading a
        # whole capped stream (an index walk per switch of streams) would hold the event loop.
        budget = pump.budget
        backlog = [(stream, session.output[stream].read(0, budget).data) for stream in (Stream.STDOUT, Stream.STDERR)]
        # ... then every chunk from now on, in the same loop step: nothing in between, nothing twice.
        pump.unsubscribe = session.output.subscribe(lambda stream, data: self._on_output(pump, stream, data))
        for stream, data in backlog:
            if data:
                self._on_output(pump, stream, data)
        if session.finished:
            self._finish(pump)

    def _on_output(self, pump: _Pump, stream: Stream, data: bytes) -> None:
        if pump.stopped or stream not in pump.streams:
            return
        room = pump.budget - pump.sent_bytes
        if len(data) > room:
            data = data[: max(room, 0)]
            pump.stopped = True
        pump.sent_bytes += len(data)
        text = pump.streams[stream].feed(data)
        if text:
            self._emit(pump, stream, text)
        if pump.stopped:
            self._emit(pump, stream, "", truncated=True)
            if pump.unsubscribe is not None:
                pump.unsubscribe()

    def _emit(self, pump: _Pump, stream: Stream, text: str, *, truncated: bool = False) -> None:
        event = ProcReadEvent(
            proc_id=pump.proc_id,
            stream_type="stdout" if stream is Stream.STDOUT else "stderr",
            data=text,
            seq=pump.seq,
            truncated=truncated,
        )
        pump.seq += 1
        self._push(event)

    def _finish(self, pump: _Pump) -> None:
        """The process has ended and all its output is in: flush split characters, stop listening."""
        self._pumps.pop(pump.proc_id, None)
        if pump.unsubscribe is not None:
            pump.unsubscribe()
        if pump.stopped:
            return
        for stream, decoder in pump.streams.items():
            rest = decoder.flush()
            if rest:
                self._emit(pump, stream, rest)

    def _on_exit(self, info: ExitInfo) -> None:
        # Called by the supervisor once the session's output is complete (before any waiter resumes).
        pump = self._pumps.get(info.session_id)
        if pump is not None:
            self._finish(pump)

    async def _write(self, req: ProcWriteRequest) -> ProcWriteResponse:
        session = self.sup.get(self.scope, req.proc_id)
        try:
            written = await self.sup.write(self.scope, req.proc_id, req.data.encode(), eof=req.eof)
        except StdinClosed as exc:
            if session.finished or not session.is_running:
                raise ProcessAlreadyExited(f"process {req.proc_id} has ended ({session.state.value})") from exc
            return ProcWriteResponse(
                id=req.id,
                proc_id=req.proc_id,
                stdin_closed=True,
                error=_error("stdin_closed", exc.message, exc.hints),
                node=session.node,
            )
        return ProcWriteResponse(
            id=req.id,
            proc_id=req.proc_id,
            bytes_written=written,
            stdin_closed=not session.stdin_open,
            node=session.node,
        )

    async def _kill(self, req: ProcKillRequest) -> ProcKillResponse:
        session = self.sup.get(self.scope, req.proc_id)
        if session.finished:
            raise ProcessAlreadyExited(f"process {req.proc_id} has already ended ({proc_state(session).value})")
        sig = signal_module.Signals[req.signal]
        grace = self.sup.settings.exec.kill_grace_sec if sig == signal_module.SIGTERM else 0.0
        await self.sup.kill(self.scope, req.proc_id, sig, grace=grace, wait=0)
        if sig == signal_module.SIGTERM:
            settle = grace + _KILL_WAIT_SEC
        elif sig == signal_module.SIGINT:
            settle = _SIGINT_WAIT_SEC
        else:
            settle = _KILL_WAIT_SEC
        await session.wait_finished(settle)
        return ProcKillResponse(
            id=req.id,
            proc_id=session.id,
            signal_sent=session.signal_sent or req.signal,
            state=proc_state(session),
            exit_code=session.exit_code,
            node=session.node,
        )

    def _status(self, req: ProcStatusRequest) -> ProcStatusResponse:
        session = self.sup.get(self.scope, req.proc_id)
        return ProcStatusResponse(
            id=req.id,
            proc_id=session.id,
            state=proc_state(session),
            pid=session.pid,
            exit_code=session.exit_code,
            exit_signal=session.exit_signal,
            duration_ms=session.duration_ms,
            reason=session.error,
            output_dropped=session.output[Stream.COMBINED].lost,
            node=session.node,
        )
