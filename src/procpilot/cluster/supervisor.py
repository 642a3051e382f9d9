"""The daemon's supervisor on a Ray cluster: the faces call it as they call the one-host Supervisor.

It *is* a ``Supervisor`` whose sessions all run on the cluster's nodes: ``spawn`` runs the same
admission (the engine's fence, the agent's policy) here, places the session on a node (its
agent's ``placement`` resource, else the least busy node) and starts it there through that
node's actor; everything that reads a session (get, list, wait, poll, log, the exit events)
works on the daemon's copy of it, kept current by one stream per session. A node that dies
ends its sessions ``lost`` (``node_lost``); a node that joins is used from then on.

Invariants: every live session has exactly one pump task reading its node's stream, and a
session leaves the running states only through its node's record of the end or through
``lose``; nothing waits on a node without a bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from procpilot.cluster.placement import NodeView, choose_node
from procpilot.cluster.ray_backend import NodeActor, NodeGone, NodeInfo, NodeUnreachable, alive_nodes, join, leave
from procpilot.cluster.remote import RemoteSession, mirror
from procpilot.cluster.replies import raise_reply
from procpilot.config import Settings
from procpilot.engine.capture import ReadResult, SessionOutput, Stream
from procpilot.engine.session import Session
from procpilot.engine.spawn import SpawnSpec
from procpilot.engine.supervisor import Supervisor
from procpilot.errors import NodeUnavailable, ProcpilotError, SessionNotFound

__all__ = ["ClusterSupervisor"]

_log = logging.getLogger(__name__)
_WATCH_INTERVAL = 2.0  # seconds between two looks at the cluster's membership (a control-plane call)
_JOIN_TIMEOUT = 120.0
_FOLLOW_RETRIES = 3  # a stream that broke while Ray still counts its node alive is followed again
_FOLLOW_RETRY_DELAY = 1.0  # a node actor's start: its worker process, the engine's probes


@dataclass(slots=True)
class _Node:
    actor: NodeActor
    info: NodeInfo
    capabilities: dict[str, Any]


class ClusterSupervisor(Supervisor):
    def __init__(
        self,
        settings: Settings,
        *,
        spawn_filter: Callable[[str, SpawnSpec, int], SpawnSpec] | None = None,
        write_filter: Callable[[str, Session, bytes], None] | None = None,
    ) -> None:
        super().__init__(settings, spawn_filter=spawn_filter, write_filter=write_filter)
        self._nodes: dict[str, _Node] = {}  # live nodes in the order they joined
        self._joining: set[str] = set()
        self._pumps: set[asyncio.Task[None]] = set()
        self._background: set[asyncio.Task[Any]] = set()
        self._watcher: asyncio.Task[None] | None = None
        # What the nodes get: the engine's settings and the policy's, never the daemon's tokens.
        server = settings.server.model_copy(update={"tokens": {}})
        self._node_settings = settings.model_copy(update={"server": server})

    # -- membership ----------------------------------------------------------------------------

    async def start(self) -> ClusterSupervisor:
        if self._started:
            return self
        await super().start()
        try:
            await asyncio.to_thread(join, self.settings.cluster.address)
            await self._refresh_nodes()
        except BaseException:
            await self.aclose()
            raise
        self._watcher = asyncio.ensure_future(self._watch_nodes())
        return self

    async def _watch_nodes(self) -> None:
        while True:
            await asyncio.sleep(_WATCH_INTERVAL)
            try:
                await self._refresh_nodes()
            except Exception:  # a control-plane hiccup: look again next time
                _log.warning("could not read the cluster's nodes", exc_info=True)

    async def _refresh_nodes(self) -> None:
        live = await asyncio.to_thread(alive_nodes)
        ids = {n.node_id for n in live}
        for node_id in [n for n in self._nodes if n not in ids]:
            self._node_lost(node_id, "Ray reports it dead")
        new = [n for n in live if n.node_id not in self._nodes and n.node_id not in self._joining]
        await asyncio.gather(*(self._join_node(info) for info in new))

    async def _join_node(self, info: NodeInfo) -> None:
        self._joining.add(info.node_id)
        try:
            actor = NodeActor(self._node_settings, info.node_id)
            try:
                started = await actor.call("start", timeout=_JOIN_TIMEOUT)
            except NodeUnavailable:
                _log.warning("node %s did not start its supervisor", info.node_id)
                with contextlib.suppress(Exception):
                    actor.kill()
                return
            self._nodes[info.node_id] = _Node(actor, info, started["capabilities"])
        finally:
            self._joining.discard(info.node_id)

    def _node_lost(self, node_id: str, why: str) -> None:
        node = self._nodes.pop(node_id, None)
        for session in self._sessions.values():
            if isinstance(session, RemoteSession) and session.node == node_id:
                session.lose(f"node {node_id[:12]} is gone ({why})")
        if node is not None:
            _log.warning("node %s lost: %s", node_id, why)
            with contextlib.suppress(Exception):
                node.actor.kill()

    def _running_on(self, node_id: str) -> int:
        return sum(1 for s in self._sessions.values() if s.node == node_id and not s.finished)

    # -- spawning ------------------------------------------------------------------------------

    async def spawn(self, spec: SpawnSpec, *, scope: str) -> Session:
        spec = await self._admit(spec, scope)
        if self._store is None:
            raise ProcpilotError("the supervisor is shutting down", hints={"retry": "Start a new server."})
        resource = self.settings.policy.for_agent(scope).placement
        views = [NodeView(n, node.info.resources, self._running_on(n)) for n, node in self._nodes.items()]
        node = self._nodes[choose_node(views, resource)]
        # Shielded: a caller that gives up must not leave a session the daemon never heard of.
        call = asyncio.ensure_future(node.actor.call("spawn", scope, spec))
        try:
            reply = await asyncio.shield(call)
        except asyncio.CancelledError:
            call.add_done_callback(lambda done: self._abandon(node, scope, done))
            raise
        raise_reply(reply)
        record = reply["record"]
        output = SessionOutput(self._store.session_dir(record["id"]), self.config.max_log_bytes)
        session = RemoteSession(
            record,
            scope,
            spec,
            output,
            self._tree_backend,
            self._on_finish,
            node=node.info.node_id,
            call=node.actor.call,
            kill_grace=self.config.kill_grace_sec,
        )
        self._sessions[session.id] = session
        self._store.save(session.id, session.record())
        pump = asyncio.ensure_future(self._pump(session, node))
        self._pumps.add(pump)
        pump.add_done_callback(self._pumps.discard)
        return session

    def _abandon(self, node: _Node, scope: str, done: asyncio.Future[Any]) -> None:
        if done.cancelled() or done.exception() is not None or "record" not in done.result():
            return
        self._in_background(node.actor.call("forget", scope, done.result()["record"]["id"]))

    def _in_background(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        task.add_done_callback(lambda t: t.cancelled() or t.exception())  # retrieved: never logged

    async def _pump(self, session: RemoteSession, node: _Node) -> None:
        """Mirror the node's stream of one session until its end (or the node's).

        A node that cannot be reached but that Ray still counts alive is followed again (from
        the start: the copy skips what it has) a few times, a second apart; a node Ray reports
        dead, or one still unreachable after that, is lost with all its sessions."""
        for attempt in range(_FOLLOW_RETRIES + 1):
            try:
                await self._follow(session, node)
                return
            except NodeUnreachable as exc:
                if attempt == _FOLLOW_RETRIES or not await self._counted_alive(node):
                    self._node_lost(node.info.node_id, type(exc).__name__)
                    return
                await asyncio.sleep(_FOLLOW_RETRY_DELAY)
            except NodeGone as exc:
                self._node_lost(node.info.node_id, type(exc).__name__)
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                _log.exception("the stream of session %s failed", session.id)
                session.lose(f"its stream from node {node.info.node_id[:12]} failed ({type(exc).__name__})")
                return

    async def _follow(self, session: RemoteSession, node: _Node) -> None:
        async for item in node.actor.follow(session.scope, session.id):
            if session.finished:  # ended here first (killed while queued): its copy is closed
                return
            if item[0] == "both":  # one run of stdout or stderr, and where it sits in combined
                mirror(session.output, Stream(item[1]), item[2], item[3], item[4])
            elif item[0] == "end":
                session.apply_end(item[1])
                return
            else:
                session.lose(f"node {node.info.node_id[:12]} no longer has it ({item[1]['message']})")
                return
        session.lose(f"node {node.info.node_id[:12]} ended its stream early")

    async def _counted_alive(self, node: _Node) -> bool:
        if node.info.node_id not in self._nodes:
            return False
        with contextlib.suppress(Exception):
            return any(n.node_id == node.info.node_id for n in await asyncio.to_thread(alive_nodes))
        return False

    # -- what the base class does for local sessions -------------------------------------------

    def _on_finish(self, session: Session) -> None:
        # No lane, no orphans here: those are the node's. The journal and the exit event are ours.
        if self._store is not None and session.id in self._sessions:
            self._store.save(session.id, session.record())
        if session.spec.notify_on_exit and self.exits.has_listeners:
            self.exits.publish(session.exit_info(self.tail_text(session)))

    def _forget(self, session: Session) -> None:
        super()._forget(session)
        node = self._nodes.get(session.node or "")
        if node is not None:
            self._in_background(node.actor.call("forget", session.scope, session.id))

    async def _close(self, sig: int, grace: float | None) -> None:
        try:
            await super()._close(sig, grace)
        finally:
            await self._leave_cluster(self.config.kill_grace_sec if grace is None else grace)

    async def _leave_cluster(self, grace: float) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
        nodes = list(self._nodes.values())
        # Each node ends whatever it still runs (a session that was queued, one started as we closed).
        await asyncio.gather(*(n.actor.call("close", timeout=grace + 10) for n in nodes), return_exceptions=True)
        for task in [*self._pumps, *self._background]:
            task.cancel()
        await asyncio.gather(*self._pumps, *self._background, return_exceptions=True)
        for session in self._sessions.values():
            if isinstance(session, RemoteSession):
                session.lose("the daemon left the cluster before its end was heard")
        for node in nodes:
            with contextlib.suppress(Exception):
                node.actor.kill()
        self._nodes.clear()
        await asyncio.to_thread(leave)

    # -- the cluster's own reads ---------------------------------------------------------------

    async def page(self, scope: str, session_id: str, stream: Stream, offset: int, limit: int) -> ReadResult:
        """Bytes of a session's log read from the node that holds it (its files are the truth)."""
        session = self.get(scope, session_id)
        node = self._nodes.get(session.node or "")
        if node is None:
            raise SessionNotFound(f"session {session_id}'s node is gone", session_id=session_id)
        reply = await node.actor.call("page", scope, session_id, stream.value, offset, limit)
        raise_reply(reply)
        return ReadResult(reply["data"], reply["start"], reply["end"], reply["dropped"], reply["total"])

    def nodes(self) -> list[dict[str, Any]]:
        """The live nodes: their sessions (as this daemon counts them), resources and mechanisms."""
        shown = []
        for node_id, node in self._nodes.items():
            caps = node.capabilities
            shown.append(
                {
                    "node": node_id,
                    "address": node.info.address,
                    "sessions": self._running_on(node_id),
                    "resources": {k: v for k, v in node.info.resources.items() if not k.startswith("node:")},
                    "tree_kill": caps.get("tree_kill"),
                    "limits": caps.get("limits", {}).get("mechanism"),
                    "isolation": caps.get("isolation"),
                }
            )
        return shown

    def capabilities(self) -> dict[str, Any]:
        caps = super().capabilities()  # the daemon's own host: where the state directory lives
        caps["cluster"] = {"backend": "ray", "address": self.settings.cluster.address, "nodes": self.nodes()}
        return caps

