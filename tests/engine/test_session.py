"""One session: its end is reported once and only after its last byte, a terminate escalates to
SIGKILL after the grace period, stdin writes are bounded by their timeout, and what the store
keeps of it is enough to list it after a restart."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import threading
import time

import pytest

from procpilot.engine.capture import Stream
from procpilot.engine.reaper import ExitWatcher
from procpilot.engine.spawn import SpawnSpec
from procpilot.engine.states import SessionState
from procpilot.engine.supervisor import Supervisor
from procpilot.errors import ProcessAlreadyExited

A = "agent-a"


async def test_finished_means_reaped_and_every_byte_stored(supervisor: Supervisor) -> None:
    session = await supervisor.spawn(SpawnSpec("head -c 3000000 /dev/zero; echo END"), scope=A)
    assert await session.wait_finished(30)
    assert session.state is SessionState.EXITED_OK and session.exit_code == 0
    assert session.output[Stream.STDOUT].size == 3_000_004  # nothing still in flight at the end
    assert await session.wait_finished(0)  # and says so at once, every time after


async def test_terminate_escalates_after_the_grace_period(supervisor: Supervisor) -> None:
    session = await supervisor.spawn(SpawnSpec("trap '' TERM; echo ready; sleep 30"), scope=A)
    await supervisor.wait(A, session.id, timeout=10, pattern=re.compile("ready"))
    session.terminate(SessionState.KILLED, signal.SIGTERM, 0.3)
    assert await session.wait_finished(10)
    assert session.state is SessionState.KILLED and session.exit_signal == "SIGKILL"
    with pytest.raises(ProcessAlreadyExited):
        session.terminate(SessionState.KILLED, signal.SIGTERM, None)


async def test_a_write_to_a_child_that_never_reads_returns_what_went_in(supervisor: Supervisor) -> None:
    session = await supervisor.spawn(SpawnSpec("sleep 30"), scope=A)
    written = await session.write(b"x" * (8 << 20), timeout=0.5)
    assert 0 < written < 8 << 20  # the pipe took what it could hold, the call did not hang
    await supervisor.kill(A, session.id)


async def test_the_record_and_the_exit_info_say_how_it_ended(supervisor: Supervisor) -> None:
    session = await supervisor.run(SpawnSpec("exit 3"), scope=A, yield_ms=None)
    record = session.record()
    assert record["id"] == session.id and record["scope"] == A and record["command"] == "exit 3"
    assert record["state"] == "exited_error" and record["exit_code"] == 3 and record["ended_at"]
    info = session.exit_info("tail")
    assert (info.session_id, info.state, info.exit_code, info.tail) == (session.id, session.state, 3, "tail")


async def test_an_exit_with_nothing_left_ends_the_session_as_it_is_seen(supervisor: Supervisor) -> None:
    # The leader exits, its tree is empty, and its pipes hold its last bytes and their EOF: the
    # exit's own callback reads them and ends the session, with every byte, not a loop pass later.
    session = await supervisor.spawn(SpawnSpec("printf out; printf err >&2; exit 3"), scope=A)
    pid = session.pid
    assert pid is not None
    deadline = time.monotonic() + 10
    while os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:  # the loop does not run
        assert time.monotonic() < deadline
        time.sleep(0.001)
    watcher = ExitWatcher.of(asyncio.get_running_loop())
    assert watcher is not None
    watcher.sweep()  # the exit is seen: its callback runs, and nothing else of the loop
    assert session.finished
    assert session.state is SessionState.EXITED_ERROR and session.exit_code == 3
    assert session.output[Stream.STDOUT].read(0).data == b"out"
    assert session.output[Stream.STDERR].read(0).data == b"err"


async def test_a_pipe_written_from_outside_the_tree_ends_the_session_with_its_last_byte(supervisor: Supervisor) -> None:
    # The tree is empty when the leader exits, but something outside it (here a thread of this
    # process) holds the stdout pipe open and writes on: the exit's callback reads what is there
    # and leaves the rest to the loop, which serves everything else meanwhile and ends the
    # session at the pipe's end, every byte kept.
    session = await supervisor.spawn(SpawnSpec("sleep 0.2"), scope=A)
    assert session.spawned is not None
    ours = os.fstat(session.spawned.stdout_fd).st_ino
    deadline = time.monotonic() + 5
    while os.stat(f"/proc/{session.pid}/fd/1").st_ino != ours:  # a warm shell's join redirects it a moment
        assert time.monotonic() < deadline
        await asyncio.sleep(0.001)
    writer = os.open(f"/proc/{session.pid}/fd/1", os.O_WRONLY)
    assert os.fstat(writer).st_ino == ours
    stop = threading.Event()
    stopped_by_the_loop: list[bool] = []
    written: list[int] = []

    def spew() -> None:
        deadline = time.monotonic() + 5  # a bound of its own: a held loop would never stop it
        try:
            while not stop.is_set() and time.monotonic() < deadline:
                written.append(os.write(writer, b"x" * 65536))
        finally:
            os.close(writer)

    def stop_from_the_loop() -> None:
        stopped_by_the_loop.append(True)
        stop.set()

    thread = threading.Thread(target=spew)
    thread.start()
    asyncio.get_running_loop().call_later(0.5, stop_from_the_loop)  # after the leader's exit
    try:
        assert await session.wait_finished(10)
    finally:
        stop.set()
        thread.join()
    assert stopped_by_the_loop
    assert session.state is SessionState.EXITED_OK and session.output[Stream.STDOUT].size == sum(written) > 0
