"""The client side: the CLI commands as subprocesses, and procpilot.client's Client/AsyncClient."""

from __future__ import annotations

import contextlib
import json
import os
import re
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from procpilot.client import AsyncClient, Client, DaemonNotRunning, ToolReply, Unauthorized, UnknownTool
from procpilot.errors import InvalidArgument, ProcessAlreadyExited, ProcpilotError, SessionNotFound
from tests.daemon import PROCPILOT, TOKEN_A, TOKEN_B, Served, cli_env, start_daemon


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    daemon = start_daemon(tmp_path_factory.mktemp("cli"))
    yield daemon
    assert daemon.stop() == 0, daemon.log_text()


def cli(
    served: Served | None, *args: str, token: str | None = TOKEN_A, timeout: float = 60, **kw: object
) -> subprocess.CompletedProcess[str]:
    env = cli_env(HOME="/nonexistent", COLUMNS="200")
    if served is not None:
        env["PROCPILOT_URL"] = served.url
    if token is not None:
        env["PROCPILOT_TOKEN"] = token
    return subprocess.run(
        [PROCPILOT, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        **kw,  # type: ignore[call-overload]
    )


# -- the CLI -----------------------------------------------------------------------------------


def test_run_streams_output_and_exits_with_the_code(served: Served) -> None:
    result = cli(served, "run", "echo one; sleep 0.3; echo two >&2; exit 7")
    assert result.returncode == 7
    assert result.stdout == "one\n"
    assert result.stderr == "two\n"  # the session's stderr is ours
    result = cli(served, "run", "printf", "%s\\n", "a b", "c")  # words are quoted, not re-split
    assert (result.returncode, result.stdout) == (0, "a b\nc\n")


def test_run_refuses_a_mistyped_option_instead_of_running_it(served: Served) -> None:
    typo = cli(served, "run", "--timout", "5", "echo", "ran")
    assert typo.returncode == 2 and "ran" not in typo.stdout
    assert "--timeout" in typo.stderr  # the suggestion
    dashed = cli(served, "run", "echo", "-n", "--x")  # after the command, dashes are its own
    assert (dashed.returncode, dashed.stdout) == (0, "--x")


def test_run_streams_live(served: Served) -> None:
    env = cli_env(PROCPILOT_URL=served.url, PROCPILOT_TOKEN=TOKEN_A)
    proc = subprocess.Popen(
        [PROCPILOT, "run", "echo first; read go; echo second $go"],
        env=env,
        stdout=subprocess.PIPE,
        stdin=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdin is not None
    # The command is blocked reading stdin until we answer: "first" was seen while it still runs,
    # however slow the machine (no clock involved).
    assert proc.stdout.readline() == "first\n"
    proc.stdin.write("now\n")
    proc.stdin.close()
    assert proc.stdout.readline() == "second now\n"
    assert proc.wait(60) == 0
    proc.stdout.close()


def test_run_interrupted_kills_the_session(served: Served) -> None:
    env = cli_env(PROCPILOT_URL=served.url, PROCPILOT_TOKEN=TOKEN_A)
    proc = subprocess.Popen([PROCPILOT, "run", "echo up; sleep 60"], env=env, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline() == "up\n"
    proc.send_signal(signal.SIGINT)
    assert proc.wait(30) == 128 + signal.SIGINT
    proc.stdout.close()
    with Client(served.url, TOKEN_A) as c:
        rows = c.process("list")["sessions"]
        assert all(r["status"] != "running" for r in rows)
        for row in rows:
            c.process("remove", row["sessionId"])


def test_run_forwards_piped_stdin(served: Served) -> None:
    result = cli(served, "run", "cat", input="hi\n")
    assert (result.returncode, result.stdout) == (0, "hi\n"), result.stderr
    result = cli(served, "run", "wc -l", input="".join(f"line {i}\n" for i in range(5000)))
    assert (result.returncode, result.stdout.strip()) == (0, "5000"), result.stderr
    result = cli(served, "run", "cat", stdin=subprocess.DEVNULL)  # EOF at once: cat ends
    assert (result.returncode, result.stdout) == (0, "")
    with Client(served.url, TOKEN_A) as c:
        for row in c.process("list")["sessions"]:
            c.process("remove", row["sessionId"])


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_run_terminated_kills_the_session(served: Served, sig: int) -> None:
    env = cli_env(PROCPILOT_URL=served.url, PROCPILOT_TOKEN=TOKEN_A)
    proc = subprocess.Popen(
        [PROCPILOT, "run", "echo up; sleep 60"], env=env, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True
    )
    assert proc.stdout is not None
    assert proc.stdout.readline() == "up\n"
    proc.send_signal(sig)
    assert proc.wait(30) == 128 + sig  # the session got the same signal, and its code is ours
    proc.stdout.close()
    with Client(served.url, TOKEN_A) as c:
        rows = c.process("list")["sessions"]
        assert rows and all(r["status"] != "running" for r in rows)
        for row in rows:
            c.process("remove", row["sessionId"])


def test_a_stdin_pump_still_alive_at_the_end_never_meets_interpreter_finalization() -> None:
    # A daemon thread in the middle of an HTTP call while CPython finalizes crashed `procpilot run`
    # with SIGSEGV in CI (2 in 100 in a loop). A pump still alive at the end (stdin never closed,
    # or its last write in flight) now ends the process without finalizing: atexit never runs,
    # the exit code and the output already printed are kept.
    script = (
        "import atexit, sys, threading, time\n"
        "from procpilot.transports import cli_app\n"
        "atexit.register(print, 'FINALIZED')\n"
        "pump = threading.Thread(target=time.sleep, args=(60,), daemon=True)\n"
        "cli_app._STDIN_PUMPS.append(pump)\n"
        "pump.start()\n"
        "sys.argv = ['procpilot', 'kill', '--help']\n"
        "cli_app.main()\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], env=cli_env(), capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert "Usage" in done.stdout and "FINALIZED" not in done.stdout
    script = script.replace("['procpilot', 'kill', '--help']", "['procpilot', 'no-such-verb']")
    done = subprocess.run(
        [sys.executable, "-c", script], env=cli_env(), capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 2 and "no-such-verb" in done.stderr and "FINALIZED" not in done.stdout


def test_detached_session_lifecycle(served: Served) -> None:
    started = cli(served, "run", "-d", "cat")
    assert started.returncode == 0, started.stderr
    sid = started.stdout.strip()
    assert re.fullmatch(r"[a-z2-7]{16}", sid)
    ps = cli(served, "ps")
    assert sid[:8] in ps.stdout and "running" in ps.stdout  # ps shows an id prefix that resolves
    assert cli(served, "write", sid, "hello", "--newline").returncode == 0
    assert cli(served, "write", sid, "--eof").returncode == 0
    waited = cli(served, "wait", sid, "--timeout", "20")
    assert waited.returncode == 0, waited.stderr
    logs = cli(served, "logs", sid)
    assert logs.stdout == "hello\n"
    assert cli(served, "rm", sid).returncode == 0
    assert sid[:8] not in cli(served, "ps").stdout


def test_named_sessions_and_ps(served: Served) -> None:
    started = cli(served, "run", "-d", "--name", "web", "echo listening; sleep 30")
    assert started.returncode == 0, started.stderr
    sid = started.stdout.strip()
    assert "procpilot logs -f web" in started.stderr
    taken = cli(served, "run", "-d", "--name", "web", "true")
    assert taken.returncode == 1 and "SessionNameInUse" in taken.stderr and sid in taken.stderr
    assert cli(served, "wait", "web", "--pattern", "listening", "--timeout", "20").returncode == 0
    ps = cli(served, "ps", "--running")
    header = ps.stdout.splitlines()[0].split()
    assert header[:7] == ["ID", "NAME", "PID", "STATUS", "AGE", "CPU", "MEM"] and header[-1] == "COMMAND"
    line = next(line for line in ps.stdout.splitlines() if line.startswith(sid[:8])).split()
    assert line[1] == "web" and line[2].isdigit() and line[3] == "running"
    assert cli(served, "logs", sid[:8]).stdout == "listening\n"  # a prefix of the id
    assert cli(served, "kill", "web").returncode == 0
    assert sid[:8] not in cli(served, "ps", "--running").stdout
    assert sid[:8] in cli(served, "ps").stdout
    assert cli(served, "rm", "web").returncode == 0
    flaky = cli(served, "run", "-d", "--name", "flaky", "--restart", "on-failure", "--max-restarts", "1", "exit 3")
    assert flaky.returncode == 0, flaky.stderr
    assert cli(served, "wait", "flaky", "--timeout", "30").returncode == 3  # the last run's code
    row = json.loads(cli(served, "ps", "--json").stdout)
    assert next(r for r in row if r["sessionName"] == "flaky")["restarts"] == 1
    assert "restart 1 of 1" in cli(served, "logs", "flaky").stdout
    assert cli(served, "rm", "flaky").returncode == 0


def test_run_copies_every_byte(served: Served) -> None:
    """Issue 23, finding 8: `run "seq 1 200000" | wc -l` printed 28,571 lines, the rest cut with a
    note on stderr, so `run make | tee build.log` lost lines silently."""
    result = cli(served, "run", "seq 1 200000; seq 1 50000 >&2", timeout=120)
    assert result.returncode == 0, result.stderr[-500:]
    assert result.stdout == "".join(f"{n}\n" for n in range(1, 200_001))
    assert result.stderr == "".join(f"{n}\n" for n in range(1, 50_001))


def test_ps_fits_80_columns_with_ids_that_resolve(served: Served) -> None:
    """Finding 8: at 80 columns COMMAND wrapped a word a line and ids were cut to `2ayb3…`."""
    long = "sleep 30 # " + " ".join(f"word{n}" for n in range(40))
    ids = [cli(served, "run", "-d", "--name", f"wide{n}", long).stdout.strip() for n in range(2)]
    env = cli_env(PROCPILOT_URL=served.url, PROCPILOT_TOKEN=TOKEN_A, COLUMNS="80")
    ps = subprocess.run([PROCPILOT, "ps", "--running"], env=env, capture_output=True, text=True, timeout=60, check=True)
    lines = ps.stdout.splitlines()
    assert all(len(line) <= 80 for line in lines), ps.stdout
    assert len(lines) == 1 + len(json.loads(cli(served, "ps", "--running", "--json").stdout))  # a line a session
    shown = [line.split()[0] for line in lines[1:] if line.split()[1].startswith("wide")]
    assert len(shown) == 2 and "…" not in "".join(shown), ps.stdout
    for short in shown:  # the id as shown is one every verb takes
        assert cli(served, "stop", short).returncode == 0
    assert {row["sessionId"] for row in json.loads(cli(served, "ps", "--json").stdout)} >= set(ids)
    for sid in ids:
        assert cli(served, "rm", sid).returncode == 0


def test_version_stop_restart_and_numeric_signals(served: Served) -> None:
    """Finding 8: no --version, no stop/restart verbs, `--signal 9` refused."""
    version = cli(None, "--version")
    assert version.returncode == 0 and re.fullmatch(r"procpilot \S+\n", version.stdout), version
    sid = cli(served, "run", "-d", "--name", "svc", "echo up; sleep 60").stdout.strip()
    killed = cli(served, "kill", "--signal", "9", "svc")
    assert killed.returncode == 0, killed.stderr
    assert cli(served, "wait", "svc", "--timeout", "20").returncode == 128 + signal.SIGKILL
    row = next(r for r in json.loads(cli(served, "ps", "--json").stdout) if r["sessionId"] == sid)
    assert row["exitSignal"] == "SIGKILL"
    again = cli(served, "restart", "svc")
    assert again.returncode == 0, again.stderr
    new_id = again.stdout.strip()
    assert new_id != sid
    assert cli(served, "wait", new_id, "--pattern", "up", "--timeout", "20").returncode == 0
    assert cli(served, "stop", "svc").returncode == 0
    rows = {r["sessionId"]: r for r in json.loads(cli(served, "ps", "--json").stdout)}
    assert rows[new_id]["status"] == "killed" and rows[new_id]["sessionName"] == "svc"  # stopped, still listed
    for gone in (sid, new_id):
        assert cli(served, "rm", gone).returncode == 0


def test_address_in_use_names_the_port_options(tmp_path: Path) -> None:
    """Finding 8: the "address in use" hint did not say how to pick another port."""
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        env = cli_env(HOME=str(tmp_path), PROCPILOT_STATE_DIR=str(tmp_path / "state"))
        argv = [PROCPILOT, "serve", "--port", str(port), "--workspace", str(tmp_path)]
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode != 0
    assert "--port" in done.stderr and "PORT=" in done.stderr, done.stderr


def test_logs_follow_and_wait_codes(served: Served) -> None:
    sid = cli(served, "run", "-d", "for i in 1 2 3 4 5; do echo n$i; sleep 0.2; done; exit 3").stdout.strip()
    followed = cli(served, "logs", "-f", sid)
    assert followed.stdout == "n1\nn2\nn3\nn4\nn5\n"
    assert cli(served, "wait", sid).returncode == 3
    sleeper = cli(served, "run", "-d", "sleep 30").stdout.strip()
    assert cli(served, "wait", sleeper, "--timeout", "0.5").returncode == 124
    killed = cli(served, "kill", sleeper, "--signal", "SIGKILL")
    assert killed.returncode == 0 and "killed" in killed.stderr
    assert cli(served, "wait", sleeper).returncode == 128 + signal.SIGKILL
    for session in (sid, sleeper):
        cli(served, "rm", session)


def test_logs_follow_prints_a_complete_line_while_the_session_runs(served: Served) -> None:
    sid = cli(served, "run", "-d", "echo 'Listening on :3000'; sleep 30").stdout.strip()
    env = cli_env(PROCPILOT_URL=served.url, PROCPILOT_TOKEN=TOKEN_A)
    proc = subprocess.Popen([PROCPILOT, "logs", "-f", sid], env=env, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    try:
        # The line is out while the session sleeps (before the fix: only when the session ended).
        assert select.select([proc.stdout], [], [], 20)[0], "logs -f held a complete line back"
        assert proc.stdout.readline() == "Listening on :3000\n"
    finally:
        cli(served, "kill", sid, "--signal", "SIGKILL")
        proc.wait(60)
        proc.stdout.close()
        cli(served, "rm", sid)


def test_wait_longer_than_one_tool_call(served: Served, monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from procpilot.transports import cli_app as cli_module

    monkeypatch.setattr(cli_module, "_WAIT_CALL_S", 0.3)  # the tool's 600 s cap, scaled down
    sid = cli(served, "run", "-d", "sleep 1.5; exit 4").stdout.strip()
    env = {"PROCPILOT_URL": served.url, "PROCPILOT_TOKEN": TOKEN_A}
    assert CliRunner().invoke(cli_module.app, ["wait", sid, "--timeout", "30"], env=env).exit_code == 4
    assert CliRunner().invoke(cli_module.app, ["wait", sid], env=env).exit_code == 4
    cli(served, "rm", sid)


def test_logs_pages_a_long_output(served: Served) -> None:
    sid = cli(served, "run", "-d", "seq 1 5000").stdout.strip()
    cli(served, "wait", sid)
    out = cli(served, "logs", sid).stdout
    assert out == "".join(f"{i}\n" for i in range(1, 5001))
    cli(served, "rm", sid)


def test_tools_and_errors(served: Served) -> None:
    tools = cli(served, "tools")
    assert tools.returncode == 0 and "exec" in tools.stdout and "process" in tools.stdout
    missing = cli(served, "kill", "nosuchsession000")
    assert missing.returncode == 1
    assert "SessionNotFound" in missing.stderr and "Traceback" not in missing.stderr
    assert "procpilot ps" in missing.stderr and "process list" not in missing.stderr  # a CLI verb, not a tool call
    wrong = cli(served, "ps", token="wrong")  # noqa: S106
    assert wrong.returncode == 1 and "Unauthorized" in wrong.stderr and "PROCPILOT_TOKEN" in wrong.stderr


def test_clear_error_when_no_daemon_runs(tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = cli_env(HOME=str(tmp_path), PROCPILOT_URL=f"http://127.0.0.1:{port}")
    result = subprocess.run([PROCPILOT, "ps"], env=env, capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 1
    assert "DaemonNotRunning" in result.stderr
    assert "procpilot serve" in result.stderr  # and how to start one
    assert "Traceback" not in result.stderr


def test_cli_finds_the_daemon_through_its_state_dir(served: Served) -> None:
    env = cli_env(PROCPILOT_STATE_DIR=str(served.root / "state"), PROCPILOT_TOKEN=TOKEN_A)
    result = subprocess.run([PROCPILOT, "ps"], env=env, capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr


def test_unix_socket_url(served: Served) -> None:
    env = cli_env(PROCPILOT_URL=f"unix://{served.unix_socket}", PROCPILOT_TOKEN=TOKEN_B)
    result = subprocess.run(
        [PROCPILOT, "run", "echo via-socket"], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert (result.returncode, result.stdout) == (0, "via-socket\n")


# -- the Python client -------------------------------------------------------------------------


def test_sync_client_every_tool_and_typed_errors(served: Served) -> None:
    with Client(served.url, TOKEN_A) as c:
        names = {t["name"] for t in c.tools()}
        assert {"exec", "process"} <= names
        done = c.exec("echo hi")
        assert isinstance(done, ToolReply) and done["output"] == "hi\n" and "hi" in done.text
        bg = c.exec("cat", background=True)
        sid = bg["sessionId"]
        assert c.process("write", sid, data="x\n", eof=True)["bytesWritten"] == 2
        assert c.process("wait", sid, timeout=10_000)["reason"] == "exited"
        with pytest.raises(ProcessAlreadyExited) as caught:
            c.process("write", sid, data="more")
        assert caught.value.hints and caught.value.code == "ProcessAlreadyExited"
        with pytest.raises(SessionNotFound):
            c.process("poll", "nosuchsession000")
        with pytest.raises(InvalidArgument):
            c.call("exec")
        with pytest.raises(UnknownTool):
            c.call("nope")
        # Every other tool by name, or as an attribute (dots become underscores).
        if "process.list" in names:
            assert "processes" in c.process_list().data
        assert c.call("process", action="list")["total"] >= 1
        c.process("remove", sid)
        c.process("remove", done["sessionId"])
        assert c.openapi()["openapi"].startswith("3.1")


def test_errors_of_every_face_come_back_as_their_own_classes() -> None:
    # In a fresh interpreter, so nothing has imported the faces or the policy before the client.
    code = (
        "from procpilot.client import error_from\n"
        "for name in ('ProcessNotFound', 'CommandDenied', 'ResourceLimitExceeded', 'ProcLimit'):\n"
        "    exc = error_from({'error': name, 'message': 'm', 'hints': {}})\n"
        "    print(type(exc).__module__, type(exc).__name__)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split("\n")
    assert out[:4] == [  # one error tree: every class lives in procpilot.errors
        "procpilot.errors ProcessNotFound",
        "procpilot.errors CommandDenied",
        "procpilot.errors ResourceLimitExceeded",
        "procpilot.errors ProcLimit",
    ]


def test_unknown_error_codes_still_raise_procpilot_errors() -> None:
    from procpilot.client import error_from

    exc = error_from({"error": "BrandNewError", "message": "m", "hints": {"h": "x"}, "extra": 1})
    assert isinstance(exc, ProcpilotError) and exc.code == "BrandNewError"
    assert exc.hints == {"h": "x"} and exc.details == {"extra": 1}


def test_client_errors_for_auth_and_absent_daemon(served: Served) -> None:
    with Client(served.url, "wrong") as c, pytest.raises(Unauthorized):
        c.exec("true")
    with Client("http://127.0.0.1:1", TOKEN_A) as c, pytest.raises(DaemonNotRunning) as caught:
        c.exec("true")
    assert "procpilot serve" in " ".join(caught.value.hints.values())


async def test_async_client_and_events(served: Served) -> None:
    async with AsyncClient(served.url, TOKEN_A) as c:
        events = c.events()
        assert (await anext(events))["type"] == "ready"
        bg = await c.exec("sleep 0.2; exit 2", background=True)
        event = await anext(events)
        if event["type"] == "audit":  # exec is a notify-tier tool: its call is audited first
            assert event["tool"] == "exec"
            event = await anext(events)
        assert event["sessionId"] == bg["sessionId"] and event["exitCode"] == 2
        await events.aclose()
        with pytest.raises(SessionNotFound):
            await c.process("kill", "nosuchsession000")
        await c.process("remove", bg["sessionId"])


def test_sync_events(served: Served) -> None:
    with Client(served.url, TOKEN_A) as c:
        events = c.events()
        assert next(events)["type"] == "ready"
        bg = c.exec("true", background=True)
        event = next(events)
        while event["type"] != "exit":
            event = next(events)
        assert event["sessionId"] == bg["sessionId"]
        events.close()
        c.process("remove", bg["sessionId"])


def _has_socket(pid: int) -> bool:
    with contextlib.suppress(OSError):
        return any(os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:") for fd in os.listdir(f"/proc/{pid}/fd"))
    return False


def test_daemon_dying_mid_request_is_a_clean_error(tmp_path: Path) -> None:
    import threading

    from procpilot.client import DaemonConnectionLost
    from tests.conftest import marked_processes

    daemon = start_daemon(tmp_path / "dying")
    try:
        sid = cli(daemon, "run", "-d", "sleep 60").stdout.strip()
        waiting = subprocess.Popen(
            [PROCPILOT, "wait", sid],
            env=cli_env(PROCPILOT_URL=daemon.url, PROCPILOT_TOKEN=TOKEN_A, COLUMNS="200"),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        caught: list[BaseException] = []

        def client_wait() -> None:
            with Client(daemon.url, TOKEN_A) as c:
                try:
                    c.process("wait", sid, timeout=60_000)
                except BaseException as exc:  # the test inspects whatever it was
                    caught.append(exc)

        thread = threading.Thread(target=client_wait)
        thread.start()
        # Both waits must be in flight when the daemon dies (a late one is DaemonNotRunning instead).
        deadline = time.monotonic() + 30
        while not _has_socket(waiting.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(1.0)
        daemon.proc.kill()
        daemon.proc.wait()
        _out, err = waiting.communicate(timeout=30)
        thread.join(30)
        assert waiting.returncode not in (0, None), (waiting.returncode, err)
        assert "DaemonConnectionLost" in err and "Traceback" not in err, err
        assert "procpilot ps" in err  # and what to do next
        assert len(caught) == 1 and isinstance(caught[0], DaemonConnectionLost), caught
    finally:
        if daemon.proc.poll() is None:
            daemon.proc.kill()
            daemon.proc.wait()
        for pid in marked_processes():  # the SIGKILLed daemon could not end its sessions
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_serve_banner_says_how_to_connect(served: Served, tmp_path: Path) -> None:
    banner = served.log_text()
    assert f"claude mcp add --transport http procpilot {served.url}/mcp" in banner
    assert f"export PROCPILOT_URL={served.url}" in banner
    assert f"export PROCPILOT_STATE_DIR={served.root / 'state'}" in banner  # not the default state dir
    assert not any(token in banner for token in (TOKEN_A, TOKEN_B))

    # The default state dir needs no export: the CLI looks there anyway.
    project = tmp_path / "project"
    project.mkdir()
    proc = subprocess.Popen(
        [PROCPILOT, "serve", "--port", "0", "--workspace", str(project)],
        env=cli_env(HOME=str(tmp_path)),
        cwd=tmp_path,
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stderr is not None
        lines: list[str] = []
        while not any("CLI:" in line for line in lines):
            line = proc.stderr.readline()
            assert line, "".join(lines)
            lines.append(line)
        text = "".join(lines)
        url = re.search(r"daemon on (http://127\.0\.0\.1:\d+)", text)
        assert url, text
        assert f"claude mcp add --transport http procpilot {url.group(1)}/mcp" in text
        assert f"export PROCPILOT_URL={url.group(1)}" in text
        assert "PROCPILOT_STATE_DIR" not in text
        assert f"workspace: {project}" in text
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        assert proc.stderr is not None
        proc.stderr.close()


def test_capabilities_endpoint_and_doctor(served: Served) -> None:
    with Client(served.url, TOKEN_A) as c:
        caps = c.capabilities()
    assert {"tree_kill", "limits", "isolation", "pidfd"} <= set(caps)
    assert set(caps["limits"]) == {"mechanism", "enforced", "not_enforced", "passed_over"}
    # The daemon made room for its sessions in its own descriptor limit, and says so.
    fds = caps["descriptors"]
    assert fds["raised_for_sessions"] == 10_000 and fds["per_session"] == 2
    assert fds["soft"] == min(fds["hard"], 2 * 10_000 + 4096 + 2048)
    assert ("note" in fds) is (fds["hard"] < 2 * 10_000 + 4096 + 2048)
    with Client(served.url, "wrong") as c, pytest.raises(Unauthorized):
        c.capabilities()

    doctor = cli(served, "doctor")
    assert doctor.returncode == 0, doctor.stderr
    assert "Traceback" not in doctor.stderr
    assert "tree kill" in doctor.stdout and caps["tree_kill"] in doctor.stdout
    assert caps["limits"]["mechanism"] in doctor.stdout
    assert "descriptors: soft" in doctor.stdout
    assert f"daemon reachable at {served.url}" in doctor.stdout
    as_json = json.loads(cli(served, "doctor", "--json").stdout)
    assert as_json["daemon"]["reachable"]
    # The same capabilities; only the disk's free bytes may have moved between the two calls.
    seen = as_json["daemon"]["capabilities"]
    assert seen["state_dir"]["free_bytes"] > 0
    for both in (seen, caps):
        both["state_dir"].pop("free_bytes")
    assert seen == caps
    assert as_json["host"]["limits"]["mechanism"] == caps["limits"]["mechanism"]  # the same host
    # Which mechanism records how a session ended while no server ran, here and in the daemon.
    assert as_json["host"]["outage_exits"] == caps["outage_exits"]
    assert "outage exits: mechanism" in doctor.stdout

    refused = cli(served, "doctor", token="wrong")  # noqa: S106
    assert refused.returncode == 0 and "Unauthorized" in refused.stdout


def test_doctor_without_a_daemon(tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = cli_env(HOME=str(tmp_path), COLUMNS="200")
    env["PROCPILOT_URL"] = f"http://127.0.0.1:{port}"
    result = subprocess.run([PROCPILOT, "doctor"], env=env, capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    assert "limits: mechanism" in result.stdout
    assert "no daemon running" in result.stdout and "procpilot serve" in result.stdout
    assert "Traceback" not in result.stderr
