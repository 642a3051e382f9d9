"""Where ``Supervisor.run`` spends an ``exec true`` after 100 ms idle: in a real ``procpilot serve``
and in this process, side by side (issue 24's "the daemon's engine call").

Run: ``.venv/bin/python bench/engine_phases.py [calls]`` (default 40; about 20 s for 40).

Each call's phases are timed with ``time.perf_counter_ns`` at a few engine methods, wrapped in
this process and, through a wrapper script that installs the same probes before ``procpilot``'s
CLI, in the daemon (each call's times appended to a JSON-lines file). The calls take turns, each
after 100 ms asleep: ``subprocess.run(["/bin/sh","-c","true"])``, REST ``POST /v1/tools/exec`` on
the daemon, the exec tool in this process on a bare ``Supervisor`` (no owner, no policy), and the
gated exec tool on a supervisor made as the daemon makes it (``make_supervisor(owner="serve")``).
Medians per phase, in µs; the probes cost a few µs each. Nothing here is asserted.

Phases (each from the previous point): ``launch`` the call's checks up to the warm shell's launch;
``written`` the command line written to it; ``watch`` the session attached up to its exit watch;
``pass`` the rest of the attach (the holder's hand-over, the journal) to the watcher's first
pass; ``exit`` the shell runs and its exit is seen; ``reaped`` the leader reaped; ``eof`` its tree
checked and its output pipes' end read; ``finish`` the session's end up to the supervisor's
callback; ``onfinish`` that callback (journal, usage, exit listeners); ``end`` back in ``run``.

A second table follows the daemon's REST call around the engine's, each point's median time from
the request's bytes at the protocol (``recv``), in µs: ``task`` the request's task running,
``auth`` the auth middleware, ``route`` the tool's route (the agent's turn and the body read
before it), ``face`` the exec face, ``run`` ``Supervisor.run`` called, ``ran`` it returned,
``reply`` the response handed to the transport; ``client`` is the client's whole call, so the
rest of it (client to ``recv``, ``reply`` to the client's read) is both ends' wake-ups and the
loopback round trip.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

PROBE_FILE_ENV = "PROCPILOT_BENCH_PROBES"
ORDER = ["start", "launch", "written", "watch", "pass", "exit", "reaped", "eof", "finish", "onfinish", "done", "end"]
HTTP_ORDER = ["recv", "task", "auth", "route", "face", "run", "ran", "reply"]
_T: dict[str, int] = {}
_LAST: list[dict[str, int]] = []


def install(out: str | None) -> None:
    """Wrap the engine's methods; each ``Supervisor.run`` call's times go to ``_LAST`` (and ``out``)."""
    from procpilot.engine import reaper, session, supervisor, warm

    def probe(cls: Any, name: str, label: str, *, after: bool = False) -> None:
        orig = getattr(cls, name)

        def wrapped(*args: Any, **kw: Any) -> Any:
            if "start" in _T and not after and label not in _T:
                _T[label] = time.perf_counter_ns()
            result = orig(*args, **kw)
            if "start" in _T and after and label not in _T:
                _T[label] = time.perf_counter_ns()
            return result

        setattr(cls, name, wrapped)

    probe(warm.WarmShell, "launch", "launch")
    probe(warm.WarmShell, "launch", "written", after=True)
    probe(reaper.ExitWatcher, "watch", "watch")
    probe(reaper.ExitWatcher, "_pass", "pass")
    probe(session.Session, "_on_leader_exit", "exit")
    # The leader reaped: the callback goes on to its tree, its pipes' end and the finish itself.
    probe(session.Session, "_after_leader_exit", "reaped")
    probe(session.Session, "_close_stream", "eof")
    probe(session.Session, "_finish", "finish")
    probe(supervisor.Supervisor, "_on_finish", "onfinish")
    probe(supervisor.Supervisor, "_on_finish", "done", after=True)
    run = supervisor.Supervisor.run

    async def timed_run(self: Any, *args: Any, **kw: Any) -> Any:
        served = "recv" in _T  # in the daemon: a request's marks come first, kept until its reply
        if not served:
            _T.clear()
        _T["start"] = time.perf_counter_ns()
        try:
            return await run(self, *args, **kw)
        finally:
            _T["end"] = time.perf_counter_ns()
            if not served:
                _LAST.append(dict(_T))
                _T.clear()

    supervisor.Supervisor.run = timed_run  # type: ignore[method-assign]
    if out:
        install_http(out)


def install_http(out: str) -> None:
    """In the daemon: mark the REST call's way around the engine; a row per reply goes to ``out``."""
    from uvicorn.protocols.http import httptools_impl

    from procpilot.faces import exec_process
    from procpilot.transports import connections
    from procpilot.transports.http import auth, rest

    def mark(cls: Any, name: str, label: str, *, first: bool = False) -> None:
        orig = getattr(cls, name)

        def wrapped(*args: Any, **kw: Any) -> Any:
            if first:
                _T.clear()
            if (first or "recv" in _T) and label not in _T:
                _T[label] = time.perf_counter_ns()
            return orig(*args, **kw)

        setattr(cls, name, wrapped)

    # Called at the top of each data_received (procpilot's protocol overrides data_received itself).
    mark(httptools_impl.HttpToolsProtocol, "_unset_keepalive_if_required", "recv", first=True)
    mark(httptools_impl.RequestResponseCycle, "run_asgi", "task")
    mark(auth.AuthMiddleware, "__call__", "auth")
    mark(rest.ToolCall, "__call__", "route")
    mark(exec_process.ExecProcessFace, "exec", "face")
    joining: Any = connections._Joining
    for name in ("write", "flush"):  # the reply leaves by one or the other (head and body joined)
        orig = getattr(joining, name)

        def left(self: Any, *args: Any, _orig: Any = orig) -> Any:
            result = _orig(self, *args)
            if "start" in _T and self._held is None:
                row = {**_T, "run": _T["start"], "ran": _T["end"], "reply": time.perf_counter_ns()}
                _T.clear()
                with Path(out).open("a") as f:
                    f.write(json.dumps(row) + "\n")
            return result

        setattr(joining, name, left)


