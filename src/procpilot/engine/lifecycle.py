"""The supervisor's own lifecycle as an explicit state machine. No dependencies but the error tree.

    NEW ──► RUNNING ──► CLOSING ──► CLOSED
     │                                 ▲
     └─────────────────────────────────┘   (closed before it ever started)

NEW: made, nothing started (no state directory opened, no probe, no task). A spawn starts it.
RUNNING: ``start()`` is done: it owns its sessions, its warm pool and its housekeeping.
CLOSING: ``aclose()`` or ``detach()`` runs: sessions end (or are handed over), tasks stop.
CLOSED: nothing of it runs; it never starts again.

A supervisor that is CLOSING or CLOSED refuses whatever would start work (a spawn, a run, a
``start``, its warm pool, its housekeeping) with ``SupervisorClosed``; a start that failed leaves
it NEW (the next spawn tries again), as before. The table below is the one place that says what
may follow what; a move it does not have is a bug (``IllegalLifecycleMove``).
"""

from __future__ import annotations

import enum

from procpilot.errors import SupervisorClosed

__all__ = ["IllegalLifecycleMove", "Lifecycle", "SupervisorState"]


class SupervisorState(enum.Enum):
    NEW = "new"
    RUNNING = "running"
    CLOSING = "closing"
    CLOSED = "closed"

    @property
    def is_ending(self) -> bool:
        """True iff CLOSING or CLOSED: it takes no new work, and never will again."""
        return self in (SupervisorState.CLOSING, SupervisorState.CLOSED)


_ALLOWED: dict[SupervisorState, frozenset[SupervisorState]] = {
    SupervisorState.NEW: frozenset({SupervisorState.RUNNING, SupervisorState.CLOSED}),
    SupervisorState.RUNNING: frozenset({SupervisorState.CLOSING}),
    SupervisorState.CLOSING: frozenset({SupervisorState.CLOSED}),
}


class IllegalLifecycleMove(RuntimeError):
    """A bug: the supervisor tried to move along an edge the table does not have."""


class Lifecycle:
    """Where one supervisor is in its life; ``move`` is the only way on."""

    __slots__ = ("state",)

    def __init__(self) -> None:
        self.state = SupervisorState.NEW

    def __repr__(self) -> str:
        return f"Lifecycle({self.state.value})"

    def move(self, new: SupervisorState) -> None:
        if new not in _ALLOWED.get(self.state, frozenset()):
            raise IllegalLifecycleMove(f"supervisor cannot go from {self.state.value} to {new.value}")
        self.state = new

    def refuse_if_ending(self, what: str) -> None:
        """Raise ``SupervisorClosed`` for ``what`` (a spawn, a start) once the supervisor is ending."""
        if self.state.is_ending:
            raise SupervisorClosed(f"cannot {what}: the supervisor is {self.state.value}", state=self.state.value)
