"""How a session ended while nobody could wait for it: its server was killed -9, so its leader
belonged to init, and the next server adopted it without being its parent. The holder keeps the
kernel's exit record of each such leader (engine/exit_records.py): the code or signal reported is
the one a live server would have reported, for argv sessions, boxed ones and scripts that end in
``exec`` alike; without the privilege it needs, the session is lost and says why."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import httpx2
import pytest

from procpilot.engine.exit_records import probe
from procpilot.engine.isolation import isolation_capabilities
from tests.daemon import TOKEN_B, Served, cleanup, end_all_left, post, start_daemon

RECORDS, WHY_NOT = probe()
needs_records = pytest.mark.skipif(RECORDS is None, reason=f"no kernel exit records here: {WHY_NOT}")
BOXED = "[policy.agents.agent-b]\nisolate = true\n"
HOG = "import time\nchunks=[]\nwhile True:\n    chunks.append(bytearray(8 << 20))\n    time.sleep(0.005)\n"
NO_NET_ADMIN = ("setpriv", "--bounding-set", "-net_admin", "--inh-caps", "-net_admin")


# The outage's exits come once the holder listens for them, however long the daemon took to get
# there (a fixed sleep raced it on a busy machine: an exit before it is lost, as documented).
_AT_GO = "until [ -e go ]; do sleep 0.05; done"


def _exec(c: httpx2.Client, command: str, **kw: Any) -> str:
    data = post(c, "exec", command=command, background=True, **kw).json()["data"]
    assert data["status"] == "running", data
    return str(data["sessionId"])


def _argv(c: httpx2.Client, *argv: str, **kw: Any) -> str:
    """An argv session: no shell of ours runs it, so no EXIT trap could record its end."""
    data = post(c, "process.run", command=argv[0], args=list(argv[1:]), background=True, **kw).json()
    assert "process_id" in data["data"], data
    return str(data["data"]["process_id"])


def _row(c: httpx2.Client, sid: str) -> dict[str, Any]:
    data = post(c, "process", action="wait", sessionId=sid, timeout=15_000).json()["data"]
    assert data["state"] != "running", data
    return dict(data)


def _pid(c: httpx2.Client, sid: str) -> int:
    rows = post(c, "process", action="list").json()["data"]["sessions"]
    return int(next(r["pid"] for r in rows if r["sessionId"] == sid))


def _gone(sessions: list[str]) -> bool:
    return not any(_alive(sid) for sid in sessions)


def _alive(session_id: str) -> bool:
    marker = f"PROCPILOT_SESSION={session_id}".encode()
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                if marker not in f.read().split(b"\0"):
                    continue
            with open(f"/proc/{name}/stat", "rb") as f:
                if f.read().rsplit(b")", 1)[1].split()[0] != b"Z":
                    return True
        except OSError:
            continue
    return False


def _holder_listens(state_dir: Path) -> bool:
    """The state directory's holder has a generic netlink socket: it registered for exit records."""
    generic = set()
    with open("/proc/net/netlink") as f:
        for line in f.read().splitlines()[1:]:
            fields = line.split()
            if fields[1] == "16":  # NETLINK_GENERIC
                generic.add(f"socket:[{fields[-1]}]")
    path = str(state_dir / "holder.sock").encode()
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                if path not in f.read().split(b"\0"):
                    continue
            return any(os.readlink(f"/proc/{name}/fd/{fd}") in generic for fd in os.listdir(f"/proc/{name}/fd"))
        except OSError:
            continue
    return False


def _until(check: Any, what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.05)


def _crash(daemon: Served) -> None:
    daemon.proc.kill()
    daemon.proc.wait()


def _end_all(root: Path, daemons: list[Served]) -> None:
    for daemon in daemons:
        if daemon.proc.poll() is None:
            _crash(daemon)
    end_all_left(root, (None, TOKEN_B))


