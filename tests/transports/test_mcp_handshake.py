"""`procpilot mcp` answers its client's handshake before it has loaded (issue 24: Codex CLI left
out the tools of a server that took 0.75-0.9 s to answer `initialize`).

No timing here (bench/startup.py measures it): the server's first heavy import (pydantic, which
the settings, the engine and the MCP SDK all need) is held shut by a `sitecustomize` gate, and
`initialize` and `tools/list` must still be answered; once the gate opens, the same server serves
a call, without answering the handshake twice."""

from __future__ import annotations

import json
import os
import select
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from procpilot.transports.mcp_direct import SHAPED_ALIKE as DIRECT_SHAPED
from procpilot.transports.mcp_handshake import SHAPED_ALIKE, cache_path
from tests.daemon import PROCPILOT, cli_env

# Holds the first import of pydantic_core (pydantic's first import) until HANDSHAKE_TEST_GATE names a file.
GATE = """
import os, sys, time
class _Gate:
    def find_spec(self, name, path=None, target=None):
        if name == "pydantic_core":
            sys.meta_path.remove(self)
            flag = os.environ["HANDSHAKE_TEST_GATE"]
            open(flag + ".reached", "w").close()
            while not os.path.exists(flag):
                time.sleep(0.01)
        return None
if os.environ.get("HANDSHAKE_TEST_GATE"):
    sys.meta_path.insert(0, _Gate())
"""
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
}
INITIALIZED = {"jsonrpc": "2.0", "method": "notifications/initialized"}
LIST = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}
CALL = {
    "jsonrpc": "2.0",
    "id": 3,
    "method": "tools/call",
    "params": {"name": "exec", "arguments": {"command": "echo hi"}},
}


