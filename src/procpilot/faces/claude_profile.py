"""The claude profile: Claude Code's own shell tools, ``Bash``, ``TaskOutput`` and ``TaskStop``
(and the older ``BashOutput`` and ``KillShell``, which still answer).

A model trained in Claude Code's harness reads these tools' results best as Claude Code writes
them. With ``[tools.exec] profile = "claude"`` (``procpilot mcp --profile claude``) they take the
place of exec/process, and every result is its text alone:

- ``Bash`` runs a command with stdout and stderr merged; exit 0 gives the output, any other exit
  is an error result ``Exit code N`` followed by the output; past 30,000 characters
  (``BASH_MAX_OUTPUT_LENGTH`` in the server's environment changes it) the middle is cut and said;
- ``run_in_background`` answers at once with a task id (``b`` + 8 characters) and the file the
  output goes to; ``TaskOutput`` reads a task (blocking by default), ``TaskStop`` ends it;
- a background task's end is told as Claude Code tells it: a ``<task-notification>`` at the top of
  the next result of any of these tools, unless the model already saw it end.

Each task is an ordinary engine session (the agent's limits, box, command policy, console and
durability all apply), named by its task id, at most 256 per agent (or conversation); the id and
what the model was told of it are kept in the session's record, so a restarted server knows them.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import string
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import regex
from pydantic import BaseModel, ConfigDict, Field

from procpilot.contract import Handler, PermissionTier, ToolResult, ToolSpec, error_result, parse_arguments
from procpilot.engine.capture import Stream
from procpilot.engine.session import Session
from procpilot.engine.spawn import SpawnSpec, check_os_string
from procpilot.engine.states import SessionState
from procpilot.engine.supervisor import Supervisor
from procpilot.errors import (
    InvalidArgument,
    InvalidPattern,
    ProcpilotError,
    SessionNotFound,
    SessionStateError,
    SpawnFailed,
)
from procpilot.faces.harness import default_shell, exit_code, first_log_file, read_bytes, scan
from procpilot.render import complete_utf8_prefix

__all__ = [
    "BashOutputParams",
    "BashParams",
    "KillShellParams",
    "TaskOutputParams",
    "TaskStopParams",
    "claude_tools",
    "cut_middle",
]

_BASH_TIMEOUT = (120_000, 600_000)  # default, most (ms)
_TASK_TIMEOUT = (30_000, 600_000)
_OUTPUT_LIMIT = 30_000
_OUTPUT_LIMIT_MOST = 150_000  # what Claude Code lets BASH_MAX_OUTPUT_LENGTH raise it to
_TASK_OUTPUT_TAIL = 32_000
_TASKS_KEPT = 256  # per agent; the oldest ended task is forgotten past that (its session stays)
_ID_CHARS = string.digits + string.ascii_lowercase
_MERGED = "exec 2>&1; "
_FACE = "claude"  # its key in a session's face_data
_FILTER_SCAN = 0.5  # s a filter may take over one result (catastrophic backtracking)

BASH_DESCRIPTION = (
    "Runs a bash command and returns its output (stdout and stderr together). A non-zero exit is an "
    "error whose text starts 'Exit code N'. timeout is in milliseconds (default 120000, at most 600000). "
    "run_in_background=true returns at once with a task id: read it with TaskOutput, end it with TaskStop; "
    "you are told when it finishes. Output past 30000 characters is cut in the middle."
)
TASK_OUTPUT_DESCRIPTION = (
    "Reads a background task's status, exit code and output. block=true (the default) waits up to timeout "
    "milliseconds (default 30000) for the task to finish."
)
TASK_STOP_DESCRIPTION = "Stops a running background task by its id."
BASH_OUTPUT_DESCRIPTION = (
    "Reads the new output of a background shell since the last read. filter: a regular expression; "
    "only the lines matching it are returned (the others are consumed)."
)
KILL_SHELL_DESCRIPTION = "Stops a running background shell by its id."


class BashParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    command: str = Field(description="The command to run.")
    timeout: int | None = Field(
        None, ge=0, description="Milliseconds before it is killed (default 120000, max 600000)."
    )
    description: str | None = Field(None, description="What the command does, in a few words.")
    run_in_background: bool = Field(False, description="Run it in the background and return a task id at once.")


class TaskOutputParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    task_id: str = Field(description="The task's id.")
    block: bool = Field(True, description="Wait for the task to finish (up to timeout).")
    timeout: int | None = Field(
        None, ge=0, le=_TASK_TIMEOUT[1], description="Milliseconds to wait (default 30000, max 600000)."
    )


class TaskStopParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    task_id: str = Field(description="The task's id.")


class BashOutputParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    bash_id: str = Field(description="The background shell's id.")
    filter: str | None = Field(None, description="A regular expression: only matching lines are returned.")


class KillShellParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    shell_id: str = Field(description="The background shell's id.")


@dataclass(slots=True)
class _Task:
    """A background task by its id, as its session's record keeps it (``face_data``)."""

    session: Session
    task_id: str
    command: str
    summary: str  # the description, else the command: how the notification names it
    notified: bool = False  # the model has been told (or has seen) how it ended
    stopped: bool = False  # TaskStop ended it
    read: int = 0  # where BashOutput's last read of the output ended

    def kept(self) -> dict[str, Any]:
        return {
            "id": self.task_id,
            "command": self.command,
            "summary": self.summary,
            "notified": self.notified,
            "stopped": self.stopped,
            "read": self.read,
        }


