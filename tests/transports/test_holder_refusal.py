"""A real daemon whose holder has no room left in its descriptor table (engine/holder.py): a
session started then runs, but the holder takes no copy of it. The daemon says so where an
operator and an agent look (``/v1/capabilities``, ``procpilot doctor``, the session's own
result), and after a ``kill -9`` of the daemon the next server ends the session with that reason.

The table is filled by lowering the holder's limit under it (it raises its soft limit once, at
start) to the lowest descriptor number it has free: nothing more fits."""

from __future__ import annotations

import os
import resource
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from procpilot.config import load_settings
from procpilot.engine.capture import Stream
from procpilot.engine.supervisor import Supervisor
from tests.daemon import PROCPILOT, TOKEN_A, cli_env, marked, post, start_daemon

AGENT = "agent-a"


def _until(check: Callable[[], bool], what: str, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.02)


def _no_room(pid: int) -> None:
    taken = {int(name) for name in os.listdir(f"/proc/{pid}/fd")}
    lowest_free = min(set(range(max(taken) + 2)) - taken)
    hard = resource.prlimit(pid, resource.RLIMIT_NOFILE)[1]
    resource.prlimit(pid, resource.RLIMIT_NOFILE, (lowest_free, hard))


async def test_a_daemon_says_what_its_full_holder_refused_and_a_crash_ends_it_with_that_reason(tmp_path: Path) -> None:
    root = tmp_path / "d"
    first = start_daemon(root)
    try:
        with first.http() as c:
            _no_room(int(c.get("/v1/capabilities").json()["restarts"]["holder_pid"]))
            started = post(c, "exec", command="echo up; sleep 30", background=True).json()["data"]
            assert started["status"] == "running", started
            sid = str(started["sessionId"])
            _until(lambda: "not_held" in c.get("/v1/capabilities").json()["restarts"], "the holder's refusal")
            restarts = c.get("/v1/capabilities").json()["restarts"]
            assert restarts["survive"] is True and restarts["not_held"]["ids"] == [sid]
            why = str(restarts["not_held"]["why"])
            poll = post(c, "process", action="poll", sessionId=sid).json()["data"]
            assert poll["survive"] is False and poll["surviveWhy"] == why
            assert poll["status"] == "running"
        env = cli_env(HOME="/nonexistent", COLUMNS="200", PROCPILOT_URL=first.url, PROCPILOT_TOKEN=TOKEN_A)
        doctor = subprocess.run([PROCPILOT, "doctor"], env=env, capture_output=True, text=True, timeout=60, check=False)
        assert doctor.returncode == 0, doctor.stderr
        assert "restarts: not held" in doctor.stdout and "1 running session(s) would not survive" in doctor.stdout
    finally:
        first.proc.kill()
        first.proc.wait()
    # Its pipes died with the daemon; the next server ends what is left, and says why.
    async with Supervisor(load_settings(root / "procpilot.toml", env={}), owner="serve") as second:
        gone = second.get(AGENT, sid)
        assert await gone.wait_finished(10)
        assert gone.error == f"it did not survive its server: {why}", gone.error
    assert not marked(sid)


async def test_a_refused_session_the_holder_takes_later_survives_a_kill_9(tmp_path: Path) -> None:
    root = tmp_path / "d"
    first = start_daemon(root)
    try:
        with first.http() as c:
            holder = int(c.get("/v1/capabilities").json()["restarts"]["holder_pid"])
            limit = resource.prlimit(holder, resource.RLIMIT_NOFILE)
            _no_room(holder)
            started = post(c, "exec", command='echo up; read a; echo "got $a"', background=True).json()["data"]
            sid = str(started["sessionId"])
            _until(lambda: "not_held" in c.get("/v1/capabilities").json()["restarts"], "the holder's refusal")
            resource.prlimit(holder, resource.RLIMIT_NOFILE, limit)  # room again
            # The next session to end is when the daemon offers the refused one again.
            assert post(c, "exec", command="true").json()["data"]["exitCode"] == 0
            _until(lambda: "not_held" not in c.get("/v1/capabilities").json()["restarts"], "the holder taking it")
            poll = post(c, "process", action="poll", sessionId=sid).json()["data"]
            assert poll["status"] == "running" and "survive" not in poll, poll
    finally:
        first.proc.kill()
        first.proc.wait()
    # Held now: the next server takes it over whole, its stdin and its output with it.
    async with Supervisor(load_settings(root / "procpilot.toml", env={}), owner="serve") as second:
        kept = second.get(AGENT, sid)
        assert kept.is_running, kept.error
        await second.write(AGENT, sid, b"x\n")
        assert await kept.wait_finished(10) and kept.exit_code == 0
        assert kept.output[Stream.COMBINED].read(0, 1 << 16).data == b"up\ngot x\n"
    assert not marked(sid)
