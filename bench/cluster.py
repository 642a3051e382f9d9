"""procpilot serve on a two-node Ray cluster against the same daemon on one host, in the same run.

Run: ``.venv/bin/python bench/cluster.py [--quick]`` (needs the ``ray`` extra, unshare and ip).

It starts the tests' cluster (tests/cluster/netns.py: a head and a worker on 127.0.0.1 in a
private network and pid namespace, the daemon joined to it) and a plain one-host daemon, and
drives both over their Unix sockets with the same REST calls an agent makes:

- ``exec true`` (sequential, yieldMs long enough to end): one host vs a session on the worker
  node (an agent placed there) vs a session on the head node (the daemon's own host, still
  through its node actor);
- 100 MB of output (``head -c``) in a background session, until the daemon has seen its end
  (every byte mirrored to the daemon first);
- sessions started per second: ``sleep`` sessions started by 8 concurrent clients;
- paging a 14.9 MB log (64 KiB ``process.logs`` pages: mid-log, read from the node; at its
  end, from the daemon's bounded copy) and ``process list`` of 20 running sessions (the nodes
  asked for usage and stdin waits first).

The per-call rows run back to back and again with 100 ms of quiet before each call (as an
agent's calls come). Nothing is asserted; read the ratio column (cluster / one host). Traffic stays on loopback and
in the namespace; the cluster and the daemon are stopped at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx2

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.cluster.netns import Cluster, start_cluster, unavailable
from tests.daemon import start_daemon

CONFIG = """state_dir = "state"
workspace_root = "ws"
[cluster]
backend = "ray"
address = "127.0.0.1:6379"
[server]
port = 0
unix_socket = "daemon.sock"
[server.tokens]
"tok-local-0123456789" = "a"
"tok-worker-012345678" = "on-worker"
"tok-head-0123456789" = "on-head"
[policy.agents.on-worker]
placement = "ws_b"
[policy.agents.on-head]
placement = "ws_a"
"""


def client(socket: str, token: str) -> httpx2.Client:
    return httpx2.Client(
        transport=httpx2.HTTPTransport(uds=socket),
        base_url="http://localhost",
        headers={"Authorization": f"Bearer {token}"},
        timeout=300,
    )


def call(h: httpx2.Client, tool: str, **arguments: Any) -> dict[str, Any]:
    body: dict[str, Any] = h.post(f"/v1/tools/{tool}", json=arguments).json()
    if "data" not in body:
        raise RuntimeError(body)
    data: dict[str, Any] = body["data"]
    return data


IDLE = 0.1  # an agent's calls come apart: each "after idle" call follows this much quiet


def exec_true(h: httpx2.Client, n: int, idle: float = 0.0) -> float:
    for _ in range(5):
        call(h, "exec", command="true", yieldMs=30_000)
    times = []
    for _ in range(n):
        time.sleep(idle)
        t = time.perf_counter()
        done = call(h, "exec", command="true", yieldMs=30_000)
        times.append(time.perf_counter() - t)
        assert done["status"] == "done", done
    for row in call(h, "process", action="list")["sessions"]:
        call(h, "process", action="remove", sessionId=row["sessionId"])
    return statistics.median(times)


def big_output(h: httpx2.Client, size: int) -> float:
    t = time.perf_counter()
    s = call(h, "exec", command=f"head -c {size} /dev/zero", yieldMs=0)
    done = call(h, "process", action="wait", sessionId=s["sessionId"], timeout=300_000)
    elapsed = time.perf_counter() - t
    assert (done["reason"], done["status"]) == ("exited", "done"), done
    call(h, "process", action="remove", sessionId=s["sessionId"])
    return size / elapsed / 1e6


def log_pages(h: httpx2.Client, n: int, idle: float = 0.0) -> tuple[float, float, float]:
    """p50 of a 64 KiB ``process.logs`` page in the middle of a 14.9 MB log and at its end (on a
    cluster: from the node, and from the daemon's bounded copy), and of ``process list`` with 20
    sessions running (on a cluster: one status call per node first); each after ``idle``."""
    s = call(h, "exec", command="seq 1 2000000", yieldMs=120_000)
    sid, size = s["sessionId"], s["outputBytes"]

    def p50(arguments: dict[str, Any], tool: str = "process.logs") -> float:
        times = []
        for _ in range(n):
            time.sleep(idle)
            t = time.perf_counter()
            call(h, tool, **arguments)
            times.append(time.perf_counter() - t)
        return statistics.median(times)

    middle = p50({"process_id": sid, "stream": "stdout", "offset": size // 2, "limit": 65536})
    end = p50({"process_id": sid, "stream": "stdout", "offset": size - 65536, "limit": 65536})
    running = [call(h, "exec", command="sleep 300", yieldMs=0)["sessionId"] for _ in range(20)]
    listing = p50({"action": "list"}, "process")
    for session_id in [sid, *running]:
        call(h, "process", action="remove", sessionId=session_id)
    return middle, end, listing


async def start_rate(socket: str, token: str, n: int) -> float:
    transport = httpx2.AsyncHTTPTransport(uds=socket)
    async with httpx2.AsyncClient(
        transport=transport, base_url="http://localhost", headers={"Authorization": f"Bearer {token}"}, timeout=300
    ) as h:
        queue: asyncio.Queue[int] = asyncio.Queue()
        for i in range(n):
            queue.put_nowait(i)
        ids: list[str] = []

        async def worker() -> None:
            while not queue.empty():
                queue.get_nowait()
                r = await h.post("/v1/tools/exec", json={"command": "sleep 60", "yieldMs": 0})
                ids.append(r.json()["data"]["sessionId"])

        t = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(8)))
        rate = n / (time.perf_counter() - t)
        for sid in ids:
            await h.post("/v1/tools/process", json={"action": "remove", "sessionId": sid})
        return rate


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    why = unavailable()
    if why:
        print(f"skipped: {why}")
        return 0
    n, size, starts = (20, 20_000_000, 40) if args.quick else (100, 100_000_000, 200)
    with tempfile.TemporaryDirectory(prefix="procpilot-bench-cluster-") as tmp:
        root = Path(tmp)
        local = start_daemon(root / "local", {"tok-local-0123456789": "a"})
        cluster: Cluster | None = None
        try:
            cluster = start_cluster(root / "cluster", CONFIG)
            assert local.unix_socket
            rows: list[tuple[str, float, float, str]] = []
            with (
                client(local.unix_socket, "tok-local-0123456789") as lh,
                client(cluster.socket, "tok-worker-012345678") as wh,
                client(cluster.socket, "tok-head-0123456789") as hh,
            ):
                for idle, when in ((0.0, "back to back"), (IDLE, "after 100 ms idle")):
                    base = exec_true(lh, n, idle) * 1e3
                    for node, h in (("worker", wh), ("head", hh)):
                        rows.append((f"exec true, p50 ms, {when}: {node} node", exec_true(h, n, idle) * 1e3, base, "x"))
                base_mb = big_output(lh, size)
                rows.append((f"{size // 1_000_000} MB output, MB/s: worker node", big_output(wh, size), base_mb, "%"))
                rows.append((f"{size // 1_000_000} MB output, MB/s: head node", big_output(hh, size), base_mb, "%"))
                for idle, when in ((0.0, "back to back"), (IDLE, "after 100 ms idle")):
                    pages, base_pages = log_pages(wh, n, idle), log_pages(lh, n, idle)
                    names = (
                        f"64 KiB log page mid-log, p50 ms, {when}: from the node",
                        f"64 KiB log page at the end, {when}: daemon's copy",
                        f"process list, 20 running, p50 ms, {when}: worker node",
                    )
                    rows += [(name, a * 1e3, b * 1e3, "x") for name, a, b in zip(names, pages, base_pages, strict=True)]
            base_rate = asyncio.run(start_rate(local.unix_socket, "tok-local-0123456789", starts))
            rate = asyncio.run(start_rate(cluster.socket, "tok-local-0123456789", starts))
            rows.append((f"sessions started/s (8 clients, {starts}): 2 nodes", rate, base_rate, "%"))
        finally:
            if cluster is not None:
                cluster.stop()
            local.proc.terminate()
            local.proc.wait(30)
    print(f"{'':64} {'cluster':>10} {'one host':>10} {'ratio':>8}")
    for name, value, baseline, kind in rows:
        ratio = f"{value / baseline:.2f}x" if kind == "x" else f"{100 * value / baseline:.0f}%"
        print(f"{name:64} {value:10.2f} {baseline:10.2f} {ratio:>8}")
    return 0


if __name__ == "__main__":
    # SIGTERM ends a run as Ctrl-C does: its finally blocks end the daemons and sessions it started.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    sys.exit(main())
