"""The floors under a REST ``exec true`` on the daemon, after 100 ms idle and back to back, in
one run (issue 24).

Run: ``.venv/bin/python bench/http_floor.py [rounds]`` (default 50; about 0.8 s a round).

Each round, 100 ms asleep before each call, in turn: ``subprocess.run(["/bin/sh","-c",
"true"])`` (the raw baseline); a request on a bare asyncio protocol in another process that
answers every read with a fixed response (the loopback round trip and both ends' wake-ups, no
HTTP parsing); the same on uvicorn over httptools with a trivial ASGI app (uvicorn's own
floor); a JSON line echoed back over pipes by another Python process (MCP over stdio's floor);
the daemon's trivial request (``GET /v1/sessions``: uvicorn, the auth middleware, the route,
no process); the daemon's REST ``POST /v1/tools/exec`` with ``true``; and ``Supervisor.run``
of ``true`` in this process on a bare supervisor (the engine's call alone, no face, no
transport). Then the same back to back (each path's calls in a block of their own). Medians,
each as a ratio to the raw baseline of the same pattern. This process's event loop runs while
it sleeps, as a server's does (the in-process supervisor refills its warm shells between
calls); every other call blocks it. The client is bench/run.py's bare HTTP client (HTTP/1.1
written and read on a keep-alive socket). Nothing is asserted.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

PROTOCOL_SERVER = """\
import asyncio, sys
class Answer(asyncio.Protocol):
    def connection_made(self, transport): self.transport = transport
    def data_received(self, data): self.transport.write(b"HTTP/1.1 200 OK\\r\\ncontent-length: 2\\r\\n\\r\\n[]")
async def main():
    server = await asyncio.get_running_loop().create_server(Answer, "127.0.0.1", int(sys.argv[1]))
    await server.serve_forever()
asyncio.run(main())
"""

LINE_ECHO = """\
import sys
for line in sys.stdin.buffer:
    sys.stdout.buffer.write(line)
    sys.stdout.buffer.flush()
"""

UVICORN_SERVER = """\
import sys, uvicorn
async def app(scope, receive, send):
    if scope["type"] == "http":
        headers = [(b"content-length", b"2"), (b"content-type", b"application/json")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b"[]"})
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), http="httptools", log_level="warning", lifespan="off")
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def wait_listening(port: int) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on port {port}")


async def main(rounds: int) -> None:
    sys.path.insert(0, str(Path(__file__).parent))
    import run as bench  # bench/run.py: its daemon starter and bare HTTP client

    from procpilot.config import load_settings
    from procpilot.engine.spawn import SpawnSpec
    from procpilot.engine.supervisor import Supervisor

    root = Path(tempfile.mkdtemp(prefix="procpilot-http-floor-"))
    children = bench.Children()
    sup: Supervisor | None = None
    try:
        token = secrets.token_hex(16)
        _proc, host, port = bench.start_serve(children, root / "serve", token)
        servers = {}
        for name, code in (("protocol", PROTOCOL_SERVER), ("uvicorn", UVICORN_SERVER)):
            servers[name] = free_port()
            children.popen([sys.executable, "-c", code, str(servers[name])])
            wait_listening(servers[name])
        settings = load_settings(env={}, state_dir=root / "bare", workspace_root=root / "serve" / "ws")
        sup = await Supervisor(settings).start()
        auth = {"Authorization": f"Bearer {token}"}
        daemon = bench.BareHttp(host, port)
        bare = {name: bench.BareHttp("127.0.0.1", p) for name, p in servers.items()}
        # MCP over stdio's floor: a JSON line echoed back over pipes by another Python process.
        echo = children.popen(
            [sys.executable, "-c", LINE_ECHO], stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0
        )

        def line_round_trip() -> None:
            assert echo.stdin is not None
            assert echo.stdout is not None
            echo.stdin.write(b'{"jsonrpc": "2.0", "id": 1, "method": "ping"}\n')
            echo.stdout.readline()

        json_body = auth | {"Content-Type": "application/json"}

        async def engine() -> None:
            assert sup is not None
            await sup.run(SpawnSpec("true"), scope="bench", yield_ms=None)

        def blocking(call: Callable[[], object]) -> Callable[[], Awaitable[None]]:
            async def step() -> None:
                call()

            return step

        exec_body = b'{"command": "true"}'
        steps: dict[str, Callable[[], Awaitable[None]]] = {
            "raw sh -c true": blocking(lambda: subprocess.run(["/bin/sh", "-c", "true"], check=True)),
            "bare asyncio protocol": blocking(lambda: bare["protocol"].request("GET", "/", {}, None)),
            "uvicorn, trivial app": blocking(lambda: bare["uvicorn"].request("GET", "/", {}, None)),
            "a JSON line over pipes": blocking(line_round_trip),
            "daemon GET /v1/sessions": blocking(lambda: daemon.request("GET", "/v1/sessions", auth, None)),
            "daemon REST exec true": blocking(lambda: daemon.request("POST", "/v1/tools/exec", json_body, exec_body)),
            "Supervisor.run, in-process": engine,
        }
        for step in steps.values():
            for _ in range(10):
                await step()
                await asyncio.sleep(0.01)
        idle: dict[str, list[float]] = {name: [] for name in steps}
        for _ in range(rounds):
            for name, step in steps.items():
                await asyncio.sleep(bench.EXEC_IDLE)
                t0 = time.perf_counter()
                await step()
                idle[name].append(time.perf_counter() - t0)
        # Back to back: each path's calls in a block of their own (rounds of them, then the next
        # path), so one path's after-effects (the engine's refill, a cgroup's removal) land on
        # its own calls, as they do for a client that calls one path in a row.
        b2b: dict[str, list[float]] = {name: [] for name in steps}
        for name, step in steps.items():
            for _ in range(rounds):
                t0 = time.perf_counter()
                await step()
                b2b[name].append(time.perf_counter() - t0)
        print(f"load average {os.getloadavg()[0]:.2f}; {rounds} calls of each, medians")
        idle_label = f"after {bench.EXEC_IDLE * 1000:.0f} ms idle"
        print(f"{'':30s}{idle_label:>20s}{'x raw':>7s}{'back to back':>16s}{'x raw':>7s}")
        raw_idle, raw_b2b = statistics.median(idle["raw sh -c true"]), statistics.median(b2b["raw sh -c true"])
        for name in steps:
            i, b = statistics.median(idle[name]), statistics.median(b2b[name])
            print(f"{name:30s}{i * 1e3:17.3f} ms{i / raw_idle:7.2f}{b * 1e3:13.3f} ms{b / raw_b2b:7.2f}")
    finally:
        if sup is not None:
            await sup.aclose(signal.SIGKILL, grace=0)
        children.kill_all()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    # SIGTERM ends a run as Ctrl-C does: its finally blocks end the daemons and sessions it started.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 50))
