"""A real daemon killed -9 while its holder keeps its sessions, the holder's descriptor table then
too full to take their copies back for the next daemon's hello (engine/holder.py ``_hello``). No
session is handed over in part (its output taken as ended while its command prints, its stdin
closed under it): the next daemon ends each one and says why, where an agent looks (the session's
poll) and where an operator does (``/v1/capabilities``, ``procpilot doctor``).

The table is filled by lowering the holder's limit under it (it raises its soft limit once, at
start): one descriptor free beside the next daemon's connection, no session's copies whole."""

from __future__ import annotations

import contextlib
import os
import resource
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from tests.daemon import PROCPILOT, TOKEN_A, cli_env, end_all_left, marked, post, start_daemon

SESSIONS = 2


def _until(check: Callable[[], bool], what: str, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.02)


def _fds(pid: int) -> dict[int, str]:
    found = {}
    for name in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(FileNotFoundError):
            found[int(name)] = os.readlink(f"/proc/{pid}/fd/{name}")
    return found


def _room_for(pid: int, more: int) -> None:
    """Lower ``pid``'s soft descriptor limit so that exactly ``more`` new descriptors fit."""
    taken = set(_fds(pid))
    free = [fd for fd in range(max(taken) + more + 2) if fd not in taken]
    hard = resource.prlimit(pid, resource.RLIMIT_NOFILE)[1]
    resource.prlimit(pid, resource.RLIMIT_NOFILE, (free[more], hard))


def test_a_daemon_ends_what_its_full_holder_cannot_hand_back_and_says_why(tmp_path: Path) -> None:
    root = tmp_path / "d"
    first = start_daemon(root)
    second = None
    try:
        with first.http() as c:
            ids = []
            for _ in range(SESSIONS):
                data = post(c, "exec", command='echo up; read a; echo "got $a"', background=True).json()["data"]
                assert data["status"] == "running", data
                ids.append(str(data["sessionId"]))
            for sid in ids:
                _until(lambda sid=sid: "up" in post(c, "process", action="poll", sessionId=sid).json()["text"], sid)
            holder = int(c.get("/v1/capabilities").json()["restarts"]["holder_pid"])
        # Every copy in the holder's stash (it sleeps in its poll: all sent to it is handled), none
        # in its table; then no room to bring them back.
        _until(lambda: Path(f"/proc/{holder}/wchan").read_text() == "do_epoll_wait", "the holder's stash")
        _room_for(holder, 1)
        first.proc.kill()
        first.proc.wait()

        second = start_daemon(root, log_name="second.log")
        with second.http() as c:
            restarts = c.get("/v1/capabilities").json()["restarts"]
            assert restarts["holder_pid"] == holder, restarts
            told = restarts["unreturned"]
            assert told["sessions"] == SESSIONS and sorted(told["ids"]) == sorted(ids), told
            why = str(told["why"])
            assert f"holder (pid {holder})" in why and "descriptor table" in why, why
            for sid in ids:
                poll = post(c, "process", action="poll", sessionId=sid).json()["data"]
                assert poll["status"] != "running", poll
                assert poll["error"] == f"this server could not take it over, so it was ended: {why}", poll
            env = cli_env(HOME="/nonexistent", COLUMNS="300", PROCPILOT_URL=second.url, PROCPILOT_TOKEN=TOKEN_A)
            doctor = subprocess.run(
                [PROCPILOT, "doctor"], env=env, capture_output=True, text=True, timeout=60, check=False
            )
            assert doctor.returncode == 0, doctor.stderr
            assert f"{SESSIONS} running session(s) ended at start" in doctor.stdout, doctor.stdout
        assert not any(marked(sid) for sid in ids)
        second.stop()
    finally:
        for served in (first, second):
            if served is not None and served.proc.poll() is None:
                served.proc.kill()
                served.proc.wait()
        end_all_left(root)
