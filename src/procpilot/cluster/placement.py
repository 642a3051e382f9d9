"""Which node runs a new session: pure, so it is read (and tested) without a cluster.

An agent with a ``placement`` resource runs only on nodes offering it (its workspace is
there); anything else goes to the node running the fewest sessions. Ties go to the node that
joined first, so a quiet cluster fills its nodes in a predictable order.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from procpilot.errors import NodeUnavailable

__all__ = ["NodeView", "choose_node"]


@dataclass(frozen=True, slots=True)
class NodeView:
    node_id: str
    resources: Mapping[str, float]
    sessions: int  # running now, as the daemon counts them


def choose_node(nodes: Sequence[NodeView], resource: str | None) -> str:
    """The node id for a session whose agent asks for ``resource`` (None: any node)."""
    candidates = [n for n in nodes if resource is None or n.resources.get(resource, 0) > 0]
    if not candidates:
        if resource is None:
            raise NodeUnavailable("no live node in the cluster", resource=None)
        offered = sorted({r for n in nodes for r in n.resources if not r.startswith("node:")})
        raise NodeUnavailable(
            f"no live node offers the resource {resource!r} this agent is placed on",
            hints={"placement": f"Resources the live nodes offer: {', '.join(offered) or 'none'}."},
            resource=resource,
        )
    return min(enumerate(candidates), key=lambda pair: (pair[1].sessions, pair[0]))[1].node_id
