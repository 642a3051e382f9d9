"""The seam between the supervisor and where its sessions run, in the manner of httpx's transport.

The ``Supervisor`` keeps what is the same wherever a session runs: the registry, scopes, names,
lanes, admission (the engine's fence, the policy's filter), the journal, the exit events and its
own lifecycle. It hands "start this admitted spec as a session" to its ``Launcher``: the local one
(``supervisor.LocalLauncher``: process groups, cgroups, the warm pool, the holder on this host) by
default, or another given to it (``cluster/launcher.py``'s ``RayLauncher`` runs each session on a
node of a Ray cluster). A launcher reaches its supervisor only through the ``LaunchHost`` it is
bound to: no launcher subclasses the engine or reads its private state.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from procpilot.config import Settings
from procpilot.engine.lanes import LaneScheduler
from procpilot.engine.session import Session
from procpilot.engine.spawn import SpawnSpec
from procpilot.engine.trees import TreeBackend

__all__ = ["LaunchHost", "Launcher"]


@dataclass(frozen=True, slots=True)
class LaunchHost:
    """What a launcher may use of the supervisor it is bound to, and nothing more."""

    settings: Settings
    lanes: LaneScheduler  # the supervisor's: a lane's cap holds over every launcher's sessions
    trees: Callable[[], TreeBackend]  # this host's tree backend (known once the supervisor started)
    session_dir: Callable[[str], Path]  # where a session's output and record go (the journal's)
    register: Callable[[Session], None]  # a session the supervisor answers for from now on
    save: Callable[[Session], None]  # its record to the journal
    on_finish: Callable[[Session], None]  # the supervisor's part of a session's end
    start_when_free: Callable[[Session, str], None]  # queue a session for its lane's next slot
    sessions: Callable[[], list[Session]]  # every session the supervisor keeps


class Launcher(Protocol):
    """Starts the specs a supervisor admitted as sessions, and ends with it."""

    def bind(self, host: LaunchHost) -> None:
        """Called once, by the supervisor that owns this launcher, as it is made."""

    async def open(self) -> None:
        """After the supervisor started (a cluster joins here); a failure closes the supervisor."""

    async def launch(self, spec: SpawnSpec, scope: str, session_id: str | None) -> Session:
        """Start ``spec`` (admitted, its name taken) as a new session, or queue it behind its
        lane, and return the session. ``session_id``: the id to use; None: a new one."""

    async def launch_queued(self, session: Session) -> None:
        """Start a session that waited for its lane slot, now held; on failure the slot goes back."""

    def finished(self, session: Session) -> None:
        """A session ended: release what this launcher held for it (before the supervisor's part)."""

    def forgotten(self, session: Session) -> None:
        """A finished session was cleared or expired: whatever else keeps it may let it go."""

    async def close(self, grace: float) -> None:
        """After the supervisor's own shutdown: end whatever this launcher still runs."""

    async def observe(self, sessions: Sequence[Session]) -> None:
        """Bring what ``sessions`` say of their trees up to date (see ``Supervisor.observe``)."""

    def capabilities(self) -> dict[str, Any]:
        """What this launcher adds to ``Supervisor.capabilities()``; {} when nothing."""
