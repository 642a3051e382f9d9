"""A daemon killed with SIGKILL leaves no session running on the cluster's nodes.

Its own two-node cluster (see ``netns.py``): the daemon starts trees on both nodes, is killed
without a chance to clean up, and each node's actor, hearing from its daemon no more, ends
what it runs.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cluster import netns
from tests.cluster.netns import Cluster, tool
from tests.daemon import marked

pytestmark = netns.cluster_marks()

TOKENS = {"tok-death-0123456789": "agent-d"}
(TOKEN,) = TOKENS


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    config = netns.daemon_config(TOKENS)
    with netns.running(tmp_path_factory.mktemp("cluster"), config, outlive_daemon=True) as c:
        yield c


def spread_trees(cluster: Cluster) -> list[str]:
    """Running sessions spread over both nodes; each a tree of five (a shell, a nested shell,
    three sleeps, one of them in a session of its own)."""
    with cluster.http(TOKEN) as h:
        deadline = time.monotonic() + 60  # after a test that ended the actors: both back
        while len(h.get("/v1/capabilities").json()["cluster"]["nodes"]) < 2 and time.monotonic() < deadline:
            time.sleep(0.5)
        command = "sleep 300 & setsid sleep 300 & sh -c 'sleep 300; :' & wait"
        started: list[dict[str, Any]] = []
        # Four at least; more while a node that lost its actor to the test before is joined again.
        while len(started) < 4 or (len({s["node"] for s in started}) < 2 and len(started) < 8):
            started.append(tool(h, "exec", command=command, yieldMs=0)["data"])
    assert len({s["node"] for s in started}) == 2
    ids = [s["sessionId"] for s in started]
    deadline = time.monotonic() + 30
    while any(len(marked(i)) < 5 for i in ids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert all(len(marked(i)) >= 5 for i in ids)
    return ids


def wait_gone(ids: list[str], within: float) -> dict[str, list[int]]:
    deadline = time.monotonic() + within
    while any(marked(i) for i in ids) and time.monotonic() < deadline:
        time.sleep(0.5)
    return {i: marked(i) for i in ids}


def test_the_nodes_of_a_frozen_daemon_end_its_sessions(cluster: Cluster) -> None:
    """A daemon alive but silent (here stopped; a partition looks the same to a node): Ray
    still counts its driver alive, so only the nodes' own watchdog ends the trees."""
    ids = spread_trees(cluster)
    daemon = cluster.daemon()
    daemon.send_signal(signal.SIGSTOP)
    try:
        # The watchdog's 15 s, the kill grace (2 s here), and slack for a busy machine.
        left = wait_gone(ids, 60)
    finally:
        daemon.send_signal(signal.SIGCONT)
    assert left == {i: [] for i in ids}
    # Back, the daemon finds those sessions ended and the nodes in use again.
    with cluster.http(TOKEN) as h:
        for i in ids:
            waited = tool(h, "process", action="wait", sessionId=i, timeout=60_000)["data"]
            # Ended by the node (its end record was waiting in the stream), or lost with it.
            assert waited["status"] in ("killed", "lost"), waited
        deadline = time.monotonic() + 60
        while (again := tool(h, "exec", command="echo back", yieldMs=30_000))["status_code"] == 503:
            assert time.monotonic() < deadline, again  # NodeUnavailable says: call again
            time.sleep(0.5)
        assert again["data"]["status"] == "done", again


def _host_pid_of(cluster: Cluster, namespace_pid: int) -> int:
    """The host pid of the namespace's process ``namespace_pid`` (its NSpid line's last field)."""
    for process in cluster.processes():
        try:
            status = Path(f"/proc/{process.pid}/status").read_text()
        except OSError:
            continue
        nspid = next((line.split()[1:] for line in status.splitlines() if line.startswith("NSpid:")), [])
        if nspid and int(nspid[-1]) == namespace_pid:
            return process.pid
    raise AssertionError(f"no process {namespace_pid} in the namespace")


def test_a_crashed_node_actor_leaves_no_tree_running(cluster: Cluster) -> None:
    """The actor's engine is what ends a node's trees; killed (by the OOM killer, say), its
    sessions are lost at once, and the actor started in its place on the same node ends the
    trees its predecessor left (its start-up sweep of supervisors that are gone)."""
    ids = spread_trees(cluster)
    with cluster.http(TOKEN) as h:
        rows = {r["sessionId"]: r for r in tool(h, "process", action="list")["data"]["sessions"]}
    victim_node = rows[ids[0]]["node"]
    victims = [i for i in ids if rows[i]["node"] == victim_node]
    others = [i for i in ids if rows[i]["node"] != victim_node]
    environ = Path(f"/proc/{marked(victims[0])[0]}/environ").read_bytes().split(b"\0")
    supervisor = next(v for v in environ if v.startswith(b"PROCPILOT_SUPERVISOR=")).split(b"=", 1)[1]
    actor = _host_pid_of(cluster, int(supervisor.split(b"-")[1]))
    os.kill(actor, signal.SIGKILL)
    assert wait_gone(victims, 60) == {i: [] for i in victims}  # 2.5 s here: the next look, a start
    with cluster.http(TOKEN) as h:
        for i in victims:
            waited = tool(h, "process", action="wait", sessionId=i, timeout=60_000)["data"]
            assert waited["status"] == "lost", waited
        for i in others:  # the other node's sessions never noticed
            assert tool(h, "process", action="poll", sessionId=i)["data"]["status"] == "running"
    assert all(marked(i) for i in others)
    netns.remove_sessions(cluster, TOKENS)


def test_a_killed_daemon_leaves_no_session_running_on_the_nodes(cluster: Cluster) -> None:
    """Last in the module: the daemon does not come back. Ray ends a driver's actors with it,
    and their workers' exits end what they started, at once; the watchdog is the bound."""
    ids = spread_trees(cluster)
    daemon = cluster.daemon()
    daemon.send_signal(signal.SIGKILL)
    daemon.wait(30)
    assert cluster.proc.poll() is None  # the namespace, its nodes and what they run live on
    assert wait_gone(ids, 60) == {i: [] for i in ids}
