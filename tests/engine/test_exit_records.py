"""The kernel's exit records (engine/exit_records.py) for processes we are not the parent of: the
exact wait status, only the watched processes' records reach the socket, and where a listener
cannot register, why not."""

from __future__ import annotations

import os
import select
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from procpilot.engine.exit_records import ExitRecorder, ExitWatch, probe, read_outcome, record_path, write_outcome

MECHANISM, WHY_NOT = probe()
pytestmark = pytest.mark.skipif(MECHANISM is None, reason=f"no kernel exit records here: {WHY_NOT}")

# The main thread leaves first (pthread_exit); the process ends later, by another thread's exit(9).
LEADER_LEAVES_FIRST = (
    "import ctypes, os, threading, time\n"
    "def last():\n    time.sleep(0.2)\n    os._exit(9)\n"
    "threading.Thread(target=last).start()\n"
    "ctypes.CDLL(None).pthread_exit(None)\n"
)


@pytest.fixture
def recorder() -> Iterator[ExitRecorder]:
    found = ExitRecorder()
    yield found
    found.close()


def _ended(recorder: ExitRecorder, argv: list[str], sig: int | None = None) -> tuple[int | None, int]:
    """Start ``argv`` held at a pipe, watch it, let it go (or signal it): the recorded status
    once its pidfd is readable, and the status its parent (we) got."""
    child = subprocess.Popen(["/bin/sh", "-c", 'read x; exec "$@"', "sh", *argv], stdin=subprocess.PIPE)
    pidfd = os.pidfd_open(child.pid)
    try:
        recorder.watch({child.pid})
        assert child.stdin is not None
        child.stdin.close()
        if sig is not None:
            os.kill(child.pid, sig)
        select.select([pidfd], [], [], 30)
        recorder.read()  # the record was queued before the pidfd turned readable
        found = recorder.status(child.pid)
    finally:
        os.close(pidfd)
        child.wait()
    return found, child.returncode


@pytest.mark.parametrize(
    ("argv", "sig", "code"),
    [
        (["/bin/sh", "-c", "exit 7"], None, 7),
        (["sleep", "30"], signal.SIGTERM, -signal.SIGTERM),
        (["sleep", "30"], signal.SIGKILL, -signal.SIGKILL),
        ([sys.executable, "-c", LEADER_LEAVES_FIRST], None, 9),
    ],
    ids=["exit-7", "sigterm", "sigkill", "leader-thread-leaves-first"],
)
def test_the_record_is_the_status_the_parent_waits_for(
    recorder: ExitRecorder, argv: list[str], sig: int | None, code: int
) -> None:
    status, parent_saw = _ended(recorder, argv, sig)
    assert status is not None and os.waitstatus_to_exitcode(status) == code == parent_saw


def test_only_the_watched_processes_records_reach_the_socket(recorder: ExitRecorder) -> None:
    watched = subprocess.Popen(["sleep", "30"])
    try:
        recorder.watch({watched.pid})
        for _ in range(20):  # others exit meanwhile, on a host where many more do
            subprocess.run(["/bin/true"], check=True)
        with pytest.raises(BlockingIOError):
            recorder.sock.recv(65536, socket.MSG_DONTWAIT)  # dropped in the kernel, never queued
    finally:
        watched.kill()
        watched.wait()
    recorder.read()
    assert recorder.status(watched.pid) == signal.SIGKILL


def test_a_leader_gone_before_the_watch_began_is_said_so() -> None:
    child = subprocess.Popen(["/bin/true"])
    pidfd = os.pidfd_open(child.pid)
    child.wait()  # ended and reaped before anyone listened
    watch = ExitWatch()
    try:
        watch.add({"s1": pidfd})
        outcome = watch.outcome("s1")
    finally:
        watch.discard("s1")
        os.close(pidfd)
    assert "status" not in outcome and "before the holder began to listen" in str(outcome["why"])
    assert watch.recorder is None  # nothing left to watch: the listener is closed


def test_the_record_file_round_trips_and_is_taken_once(tmp_path: Path) -> None:
    path = record_path(str(tmp_path / "s1" / "outage.spool"))
    assert path == str(tmp_path / "s1.exit.json")
    write_outcome(path, {"status": 7 << 8, "by": "taskstats"})
    assert read_outcome(path) == 7
    assert read_outcome(path) is None  # read once: the next server does not see it again
    write_outcome(path, {"status": signal.SIGKILL})
    assert read_outcome(path) == -signal.SIGKILL
    write_outcome(path, {"why": "no privilege"})
    assert read_outcome(path) == "no privilege"


@pytest.mark.parametrize(
    ("wrap", "said"),
    [
        (["setpriv", "--bounding-set", "-net_admin", "--inh-caps", "-net_admin"], "CAP_NET_ADMIN"),
        (["unshare", "--pid", "--fork", "--mount-proc"], "pid and user namespaces"),
    ],
    ids=["no-cap-net-admin", "own-pid-namespace"],
)
def test_where_no_listener_can_register_the_reason_says_why(wrap: list[str], said: str) -> None:
    if shutil.which(wrap[0]) is None:
        pytest.skip(f"{wrap[0]} is not installed")
    code = "from procpilot.engine.exit_records import probe; print(probe())"
    ran = subprocess.run([*wrap, sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.startswith("(None, ") and said in ran.stdout, ran.stdout
