"""The codex profile: Codex CLI's own shell tools, ``exec_command`` and ``write_stdin``.

A model trained in Codex CLI's harness reads these tools' results best as Codex writes them. With
``[tools.exec] profile = "codex"`` (``procpilot mcp --profile codex``) they take the place of
exec/process, and every result is its text alone, laid out as Codex lays it out::

    Chunk ID: 3fa830
    Wall time: 0.0123 seconds
    Process exited with code 0              (only when it exited during this call)
    Process running with session ID 48213   (only while it runs)
    Original token count: 2
    Output:
    hi

Codex's process ids are small integers; here each maps onto an ordinary engine session (so the
agent's limits, box, command policy, console and durability all apply), at most 64 live ones per
agent (or conversation), as Codex has it. The id is kept in its session's record, so a restarted
server still knows it. An id is forgotten once a call has reported its process's exit; the engine
session stays until the TTL sweep, as every session does.
"""

from __future__ import annotations

import secrets
import signal
import time
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from procpilot.contract import PermissionTier, ToolResult, ToolSpec, fields_named, parse_arguments
from procpilot.engine.capture import Stream
from procpilot.engine.session import Session
from procpilot.engine.spawn import SpawnSpec, check_os_string
from procpilot.engine.states import SessionState
from procpilot.engine.supervisor import Supervisor
from procpilot.errors import ProcpilotError, StdinClosed
from procpilot.faces.harness import Chunk, default_shell, exit_code, read_bytes, scan
from procpilot.render import complete_utf8_prefix

__all__ = ["CODEX_ENV", "ExecCommandParams", "WriteStdinParams", "codex_tools", "scan_for", "truncate_middle"]

# The environment Codex gives every command: no colour, no pager, UTF-8.
CODEX_ENV: Mapping[str, str] = MappingProxyType(
    {
        "NO_COLOR": "1",
        "TERM": "dumb",
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "LC_CTYPE": "C.UTF-8",
        "PAGER": "cat",
        "GIT_PAGER": "cat",
        "GH_PAGER": "cat",
    }
)
_EXEC_YIELD = (10_000, 250, 30_000)  # default, least, most (ms)
_WRITE_YIELD = (250, 250, 30_000)
_POLL_YIELD = (250, 5_000, 300_000)  # an empty write is a poll: it may wait much longer
_DEFAULT_TOKENS = 10_000
_AFTER_WRITE = 0.1  # s: under a terminal, the echo and the first answer come this soon
_MAX_LIVE = 64
_KEEP_NEWEST = 8  # never pruned to make room
_IDS = (1000, 99_999)
_FACE = "codex"  # its key in a session's face_data
_STDIN_CLOSED = "stdin is closed for this session; rerun exec_command with tty=true to keep stdin open"
_CTRL_C = "\u0003"

# Codex's descriptions, in our words.
EXEC_COMMAND_DESCRIPTION = (
    "Runs a command (in a terminal with tty=true), returning its output, or a session ID to keep "
    "interacting with it if it is still running when yield_time_ms is up."
)
WRITE_STDIN_DESCRIPTION = (
    "Writes characters to the stdin of a running exec_command session and returns the output since "
    "the last call; empty chars polls for new output without writing."
)


class ExecCommandParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    cmd: str = Field(description="The shell command to run.")
    workdir: str | None = Field(None, description="Working directory, relative to the workspace (default: it).")
    tty: bool = Field(False, description="Run in a terminal (stdin stays open); false: plain pipes, stdin closed.")
    yield_time_ms: int | None = Field(
        None, description="How long to wait for output before returning. Default 10000 ms; 250-30000 ms."
    )
    max_output_tokens: int | None = Field(
        None, ge=0, description="Output budget in tokens (about 4 bytes each). Default 10000."
    )
    shell: str | None = Field(None, description="The shell to run cmd with. Default: the user's shell.")
    login: bool = Field(True, description="Run the shell as a login shell (-lc); false: -c.")


class WriteStdinParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    session_id: int = Field(description="The session ID exec_command returned.")
    chars: str = Field("", description="Characters to write to stdin; empty: only poll for new output.")
    yield_time_ms: int | None = Field(
        None,
        description="How long to wait for output. A write: default 250 ms, at most 30000; an empty poll: "
        "5000-300000 ms.",
    )
    max_output_tokens: int | None = Field(
        None, ge=0, description="Output budget in tokens (about 4 bytes each). Default 10000."
    )


@dataclass(slots=True)
class _Process:
    """A live process by its Codex id, as its session's record keeps it (``face_data``)."""

    session: Session
    process_id: int
    cursor: int  # the byte of its combined output the next call starts at
    used: float  # when a call last named it (wall clock): the least recently used goes first

    def kept(self) -> dict[str, Any]:
        return {"id": self.process_id, "cursor": self.cursor, "used": self.used}


