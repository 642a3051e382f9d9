"""The exec face's two profiles: ours (spec 002's vocabulary) and OpenClaw's, in one place.

An agent trained on OpenClaw's ``exec``/``process`` tools reads their results a certain way; with
``[tools.exec] profile = "openclaw"`` (``procpilot mcp --profile openclaw``) the face answers the
way those tools do wherever ours differ. Every difference is a member of :class:`Profile`, which
the face consults; nothing else in the face asks which profile is on:

- status: a command that ran to its end is ``completed`` whatever its exit code (the code is in
  ``exitCode`` and the text ends "(Command exited with code N)"); ``failed`` is kept for a timeout,
  a signal (a kill included), exit 126/127 (the shell could not run it) and a start that failed;
- poll and log results carry ``aggregated``, the output so far (within the result cap);
- the command's environment has ``OPENCLAW_SHELL=exec``;
- send-keys: Home/End are ``ESC [1~``/``ESC [4~`` (``ESC O H``/``ESC O F`` in cursor-key mode),
  a hex element that is no byte is skipped with a warning instead of failing the call, and an
  arrow, Home or End is refused while the program under the terminal has written nothing yet;
- a running poll's ``retryInMs`` follows OpenClaw's backoff (5, 10, 30, 60 s; 5 s after output);
- python/node scripts are checked for shell syntax before they run (policy/script_preflight.py);
- an ``env`` override of a protected variable and an ``elevated`` run the policy does not allow
  are refused in OpenClaw's words (the latter naming the chat the call came from, when its caller
  said: procpilot/chat_context.py), keeping our error types and hints;
- the result texts ("(no new output)", "Process still running.", "showing last 200 of 201 lines",
  a timeout's "re-run with a higher timeout", send-keys' "Sent N bytes to session S.") and the tool
  descriptions (OpenClaw's guidance) follow OpenClaw's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any, Literal

from procpilot.chat_context import ChatContext
from procpilot.config import Settings
from procpilot.engine.keys import encode_hex, encode_hex_lenient, encode_keys, encode_literal
from procpilot.engine.session import Session
from procpilot.engine.states import SessionState
from procpilot.errors import ElevationDenied, ProtectedVariable

__all__ = ["OPENCLAW", "PROCPILOT", "Profile", "profile_for"]

_STATUS = {
    SessionState.QUEUED: "queued",
    SessionState.RUNNING: "running",
    SessionState.RESTARTING: "running",  # between two runs of its restart policy
    SessionState.EXITED_OK: "done",
    SessionState.EXITED_ERROR: "error",
    SessionState.TIMED_OUT: "error",
    SessionState.LIMIT_EXCEEDED: "error",
    SessionState.FAILED_TO_START: "error",
    SessionState.KILLED: "killed",
    SessionState.LOST: "lost",  # never "done": nobody saw how it ended (error says why)
}

EXEC_DESCRIPTION = (
    "Run a shell command (sh -c). Its output comes back if it ends within yieldMs; otherwise it runs on "
    "in the background with a sessionId for the process tool."
)
EXEC_SYNC_DESCRIPTION = (
    "Run a shell command and return its output when it ends (stdin is empty: it cannot prompt). "
    "The whole process tree is killed after timeout seconds."
)
PROCESS_DESCRIPTION = (
    "Follow exec's background sessions. action: list; poll (new output); log (lines by offset/limit); "
    "wait (exit, or pattern in new output); write (data to stdin; eof closes it); send-keys (keys, hex "
    "or literal text); submit/paste (text); kill (whole tree); clear; remove (kill, clear)."
)

# OpenClaw's own descriptions and guidance, cut to fit the definition size cap (1,500 characters with
# the name and the schema) and less what names a tool we do not serve (cron); process also has wait here.
_OPENCLAW_EXEC_DESCRIPTION = (
    "Run shell commands with background continuation. Use yieldMs/background to continue later via "
    "process; confirm it completed there (poll/wait). Use process whenever you need logs, status, input, "
    "or intervention. Do not use exec sleep or delay loops for reminders. Use pty=true for TTY-required commands."
)
_OPENCLAW_PROCESS_DESCRIPTION = (
    "Manage running exec sessions: list, poll, log, wait, write, send-keys, submit, paste, kill, clear, remove. "
    "Poll/wait until status is completed or failed before treating a command as done. Use "
    "write/send-keys/submit/paste/kill for input or intervention. Do not use process polling to emulate timers."
)
# Where procpilot's policy grants elevated runs (docs/security.md: per-agent policy); OpenClaw's
# refusal lists its own config keys the same way.
_ELEVATION_GATE = "elevated_allowed (policy.default.elevated_allowed / policy.agents.<agent>.elevated_allowed)"
_ELEVATION_KEYS = ("policy.default.elevated_allowed", "policy.agents.<agent>.elevated_allowed")
# OpenClaw's advice after a timeout: the agent's next move is a higher timeout or the background.
_RERUN = "If this command is expected to take longer, re-run with a higher timeout (e.g., exec timeout=300)."


class Profile:
    """Our behaviour: spec 002's ``done``/``error``/``killed`` and bracketed status lines."""

    name = "procpilot"
    exec_description = EXEC_DESCRIPTION
    exec_sync_description = EXEC_SYNC_DESCRIPTION
    process_description = PROCESS_DESCRIPTION
    # Variables every command of this profile gets (after the agent's own env).
    env: Mapping[str, str] = MappingProxyType({})
    aggregated = False  # poll/log results carry the whole output so far
    script_preflight = False  # unless [tools.exec] scriptPreflight says otherwise
    # The preflight refuses a script run inside `sh -c` or shell control flow unread (OpenClaw's
    # letter) instead of reading through them (policy/script_preflight.py).
    preflight_fails_closed = False
    # A poll of a session that had ended before it shows the output again (from its start, within
    # the result budget), not only what is new: OpenClaw's poll answers an ended session so.
    finished_poll_repeats = False
    # A command without a terminal gets a stdin pipe the process tool writes to; OpenClaw closes it
    # ("null": the command reads end of file at once, as `cat` or a prompt then do).
    stdin_without_pty: Literal["pipe", "null"] = "pipe"
    # A running session's poll suggests when to poll again (retryInMs): these steps for polls in a
    # row with no new output, reset by output; ``retry_after_output``: a poll with output suggests
    # the first step too (OpenClaw's backoff), not nothing.
    retry_steps_ms: tuple[int, ...] = (1_000, 2_000, 5_000, 10_000, 30_000)
    retry_after_output = False

    def status(self, state: SessionState, exit_code: int | None, exit_signal: str | None) -> str:
        return _STATUS[state]

    def refused_env(self, exc: ProtectedVariable) -> ProtectedVariable:
        """exec's refusal of an env override that names a protected variable."""
        return exc

    def refused_elevation(self, exc: ElevationDenied, chat: ChatContext | None) -> ElevationDenied:
        """exec's refusal of ``elevated`` the agent's policy does not allow; ``chat``: the chat the
        call came from, as its caller said (procpilot/chat_context.py)."""
        return exc

    def unknown_session(self, session_id: str) -> tuple[str, dict[str, Any]] | None:
        """A process action's answer (text, data) for a session id the agent has not got; None:
        refuse it, as ours does (SessionNotFound, with its hints)."""
        return None

    def of(self, session: Session) -> str:
        return self.status(session.state, session.exit_code, session.exit_signal)

    def finished_text(self, session: Session, output: str, ending: str, *, poll: bool, repeated: bool = False) -> str:
        """A finished session's output followed by how it ended (exec, poll and wait); ``repeated``:
        a poll showing an ended session's output again (``finished_poll_repeats``)."""
        line = f"[{self.of(session)}: {ending}]"
        return f"{output}\n{line}" if output else line

    def backgrounded_text(self, session: Session, tail: str, *, announced: bool) -> str:
        """exec's answer when the command goes on in the background; ``announced``: its exit will
        be pushed to the client."""
        verb = "queued (waiting for a lane slot)" if session.state is SessionState.QUEUED else "running"
        text = (
            f"Command {verb} in the background: sessionId={session.id} pid={session.pid}. "
            "Use process wait (blocks until exit or a pattern), poll (new output) or log (pages); "
            + (
                "you will be notified when it exits."
                if announced
                else "its exit is not announced, so wait or poll to learn when it ends."
            )
        )
        return f"{text}\nTail so far:\n{tail}" if tail else text

    def running_text(self, output: str, note: str) -> str:
        """A running session's poll: what arrived, then ``note`` (our bracketed running line)."""
        return f"{output}\n{note}" if output else note

    def list_line(self, session: Session, row: Mapping[str, Any]) -> str:
        """One session in the text of ``process list`` (``row``: its structured entry)."""
        code = "" if session.exit_code is None else f" exit={session.exit_code}"
        return f"{session.id}  {row['status']:<7} {session.duration_ms / 1000:>8.1f}s{code}  {row['name']}"

    def log_note(self, shown: int, total: int) -> str | None:
        """The note of a log call without offset or limit (the default window of the last lines)."""
        if total == 0:
            return "the log is empty: the session has written no output yet"
        return f"showing the last {shown} of {total} lines; pass offset/limit for others"

    def encode_input(
        self, literal: str | None, hex_values: Sequence[str] | None, keys: Sequence[str] | None, *, app_cursor: bool
    ) -> tuple[bytes, list[str]]:
        """send-keys' bytes, in OpenClaw's order (literal, then hex, then keys), and any warnings."""
        payload = encode_literal(literal) if literal else b""
        if hex_values:
            payload += encode_hex(hex_values)
        if keys:
            payload += encode_keys(keys, app_cursor=app_cursor)
        return payload, []

    def keys_refusal(self, session: Session, keys: Sequence[str] | None) -> tuple[str, dict[str, Any]] | None:
        """send-keys' answer (text, data) instead of sending ``keys``; None: send them."""
        return None

    def keys_text(self, written: str, sent: int, session_id: str, warnings: Sequence[str], *, complete: bool) -> str:
        """send-keys' answer: ``written`` is the write's own text, ``sent`` the bytes that went."""
        return written + "".join(f"\n[warning: {w}]" for w in warnings)


