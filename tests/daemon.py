"""A real `procpilot serve` for tests: started as a subprocess on a free loopback port (and a Unix
socket) with two agents' tokens, and the small REST helpers the transport tests share."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import select
import signal
import subprocess
import sys
import termios
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from tests.conftest import marked_processes

PROCPILOT = str(Path(sys.executable).parent / "procpilot")
TOKENS = {"tok-alpha-0123456789": "agent-a", "tok-bravo-9876543210": "agent-b"}
TOKEN_A, TOKEN_B = list(TOKENS)


@dataclass
class Served:
    proc: subprocess.Popen[bytes]
    url: str
    unix_socket: str | None
    log: Path
    root: Path
    tokens: dict[str, str] = field(default_factory=dict)

    def headers(self, token: str | None = TOKEN_A) -> dict[str, str]:
        return {"Authorization": f"Bearer {token}"} if token else {}

    def http(self, token: str | None = TOKEN_A) -> httpx2.Client:
        return httpx2.Client(base_url=self.url, headers=self.headers(token), timeout=60)

    def ahttp(self, token: str | None = TOKEN_A) -> httpx2.AsyncClient:
        return httpx2.AsyncClient(base_url=self.url, headers=self.headers(token), timeout=60)

    def mcp(self, token: str | None = TOKEN_A, mode: str = "auto", **kw: Any) -> Client:
        http = httpx2.AsyncClient(headers=self.headers(token), timeout=httpx2.Timeout(30, read=300))
        return Client(streamable_http_client(self.url + "/mcp", http_client=http), mode=mode, **kw)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout=timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")


class JsonLines:
    """A ``procpilot mcp`` subprocess spoken to a JSON-RPC line at a time (``server``: set by
    the subclass that starts it)."""

    server: subprocess.Popen[bytes]

    def __init__(self) -> None:
        self._unread = bytearray()  # what the server wrote and no reply() has taken yet

    def send(self, message: dict[str, Any]) -> None:
        assert self.server.stdin is not None
        self.server.stdin.write(json.dumps(message).encode() + b"\n")
        self.server.stdin.flush()

    def reply(self, timeout: float = 30) -> dict[str, Any]:
        """The next line the server wrote. Read here, not through ``stdout``'s buffered reader:
        that one takes in every line a burst of replies holds, and a ``select`` on the pipe
        then waits for lines that are already in its buffer."""
        deadline = time.monotonic() + timeout
        while (end := self._unread.find(b"\n")) < 0:
            assert self._more(deadline - time.monotonic()), f"no reply within {timeout} s (or the output ended)"
        line = bytes(self._unread[:end])
        del self._unread[: end + 1]
        return dict(json.loads(line))

    def quiet(self, seconds: float) -> bool:
        """Whether the server wrote nothing more for ``seconds``."""
        return not self._unread and not self._more(seconds)

    def rest(self) -> bytes:
        """Everything the server writes from here to the end of its output."""
        while self._more(None):
            pass
        rest, self._unread = bytes(self._unread), bytearray()
        return rest

    def _more(self, timeout: float | None) -> bool:
        """Whether more output came within ``timeout`` seconds (None: however long it takes)."""
        assert self.server.stdout is not None
        fd = self.server.stdout.fileno()
        if timeout is not None and not select.select([fd], [], [], max(0.0, timeout))[0]:
            return False
        chunk = os.read(fd, 1 << 16)
        self._unread += chunk
        return bool(chunk)


def cli_env(**more: str) -> dict[str, str]:
    """A clean environment for a `procpilot` subprocess: PATH, and PYTHONPATH where set (a
    checkout that is not the installed one, a worktree, puts itself first: its commands must run
    its code), plus ``more``."""
    env = {"PATH": os.environ["PATH"], **more}
    if "PYTHONPATH" in os.environ:
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    return env


def daemon_env(root: Path) -> dict[str, str]:
    return cli_env(HOME=str(root), LANG="C.UTF-8")


def write_config(
    root: Path,
    tokens: dict[str, str] | None,
    *,
    host: str = "127.0.0.1",
    extra: str = "",
    server: str = "",
    exec_: str = "",
) -> Path:
    (root / "ws").mkdir(parents=True, exist_ok=True)
    lines = [
        'state_dir = "state"',
        'workspace_root = "ws"',
        "[tools.exec]",
        "killGraceSec = 2",
        *exec_.splitlines(),
        "[server]",
        f'host = "{host}"',
        "port = 0",
        'unix_socket = "daemon.sock"',
        *server.splitlines(),
    ]
    if tokens:
        lines.append("[server.tokens]")
        lines += [f'"{t}" = "{a}"' for t, a in tokens.items()]
    config = root / "procpilot.toml"
    config.write_text("\n".join(lines) + "\n" + extra)
    return config


def start_daemon(
    root: Path,
    tokens: dict[str, str] | None = TOKENS,
    *args: str,
    extra: str = "",
    server: str = "",
    exec_: str = "",
    log_name: str = "daemon.log",
    wrap: tuple[str, ...] = (),
    terminal: int | None = None,
) -> Served:
    """``extra`` is TOML after the [server] tables; ``server`` more keys inside [server], ``exec_``
    inside [tools.exec]; ``log_name`` a log of its own for a second daemon on the same root;
    ``wrap`` a command that execs the daemon (``setpriv ...``: it keeps the daemon's pid);
    ``terminal`` a pty's terminal end: the daemon's stdin and controlling terminal."""
    root.mkdir(parents=True, exist_ok=True)
    config = write_config(root, tokens, extra=extra, server=server, exec_=exec_)
    log = root / log_name
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [*wrap, PROCPILOT, "serve", "--config", str(config), *args],
            env=daemon_env(root),
            stdin=terminal,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=root,
            start_new_session=terminal is not None,
            # In its own session, the terminal it then opens becomes its controlling one.
            preexec_fn=None if terminal is None else _take_terminal,  # noqa: PLW1509 - a test's single thread
        )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        text = log.read_text(errors="replace")
        url = re.search(r"daemon on (http://127\.0\.0\.1:\d+)", text)
        sock = re.search(r"unix socket (\S+)", text)
        if url and "state:" in text:
            return Served(proc, url.group(1), sock.group(1) if sock else None, log, root, dict(tokens or {}))
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    proc.kill()
    proc.wait()
    raise AssertionError(f"daemon did not start:\n{log.read_text(errors='replace')}")


def _take_terminal() -> None:
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


def post(client: httpx2.Client, tool: str, **arguments: Any) -> httpx2.Response:
    return client.post(f"/v1/tools/{tool}", json=arguments)


def cleanup(client: httpx2.Client) -> None:
    """Remove every session of the client's agent (the leak check wants no process left): a
    list shows what fits one result's budget, so again until it shows none."""
    for _ in range(1000):
        rows = post(client, "process", action="list").json()["data"]["sessions"]
        if not rows:
            return
        for row in rows:
            post(client, "process", action="remove", sessionId=row["sessionId"])


def end_all_left(root: Path, tokens: Sequence[str | None] = (None,)) -> None:
    """After a failure nothing may outlive the test: a last daemon over ``root`` adopts and ends
    what is left of each of ``tokens``' agents (None: the default one), then anything still
    running is killed."""
    if not marked_processes():
        return
    with contextlib.suppress(Exception):
        last = start_daemon(root, log_name="cleanup.log")
        for token in tokens:
            with last.http(token) if token else last.http() as c:
                cleanup(c)
        last.stop()
    for pid in marked_processes():
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def marked(session_id: str) -> list[int]:
    """Live processes of a session (not zombies), wherever they run: read from the host's /proc,
    so a pid namespace of the cluster tests' own is seen through too."""
    needle = f"PROCPILOT_SESSION={session_id}".encode()
    found = []
    for name in os.listdir("/proc"):
        try:
            if name.isdigit() and needle in Path(f"/proc/{name}/environ").read_bytes().split(b"\0"):
                state = Path(f"/proc/{name}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
                if state != b"Z":
                    found.append(int(name))
        except OSError:
            continue
    return found
