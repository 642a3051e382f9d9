"""procpilot serve on a real two-node Ray cluster: placement, live output, kill, scoping, a dead node.

One cluster for the module (its start is most of the cost): a head offering ``ws_a`` and a
worker offering ``ws_b``, both on 127.0.0.1 inside a private network and pid namespace, with
the daemon joined to it; the tests speak REST to the daemon over its Unix socket, as an agent
would. The test that kills the worker runs next to last, the daemon's shutdown last.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest

from procpilot.client import Client, ProcsClient
from tests.cluster.netns import (
    BIN,
    HEAD_RESOURCE,
    WORKER_RESOURCE,
    Cluster,
    cluster_marks,
    daemon_config,
    remove_sessions,
    running,
    tool,
)
from tests.daemon import marked

pytestmark = cluster_marks()

TOKENS = {"tok-alpha-0123456789": "agent-a", "tok-bravo-9876543210": "agent-b", "tok-pinned-012345678": "pinned"}
TOKEN_A, TOKEN_B, TOKEN_PINNED = list(TOKENS)
CONFIG = daemon_config(
    TOKENS,
    f"""[policy.agents.pinned]
placement = "{WORKER_RESOURCE}"
[policy.agents.agent-b]
allow = ["echo"]
""",
)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with running(tmp_path_factory.mktemp("cluster"), CONFIG) as c:
        yield c


@pytest.fixture(scope="module")
def node_of(cluster: Cluster) -> dict[str, str]:
    """Resource name -> the id of the node offering it."""
    with cluster.http(TOKEN_A) as h:
        nodes = h.get("/v1/capabilities").json()["cluster"]["nodes"]
    return {r: n["node"] for n in nodes for r in n["resources"] if r in (HEAD_RESOURCE, WORKER_RESOURCE)}


@pytest.fixture(autouse=True)
def _remove_sessions(cluster: Cluster) -> Iterator[None]:
    yield
    remove_sessions(cluster, TOKENS)


def background(h: Any, command: str) -> dict[str, Any]:
    result = tool(h, "exec", command=command, yieldMs=0)
    assert result["status_code"] == 200, result
    data: dict[str, Any] = result["data"]
    return data


def test_the_daemon_lists_each_node_with_its_sessions_and_mechanisms(cluster: Cluster, node_of: dict[str, str]) -> None:
    with cluster.http(TOKEN_PINNED) as h:
        background(h, "sleep 60")
        nodes = {n["node"]: n for n in h.get("/v1/capabilities").json()["cluster"]["nodes"]}
    assert set(nodes) == {node_of[HEAD_RESOURCE], node_of[WORKER_RESOURCE]}
    assert nodes[node_of[WORKER_RESOURCE]]["sessions"] == 1
    assert nodes[node_of[HEAD_RESOURCE]]["sessions"] == 0
    for node in nodes.values():
        assert node["tree_kill"] and node["limits"] and node["isolation"]
    # procpilot doctor shows the same, from the daemon it reaches.
    shown = subprocess.run(
        [str(BIN / "procpilot"), "doctor", "--json", "--url", f"unix://{cluster.socket}", "--token", TOKEN_A],
        capture_output=True,
        check=True,
        timeout=120,
        env={**os.environ, "HOME": str(cluster.root)},
    )
    doctor_nodes = json.loads(shown.stdout)["daemon"]["capabilities"]["cluster"]["nodes"]
    assert {n["node"] for n in doctor_nodes} == set(nodes)


def test_an_agent_placed_on_a_resource_runs_only_on_the_node_offering_it(
    cluster: Cluster, node_of: dict[str, str]
) -> None:
    with cluster.http(TOKEN_PINNED) as h:
        for i in range(3):
            done = tool(h, "exec", command=f"echo run {i}", yieldMs=30_000)["data"]
            assert (done["status"], done["output"], done["node"]) == ("done", f"run {i}\n", node_of[WORKER_RESOURCE])
        started = [background(h, "sleep 60") for _ in range(2)]  # a list names backgrounded sessions
        listed = tool(h, "process", action="list")["data"]["sessions"]
        for s in started:
            tool(h, "process", action="remove", sessionId=s["sessionId"])
    assert {row["sessionId"] for row in listed} >= {s["sessionId"] for s in started}
    assert {row["node"] for row in listed} == {node_of[WORKER_RESOURCE]}


def test_unplaced_sessions_go_to_the_node_running_the_fewest(cluster: Cluster, node_of: dict[str, str]) -> None:
    with cluster.http(TOKEN_A) as h:
        first = background(h, "sleep 60")
        second = background(h, "sleep 60")
    assert {first["node"], second["node"]} == set(node_of.values())


def test_remote_output_arrives_live_and_pages_by_line(cluster: Cluster) -> None:
    with cluster.http(TOKEN_A) as h:
        s = background(h, "seq 1 50000; echo ready; sleep 60")
        waited = tool(h, "process", action="wait", sessionId=s["sessionId"], pattern="ready", timeout=30_000)
        # The pattern matched while the command still runs: the output came as it was printed.
        assert waited["data"]["reason"] == "pattern"
        assert waited["data"]["status"] == "running"
        page = tool(h, "process", action="log", sessionId=s["sessionId"], offset=49_990, limit=5)["data"]
        assert page["output"].splitlines() == [str(n) for n in range(49_991, 49_996)]
        assert page["totalLines"] == 50_001


def test_output_order_exit_code_and_stdin_of_a_remote_session(cluster: Cluster) -> None:
    with cluster.http(TOKEN_A) as h:
        # (Paused between prints: two pipes that are both readable at once are read stdout first,
        # on a node as on one host.)
        command = "echo out; sleep 0.2; echo err >&2; sleep 0.2; echo out2; exit 3"
        done = tool(h, "exec", command=command, yieldMs=30_000)["data"]
        assert (done["status"], done["exitCode"], done["output"]) == ("error", 3, "out\nerr\nout2\n")
        s = background(h, "read line; echo got $line")
        tool(h, "process", action="write", sessionId=s["sessionId"], data="hello\n")
        waited = tool(h, "process", action="wait", sessionId=s["sessionId"], timeout=30_000)["data"]
        assert (waited["reason"], waited["status"]) == ("exited", "done")
        poll = tool(h, "process", action="poll", sessionId=s["sessionId"])["data"]
        assert poll["output"] == "got hello\n"


def test_kill_ends_the_whole_tree_on_its_node(cluster: Cluster) -> None:
    with cluster.http(TOKEN_A) as h:
        sessions = [background(h, "sleep 300 & setsid sleep 300 & sh -c 'sleep 300' & wait") for _ in range(2)]
        deadline = time.monotonic() + 20
        while any(len(marked(s["sessionId"])) < 4 for s in sessions) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert all(len(marked(s["sessionId"])) >= 4 for s in sessions)  # the shell and its three sleeps
        for s in sessions:
            killed = tool(h, "process", action="kill", sessionId=s["sessionId"])["data"]
            assert killed["status"] == "killed"
            assert marked(s["sessionId"]) == []


def test_a_session_killed_while_queued_on_its_node_never_starts(cluster: Cluster) -> None:
    with cluster.http(TOKEN_PINNED) as h:  # both on the worker, behind its lane's one slot
        first = tool(h, "exec", command="sleep 60", yieldMs=0, lane="main")["data"]
        second = tool(h, "exec", command="touch ran-after-kill", yieldMs=0, lane="main")["data"]
        assert (first["status"], second["status"]) == ("running", "queued")
        killed = tool(h, "process", action="kill", sessionId=second["sessionId"])["data"]
        assert killed["status"] == "killed"
        tool(h, "process", action="remove", sessionId=first["sessionId"])  # frees the node's slot
        # A session the node still held would start now: give it the time a start takes.
        then = tool(h, "exec", command="echo after", yieldMs=30_000, lane="main")["data"]
        assert then["status"] == "done"
        assert not (cluster.root / "ws" / "ran-after-kill").exists()


def test_scopes_hold_across_nodes(cluster: Cluster) -> None:
    with cluster.http(TOKEN_A) as a, cluster.http(TOKEN_B) as b:
        mine = [background(a, "sleep 60") for _ in range(2)]
        assert len({s["node"] for s in mine}) == 2
        assert tool(b, "process", action="list")["data"]["sessions"] == []
        for s in mine:
            for action in ("poll", "kill", "log"):
                refused = tool(b, "process", action=action, sessionId=s["sessionId"])
                assert refused["status_code"] == 404, refused
        assert {row["sessionId"] for row in tool(a, "process", action="list")["data"]["sessions"]} == {
            s["sessionId"] for s in mine
        }


def test_the_agent_policy_holds_before_any_node_is_asked(cluster: Cluster) -> None:
    with cluster.http(TOKEN_B) as b:
        refused = tool(b, "exec", command="ls /", yieldMs=30_000)
        assert (refused["status_code"], refused["error"]) == (403, "CommandDenied"), refused
        allowed = tool(b, "exec", command="echo allowed", yieldMs=30_000)["data"]
        assert (allowed["status"], allowed["output"]) == ("done", "allowed\n")
        assert allowed["node"]


def test_exit_events_reach_the_python_client(cluster: Cluster) -> None:
    """The SSE stream (what MCP exit notifications and `procpilot` watchers hear) for remote exits."""
    with Client(f"unix://{cluster.socket}", TOKEN_A) as client:
        events = client.events()
        assert next(events)["type"] == "ready"
        started = client.exec("sleep 0.3; echo bye; exit 5", yieldMs=0)
        ended = next(e for e in events if e.get("sessionId") == started["sessionId"])
        assert (ended["status"], ended["exitCode"], ended["node"]) == ("error", 5, started["node"])
        assert "bye" in ended["tail"]


async def test_proc_protocol_streams_remote_output(cluster: Cluster) -> None:
    async with ProcsClient(f"unix://{cluster.socket}", TOKEN_A) as procs:
        proc = await procs.spawn("echo via-proc; sleep 0.2; echo err >&2; exit 4")
        ended = await proc.wait(60)
    assert (ended.state, ended.exit_code) == ("CRASHED", 4)
    assert (proc.stdout, proc.stderr) == ("via-proc\n", "err\n")


def test_a_dead_worker_ends_its_sessions_lost_and_the_daemon_serves_on(
    cluster: Cluster, node_of: dict[str, str]
) -> None:
    """Next to last in the module: the worker node does not come back."""
    with cluster.http(TOKEN_A) as a, cluster.http(TOKEN_PINNED) as p:
        spread = [background(a, "while :; do echo tick; sleep 0.1; done") for _ in range(4)]
        pinned = [background(p, "sleep 300") for _ in range(2)]
        on_worker = [s for s in spread + pinned if s["node"] == node_of[WORKER_RESOURCE]]
        on_head = [s for s in spread if s["node"] == node_of[HEAD_RESOURCE]]
        assert len(on_worker) == 4 and len(on_head) == 2
        assert cluster.kill_worker_node() > 1

        for s in on_worker:
            client = p if s in pinned else a
            waited = tool(client, "process", action="wait", sessionId=s["sessionId"], timeout=60_000)["data"]
            assert waited["reason"] == "exited"
            assert (waited["status"], waited["state"]) == ("lost", "lost")
            assert waited["error"].startswith("node_lost")
        for s in on_head:  # untouched: still running, still printing
            polled = tool(a, "process", action="poll", sessionId=s["sessionId"], timeout=2_000)["data"]
            assert polled["status"] == "running" and "tick" in polled["output"]
        again = tool(a, "exec", command="echo still here", yieldMs=30_000)["data"]
        assert (again["status"], again["output"], again["node"]) == ("done", "still here\n", node_of[HEAD_RESOURCE])
        refused = tool(p, "exec", command="echo nowhere", yieldMs=30_000)
        assert refused["status_code"] == 503 and refused["error"] == "NodeUnavailable", refused
        nodes = a.get("/v1/capabilities").json()["cluster"]["nodes"]
        assert [n["node"] for n in nodes] == [node_of[HEAD_RESOURCE]]

        # A node that joins is used: a new worker offering the resource takes the placed agent.
        cluster.add_worker(WORKER_RESOURCE)
        deadline = time.monotonic() + 60
        while len(a.get("/v1/capabilities").json()["cluster"]["nodes"]) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        back = tool(p, "exec", command="echo placed again", yieldMs=30_000)["data"]
        assert (back["status"], back["output"]) == ("done", "placed again\n")
        assert back["node"] not in node_of.values()


def test_the_daemon_stops_on_sigterm_and_ends_its_sessions_on_the_nodes(cluster: Cluster) -> None:
    """Last in the module: the daemon does not come back."""
    with cluster.http(TOKEN_A) as a:
        running = [background(a, "sleep 300") for _ in range(2)]
    deadline = time.monotonic() + 20
    while any(not marked(s["sessionId"]) for s in running) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert all(marked(s["sessionId"]) for s in running)
    daemon = cluster.daemon()
    daemon.send_signal(signal.SIGTERM)
    daemon.wait(60)  # not our child: psutil waits until it is gone
    log = (cluster.root / "daemon.log").read_text(errors="replace")
    assert "Traceback" not in log, log
    assert [marked(s["sessionId"]) for s in running] == [[], []]
