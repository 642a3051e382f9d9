"""Scopes: whose sessions a call sees, and the agent that answers for them.

A scope is an agent id, or, where ``[tools] isolate_conversations`` is on, one MCP conversation of
an agent: ``<agent>`` + ``SEPARATOR`` + ``<conversation>``. Sessions are seen by their exact scope;
everything the agent owns (policy, ``max_procs``, lanes, CPU fairness, audit, the console's
grouping) is keyed by :func:`agent_of`, so a conversation never widens or escapes its agent's
limits.
"""

from __future__ import annotations

__all__ = ["SEPARATOR", "agent_of", "conversation_scope"]

# A control character: no agent id a person writes holds it, so stripping at it can never turn
# one agent's id into another's (which would hand it the other's policy).
SEPARATOR = "\x1f"


def conversation_scope(agent: str, conversation: str) -> str:
    """The scope of one conversation (an MCP session) of ``agent``."""
    return f"{agent}{SEPARATOR}{conversation}"


def agent_of(scope: str) -> str:
    """The agent a scope belongs to: the scope itself, or a conversation scope's agent."""
    return scope.partition(SEPARATOR)[0]
