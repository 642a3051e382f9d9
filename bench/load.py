"""Load test of ``procpilot serve``: many concurrent clients running and polling sessions over REST.

Run: ``.venv/bin/python bench/load.py [--clients 50] [--duration 60] [--agents 5] [--lines 100]``

It starts a real daemon on a free loopback port (its own state directory, one bearer token per
agent), then ``--clients`` asyncio clients, each with its own HTTP connection, loop for
``--duration`` seconds: start a command in the background that prints ``--lines`` numbered lines
tagged with a unique id (with short pauses, so it really runs in the background), poll it every
20 ms until it has ended, check that the concatenated polls are exactly the expected output, then
remove the session. It reports requests/s, p50/p99 latency per kind of request, the daemon's RSS
(at start, peak, at the end), and how many sessions' output arrived complete. It stops by itself
and sends traffic to 127.0.0.1 only. Not part of the test suite: nothing here is asserted, but the
exit code is 1 if any session's output arrived incomplete or any request failed.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import secrets
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2

PROCPILOT = str(Path(sys.executable).parent / "procpilot")


@dataclass
class Stats:
    latencies: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    sessions: int = 0
    complete: int = 0
    incomplete: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def requests(self) -> int:
        return sum(len(v) for v in self.latencies.values())


def start_daemon(
    root: Path, tokens: dict[str, str] | None = None, exec_keys: tuple[str, ...] = ()
) -> tuple[subprocess.Popen[bytes], str]:
    """A `procpilot serve` on a free loopback port over ``root`` (``exec_keys``: [tools.exec] lines)."""
    (root / "ws").mkdir(parents=True)
    config = root / "procpilot.toml"
    lines = ['state_dir = "state"', 'workspace_root = "ws"', "[tools.exec]", *exec_keys]
    lines += ["[server]", 'host = "127.0.0.1"', "port = 0"]
    if tokens:
        lines += ["[server.tokens]", *(f'"{t}" = "{a}"' for t, a in tokens.items())]
    config.write_text("\n".join(lines) + "\n")
    log = root / "daemon.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [PROCPILOT, "serve", "--config", str(config)],
            stdout=out,
            stderr=subprocess.STDOUT,
            # PYTHONPATH passed on: a worktree's code, measured with the shared virtualenv.
            env={"PATH": os.environ["PATH"], "HOME": str(root), "LANG": "C.UTF-8"}
            | {k: v for k, v in os.environ.items() if k == "PYTHONPATH"},
        )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        found = re.search(r"daemon on (http://127\.0\.0\.1:\d+)", log.read_text(errors="replace"))
        if found and "state:" in log.read_text(errors="replace"):
            return proc, found.group(1)
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    proc.kill()
    proc.wait()
    raise SystemExit(f"the daemon did not start:\n{log.read_text(errors='replace')}")


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


async def timed(stats: Stats, kind: str, client: httpx2.AsyncClient, tool: str, **arguments: object) -> dict[str, Any]:
    started = time.perf_counter()
    response = await client.post(f"/v1/tools/{tool}", json=arguments)
    stats.latencies[kind].append(time.perf_counter() - started)
    body = response.json()
    if response.status_code != 200:
        raise RuntimeError(f"{kind}: HTTP {response.status_code} {body.get('error')}: {body.get('message')}")
    data: dict[str, Any] = body["data"]
    return data


async def one_client(url: str, token: str, lines: int, deadline: float, stats: Stats) -> None:
    headers = {"Authorization": f"Bearer {token}"}
    # TCP_NODELAY as procpilot.client does: headers and body are two writes (Nagle + delayed ACK).
    transport = httpx2.AsyncHTTPTransport(socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)])
    async with httpx2.AsyncClient(base_url=url, headers=headers, timeout=60, transport=transport) as client:
        while time.monotonic() < deadline:
            tag = secrets.token_hex(4)
            # Numbered lines with a pause every 25: the command runs ~0.2 s, in the background.
            command = f'for i in $(seq 1 {lines}); do echo "{tag} $i"; [ $((i % 25)) = 0 ] && sleep 0.05; done; true'
            expected = "".join(f"{tag} {i}\n" for i in range(1, lines + 1))
            try:
                started = await timed(stats, "exec", client, "exec", command=command, background=True)
                sid = started["sessionId"]
                received = []
                while True:
                    polled = await timed(stats, "poll", client, "process", action="poll", sessionId=sid, limit=200_000)
                    received.append(polled.get("output") or "")
                    if polled.get("cutChars"):
                        stats.errors.append(f"{sid}: poll cut {polled['cutChars']} characters")
                    if polled["status"] not in ("running", "queued"):
                        break
                    await asyncio.sleep(0.02)
                stats.sessions += 1
                if "".join(received) == expected:
                    stats.complete += 1
                else:
                    stats.incomplete.append(sid)
                await timed(stats, "remove", client, "process", action="remove", sessionId=sid)
            except Exception as exc:  # report, and keep the load on
                stats.errors.append(f"{type(exc).__name__}: {exc}")
                await asyncio.sleep(0.1)


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--duration", type=float, default=60.0)
    parser.add_argument("--agents", type=int, default=5, help="distinct bearer tokens the clients share")
    parser.add_argument("--lines", type=int, default=100, help="lines each session prints")
    args = parser.parse_args()

    tokens = {secrets.token_urlsafe(24): f"agent-{n}" for n in range(args.agents)}
    with tempfile.TemporaryDirectory(prefix="procpilot-load-") as tmp:
        daemon, url = start_daemon(Path(tmp), tokens)
        try:
            rss = [rss_mib(daemon.pid)]
            stats = Stats()
            started = time.monotonic()
            deadline = started + args.duration
            token_list = list(tokens)
            clients = [
                asyncio.ensure_future(one_client(url, token_list[n % len(token_list)], args.lines, deadline, stats))
                for n in range(args.clients)
            ]
            while not all(c.done() for c in clients):
                await asyncio.sleep(1.0)
                rss.append(rss_mib(daemon.pid))
            await asyncio.gather(*clients)
            elapsed = time.monotonic() - started
            rss.append(rss_mib(daemon.pid))
        finally:
            daemon.send_signal(signal.SIGTERM)
            code = daemon.wait(60)

    print(f"procpilot serve load test: {args.clients} clients, {args.agents} agents, {elapsed:.1f} s")
    print(f"  requests: {stats.requests}  ({stats.requests / elapsed:.0f}/s)")
    every = [v for values in stats.latencies.values() for v in values]
    print(
        f"  latency all     p50 {percentile(every, 0.5) * 1000:7.1f} ms   p99 {percentile(every, 0.99) * 1000:7.1f} ms"
    )
    for kind, values in sorted(stats.latencies.items()):
        p50, p99 = percentile(values, 0.5) * 1000, percentile(values, 0.99) * 1000
        print(f"  latency {kind:<7} p50 {p50:7.1f} ms   p99 {p99:7.1f} ms   ({len(values)} requests)")
    print(f"  sessions: {stats.sessions} run, {stats.complete} with complete output ({stats.sessions / elapsed:.1f}/s)")
    print(f"  daemon RSS: start {rss[0]:.0f} MiB, peak {max(rss):.0f} MiB, end {rss[-1]:.0f} MiB")
    print(f"  median RSS over the run: {statistics.median(rss):.0f} MiB; daemon exit code after SIGTERM: {code}")
    if stats.errors:
        print(f"  errors: {len(stats.errors)}; first: {stats.errors[:3]}")
    if stats.incomplete:
        print(f"  INCOMPLETE output: {len(stats.incomplete)} sessions, e.g. {stats.incomplete[:3]}")
    return 1 if stats.errors or stats.incomplete else 0


if __name__ == "__main__":
    # SIGTERM ends a run as Ctrl-C does: its finally blocks end the daemons and sessions it started.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    sys.exit(asyncio.run(main()))
