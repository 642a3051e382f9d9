"""What the console costs the daemon: paging a 208 MB log, and keeping a console open.

Run: ``.venv/bin/python bench/console.py [--pages 200] [--sessions 100]``

It starts a real daemon on a free loopback port (its own state directory, no tokens), has it run
``seq`` into a 208 MB log, then measures, each twice (back to back, and again after a 5 s idle gap):

1. **log page**: ``GET /console/api/sessions/.../log`` of 64 KiB at random offsets all over the log
   (what the page asks for as a person drags the scrollbar). Baseline: ``GET`` of a 51 KiB static
   file (the vendored uPlot) from the same daemon: the same HTTP stack with no paging work.
2. **an open console**: the daemon's CPU time over 10 s with ``--sessions`` fresh running sessions,
   without a console (baseline: the daemon's own work for them), then with one console stream open
   (a snapshot a second, and the usage tracker sampling their trees once a second).

Nothing is asserted; read the ratios (the machine is shared, see bench/README.md).
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import statistics
import tempfile
import threading
import time
from pathlib import Path

import httpx2
from load import start_daemon

LINES = 16_000_000


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat", "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def median_ms(client: httpx2.Client, urls: list[str]) -> float:
    times = []
    for url in urls:
        t0 = time.perf_counter()
        r = client.get(url)
        times.append((time.perf_counter() - t0) * 1000)
        r.raise_for_status()
    return statistics.median(times)


def paging(client: httpx2.Client, sid: str, pages: int) -> tuple[float, float]:
    total = client.get(f"/console/api/sessions/default/{sid}/log", params={"limit": 1}).json()["total"]
    rng = random.Random(7)  # noqa: S311 - offsets to read, not secrets
    base = f"/console/api/sessions/default/{sid}/log"
    log_urls = [f"{base}?offset={rng.randrange(total)}&limit=65536" for _ in range(pages)]
    static = ["/console/static/vendor/uplot/uPlot.iife.min.js"] * pages
    # Interleaved in blocks, so drift on a shared machine hits both alike.
    got_log, got_static = [], []
    for block in range(4):
        part = slice(block * pages // 4, (block + 1) * pages // 4)
        got_log.append(median_ms(client, log_urls[part]))
        got_static.append(median_ms(client, static[part]))
    return statistics.median(got_log), statistics.median(got_static)


def console_cpu(url: str, pid: int, seconds: float) -> tuple[float, float]:
    """The daemon's CPU % of one core over ``seconds``, without and then with a console stream open."""
    before = cpu_seconds(pid)
    time.sleep(seconds)
    idle = (cpu_seconds(pid) - before) / seconds * 100
    stop = threading.Event()

    def watch() -> None:
        with httpx2.Client(base_url=url, timeout=None) as c, c.stream("GET", "/console/api/stream") as events:
            for _ in events.iter_lines():
                if stop.is_set():
                    return

    reader = threading.Thread(target=watch, daemon=True)
    reader.start()
    time.sleep(1)  # connected, first snapshot sent
    before = cpu_seconds(pid)
    time.sleep(seconds)
    watched = (cpu_seconds(pid) - before) / seconds * 100
    stop.set()
    return watched, idle


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pages", type=int, default=200)
    parser.add_argument("--sessions", type=int, default=100)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="pp-console-bench-") as tmp:
        proc, url = start_daemon(Path(tmp), exec_keys=("maxLogBytes = 314572800",))
        try:
            with httpx2.Client(base_url=url, timeout=300) as c:
                r = c.post("/v1/tools/exec", json={"command": f"seq -f '%012.0f' 1 {LINES}", "yieldMs": 120_000})
                sid = r.json()["data"]["sessionId"]
                rows = []
                for label in ("back to back", "after 5 s idle"):
                    if label != "back to back":
                        time.sleep(5)
                    log_ms, static_ms = paging(c, sid, args.pages)
                    rows.append(
                        (
                            f"64 KiB log page, 208 MB log ({label})",
                            f"{log_ms:.2f} ms",
                            f"{static_ms:.2f} ms",
                            f"{log_ms / static_ms:.2f}x",
                        )
                    )
                for label in ("back to back", "after 5 s idle"):
                    if label != "back to back":
                        time.sleep(5)
                    # Fresh sessions each time: once a console has shown a session, the usage
                    # tracker samples it until it ends, console or not.
                    sleep = {"command": "sleep 120", "yieldMs": 0}
                    started = [c.post("/v1/tools/exec", json=sleep).json() for _ in range(args.sessions)]
                    ids = [r["data"]["sessionId"] for r in started]
                    watched, idle = console_cpu(url, proc.pid, 10)
                    for sid in ids:
                        c.post("/v1/tools/process", json={"action": "kill", "sessionId": sid, "signal": "SIGKILL"})
                    rows.append(
                        (
                            f"daemon CPU, {args.sessions} running, console open ({label})",
                            f"{watched:.1f}%",
                            f"{idle:.1f}%",
                            f"+{watched - idle:.1f} points",
                        )
                    )
        finally:
            proc.terminate()
            proc.wait(60)
    print(f"{'measure':<58} {'procpilot':>12} {'baseline':>12} {'ratio':>14}")
    for name, mine, base, ratio in rows:
        print(f"{name:<58} {mine:>12} {base:>12} {ratio:>14}")
    print("baselines: a 51 KiB static file from the same daemon; the same daemon with no console open")
    return 0


if __name__ == "__main__":
    # SIGTERM ends a run as Ctrl-C does: its finally blocks end the daemons and sessions it started.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    raise SystemExit(main())
