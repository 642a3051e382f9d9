"""procpilot benchmarks: the engine against raw baselines measured in the same run.

Run: ``.venv/bin/python bench/run.py [--quick] [--only exec,mcp,http,output,many,latency,isolation]``

Every figure is informational: nothing here is asserted and nothing is part of CI's pass/fail.
The "goal" column says what we aim for; "verdict" says whether this one run met it. The machine
is shared and CPU-bound medians drift, so quote ratios (ours / raw, same run), not absolutes.
See bench/README.md for what each line means.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import fcntl
import gc
import json
import math
import os
import re
import resource
import secrets
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
from rich import box
from rich.console import Console
from rich.table import Table

from procpilot.config import load_settings
from procpilot.engine import descriptors
from procpilot.engine.capture import SessionOutput, Stream
from procpilot.engine.spawn import SpawnSpec
from procpilot.engine.states import SessionState
from procpilot.engine.supervisor import Supervisor
from procpilot.engine.trees import MARKER_ENV, own_unified_cgroup
from procpilot.faces.exec_process import exec_process_tools

MIB = 1 << 20
GIB = 1 << 30
_F_SETPIPE_SZ = 1031
_ERR = Console(stderr=True, highlight=False)


# -- sizes ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Sizes:
    exec_calls: int
    idle_calls: int
    kept: int
    mcp_calls: int
    output_bytes: int
    sessions: int
    lines: int

    @classmethod
    def pick(cls, quick: bool) -> Sizes:
        if quick:
            return cls(60, 20, 1000, mcp_calls=40, output_bytes=100 * 1000 * 1000, sessions=200, lines=300)
        return cls(300, 60, 10_000, mcp_calls=200, output_bytes=GIB, sessions=1000, lines=1000)


# -- results and the table -----------------------------------------------------------------------


@dataclass
class Row:
    bench: str
    metric: str
    ours: str
    base: str = ""
    ratio: str = ""
    goal: str = ""
    verdict: str = ""


@dataclass
class Results:
    rows: list[Row] = field(default_factory=list)
    notes: list[tuple[int, str]] = field(default_factory=list)

    def add(self, *args: str, **kw: str) -> None:
        self.rows.append(Row(*args, **kw))

    def compare(
        self,
        bench: str,
        metric: str,
        ours: float,
        base: float,
        fmt: Callable[[float], str],
        goal: str = "",
        ok: str = "",
    ) -> None:
        """A row of ours against the baseline, both shown by ``fmt``, and their ratio."""
        self.add(bench, metric, fmt(ours), fmt(base), f"{ours / base:.2f}x", goal, ok)

    def note(self, bench: int, text: str) -> None:
        """A footnote, printed under the table in benchmark order (0 = general)."""
        self.notes.append((bench, text))


def verdict(ok: bool) -> str:
    return "met" if ok else "MISSED"


def pct(values: Iterable[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..1)."""
    data = sorted(values)
    if not data:
        return math.nan
    return data[min(len(data) - 1, max(0, math.ceil(q * len(data)) - 1))]


def fmt_ms(seconds: float) -> str:
    ms = seconds * 1000
    return f"{ms:.3f} ms" if ms < 10 else f"{ms:.1f} ms"


def fmt_lat(ns: float) -> str:
    return f"{ns / 1000:.0f} µs" if ns < 1_000_000 else f"{ns / 1e6:.2f} ms"


def fmt_mib(n: float) -> str:
    return f"{n / MIB:.1f} MiB"


def print_table(results: Results, title: str) -> None:
    width = None if sys.stdout.isatty() else 150
    console = Console(width=width, highlight=False)
    table = Table(title=title, box=box.SIMPLE_HEAD, title_justify="left")
    for name, justify in (
        ("bench", "left"),
        ("metric", "left"),
        ("procpilot", "right"),
        ("raw baseline", "right"),
        ("ratio", "right"),
        ("goal", "left"),
        ("verdict", "left"),
    ):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    previous = None
    for row in sorted(results.rows, key=lambda r: int(r.bench.split(".")[0])):
        if previous is not None and row.bench != previous:
            table.add_section()
        table.add_row(
            row.bench if row.bench != previous else "",
            row.metric,
            row.ours,
            row.base,
            row.ratio,
            row.goal,
            row.verdict,
        )
        previous = row.bench
    console.print(table)
    for _, note in sorted(results.notes, key=lambda n: n[0]):
        console.print(f"  * {note}")


# -- process hygiene -----------------------------------------------------------------------------


class Children:
    """Raw child processes this script started itself; all are killed on the way out."""

    def __init__(self) -> None:
        self._procs: list[subprocess.Popen[bytes]] = []

    def popen(self, argv: list[str], **kw: Any) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(argv, **kw)
        self._procs.append(proc)
        return proc

    def kill_all(self) -> None:
        for proc in self._procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    if os.getpgid(proc.pid) == proc.pid:
                        os.killpg(proc.pid, signal.SIGKILL)
                    else:
                        proc.kill()
            with contextlib.suppress(Exception):
                proc.wait(timeout=5)
            for pipe in (proc.stdin, proc.stdout, proc.stderr):
                if pipe is not None:
                    with contextlib.suppress(OSError):
                        pipe.close()
        if self._procs:
            reap_adopted_children(timeout=0.5)
        self._procs.clear()


def own_children() -> set[int]:
    pids: set[int] = set()
    for tid in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError), open(f"/proc/self/task/{tid}/children") as f:
            pids.update(int(p) for p in f.read().split())
    return pids


def reap_adopted_children(timeout: float = 2.0) -> int:
    """Wait for, and reap, every child we still have: call only once our own children are dead or
    dying and no Supervisor is alive (it reaps its own). As subreaper we adopt orphans, e.g. a raw
    ``sh``'s ``sleep`` once the shell died. Returns how many were reaped."""
    reaped = 0
    deadline = time.monotonic() + timeout
    while (children := own_children()) and time.monotonic() < deadline:
        for pid in children:
            with contextlib.suppress(ChildProcessError):
                if os.waitpid(pid, os.WNOHANG)[0]:
                    reaped += 1
        time.sleep(0.001)
    return reaped


def kill_stray_children() -> list[str]:
    """Last line of defence: every process still our child (we started it, or adopted it as
    subreaper once a Supervisor was created) is killed with its group, then reaped.
    Returns a short description of each ("pid state command")."""
    strays = sorted(own_children())
    described = []
    for pid in strays:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0].decode()
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                command = f.read().replace(b"\0", b" ").decode(errors="replace").strip()[:40]
        except OSError:
            state, command = "?", ""
        described.append(f"{pid} {state} {command}")
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if os.getpgid(pid) == pid:
                os.killpg(pid, signal.SIGKILL)
            else:
                os.kill(pid, signal.SIGKILL)
    for pid in strays:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
    return described


