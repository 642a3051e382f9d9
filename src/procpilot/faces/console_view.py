"""The console's face: sessions as a person overseeing agents sees and handles them.

What the web console (``transports/http/console.py``) shows and does, in engine terms: a row per
session (state, CPU, memory, exit), a bounded page of one stream's log at any byte offset, the
output from an offset as it arrives, and the few things a person does to a session (a signal to
the whole tree, a line to its stdin or keys to its pty, remove). The transport only carries these.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator
from typing import Any

from procpilot.engine.capture import OutputView, Stream
from procpilot.engine.scopes import agent_of
from procpilot.engine.session import Session
from procpilot.engine.states import SessionState
from procpilot.engine.supervisor import Supervisor
from procpilot.errors import InvalidArgument, ProcpilotError, SessionNotFound

__all__ = [
    "MAX_ROWS",
    "PAGE_MAX",
    "act",
    "agent_sessions",
    "exit_text",
    "find",
    "log_page",
    "output_chunks",
    "rows",
    "view",
]

MAX_ROWS = 500  # sessions in one snapshot, newest first
PAGE_MAX = 256 * 1024  # bytes in one log page, whatever is asked
CHUNK = 64 * 1024  # bytes in one output event; a reader far behind starts this far from the end
_MAX_WRITE = 64 * 1024
_SIGNALS = {"SIGINT": signal.SIGINT, "SIGTERM": signal.SIGTERM, "SIGKILL": signal.SIGKILL}
_STREAMS = {"combined": Stream.COMBINED, "stdout": Stream.STDOUT, "stderr": Stream.STDERR}


def rows(sup: Supervisor, scope: str | None) -> list[dict[str, Any]]:
    """The newest sessions of ``scope`` (None: of every agent), at most ``MAX_ROWS``: an agent's
    rows hold those of all its conversations (``[tools] isolate_conversations``) too."""
    sessions = sup.all_sessions() if scope is None else agent_sessions(sup, scope)
    newest = sorted(sessions, key=lambda s: s.created_at, reverse=True)[:MAX_ROWS]
    return [row(sup, s) for s in newest]


def agent_sessions(sup: Supervisor, agent: str) -> list[Session]:
    """``agent``'s sessions, in its own scope and in each of its conversations' scopes."""
    return [s for s in sup.all_sessions() if agent_of(s.scope) == agent]


def find(sup: Supervisor, agent: str, session_id: str) -> Session:
    """``agent``'s session by id (or name, or prefix) in its own scope, else by exact id in one of
    its conversations': the console is where a human reaches them all."""
    try:
        return sup.get(agent, session_id)
    except SessionNotFound:
        for session in agent_sessions(sup, agent):
            if session.id == session_id:
                return session
        raise


def row(sup: Supervisor, s: Session) -> dict[str, Any]:
    # The tracker's last periodic sample, not a new one: a console asks this of 500 sessions a second.
    usage = sup.usage.latest(s) if s.pid is not None else None
    return {
        "id": s.id,
        "agent": agent_of(s.scope),  # a conversation's sessions are shown under its agent
        "command": s.command[:2000],
        "state": s.state.value,
        "pty": s.spec.pty,
        "ptySize": list(s.spec.pty_size),  # (cols, rows): the console's terminal is made this size
        "pid": s.pid,
        "startedAt": s.started_at,
        "endedAt": s.ended_at,
        "durationMs": s.duration_ms,
        "exitCode": s.exit_code,
        "exitSignal": s.exit_signal,
        "exit": exit_text(s),
        "name": s.name,
        "cpuMs": usage.cpu_ms if usage else 0,
        "memoryBytes": sup.usage.rss_now(s),  # the tree's resident memory now (0 once ended)
        "memoryPeakBytes": usage.memory_peak_bytes if usage else 0,
        "stdinOpen": s.stdin_open,
        "bytes": s.output[Stream.COMBINED].size,
    }


# Endings procpilot brought about: the exit column names them and the signal, never only a code.
_ENDED_BY = {
    SessionState.KILLED: "killed",
    SessionState.TIMED_OUT: "timed out",
    SessionState.LIMIT_EXCEEDED: "memory limit",
}


