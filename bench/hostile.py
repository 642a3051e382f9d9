"""A hostile neighbour: how a quiet agent fares while another agent does its worst to a shared daemon.

Run: ``.venv/bin/python bench/hostile.py [--calls 30] [--gap-ms 100]``

It starts a real ``procpilot serve`` on a free loopback port with two agents (bearer tokens
``quiet`` and ``noisy``). The quiet agent runs ``exec true`` over REST, ``--calls`` times, one call
every ``--gap-ms`` (an agent's calls come with the model's thinking in between), first on an idle
daemon, then while the noisy agent does one of these, then all of them at once, then again after
the noise has stopped:

- ``1 MB commands``: four loops sending ``exec`` with a 1 MB command (one word of ``A``);
- ``never-read WS``: a WebSocket that sends 500 ``proc/log/req`` of 1 MiB each and never reads;
- ``1000 idle conns``: 1,000 TCP connections that send half a request line and wait;
- ``exec flood``: eight loops of ``exec true`` back to back (a noisy agent at full rate);
- ``busy sessions``: eight background sessions that each keep a core busy (``while :; do :; done``).

For each phase it prints the quiet agent's p50 and p99 latency, their ratio to the idle phase,
the noisy agent's completed and refused requests, and the daemon's RSS (peak during the phase,
and after it). Traffic goes to 127.0.0.1 only; every loop is bounded in time and it stops by
itself. Nothing is asserted: the figures are for people (see docs/performance.md).

The noisy agent runs in a process of its own (``--noise``), as another agent's client would:
sharing the quiet client's event loop, its work would count in the quiet agent's latencies.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import resource
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx2
import websockets
from load import percentile, rss_mib, start_daemon

QUIET, NOISY = "quiet-token-" + "q" * 20, "noisy-token-" + "n" * 20
CALL_TIMEOUT = 30.0  # a quiet call that takes longer is counted at this latency
PHASE_LIMIT = 60.0  # seconds a phase may take, whatever the daemon does


@dataclass
class Noise:
    done: int = 0
    refused: int = 0
    failed: int = 0
    notes: list[str] = field(default_factory=list)


def client(url: str, token: str) -> httpx2.AsyncClient:
    transport = httpx2.AsyncHTTPTransport(socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)])
    return httpx2.AsyncClient(
        base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=CALL_TIMEOUT, transport=transport
    )


async def exec_loop(command: str, url: str, noise: Noise) -> None:
    """The noisy agent's ``exec`` calls, back to back, as fast as the daemon answers."""
    async with client(url, NOISY) as http:
        while True:
            try:
                response = await http.post("/v1/tools/exec", json={"command": command})
            except httpx2.HTTPError as exc:
                noise.failed += 1
                noise.notes.append(type(exc).__name__)
                continue
            if response.status_code == 200:
                noise.done += 1
            else:
                noise.refused += 1


big_commands = functools.partial(exec_loop, "echo " + "A" * 1_000_000)
exec_flood = functools.partial(exec_loop, "true")


async def busy_sessions(url: str, noise: Noise) -> None:
    """Eight background sessions burning CPU: what the agents' CPU groups are for."""
    started: list[str] = []
    async with client(url, NOISY) as http:
        try:
            for _ in range(8):
                response = await http.post(
                    "/v1/tools/exec",
                    json={"command": "timeout 90 sh -c 'while :; do :; done'", "background": True},
                )
                if response.status_code == 200:
                    started.append(response.json()["data"]["sessionId"])
                    noise.done += 1
                else:
                    noise.refused += 1
            await asyncio.sleep(PHASE_LIMIT)
        finally:
            for session in started:
                with contextlib.suppress(httpx2.HTTPError):
                    await http.post("/v1/tools/process", json={"action": "kill", "sessionId": session})


async def never_read_ws(url: str, noise: Noise) -> None:
    async with client(url, NOISY) as http:  # a session with 2 MiB of stdout to page through
        response = await http.post(
            "/v1/tools/exec", json={"command": "head -c 2097152 /dev/zero | tr '\\0' x", "yieldMs": 10000}
        )
        session = response.json()["data"]["sessionId"]
    ws_url = url.replace("http://", "ws://") + "/v1/proc"
    # max_queue=1: the library stops reading the socket once one message waits, as a client that
    # never reads would; the daemon's writes then meet a full TCP window.
    async with websockets.connect(
        ws_url, additional_headers={"Authorization": f"Bearer {NOISY}"}, max_queue=1, max_size=None
    ) as ws:
        for n in range(500):
            request = {"type": "proc/log/req", "id": n, "proc_id": session, "stream_type": "stdout"}
            try:
                await asyncio.wait_for(ws.send(json.dumps({**request, "offset": 0, "limit": 1 << 20})), 5)
                noise.done += 1
            except (TimeoutError, websockets.WebSocketException):
                noise.refused += 1  # back-pressure: the daemon stopped reading us
                break
        await asyncio.sleep(PHASE_LIMIT)


async def idle_connections(url: str, noise: Noise) -> None:
    host, port = url.removeprefix("http://").split(":")
    held: list[socket.socket] = []
    try:
        for _ in range(1000):
            sock = socket.socket()
            sock.setblocking(False)
            try:
                await asyncio.get_running_loop().sock_connect(sock, (host, int(port)))
                sock.send(b"GET /v1/tools HTTP/1.1\r\nHost: 127.0")  # half a request, never finished
                held.append(sock)
                noise.done += 1
            except OSError as exc:
                sock.close()
                noise.refused += 1
                noise.notes.append(exc.strerror or type(exc).__name__)
        await asyncio.sleep(PHASE_LIMIT)
    finally:
        for sock in held:
            sock.close()


