"""A real two-node Ray cluster and a `procpilot serve` that joins it, all in a private namespace.

``unshare --net --pid --fork --mount-proc`` gives them a network with only the loopback up (Ray
binds 127.0.0.1 and no packet leaves the machine) and a pid namespace of their own, whose init
is the script below: killing it ends every process inside (Ray, the daemon, the sessions), so
nothing outlives the module even if a test fails half-way. The tests reach the daemon through
its Unix socket, which a network namespace does not fence off.

Kept small for a 2-core machine: one CPU per node, no dashboard, a 100 MB object store.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import psutil
import pytest

BIN = Path(sys.executable).parent
HEAD_RESOURCE, WORKER_RESOURCE = "ws_a", "ws_b"
# The control store declares a node dead after about 2 s without its heartbeat (Ray's default is
# 15 s or more): a killed node's sessions end `lost` within seconds, not a quarter of a minute.
_HEALTH = {
    "RAY_health_check_period_ms": "500",
    "RAY_health_check_timeout_ms": "500",
    "RAY_health_check_failure_threshold": "4",
    "RAY_health_check_initial_delay_ms": "0",
}

_INIT = r"""
set -e
ip link set lo up
ray_start() { "$BIN/ray" start --node-ip-address 127.0.0.1 --num-cpus 1 --object-store-memory 100000000 \
    --disable-usage-stats "$@" >>"$ROOT/ray.log" 2>&1; }
ray_start --head --port 6379 --include-dashboard=false --resources '{"ws_a": 1}'
ray_start --address 127.0.0.1:6379 --resources '{"ws_b": 1}'
"$BIN/procpilot" serve --config "$ROOT/procpilot.toml" >"$ROOT/daemon.log" 2>&1 &
wait $! || status=$?
# The namespace ends with its init: a test that kills the daemon keeps the nodes to look at.
[ -z "$OUTLIVE_DAEMON" ] || exec sleep infinity
exit "${status:-0}"
"""


def daemon_config(tokens: dict[str, str], more: str = "") -> str:
    """A daemon on the namespace's cluster, on a Unix socket, with these tokens (token -> agent)."""
    names = "\n".join(f'"{t}" = "{a}"' for t, a in tokens.items())
    return f"""state_dir = "state"
workspace_root = "ws"
[cluster]
backend = "ray"
address = "127.0.0.1:6379"
[tools.exec]
killGraceSec = 2
[server]
port = 0
unix_socket = "daemon.sock"
[server.tokens]
{names}
{more}"""


def cluster_marks() -> list[pytest.MarkDecorator]:
    """A cluster test module's marks: skipped (saying why) where no cluster can run, and a
    timeout that covers the cluster's start."""
    why = unavailable()
    return [pytest.mark.skipif(why is not None, reason=why or ""), pytest.mark.timeout(300)]


def unavailable() -> str | None:
    """Why this machine cannot run the cluster tests, or None."""
    try:
        import ray  # noqa: F401
    except ImportError:
        return "Ray is not installed (pip install 'procpilot[ray]'; make test installs it where it can)"
    if not all(shutil.which(tool) for tool in ("unshare", "nsenter", "ip")):
        return "unshare, nsenter and ip (util-linux, iproute2) are needed for a private network namespace"
    probe = subprocess.run(
        ["unshare", "--net", "--pid", "--fork", "--mount-proc", "sh", "-c", "ip link set lo up"],
        capture_output=True,
        check=False,
    )
    if probe.returncode != 0:
        return f"cannot make a private network and pid namespace here: {probe.stderr.decode().strip()}"
    return None