def phases(rows: list[dict[str, int]]) -> tuple[list[float], float]:
    cols = []
    for a, b in itertools.pairwise(ORDER):
        spans = [(r[b] - r[a]) / 1e3 for r in rows if a in r and b in r]
        cols.append(statistics.median(spans) if spans else float("nan"))
    return cols, statistics.median((r["end"] - r["start"]) / 1e3 for r in rows)


async def main(n: int) -> None:
    sys.path.insert(0, str(Path(__file__).parent))
    import run as bench  # bench/run.py: its daemon starter and bare HTTP client

    from procpilot.config import load_settings
    from procpilot.engine.supervisor import Supervisor
    from procpilot.faces.exec_process import exec_process_tools
    from procpilot.transports.serve import build_toolset, make_supervisor

    install(None)
    root = Path(tempfile.mkdtemp(prefix="procpilot-phases-"))
    probe_file = root / "daemon-probes.jsonl"
    # The daemon: procpilot's CLI after the same probes, writing its calls' times to probe_file.
    bench.probe_daemons(root, "engine_phases", probe_file)
    children = bench.Children()
    token = secrets.token_hex(16)
    sups: list[Supervisor] = []
    try:
        _proc, host, port = bench.start_serve(children, root / "serve", token)
        client = bench.Bare(host, port, token)
        ws = root / "serve" / "ws"
        bare = await Supervisor(load_settings(env={}, state_dir=root / "bare", workspace_root=ws)).start()
        settings = load_settings(env={}, state_dir=root / "daemon", workspace_root=ws)
        like_daemon = await make_supervisor(settings, owner="serve").start()
        sups += [bare, like_daemon]
        bare_exec = exec_process_tools(bare)[0]
        gated_exec = next(t for t in build_toolset(like_daemon, settings).tools if t.name == "exec")

        async def raw() -> None:
            subprocess.run(["/bin/sh", "-c", "true"], check=True)  # noqa: ASYNC221 - the baseline

        async def rest() -> None:
            await asyncio.to_thread(client.rest_exec)

        async def in_process_bare() -> None:
            assert not (await bare_exec.call({"command": "true"}, "bench")).is_error

        async def in_process_like_daemon() -> None:
            assert not (await gated_exec.call({"command": "true"}, "bench")).is_error

        methods: dict[str, Callable[[], Awaitable[None]]] = {
            "raw sh -c true": raw,
            "daemon, REST exec": rest,
            "in-process, bare supervisor": in_process_bare,
            "in-process, as the daemon's": in_process_like_daemon,
        }
        for method in methods.values():
            for _ in range(5):
                await method()
        probe_file.write_text("")
        walls: dict[str, list[float]] = {k: [] for k in methods}
        inner: dict[str, list[dict[str, int]]] = {k: [] for k in methods}
        for _ in range(n):
            for name, method in methods.items():
                await asyncio.sleep(bench.EXEC_IDLE)
                _LAST.clear()
                t0 = time.perf_counter()
                await method()
                walls[name].append(time.perf_counter() - t0)
                if _LAST:
                    inner[name].append(_LAST[-1])
        inner["daemon, REST exec"] = [json.loads(line) for line in probe_file.read_text().splitlines()]
        client.close()
    finally:
        for sup in sups:
            await sup.aclose(signal.SIGKILL, grace=0)
        children.kill_all()
        shutil.rmtree(root, ignore_errors=True)
    raw_median = statistics.median(walls["raw sh -c true"])
    print(f"load average {os.getloadavg()[0]:.2f}; {n} calls each, after {bench.EXEC_IDLE * 1000:.0f} ms idle; µs")
    print(f"{'':30s}{'wall':>8s}{'x raw':>6s}{'run()':>7s} |" + "".join(f"{b:>9s}" for b in ORDER[1:]))
    for name in methods:
        wall = statistics.median(walls[name])
        line = f"{name:30s}{wall * 1e6:8.0f}{wall / raw_median:6.2f}"
        if inner[name]:
            cols, total = phases(inner[name])
            line += f"{total:7.0f} |" + "".join(f"{c:9.0f}" for c in cols)
        print(line)
    rows = inner["daemon, REST exec"]
    if rows and all("recv" in r for r in rows):
        print("\nthe daemon's REST call, each point's median from recv (µs); client: the client's whole call")
        print("".join(f"{k:>8s}" for k in [*HTTP_ORDER, "client"]))
        marks = [statistics.median((r[k] - r["recv"]) / 1e3 for r in rows if k in r) for k in HTTP_ORDER]
        print("".join(f"{m:8.0f}" for m in marks) + f"{statistics.median(walls['daemon, REST exec']) * 1e6:8.0f}")


if __name__ == "__main__":
    # SIGTERM ends a run as Ctrl-C does: its finally blocks end the daemons and sessions it started.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 40))