def _kept_task(session: Session) -> _Task | None:
    """The task ``session``'s record carries, if any (anything malformed is no task)."""
    kept = session.face_data.get(_FACE)
    if not isinstance(kept, dict):
        return None
    task_id, command, summary, read = kept.get("id"), kept.get("command"), kept.get("summary"), kept.get("read", 0)
    if not all(isinstance(v, str) for v in (task_id, command, summary)):
        return None
    if isinstance(read, bool) or not isinstance(read, int):
        return None
    notified, stopped = bool(kept.get("notified")), bool(kept.get("stopped"))
    return _Task(session, str(task_id), str(command), str(summary), notified, stopped, read)


def cut_middle(text: str, limit: int) -> str:
    """``text`` within ``limit`` characters: the head and the tail, and how much was cut between."""
    if len(text) <= limit:
        return text
    head, tail = text[: limit // 2], text[len(text) - (limit - limit // 2) :]
    middle = text[len(head) : len(text) - len(tail)]
    return _marked(head, len(middle), middle.count("\n") + 1, tail)


def _marked(head: str, chars: int, lines: int, tail: str) -> str:
    return f"{head}\n\n... [{chars} characters, {lines} lines truncated] ...\n\n{tail}"


def _decode(raw: bytes) -> str:
    return raw.decode("utf-8", "replace")


def _output_limit() -> int:
    try:
        wanted = int(os.environ.get("BASH_MAX_OUTPUT_LENGTH", ""))
    except ValueError:
        return _OUTPUT_LIMIT
    return min(max(wanted, 1), _OUTPUT_LIMIT_MOST)


def _status(task: _Task) -> str:
    session = task.session
    if session.state is SessionState.KILLED or task.stopped:
        return "killed"
    if not session.finished:
        return "running"
    return "completed" if session.state is SessionState.EXITED_OK else "failed"


class ClaudeFace:
    """Claude Code's tools over the engine. Its task ids are not a table of its own: each task
    (id, command, what the model was told, where BashOutput's reads got to) lives in its
    session's record (``face_data``), so it is kept across restarts and goes with its session
    (the TTL sweep, a removal), and a scope (an agent, or one conversation of it) sees only its
    own sessions' tasks."""

    def __init__(self, supervisor: Supervisor) -> None:
        self.sup = supervisor
        self._limit = _output_limit()

    def _table(self, scope: str) -> dict[str, _Task]:
        """``scope``'s tasks, oldest first."""
        mine = reversed(self.sup.list(scope))
        return {t.task_id: t for s in mine if (t := _kept_task(s)) is not None}

    def _keep(self, task: _Task) -> None:
        # Every field moves one way only: a call that waited keeps what another wrote meanwhile.
        if (now := _kept_task(task.session)) is not None:
            task.notified, task.stopped = task.notified or now.notified, task.stopped or now.stopped
            task.read = max(task.read, now.read)
        self.sup.keep_face_data(task.session, _FACE, task.kept())

    def _task(self, scope: str, task_id: str) -> _Task:
        task = self._table(scope).get(task_id)
        if task is None:
            raise SessionNotFound(f"No task found with ID: {task_id}", session_id=task_id)
        return task

    # -- notifications -------------------------------------------------------------------------

    def _told(self, scope: str, result: ToolResult) -> ToolResult:
        """``result`` with every background end the model has not heard of at its top."""
        notes = []
        for task_id, task in self._table(scope).items():
            if task.notified or not task.session.finished:
                continue
            task.notified = True
            self._keep(task)
            status = _status(task)
            if status == "killed":
                how = "was stopped"
            elif status == "completed":
                how = "completed (exit code 0)"
            else:
                how = f"failed with exit code {exit_code(task.session)}"
            notes.append(
                "<task-notification>\n"
                f"<task-id>{task_id}</task-id>\n"
                f"<output-file>{first_log_file(task.session)}</output-file>\n"
                f"<status>{status}</status>\n"
                f'<summary>Background command "{task.summary}" {how}</summary>\n'
                "</task-notification>"
            )
        if not notes:
            return result
        text = "\n".join(notes) + "\n\n" + result.text
        return ToolResult(text, result.data, result.is_error, structured=False)

    def _told_of_errors(self, scope: str, exc: ProcpilotError) -> ToolResult:
        """Claude Code's own words for a task it does not know or that has ended; for anything
        else (bad input, a refused command) our typed error with its hints."""
        plain = isinstance(exc, SessionNotFound | SessionStateError)
        text = exc.message if plain else error_result(exc).text
        return self._told(scope, ToolResult(text, exc.to_dict(), is_error=True, structured=False))

    # -- Bash ----------------------------------------------------------------------------------

    async def bash(self, arguments: Mapping[str, Any], scope: str) -> ToolResult:
        try:
            return self._told(scope, await self._bash(parse_arguments(BashParams, arguments), scope))
        except ProcpilotError as exc:
            return self._told_of_errors(scope, exc)

    async def _bash(self, params: BashParams, scope: str) -> ToolResult:
        timeout = _BASH_TIMEOUT[0] if params.timeout is None else params.timeout
        if timeout > _BASH_TIMEOUT[1]:
            raise InvalidArgument(
                f"timeout {timeout} ms is more than the most, {_BASH_TIMEOUT[1]} ms",
                hints={"use_background": "For a longer command use run_in_background=true and TaskOutput."},
                field="timeout",
            )
        check_os_string("command", params.command)
        spec = SpawnSpec(
            # One pipe for both streams, as Claude Code has it: two pipes read apart can swap lines.
            command=(default_shell(), "-c", _MERGED + params.command),
            workspace=self.sup.settings.workspace_root,
            timeout=None if params.run_in_background else (timeout / 1000 or None),
            stdin="null",  # Claude Code's commands get no input
            notify_on_exit=False,  # told by the task notification
        )
        if params.run_in_background:
            session = await self.sup.run(spec, scope=scope, yield_ms=0)
            task_id = self._add(scope, session, params.command, params.description or params.command)
            text = (
                f"Command running in background with ID: {task_id}. "
                f"Output is being written to: {first_log_file(session)}"
            )
            return ToolResult(text, {"sessionId": session.id}, structured=False)
        session = await self.sup.run(spec, scope=scope, yield_ms=None)
        if session.state is SessionState.FAILED_TO_START:
            raise SpawnFailed(f"Command failed to start: {session.error}")
        output = await self._output(session)
        lines = [output] if output else []
        if session.state is SessionState.TIMED_OUT:
            lines.append(f"Command timed out after {timeout} ms")
        code = exit_code(session)
        if code == 0:
            return ToolResult("\n".join(lines), {"sessionId": session.id}, structured=False)
        text = "\n".join([f"Exit code {code}", *lines])
        return ToolResult(text, {"sessionId": session.id}, is_error=True, structured=False)

    async def _output(self, session: Session) -> str:
        """The whole output, trailing newlines dropped, within the limit (``cut_middle``); only
        the head and the tail of a long one are read (a log may hold 64 MiB)."""
        limit = self._limit
        keep_head, keep_tail = limit // 2, limit - limit // 2
        # 4 bytes a character at most: these windows hold the characters shown, whatever they are.
        chunk = await scan(session, 0, session.output[Stream.COMBINED].size, head=keep_head * 4, tail=limit * 4)
        if chunk.whole:
            return cut_middle(_decode(chunk.head + chunk.tail).rstrip("\n"), limit)
        head = _decode(chunk.head)[:keep_head]
        skip = 0
        while skip < len(chunk.tail) and 0x80 <= chunk.tail[skip] <= 0xBF:
            skip += 1  # never half a character
        last = _decode(chunk.tail[skip:])
        trailing = len(last) - len(last.rstrip("\n"))
        tail = last[: len(last) - trailing][-keep_tail:]
        chars = chunk.chars - trailing - len(head) - len(tail)
        lines = chunk.newlines - trailing - head.count("\n") - tail.count("\n") + 1
        return _marked(head, chars, lines, tail)

    def _add(self, scope: str, session: Session, command: str, summary: str) -> str:
        table = self._table(scope)
        if len(table) >= _TASKS_KEPT:  # forget the oldest task that ended (else the oldest)
            ended = next((t for t in table.values() if t.session.finished), next(iter(table.values())))
            self.sup.keep_face_data(ended.session, _FACE, None)
        while True:
            task_id = "b" + "".join(secrets.choice(_ID_CHARS) for _ in range(8))
            if task_id not in table:
                break
        self._keep(_Task(session, task_id, command, summary))
        return task_id

    # -- TaskOutput, BashOutput ----------------------------------------------------------------

    async def task_output(self, arguments: Mapping[str, Any], scope: str) -> ToolResult:
        try:
            params: TaskOutputParams = parse_arguments(TaskOutputParams, arguments)
            timeout = _TASK_TIMEOUT[0] if params.timeout is None else params.timeout  # the schema bounds it
            task = self._task(scope, params.task_id)
            if params.block and not task.session.finished:
                await task.session.wait_finished(timeout / 1000)
            if task.session.finished:
                retrieval = "success"
                task.notified = True  # the model sees how it ended here
                self._keep(task)
            else:
                retrieval = "timeout" if params.block else "not_ready"
            return self._told(scope, await self._task_text(params.task_id, task, retrieval))
        except ProcpilotError as exc:
            return self._told_of_errors(scope, exc)

    async def _task_text(self, task_id: str, task: _Task, retrieval: str) -> ToolResult:
        session = task.session
        end = session.output[Stream.COMBINED].size
        start = max(0, end - _TASK_OUTPUT_TAIL * 4)  # enough bytes for the last characters
        raw = await read_bytes(session, start, end)
        if start:
            while raw and 0x80 <= raw[0] <= 0xBF:
                raw = raw[1:]  # never half a character
        if not session.finished:
            raw = raw[: complete_utf8_prefix(raw)]
        output = _decode(raw).rstrip("\n")
        if start or len(output) > _TASK_OUTPUT_TAIL:
            output = output[-_TASK_OUTPUT_TAIL:]
            note = f"[Truncated: the last {len(output)} characters. The full output is in {first_log_file(session)}]"
            output = f"{note}\n{output}"
        parts = [
            f"<retrieval_status>{retrieval}</retrieval_status>",
            f"<task_id>{task_id}</task_id>",
            "<task_type>local_bash</task_type>",
            f"<status>{_status(task)}</status>",
        ]
        if session.finished and (code := exit_code(session)) is not None:
            parts.append(f"<exit_code>{code}</exit_code>")
        parts.append(f"<output>\n{output}\n</output>" if output else "<output></output>")
        return ToolResult("\n\n".join(parts), {"sessionId": session.id}, structured=False)

    async def bash_output(self, arguments: Mapping[str, Any], scope: str) -> ToolResult:
        try:
            params: BashOutputParams = parse_arguments(BashOutputParams, arguments)
            matcher = _compile(params.filter)
            task = self._task(scope, params.bash_id)
            session = task.session
            if session.finished:
                task.notified = True
            parts = [f"<status>{_status(task)}</status>"]
            if session.finished and (code := exit_code(session)) is not None:
                parts.append(f"<exit_code>{code}</exit_code>")
            new, task.read = await self._new(session, task.read)
            self._keep(task)
            shown = new if matcher is None else _kept_lines(matcher, new)
            if shown:  # stderr is merged into it (see _MERGED): there is never a <stderr> part
                parts.append(f"<stdout>\n{shown.rstrip(chr(10))}\n</stdout>")
            parts.append(f"<timestamp>{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}</timestamp>")
            return self._told(scope, ToolResult("\n\n".join(parts), {"sessionId": session.id}, structured=False))
        except ProcpilotError as exc:
            return self._told_of_errors(scope, exc)

    async def _new(self, session: Session, start: int) -> tuple[str, int]:
        raw = await read_bytes(session, start, session.output[Stream.COMBINED].size)
        if not session.finished:
            raw = raw[: complete_utf8_prefix(raw)]
        return _decode(raw), start + len(raw)

    # -- TaskStop, KillShell -------------------------------------------------------------------

    async def task_stop(self, arguments: Mapping[str, Any], scope: str) -> ToolResult:
        try:
            params: TaskStopParams = parse_arguments(TaskStopParams, arguments)
            return self._told(scope, await self._stop(scope, params.task_id))
        except ProcpilotError as exc:
            return self._told_of_errors(scope, exc)

    async def kill_shell(self, arguments: Mapping[str, Any], scope: str) -> ToolResult:
        try:
            params: KillShellParams = parse_arguments(KillShellParams, arguments)
            return self._told(scope, await self._stop(scope, params.shell_id))
        except ProcpilotError as exc:
            return self._told_of_errors(scope, exc)

    async def _stop(self, scope: str, task_id: str) -> ToolResult:
        task = self._task(scope, task_id)
        if task.session.finished or task.stopped:
            raise SessionStateError(f"Task {task_id} is not running (status: {_status(task)})", session_id=task_id)
        task.stopped = task.notified = True  # it ends because the model asked: nothing to tell
        self._keep(task)
        # SIGTERM, SIGKILL after the grace period: the answer waits for the tree to be gone.
        await self.sup.kill(scope, task.session.id, signal.SIGTERM, wait=None)
        answer = {
            "message": f"Successfully stopped task: {task_id} ({task.command})",
            "task_id": task_id,
            "task_type": "local_bash",
            "command": task.command,
        }
        text = json.dumps(answer, ensure_ascii=False, separators=(",", ":"))  # as JSON.stringify writes it
        return ToolResult(text, {"sessionId": task.session.id}, structured=False)


def _compile(pattern: str | None) -> regex.Pattern[str] | None:
    if pattern is None:
        return None
    try:
        return regex.compile(pattern)
    except regex.error as exc:
        raise InvalidPattern(f"Invalid regular expression {pattern!r}: {exc}", field="filter") from None


def _kept_lines(matcher: regex.Pattern[str], text: str) -> str:
    try:
        return "".join(
            line for line in text.splitlines(keepends=True) if matcher.search(line, timeout=_FILTER_SCAN) is not None
        )
    except TimeoutError:
        raise InvalidPattern(
            f"the filter {matcher.pattern!r} takes too long to match (catastrophic backtracking)", field="filter"
        ) from None


def claude_tools(supervisor: Supervisor) -> list[ToolSpec]:
    face = ClaudeFace(supervisor)
    # TaskStop and KillShell end a process: notify-tier, so each call is audited as process.kill is.
    tools: list[tuple[str, str, type[BaseModel], Handler, PermissionTier]] = [
        ("Bash", BASH_DESCRIPTION, BashParams, face.bash, PermissionTier.NOTIFY),
        ("TaskOutput", TASK_OUTPUT_DESCRIPTION, TaskOutputParams, face.task_output, PermissionTier.AUTONOMOUS),
        ("TaskStop", TASK_STOP_DESCRIPTION, TaskStopParams, face.task_stop, PermissionTier.NOTIFY),
        ("BashOutput", BASH_OUTPUT_DESCRIPTION, BashOutputParams, face.bash_output, PermissionTier.AUTONOMOUS),
        ("KillShell", KILL_SHELL_DESCRIPTION, KillShellParams, face.kill_shell, PermissionTier.NOTIFY),
    ]
    return [ToolSpec(name, text, model, handler, tier, text_only=True) for name, text, model, handler, tier in tools]