class OpenClawProfile(Profile):
    """OpenClaw's exec/process tools, where they differ from ours."""

    name = "openclaw"
    exec_description = _OPENCLAW_EXEC_DESCRIPTION
    exec_sync_description = EXEC_SYNC_DESCRIPTION
    process_description = _OPENCLAW_PROCESS_DESCRIPTION
    env: Mapping[str, str] = MappingProxyType({"OPENCLAW_SHELL": "exec"})
    aggregated = True
    script_preflight = True
    preflight_fails_closed = True
    finished_poll_repeats = True
    stdin_without_pty: Literal["pipe", "null"] = "null"
    retry_steps_ms = (5_000, 10_000, 30_000, 60_000)
    retry_after_output = True

    def refused_env(self, exc: ProtectedVariable) -> ProtectedVariable:
        # OpenClaw's words for one variable; several keep ours, which names them all.
        names = exc.details.get("variables") or []
        if len(names) != 1:
            return exc
        if names[0] == "PATH":
            message = "Security Violation: Custom 'PATH' variable is forbidden during host execution."
        else:
            message = f"Security Violation: Environment variable '{names[0]}' is forbidden during host execution."
        return ProtectedVariable(message, hints=exc.hints, variables=names)

    def refused_elevation(self, exc: ElevationDenied, chat: ChatContext | None) -> ElevationDenied:
        # OpenClaw's lines: what is not available, the gate that failed, which chat asked (only
        # when its caller said), the keys that would grant it (procpilot's, where OpenClaw's are
        # its own). The type and hints stay ours.
        runtime = "sandboxed" if exc.details.get("boxed") else "direct"
        lines = [
            f"elevated is not available right now (runtime={runtime}).",
            f"Failing gates: {_ELEVATION_GATE}",
            *([f"Context: {chat.text()}"] if chat is not None else []),
            "Fix-it keys:",
            *(f"- {key}" for key in _ELEVATION_KEYS),
        ]
        chat_details = {} if chat is None else {"chat": chat.parts()}
        return ElevationDenied("\n".join(lines), hints=exc.hints, **exc.details, **chat_details)

    def unknown_session(self, session_id: str) -> tuple[str, dict[str, Any]] | None:
        # OpenClaw answers rather than throws: a failed status (another agent's id, one gone).
        return f"No session found for {session_id}", {"status": "failed", "sessionId": session_id}

    def status(self, state: SessionState, exit_code: int | None, exit_signal: str | None) -> str:
        if state in (SessionState.QUEUED, SessionState.RUNNING, SessionState.RESTARTING):
            return "running"
        ran_to_its_end = state in (SessionState.EXITED_OK, SessionState.EXITED_ERROR) and exit_signal is None
        # 126 and 127 are the shell's own: the command could not be executed or was not found.
        return "completed" if ran_to_its_end and exit_code not in (126, 127) else "failed"

    def _reason(self, session: Session, ending: str) -> str:
        if session.state is SessionState.TIMED_OUT:
            seconds = session.spec.timeout
            return (
                f"Command timed out after {seconds:g} seconds. {_RERUN}" if seconds else f"Command timed out. {_RERUN}"
            )
        if session.exit_signal is not None or session.state is SessionState.KILLED:
            return f"Command aborted by signal {session.signal_sent or session.exit_signal}"
        if session.exit_code is not None:
            return f"(Command exited with code {session.exit_code})"
        return f"Command failed: {ending}"

    def finished_text(self, session: Session, output: str, ending: str, *, poll: bool, repeated: bool = False) -> str:
        body = output.rstrip("\n")
        completed = self.of(session) == "completed"
        if poll:
            body = body or ("(no output recorded)" if repeated else "(no new output)")
            if session.exit_signal is not None or session.state is SessionState.KILLED:
                how = f"signal {session.signal_sent or session.exit_signal}"
            elif session.exit_code is not None:
                how = f"code {session.exit_code}"
            else:
                how = ending
            return f"{body}\n\nProcess exited with {how}."
        if completed and session.exit_code == 0:
            return body or "(no output)"
        reason = self._reason(session, ending)
        return f"{body}\n\n{reason}" if body else reason

    def backgrounded_text(self, session: Session, tail: str, *, announced: bool) -> str:
        text = (
            f"Command still running (session {session.id}, pid {session.pid}). It has not finished: follow it "
            "with process (poll, log, wait, write, kill) and confirm it completed before relying on its result."
        )
        return f"{text}\n\n{tail.rstrip()}" if tail.strip() else text

    def running_text(self, output: str, note: str) -> str:
        body = output.rstrip("\n") or "(no new output)"
        return f"{body}\n\nProcess still running. {note}"

    def list_line(self, session: Session, row: Mapping[str, Any]) -> str:
        wait = " [input-wait]" if row.get("waitingForInput") else ""
        return f"{session.id} {row['status']:<9} {session.duration_ms / 1000:.1f}s{wait} :: {row['name']}"

    def log_note(self, shown: int, total: int) -> str | None:
        return f"showing last {shown} of {total} lines; pass offset/limit to page" if total > shown else None

    def encode_input(
        self, literal: str | None, hex_values: Sequence[str] | None, keys: Sequence[str] | None, *, app_cursor: bool
    ) -> tuple[bytes, list[str]]:
        payload = encode_literal(literal) if literal else b""
        warnings: list[str] = []
        if hex_values:
            raw, warnings = encode_hex_lenient(hex_values)
            payload += raw
        if keys:
            payload += encode_keys(keys, app_cursor=app_cursor, vt_home_end=True)
        return payload, warnings

    def keys_refusal(self, session: Session, keys: Sequence[str] | None) -> tuple[str, dict[str, Any]] | None:
        # OpenClaw fails loud rather than guess a cursor key's bytes (ESC [A or ESC O A) before
        # the program under the terminal has said which it wants. It waits for a DECCKM report;
        # here the program's first output settles it (a terminal starts in normal mode, and a
        # program that wants application mode switches before it draws), so arrows to a shell
        # that never reports DECCKM are not refused for good.
        if not session.spec.pty or session.terminal.started or not any(map(_cursor_mode_key, keys or ())):
            return None
        text = (
            f"Session {session.id} cursor key mode is not known yet. "
            "Poll or log until startup output appears, then retry send-keys."
        )
        return text, {"status": "failed", "sessionId": session.id}

    def keys_text(self, written: str, sent: int, session_id: str, warnings: Sequence[str], *, complete: bool) -> str:
        if not complete:
            return super().keys_text(written, sent, session_id, warnings, complete=complete)  # ours says what is left
        listed = "".join(f"\n- {w}" for w in warnings)
        return f"Sent {sent} bytes to session {session_id}." + (f"\nWarnings:{listed}" if warnings else "")


def _cursor_mode_key(token: str) -> bool:
    """An unmodified key whose bytes depend on the cursor key mode (OpenClaw's list: the arrows,
    Home and End); ``C-Up``, ``S-Home``... use xterm's modifier form in either mode."""
    return token.strip().lower() in ("up", "down", "left", "right", "home", "end")


PROCPILOT = Profile()
OPENCLAW = OpenClawProfile()
_PROFILES = {p.name: p for p in (PROCPILOT, OPENCLAW)}


def profile_for(settings: Settings) -> Profile:
    # codex and claude replace the exec face's tools; what it still says (exit events, proc://
    # resources) stays in our vocabulary.
    return _PROFILES.get(settings.exec.profile, PROCPILOT)