def exit_text(s: Session) -> str:
    """How a session ended, for the exit column ("" while it runs). A restarting session killed
    between two runs kept its last run's exit code 0: shown as such it read as a success."""
    if not s.finished:
        return ""
    if (word := _ENDED_BY.get(s.state)) is not None:
        if s.exit_signal:
            return f"{word} ({s.exit_signal})"
        sent = f", {s.signal_sent} sent" if s.signal_sent else ""
        last = f"; last run exited {s.exit_code}" if s.exit_code is not None else ""
        return f"{word}{sent}{last}"
    if s.exit_signal:
        return s.exit_signal
    return "" if s.exit_code is None else str(s.exit_code)


def view(session: Session, name: str) -> OutputView:
    if name not in _STREAMS:
        raise InvalidArgument("stream: combined, stdout or stderr", field="stream")
    return session.output[_STREAMS[name]]


async def log_page(session: Session, stream: str, offset: int, limit: int) -> dict[str, Any]:
    """At most ``limit`` (≤ ``PAGE_MAX``) bytes from ``offset``; a negative offset or one past the
    end gives the last ``limit``. One bounded read, whatever the size of the log."""
    log = view(session, stream)
    limit = min(max(1, limit), PAGE_MAX)
    if offset < 0 or offset >= log.size:
        offset = max(0, log.size - limit)
    page = await session.page(_STREAMS[stream], offset, limit)
    return {
        "offset": page.start,
        "end": page.end,
        "total": page.total,
        "dropped": page.dropped,
        "data": page.data,
        "finished": session.finished,
    }


async def output_chunks(
    session: Session, stream: str, start: int, closing: asyncio.Event, tick: float = 1.0
) -> AsyncIterator[dict[str, Any] | None]:
    """The output from ``start`` (-1: the last ``CHUNK``) as it arrives, ``CHUNK`` bytes at most a
    chunk, then one ``{"ended": True, ...}`` once the session has ended and all of it was given.
    ``None`` every ``tick`` seconds of quiet (for keep-alives); nothing more once ``closing`` is set."""
    log = view(session, stream)
    offset = max(0, log.size - CHUNK) if start < 0 else start
    while not closing.is_set():
        if offset < log.size:
            try:
                page = await session.page(_STREAMS[stream], offset, CHUNK)
            except ProcpilotError:  # on a cluster, a node that is gone: what this host holds
                page = log.read(offset, CHUNK)
            offset = page.end
            yield {"offset": page.start, "end": page.end, "dropped": page.dropped, "data": page.data}
            continue
        if session.finished:
            yield {"ended": True, "state": session.state.value, "exitCode": session.exit_code}
            return
        # Short waits: a daemon shutting down ends the stream within ``tick``.
        if await session.output.wait_for_change(tick):
            if session.output.closed and not session.finished:
                await session.wait_finished(tick)  # drained, not yet reaped: the end is near
        else:
            yield None


async def act(sup: Supervisor, session: Session, action: str, body: dict[str, Any]) -> str:
    """Do ``action`` to ``session``; returns what was done, for the audit trail."""
    if action == "signal":
        name = body.get("signal")
        if name not in _SIGNALS:
            raise InvalidArgument("signal: SIGINT, SIGTERM or SIGKILL", field="signal")
        # Kill ends the tree now; INT and TERM leave it the grace period (then SIGKILL), as the
        # process tool's kill does.
        kill_now = name == "SIGKILL"
        await sup.kill(
            session.scope, session.id, _SIGNALS[name], grace=0.0 if kill_now else None, wait=5.0 if kill_now else 0.0
        )
        return str(name)
    if action == "write":
        data, eof = body.get("data", ""), body.get("eof", False)
        if not isinstance(data, str) or len(data) > _MAX_WRITE or not isinstance(eof, bool):
            raise InvalidArgument(f"data: text of at most {_MAX_WRITE} characters; eof: a boolean", field="data")
        # Through the supervisor's write filter: keys typed by a person are input like an agent's.
        written = await sup.write(session.scope, session.id, data.encode(), eof=eof, timeout=5.0)
        return f"{written} bytes" + (", eof" if eof else "")
    if action == "remove":
        await sup.remove(session.scope, session.id)
        return "removed"
    raise InvalidArgument("action: signal, write or remove", field="action")
