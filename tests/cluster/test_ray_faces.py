"""Every face on remote sessions: the node in every result, logs paged from the node, the node's
own view of a session (waiting for input, usage).

Its own two-node cluster (see ``netns.py``); the agent is not placed, so its sessions go to
the least busy node; the tests speak REST and proc/* to the daemon over its Unix
socket, as an agent would.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from procpilot.client import ProcsClient
from tests.cluster import netns
from tests.cluster.netns import Cluster, tool

pytestmark = netns.cluster_marks()

TOKENS = {"tok-faces-0123456789": "agent-f"}
(TOKEN,) = TOKENS
CONFIG = netns.daemon_config(TOKENS)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with netns.running(tmp_path_factory.mktemp("cluster"), CONFIG) as c:
        yield c


@pytest.fixture(scope="module")
def nodes(cluster: Cluster) -> set[str]:
    with cluster.http(TOKEN) as h:
        shown = h.get("/v1/capabilities").json()["cluster"]["nodes"]
    found = {n["node"] for n in shown if {netns.HEAD_RESOURCE, netns.WORKER_RESOURCE} & set(n["resources"])}
    assert len(found) == 2
    return found


@pytest.fixture(autouse=True)
def _remove_sessions(cluster: Cluster) -> Iterator[None]:
    yield
    netns.remove_sessions(cluster, TOKENS)


def ok(result: dict[str, Any]) -> dict[str, Any]:
    assert result["status_code"] == 200, result
    data: dict[str, Any] = result["data"]
    return data


def test_process_capabilities_name_the_node_in_every_result(cluster: Cluster, nodes: set[str]) -> None:
    with cluster.http(TOKEN) as h:
        ran = ok(tool(h, "process.run", command="echo hi"))
        assert ran["node"] in nodes and ran["stdout_summary"] == "hi\n"
        bg = ok(tool(h, "process.run", command="sleep 60", background=True))
        assert bg["node"] in nodes
        pid = bg["process_id"]
        assert ok(tool(h, "process.monitor", process_id=pid))["node"] == bg["node"]
        assert ok(tool(h, "process.logs", process_id=pid))["node"] == bg["node"]
        listed = ok(tool(h, "process.list"))["processes"]
        assert {p["process_id"]: p["node"] for p in listed} == {ran["process_id"]: ran["node"], pid: bg["node"]}
        killed = ok(tool(h, "process.kill", process_id=pid, signal="SIGKILL"))
        assert (killed["killed"], killed["node"]) == (True, bg["node"])


async def test_proc_messages_name_the_node_in_every_response(cluster: Cluster, nodes: set[str]) -> None:
    async with ProcsClient(f"unix://{cluster.socket}", TOKEN) as procs:
        spawned = await procs.request({"type": "proc/spawn/req", "cmd": ["sh", "-c", "read x; echo got $x"]})
        node, proc_id = spawned["node"], spawned["proc_id"]
        assert node in nodes
        written = await procs.request({"type": "proc/write/req", "proc_id": proc_id, "data": "a\n", "eof": True})
        assert written["node"] == node
        status = await procs.request({"type": "proc/status/req", "proc_id": proc_id})
        assert status["node"] == node
        page = await procs.request({"type": "proc/log/req", "proc_id": proc_id, "stream_type": "stdout"})
        assert page["node"] == node
        sleeper = await procs.request({"type": "proc/spawn/req", "cmd": ["sleep", "60"]})
        killed = await procs.request({"type": "proc/kill/req", "proc_id": sleeper["proc_id"], "signal": "SIGKILL"})
        assert killed["node"] == sleeper["node"] and killed["state"] == "STOPPED"