def processes_with_marker(session_ids: set[str]) -> list[int]:
    """Live processes whose environment carries one of ``session_ids`` as PROCPILOT_SESSION."""
    wanted = {f"{MARKER_ENV}={sid}".encode() for sid in session_ids}
    prefix = f"{MARKER_ENV}=".encode()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                env = f.read()
            with open(f"/proc/{name}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue
        if state == b"Z" or prefix not in env:
            continue
        if any(var in wanted for var in env.split(b"\0")):
            found.append(int(name))
    return found


def processes_in_sessions(sids: set[int]) -> int:
    """Live processes whose session id is one of ``sids`` (each raw child leads its own session)."""
    count = 0
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != b"Z" and int(fields[3]) in sids:
            count += 1
    return count


def remove_own_cgroups() -> int:
    """Last line of defence for the engine's cgroup roots of this process (procpilot-<our pid>-*):
    kill whatever is left in them and remove them. Returns how many session cgroups were left."""
    base = own_unified_cgroup()
    roots = [r for r in base.glob(f"procpilot-{os.getpid()}-*") if r.is_dir()] if base is not None else []
    left = [d for root in roots for d in root.iterdir() if d.is_dir()]
    for cgroup in left:
        with contextlib.suppress(OSError):
            (cgroup / "cgroup.kill").write_text("1")
    for cgroup in left:
        for _ in range(100):
            try:
                cgroup.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError:
                time.sleep(0.01)
    for root in roots:
        with contextlib.suppress(OSError):
            root.rmdir()
    return len(left)


def raise_nofile(sessions: int) -> tuple[int, int]:
    """As a server does at start (engine/descriptors.py): room for ``sessions`` running sessions,
    and as many raw ``Popen``s with three pipes each (the baseline runs after them, never beside)."""
    descriptors.raise_for(sessions)
    return resource.getrlimit(resource.RLIMIT_NOFILE)


def set_pipe_size(fd: int) -> None:
    with contextlib.suppress(OSError):
        fcntl.fcntl(fd, _F_SETPIPE_SZ, MIB)


def fs_type(path: Path) -> str:
    """The filesystem type ``path`` lives on (longest matching mount point)."""
    mounts = psutil.disk_partitions(all=True)
    best = max((m for m in mounts if str(path).startswith(m.mountpoint)), key=lambda m: len(m.mountpoint), default=None)
    return best.fstype if best else "?"


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def rss() -> int:
    return int(psutil.Process().memory_info().rss)


class PeakRss:
    """Samples this process's RSS in a thread (every ``period`` s) while in the block."""

    def __init__(self, period: float = 0.01) -> None:
        self.period = period
        self.start = 0
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        proc = psutil.Process()
        while not self._stop.wait(self.period):
            self.peak = max(self.peak, int(proc.memory_info().rss))

    def __enter__(self) -> PeakRss:
        gc.collect()
        self.start = self.peak = rss()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss())

    @property
    def growth(self) -> int:
        return self.peak - self.start


@contextlib.asynccontextmanager
async def supervisor(
    root: Path, name: str, *, warm_shells: int | None = None, **exec_settings: Any
) -> AsyncIterator[Supervisor]:
    settings = load_settings(env={}, state_dir=root / name, workspace_root=root, exec=exec_settings)
    sup = await Supervisor(settings, warm_shells=warm_shells).start()
    try:
        yield sup
    finally:
        await sup.aclose(signal.SIGKILL, grace=0)
        # Belt and braces: a benchmark must never leave a process behind, whatever went wrong.
        for session in sup.all_sessions():
            if not session.finished and session.pid:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(session.pid, signal.SIGKILL)
        shutil.rmtree(root / name, ignore_errors=True)


async def close_timed(sup: Supervisor) -> float:
    """``await sup.aclose()`` (SIGTERM, SIGKILL after the grace period); returns the seconds it took.

    aclose() itself is safe to interrupt: a Ctrl-C meanwhile lets the shutdown finish in the
    background, and the ``supervisor()`` context's own aclose() waits for it.
    """
    t0 = time.perf_counter()
    await sup.aclose()
    return time.perf_counter() - t0


# -- 1. exec `true`

EXEC_IDLE = 0.1  # seconds between an agent's calls, at the least: the model thinks in between


async def interleaved(
    methods: Mapping[str, Callable[[], Awaitable[None]]], n: int, warmup: int, idle: float = 0.0
) -> dict[str, Any]:
    """Run each method ``n`` times, in alternating blocks so drift hits them alike; with ``idle``,
    each call comes that many seconds after the last (as an agent's do: the model thinks between).

    Returns per method: the list of per-call seconds and the parent CPU seconds per call.
    """
    for method in methods.values():
        for _ in range(warmup):
            await method()
    walls: dict[str, list[float]] = {name: [] for name in methods}
    cpu: dict[str, float] = dict.fromkeys(methods, 0.0)
    blocks = 6
    for b in range(blocks):
        count = n // blocks + (1 if b < n % blocks else 0)
        for name, method in methods.items():
            for _ in range(count):
                if idle:
                    await asyncio.sleep(idle)
                c0 = time.process_time()
                t0 = time.perf_counter()
                await method()
                walls[name].append(time.perf_counter() - t0)
                cpu[name] += time.process_time() - c0
    return {name: (walls[name], cpu[name] / len(walls[name])) for name in methods}


def popen_floor() -> None:
    """What the engine's design costs at the least: three 1 MiB pipes, a new session, wait4."""
    fds = [os.pipe2(os.O_CLOEXEC) for _ in range(3)]
    for r, _ in fds:
        set_pipe_size(r)
    (r_in, w_in), (r_out, w_out), (r_err, w_err) = fds
    proc = subprocess.Popen(["/bin/sh", "-c", "true"], stdin=r_in, stdout=w_out, stderr=w_err, start_new_session=True)
    for fd in (r_in, w_out, w_err):
        os.close(fd)
    os.wait4(proc.pid, 0)
    proc.returncode = 0
    for fd in (w_in, r_out, r_err):
        os.close(fd)


def tmpfs_dir() -> Path | None:
    shm = Path("/dev/shm")  # noqa: S108 - mkdtemp below makes a private directory in it
    if not shm.is_dir() or fs_type(shm) != "tmpfs":
        return None
    return Path(tempfile.mkdtemp(prefix="procpilot-bench-", dir=shm))


async def bench_exec(root: Path, sizes: Sizes, out: Results) -> None:
    shm = tmpfs_dir()
    try:
        async with contextlib.AsyncExitStack() as stack:
            sup = await stack.enter_async_context(supervisor(root, "exec"))
            cold = await stack.enter_async_context(supervisor(root, "exec-cold", warm_shells=0))
            exec_tool = exec_process_tools(sup)[0]

            async def raw() -> None:
                subprocess.run(["/bin/sh", "-c", "true"], check=True)  # noqa: ASYNC221 - the baseline

            async def floor() -> None:
                popen_floor()

            async def api() -> None:
                session = await sup.run(SpawnSpec("true"), scope="b", yield_ms=None)
                assert session.state is SessionState.EXITED_OK, session.state

            async def api_cold() -> None:
                session = await cold.run(SpawnSpec("true"), scope="b", yield_ms=None)
                assert session.state is SessionState.EXITED_OK, session.state

            async def face() -> None:
                result = await exec_tool.call({"command": "true"}, "b")
                assert not result.is_error, result.text

            methods = {"raw": raw, "floor": floor, "api": api, "api_cold": api_cold, "face": face}
            if shm is not None:
                sup_shm = await stack.enter_async_context(supervisor(shm, "exec"))

                async def api_tmpfs() -> None:
                    session = await sup_shm.run(SpawnSpec("true"), scope="b", yield_ms=None)
                    assert session.state is SessionState.EXITED_OK, session.state

                methods["api_tmpfs"] = api_tmpfs
            passes = {
                "back to back": await interleaved(methods, sizes.exec_calls, warmup=10),
                f"after {EXEC_IDLE * 1000:.0f} ms idle": await interleaved(
                    {k: v for k, v in methods.items() if k in ("raw", "api", "api_cold", "face")},
                    sizes.idle_calls,
                    warmup=2,
                    idle=EXEC_IDLE,
                ),
            }
            warm = sup.warm_shells()
            out.note(
                1,
                f"exec: tree mechanism {sup.tree_mechanism}, limits {sup.limit_mechanism}; warm shells: "
                f"{warm['sessions_started_warm']} sessions started warm; cgroup2 favordynmods: "
                f"{warm['cgroup_favordynmods']}",
            )
    finally:
        if shm is not None:
            shutil.rmtree(shm, ignore_errors=True)

    fs = fs_type(root)
    rows = [
        ("api", f"Supervisor.run (warm shells), state on {fs}", True),
        ("api_cold", "Supervisor.run, every start cold", False),
        ("face", "exec tool (face)", True),
        ("api_tmpfs", "Supervisor.run, state on tmpfs", False),
        ("floor", "floor: Popen 3 pipes + setsid", False),
    ]
    for pattern, res in passes.items():
        raw_walls, raw_cpu = res["raw"]
        raw_med, raw_p90 = statistics.median(raw_walls), pct(raw_walls, 0.9)
        bench = f"1. exec true, {pattern} x{len(raw_walls)}"
        for key, label, goal in rows:
            if key not in res:
                continue
            walls, cpu_per = res[key]
            med, p90 = statistics.median(walls), pct(walls, 0.9)
            ratio = med / raw_med
            goal_text, ok = ("≤ 1.3x", verdict(ratio <= 1.3)) if goal else ("", "")
            out.compare(bench, f"{label}: median", med, raw_med, fmt_ms, goal_text, ok)
            out.compare(bench, f"{label}: p90", p90, raw_p90, fmt_ms)
            out.compare(bench, f"{label}: parent CPU/call", cpu_per, raw_cpu, lambda v: f"{v * 1e6:.0f} µs")
    out.note(
        1,
        "exec: baseline subprocess.run(['/bin/sh', '-c', 'true']) in the same process; all methods interleaved "
        f"in 6 blocks, back to back and then with {EXEC_IDLE * 1000:.0f} ms asleep before each call; 'floor' is "
        "the least a cold start's design (3 pipes, new session) can cost",
    )


