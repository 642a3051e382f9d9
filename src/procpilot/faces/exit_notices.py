"""Exits an agent has not been told of, named at the top of its next result of any tool.

An MCP server can only speak through notifications and results, and many clients pass no
notification to their model (Claude Code subscribes to list changes only; over stdio nothing is
pushed unless the transport pushes it). So every exit of a session an agent started and that went
on in the background (one that ended within its call was told by that call's result) is kept here
until a result has told it: the session's own result (exec, poll, wait, list, process.monitor...
showing it ended) tells it, and else the next result of any tool names it at its top, once, in
both forms (a text line, and an ``exits`` list in the structured content).

What is kept is bounded: at most ``MAX_PER_AGENT`` exits per agent (the oldest go first, and the
next result says how many went), for at most ``MAX_AGENTS`` agents.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping
from typing import Any

from procpilot.contract import ToolResult, ToolSpec
from procpilot.engine.session import ExitInfo
from procpilot.engine.supervisor import Supervisor
from procpilot.faces.openclaw_profile import profile_for

__all__ = ["MAX_AGENTS", "MAX_PER_AGENT", "ExitNotices", "exit_line", "exit_notice"]

MAX_PER_AGENT = 64
MAX_AGENTS = 1024
_COMMAND_CHARS = 120
# States a result names a session in while it has not ended (both vocabularies).
_LIVE = frozenset({"running", "queued", "starting"})


def exit_notice(info: ExitInfo, status: str) -> dict[str, Any]:
    """One exit as the structured ``exits`` list holds it: the state, and the call that shows it."""
    command = info.command if len(info.command) <= _COMMAND_CHARS else info.command[: _COMMAND_CHARS - 1] + "…"
    return {
        "sessionId": info.session_id,
        "status": status,
        "state": info.state.value,
        "exitCode": info.exit_code,
        "exitSignal": info.exit_signal,
        "durationMs": info.duration_ms,
        "command": command,
        "next": f"process log sessionId={info.session_id}",
    }


def exit_line(notice: Mapping[str, Any]) -> str:
    """The text line for one exit, as the top of a result shows it."""
    how = (
        f"exit code {notice['exitCode']}"
        if notice["exitCode"] is not None
        else (notice["exitSignal"] or notice["state"])
    )
    return (
        f"[session {notice['sessionId']} ({notice['command']}) ended: {notice['status']}, {how} after "
        f"{notice['durationMs']} ms; {notice['next']} shows its output]"
    )


class ExitNotices:
    """The exits each agent has not been told of, fed by the supervisor's exit events.

    ``wrap`` a tool so its results name them; ``listen`` to hear each exit as it comes (a
    transport that can push it does); ``close`` stops listening to the supervisor."""

    def __init__(self, supervisor: Supervisor) -> None:
        self._profile = profile_for(supervisor.settings)
        self._pending: OrderedDict[str, deque[dict[str, Any]]] = OrderedDict()
        self._overflow: dict[str, int] = {}
        self._listeners: list[Callable[[str, dict[str, Any]], None]] = []
        self._remove = supervisor.exits.add_callback(self._on_exit)

    def close(self) -> None:
        self._remove()

    def listen(self, listener: Callable[[str, dict[str, Any]], None]) -> Callable[[], None]:
        """Call ``listener(agent, notice)`` on each exit; returns the remover."""
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener) if listener in self._listeners else None

    def _on_exit(self, info: ExitInfo) -> None:
        if not info.backgrounded:
            return  # a run that ended within its call: that call's own result told it
        notice = exit_notice(info, self._profile.status(info.state, info.exit_code, info.exit_signal))
        queue = self._pending.get(info.scope)
        if queue is None:
            if len(self._pending) >= MAX_AGENTS:
                gone, _ = self._pending.popitem(last=False)
                self._overflow.pop(gone, None)
            queue = self._pending[info.scope] = deque(maxlen=MAX_PER_AGENT)
        if len(queue) == queue.maxlen:
            self._overflow[info.scope] = self._overflow.get(info.scope, 0) + 1
        queue.append(notice)
        for listener in list(self._listeners):
            listener(info.scope, notice)

    def take(self, agent: str, told: set[str]) -> tuple[list[dict[str, Any]], int]:
        """The exits ``agent`` has not been told of, minus those ``told`` (a result about to be
        given names them ended), and how many more were dropped; forgotten once taken."""
        queue = self._pending.pop(agent, None)
        dropped = self._overflow.pop(agent, 0)
        if not queue:
            return [], dropped
        return [n for n in queue if n["sessionId"] not in told], dropped

    def wrap(self, spec: ToolSpec) -> ToolSpec:
        """``spec`` whose every result (errors too) names, at its top, the exits not yet told.

        A text-only tool (the codex and claude profiles) is left as it is: its text is exactly its
        harness's, which tells exits in its own words (Claude Code's task notifications)."""
        if spec.text_only:
            return spec
        inner = spec.handler

        async def handler(arguments: Mapping[str, Any], scope: str) -> ToolResult:
            result = await inner(arguments, scope)
            if scope not in self._pending:
                return result
            notices, dropped = self.take(scope, _told(result.data))
            if not notices and not dropped:
                return result
            lines = [exit_line(n) for n in notices]
            if dropped:
                lines.append(f"[{dropped} more sessions ended; process list shows them all]")
            data = {"exits": notices, **({"exitsDropped": dropped} if dropped else {}), **result.data}
            return dataclasses.replace(result, text="\n".join(lines) + "\n" + result.text, data=data)

        return dataclasses.replace(spec, handler=handler)


def _told(data: Mapping[str, Any]) -> set[str]:
    """The sessions a result shows ended (or gone): it tells their exits itself."""
    told = set()
    rows = [data, *data.get("sessions", ()), *data.get("processes", ())]
    for row in rows:
        if not isinstance(row, Mapping):
            continue
        sid = row.get("sessionId", row.get("process_id"))
        ended = row.get("state") not in _LIVE or row.get("removed") or row.get("cleared")
        if isinstance(sid, str) and ended and ("state" in row or "removed" in row or "cleared" in row):
            told.add(sid)
    return told
