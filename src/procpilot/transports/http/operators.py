"""Who sees what: an agent sees its own sessions; an operator sees and acts on every agent's.

Operators are the agents named in ``[server] operators``. With no tokens configured (loopback
only) every caller is the one open agent, the only agent there is, and so sees everything.
"""

from __future__ import annotations

from procpilot.config import ServerSettings
from procpilot.errors import InvalidArgument, OperatorForbidden

__all__ = ["acting_scope", "is_operator"]

_MAX_AGENT_ID = 200  # longer than any configured agent id: refused where it enters


def is_operator(server: ServerSettings, agent: str) -> bool:
    return not server.tokens or agent in server.operators


def acting_scope(server: ServerSettings, agent: str, requested: str | None) -> str:
    """The scope a call acts in: the caller's own, or (operators only) the agent it names."""
    if requested is None or requested == agent:
        return agent
    if not requested or len(requested) > _MAX_AGENT_ID:
        raise InvalidArgument(f"agent: an agent id of 1 to {_MAX_AGENT_ID} characters", field="agent")
    if not is_operator(server, agent):
        raise OperatorForbidden(f"agent {agent!r} is not an operator: it acts only on its own sessions")
    return requested
