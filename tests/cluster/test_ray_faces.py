"""Every face on remote sessions: the node in every result, logs paged from the node, the node's
own view of a session (waiting for input, usage), lanes and names across the nodes.

Its own two-node cluster (see ``netns.py``); the agent is not placed, so its sessions go to
the least busy node; the tests speak REST and proc/* to the daemon over its Unix socket, as an
agent would. The test that kills the worker node runs last.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Iterator
from typing import Any

import pytest

from procpilot.client import ProcsClient
from procpilot.cluster.pages import COPY_CAP
from procpilot.errors import NodeUnavailable
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


def test_a_lane_caps_its_sessions_across_the_nodes(cluster: Cluster) -> None:
    with cluster.http(TOKEN) as h:
        first = ok(tool(h, "exec", command="sleep 60", yieldMs=0, lane="main"))
        # The other node is idle, but the lane's one slot is taken: it waits, on no node yet.
        second = ok(tool(h, "exec", command="echo second", yieldMs=0, lane="main"))
        assert (first["status"], second["status"]) == ("running", "queued")
        assert "node" not in second
        ok(tool(h, "process", action="kill", sessionId=first["sessionId"]))
        done = ok(tool(h, "process", action="wait", sessionId=second["sessionId"], timeout=30_000))
        assert done["status"] == "done", done
        polled = ok(tool(h, "process", action="poll", sessionId=second["sessionId"]))
        assert polled["output"] == "second\n" and polled["node"]
        # A slot freed by an end goes to the next: one at a time, again.
        third = ok(tool(h, "exec", command="echo third", yieldMs=30_000, lane="main"))
        assert third["status"] == "done"


def test_a_session_name_is_unique_across_the_nodes(cluster: Cluster) -> None:
    def named(h: Any, name: str) -> dict[str, Any]:
        response = h.post("/v1/tools/exec", json={"command": "sleep 60", "yieldMs": 0, "name": name})
        return {**response.json(), "status_code": response.status_code}

    with cluster.http(TOKEN) as h:
        web = ok(named(h, "web"))
        # The other node (the least busy) runs nothing named web, but the agent does.
        refused = named(h, "web")
        assert (refused["status_code"], refused["error"]) == (409, "SessionNameInUse"), refused
        assert ok(named(h, "api"))["node"] != web["node"]


HUNDRED_MB = 100 << 20
HOG = (  # 100 MB resident, a second of CPU, then quiet
    "python3 -c 'import time; b = b\"x\" * (100 << 20)\nwhile time.process_time() < 1: pass\ntime.sleep(300)'"
)


def test_usage_and_stdin_waits_come_from_the_node(cluster: Cluster) -> None:
    with cluster.http(TOKEN) as h:
        # Too short to be sampled: its figures are the node's wait4 rusage, sent with its end.
        ran = ok(tool(h, "process.run", command="python3 -c 'b = b\"x\" * (100 << 20)'"))
        assert ran["resource_usage"]["memory_peak_bytes"] >= HUNDRED_MB, ran
        # Running: the node samples the tree; monitor and both listings show its figures.
        hog = ok(tool(h, "exec", command=HOG, yieldMs=0))["sessionId"]
        reader = ok(tool(h, "exec", command="read line; echo got $line", yieldMs=0))["sessionId"]
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            usage = ok(tool(h, "process.monitor", process_id=hog))["resource_usage"]
            polled = ok(tool(h, "process", action="poll", sessionId=reader))
            if usage["memory_peak_bytes"] >= HUNDRED_MB and usage["cpu_ms"] >= 500 and polled.get("waitingForInput"):
                break
            time.sleep(0.5)
        assert usage["memory_peak_bytes"] >= HUNDRED_MB and usage["cpu_ms"] >= 500, usage
        assert polled["waitingForInput"] is True, polled
        rows = {r["sessionId"]: r for r in ok(tool(h, "process", action="list"))["sessions"]}
        assert rows[hog]["memoryBytes"] >= HUNDRED_MB and rows[hog]["cpuMs"] >= 500, rows[hog]
        assert rows[reader]["waitingForInput"] is True and rows[hog].get("waitingForInput") is not True
        listed = {p["process_id"]: p for p in ok(tool(h, "process.list"))["processes"]}
        assert listed[hog]["resource_usage"]["memory_peak_bytes"] >= HUNDRED_MB
        ok(tool(h, "process", action="write", sessionId=reader, data="x\n"))
        done = ok(tool(h, "process", action="wait", sessionId=reader, timeout=30_000))
        assert done["status"] == "done" and not done.get("waitingForInput")


SEQ = 1_000_000  # `seq 1 1000000`: 6.9 MB per view, past what the daemon's copy of a view keeps
SEQ_BYTES = "".join(f"{n}\n" for n in range(1, SEQ + 1)).encode()


def big_session(h: Any) -> dict[str, Any]:
    done = ok(tool(h, "exec", command=f"seq 1 {SEQ}", yieldMs=120_000))
    assert (done["status"], done["outputBytes"]) == ("done", len(SEQ_BYTES))
    return done


async def test_a_remote_log_is_paged_from_its_node_past_the_daemons_copy(cluster: Cluster) -> None:
    with cluster.http(TOKEN) as h:
        sid = big_session(h)["sessionId"]
        # The daemon keeps a bounded copy of each view (its head and its tail), not the log.
        copy = cluster.root / "state" / "sessions" / sid
        kept = sum(p.stat().st_size for p in copy.iterdir())
        assert kept <= 3 * COPY_CAP < 3 * len(SEQ_BYTES)
        # By line, in the middle: what only the node still has.
        page = ok(tool(h, "process", action="log", sessionId=sid, offset=500_000, limit=3))
        assert page["output"].splitlines() == ["500001", "500002", "500003"]
        assert (page["totalLines"], page["droppedBytes"]) == (SEQ, 0)
        newest = ok(tool(h, "process", action="log", sessionId=sid, limit=2))  # from the copy's tail
        assert newest["output"].splitlines() == [str(SEQ - 1), str(SEQ)]
        # By byte, at several offsets and sizes, through every face that pages.
        for offset, limit in ((3_000_000, 100), (2_500_000, 3 << 20), (len(SEQ_BYTES) - 10, 100)):
            want = SEQ_BYTES[offset : offset + limit]
            assert _paged(h, sid, offset, limit) == want
            console = h.get(f"/console/api/sessions/agent-f/{sid}/log", params={"offset": offset, "limit": 4096})
            assert base64.b64decode(console.json()["data"]) == SEQ_BYTES[offset : offset + 4096]
        assert _paged(h, sid, 0, None) == SEQ_BYTES  # no limit: all of it, a result's budget a page
    async with ProcsClient(f"unix://{cluster.socket}", TOKEN) as procs:
        req = {"type": "proc/log/req", "proc_id": sid, "stream_type": "stdout", "offset": 4_000_000, "limit": 1000}
        proc_page = await procs.request(req)
        assert proc_page["data"].encode() == SEQ_BYTES[4_000_000:4_001_000]


def _paged(h: Any, sid: str, offset: int, limit: int | None) -> bytes:
    """process.logs from ``offset`` on, page after page (each within a result's budget, the next
    one at ``stdout_next_offset``), until ``limit`` bytes (None: the end)."""
    got = b""
    while limit is None or len(got) < limit:
        left = None if limit is None else limit - len(got)
        page = ok(tool(h, "process.logs", process_id=sid, stream="stdout", offset=offset, limit=left))
        got += page["stdout"].encode()
        if page["stdout_next_offset"] is None or page["stdout_next_offset"] <= offset:
            break
        offset = page["stdout_next_offset"]
    return got


async def test_a_gone_nodes_log_serves_what_the_daemon_holds_and_refuses_the_rest(cluster: Cluster) -> None:
    """Last in the module: the worker node does not come back."""
    with cluster.http(TOKEN) as h:
        # Running, so the second goes to the other node (the least busy).
        sessions = [ok(tool(h, "exec", command=f"seq 1 {SEQ}; sleep 300", yieldMs=0)) for _ in range(2)]
        for s in sessions:
            waited = tool(h, "process", action="wait", sessionId=s["sessionId"], pattern=str(SEQ), timeout=60_000)
            assert ok(waited)["reason"] == "pattern"
        caps = h.get("/v1/capabilities").json()["cluster"]["nodes"]
        worker = next(n["node"] for n in caps if netns.WORKER_RESOURCE in n["resources"])
        (gone,) = [s["sessionId"] for s in sessions if s["node"] == worker]
        assert cluster.kill_worker_node() > 1
        deadline = time.monotonic() + 60
        while len(h.get("/v1/capabilities").json()["cluster"]["nodes"]) > 1 and time.monotonic() < deadline:
            time.sleep(0.2)
        # Within the daemon's copy: the newest lines, the first bytes.
        newest = ok(tool(h, "process", action="log", sessionId=gone, limit=2))
        assert newest["output"].splitlines() == [str(SEQ - 1), str(SEQ)]
        first = ok(tool(h, "process.logs", process_id=gone, stream="stdout", limit=14))
        assert first["stdout"] == "1\n2\n3\n4\n5\n6\n7\n"
        # Past it: a typed refusal at once, naming what is held, never a hang.
        refused = tool(h, "process", action="log", sessionId=gone, offset=500_000, limit=3)
        assert (refused["status_code"], refused["error"]) == (503, "NodeUnavailable"), refused
        assert "page_what_is_held" in refused["hints"]
        refused = tool(h, "process.logs", process_id=gone, stream="stdout", offset=3_000_000, limit=100)
        assert (refused["status_code"], refused["error"]) == (503, "NodeUnavailable"), refused
    async with ProcsClient(f"unix://{cluster.socket}", TOKEN) as procs:
        req = {"type": "proc/log/req", "proc_id": gone, "stream_type": "stdout", "offset": 3_000_000, "limit": 100}
        with pytest.raises(NodeUnavailable) as error:
            await procs.request(req)
        assert "page_what_is_held" in error.value.hints
