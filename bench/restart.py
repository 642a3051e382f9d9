"""What surviving a restart costs: spawn with and without an owner, adopting N running sessions
after a kill -9 of their server, output drained by the holder while no server runs, N exits
in an outage recorded (the holder's kernel exit records), and a SIGHUP re-exec of a daemon (how
long requests wait meanwhile).

Run: ``.venv/bin/python bench/restart.py [--quick] [--adopt N]`` (~30 s; quick ~12 s; ``--adopt``:
row 2 alone with N sessions, each server's and the holder's descriptors counted). Nothing is asserted;
every figure is printed beside a raw baseline measured in the same run. Every process it starts
is ended before it returns (the last supervisor ends every session; the holder then exits).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from procpilot.config import Settings, load_settings
from procpilot.engine import descriptors
from procpilot.engine.spawn import SpawnSpec
from procpilot.engine.states import SessionState
from procpilot.engine.store import FileStore
from procpilot.engine.supervisor import Supervisor

MIB = 1 << 20
CRASHING = """
import asyncio, json, sys
from pathlib import Path
from procpilot.config import load_settings
from procpilot.engine.spawn import SpawnSpec
from procpilot.engine.supervisor import Supervisor

async def main():
    root, n, command, cap = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
    settings = load_settings(env={}, state_dir=root / "state", workspace_root=root, exec={"max_log_bytes": cap})
    sup = await Supervisor(settings, owner="bench").start()
    ids = [(await sup.spawn(SpawnSpec(command), scope="b")).id for _ in range(n)]
    await asyncio.sleep(0.2)  # past the holder's batch window (50 ms): every session is handed over
    print(json.dumps(ids), flush=True)
    await asyncio.sleep(3600)