NOISES: dict[str, list[Callable[[str, Noise], Awaitable[None]]]] = {
    "idle": [],
    "1 MB commands": [big_commands] * 4,
    "never-read WS": [never_read_ws],
    "1000 idle conns": [idle_connections],
    "exec flood": [exec_flood] * 8,
    "busy sessions": [busy_sessions],
    "all at once": [*[big_commands] * 4, never_read_ws, idle_connections, *[exec_flood] * 8],
    "after": [],
}


async def quiet_calls(url: str, calls: int, gap: float) -> list[float]:
    latencies = []
    deadline = time.monotonic() + PHASE_LIMIT
    async with client(url, QUIET) as http:
        for _ in range(calls):
            if time.monotonic() > deadline:
                break
            started = time.perf_counter()
            try:
                response = await http.post("/v1/tools/exec", json={"command": "true"})
                assert response.status_code == 200, response.text[:200]
                latencies.append(time.perf_counter() - started)
            except httpx2.TimeoutException:
                latencies.append(CALL_TIMEOUT)
            await asyncio.sleep(gap)
    return latencies


async def noisy_agent(url: str, name: str) -> int:
    """The child process of ``--noise``: make the noise until SIGTERM, then print its counts."""
    noise = Noise()
    tasks = [asyncio.ensure_future(make(url, noise)) for make in NOISES[name]]
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), PHASE_LIMIT + 10)
    for task in tasks:
        task.cancel()
    for task in tasks:
        with contextlib.suppress(BaseException):
            await task
    print(json.dumps({"done": noise.done, "refused": noise.refused, "failed": noise.failed}), flush=True)
    return 0


async def phase(url: str, pid: int, name: str, calls: int, gap: float) -> dict[str, object]:
    noise = Noise()
    child = None
    if NOISES[name]:
        child = await asyncio.create_subprocess_exec(
            sys.executable, __file__, "--noise", name, "--url", url, stdout=asyncio.subprocess.PIPE
        )
    peak = rss_mib(pid)

    async def sample() -> None:
        nonlocal peak
        while True:
            peak = max(peak, rss_mib(pid))
            await asyncio.sleep(0.1)

    sampler = asyncio.ensure_future(sample())
    await asyncio.sleep(1.0 if child else 0)  # let the noise build up
    latencies = await quiet_calls(url, calls, gap)
    sampler.cancel()
    with contextlib.suppress(BaseException):
        await sampler
    if child is not None:
        child.send_signal(signal.SIGTERM)
        out, _ = await child.communicate()
        with contextlib.suppress(ValueError):
            counts = json.loads(out.decode().strip().splitlines()[-1])
            noise.done, noise.refused, noise.failed = counts["done"], counts["refused"], counts["failed"]
    await asyncio.sleep(2.0)  # what the daemon gives back once the noise is gone
    return {
        "name": name,
        "p50": percentile(latencies, 0.5) * 1000,
        "p99": percentile(latencies, 0.99) * 1000,
        "calls": len(latencies),
        "noise": noise,
        "peak": peak,
        "after": rss_mib(pid),
    }


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=30, help="quiet calls per phase")
    parser.add_argument("--gap-ms", type=float, default=100.0, help="idle time between two quiet calls")
    parser.add_argument("--only", default="", help="comma-separated phases (idle always runs first)")
    parser.add_argument("--noise", help=argparse.SUPPRESS)  # run as the noisy agent's process
    parser.add_argument("--url", help=argparse.SUPPRESS)
    args = parser.parse_args()
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # 1,000 connections on each side
    if args.noise:
        return await noisy_agent(args.url, args.noise)

    wanted = [n for n in NOISES if n != "idle" and (not args.only or n in args.only.split(","))]
    rows = []
    with tempfile.TemporaryDirectory(prefix="procpilot-hostile-") as tmp:
        daemon, url = start_daemon(Path(tmp), {QUIET: "quiet", NOISY: "noisy"})
        try:
            start_rss = rss_mib(daemon.pid)
            for name in ["idle", *wanted]:
                rows.append(await phase(url, daemon.pid, name, args.calls, args.gap_ms / 1000))
                print(f"  {name}: done", file=sys.stderr)
        finally:
            daemon.terminate()
            daemon.wait(60)

    idle = rows[0]
    print(f"hostile neighbour: quiet agent's `exec true` over REST, {args.calls} calls {args.gap_ms:.0f} ms apart")
    print(f"daemon RSS at start: {start_rss:.0f} MiB")
    print(
        f"{'phase':<18} {'p50 ms':>8} {'p99 ms':>8} {'p99/idle':>9} {'noisy ok':>9} {'refused':>8} "
        f"{'RSS peak':>9} {'RSS after':>10}"
    )
    for row in rows:
        noise = row["noise"]
        assert isinstance(noise, Noise)
        ratio = float(row["p99"]) / float(idle["p99"])  # type: ignore[arg-type]
        print(
            f"{row['name']:<18} {row['p50']:8.1f} {row['p99']:8.1f} {ratio:8.1f}x {noise.done:9d} "
            f"{noise.refused + noise.failed:8d} {row['peak']:8.0f}M {row['after']:9.0f}M"
        )
    return 0


if __name__ == "__main__":
    # SIGTERM ends a run as Ctrl-C does: its finally blocks end the daemons and sessions it started.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        sys.exit(asyncio.run(main()))
    except KeyboardInterrupt:
        sys.exit(130)
