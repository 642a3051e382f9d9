"""When a long-lived session's command ends on its own, whether and when to start it again.

A restart keeps the session: the same id, the same log (a marker line says why and when), the
state is ``restarting`` between two runs (faces show it as running), and nobody hears of an exit
until the last one. What
ends a session for good: a kill (or a timeout, a memory limit, the supervisor shutting down), an
exit the policy accepts (``on-failure``: exit 0), or ``max_restarts`` reached. The delay before
a restart doubles after each quick failure (as pm2's exponential backoff does) and starts over
after a run that lasted ``stable_after`` seconds, so a server that crashes once a day restarts
at once while one that crashes on start does not spin.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["RestartMode", "RestartPolicy", "restart_policy"]

RestartMode = Literal["on-failure", "always"]


@dataclass(frozen=True, slots=True)
class RestartPolicy:
    mode: RestartMode
    max_restarts: int = 10
    backoff: float = 1.0  # seconds before the first restart
    max_backoff: float = 60.0
    stable_after: float = 30.0  # a run at least this long resets the backoff

    def wants(self, exit_code: int | None, exit_signal: str | None) -> bool:
        """Whether a run that ended on its own this way is started again (before the limit)."""
        return self.mode == "always" or exit_signal is not None or exit_code != 0

    def delay(self, quick_failures: int) -> float:
        """Seconds to wait before the next run, after ``quick_failures`` short runs in a row."""
        return min(self.max_backoff, self.backoff * 2.0 ** max(0, quick_failures - 1))


def restart_policy(
    mode: str | None,
    max_restarts: int | None,
    *,
    background: bool,
    default_mode: str,
    default_max_restarts: int,
    backoff: float,
) -> RestartPolicy | None:
    """The restart policy a run asked for (``mode``: "no", "on-failure", "always"; None: not
    given), the same for every face; without one, the configured ``default_mode`` applies to
    background runs only (a foreground command that fails is the agent's to look at)."""
    if mode is None:
        mode = default_mode if background else "no"
    if mode == "no":
        return None
    return RestartPolicy(
        "always" if mode == "always" else "on-failure",
        max_restarts=default_max_restarts if max_restarts is None else max_restarts,
        backoff=backoff,
    )