asyncio.run(main())
"""


def settings_for(root: Path, cap: int = 64 * MIB) -> Settings:
    return load_settings(env={}, state_dir=root / "state", workspace_root=root, exec={"max_log_bytes": cap})


def crash_with(root: Path, n: int, command: str, cap: int = 64 * MIB) -> list[str]:
    """A supervisor in a child process starts ``n`` sessions of ``command``, then is killed -9."""
    child = subprocess.Popen(
        [sys.executable, "-c", CRASHING, str(root), str(n), command, str(cap)], stdout=subprocess.PIPE
    )
    assert child.stdout is not None
    ids: list[str] = json.loads(child.stdout.readline())
    child.kill()
    child.wait()
    child.stdout.close()
    return ids


def holder_rss(root: Path) -> int:
    sock = str(root / "state" / "holder.sock")
    for name in os.listdir("/proc"):
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                if sock.encode() in f.read():
                    with open(f"/proc/{name}/status") as status:
                        for line in status:
                            if line.startswith("VmRSS:"):
                                return int(line.split()[1]) * 1024
        except OSError:
            continue
    return 0


async def bench_spawn(root: Path, n: int) -> None:
    async with (
        Supervisor(settings_for(root / "plain")) as plain,
        Supervisor(settings_for(root / "owned"), owner="bench") as owned,
    ):
        assert owned.can_detach

        async def raw() -> None:
            subprocess.run(["/bin/sh", "-c", "true"], check=True)  # noqa: ASYNC221 - the baseline

        async def without() -> None:
            s = await plain.run(SpawnSpec("true"), scope="b", yield_ms=None)
            assert s.state is SessionState.EXITED_OK
            plain.clear("b", s.id)

        async def with_owner() -> None:
            s = await owned.run(SpawnSpec("true"), scope="b", yield_ms=None)
            assert s.state is SessionState.EXITED_OK
            owned.clear("b", s.id)

        async def background(sup: Supervisor) -> None:
            # What exec's background=true does: the session's id leaves the server at once.
            s = await sup.spawn(SpawnSpec("true"), scope="b")
            await s.wait_finished()
            assert s.state is SessionState.EXITED_OK
            sup.clear("b", s.id)

        async def bg_without() -> None:
            await background(plain)

        async def bg_owner() -> None:
            await background(owned)

        methods = {"raw": raw, "without": without, "owner": with_owner, "bg_without": bg_without, "bg_owner": bg_owner}
        walls: dict[str, list[float]] = {k: [] for k in methods}
        cpu = dict.fromkeys(methods, 0.0)
        for method in methods.values():
            for _ in range(10):
                await method()
        for block in range(6):  # interleaved blocks: drift hits every method alike
            for name, method in methods.items():
                c0 = time.process_time()
                for _ in range(n // 6 + (block < n % 6)):
                    t0 = time.perf_counter()
                    await method()
                    walls[name].append(time.perf_counter() - t0)
                cpu[name] += time.process_time() - c0
    raw_med = statistics.median(walls["raw"])
    print(
        f"1. exec true x{n} (run: until it ends; spawn: background, then wait), interleaved with the raw"
        " baseline subprocess.run(['/bin/sh', '-c', 'true'])"
    )
    labels = {
        "raw": "raw baseline",
        "without": "Supervisor.run, no owner",
        "owner": "Supervisor.run, owner",
        "bg_without": "Supervisor.spawn, no owner",
        "bg_owner": "Supervisor.spawn, owner",
    }
    for name, label in labels.items():
        med = statistics.median(walls[name])
        print(
            f"   {label:28s} median {med * 1e3:6.3f} ms  ({med / raw_med:4.2f}x raw)"
            f"   parent CPU/call {cpu[name] / len(walls[name]) * 1e6:5.0f} µs"
        )
    ratio = statistics.median(walls["owner"]) / statistics.median(walls["without"])
    print(f"   run: owner / no owner {ratio:.2f}x (the exit trap; a command ending in 50 ms never reaches the holder)")
    ratio = statistics.median(walls["bg_owner"]) / statistics.median(walls["bg_without"])
    print(f"   spawn: owner / no owner {ratio:.2f}x (the holder has its descriptors before spawn returns)")


async def bench_adopt(root: Path, n: int) -> None:
    ids = crash_with(root, n, "sleep 3600")
    fds0 = len(os.listdir("/proc/self/fd"))
    t0 = time.perf_counter()
    sup = await Supervisor(settings_for(root), owner="bench").start()
    adopt = time.perf_counter() - t0
    running = sum(1 for s in sup.all_sessions() if s.is_running)
    fds = len(os.listdir("/proc/self/fd")) - fds0
    holder = sup.capabilities()["restarts"]["holder_pid"]
    holder_fds = len(os.listdir(f"/proc/{holder}/fd")) if holder else 0
    rss = holder_rss(root)
    t1 = time.perf_counter()
    await sup.aclose()
    close = time.perf_counter() - t1
    empty = Path(tempfile.mkdtemp(dir=root))
    t2 = time.perf_counter()
    base = await Supervisor(settings_for(empty), owner="bench").start()
    baseline = time.perf_counter() - t2
    await base.aclose()
    print(f"2. {n} x sleep 3600, their server killed -9, then a new server on the same state dir")
    print(f"   start with adoption       {adopt:6.3f} s   ({running} of {len(ids)} adopted running)")
    print(f"   descriptors of the new server: {fds:,} ({fds / n:.2f} a session); of the holder: {holder_fds:,}")
    per = (adopt - baseline) / n * 1e3
    print(f"   baseline: start, nothing to adopt {baseline:6.3f} s   (adoption adds {per:.2f} ms per session)")
    print(f"   end them all (aclose)     {close:6.3f} s")
    print(f"   holder RSS while holding {n}: {rss / MIB:.1f} MiB")


async def bench_outage_output(root: Path, size: int) -> None:
    root.mkdir(parents=True, exist_ok=True)
    sink = root / "raw.out"
    t0 = time.perf_counter()
    subprocess.run(["sh", "-c", f"head -c {size} /dev/zero > {sink}"], check=True)  # noqa: ASYNC221 - baseline
    raw = time.perf_counter() - t0
    sink.unlink()
    # The session waits a moment so every byte of it flows while no server runs.
    ids = crash_with(root, 1, f"sleep 0.5; head -c {size} /dev/zero", cap=size + MIB)
    t1 = time.perf_counter()
    exit_file = root / "state" / "sessions" / f"{ids[0]}.exit"
    while not exit_file.exists():  # noqa: ASYNC110 - a file another process writes: nothing to await
        await asyncio.sleep(0.005)
    drained = time.perf_counter() - t1 - 0.3  # the child slept 0.5 s, 0.2 s of it before the kill
    t2 = time.perf_counter()
    sup = await Supervisor(settings_for(root, cap=size + MIB), owner="bench").start()
    replay = time.perf_counter() - t2
    session = sup.all_sessions()[0]
    await session.wait_finished(30)
    stored = session.output.views[next(iter(session.output.views))].size
    await sup.aclose()
    print(f"3. {size // MIB} MiB printed while no server ran (head -c from /dev/zero)")
    print(f"   through the holder into its spool  {size / MIB / drained:7.0f} MiB/s")
    print(f"   raw baseline: head > file          {size / MIB / raw:7.0f} MiB/s")
    print(f"   replayed into the logs at adoption {replay:.2f} s ({stored // MIB} MiB, exit {session.exit_code})")


async def bench_outage_exits(root: Path, n: int) -> None:
    """N sessions ended by a signal while no server runs: does every one report it after adoption?"""
    ids = crash_with(root, n, "sleep 600")
    records = FileStore(root / "state").load()
    await asyncio.sleep(0.5)  # the holder listens within milliseconds of its server's death
    t0 = time.perf_counter()
    for sid in ids:
        os.killpg(records[sid]["pid"], signal.SIGTERM)
    written = [root / "state" / "sessions" / f"{sid}.exit.json" for sid in ids]
    deadline = time.monotonic() + 20
    while not all(p.exists() for p in written) and time.monotonic() < deadline:  # noqa: ASYNC110 - another process writes them
        await asyncio.sleep(0.01)
    recorded = time.perf_counter() - t0
    files = sum(p.exists() for p in written)
    sup = await Supervisor(settings_for(root), owner="bench").start()
    for session in sup.all_sessions():
        await session.wait_finished(30)
    told = sum(1 for s in sup.all_sessions() if s.exit_signal == "SIGTERM")
    lost = sum(1 for s in sup.all_sessions() if s.state is SessionState.LOST)
    why = next((s.error for s in sup.all_sessions() if s.state is SessionState.LOST), None)
    await sup.aclose()
    print(f"4. {n} x sleep 600, their server killed -9, each then ended by SIGTERM, then a new server")
    print(f"   adopted with exitSignal SIGTERM  {told} of {n}   lost {lost}{f' ({why})' if why else ''}")
    print(f"   the holder's records written     {recorded:6.3f} s after the first signal ({files} files)")


def bench_reload(root: Path, n: int) -> None:
    """``procpilot serve`` with ``n`` sessions running gets SIGHUP: how long a request sent at that
    moment waits (in the listening socket's backlog) for the re-exec'd image, beside a cold start."""
    import httpx2

    root.mkdir(parents=True, exist_ok=True)
    config = root / "procpilot.toml"
    config.write_text(f'state_dir = "{root / "state"}"\nworkspace_root = "{root}"\n[server]\nport = 0\n')
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "PYTHONPATH")}
    log = root / "daemon.log"
    t0 = time.perf_counter()
    with open(log, "wb") as out:
        daemon = subprocess.Popen(
            [str(Path(sys.executable).with_name("procpilot")), "serve", "--config", str(config)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,  # no terminal: a SIGHUP is a reload
        )
    try:
        while "daemon on http" not in log.read_text():
            assert daemon.poll() is None, log.read_text()
            time.sleep(0.01)
        url = log.read_text().split("daemon on ", 1)[1].split()[0]
        with httpx2.Client(base_url=url, timeout=60) as c:
            c.get("/v1/capabilities").raise_for_status()
            cold = time.perf_counter() - t0
            for _ in range(n):
                c.post("/v1/tools/exec", json={"command": "sleep 600", "background": True}).raise_for_status()
        t1 = time.perf_counter()
        daemon.send_signal(signal.SIGHUP)
        longest, failed, back = 0.0, 0, 0.0
        while not back:
            new_image = log.read_text().count("daemon on http") == 2
            t2 = time.perf_counter()
            try:
                with httpx2.Client(base_url=url, timeout=60) as c:  # a new connection each time
                    c.get("/v1/capabilities").raise_for_status()
            except httpx2.HTTPError:
                failed += 1
            longest = max(longest, time.perf_counter() - t2)
            back = time.perf_counter() - t1 if new_image else 0.0
            time.sleep(0.01)
        with httpx2.Client(base_url=url, timeout=60) as c:
            rows = c.post("/v1/tools/process", json={"action": "list"}).json()["data"]["sessions"]
            running = sum(1 for row in rows if row["status"] == "running")
    finally:
        daemon.send_signal(signal.SIGTERM)  # ends every session, then the daemon
        daemon.wait(60)
    print(f"5. SIGHUP to procpilot serve with {n} sessions running (sleep 600)")
    print(f"   the new image serving, from the signal   {back:5.2f} s ({running} of {n} running after)")
    print(f"   longest wait of a request meanwhile     {longest:5.2f} s ({failed} refused or failed)")
    print(f"   baseline: the daemon's cold start, to its first answer {cold:5.2f} s")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument(
        "--adopt", type=int, help="sessions adopted in row 2 (default 1,000), alone: rows 1 and 3-5 skipped"
    )
    args = parser.parse_args()
    descriptors.raise_for(args.adopt or 1000)  # as a server does at start (the crashed child inherits it)
    root = Path(tempfile.mkdtemp(prefix="pp-restart-"))
    try:
        if args.adopt:
            await bench_adopt(root / "adopt", args.adopt)
            return
        await bench_spawn(root / "spawn", 60 if args.quick else 300)
        await bench_adopt(root / "adopt", 200 if args.quick else 1000)
        await bench_outage_output(root / "output", (64 if args.quick else 256) * MIB)
        await bench_outage_exits(root / "exits", 200 if args.quick else 1000)
        bench_reload(root / "reload", 20 if args.quick else 100)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    # SIGTERM ends a run as Ctrl-C does: its finally blocks end the daemons and sessions it started.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        os.kill(os.getpid(), signal.SIGINT)
