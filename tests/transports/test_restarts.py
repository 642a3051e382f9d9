"""Sessions outlive the server: a real daemon killed outright (or handing over), then a new one on
the same state directory, which adopts every session with its output, its stdin and its exit."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import anyio
import httpx2
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from websockets.asyncio.client import connect

from procpilot.engine.exit_records import probe
from tests import daemon as daemons
from tests.conftest import marked_processes
from tests.daemon import (
    PROCPILOT,
    TOKENS,
    Served,
    cleanup,
    daemon_env,
    end_all_left,
    marked,
    post,
    start_daemon,
    write_config,
)

RECORDS = probe()[0] is not None
PRINTER = "for i in $(seq 1 40); do echo line$i; sleep 0.05; done; echo to-stderr >&2; exit 7"


def _exec(c: httpx2.Client, command: str, **kw: Any) -> str:
    data = post(c, "exec", command=command, background=True, **kw).json()["data"]
    assert data["status"] == "running", data
    return str(data["sessionId"])


def _until(check: Any, what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.05)


def _log(c: httpx2.Client, sid: str) -> str:
    return str(post(c, "process", action="log", sessionId=sid, offset=0, limit=1000).json()["data"]["output"])


def _kill_9(daemon: Served) -> None:
    daemon.proc.kill()
    daemon.proc.wait()


def _leave_nothing(root: Path, *daemons: Served | None) -> None:
    """Whatever a test left running ends: its daemons, then (through a last daemon) their sessions."""
    for daemon in daemons:
        if daemon is not None and daemon.proc.poll() is None:
            _kill_9(daemon)
    if marked_processes():
        end_all_left(root)


def test_kill_9_loses_no_session_no_output_no_stdin_and_no_exit(tmp_path: Path) -> None:
    root = tmp_path / "d"
    state = root / "state" / "sessions"
    first = start_daemon(root)
    try:
        with first.http() as c:
            printer = _exec(c, PRINTER)
            piped = _exec(c, "cat")  # reads a stdin that must stay open through the outage
            tty = _exec(c, "cat", pty=True)
            execd = _exec(c, "sleep 0.2; exec sleep 0.3")  # exec drops the shell's EXIT trap
            long = _exec(c, "setsid sleep 300 & sleep 300")
            _until(lambda: "line3" in _log(c, printer), "the printer to start")
        _kill_9(first)
        # The outage: the printer prints its last lines and exits, with no server at all.
        _until((state / f"{printer}.exit").exists, "the printer to end during the outage")
        _until(lambda: not marked(execd), "the exec'd one to end")

        second = start_daemon(root, log_name="second.log")
        # What ended in the outage was told to nobody: the agent's first event stream hears it.
        # The exec'd one's exit: the holder's kernel record (test_outage_exits.py), where it may have one.
        assert _exit_events(second, 2) == {printer: 7, execd: 0 if RECORDS else None}
        with second.http() as c:
            assert c.get("/v1/capabilities").json()["restarts"]["survive"] is True
            listed = {s["sessionId"]: s for s in post(c, "process", action="list").json()["data"]["sessions"]}
            assert set(listed) == {printer, piped, tty, execd, long}
            assert listed[long]["status"] == "running" and listed[piped]["status"] == "running"

            ended = post(c, "process", action="wait", sessionId=printer, timeout=10_000).json()["data"]
            assert (ended["status"], ended["exitCode"]) == ("error", 7)  # the exit it made during the outage
            lines = _log(c, printer).splitlines()
            assert [ln for ln in lines if ln.startswith("line")] == [f"line{i}" for i in range(1, 41)]
            assert lines[-1] == "to-stderr"

            gone = post(c, "process", action="wait", sessionId=execd, timeout=10_000).json()["data"]
            if RECORDS:
                assert (gone["state"], gone["exitCode"]) == ("exited_ok", 0)
            else:
                assert gone["state"] == "lost" and gone["exitCode"] is None  # said, never invented
                assert "unknown" in post(c, "process", action="poll", sessionId=execd).json()["text"]

            for sid, typed in ((piped, "after-the-crash"), (tty, "typed-in-a-tty")):
                post(c, "process", action="write", sessionId=sid, data=typed + "\n")
                found = post(c, "process", action="wait", sessionId=sid, pattern=typed, timeout=10_000).json()
                assert found["data"]["reason"] == "pattern", found

            # The tree kill still reaches everything, the setsid'd grandchild included.
            killed = post(c, "process", action="kill", sessionId=long).json()["data"]
            assert killed["sessionId"] == long
            post(c, "process", action="wait", sessionId=long, timeout=10_000)
            assert not marked(long)
            cleanup(c)
        assert second.stop() == 0
        # Nothing held any more and no server: the holder went too.
        _until(lambda: not (root / "state" / "holder.sock").exists(), "the holder to exit")
    finally:
        _leave_nothing(root, first)


def test_a_session_whose_server_is_killed_the_moment_it_started_survives(tmp_path: Path) -> None:
    """The id came back, then kill -9 at once: the session's descriptors had reached the holder
    before its id left the server (no SIGPIPE at its next line), and nothing it printed is lost."""
    root = tmp_path / "d"
    first = start_daemon(root)
    second: Served | None = None
    try:
        with first.http() as c:
            young = _exec(c, "for i in $(seq 1 20); do echo young$i; sleep 0.02; done; exit 3")
            tty = _exec(c, "for i in $(seq 1 20); do echo tty$i; sleep 0.02; done; exit 4", pty=True)
            piped = _exec(c, "read x; echo got-$x")
        _kill_9(first)
        second = start_daemon(root, log_name="second.log")
        with second.http() as c:
            assert second.proc.poll() is None
            ended = post(c, "process", action="wait", sessionId=young, timeout=10_000).json()["data"]
            assert (ended["status"], ended["exitCode"]) == ("error", 3), ended
            assert _log(c, young).splitlines() == [f"young{i}" for i in range(1, 21)]
            ended = post(c, "process", action="wait", sessionId=tty, timeout=10_000).json()["data"]
            assert (ended["status"], ended["exitCode"]) == ("error", 4), ended  # no SIGHUP either
            assert [ln.strip() for ln in _log(c, tty).splitlines()] == [f"tty{i}" for i in range(1, 21)]
            post(c, "process", action="write", sessionId=piped, data="in\n")
            done = post(c, "process", action="wait", sessionId=piped, timeout=10_000).json()["data"]
            assert (done["status"], done["exitCode"]) == ("done", 0), done
            assert "got-in" in _log(c, piped)
            cleanup(c)
        assert second.stop() == 0
    finally:
        _leave_nothing(root, first, second)


def test_exits_in_an_outage_reach_every_listener_that_connects(tmp_path: Path) -> None:
    """Sessions that ended while no server ran: every SSE stream, MCP listen stream and proc/*
    WebSocket of their agent that connects to the next server hears of them; another agent's none."""
    root = tmp_path / "d"
    first = start_daemon(root)
    second: Served | None = None
    try:
        with first.http() as a, first.http(daemons.TOKEN_B) as b:
            ended_a = _exec(a, "sleep 0.3; exit 5")
            ended_b = _exec(b, "sleep 0.3")
        _kill_9(first)
        for sid in (ended_a, ended_b):
            _until((root / "state" / "sessions" / f"{sid}.exit").exists, "the exits during the outage")
        second = start_daemon(root, log_name="second.log")
        with second.http() as a, second.http(daemons.TOKEN_B) as b:
            # Each stream that connects hears them, not only the first; a live exit follows them.
            for _ in range(2):
                assert _exits_until_live(second, a, daemons.TOKEN_A) == [(ended_a, 5)]
            assert _exits_until_live(second, b, daemons.TOKEN_B) == [(ended_b, 0)]
        assert asyncio.run(_mcp_listen_hears(second, ended_a, ended_b)) == [f"proc://{ended_a}"]
        assert asyncio.run(_websocket_hears(second)) == [(ended_a, 5)]
        with second.http() as a, second.http(daemons.TOKEN_B) as b:
            cleanup(a)
            cleanup(b)
        assert second.stop() == 0
    finally:
        _leave_nothing(root, first, second)


def test_a_holder_killed_under_a_live_server_is_replaced_before_the_server_dies_too(tmp_path: Path) -> None:
    """kill -9 of the holder: the server still has every descriptor, starts another holder and
    hands it everything, so the kill -9 of the server that follows loses nothing either."""
    root = tmp_path / "d"
    first = start_daemon(root)
    second: Served | None = None
    try:
        with first.http() as c:
            printer = _exec(c, PRINTER)
            piped = _exec(c, "read x; echo got-$x")
            tty = _exec(c, "read x; echo tty-got-$x", pty=True)
            _until(lambda: "line3" in _log(c, printer), "the printer to start")
            old = c.get("/v1/capabilities").json()["restarts"]["holder_pid"]
            os.kill(old, signal.SIGKILL)

            def replaced() -> bool:
                now = c.get("/v1/capabilities").json()["restarts"]
                return bool(now["survive"]) and now["holder_pid"] not in (None, old)

            _until(replaced, "a new holder")
            assert "line40" not in _log(c, printer)  # the crash below comes while it prints
        _kill_9(first)
        second = start_daemon(root, log_name="second.log")
        with second.http() as c:
            ended = post(c, "process", action="wait", sessionId=printer, timeout=10_000).json()["data"]
            assert (ended["status"], ended["exitCode"]) == ("error", 7), ended
            lines = _log(c, printer).splitlines()
            assert [ln for ln in lines if ln.startswith("line")] == [f"line{i}" for i in range(1, 41)]
            for sid, said in ((piped, "got-in"), (tty, "tty-got-in")):
                post(c, "process", action="write", sessionId=sid, data="in\n")
                done = post(c, "process", action="wait", sessionId=sid, timeout=10_000).json()["data"]
                assert (done["status"], done["exitCode"]) == ("done", 0), done
                assert said in _log(c, sid)
            cleanup(c)
        assert second.stop() == 0
    finally:
        _leave_nothing(root, first, second)


def test_sighup_runs_the_daemon_again_in_its_own_pid_and_every_session_goes_on(tmp_path: Path) -> None:
    """SIGHUP: the daemon hands everything over and re-execs its own command line: the same pid
    and port, the config read again, every session adopted with all its output, and a client
    polling throughout sees it running until its exit (waits, at worst: refused or a 503). With a
    config that does not load, a SIGHUP changes nothing."""
    root = tmp_path / "d"
    first = start_daemon(root)
    pid = first.proc.pid
    try:
        with first.http() as c:
            printer = _exec(c, PRINTER)
            piped = _exec(c, "read x; echo got-$x")
            _until(lambda: "line3" in _log(c, printer), "the printer to start")
        config = root / "procpilot.toml"
        text = config.read_text()
        config.write_text(text + "[broken\n")  # a new image could not start: this one serves on
        first.proc.send_signal(signal.SIGHUP)
        _until(lambda: "SIGHUP ignored" in first.log_text(), "the daemon to refuse the reload")
        with first.http() as c:
            assert post(c, "process", action="poll", sessionId=printer).json()["data"]["status"] == "running"
        config.write_text(text + '"tok-charlie-5555555555" = "agent-c"\n')
        first.proc.send_signal(signal.SIGHUP)
        seen: list[str] = []
        deadline = time.monotonic() + 30
        with first.http() as c:
            while "error" not in seen:
                assert time.monotonic() < deadline, f"gave up polling: {seen}"
                time.sleep(0.02)
                try:
                    reply = post(c, "process", action="poll", sessionId=printer)
                except httpx2.TransportError:
                    seen.append("refused")
                    continue
                assert reply.status_code in (200, 503), reply.text
                seen.append(reply.json()["data"]["status"] if reply.status_code == 200 else "503")
            assert set(seen) <= {"running", "503", "refused", "error"}, seen
            assert first.proc.poll() is None and first.log_text().count("state:") == 2  # ran again
            assert json.loads((root / "state" / "daemon.json").read_text())["pid"] == pid
            lines = _log(c, printer).splitlines()
            assert [ln for ln in lines if ln.startswith("line")] == [f"line{i}" for i in range(1, 41)]
            post(c, "process", action="write", sessionId=piped, data="x\n")
            done = post(c, "process", action="wait", sessionId=piped, timeout=10_000).json()["data"]
            assert (done["status"], done["exitCode"]) == ("done", 0), done
            assert "got-x" in _log(c, piped)
            cleanup(c)
        with first.http("tok-charlie-5555555555") as c:  # the config it read again
            assert post(c, "process", action="list").status_code == 200
        assert first.stop() == 0
    finally:
        _leave_nothing(root, first)


def test_a_sigterm_during_a_sighup_reexec_is_not_lost(tmp_path: Path) -> None:
    """SIGTERM once the old image has begun handing over (its event streams end first): whether it
    lands there or while the new image starts, the new image starts, then stops with every session
    ended; the signal is never lost, nor fatal to the process on its way."""
    root = tmp_path / "d"
    daemon = start_daemon(root)
    try:
        with daemon.http() as c, c.stream("GET", "/v1/events") as events:
            sid = _exec(c, "sleep 300")
            daemon.proc.send_signal(signal.SIGHUP)
            for _line in events.iter_lines():
                pass  # until the stream ends: the SIGHUP has been acted on
            daemon.proc.send_signal(signal.SIGTERM)
        assert daemon.proc.wait(timeout=30) == 0
        assert daemon.log_text().count("state:") == 2  # the new image ran, then stopped
        assert not marked(sid)
    finally:
        _leave_nothing(root, daemon)


def test_a_sighup_from_a_terminal_that_closed_still_ends_every_session(tmp_path: Path) -> None:
    """The kernel's SIGHUP for a hung-up terminal is not a reload: the new image would have no
    terminal to write to, and whoever ran it there is gone. It ends every session, as before."""
    root = tmp_path / "d"
    controller, terminal = os.openpty()
    daemon = start_daemon(root, terminal=terminal)
    os.close(terminal)
    try:
        with daemon.http() as c:
            sid = _exec(c, "sleep 300")
        os.close(controller)  # the terminal hangs up: SIGHUP to the daemon, its session's leader
        assert daemon.proc.wait(timeout=30) == 0
        assert daemon.log_text().count("state:") == 1  # not started again
        assert not marked(sid)
    finally:
        with contextlib.suppress(OSError):
            os.close(controller)
        _leave_nothing(root, daemon)


def _exits_until_live(daemon: Served, c: httpx2.Client, token: str) -> list[tuple[str, int | None]]:
    """The exit events one new SSE stream delivers before that of a session started after it
    connected (the replayed ones come first): (session id, exit code)."""
    found: list[tuple[str, int | None]] = []
    with daemon.http(token) as listener, listener.stream("GET", "/v1/events") as events:
        lines = events.iter_lines()
        assert next(lines) == "retry: 3000"
        live = str(post(c, "exec", command="true").json()["data"]["sessionId"])
        kind = None
        for line in lines:
            if line.startswith("event: "):
                kind = line[7:]
            elif line.startswith("data: ") and kind == "exit":
                event = json.loads(line[6:])
                if event["sessionId"] == live:
                    return found
                found.append((event["sessionId"], event["exitCode"]))
    raise AssertionError(f"the stream ended after {found}")


async def _mcp_listen_hears(daemon: Served, *session_ids: str) -> list[str]:
    """The resource updates a new listen stream of agent A gets (for these sessions' URIs and a
    live one's) before the live one's."""
    uris: list[str] = []
    async with daemon.mcp() as client:
        assert not client.protocol_version.startswith("2025"), "the SDK negotiated a legacy version"
        live = (await client.call_tool("exec", {"command": "sleep 0.5", "background": True})).structured_content
        live_uri = f"proc://{(live or {})['sessionId']}"
        wanted = [f"proc://{sid}" for sid in session_ids] + [live_uri]
        async with client.listen(resource_subscriptions=wanted) as sub:
            with anyio.fail_after(15):
                async for event in sub:
                    uri = str(getattr(event, "uri", ""))
                    if uri == live_uri:
                        return uris
                    uris.append(uri)
    raise AssertionError(f"the listen stream ended after {uris}")


async def _websocket_hears(daemon: Served) -> list[tuple[str, int | None]]:
    """The proc/exit/event frames a new proc/* WebSocket of agent A gets before that of a
    process it spawns itself."""
    found: list[tuple[str, int | None]] = []
    url = daemon.url.replace("http://", "ws://") + "/v1/proc"
    async with connect(url, additional_headers=daemon.headers()) as ws:
        await ws.send(json.dumps({"type": "proc/spawn/req", "id": "1", "cmd": ["sleep", "0.3"]}))
        live = None
        while True:
            frame = json.loads(await asyncio.wait_for(ws.recv(), 15))
            if frame["type"] == "proc/spawn/resp":
                live = frame["proc_id"]
            elif frame["type"] == "proc/exit/event":
                if frame["proc_id"] == live:
                    return found
                found.append((frame["proc_id"], frame["exit_code"]))


def _exit_events(daemon: Served, count: int) -> dict[str, int | None]:
    """The first ``count`` exit events of agent A's stream: session id -> exit code."""
    found: dict[str, int | None] = {}
    with daemon.http() as c, c.stream("GET", "/v1/events") as events:
        kind = None
        for line in events.iter_lines():
            if line.startswith("event: "):
                kind = line[7:]
            elif line.startswith("data: ") and kind == "exit":
                event = json.loads(line[6:])
                found[event["sessionId"]] = event["exitCode"]
                if len(found) == count:
                    return found
    raise AssertionError(f"the stream ended after {found}")


def test_a_second_live_server_on_one_state_dir_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "d"
    first = start_daemon(root)
    try:
        other = tmp_path / "other"
        config = write_config(other, TOKENS)
        text = config.read_text().replace('state_dir = "state"', f'state_dir = "{root / "state"}"')
        config.write_text(text)
        refused = subprocess.run(
            [PROCPILOT, "serve", "--config", str(config)],
            check=False,
            env=daemon_env(other),
            cwd=other,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert refused.returncode == 2
        assert "StateDirBusy" in refused.stderr and str(first.proc.pid) in refused.stderr
        assert "Traceback" not in refused.stderr
        with first.http() as c:  # the first one never noticed
            assert post(c, "exec", command="echo still-mine").json()["data"]["output"] == "still-mine\n"
    finally:
        assert first.stop() == 0


def test_takeover_under_a_client_polling_throughout(tmp_path: Path) -> None:
    root = tmp_path / "d"
    first = start_daemon(root)
    second: Served | None = None
    seen: list[str] = []
    refused = 0
    done = threading.Event()
    try:
        with first.http() as c:
            printer = _exec(c, PRINTER)
            _until(lambda: "line3" in _log(c, printer), "the printer to start")
        assert first.unix_socket is not None

        def poll_throughout() -> None:
            # Over the Unix socket both daemons serve in turn: between them it is refused, never
            # a SessionNotFound, never a session that ended without its exit.
            nonlocal refused
            transport = httpx2.HTTPTransport(uds=first.unix_socket)
            with httpx2.Client(transport=transport, base_url="http://localhost", headers=first.headers()) as c:
                while not done.is_set():
                    try:
                        body = post(c, "process", action="poll", sessionId=printer).json()
                    except httpx2.TransportError:
                        refused += 1
                        time.sleep(0.01)
                        continue
                    data = body.get("data")  # an answer without it (a bare 401, a 503) is named as it is
                    seen.append(data.get("status") or data.get("error") if data else json.dumps(body))
                    time.sleep(0.02)

        poller = threading.Thread(target=poll_throughout)
        poller.start()
        second = start_daemon(root, TOKENS, "--takeover", log_name="second.log")
        assert first.proc.wait(timeout=30) == 0  # it handed over and left
        with second.http() as c:
            ended = post(c, "process", action="wait", sessionId=printer, timeout=20_000).json()["data"]
            assert (ended["status"], ended["exitCode"]) == ("error", 7)
            lines = [ln for ln in _log(c, printer).splitlines() if ln.startswith("line")]
            assert lines == [f"line{i}" for i in range(1, 41)]
            _until(lambda: "error" in seen, "the poller to see the exit")
            done.set()
            poller.join(30)
            assert set(seen) <= {"running", "error"}, seen  # running until its exit: nothing lost
            cleanup(c)
        assert second.stop() == 0
    finally:
        done.set()
        _leave_nothing(root, first, second)


async def test_per_call_stdio_servers_of_one_agent_keep_their_sessions(tmp_path: Path) -> None:
    """LangChain's MCP adapters start a fresh server for every call: with --keep-sessions a
    background exec in one call is there to poll in the next."""
    env = {
        **daemon_env(tmp_path),
        "PROCPILOT_STATE_DIR": str(tmp_path / "state"),
        "PROCPILOT_WORKSPACE": str(tmp_path),
    }
    params = StdioServerParameters(command=PROCPILOT, args=["mcp", "--agent", "lc", "--keep-sessions"], env=env)
    async with Client(params) as client:
        started = await client.call_tool("exec", {"command": "read x; echo got-$x; exit 4", "background": True})
        sid = (started.structured_content or {})["sessionId"]
    try:
        async with Client(params) as client:
            await client.call_tool("process", {"action": "write", "sessionId": sid, "data": "it\n"})
            waited = await client.call_tool("process", {"action": "wait", "sessionId": sid, "timeout": 10_000})
            data = waited.structured_content or {}
            assert (data["status"], data["exitCode"]) == ("error", 4), json.dumps(data)
            log = await client.call_tool("process", {"action": "log", "sessionId": sid})
            assert "got-it" in (log.structured_content or {})["output"]
    finally:
        for pid in marked_processes():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_keep_sessions_makes_sigterm_hand_over_instead_of_ending(tmp_path: Path) -> None:
    root = tmp_path / "d"
    first = start_daemon(root, TOKENS, "--keep-sessions")
    second: Served | None = None
    try:
        with first.http() as c:
            sleeper = _exec(c, "read line; echo got-$line")
            time.sleep(0.2)  # past the holder's batch window
        assert first.stop(signal.SIGTERM) == 0
        assert marked(sleeper)  # SIGTERM left it running, its stdin open
        second = start_daemon(root, log_name="second.log")
        with second.http() as c:
            post(c, "process", action="write", sessionId=sleeper, data="x\n")
            done = post(c, "process", action="wait", sessionId=sleeper, timeout=10_000).json()["data"]
            assert (done["status"], done["exitCode"]) == ("done", 0)
            assert "got-x" in _log(c, sleeper)
        assert second.stop() == 0
    finally:
        _leave_nothing(root, first, second)


def test_a_planted_record_whose_id_leaves_sessions_dir_touches_nothing_outside(tmp_path: Path) -> None:
    """Nothing read back from the journal is trusted: a record whose id is ``../victim`` would
    make adoption read (and delete) ``state/victim.exit`` and a removal ``rmtree`` ``state/victim``.
    It is ignored, and said so in the log."""
    root = tmp_path / "d"
    state = root / "state"
    victim = state / "victim"
    victim.mkdir(parents=True)
    (victim / "keep.txt").write_text("not procpilot's\n")
    (state / "victim.exit").write_text("0\n")
    planted = {
        "id": "../victim",
        "scope": "agent-a",
        "owner": "serve",
        "format": 2,
        "command": "true",
        "cwd": None,
        "pty": False,
        "state": "running",
        "pid": 2**22 - 1,  # no such process: its tree is "gone", so adoption asks how it ended
        "created_at": time.time(),
        "started_at": time.time(),
    }
    (state / "sessions.jsonl").write_text(json.dumps(planted) + "\n")
    daemon = start_daemon(root)
    try:
        with daemon.http() as c:
            assert post(c, "process", action="list").json()["data"]["sessions"] == []
            refused = post(c, "process", action="remove", sessionId="../victim")
            assert refused.json()["error"] == "SessionNotFound", refused.text
        assert (victim / "keep.txt").read_text() == "not procpilot's\n"
        assert (state / "victim.exit").read_text() == "0\n"
        assert "invalid id '../victim'" in daemon.log_text()
    finally:
        assert daemon.stop() == 0