# -- 2. MCP over stdio ---------------------------------------------------------------------------


_WRAPPER: list[str] = []  # the probing wrapper to start instead (probe_daemons), if any


def procpilot_bin() -> str:
    if _WRAPPER:
        return _WRAPPER[0]
    here = Path(sys.executable).with_name("procpilot")
    return str(here) if here.exists() else (shutil.which("procpilot") or "procpilot")


def probe_daemons(root: Path, module: str, out: Path) -> None:
    """Every ``procpilot`` this process starts from now on runs ``bench/<module>.py``'s
    ``install(out)`` before procpilot's CLI: a wrapper under ``root`` (engine_phases.py and
    http_calls.py watch a real daemon's calls this way)."""
    launcher = root / f"{module}_launcher.py"
    launcher.write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        f"import {module}\n"
        f"{module}.install({str(out)!r})\n"
        "from procpilot.transports.cli import main\n"
        "sys.exit(main())\n"
    )
    wrapper = root / "procpilot"
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{launcher}" "$@"\n')
    wrapper.chmod(0o755)
    _WRAPPER[:] = [str(wrapper)]


def server_env(state_dir: Path, workspace: Path) -> dict[str, str]:
    return {"PROCPILOT_STATE_DIR": str(state_dir), "PROCPILOT_WORKSPACE": str(workspace)}


def bare_jsonrpc(children: Children, env: dict[str, str], n: int, warmup: int, idle_n: int) -> dict[str, list[float]]:
    """A minimal client: newline-delimited JSON-RPC on the server's stdin/stdout, one call at a time."""
    full_env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "TERM", "USER")} | env
    proc = children.popen(
        [procpilot_bin(), "mcp", "--agent", "bench"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=full_env,
    )
    assert proc.stdin is not None
    assert proc.stdout is not None
    stdin, stdout = proc.stdin, proc.stdout
    next_id = 0

    def call(method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        nonlocal next_id
        next_id += 1
        msg: dict[str, Any] = {"jsonrpc": "2.0", "id": next_id, "method": method}
        if params is not None:
            msg["params"] = params
        stdin.write(json.dumps(msg).encode() + b"\n")
        stdin.flush()
        while True:
            line = stdout.readline()
            if not line:
                raise RuntimeError("the MCP server closed its stdout")
            reply = json.loads(line)
            if reply.get("id") == next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return dict(reply["result"])

    try:
        call(
            "initialize",
            {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "bench", "version": "0"}},
        )
        stdin.write(b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n')
        stdin.flush()
        exec_args = {"name": "exec", "arguments": {"command": "true"}}
        out: dict[str, list[float]] = {k: [] for k in ("ping", "exec", "raw", "idle_raw", "idle_ping", "idle_exec")}
        for _ in range(warmup):
            call("ping")
            assert not call("tools/call", exec_args).get("isError")
        for _ in range(n):
            t0 = time.perf_counter()
            call("ping")
            out["ping"].append(time.perf_counter() - t0)
        for _ in range(n):
            t0 = time.perf_counter()
            result = call("tools/call", exec_args)
            out["exec"].append(time.perf_counter() - t0)
            assert not result.get("isError"), result
            t0 = time.perf_counter()
            subprocess.run(["/bin/sh", "-c", "true"], check=True)
            out["raw"].append(time.perf_counter() - t0)
        # As an agent calls: each call after EXEC_IDLE of quiet, raw sh -c true after the same.
        for _ in range(idle_n):
            for key, step in (
                ("idle_raw", lambda: subprocess.run(["/bin/sh", "-c", "true"], check=True)),
                ("idle_ping", lambda: call("ping")),
                ("idle_exec", lambda: call("tools/call", exec_args)),
            ):
                time.sleep(EXEC_IDLE)
                t0 = time.perf_counter()
                step()
                out[key].append(time.perf_counter() - t0)
        return out
    finally:
        stdin.close()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def sdk_client(env: dict[str, str], n: int, warmup: int) -> tuple[list[float], float]:
    from mcp import Client
    from mcp.client.stdio import StdioServerParameters

    params = StdioServerParameters(command=procpilot_bin(), args=["mcp", "--agent", "bench"], env=env)
    walls: list[float] = []
    async with Client(params) as client:
        for _ in range(warmup):
            await client.call_tool("exec", {"command": "true"})
        t_all = time.perf_counter()
        for _ in range(n):
            t0 = time.perf_counter()
            result = await client.call_tool("exec", {"command": "true"})
            walls.append(time.perf_counter() - t0)
            assert not result.is_error, result
        total = time.perf_counter() - t_all
    return walls, total


async def bench_mcp(root: Path, sizes: Sizes, out: Results, children: Children) -> None:
    n = sizes.mcp_calls
    env = server_env(root / "mcp-sdk", root)
    try:
        walls, total = await sdk_client(env, n, warmup=10)
        bare = bare_jsonrpc(children, server_env(root / "mcp-bare", root), n, 10, sizes.idle_calls)
    finally:
        shutil.rmtree(root / "mcp-sdk", ignore_errors=True)
        shutil.rmtree(root / "mcp-bare", ignore_errors=True)
    bench = f"2. MCP stdio x{n}"
    b_exec, b_ping = bare["exec"], bare["ping"]
    out.compare(bench, "SDK Client exec true: calls/s", n / total, n / sum(b_exec), lambda v: f"{v:.0f}/s")
    # p50 is the median (the mean of the middle two), as before; p99 the nearest rank.
    stats: tuple[tuple[str, Callable[[list[float]], float]], ...] = (
        ("p50", statistics.median),
        ("p99", lambda values: pct(values, 0.99)),
    )
    for name, stat in stats:
        out.compare(bench, f"SDK Client exec true: {name}", stat(walls), stat(b_exec), fmt_ms)
    for name, stat in stats:
        out.compare(bench, f"bare JSON-RPC exec true vs ping: {name}", stat(b_exec), stat(b_ping), fmt_ms)
    for pattern, (ex, raw) in {
        "back to back": (b_exec, bare["raw"]),
        f"after {EXEC_IDLE * 1000:.0f} ms idle": (bare["idle_exec"], bare["idle_raw"]),
    }.items():
        med = statistics.median(ex) / statistics.median(raw)
        out.compare(
            bench,
            f"bare JSON-RPC exec true vs raw sh -c true, {pattern}: p50",
            statistics.median(ex),
            statistics.median(raw),
            fmt_ms,
            "≤ 2x",
            verdict(med <= 2),
        )
    out.compare(
        bench,
        f"bare JSON-RPC ping vs raw sh -c true, after {EXEC_IDLE * 1000:.0f} ms idle: p50",
        statistics.median(bare["idle_ping"]),
        statistics.median(bare["idle_raw"]),
        fmt_ms,
    )
    out.note(
        2,
        "MCP: rows 1-3 compare the SDK's Client with a bare line-JSON-RPC client on the same server "
        "(baseline column); rows 4-5 compare exec with a no-op ping, both through the bare client",
    )


# -- 9. the daemon's HTTP paths --------------------------------------------------------------------


def start_serve(children: Children, root: Path, token: str) -> tuple[subprocess.Popen[bytes], str, int]:
    """A ``procpilot serve`` on a free loopback port over ``root``, one bearer token; (process, host, port)."""
    (root / "ws").mkdir(parents=True, exist_ok=True)
    config = root / "procpilot.toml"
    lines = ['state_dir = "state"', 'workspace_root = "ws"', "[server]", 'host = "127.0.0.1"', "port = 0"]
    config.write_text("\n".join([*lines, "[server.tokens]", f'"{token}" = "bench"']) + "\n")
    log = root / "daemon.log"
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "USER", "PYTHONPATH")}
    with open(log, "wb") as out:
        proc = children.popen([procpilot_bin(), "serve", "--config", str(config)], stdout=out, stderr=out, env=env)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        text = log.read_text(errors="replace")
        found = re.search(r"daemon on http://127\.0\.0\.1:(\d+)", text)
        if found and "state:" in text:
            return proc, "127.0.0.1", int(found.group(1))
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    raise RuntimeError(f"the daemon did not start: {log.read_text(errors='replace')[-500:]}")