class Server:
    def __init__(
        self, tmp_path: Path, gate: Path | None = None, *, options: tuple[str, ...] = (), stderr: int | None = None
    ) -> None:
        env, options = self.started_with(tmp_path, gate, options)
        argv = [PROCPILOT, "mcp", *options]
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, env=env, cwd=tmp_path, bufsize=0
        )
        self._buffer = b""  # read from the server, not yet taken as a line

    @staticmethod
    def started_with(
        tmp_path: Path, gate: Path | None = None, options: tuple[str, ...] = ()
    ) -> tuple[dict[str, str], tuple[str, ...]]:
        """The environment and the options of ``procpilot mcp`` such a server is started with."""
        site = tmp_path / "site"
        site.mkdir(exist_ok=True)
        (site / "sitecustomize.py").write_text(GATE)
        env = cli_env(HOME=str(tmp_path), PROCPILOT_STATE_DIR=str(tmp_path / "state"))
        env["PYTHONPATH"] = f"{site}:{env.get('PYTHONPATH', '')}"
        if gate is not None:
            env["HANDSHAKE_TEST_GATE"] = str(gate)
        return env, ("--agent", "hs", "--workspace", str(tmp_path), *options)

    def wait_at_gate(self, gate: Path) -> None:
        """Until the server stands at its first heavy import: the settings, the engine and the
        SDK are all held up behind it."""
        deadline = time.monotonic() + 60
        while not gate.with_name(gate.name + ".reached").exists():
            assert time.monotonic() < deadline and self.proc.poll() is None, "the server never reached pydantic"
            time.sleep(0.01)

    def send(self, message: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(message).encode() + b"\n")
        self.proc.stdin.flush()

    def read(self) -> dict[str, Any]:
        """The next line the server wrote; a reply that never comes fails here within 60 s."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + 60
        while b"\n" not in self._buffer:
            ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
            assert ready, "no reply within 60 s"
            chunk = os.read(fd, 1 << 16)
            assert chunk, "the server closed its stdout"
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        reply: dict[str, Any] = json.loads(line)
        return reply

    def kill(self) -> None:
        """After a failure: the server ended and its pipes closed (a no-op after :meth:`close`)."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if pipe is not None and not pipe.closed:
                pipe.close()

    def close(self) -> list[dict[str, Any]]:
        """Close stdin; what the server still wrote before it ended."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.close()
        rest = [json.loads(line) for line in (self._buffer + self.proc.stdout.read()).splitlines() if line.strip()]
        assert self.proc.wait(timeout=30) == 0
        self.proc.stdout.close()
        return rest


def _handshake(server: Server) -> tuple[dict[str, Any], dict[str, Any]]:
    server.send(INITIALIZE)
    initialized = server.read()
    server.send(INITIALIZED)
    server.send(LIST)
    return initialized, server.read()


def _first_start(tmp_path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """A first start (nothing cached): answered by the loaded server, whose answers are kept."""
    server = Server(tmp_path)
    try:
        replies = _handshake(server)
        assert server.close() == []
    finally:
        server.kill()
    return replies


def test_the_handshake_is_answered_while_the_server_has_not_loaded(tmp_path: Path) -> None:
    initialized, listed = _first_start(tmp_path)
    assert [t["name"] for t in listed["result"]["tools"]] == ["exec", "process"]
    gate = tmp_path / "gate"
    server = Server(tmp_path, gate)
    try:
        server.wait_at_gate(gate)
        assert _handshake(server) == (initialized, listed)
        gate.touch()
        server.send(CALL)
        called = server.read()
        assert called["id"] == 3 and called["result"]["content"][0]["text"].startswith("hi\n")
        assert server.close() == []  # initialize and tools/list were not answered a second time
    finally:
        gate.touch()
        server.kill()


@pytest.mark.parametrize(
    ("profile", "call", "names"),
    [
        ("procpilot", CALL["params"], ["exec", "process"]),
        ("codex", {"name": "exec_command", "arguments": {"cmd": "echo hi"}}, ["exec_command", "write_stdin"]),
    ],
)
def test_a_first_start_is_answered_before_the_server_loads(
    tmp_path: Path, profile: str, call: dict[str, Any], names: list[str]
) -> None:
    """Nothing cached (the first start of a build and configuration): the answers procpilot
    ships for the configuration are written while pydantic, and so the settings, the engine and
    the SDK, are not imported yet; they are the loaded server's own (which it keeps in the cache,
    and which differ in nothing: no list_changed follows)."""
    gate = tmp_path / "gate"
    server = Server(tmp_path, gate, options=("--profile", profile))
    try:
        server.wait_at_gate(gate)
        initialized, listed = _handshake(server)
        assert [tool["name"] for tool in listed["result"]["tools"]] == names
        gate.touch()
        server.send({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": call})
        called = server.read()
        assert called["id"] == 3 and "hi" in called["result"]["content"][0]["text"]
        assert server.close() == []  # nothing answered twice, no change of the tools told
    finally:
        gate.touch()
        server.kill()
    [cached] = list((tmp_path / ".cache" / "procpilot" / "handshake").glob("*.json"))
    entry = json.loads(cached.read_text())
    assert entry["initialize"] == {"2025-06-18": initialized["result"]}
    assert entry["tools"] == {"2025-06-18": listed["result"]}


def test_a_first_start_with_a_config_file_is_answered_before_the_server_loads(tmp_path: Path) -> None:
    """A --config file whose keys change neither answer (here a profile, limits and a policy)
    is served from the seed on its first start (every edit of the file is one): answered while
    the settings are not imported yet, and the loaded server finds nothing to correct."""
    config = tmp_path / "procpilot.toml"
    config.write_text('[tools.exec]\nprofile = "codex"\ntimeoutSec = 600\n[policy.default]\ndeny = ["shutdown"]\n')
    gate = tmp_path / "gate"
    server = Server(tmp_path, gate, options=("--config", str(config)))
    try:
        server.wait_at_gate(gate)
        initialized, listed = _handshake(server)
        assert initialized["result"]["serverInfo"]["name"] == "procpilot"
        assert [tool["name"] for tool in listed["result"]["tools"]] == ["exec_command", "write_stdin"]
        gate.touch()
        call = {"name": "exec_command", "arguments": {"cmd": "echo hi"}}
        server.send({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": call})
        assert "hi" in server.read()["result"]["content"][0]["text"]
        assert server.close() == []  # no list_changed: the seed was this server's own answers
    finally:
        gate.touch()
        server.kill()


def test_a_config_value_the_settings_refuse_after_a_seeded_answer(tmp_path: Path) -> None:
    """The seed looks at a file's keys, not its values: ``timeoutSec = -1`` is covered, so
    ``initialize`` and ``tools/list`` are answered, then the loaded settings refuse it. Every
    request read and not answered gets the typed error as a JSON-RPC error, the server's
    stdout closes, the error is on stderr (no traceback) and the exit status is 2."""
    config = tmp_path / "procpilot.toml"
    config.write_text("[tools.exec]\ntimeoutSec = -1\n")
    gate = tmp_path / "gate"
    server = Server(tmp_path, gate, options=("--config", str(config)), stderr=subprocess.PIPE)
    assert server.proc.stdin is not None and server.proc.stdout is not None and server.proc.stderr is not None
    try:
        server.wait_at_gate(gate)
        server.send(INITIALIZE)
        assert server.read()["result"]["serverInfo"]["name"] == "procpilot"
        # One write: when tools/list is answered, the front has read the call after it too.
        server.proc.stdin.write(b"".join(json.dumps(m).encode() + b"\n" for m in (INITIALIZED, LIST, CALL)))
        assert server.read()["id"] == 2
        gate.touch()
        refused = server.read()
        assert refused["id"] == 3 and refused["error"]["code"] == -32603
        assert "ConfigError" in refused["error"]["message"] and "timeoutSec" in refused["error"]["message"]
        assert refused["error"]["data"]["error"] == "ConfigError"
        assert server.proc.stdout.read() == b""  # nothing else, and closed
        assert server.proc.wait(timeout=30) == 2
        stderr = server.proc.stderr.read().decode()
        assert "ConfigError" in stderr and "tools.exec.timeoutSec" in stderr and "Traceback" not in stderr
    finally:
        gate.touch()
        server.kill()


def test_a_config_that_is_a_pipe_is_left_to_the_settings(tmp_path: Path) -> None:
    """``--config <(...)`` names a pipe, which gives its bytes once: the handshake reads no such
    file (for its cache key or the seed), so the settings get it whole. The key's read took the
    bytes: the settings read ``<(...)`` empty (the file's policy and tools silently not applied),
    and waited for a second writer of a named pipe (here) forever."""
    fifo = tmp_path / "config.fifo"
    os.mkfifo(fifo)
    writer = threading.Thread(target=fifo.write_text, args=('[tools]\nserve = ["exec"]\n',), daemon=True)
    writer.start()
    server = Server(tmp_path, options=("--config", str(fifo)))
    try:
        _, listed = _handshake(server)
        assert [tool["name"] for tool in listed["result"]["tools"]] == ["exec"]
        assert server.close() == []
    finally:
        server.kill()
        reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # a writer still waiting for a reader goes
        writer.join(timeout=30)
        os.close(reader)


def test_a_cache_the_key_did_not_tell_apart_is_corrected(tmp_path: Path) -> None:
    """An entry that no longer matches the server (here: a tool list edited on disk) is served
    once, then the server's own list replaces it and the client is told to list again."""
    _, listed = _first_start(tmp_path)
    [cached] = list((tmp_path / ".cache" / "procpilot" / "handshake").glob("*.json"))
    entry = json.loads(cached.read_text())
    stale = {"tools": listed["result"]["tools"][:1]}
    entry["tools"]["2025-06-18"] = stale
    cached.write_text(json.dumps(entry))
    server = Server(tmp_path)
    try:
        _, served = _handshake(server)
        assert served["result"] == stale  # what the cache said, at once
        server.send(CALL)
        later = [server.read(), server.read()]
        assert {"jsonrpc": "2.0", "method": "notifications/tools/list_changed"} in later
        assert any(message.get("id") == 3 for message in later)
        assert server.close() == []
    finally:
        server.kill()
    assert json.loads(cached.read_text())["tools"]["2025-06-18"] == listed["result"]


def test_an_initialize_the_sdk_refuses_is_left_to_it(tmp_path: Path) -> None:
    """An ``initialize`` without the client's info is refused by the SDK: the front, which could
    answer its version from the cache, does not answer it in the SDK's place."""
    env, options = Server.started_with(tmp_path)
    path = cache_path(options, env)
    assert path is not None
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"initialize": {"2025-06-18": {"protocolVersion": "2025-06-18"}}, "tools": {}}))
    server = Server(tmp_path)
    try:
        server.send({**INITIALIZE, "params": {"protocolVersion": "2025-06-18", "capabilities": {}}})
        refused = server.read()
        assert refused["id"] == 1 and "result" not in refused and refused["error"]["code"] == -32602
        assert server.close() == []
    finally:
        server.kill()


def test_the_front_knows_the_versions_the_direct_path_shapes() -> None:
    assert SHAPED_ALIKE == DIRECT_SHAPED
