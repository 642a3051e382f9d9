"""The launcher of a daemon on a Ray cluster: its ``Supervisor`` runs every session on a node.

The daemon's ``Supervisor`` is the engine's own, given this launcher (engine/launcher.py): it
runs the same admission (the engine's fence, the agent's policy), keeps names and lanes across
the cluster, and hands each admitted spec here, which places the session on a node (its agent's
``placement`` resource, else the least busy node) and starts it there through that node's
actor. Everything that reads a session (get, list, wait, poll, log, the exit events) works on
the daemon's copy of it, kept current by one stream per session (a bounded copy: a page it does
not hold is read from the node, ``pages.py``). A node that dies ends its sessions ``lost``
(``node_lost``); a node that joins is used from then on.

Invariants: every live session has exactly one pump task reading its node's stream, and a
session leaves the running states only through its node's record of the end or through
``lose``; nothing waits on a node without a bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from procpilot.cluster.node import SpawnFilter
from procpilot.cluster.pages import copy_output
from procpilot.cluster.placement import NodeView, choose_node
from procpilot.cluster.ray_backend import NodeActor, NodeGone, NodeInfo, NodeUnreachable, alive_nodes, join, leave
from procpilot.cluster.remote import RemoteSession, mirror
from procpilot.cluster.replies import raise_reply
from procpilot.config import Settings
from procpilot.engine.capture import Stream
from procpilot.engine.launcher import LaunchHost
from procpilot.engine.scopes import agent_of
from procpilot.engine.session import Session
from procpilot.engine.spawn import SpawnSpec
from procpilot.engine.states import SessionState
from procpilot.engine.supervisor import new_session_id
from procpilot.errors import NodeUnavailable

__all__ = ["RayLauncher"]

_log = logging.getLogger(__name__)
_WATCH_INTERVAL = 2.0  # seconds between two looks at the cluster's membership (a control-plane call)
_JOIN_TIMEOUT = 120.0
_FOLLOW_RETRIES = 3  # a stream that broke while Ray still counts its node alive is followed again
_STATUS_TIMEOUT = 2.0  # for a node's report on its sessions' trees: a result waits no longer for it
_FOLLOW_RETRY_DELAY = 1.0  # a node actor's start: its worker process, the engine's probes


@dataclass(slots=True)
class _Node:
    actor: NodeActor
    info: NodeInfo
    capabilities: dict[str, Any]


class RayLauncher:
    def __init__(self, settings: Settings, *, node_filter: Callable[[Settings], SpawnFilter] | None = None) -> None:
        """``node_filter`` builds the spawn filter each node applies again to the specs it gets
        (``make_spawn_filter``): from the nodes' settings, so no token travels with it."""
        self.settings = settings
        self.config = settings.engine
        self._host: LaunchHost | None = None
        self._nodes: dict[str, _Node] = {}  # live nodes in the order they joined
        self._joining: set[str] = set()
        self._pumps: set[asyncio.Task[None]] = set()
        self._background: set[asyncio.Task[Any]] = set()
        self._watcher: asyncio.Task[None] | None = None
        # What the nodes get: the engine's settings and the policy's, never the daemon's tokens.
        server = settings.server.model_copy(update={"tokens": {}})
        self._node_settings = settings.model_copy(update={"server": server})
        self._node_filter = None if node_filter is None else node_filter(self._node_settings)

    # -- the Launcher seam ---------------------------------------------------------------------

    def bind(self, host: LaunchHost) -> None:
        if self._host is not None:
            raise RuntimeError("a RayLauncher serves one supervisor")
        self._host = host

    @property
    def host(self) -> LaunchHost:
        if self._host is None:
            raise RuntimeError("this RayLauncher was given to no Supervisor")
        return self._host

    async def open(self) -> None:
        """Join the cluster, start an actor on each live node, then watch its membership (a
        failure here closes the supervisor, which leaves the cluster again)."""
        await asyncio.to_thread(join, self.settings.cluster.address)
        await self._refresh_nodes()
        self._watcher = asyncio.ensure_future(self._watch_nodes())

    async def launch(self, spec: SpawnSpec, scope: str, session_id: str | None) -> Session:
        return await self._admitted(spec, scope, session_id)

    def finished(self, session: Session) -> None:
        """No orphans, groups or warm shells here: those are the node's. The lane slot, the
        journal and the exit event are the supervisor's part."""

    def forgotten(self, session: Session) -> None:
        node = self._nodes.get(session.node or "")
        if node is not None:
            self._in_background(node.actor.call("forget", session.scope, session.id))

    async def close(self, grace: float) -> None:
        await self._leave_cluster(grace)

    def _sessions(self) -> list[Session]:
        return self.host.sessions()

    # -- membership ----------------------------------------------------------------------------

    async def _watch_nodes(self) -> None:
        while True:
            await asyncio.sleep(_WATCH_INTERVAL)
            for node in list(self._nodes.values()):  # the beat each node's actor waits for (NodeAgent)
                self._in_background(self._beat(node))
            try:
                await self._refresh_nodes()
            except Exception:  # a control-plane hiccup: look again next time
                _log.warning("could not read the cluster's nodes", exc_info=True)

    async def _beat(self, node: _Node) -> None:
        try:
            await node.actor.call("beat", timeout=_WATCH_INTERVAL)
        except NodeUnavailable as exc:
            if exc.details.get("actor_died"):  # gone for good: the next look starts a new one
                self._node_lost(node.info.node_id, "its actor died")

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
            actor = NodeActor(self._node_settings, info.node_id, self._node_filter)
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
        for session in self._sessions():
            if isinstance(session, RemoteSession) and session.node == node_id:
                session.lose(f"node {node_id[:12]} is gone ({why})")
        if node is not None:
            _log.warning("node %s lost: %s", node_id, why)
            with contextlib.suppress(Exception):
                node.actor.kill()

    def _running_on(self, node_id: str) -> int:
        return sum(1 for s in self._sessions() if s.node == node_id and not s.finished)

    # -- spawning ------------------------------------------------------------------------------

    async def _admitted(self, spec: SpawnSpec, scope: str, session_id: str | None) -> RemoteSession:
        # Lanes are the daemon's, so a cap holds across the cluster: a session that waits for a
        # slot waits here (no node chosen yet) and its node runs it with no lane of its own.
        if spec.lane is None:
            return await self._place(spec, scope, session_id)
        lanes = self.host.lanes
        if not lanes.try_acquire(spec.lane, agent_of(scope)):
            return self._queue(spec, scope)
        try:
            return await self._place(spec, scope, session_id)
        except BaseException:
            lanes.release(spec.lane, agent_of(scope))
            raise

    async def _place(
        self, spec: SpawnSpec, scope: str, session_id: str | None, queued: RemoteSession | None = None
    ) -> RemoteSession:
        """Start ``spec`` on a node (its lane slot, if any, held) and follow it: as a new session,
        or as ``queued``, the session that waited here for its slot."""
        resource = self.settings.policy.for_agent(agent_of(scope)).placement
        while True:
            views = [NodeView(n, node.info.resources, self._running_on(n)) for n, node in self._nodes.items()]
            node = self._nodes[choose_node(views, resource)]
            try:
                reply = await self._start_on(node, scope, spec.without_lane(), session_id)
                break
            except NodeUnavailable as exc:
                if not exc.details.get("actor_died"):
                    raise
                # Its actor is gone (it gave up on a silent daemon, or crashed): a new actor on
                # each live node that has none, and placed again.
                self._node_lost(node.info.node_id, "its actor died")
                await self._refresh_nodes()
        raise_reply(reply)
        record = reply["record"]
        if queued is not None and queued.finished:  # killed here while its node started it
            self._in_background(node.actor.call("forget", scope, record["id"]))
            return queued
        if queued is not None:
            queued.bind(record, node=node.info.node_id, call=node.actor.call)
            session = queued
        else:
            session = self._remote(record, scope, spec, node.info.node_id, node.actor.call)
        self.host.save(session)
        pump = asyncio.ensure_future(self._pump(session, node))
        self._pumps.add(pump)
        pump.add_done_callback(self._pumps.discard)
        return session

    def _remote(
        self, record: dict[str, Any], scope: str, spec: SpawnSpec, node: str | None, call: Any
    ) -> RemoteSession:
        node_dropped: dict[Stream, int] = {}  # shared by the session and its copy's views
        host = self.host
        output = copy_output(host.session_dir(record["id"]), self.config.max_log_bytes, node_dropped)
        session = RemoteSession(
            record,
            scope,
            spec,
            output,
            host.trees(),
            host.on_finish,
            node=node,
            call=call,
            node_dropped=node_dropped,
            kill_grace=self.config.kill_grace_sec,
        )
        host.register(session)
        return session

    def _queue(self, spec: SpawnSpec, scope: str) -> RemoteSession:
        """A session waiting for its lane slot: no node yet, an id of the daemon's making."""
        session_id = new_session_id()
        record = {"id": session_id, "state": SessionState.QUEUED.value, "pid": None, "started_at": None}
        session = self._remote(record, scope, spec, None, None)
        self.host.save(session)
        self.host.start_when_free(session, spec.lane or "")
        return session

    async def launch_queued(self, session: Session) -> None:
        """Place a session that waited here for its lane slot, now held (the supervisor calls
        this once its slot is free); the slot goes back if it never starts."""
        if not isinstance(session, RemoteSession) or session.spec.lane is None:
            raise TypeError(f"the cluster starts only sessions queued for a lane here, not {session!r}")
        lane = session.spec.lane
        lanes = self.host.lanes
        try:
            await self._place(session.spec, session.scope, session.id, queued=session)
        except BaseException:
            lanes.release(lane, agent_of(session.scope))
            raise
        if session.started_at is None:  # killed here while its node started it
            lanes.release(lane, agent_of(session.scope))

    async def _start_on(self, node: _Node, scope: str, spec: SpawnSpec, session_id: str | None) -> dict[str, Any]:
        # Shielded: a caller that gives up must not leave a session the daemon never heard of.
        call = asyncio.ensure_future(node.actor.call("spawn", scope, spec, session_id))
        try:
            return await asyncio.shield(call)
        except asyncio.CancelledError:
            call.add_done_callback(lambda done: self._abandon(node, scope, done))
            raise

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

    # -- leaving -------------------------------------------------------------------------------

    async def _leave_cluster(self, grace: float) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
        nodes = list(self._nodes.values())
        # Each node ends whatever it still runs (a session that was queued, one started as we closed).
        await asyncio.gather(*(n.actor.call("close", timeout=grace + 10) for n in nodes), return_exceptions=True)
        for task in [*self._pumps, *self._background]:
            task.cancel()
        await asyncio.gather(*self._pumps, *self._background, return_exceptions=True)
        for session in self._sessions() if self._host is not None else []:
            if isinstance(session, RemoteSession):
                session.lose("the daemon left the cluster before its end was heard")
        for node in nodes:
            with contextlib.suppress(Exception):
                node.actor.kill()
        self._nodes.clear()
        await asyncio.to_thread(leave)

    # -- the cluster's own reads ---------------------------------------------------------------

    async def observe(self, sessions: Sequence[Session]) -> None:
        """Ask each node running some of ``sessions`` for their usage and stdin waits: one call
        per node, at most ``_STATUS_TIMEOUT`` seconds; a node that does not answer leaves what
        was known."""
        by_node: dict[str, list[RemoteSession]] = {}
        for session in sessions:
            if isinstance(session, RemoteSession) and session.is_running and session.node in self._nodes:
                by_node.setdefault(session.node, []).append(session)
        await asyncio.gather(*(self._observe_on(self._nodes[n], mine) for n, mine in by_node.items()))

    async def _observe_on(self, node: _Node, sessions: list[RemoteSession]) -> None:
        wanted = [(s.scope, s.id) for s in sessions]
        try:
            reply = await node.actor.call("status", wanted, timeout=_STATUS_TIMEOUT)
        except NodeUnavailable:
            return
        for session in sessions:
            if session.id in reply:
                session.apply_status(reply[session.id])

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
        """Beside the daemon's own host's (where the state directory lives): the cluster's."""
        return {"cluster": {"backend": "ray", "address": self.settings.cluster.address, "nodes": self.nodes()}}
