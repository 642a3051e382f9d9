"""The session lifecycle as an explicit state machine. No dependencies.

    QUEUED ──► RUNNING ──► EXITED_OK | EXITED_ERROR | KILLED | TIMED_OUT | LIMIT_EXCEEDED | LOST
       │          ▲ │
       │          │ ▼
       │       RESTARTING ──► (the same end states)
       │
       └─────► FAILED_TO_START  (also reachable from QUEUED when the lane slot is cancelled)

    QUEUED | RUNNING ──► LOST

RESTARTING is a session with a restart policy between two runs: its last run ended on its own,
its next starts after the backoff (the same id, the same log). Nothing of it runs; a kill ends
it at once (KILLED), a next run that cannot start ends it as its last run ended.

LOST is said of a session nobody can vouch for: a restarted server found its tree gone while no
server ran with no recorded exit, or the cluster node running it died (the session's ``error``
says which). Never guessed to be an exit.

A session enters exactly one end state, once. Faces map these names to their own vocabularies
(spec 002 ``done``/``error``/``killed``, spec 000 ``completed``/``killed``/``timed_out``, spec 003
``STOPPED``/``CRASHED``/``TIMEDOUT``); the mapping lives with each face.
"""

from __future__ import annotations

import enum

__all__ = ["END_STATES", "IllegalTransition", "SessionState", "check_transition"]


class SessionState(enum.Enum):
    QUEUED = "queued"
    RUNNING = "running"
    RESTARTING = "restarting"  # between two runs of a restart policy: no process, the next one due
    EXITED_OK = "exited_ok"
    EXITED_ERROR = "exited_error"
    KILLED = "killed"
    TIMED_OUT = "timed_out"
    LIMIT_EXCEEDED = "limit_exceeded"  # ended by its memory limit (the kernel's OOM killer or the watchdog)
    FAILED_TO_START = "failed_to_start"
    LOST = "lost"  # how it ended is not known (a server outage, a dead node: see Session.error)

    __hash__ = object.__hash__  # singletons compared by identity (see segments.Stream)

    @property
    def is_end(self) -> bool:
        return self in END_STATES


END_STATES = frozenset(
    {
        SessionState.EXITED_OK,
        SessionState.EXITED_ERROR,
        SessionState.KILLED,
        SessionState.TIMED_OUT,
        SessionState.LIMIT_EXCEEDED,
        SessionState.FAILED_TO_START,
        SessionState.LOST,
    }
)

_ALLOWED: dict[SessionState, frozenset[SessionState]] = {
    SessionState.QUEUED: frozenset(
        {SessionState.RUNNING, SessionState.FAILED_TO_START, SessionState.KILLED, SessionState.LOST}
    ),
    SessionState.RUNNING: (END_STATES - {SessionState.FAILED_TO_START}) | {SessionState.RESTARTING},
    SessionState.RESTARTING: (END_STATES - {SessionState.FAILED_TO_START}) | {SessionState.RUNNING},
}


class IllegalTransition(RuntimeError):
    """A bug: the engine tried to move a session along an edge the table does not have."""


def check_transition(current: SessionState, new: SessionState) -> None:
    if new not in _ALLOWED.get(current, frozenset()):
        raise IllegalTransition(f"session cannot go from {current.value} to {new.value}")