@dataclass
class Cluster:
    proc: subprocess.Popen[bytes]
    root: Path
    socket: str
    env: dict[str, str]

    def http(self, token: str) -> httpx2.Client:
        transport = httpx2.HTTPTransport(uds=self.socket)
        return httpx2.Client(
            transport=transport, base_url="http://localhost", headers={"Authorization": f"Bearer {token}"}, timeout=120
        )

    def processes(self) -> list[psutil.Process]:
        """Every process inside the namespace (seen from outside, by host pid)."""
        try:
            init = psutil.Process(self.proc.pid).children()
            return [p for top in init for p in (top, *top.children(recursive=True))]
        except psutil.NoSuchProcess:
            return []

    def daemon(self) -> psutil.Process:
        """The `procpilot serve` inside the namespace."""
        serve = [str(BIN / "procpilot"), "serve"]
        found = [p for p, cmd in self._cmdlines() if serve in (cmd[:2], cmd[1:3])]
        assert len(found) == 1, [cmd for _, cmd in self._cmdlines()]
        return found[0]

    def _cmdlines(self) -> list[tuple[psutil.Process, list[str]]]:
        found = []
        for p in self.processes():
            try:
                found.append((p, p.cmdline()))
            except psutil.Error:  # gone, or a zombie of the killed node
                continue
        return found

    def kill_worker_node(self) -> int:
        """What a dead host looks like: the worker's raylet and every process under it, SIGKILLed."""
        raylets = [p for p, cmd in self._cmdlines() if _named(p, "raylet") and WORKER_RESOURCE in " ".join(cmd)]
        assert len(raylets) == 1, [cmd for _, cmd in self._cmdlines()]
        doomed = [raylets[0], *raylets[0].children(recursive=True)]
        for p in doomed:
            with contextlib.suppress(psutil.NoSuchProcess):  # one that ended as we listed them
                p.send_signal(signal.SIGKILL)
        return len(doomed)

    def add_worker(self, resource: str) -> None:
        """Start one more worker node inside the namespace (nsenter into its network, pids, mounts)."""
        init = psutil.Process(self.proc.pid).children()[0]
        env = {**self.env, "BIN": str(BIN)}
        subprocess.run(
            [
                "nsenter",
                "--target",
                str(init.pid),
                "--net",
                "--pid",
                "--mount",
                "--",
                str(BIN / "ray"),
                "start",
                "--address",
                "127.0.0.1:6379",
                "--node-ip-address",
                "127.0.0.1",
                "--num-cpus",
                "1",
                "--object-store-memory",
                "100000000",
                "--disable-usage-stats",
                "--resources",
                json.dumps({resource: 1}),
            ],
            env=env,
            check=True,
            capture_output=True,
            timeout=120,
        )

    def stop(self) -> None:
        # The namespace's init first (its death SIGKILLs everything inside), then unshare itself.
        for p in psutil.Process(self.proc.pid).children():
            p.send_signal(signal.SIGKILL)
        self.proc.kill()
        self.proc.wait(30)


def start_cluster(root: Path, config: str, *, outlive_daemon: bool = False) -> Cluster:
    root.mkdir(parents=True, exist_ok=True)
    (root / "ws").mkdir(exist_ok=True)
    (root / "procpilot.toml").write_text(config)
    env = {
        "PATH": f"{BIN}:{os.environ['PATH']}",
        "HOME": str(root),
        "LANG": "C.UTF-8",
        "BIN": str(BIN),
        "ROOT": str(root),
        "RAY_USAGE_STATS_ENABLED": "0",
        **_HEALTH,
    }
    if outlive_daemon:
        env["OUTLIVE_DAEMON"] = "1"
    if "PYTHONPATH" in os.environ:  # a worktree's tree first, for the daemon and the nodes' workers alike
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    with open(root / "init.log", "wb") as err:
        proc = subprocess.Popen(
            ["unshare", "--net", "--pid", "--fork", "--mount-proc", "--kill-child", "bash", "-c", _INIT],
            env=env,
            cwd=root,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    log = root / "daemon.log"
    deadline = time.monotonic() + 180
    try:
        while time.monotonic() < deadline:
            text = log.read_text(errors="replace") if log.exists() else ""
            sock = re.search(r"unix socket (\S+)", text)
            if sock and "state:" in text:
                return Cluster(proc, root, sock.group(1), env)
            if proc.poll() is not None:
                break
            time.sleep(0.2)
        raise AssertionError(f"the cluster did not start:\n{_logs(root)}")
    except BaseException:
        cluster = Cluster(proc, root, "", env)
        cluster.stop()
        raise


@contextlib.contextmanager
def running(root: Path, config: str, *, outlive_daemon: bool = False) -> Iterator[Cluster]:
    """A cluster and its daemon for the ``with`` block (a module's fixture), stopped after it."""
    cluster = start_cluster(root, config, outlive_daemon=outlive_daemon)
    try:
        yield cluster
    finally:
        cluster.stop()


def remove_sessions(cluster: Cluster, tokens: Iterable[str]) -> None:
    """Remove every session of these agents (between tests), unless the daemon was stopped."""
    if not os.path.exists(cluster.socket):
        return
    for token in tokens:
        with cluster.http(token) as h:
            for row in tool(h, "process", action="list")["data"]["sessions"]:
                tool(h, "process", action="remove", sessionId=row["sessionId"])


def _logs(root: Path) -> str:
    return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in sorted(root.glob("*.log")))


def tool(client: httpx2.Client, name: str, **arguments: Any) -> dict[str, Any]:
    response = client.post(f"/v1/tools/{name}", json=arguments)
    body: dict[str, Any] = response.json()
    body["status_code"] = response.status_code
    return body


def _named(process: psutil.Process, name: str) -> bool:
    """Whether ``process`` is called ``name``; False once it has gone (listed, then ended)."""
    try:
        return bool(process.name() == name)
    except psutil.Error:
        return False
