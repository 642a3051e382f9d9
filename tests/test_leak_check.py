"""The suite's leak check counts only this run's processes: it must pass on a machine where a
procpilot daemon already serves real agents, and never end that daemon's sessions."""

from __future__ import annotations

import asyncio
import ctypes
import os
import signal
import subprocess
import time
from pathlib import Path

from procpilot.engine.spawn import SpawnSpec
from procpilot.engine.supervisor import Supervisor
from tests.conftest import PROGRAMS, PY, marked_processes

_PR_SET_CHILD_SUBREAPER, _PR_GET_CHILD_SUBREAPER = 36, 37


def _start_detached(*argv: str) -> None:
    """Run a program that double-forks, so that its daemon is no descendant of pytest. An in-process
    Supervisor of an earlier test made pytest a child subreaper, which would adopt the orphan: drop
    that for the launch."""
    libc = ctypes.CDLL(None, use_errno=True)
    flag = ctypes.c_int(0)
    libc.prctl(_PR_GET_CHILD_SUBREAPER, ctypes.byref(flag), 0, 0, 0)
    libc.prctl(_PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)
    try:
        subprocess.run([PY, *argv], check=True)
    finally:
        libc.prctl(_PR_SET_CHILD_SUBREAPER, flag.value, 0, 0, 0)


def test_another_supervisors_sessions_are_not_ours(tmp_path: Path) -> None:
    report = tmp_path / "report"
    _start_detached(str(PROGRAMS / "foreign_supervisor.py"), str(report), str(tmp_path / "state"))
    deadline = time.monotonic() + 20
    while not report.exists() or not report.read_text():
        assert time.monotonic() < deadline, "the foreign supervisor did not start"
        time.sleep(0.05)
    supervisor, sleeper = map(int, report.read_text().split())
    try:
        assert os.path.exists(f"/proc/{sleeper}")
        assert sleeper not in marked_processes()  # its process lives on past this test, unflagged
    finally:
        os.kill(supervisor, signal.SIGTERM)  # a supervisor ends its sessions on its way out
        deadline = time.monotonic() + 20
        while os.path.exists(f"/proc/{supervisor}") and time.monotonic() < deadline:
            time.sleep(0.05)


async def test_a_session_of_ours_is_counted(supervisor: Supervisor) -> None:
    session = await supervisor.run(SpawnSpec("sleep 30"), scope="me", yield_ms=0)
    while session.pid is None:
        await asyncio.sleep(0.01)
    assert session.pid in marked_processes()
    await supervisor.kill("me", session.id)