class BareHttp:
    """HTTP/1.1 on one keep-alive socket, as little as a client can do (as the stdio bench's client
    is a readline): http.client parses each response's headers with the email package, 0.06 ms a
    response back to back and 0.28 ms after 100 ms idle here, which the server's figures would carry."""

    def __init__(self, host: str, port: int) -> None:
        self.sock = socket.create_connection((host, port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.host = f"{host}:{port}"
        self.buf = b""

    def request(
        self, method: str, path: str, headers: dict[str, str], body: bytes | None
    ) -> tuple[int, dict[str, str], bytes]:
        lines = [f"{method} {path} HTTP/1.1", f"Host: {self.host}", *(f"{k}: {v}" for k, v in headers.items())]
        if body is not None:
            lines.append(f"Content-Length: {len(body)}")
        self.sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + (body or b""))
        status_line, *header_lines = self._until(b"\r\n\r\n").decode("latin-1").split("\r\n")
        fields = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in header_lines)}
        if "content-length" in fields:
            data = self._exactly(int(fields["content-length"]))
        elif fields.get("transfer-encoding", "").lower() == "chunked":
            chunks = []
            while size := int(self._until(b"\r\n"), 16):
                chunks.append(self._exactly(size))
                self._exactly(2)
            self._until(b"\r\n")
            data = b"".join(chunks)
        else:
            data = b""
        return int(status_line.split(" ", 2)[1]), fields, data

    def _fill(self) -> None:
        more = self.sock.recv(1 << 16)
        if not more:
            raise RuntimeError("the daemon closed the connection")
        self.buf += more

    def _until(self, marker: bytes) -> bytes:
        while (end := self.buf.find(marker)) < 0:
            self._fill()
        found, self.buf = self.buf[:end], self.buf[end + len(marker) :]
        return found

    def _exactly(self, n: int) -> bytes:
        while len(self.buf) < n:
            self._fill()
        found, self.buf = self.buf[:n], self.buf[n:]
        return found

    def close(self) -> None:
        self.sock.close()


