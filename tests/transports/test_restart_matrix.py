"""A session is its whole record: every restart path by every kind of session, on real daemons.

One daemon per restart path holds all six kinds at once (a running pipe session, a running pty
session, a named ``restart: always`` service mid-run, a named service between two runs, a
session that ended before the restart, a boxed service); the server restarts once; afterwards
each is listed with the same id, name, agent, state and restart count, its whole output reads in
order, the services go on restarting on schedule, and the boxed one's next run is boxed again.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx2
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from procpilot.engine.isolation import isolation_capabilities
from tests.conftest import marked_processes
from tests.daemon import PROCPILOT, TOKEN_A, TOKEN_B, TOKENS, Served, cleanup, daemon_env, start_daemon

pytestmark = pytest.mark.skipif(
    isolation_capabilities().get("readonly_root") is None, reason="bubblewrap is not installed on this host"
)

BACKOFF_S = 4.0  # long enough that a service waiting between runs is still waiting when the server restarts
EXEC = f"restartBackoffMs = {int(BACKOFF_S * 1000)}"
BOXED = "[policy.agents.agent-b]\nisolate = true\n"
# Each run says whether it is boxed: in a private pid namespace /proc/1 is bubblewrap, and / is read-only.
BOX_PROBE = "echo box-init=$(cat /proc/1/comm); touch /usr/.pp-probe 2>/dev/null && echo root=rw || echo root=ro"

Call = Callable[..., Awaitable[dict[str, Any]]]


async def _until(check: Callable[[], Awaitable[bool]], what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        await asyncio.sleep(0.05)


async def _log(call: Call, sid: str) -> list[str]:
    data = await call("process", action="log", sessionId=sid, offset=0, limit=10_000)
    return [line.strip() for line in str(data["output"]).splitlines() if line.strip()]


async def _row(call: Call, sid: str) -> dict[str, Any]:
    rows = (await call("process", action="list"))["sessions"]
    found = [r for r in rows if r["sessionId"] == sid]
    assert found, f"{sid} is not listed: {rows}"
    return dict(found[0])


async def _start_all(call: Call, boxed: Call) -> dict[str, str]:
    """The six kinds, started and brought to the moment the restart is tested at."""
    ids = {
        "pipe": "echo pipe-1; read x; echo pipe-got-$x; sleep 300",
        "pty": "echo tty-1; read x; echo tty-got-$x; sleep 300",
        "mid": "echo mid-up; read x; echo mid-got-$x",
        "between": "echo between-run",
        # Some CPU first: its usage, measured by the server it ended under, is part of its record.
        "ended": "i=0; while [ $i -lt 40000 ]; do i=$((i+1)); done; echo ended-1; echo ended-2; exit 3",
    }
    sids: dict[str, str] = {}
    for kind, command in ids.items():
        args: dict[str, Any] = {"command": command, "background": True}
        if kind == "pty":
            args["pty"] = True
        if kind in ("mid", "between"):
            args |= {"name": f"svc-{kind}", "restart": "always", "maxRestarts": 5}
        sids[kind] = str((await call("exec", **args))["sessionId"])
    started = await boxed(
        "exec",
        command=f"{BOX_PROBE}; read x; echo box-got-$x",
        background=True,
        name="svc-box",
        restart="always",
        maxRestarts=5,
    )
    sids["box"] = str(started["sessionId"])
    # The between-runs service has run once and waits BACKOFF_S for its next run; the ended one ended.
    await _until(lambda: _restarted(call, sids["between"], 1), "the service to wait for its next run")
    ended = await call("process", action="wait", sessionId=sids["ended"], timeout=10_000)
    assert ended["exitCode"] == 3, ended
    for kind, said in (("pipe", "pipe-1"), ("pty", "tty-1"), ("mid", "mid-up")):
        await _until(lambda k=kind, s=said: _says(call, sids[k], s), f"{kind} to start")
    await _until(lambda: _says(boxed, sids["box"], "root="), "the boxed service to start")
    return sids


async def _restarted(call: Call, sid: str, count: int) -> bool:
    return int((await _row(call, sid)).get("restarts") or 0) >= count


async def _says(call: Call, sid: str, text: str) -> bool:
    return any(text in line for line in await _log(call, sid))


async def _snapshot(call: Call, boxed: Call, sids: dict[str, str]) -> dict[str, dict[str, Any]]:
    keys = ("sessionId", "name", "sessionName", "state", "restarts", "exitCode", "command")
    found = {}
    for kind, sid in sids.items():
        row = await _row(boxed if kind == "box" else call, sid)
        found[kind] = {k: row.get(k) for k in (*keys, "cpuMs") if k in keys or kind == "ended"}
    return found


async def _check_all(call: Call, boxed: Call, sids: dict[str, str], before: dict[str, dict[str, Any]]) -> None:
    """After the restart: the same sessions, as they were, going on as they would have."""
    after = await _snapshot(call, boxed, sids)
    # "between" may have started its next run on schedule meanwhile: its counter is checked below.
    assert {k: v for k, v in after.items() if k != "between"} == {k: v for k, v in before.items() if k != "between"}
    assert after["between"]["name"] == "svc-between" and after["between"]["state"] in ("restarting", "running")
    assert after["ended"]["state"] == "exited_error" and after["ended"]["exitCode"] == 3
    rows_b = {r["sessionId"] for r in (await boxed("process", action="list"))["sessions"]}
    assert rows_b == {sids["box"]}  # the other agent's scope: only its own
    assert await _log(call, sids["ended"]) == ["ended-1", "ended-2"]

    # The running ones go on: their stdin is open, their output follows what came before.
    for kind, said in (("pipe", "pipe-got-in"), ("pty", "tty-got-in")):
        await call("process", action="write", sessionId=sids[kind], data="in\n")
        found = await call("process", action="wait", sessionId=sids[kind], pattern=said, timeout=10_000)
        assert found["reason"] == "pattern", found
    assert await _log(call, sids["pipe"]) == ["pipe-1", "pipe-got-in"]
    tty = await _log(call, sids["pty"])
    assert tty[0] == "tty-1" and tty[-1] == "tty-got-in", tty  # the terminal echoes "in" between

    # The between-runs service: its next run comes on schedule, its counter goes on from 1.
    await _until(lambda: _restarted(call, sids["between"], 2), "the waiting service to run again", BACKOFF_S * 4)
    assert (await _log(call, sids["between"])).count("between-run") >= 2

    # The service mid-run, and the boxed one: this run ends, the next starts after the backoff.
    for sid, caller in ((sids["mid"], call), (sids["box"], boxed)):
        await caller("process", action="write", sessionId=sid, data="go\n")
    await _until(lambda: _restarted(call, sids["mid"], 1), "the service to restart", BACKOFF_S * 4)
    await _until(lambda: _says(call, sids["mid"], "restart 1 of 5"), "the restart marker")
    await _until(lambda: _log_count(call, sids["mid"], "mid-up", 2), "the service's next run", BACKOFF_S * 4)
    mid = await _log(call, sids["mid"])
    assert mid[:2] == ["mid-up", "mid-got-go"] and mid[-1] == "mid-up", mid
    await _until(lambda: _log_count(boxed, sids["box"], "root=", 2), "the boxed service's next run", BACKOFF_S * 4)
    box = [line for line in await _log(boxed, sids["box"]) if line.startswith(("box-init=", "root="))]
    # Both runs in the box: the one adopted, and the one this server started from the record.
    assert box == ["box-init=bwrap", "root=ro", "box-init=bwrap", "root=ro"], box


async def _log_count(call: Call, sid: str, text: str, count: int) -> bool:
    return sum(text in line for line in await _log(call, sid)) >= count


def _rest(daemon: Served, token: str) -> tuple[httpx2.AsyncClient, Call]:
    client = daemon.ahttp(token)

    async def call(tool: str, **arguments: Any) -> dict[str, Any]:
        reply = await client.post(f"/v1/tools/{tool}", json=arguments)
        assert reply.status_code == 200, reply.text
        return dict(reply.json()["data"])

    return client, call


def _holder_pid(daemon: Served) -> int:
    with daemon.http() as c:
        return int(c.get("/v1/capabilities").json()["restarts"]["holder_pid"])


def _restart(kind: str, root: Path, first: Served) -> Served:
    """Restart the server as ``kind`` does; the server that serves afterwards."""
    if kind == "kill-9":
        first.proc.kill()
        first.proc.wait()
        return start_daemon(root, extra=BOXED, exec_=EXEC, log_name="second.log")
    if kind == "takeover":
        second = start_daemon(root, TOKENS, "--takeover", extra=BOXED, exec_=EXEC, log_name="second.log")
        assert first.proc.wait(timeout=30) == 0
        return second
    if kind == "sigusr2":
        first.proc.send_signal(signal.SIGUSR2)
        assert first.proc.wait(timeout=30) == 0
        return start_daemon(root, extra=BOXED, exec_=EXEC, log_name="second.log")
    if kind == "sighup":
        first.proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 30
        while first.log_text().count("state:") < 2:
            assert time.monotonic() < deadline and first.proc.poll() is None, first.log_text()
            time.sleep(0.05)
        return first
    assert kind == "holder-killed"
    # The holder dies under a live server, which hands everything to a new one; then the server
    # dies too: only what the new holder and the journal have is left.
    old = _holder_pid(first)
    os.kill(old, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while True:
        with first.http() as c:
            now = c.get("/v1/capabilities").json()["restarts"]
        if now["survive"] and now["holder_pid"] not in (None, old):
            break
        assert time.monotonic() < deadline, now
        time.sleep(0.05)
    first.proc.kill()
    first.proc.wait()
    return start_daemon(root, extra=BOXED, exec_=EXEC, log_name="second.log")


def _end_everything(root: Path, *servers: Served | None) -> None:
    for server in servers:
        if server is not None and server.proc.poll() is None:
            with contextlib.suppress(Exception), server.http() as a, server.http(TOKEN_B) as b:
                cleanup(a)
                cleanup(b)
            server.stop()
    for pid in marked_processes():
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("kind", ["kill-9", "takeover", "sigusr2", "sighup", "holder-killed"])
async def test_every_kind_of_session_survives_the_restart_whole(tmp_path: Path, kind: str) -> None:
    root = tmp_path / "d"
    first = start_daemon(root, extra=BOXED, exec_=EXEC)
    second: Served | None = None
    try:
        a, call = _rest(first, TOKEN_A)
        b, boxed = _rest(first, TOKEN_B)
        async with a, b:
            sids = await _start_all(call, boxed)
            before = await _snapshot(call, boxed, sids)
        assert before["between"]["restarts"] == 1 and before["mid"]["restarts"] == 0
        assert before["ended"]["cpuMs"] > 0, before
        second = await asyncio.to_thread(_restart, kind, root, first)
        a, call = _rest(second, TOKEN_A)
        b, boxed = _rest(second, TOKEN_B)
        async with a, b:
            await _check_all(call, boxed, sids, before)
    finally:
        await asyncio.to_thread(_end_everything, root, first, second)


async def test_per_call_keep_sessions_stdio_servers_keep_every_kind_of_session(tmp_path: Path) -> None:
    """LangChain's MCP adapters start a server per call: each call below is a server of its own
    (``procpilot mcp --agent lc --keep-sessions``), the same agent, one state directory."""
    (tmp_path / "ws").mkdir()
    config = tmp_path / "procpilot.toml"
    config.write_text(
        f'state_dir = "{tmp_path / "state"}"\nworkspace_root = "{tmp_path / "ws"}"\n[tools.exec]\n{EXEC}\n'
    )
    boxed_config = tmp_path / "boxed.toml"
    boxed_config.write_text(config.read_text() + "[policy.agents.lc-box]\nisolate = true\n")
    env = daemon_env(tmp_path)

    def server(agent: str, cfg: Path) -> StdioServerParameters:
        return StdioServerParameters(
            command=PROCPILOT, args=["mcp", "--config", str(cfg), "--agent", agent, "--keep-sessions"], env=env
        )

    plain, box = server("lc", config), server("lc-box", boxed_config)

    def caller(client: Client) -> Call:
        async def call(tool: str, **arguments: Any) -> dict[str, Any]:
            result = await client.call_tool(tool, arguments)
            assert not result.is_error, result
            return dict(result.structured_content or {})

        return call

    try:
        # One client connection is one server's life: the first ends when its client goes (it
        # hands over, as a per-call server does after its call); the next adopts everything.
        async with Client(plain) as first, Client(box) as first_boxed:
            sids = await _start_all(caller(first), caller(first_boxed))
            before = await _snapshot(caller(first), caller(first_boxed), sids)
        assert before["between"]["restarts"] == 1 and before["mid"]["restarts"] == 0
        assert before["ended"]["cpuMs"] > 0, before
        async with Client(plain) as second, Client(box) as second_boxed:
            await _check_all(caller(second), caller(second_boxed), sids, before)
            for call in (caller(second), caller(second_boxed)):
                for row in (await call("process", action="list"))["sessions"]:
                    await call("process", action="remove", sessionId=row["sessionId"])
    finally:
        for pid in marked_processes():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
