"""How soon ``procpilot mcp`` (stdio) answers its client after exec, beside a bare Python start.

Run: ``.venv/bin/python bench/startup.py [--rounds 15]`` (~3 s a round). Nothing is asserted. Each
round, interleaved so that the machine's load touches every row alike:

- raw: exec -> exit of ``python -c pass`` (the interpreter ``procpilot`` runs on);
- warm: ``procpilot mcp`` whose handshake is cached (every start after the first of a build and
  configuration): exec -> the ``initialize`` reply, exec -> the ``tools/list`` reply (sent with
  ``notifications/initialized`` once ``initialize`` is answered), exec -> the reply to a first
  ``tools/call`` (``exec true``: the whole server loaded);
- cold: the same with an empty cache (the first start of a build or configuration), answered
  from the handshake procpilot ships (transports/handshake_seed.py);
- --config: a first start with a ``--config`` file of keys that change neither answer (limits,
  a policy: every edit of a file is such a start), answered from the shipped handshake;
- uncovered: a first start the shipped handshake does not cover (a ``--config`` file that
  renames the tools), which the loaded server answers.

Goal (issue 24): ``initialize`` and ``tools/list`` within 250 ms of exec. The machine is shared:
quote the ratios to raw, measured in the same run, beside the absolutes.
"""

from __future__ import annotations

import argparse
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

INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "bench", "version": "0"}},
}
LIST = b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n{"jsonrpc":"2.0","id":2,"method":"tools/list"}\n'
CALL = b'{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"exec","arguments":{"command":"true"}}}\n'
GOAL_S = 0.25


def procpilot_bin() -> str:
    here = Path(sys.executable).with_name("procpilot")
    return str(here) if here.exists() else (shutil.which("procpilot") or "procpilot")


def raw_start() -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", "pass"], check=True)
    return time.perf_counter() - t0


def _reply(stdout: object, want: int) -> None:
    while True:
        line = stdout.readline()  # type: ignore[attr-defined]
        if not line:
            raise RuntimeError("procpilot mcp closed its stdout")
        if json.loads(line).get("id") == want:
            return


def mcp_start(env: dict[str, str], workspace: Path, *options: str) -> tuple[float, float, float]:
    """exec -> initialize reply, -> tools/list reply, -> first tools/call reply (seconds)."""
    argv = [procpilot_bin(), "mcp", "--agent", "bench", "--workspace", str(workspace), *options]
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, cwd=workspace)
    assert proc.stdin is not None
    assert proc.stdout is not None
    try:
        proc.stdin.write(json.dumps(INITIALIZE).encode() + b"\n")
        proc.stdin.flush()
        _reply(proc.stdout, 1)
        initialized = time.perf_counter() - t0
        proc.stdin.write(LIST)
        proc.stdin.flush()
        _reply(proc.stdout, 2)
        listed = time.perf_counter() - t0
        proc.stdin.write(CALL)
        proc.stdin.flush()
        _reply(proc.stdout, 3)
        called = time.perf_counter() - t0
    finally:
        proc.stdin.close()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        proc.stdout.close()
    return initialized, listed, called


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="procpilot-startup-"))
    try:
        base = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "TERM", "USER", "PYTHONPATH")}
        warm_env = base | {"HOME": str(root), "PROCPILOT_STATE_DIR": str(root / "state")}
        mcp_start(warm_env, root)  # the first start of this configuration: it fills the cache
        config = root / "neutral.toml"
        config.write_text('[tools.exec]\ntimeoutSec = 600\n[policy.default]\ndeny = ["shutdown"]\n')
        shaping = root / "shaping.toml"
        shaping.write_text('[tools]\nnames = "underscore"\n')
        names = ("raw", "warm init", "warm list", "warm call", "cold init", "cold list", "cold call")
        more = ("config init", "config list", "uncovered init", "uncovered list")
        rows: dict[str, list[float]] = {k: [] for k in (*names, *more)}
        for n in range(args.rounds):
            rows["raw"].append(raw_start())
            for name, value in zip(("warm init", "warm list", "warm call"), mcp_start(warm_env, root), strict=True):
                rows[name].append(value)
            cold_env = warm_env | {"XDG_CACHE_HOME": str(root / f"cold-{n}")}  # nothing cached there
            for name, value in zip(("cold init", "cold list", "cold call"), mcp_start(cold_env, root), strict=True):
                rows[name].append(value)
            for row, file in (("config", config), ("uncovered", shaping)):
                first_env = warm_env | {"XDG_CACHE_HOME": str(root / f"{row}-{n}")}  # nothing cached there
                initialized, listed, _ = mcp_start(first_env, root, "--config", str(file))
                rows[f"{row} init"].append(initialized)
                rows[f"{row} list"].append(listed)
        raw = statistics.median(rows["raw"])
        print(f"procpilot mcp start-up, {args.rounds} rounds (median, p90; ratio = median / raw median)")
        print(f"{'':38} {'median':>9} {'p90':>9} {'ratio':>7}  goal")
        labels = {
            "raw": "raw: python -c pass, exec -> exit",
            "warm init": "cached: exec -> initialize reply",
            "warm list": "cached: exec -> tools/list reply",
            "warm call": "cached: exec -> first tools/call reply",
            "cold init": "first start: exec -> initialize reply",
            "cold list": "first start: exec -> tools/list reply",
            "cold call": "first start: exec -> tools/call reply",
            "config init": "first start, --config: -> initialize",
            "config list": "first start, --config: -> tools/list",
            "uncovered init": "first, --config [tools] names: -> init",
            "uncovered list": "first, --config [tools] names: -> list",
        }
        for key, label in labels.items():
            values = sorted(rows[key])
            med, p90 = statistics.median(values), values[min(len(values) - 1, int(0.9 * len(values)))]
            goal = ""
            if key.endswith((" init", " list")):
                goal = f"≤ {GOAL_S * 1000:.0f} ms: {'met' if med <= GOAL_S else 'missed'}"
            print(f"{label:38} {med * 1000:7.0f}ms {p90 * 1000:7.0f}ms {med / raw:6.1f}x  {goal}")
        print(f"load average at the end: {', '.join(f'{x:.1f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    # SIGTERM ends a run as Ctrl-C does: its finally blocks end the daemons and sessions it started.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    sys.exit(main())