@needs_records
def test_exits_while_no_server_runs_are_reported_as_a_live_server_would(tmp_path: Path) -> None:
    root = tmp_path / "d"
    boxed_here = isolation_capabilities().get("private_box") is not None
    first = start_daemon(root, extra=BOXED if boxed_here else "")
    daemons = [first]
    try:
        with first.http() as c:
            oom_here = c.get("/v1/capabilities").json()["limits"]["mechanism"] != "watchdog"
            argv = _argv(c, "sh", "-c", f"{_AT_GO}; exit 7")
            execd = _exec(c, f"{_AT_GO}; exec sh -c 'exit 4'")  # exec replaced the shell and its trap
            tty = _exec(c, f"{_AT_GO}; exec sh -c 'exit 9'", pty=True)
            termed = _exec(c, "sleep 300")  # its process group gets SIGTERM during the outage
            killed = _argv(c, "sleep", "300")  # SIGKILL during the outage
            later = _argv(c, "sh", "-c", "read x; exit 3")  # ends under the next server, not its parent
            hog = None
            if oom_here:
                wait = "import os, time\nwhile not os.path.exists('go'): time.sleep(0.05)"
                hog = _argv(c, "python3", "-c", f"{wait}\n{HOG}", memory_limit=96 << 20)
            termed_pid, killed_pid = _pid(c, termed), _pid(c, killed)
        boxed = None
        if boxed_here:
            with first.http(TOKEN_B) as cb:
                boxed = _exec(cb, f"{_AT_GO}; exit 5")  # the leader is bubblewrap, outside the box
        time.sleep(0.3)  # past the holder's batch window
        _crash(first)
        # Within milliseconds the holder listens; an exit before that is lost (docs/daemon.md).
        _until(lambda: _holder_listens(root / "state"), "the holder to listen for exits")
        time.sleep(0.2)
        (root / "ws" / "go").touch()  # now those that wait for it end, with nobody to wait for them
        os.killpg(termed_pid, signal.SIGTERM)
        os.kill(killed_pid, signal.SIGKILL)
        ended = [s for s in (argv, execd, tty, termed, killed, hog, boxed) if s is not None]
        _until(lambda: _gone(ended), "the sessions to end during the outage")

        second = start_daemon(root, log_name="second.log")
        daemons.append(second)
        with second.http() as c:
            assert (_row(c, argv)["state"], _row(c, argv)["exitCode"]) == ("exited_error", 7)
            assert _row(c, execd)["exitCode"] == 4
            assert _row(c, tty)["exitCode"] == 9
            assert (_row(c, termed)["state"], _row(c, termed)["exitSignal"]) == ("exited_error", "SIGTERM")
            assert _row(c, killed)["exitSignal"] == "SIGKILL"
            if hog is not None:  # its memory limit's OOM kill, as a live server reports it
                assert (_row(c, hog)["state"], _row(c, hog)["exitSignal"]) == ("limit_exceeded", "SIGKILL")
            post(c, "process", action="write", sessionId=later, data="go\n")
            assert (_row(c, later)["state"], _row(c, later)["exitCode"]) == ("exited_error", 3)
            # The same ends under a live server, its parent: reported alike, word for word.
            twins = {termed: _exec(c, "sleep 300"), killed: _argv(c, "sleep", "300")}
            os.killpg(_pid(c, twins[termed]), signal.SIGTERM)
            os.kill(_pid(c, twins[killed]), signal.SIGKILL)
            for outage, live in twins.items():
                ended_then, ended_live = _row(c, outage), _row(c, live)
                for key in ("state", "status", "exitCode", "exitSignal"):
                    assert ended_then[key] == ended_live[key], (key, ended_then, ended_live)
            cleanup(c)
        if boxed is not None:
            with second.http(TOKEN_B) as cb:
                assert _row(cb, boxed)["exitCode"] == 5
                cleanup(cb)
        else:
            pytest.skip("checked all but a boxed session: bubblewrap cannot make a private box here")
    finally:
        _end_all(root, daemons)


def test_without_the_privilege_an_unrecorded_exit_is_lost_and_says_why(tmp_path: Path) -> None:
    """A holder without CAP_NET_ADMIN gets no exit records: an argv session that ends in the
    outage is lost with the reason; a shell command still has its EXIT trap."""
    root = tmp_path / "d"
    first = start_daemon(root, wrap=NO_NET_ADMIN)  # and so the holder it starts
    daemons = [first]
    try:
        with first.http() as c:
            said = c.get("/v1/capabilities").json()["outage_exits"]
            assert "EXIT trap only" in said["mechanism"] and "CAP_NET_ADMIN" in said["why"]
            argv = _argv(c, "sh", "-c", f"{_AT_GO}; exit 7")
            shell = _exec(c, f"{_AT_GO}; exit 6")
        time.sleep(0.3)
        _crash(first)
        (root / "ws" / "go").touch()  # they end in the outage, however long the crash took
        _until(lambda: _gone([argv, shell]), "the sessions to end during the outage")
        second = start_daemon(root, log_name="second.log")  # privileged, but the holder is not
        daemons.append(second)
        with second.http() as c:
            # The holder says what it can do: this server could do more, its holder cannot.
            assert "CAP_NET_ADMIN" in c.get("/v1/capabilities").json()["outage_exits"]["why"]
            lost = _row(c, argv)
            assert (lost["state"], lost["exitCode"], lost["exitSignal"]) == ("lost", None, None)
            text = post(c, "process", action="poll", sessionId=argv).json()["text"]
            assert "CAP_NET_ADMIN" in text, text
            assert _row(c, shell)["exitCode"] == 6
            cleanup(c)
    finally:
        _end_all(root, daemons)
