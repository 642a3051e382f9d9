"""Everything that touches Ray: joining the cluster, its live nodes, one pinned actor per node.

The only module that imports ``ray``, and only ``procpilot.cluster`` imports it, which only the
``ray`` backend loads: the single-host daemon never imports Ray.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import ray
from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from procpilot.cluster.node import NodeAgent, SpawnFilter
from procpilot.config import Settings
from procpilot.errors import NodeUnavailable, ServeRefused

__all__ = ["NodeActor", "NodeGone", "NodeInfo", "NodeUnreachable", "alive_nodes", "join", "leave"]

# A node runs one follow stream per live session plus the calls: far above Ray's default of
# 1,000 concurrent calls to an async actor.
_MAX_CONCURRENCY = 20_000
# Items a follow stream may have in flight before the node waits for the daemon to take them:
# what bounds the object store's share of one session's output (8 x 1 MiB).
_STREAM_BACKLOG = 8
_CONNECT_TIMEOUT = 5.0  # to see that something listens at the head's address
_CALL_TIMEOUT = 60.0  # a node that takes longer to answer a call is treated as gone
NodeGone = RayActorError  # the actor (its process, its node) died, or cannot be reached
NodeUnreachable = ActorUnavailableError  # cannot be reached now: perhaps dead, perhaps a blip


@dataclass(frozen=True, slots=True)
class NodeInfo:
    node_id: str
    address: str
    resources: dict[str, float]


def join(address: str) -> None:
    """Connect this process to the cluster as a driver (blocking: call it off the event loop)."""
    if ray.is_initialized():
        return
    hint = {"start_cluster": "Start one with `ray start --head`, or set [cluster] address to its HOST:PORT."}
    refused = _unreachable(address)
    if refused is not None:
        # Said at once: ray.init would retry a head that is not there for a minute or more.
        raise ServeRefused(f"no Ray cluster answers at {address!r}: {refused}", hints=hint)
    try:
        ray.init(
            address=address,
            namespace="procpilot",
            log_to_driver=False,  # the node actors' logs stay on their nodes
            logging_level=logging.WARNING,
        )
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise ServeRefused(f"could not join the Ray cluster at {address!r}: {exc}", hints=hint) from None


def _unreachable(address: str) -> str | None:
    """Why nothing takes a connection at HOST:PORT, or None (also for "auto": Ray looks it up)."""
    if address == "auto":
        return None
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=_CONNECT_TIMEOUT):
            return None
    except (OSError, ValueError) as exc:
        return str(exc) or type(exc).__name__


def leave() -> None:
    if ray.is_initialized():
        ray.shutdown()


def alive_nodes() -> list[NodeInfo]:
    """The cluster's live nodes (blocking: one request to Ray's control store)."""
    raw: list[dict[str, Any]] = ray.nodes()  # type: ignore[no-untyped-call]  # ray leaves it unannotated
    return [
        NodeInfo(n["NodeID"], n["NodeManagerAddress"], {k: float(v) for k, v in n["Resources"].items()})
        for n in raw
        if n["Alive"]
    ]


class NodeActor:
    """The daemon's handle on one node's ``NodeAgent`` actor."""

    def __init__(self, settings: Settings, node_id: str, spawn_filter: SpawnFilter | None = None) -> None:
        self.node_id = node_id
        remote_class: Any = ray.remote(NodeAgent)
        self._actor = remote_class.options(
            num_cpus=0,  # it waits on pipes; the sessions' own processes are not Ray's to count
            max_restarts=0,  # a restarted actor would have none of the sessions: the node is lost
            # Not ended by Ray with the daemon: Ray's kill of an owned actor may not leave its worker
            # time to end the trees it runs (it did not, under load). The actor's own watchdog
            # ends them once the daemon falls silent (NodeAgent), the daemon's stop kills it.
            lifetime="detached",
            max_concurrency=_MAX_CONCURRENCY,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
        ).remote(settings, node_id, spawn_filter=spawn_filter)

    async def call(self, method: str, *args: Any, timeout: float = _CALL_TIMEOUT) -> Any:
        """One call; a dead or unreachable node is ``NodeUnavailable`` (nothing was done there)."""
        try:
            async with asyncio.timeout(timeout):
                return await getattr(self._actor, method).remote(*args)
        except (RayActorError, TimeoutError) as exc:
            raise NodeUnavailable(
                f"node {self.node_id[:12]} is gone or not answering ({type(exc).__name__})",
                node=self.node_id,
                actor_died=isinstance(exc, ActorDiedError),  # for good: not a blip to wait out
            ) from None

    async def follow(self, scope: str, session_id: str) -> AsyncIterator[tuple[Any, ...]]:
        """The node's stream of a session's output and end; raises ``NodeGone`` if the node dies."""
        stream = self._actor.follow.options(
            num_returns="streaming", _generator_backpressure_num_objects=_STREAM_BACKLOG
        ).remote(scope, session_id)
        async for ref in stream:
            yield await ref

    def kill(self) -> None:
        ray.kill(self._actor, no_restart=True)
