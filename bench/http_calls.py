"""Python calls a request costs a real ``procpilot serve``, by where they are, from its bytes' arrival
to its reply handed to the socket (issue 24: figures that do not depend on the machine's load).

Run: ``.venv/bin/python bench/http_calls.py [calls]`` (default 30; a few seconds).

The daemon runs under a wrapper that, for each request, profiles its event loop (``cProfile``)
from the request's first bytes at the protocol to the reply's last write, and appends the calls
counted, grouped by the code's place, to a JSON-lines file. Requests, each after 100 ms idle:
REST ``POST /v1/tools/exec`` ``true``, MCP streamable HTTP ``tools/call`` exec ``true`` (a
2025-06-18 session), and ``GET /v1/sessions``. Counts are medians per request: Python function
calls and the C functions they call (``len``, ``dict.get``...). What else the loop ran meanwhile
(a warm shell's refill) is counted too, under its own place. ``--top N`` also lists the N
functions called most in the transport's places. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import json
import os
import secrets
import shutil
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

PROBE_FILE_ENV = "PROCPILOT_BENCH_CALLS"

# Where a function's code lives -> its place (first match); C functions are "builtins".
PLACES = [
    ("procpilot/transports/http/", "procpilot http"),
    ("procpilot/transports/connections", "procpilot http"),
    ("procpilot/transports/serve", "procpilot audit"),
    ("procpilot/turns", "procpilot turns"),
    ("procpilot/transports/", "procpilot transports"),
    ("procpilot/engine/", "procpilot engine"),
    ("procpilot/faces/", "procpilot faces"),
    ("procpilot/policy/", "procpilot policy"),
    ("procpilot/", "procpilot other"),
    ("uvicorn/", "uvicorn"),
    ("starlette/", "starlette"),
    ("mcp/", "mcp sdk"),
    ("mcp_types/", "mcp sdk"),
    ("pydantic", "pydantic"),
    ("asyncio/", "asyncio"),
    ("json/", "json"),
]
TRANSPORT = ("procpilot http", "procpilot audit", "procpilot turns", "procpilot transports", "uvicorn", "starlette")


def place(filename: str) -> str:
    if filename == "~":
        return "builtins"
    for part, name in PLACES:
        if part in filename:
            return name
    return "other"


def install(out: str) -> None:
    """In the daemon: profile each request from its bytes to its reply; a row per reply goes to ``out``."""
    from uvicorn.protocols.http import httptools_impl

    from procpilot.transports import connections

    state: dict[str, Any] = {}

    def mark_recv(orig: Any) -> Any:
        def wrapped(self: Any, *args: Any) -> Any:
            if "prof" not in state:
                prof = state["prof"] = cProfile.Profile()
                prof.enable()
            return orig(self, *args)

        return wrapped

    httptools_impl.HttpToolsProtocol._unset_keepalive_if_required = mark_recv(  # type: ignore[method-assign]
        httptools_impl.HttpToolsProtocol._unset_keepalive_if_required
    )
    joining: Any = connections._Joining
    for name in ("write", "flush"):  # the reply leaves by one or the other (head and body joined)
        orig = getattr(joining, name)

        def left(self: Any, *args: Any, _orig: Any = orig) -> Any:
            result = _orig(self, *args)
            prof = state.get("prof")
            if prof is not None and self._held is None:
                prof.disable()
                del state["prof"]
                prof.create_stats()
                places: collections.Counter[str] = collections.Counter()
                functions: collections.Counter[str] = collections.Counter()
                for (filename, line, func), (_cc, calls, *_rest) in prof.stats.items():  # type: ignore[attr-defined]
                    where = place(filename)
                    places[where] += calls
                    short = filename.rsplit("site-packages/", 1)[-1].rsplit("src/", 1)[-1]
                    functions[f"{where}|{short}:{line}:{func}"] += calls
                with Path(out).open("a") as f:
                    f.write(json.dumps({"places": places, "functions": functions}) + "\n")
            return result

        setattr(joining, name, left)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("calls", type=int, nargs="?", default=30)
    parser.add_argument("--top", type=int, default=0)
    parser.add_argument("--places", default=",".join(sorted(TRANSPORT)), help="whose functions --top lists")
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).parent))
    import run as bench  # bench/run.py: its daemon starter and bare HTTP client

    root = Path(tempfile.mkdtemp(prefix="procpilot-calls-"))
    probe_file = root / "daemon-calls.jsonl"
    bench.probe_daemons(root, "http_calls", probe_file)
    children = bench.Children()
    token = secrets.token_hex(16)
    rows: dict[str, list[dict[str, Any]]] = {}
    try:
        _proc, host, port = bench.start_serve(children, root / "serve", token)
        client = bench.Bare(host, port, token)
        steps = {
            "REST POST /v1/tools/exec": client.rest_exec,
            "MCP tools/call exec": client.mcp_exec,
            "GET /v1/sessions": lambda: client.rest("GET", "/v1/sessions"),
        }
        for step in steps.values():
            for _ in range(5):
                step()
        for name, step in steps.items():
            probe_file.write_text("")
            for _ in range(args.calls):
                time.sleep(bench.EXEC_IDLE)
                step()
            time.sleep(0.05)  # the last row written
            rows[name] = [json.loads(line) for line in probe_file.read_text().splitlines()]
        client.close()
    finally:
        children.kill_all()
        shutil.rmtree(root, ignore_errors=True)
    print(f"load average {os.getloadavg()[0]:.2f}; {args.calls} requests each, after 100 ms idle")
    print("median calls per request, from the request's bytes to its reply, by place")
    names = sorted({p for rs in rows.values() for r in rs for p in r["places"]})
    print(f"{'':22s}" + "".join(f"{n[:26]:>28s}" for n in rows))
    for n in [*names, "total"]:
        cells = []
        for rs in rows.values():
            values = [sum(r["places"].values()) if n == "total" else r["places"].get(n, 0) for r in rs]
            cells.append(f"{statistics.median(values) if values else 0:28.0f}")
        print(f"{n:22s}" + "".join(cells))
    if args.top:
        for label, rs in rows.items():
            counted: collections.Counter[str] = collections.Counter()
            wanted = set(args.places.split(","))
            for r in rs:
                counted.update({f: c for f, c in r["functions"].items() if f.split("|", 1)[0] in wanted})
            print(f"\n{label}: the most called functions of {args.places}, per request")
            for func, calls in counted.most_common(args.top):
                print(f"{calls / len(rs):8.1f}  {func}")


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    main()