class Bare:
    """Bare clients of one daemon, one keep-alive connection each: MCP over streamable HTTP (the
    handshake, then tools/list, as clients do), REST, and the proc/* WebSocket."""

    def __init__(self, host: str, port: int, token: str) -> None:
        from websockets.sync.client import connect

        self.auth = {"Authorization": f"Bearer {token}"}
        self.mcp_conn = BareHttp(host, port)
        self.rest_conn = BareHttp(host, port)
        self.ws = connect(f"ws://{host}:{port}/v1/proc", additional_headers=self.auth)
        self.session = ""
        self.next_id = 0
        hello = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "bench", "version": "0"}}
        self.rpc("initialize", hello)
        self.mcp_post({"jsonrpc": "2.0", "method": "notifications/initialized"})
        self.rpc("tools/list", {})

    def mcp_post(self, message: dict[str, Any]) -> bytes:
        headers = self.auth | {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
        if self.session:
            headers |= {"Mcp-Session-Id": self.session, "Mcp-Protocol-Version": "2025-06-18"}
        _status, fields, body = self.mcp_conn.request("POST", "/mcp", headers, json.dumps(message).encode())
        self.session = self.session or fields.get("mcp-session-id", "")
        return body

    def rpc(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        self.next_id += 1
        body = self.mcp_post({"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params})
        data = [line[6:] for line in body.decode().splitlines() if line.startswith("data: ")]
        reply = json.loads(data[-1] if data else body)
        if "result" not in reply:
            raise RuntimeError(f"{method}: {reply}")
        return dict(reply["result"])

    def mcp_exec(self) -> None:
        assert not self.rpc("tools/call", {"name": "exec", "arguments": {"command": "true"}})["isError"]

    def rest(self, method: str, path: str, body: bytes | None = None) -> bytes:
        headers = self.auth | ({"Content-Type": "application/json"} if body is not None else {})
        status, _fields, data = self.rest_conn.request(method, path, headers, body)
        if status != 200:
            raise RuntimeError(f"{method} {path}: {status} {data[:200]!r}")
        return data

    def rest_exec(self) -> None:
        self.rest("POST", "/v1/tools/exec", b'{"command": "true"}')

    def ws_exec(self) -> None:
        self.next_id += 1
        rid = str(self.next_id)
        spawn = {"type": "proc/spawn/req", "id": rid, "cmd": ["/bin/sh", "-c", "true"], "stdin_mode": "null"}
        self.ws.send(json.dumps(spawn))
        proc_id = None
        while True:
            frame = json.loads(self.ws.recv(timeout=30))
            if frame.get("id") == rid:
                proc_id = frame["proc_id"]
            elif frame.get("type") == "proc/exit/event" and proc_id is not None and frame.get("proc_id") == proc_id:
                return

    def close(self) -> None:
        self.ws.close()
        self.mcp_conn.close()
        self.rest_conn.close()


class StdioBare:
    """A bare line-JSON-RPC client of a ``procpilot mcp`` (as in bench 2), for the same pass as the
    daemon's paths: the machine's load then weighs on every path alike."""

    def __init__(self, children: Children, env: dict[str, str]) -> None:
        full_env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "USER", "PYTHONPATH")} | env
        argv = [procpilot_bin(), "mcp", "--agent", "bench"]
        self.proc = children.popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=full_env)
        self.next_id = 0
        hello = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "bench", "version": "0"}}
        self.call("initialize", hello)
        self.write({"jsonrpc": "2.0", "method": "notifications/initialized"})
        self.call("tools/list", {})

    def write(self, message: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(message).encode() + b"\n")
        self.proc.stdin.flush()

    def call(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdout is not None
        self.next_id += 1
        self.write({"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params})
        while True:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError("the MCP server closed its stdout")
            reply = json.loads(line)
            if reply.get("id") == self.next_id:
                return dict(reply["result"])

    def exec(self) -> None:
        assert not self.call("tools/call", {"name": "exec", "arguments": {"command": "true"}})["isError"]

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def http_passes(bare: Bare, stdio: StdioBare, n: int, idle_n: int) -> dict[str, dict[str, list[float]]]:
    """Each path and the raw baseline, back to back (alternating blocks) and after ``EXEC_IDLE``."""
    steps: dict[str, Callable[[], object]] = {
        "raw": lambda: subprocess.run(["/bin/sh", "-c", "true"], check=True),
        "stdio": stdio.exec,
        "mcp": bare.mcp_exec,
        "rest": bare.rest_exec,
        "ws": bare.ws_exec,
        "sessions": lambda: bare.rest("GET", "/v1/sessions"),
    }
    for step in steps.values():
        for _ in range(10):
            step()
    b2b: dict[str, list[float]] = {name: [] for name in steps}
    for block in range(6):
        for name, step in steps.items():
            for _ in range(n // 6 + (1 if block < n % 6 else 0)):
                t0 = time.perf_counter()
                step()
                b2b[name].append(time.perf_counter() - t0)
    idle: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(idle_n):
        for name, step in steps.items():
            time.sleep(EXEC_IDLE)
            t0 = time.perf_counter()
            step()
            idle[name].append(time.perf_counter() - t0)
    docs: dict[str, list[float]] = {"tools": [], "openapi": []}
    for _ in range(max(10, n // 10)):
        for name, path in (("tools", "/v1/tools"), ("openapi", "/openapi.json")):
            t0 = time.perf_counter()
            bare.rest("GET", path)
            docs[name].append(time.perf_counter() - t0)
    return {"back to back": b2b, f"after {EXEC_IDLE * 1000:.0f} ms idle": idle, "documents": docs}


async def bench_http(root: Path, sizes: Sizes, out: Results, children: Children) -> None:
    bench = "9. the daemon's HTTP"
    token = secrets.token_hex(16)  # a bearer token of its own: the daemon checks it on every call
    _proc, host, port = start_serve(children, root / "serve", token)
    bare = await asyncio.to_thread(Bare, host, port, token)
    stdio = await asyncio.to_thread(StdioBare, children, server_env(root / "serve-stdio", root / "serve" / "ws"))
    try:
        passes = await asyncio.to_thread(http_passes, bare, stdio, sizes.mcp_calls, sizes.idle_calls)
    finally:
        bare.close()
        stdio.close()
        shutil.rmtree(root / "serve", ignore_errors=True)
        shutil.rmtree(root / "serve-stdio", ignore_errors=True)
    goals = {"mcp": ("≤ 2.0x", 2.0), "rest": ("≤ 1.8x", 1.8)}
    names = {
        "stdio": "MCP stdio tools/call exec true (bare JSON-RPC, as bench 2)",
        "mcp": "MCP streamable HTTP tools/call exec true",
        "rest": "REST POST /v1/tools/exec true",
        "ws": "WebSocket proc/spawn sh -c true → exit event",
        "sessions": "REST GET /v1/sessions (a trivial request)",
    }
    idle_label = f"after {EXEC_IDLE * 1000:.0f} ms idle"
    for pattern in ("back to back", idle_label):
        res = passes[pattern]
        raw = statistics.median(res["raw"])
        for key, name in names.items():
            ours = statistics.median(res[key])
            goal, limit = goals.get(key, ("", 0.0))
            ok = verdict(ours / raw <= limit) if goal and pattern == idle_label else ""
            out.compare(bench, f"{name}, {pattern}: p50", ours, raw, fmt_ms, goal if ok else "", ok)
    for key, path in (("tools", "GET /v1/tools"), ("openapi", "GET /openapi.json")):
        out.add(bench, f"{path}, back to back: p50", fmt_ms(statistics.median(passes["documents"][key])))
    out.note(
        9,
        "the daemon's HTTP: one procpilot serve (a bearer token) and one procpilot mcp (stdio), bare clients "
        "(HTTP/1.1 on a keep-alive socket, websockets' sync client, JSON lines), every path and "
        "subprocess.run(['/bin/sh','-c','true']) taking turns in one pass",
    )


# -- 3. 1 GiB of output --------------------------------------------------------------------------


def raw_drain(children: Children, nbytes: int, sink: Path | None) -> tuple[float, float]:
    """``head -c N /dev/zero`` into a 1 MiB pipe, read 1 MiB at a time: discarded, or appended to ``sink``.
    Returns (seconds, parent CPU seconds)."""
    c0, t0 = time.process_time(), time.perf_counter()
    proc = children.popen(["head", "-c", str(nbytes), "/dev/zero"], stdout=subprocess.PIPE)
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    set_pipe_size(fd)
    out_fd = os.open(sink, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600) if sink else None
    total = 0
    try:
        while chunk := os.read(fd, MIB):
            total += len(chunk)
            if out_fd is not None:
                os.write(out_fd, chunk)
    finally:
        if out_fd is not None:
            os.close(out_fd)
        proc.stdout.close()
        proc.wait()
    assert total == nbytes, total
    return time.perf_counter() - t0, time.process_time() - c0


# N bytes in 64 KiB writes that take turns between stdout and stderr: a switch per write, so the
# ordering index gets a record for every 64 KiB (16,384 per GiB).
INTERLEAVED = (
    "import os\nb = bytes(65536)\nfor i in range({n} // 65536):\n"
    "    v = memoryview(b)\n    while v:\n        v = v[os.write(1 + i % 2, v):]\n"
)


async def engine_drain(
    root: Path, nbytes: int, cap: int | None, *, interleaved: bool = False
) -> tuple[float, float, int, int]:
    """The same through a background session. Returns (seconds, parent CPU s, RSS growth, bytes kept)."""
    exec_settings = {} if cap is None else {"max_log_bytes": cap}
    command = (
        SpawnSpec(("python3", "-c", INTERLEAVED.format(n=nbytes)))
        if interleaved
        else SpawnSpec(f"head -c {nbytes} /dev/zero")
    )
    async with supervisor(root, "output", **exec_settings) as sup:
        with PeakRss() as mem:
            c0, t0 = time.process_time(), time.perf_counter()
            session = await sup.spawn(command, scope="out")
            await session.wait_finished()
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        view = session.output[Stream.COMBINED]
        assert session.state is SessionState.EXITED_OK, session.state
        assert view.size == (nbytes // 65536 * 65536 if interleaved else nbytes), (view.size, nbytes)
        kept = sum(p.stat().st_size for p in session.output.directory.glob("*.0*"))
    return wall, cpu, mem.growth, kept


def prefault_page_cache(root: Path, nbytes: int) -> None:
    """Write, then delete, ``nbytes`` of file under ``root``.

    On a VM that hands freed memory back to the host, the first write into fresh page cache costs
    several times a warm one (dd of 2 GiB here: ~0.5 GB/s cold, ~5 GB/s right after): without
    this, whichever run writes first measures the hypervisor rather than the reader.
    """
    path = root / "prefault"
    chunk = bytes(MIB)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for _ in range(max(1, nbytes // MIB)):
            os.write(fd, chunk)
    finally:
        os.close(fd)
        path.unlink(missing_ok=True)


def stream_read_cpu(root: Path, lines: int = 200_000) -> tuple[float, float]:
    """CPU seconds (median of 5) to read 1 MiB of stdout from a session that switched between
    stdout and stderr at every 12-byte line (a record per line in its ordering index), and to
    read 1 MiB of its combined view (the raw bytes, in order: no index)."""
    output = SessionOutput(root / "switching", 64 << 20)
    try:
        for i in range(lines):
            output.append(Stream.STDOUT if i % 2 else Stream.STDERR, b"line %06d\n" % i)
        costs: dict[Stream, list[float]] = {Stream.STDOUT: [], Stream.COMBINED: []}
        for _ in range(5):
            for stream, taken in costs.items():
                c0 = time.process_time()
                output[stream].read(0, MIB)
                taken.append(time.process_time() - c0)
        return statistics.median(costs[Stream.STDOUT]), statistics.median(costs[Stream.COMBINED])
    finally:
        output.mark_closed()
        output.remove_files()


async def bench_output(root: Path, sizes: Sizes, out: Results, children: Children) -> None:
    nbytes = sizes.output_bytes
    mb = nbytes / 1e6
    default_cap = load_settings(env={}).exec.max_log_bytes
    base_wall, base_cpu = raw_drain(children, nbytes, None)
    sink = root / "raw-sink"
    try:
        prefault_page_cache(root, nbytes)
        file_wall, file_cpu = raw_drain(children, nbytes, sink)
    finally:
        sink.unlink(missing_ok=True)
    size = f"{nbytes / GIB:.0f} GiB" if nbytes >= GIB else f"{mb:.0f} MB"
    bench = f"3. {size} of output"
    base_rate = mb / base_wall
    out.add(
        bench,
        "raw: read 1 MiB → append to a file",
        f"{mb / file_wall:,.0f} MB/s",
        f"{base_rate:,.0f} MB/s",
        f"{(mb / file_wall) / base_rate:.0%}",
    )
    out.add(
        bench,
        "raw: read 1 MiB → file: reader CPU",
        f"{file_cpu:.2f} s",
        f"{base_cpu:.2f} s",
        f"{file_cpu / base_cpu:.2f}x",
    )
    # The default cap first (what a server runs with), then a cap above N: everything kept; then
    # the default cap again with a command that switches streams every 64 KiB.
    runs = (
        (default_cap, f"cap {fmt_mib(default_cap)} (default)", False),
        (2 * GIB, "cap 2 GiB (keeps all)", False),
        (default_cap, "2 streams, default cap", True),
    )
    for cap, label, interleaved in runs:
        # As much as the per-stream layout (combined and stdout, each up to the cap) once wrote,
        # so figures from before and after storing output once stay comparable.
        prefault_page_cache(root, min(2 * nbytes, 2 * cap + cap // 4))
        wall, cpu, growth, kept = await engine_drain(root, nbytes, cap, interleaved=interleaved)
        rate = mb / wall
        out.add(
            bench,
            f"{label}: throughput",
            f"{rate:,.0f} MB/s",
            f"{base_rate:,.0f} MB/s",
            f"{rate / base_rate:.0%}",
            "≥ 50%",
            verdict(rate / base_rate >= 0.5),
        )
        out.add(bench, f"{label}: supervisor CPU", f"{cpu:.2f} s", f"{base_cpu:.2f} s", f"{cpu / base_cpu:.2f}x")
        out.add(bench, f"{label}: RSS growth (peak)", fmt_mib(growth), "", "", "≤ 64 MiB", verdict(growth <= 64 * MIB))
        out.add(bench, f"{label}: bytes on disk at the end", f"{kept:,} B ({fmt_mib(kept)})")
    stream_cpu, combined_cpu = stream_read_cpu(root)
    out.add(
        bench,
        "read 1 MiB of stdout switching every line",
        f"{stream_cpu * 1000:.0f} ms CPU",
        f"{combined_cpu * 1000:.1f} ms",
        f"{stream_cpu / combined_cpu:.0f}x",
    )
    out.note(
        3,
        f"output: state dir under {root} ({fs_type(root)}); baseline: Popen stdout=PIPE (1 MiB pipe), os.read 1 MiB, "
        "discard; page cache pre-faulted before each file-writing run",
    )


# -- 4. many concurrent sessions -----------------------------------------------------------------


def many_sleep(n: int) -> int:
    """Seconds each sleeps: 60, or an hour past 2,000 sessions, whose start takes over a minute on
    a busy machine (the first ones would end before the last started)."""
    return 60 if n <= 2000 else 3600


def spawn_raw_sleeps(children: Children, n: int) -> list[subprocess.Popen[bytes]]:
    pipe = subprocess.PIPE
    return [
        children.popen(
            ["/bin/sh", "-c", f"sleep {many_sleep(n)}"], stdin=pipe, stdout=pipe, stderr=pipe, start_new_session=True
        )
        for _ in range(n)
    ]


def kill_raw_sleeps(procs: list[subprocess.Popen[bytes]]) -> None:
    """killpg each group, wait for each shell, then reap the ``sleep``s orphaned to us: done when
    nothing is left, as aclose() is (it waits until each session's cgroup is empty)."""
    for proc in procs:
        os.killpg(proc.pid, signal.SIGTERM)
    for proc in procs:
        proc.wait()
        for pipe in (proc.stdin, proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
    reap_adopted_children()


def raw_many(children: Children, n: int) -> dict[str, tuple[float, str]]:
    """The baseline of the concurrency row: Popen with three pipes and a new session each, then
    killpg + wait; per metric of the row, its value and its text."""
    gc.collect()
    rss0, fds0 = rss(), open_fds()
    t0 = time.perf_counter()
    raw = spawn_raw_sleeps(children, n)
    started = time.perf_counter() - t0
    time.sleep(0.2)
    rss1, fds1 = rss(), open_fds()
    procs = processes_in_sessions({p.pid for p in raw})
    t0 = time.perf_counter()
    kill_raw_sleeps(raw)
    killed = time.perf_counter() - t0
    return {
        "start all": (started, f"{started:.2f} s"),
        "sessions running / processes": (0.0, f"{n} / {procs}"),
        "RSS growth": (max(1, rss1 - rss0), fmt_mib(rss1 - rss0)),
        "start rate": (n / started, f"{n / started:,.0f} sessions/s"),
        "open fds added": (fds1 - fds0, f"{fds1 - fds0:,}"),
        "descriptors a session": ((fds1 - fds0) / n, f"{(fds1 - fds0) / n:.2f}"),
        "kill all + reap (aclose / killpg)": (killed, f"{killed:.2f} s"),
    }


async def bench_many(root: Path, sizes: Sizes, out: Results, children: Children, *, with_raw: bool = True) -> None:
    n = sizes.sessions
    bench = f"4. {n} x sleep {many_sleep(n)}"
    me = psutil.Process()
    ids: set[str] = set()
    # procpilot first: if Python's allocator reuses freed memory, it flatters the baseline, not us.
    async with supervisor(root, "many") as sup:
        gc.collect()
        rss0, fds0, threads0 = rss(), open_fds(), me.num_threads()
        t0 = time.perf_counter()
        for _ in range(n):
            # As an agent's background exec: listed by `process list`, which shows backgrounded ones.
            session = await sup.run(SpawnSpec(f"sleep {many_sleep(n)}"), scope="many", yield_ms=0)
            ids.add(session.id)
        t_start = time.perf_counter() - t0
        await asyncio.sleep(0.2)  # let the shells join their cgroups and exec
        # Past half the descriptor table, quiet sessions' output ends are parked by a sweep
        # (engine/output_parking.py): counted once two sweeps have seen the last ones quiet.
        await asyncio.sleep(2.5 * sup.output_parking.sweep_every)
        parked = len(sup.output_parking)
        rss1, fds1, threads1 = rss(), open_fds(), me.num_threads()
        running = sum(1 for s in sup.list("many") if s.is_running)
        procs = len(processes_with_marker(ids))
        list_walls = []
        for _ in range(20):
            t = time.perf_counter()
            sup.list("many")
            list_walls.append(time.perf_counter() - t)
        process_tool = exec_process_tools(sup)[1]
        face_walls: list[float] = []
        idle_walls: list[float] = []
        for walls, idle in ((face_walls, 0.0), (idle_walls, EXEC_IDLE)):
            for _ in range(3):
                await asyncio.sleep(idle)
                t = time.perf_counter()
                result = await process_tool.call({"action": "list"}, "many")
                walls.append(time.perf_counter() - t)
                assert result.data["total"] == n, result.text[:200]
        t_kill = await close_timed(sup)  # the shutdown path: SIGTERM to every tree, SIGKILL after the grace
        killed = sum(1 for s in sup.all_sessions() if s.state is SessionState.KILLED)
    await asyncio.sleep(0.05)
    survivors = processes_with_marker(ids)

    ours = {
        "start all": (t_start, f"{t_start:.2f} s"),
        "start rate": (n / t_start, f"{n / t_start:,.0f} sessions/s"),
        "sessions running / processes": (0.0, f"{running} / {procs}"),
        "RSS growth": (rss1 - rss0, fmt_mib(rss1 - rss0)),
        "open fds added": (fds1 - fds0, f"{fds1 - fds0:,}"),
        "descriptors a session": ((fds1 - fds0) / n, f"{(fds1 - fds0) / n:.2f}"),
        "sessions with their output parked": (0.0, f"{parked:,}"),
        "kill all + reap (aclose / killpg)": (t_kill, f"{t_kill:.2f} s"),
    }
    base = raw_many(children, n) if with_raw else {}
    for metric, (value, text) in ours.items():
        if metric not in base:
            out.add(bench, metric, text)
            continue
        b_value, b_text = base[metric]
        ratio = f"{value / b_value:.2f}x" if b_value and metric != "sessions running / processes" else ""
        out.add(bench, metric, text, b_text, ratio)
    out.add(bench, "supervisor RSS with all running", fmt_mib(rss1), "", "", "≤ 200 MiB", verdict(rss1 <= 200 << 20))
    out.add(bench, "threads added", f"{threads1 - threads0}", "0")
    out.add(bench, "Supervisor.list(scope): median", fmt_ms(statistics.median(list_walls)))
    out.add(bench, "process tool list (face): median", fmt_ms(statistics.median(face_walls)))
    out.add(
        bench, f"process tool list, after {EXEC_IDLE * 1000:.0f} ms idle: median", fmt_ms(statistics.median(idle_walls))
    )
    out.add(
        bench,
        "sessions KILLED / survivors",
        f"{killed} / {len(survivors)}",
        "",
        "",
        "0 survivors",
        verdict(not survivors and killed == n),
    )
    out.note(4, f"many: /proc scanned for {MARKER_ENV}=<one of the {n} ids> after aclose()")


# -- 5. write → visible latency ------------------------------------------------------------------

CHILD = """
import os, sys, time
n, period = int(sys.argv[1]), int(sys.argv[2])
due = time.monotonic_ns()
for _ in range(n):
    due += period
    delay = due - time.monotonic_ns()
    if delay > 0:
        time.sleep(delay / 1e9)
    os.write(1, b"%d\\n" % time.monotonic_ns())
"""
_SKIP = 10  # the first lines meet a cold interpreter on both sides


def latencies(records: list[tuple[int, bytes]]) -> list[int]:
    """(time seen, bytes) records → per line, time seen minus the child's timestamp (ns)."""
    out: list[int] = []
    carry = b""
    for seen, data in records:
        lines = (carry + data).split(b"\n")
        carry = lines.pop()
        out.extend(seen - int(line) for line in lines if line)
    return out[_SKIP:]


async def latency_listener(sup: Supervisor, n: int, period_ns: int) -> list[int]:
    records: list[tuple[int, bytes]] = []
    session = await sup.spawn(SpawnSpec((sys.executable, "-c", CHILD, str(n), str(period_ns))), scope="lat")
    session.output.subscribe(lambda _stream, data: records.append((time.monotonic_ns(), data)))
    await session.wait_finished()
    return latencies(records)


async def latency_polling(sup: Supervisor, n: int, period_ns: int) -> list[int]:
    session = await sup.spawn(SpawnSpec((sys.executable, "-c", CHILD, str(n), str(period_ns))), scope="lat")
    view = session.output[Stream.COMBINED]
    seen = 0
    spans: list[tuple[int, int, int]] = []
    while True:
        await session.output.wait_for_change(1.0)
        now = time.monotonic_ns()
        size = view.size
        if size > seen:
            spans.append((now, seen, size))
            seen = size
        elif session.finished:
            break
    return latencies([(now, view.read(lo, hi - lo).data) for now, lo, hi in spans])


def latency_raw(children: Children, n: int, period_ns: int) -> list[int]:
    records: list[tuple[int, bytes]] = []
    proc = children.popen([sys.executable, "-c", CHILD, str(n), str(period_ns)], stdout=subprocess.PIPE)
    assert proc.stdout is not None
    fd = proc.stdout.fileno()

    def reader() -> None:
        while data := os.read(fd, 65536):
            records.append((time.monotonic_ns(), data))

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    thread.join()
    proc.stdout.close()
    proc.wait()
    return latencies(records)


async def bench_latency(root: Path, sizes: Sizes, out: Results, children: Children) -> None:
    # Back to back: a line every millisecond. After idle: a line every EXEC_IDLE (100 ms), as an
    # agent's dev server prints now and then, and each line meets a reader that went to sleep.
    for pattern, n, period_ns in (
        ("a line every 1 ms", sizes.lines, 1_000_000),
        (f"a line every {EXEC_IDLE * 1000:.0f} ms (after idle)", _SKIP + sizes.idle_calls // 2, int(EXEC_IDLE * 1e9)),
    ):
        raw = latency_raw(children, n, period_ns)
        async with supervisor(root, "latency") as sup:
            listener = await latency_listener(sup, n, period_ns)
            polling = await latency_polling(sup, n, period_ns)
        bench = f"5. line → visible, {pattern} x{len(raw)}"
        for label, values in (("subscribe listener", listener), ("wait_for_change + size", polling)):
            for q, name in ((0.5, "p50"), (0.99, "p99")):
                ours, base = pct(values, q), pct(raw, q)
                goal, ok = ("≤ 10 ms", verdict(ours <= 10e6)) if name == "p99" else ("", "")
                out.add(bench, f"{label}: {name}", fmt_lat(ours), fmt_lat(base), f"{ours / base:.1f}x", goal, ok)
            out.add(bench, f"{label}: max", fmt_lat(max(values)), fmt_lat(max(raw)))
            if len(values) != len(raw):
                out.note(5, f"latency: {label} saw {len(values)} lines, the raw reader {len(raw)}")
    out.note(5, "latency baseline: a thread blocking in os.read(64 KiB) on the child's pipe")


def bench_isolation(root: Path, out: Results) -> None:
    """What each isolation mechanism adds to one spawn of /bin/true (best of 10, wall time)."""
    from procpilot.engine import isolation as iso

    def best(argv: list[str]) -> float:
        times = []
        for _ in range(10):
            start = time.perf_counter()
            subprocess.run([*argv, "/bin/true"], check=True)
            times.append(time.perf_counter() - start)
        return min(times)

    bench = "6. isolation per spawn"
    bare = best([])
    workspace = root / "isolation"
    workspace.mkdir(exist_ok=True)
    cases = {
        "network off": iso.Isolation(network=False),
        "read-only root": iso.Isolation(readonly_root=True, writable=(workspace,)),
        "private box": iso.Isolation(private=True, writable=(workspace,)),
    }
    for label, isolation in cases.items():
        try:
            prefix = iso.isolation_prefix(isolation)
        except iso.IsolationUnavailable as exc:
            out.add(bench, label, "unavailable", fmt_ms(bare))
            out.note(6, f"isolation: {label}: {exc}")
            continue
        wrapped = best(prefix)
        out.add(bench, f"{label} ({Path(prefix[0]).name})", fmt_ms(wrapped), fmt_ms(bare), f"+{fmt_ms(wrapped - bare)}")
    if iso._landlock() and iso._seccomp():
        wrapped = best(iso._sandbox("--landlock", "--writable", str(workspace), "--no-network"))
        label = "Landlock + seccomp wrapper (fallback)"
        out.add(bench, label, fmt_ms(wrapped), fmt_ms(bare), f"+{fmt_ms(wrapped - bare)}")
    out.note(6, "isolation baseline: /bin/true spawned bare by subprocess.run; ratio column: time added")


# -- main ----------------------------------------------------------------------------------------

BENCHES = ("exec", "mcp", "http", "output", "many", "latency", "isolation", "kept", "openclaw")
# "many" runs first, in a young heap: later, memory freed by earlier benchmarks would be reused and
# hide the sessions' own RSS. The table is printed in the numbered order all the same.
RUN_ORDER = ("many", "exec", "mcp", "http", "output", "latency", "isolation", "kept", "openclaw")


# -- 7. per-call cost with many finished sessions kept -------------------------------------------


async def bench_kept(root: Path, sizes: Sizes, out: Results) -> None:
    """``exec true`` through the tools a server builds (policy, gate, face), one call after another,
    every finished session kept: the median of the first calls against that of the last ones."""
    from procpilot.transports.serve import build_tools

    n, window = sizes.kept, 200
    settings = load_settings(env={}, state_dir=root / "kept", workspace_root=root)
    sup = await Supervisor(settings).start()
    try:
        tools, _audit = build_tools(sup, settings)
        exec_tool = next(t for t in tools if t.name == "exec")
        walls = []
        rss0 = rss()
        for _ in range(n):
            t0 = time.perf_counter()
            result = await exec_tool.call({"command": "true"}, "kept")
            walls.append(time.perf_counter() - t0)
            assert not result.is_error, result.text
        kept = len(sup.list("kept"))
        rss1 = rss()
    finally:
        await sup.aclose(signal.SIGKILL, grace=0)
        shutil.rmtree(root / "kept", ignore_errors=True)
    first, last = statistics.median(walls[:window]), statistics.median(walls[-window:])
    bench = f"7. exec true x{n}, every session kept"
    label = f"median of the last {window} vs the first {window}"
    out.compare(bench, label, last, first, fmt_ms, "≤ 1.2x", verdict(last / first <= 1.2))
    out.add(bench, "sessions kept / RSS growth", f"{kept:,} / {fmt_mib(rss1 - rss0)}")
    out.note(7, "kept: the tools procpilot serve builds (policy, gate, exec face); the ratio column is last / first")


# -- 8. OpenClaw's exec tool as a peer -------------------------------------------------------------

OPENCLAW_DIR_ENV = "PROCPILOT_BENCH_OPENCLAW"  # a directory holding node_modules/openclaw
NODE_ENV = "PROCPILOT_BENCH_NODE"  # a Node >= 24 binary (default: node on PATH)
OPENCLAW_SCRIPT = Path(__file__).with_name("openclaw_exec.mjs")


def openclaw_setup() -> tuple[str, Path] | str:
    """(node, install dir) of an OpenClaw the bench can run, or why it cannot."""
    where = os.environ.get(OPENCLAW_DIR_ENV)
    if not where:
        return f"{OPENCLAW_DIR_ENV} is not set (bench/README.md says how to install OpenClaw for it)"
    install = Path(where)
    if not (install / "node_modules" / "openclaw" / "package.json").is_file():
        return f"no node_modules/openclaw under {install}"
    node = os.environ.get(NODE_ENV) or shutil.which("node")
    if node is None:
        return "no node on PATH (OpenClaw needs Node >= 24)"
    try:
        version = subprocess.run([node, "--version"], capture_output=True, text=True, check=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        return f"{node} --version failed: {exc}"
    major = int(version.strip().lstrip("v").split(".")[0] or 0)
    if major < 24:
        return f"{node} is Node {version.strip()}; OpenClaw needs >= 24 (set {NODE_ENV})"
    return node, install


async def bench_openclaw(root: Path, sizes: Sizes, out: Results) -> None:
    """OpenClaw's real exec tool, in-process in Node, beside procpilot's exec tool in-process and
    the raw baseline, back to back and after the same idle gap."""
    bench = "8. OpenClaw exec tool (in-process)"
    found = openclaw_setup()
    if isinstance(found, str):
        out.add(bench, "skipped", found)
        return
    node, install = found
    n, idle_n = sizes.exec_calls // 2, sizes.idle_calls
    done = await asyncio.to_thread(
        subprocess.run,
        [node, str(OPENCLAW_SCRIPT), str(install), str(n), str(idle_n), str(int(EXEC_IDLE * 1000))],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        cwd=root,
    )
    if done.returncode != 0:
        out.add(bench, "failed", done.stderr.strip().splitlines()[-1][:100] if done.stderr.strip() else "no output")
        return
    peer = json.loads(done.stdout.strip().splitlines()[-1])
    async with supervisor(root, "peer") as sup:
        exec_tool = exec_process_tools(sup)[0]

        async def raw() -> None:
            subprocess.run(["/bin/sh", "-c", "true"], check=True)  # noqa: ASYNC221 - the baseline

        async def face() -> None:
            result = await exec_tool.call({"command": "true"}, "b")
            assert not result.is_error, result.text

        methods = {"raw": raw, "face": face}
        passes = {
            "back to back": (await interleaved(methods, n, warmup=10), "exec", "raw"),
            f"after {EXEC_IDLE * 1000:.0f} ms idle": (
                await interleaved(methods, idle_n, warmup=2, idle=EXEC_IDLE),
                "idle_exec",
                "idle_raw",
            ),
        }
    ms = 1e-3  # the Node script reports milliseconds
    for pattern, (res, peer_key, peer_raw) in passes.items():
        raw_med = statistics.median(res["raw"][0])
        theirs = statistics.median(peer[peer_key]) * ms
        ours = statistics.median(res["face"][0])
        out.compare(bench, f"{pattern}: OpenClaw {peer['version']} exec true, median", theirs, raw_med, fmt_ms)
        out.compare(bench, f"{pattern}: procpilot exec tool, median", ours, raw_med, fmt_ms)
        node_raw = statistics.median(peer[peer_raw]) * ms
        out.add(bench, f"{pattern}: Node spawnSync sh -c true, median", fmt_ms(node_raw))
    out.note(
        8,
        f"OpenClaw: createExecTool({{}}).execute() in Node {peer['node']} (bench/openclaw_exec.mjs), then procpilot's "
        "exec tool and the raw baseline interleaved in this process; both tools' ratios are against that baseline",
    )


async def settle() -> None:
    """Between benchmarks: flush what the last one left to the disk, so it does not stall the next."""
    gc.collect()
    os.sync()
    await asyncio.sleep(0.2)


async def run_all(args: argparse.Namespace, root: Path, out: Results, children: Children) -> None:
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    loop.add_signal_handler(signal.SIGTERM, task.cancel)
    sizes = Sizes.pick(args.quick)
    if args.sessions:
        sizes = dataclasses.replace(sizes, sessions=args.sessions)
    wanted = set(args.only.split(","))
    if unknown := wanted - set(BENCHES):
        raise SystemExit(f"unknown benchmark(s): {', '.join(sorted(unknown))}")
    chosen = [b for b in RUN_ORDER if b in wanted]
    steps: dict[str, Callable[[], Awaitable[None]]] = {
        "exec": lambda: bench_exec(root, sizes, out),
        "mcp": lambda: bench_mcp(root, sizes, out, children),
        "http": lambda: bench_http(root, sizes, out, children),
        "output": lambda: bench_output(root, sizes, out, children),
        "many": lambda: bench_many(root, sizes, out, children, with_raw=not args.no_raw),
        "latency": lambda: bench_latency(root, sizes, out, children),
        "isolation": lambda: asyncio.to_thread(bench_isolation, root, out),
        "kept": lambda: bench_kept(root, sizes, out),
        "openclaw": lambda: bench_openclaw(root, sizes, out),
    }
    try:
        for i, name in enumerate(chosen, 1):
            _ERR.print(f"[{i}/{len(chosen)}] {name} ...", end="")
            t0 = time.perf_counter()
            try:
                await steps[name]()
            finally:
                children.kill_all()
            await settle()
            _ERR.print(f" {time.perf_counter() - t0:.1f} s")
    finally:
        loop.remove_signal_handler(signal.SIGTERM)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run in well under 30 s")
    parser.add_argument("--only", default=",".join(BENCHES), help="comma-separated subset of " + ",".join(BENCHES))
    parser.add_argument("--sessions", type=int, help="concurrent sessions in the 'many' benchmark (default 1,000)")
    parser.add_argument(
        "--no-raw", action="store_true", help="'many' without its raw baseline (under emulation: only counts compare)"
    )
    args = parser.parse_args()
    soft, _ = raise_nofile(args.sessions or Sizes.pick(args.quick).sessions)
    out = Results()
    children = Children()
    root = Path(tempfile.mkdtemp(prefix="procpilot-bench-", dir="/tmp"))
    status = 0
    t0 = time.perf_counter()
    try:
        asyncio.run(run_all(args, root, out, children))
    except (KeyboardInterrupt, asyncio.CancelledError):
        _ERR.print("\ninterrupted: cleaning up; partial results follow")
        status = 130
    finally:
        children.kill_all()
        strays = kill_stray_children()
        if strays:
            zombies = sum(1 for d in strays if d.split()[1] == "Z")
            out.note(
                0,
                f"killed or reaped {len(strays)} stray child processes on the way out ({zombies} zombies): "
                + "; ".join(strays[:3]),
            )
        if cgroups := remove_own_cgroups():
            out.note(0, f"removed {cgroups} session cgroups left under procpilot-{os.getpid()}")
        shutil.rmtree(root, ignore_errors=True)
    mode = "quick" if args.quick else "full"
    title = (
        f"procpilot bench ({mode}, {time.perf_counter() - t0:.0f} s) · {os.cpu_count()} cores · "
        f"Python {sys.version.split()[0]} · RLIMIT_NOFILE {soft}"
    )
    print_table(out, title)
    return status


if __name__ == "__main__":
    sys.exit(main())