def _kept_process(session: Session) -> _Process | None:
    """The Codex id ``session``'s record carries, if any (anything malformed is no id)."""
    kept = session.face_data.get(_FACE)
    if not isinstance(kept, dict):
        return None
    process_id, cursor, used = kept.get("id"), kept.get("cursor"), kept.get("used")
    if not isinstance(process_id, int) or not isinstance(cursor, int) or not isinstance(used, int | float):
        return None
    return _Process(session, process_id, cursor, float(used))


def _victim(table: Mapping[int, _Process]) -> _Process | None:
    """Which process goes to make room: past the newest few, an exited one first, else the
    least recently used."""
    if len(table) < _MAX_LIVE:
        return None
    by_use = sorted(table.values(), key=lambda p: p.used)
    candidates = by_use[: max(0, len(by_use) - _KEEP_NEWEST)]
    for process in candidates:
        if process.session.finished:
            return process
    return candidates[0] if candidates else None


def truncate_middle(chunk: Chunk, max_tokens: int) -> str:
    """The chunk decoded, cut to 4 bytes a token of ``max_tokens`` as Codex cuts it: the line
    count, a blank line, the head (half the budget), ``…K tokens truncated…`` and the tail.
    ``chunk`` must hold the first half and the last ``budget`` bytes (``scan_for``)."""
    budget = max_tokens * 4
    if chunk.size <= budget:
        return (chunk.head + chunk.tail).decode("utf-8", "replace")
    lines = chunk.newlines + (0 if (chunk.tail or chunk.head).endswith(b"\n") else 1)
    half = budget // 2
    head = chunk.head[: complete_utf8_prefix(chunk.head[:half])]
    last = chunk.tail[len(chunk.tail) - (budget - half) :] if budget > half else b""
    skip = 0
    while skip < len(last) and 0x80 <= last[skip] <= 0xBF:
        skip += 1  # never half a character
    cut = -(-(chunk.size - budget) // 4)
    body = f"{head.decode('utf-8', 'replace')}…{cut} tokens truncated…{last[skip:].decode('utf-8', 'replace')}"
    return f"Total output lines: {lines}\n\n{body}"


def scan_for(session: Session, start: int, end: int, max_tokens: int) -> Awaitable[Chunk]:
    """What ``truncate_middle`` needs of bytes ``[start, end)``."""
    budget = max_tokens * 4
    return scan(session, start, end, head=budget // 2, tail=budget)


def _clamp(value: int | None, bounds: tuple[int, int, int]) -> int:
    default, least, most = bounds
    return min(max(default if value is None else value, least), most)


def _failure(text: str) -> ToolResult:
    return ToolResult(text, {}, is_error=True, structured=False)


class CodexFace:
    """Codex's tools over the engine. Its ids are not a table of its own: each lives in its
    session's record (``face_data``), so it is kept across restarts and goes with its session
    (the TTL sweep, a removal), and a scope (an agent, or one conversation of it) sees only its
    own sessions' ids."""

    def __init__(self, supervisor: Supervisor) -> None:
        self.sup = supervisor
        # Codex lets the policy cap a budget: ours is the exec face's result cap.
        self._max_tokens = supervisor.settings.exec.result_max_chars // 4

    def _table(self, scope: str) -> dict[int, _Process]:
        return {p.process_id: p for s in self.sup.list(scope) if (p := _kept_process(s)) is not None}

    def _keep(self, process: _Process) -> None:
        self.sup.keep_face_data(process.session, _FACE, process.kept())

    async def exec_command(self, arguments: Mapping[str, Any], scope: str) -> ToolResult:
        params: ExecCommandParams = parse_arguments(ExecCommandParams, arguments)
        started = time.monotonic()
        try:
            session = await self._start(params, scope)
        except ProcpilotError as exc:
            return _failure(f"exec_command failed for `{params.cmd}`: {exc.message}")
        if session.state is SessionState.FAILED_TO_START:
            return _failure(f"exec_command failed for `{params.cmd}`: {session.error}")
        end = await _shown_end(session, 0, session.output[Stream.COMBINED].size)
        process_id = None
        if not session.finished:
            table = self._table(scope)
            if (victim := _victim(table)) is not None:
                await self._prune(scope, victim)
                del table[victim.process_id]
            while True:
                process_id = secrets.randbelow(_IDS[1] - _IDS[0] + 1) + _IDS[0]
                if process_id not in table:
                    break
            self._keep(_Process(session, process_id, end, time.time()))
        return await self._answer(session, 0, end, started, process_id, params.max_output_tokens)

    async def _start(self, params: ExecCommandParams, scope: str) -> Session:
        check_os_string("cmd", params.cmd)
        shell = params.shell or default_shell()
        with fields_named({"working_directory": "workdir"}):
            spec = SpawnSpec(
                command=(shell, "-lc" if params.login else "-c", params.cmd),
                cwd=Path(params.workdir) if params.workdir else None,
                workspace=self.sup.settings.workspace_root,
                env=CODEX_ENV,
                pty=params.tty,
                pty_size=(self.sup.settings.exec.pty_cols, self.sup.settings.exec.pty_rows),
                # Without a terminal stdin is closed, as Codex has it: a prompt reads EOF at once.
                stdin="pipe" if params.tty else "null",
                notify_on_exit=False,  # Codex tells an exit in the next call's result, nowhere else
            )
        return await self.sup.run(spec, scope=scope, yield_ms=_clamp(params.yield_time_ms, _EXEC_YIELD))

    async def _prune(self, scope: str, process: _Process) -> None:
        self.sup.keep_face_data(process.session, _FACE, None)
        if not process.session.finished:
            await self.sup.kill(scope, process.session.id, signal.SIGKILL, grace=0)

    async def write_stdin(self, arguments: Mapping[str, Any], scope: str) -> ToolResult:
        params: WriteStdinParams = parse_arguments(WriteStdinParams, arguments)
        started = time.monotonic()
        process = self._table(scope).get(params.session_id)
        if process is None:
            return _failure(f"write_stdin failed: Unknown process id {params.session_id}")
        session = process.session
        if params.chars:
            try:
                await self._write(session, params.chars, scope)
            except ProcpilotError as exc:
                return _failure(f"write_stdin failed: {exc.message}")
            wait = _clamp(params.yield_time_ms, _WRITE_YIELD) / 1000
        else:
            wait = _clamp(params.yield_time_ms, _POLL_YIELD) / 1000
        await session.wait_finished(max(0.0, started + wait - time.monotonic()))
        start = process.cursor
        end = await _shown_end(session, start, session.output[Stream.COMBINED].size)
        if session.finished:
            self.sup.keep_face_data(session, _FACE, None)  # its exit is told now, once
        else:
            process.cursor, process.used = end, time.time()
            self._keep(process)
        return await self._answer(session, start, end, started, params.session_id, params.max_output_tokens)

    async def _write(self, session: Session, chars: str, scope: str) -> None:
        if not session.spec.pty:
            if chars != _CTRL_C:
                raise StdinClosed(_STDIN_CLOSED)
            if not session.finished:  # ^C without a terminal: what the terminal would have sent
                await self.sup.kill(scope, session.id, signal.SIGINT)
            return
        if not session.finished:
            await self.sup.write(scope, session.id, chars.encode())
            await session.wait_finished(_AFTER_WRITE)

    async def _answer(
        self, session: Session, start: int, end: int, started: float, process_id: int | None, tokens: int | None
    ) -> ToolResult:
        budget = min(_DEFAULT_TOKENS if tokens is None else tokens, self._max_tokens)
        chunk = await scan_for(session, start, end, budget)
        lines = [f"Chunk ID: {secrets.token_hex(3)}", f"Wall time: {time.monotonic() - started:.4f} seconds"]
        if session.finished:
            code = exit_code(session)
            lines.append(f"Process exited with code {-1 if code is None else code}")  # -1: nobody saw how (lost)
        else:
            lines.append(f"Process running with session ID {process_id}")
        lines += [f"Original token count: {-(-chunk.size // 4)}", "Output:", truncate_middle(chunk, budget)]
        return ToolResult("\n".join(lines), {"sessionId": session.id}, structured=False)


async def _shown_end(session: Session, start: int, end: int) -> int:
    """Where this call's output ends: while the process runs, before a character split at the
    end (the next call shows it whole)."""
    if session.finished or end <= start:
        return end
    last = await read_bytes(session, max(start, end - 3), end)
    return end - (len(last) - complete_utf8_prefix(last))


def codex_tools(supervisor: Supervisor) -> list[ToolSpec]:
    face = CodexFace(supervisor)
    return [
        ToolSpec(
            "exec_command",
            EXEC_COMMAND_DESCRIPTION,
            ExecCommandParams,
            face.exec_command,
            PermissionTier.NOTIFY,
            text_only=True,
        ),
        ToolSpec(
            "write_stdin",
            WRITE_STDIN_DESCRIPTION,
            WriteStdinParams,
            face.write_stdin,
            PermissionTier.NOTIFY,
            text_only=True,
        ),
    ]
