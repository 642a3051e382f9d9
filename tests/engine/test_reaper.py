"""Leaders' exits through one SIGCHLD watcher (engine/reaper.py)."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from procpilot.config import Settings, load_settings
from procpilot.engine.reaper import ExitWatcher, LeaderPoll
from procpilot.engine.spawn import SpawnSpec
from procpilot.engine.supervisor import Supervisor
from tests.engine.test_descriptors import full_table


async def test_an_exit_is_seen_without_a_pidfd_even_behind_a_zombie_nobody_watches() -> None:
    """A child nobody here watches ends first and stays a zombie (its owner has not reaped it):
    the watched child's exit is still seen, and the other zombie is left to its owner."""
    loop = asyncio.get_running_loop()
    watcher = ExitWatcher.of(loop)
    assert watcher is not None
    other = subprocess.Popen(["/bin/sh", "-c", "exit 3"])
    # Until it is a zombie: waitid with WNOWAIT leaves it for its owner, as the watcher must.
    assert os.waitid(os.P_PID, other.pid, os.WEXITED | os.WNOWAIT) is not None
    ours = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    seen: asyncio.Future[int] = loop.create_future()

    def ended() -> None:
        _, status = os.waitpid(ours.pid, 0)
        ours.returncode = os.waitstatus_to_exitcode(status)
        seen.set_result(ours.returncode)

    watcher.watch(ours.pid, ended)
    assert ours.stdin is not None
    ours.stdin.write(b"bye")
    ours.stdin.close()  # EOF: it exits 0
    assert await asyncio.wait_for(seen, 10) == 0
    assert len(watcher) == 0
    assert other.wait(5) == 3  # still there for its owner, with its status


async def test_a_child_that_ended_before_it_was_watched_is_found_at_once() -> None:
    loop = asyncio.get_running_loop()
    watcher = ExitWatcher.of(loop)
    assert watcher is not None
    child = subprocess.Popen(["/bin/sh", "-c", "exit 4"])
    assert os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT) is not None  # a zombie already
    seen: asyncio.Future[None] = loop.create_future()
    watcher.watch(child.pid, lambda: seen.set_result(None))  # its SIGCHLD came before: none will again
    await asyncio.wait_for(seen, 10)
    assert child.wait(5) == 4


def test_a_loop_off_the_main_thread_has_no_watcher() -> None:
    """There, SIGCHLD cannot be handled: a session falls back to a pidfd of its own."""
    found: list[ExitWatcher | None] = []

    def run() -> None:
        loop = asyncio.new_event_loop()
        try:
            found.append(ExitWatcher.of(loop))
        finally:
            loop.close()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    assert found == [None]


async def test_a_polled_leader_that_is_a_zombie_has_ended() -> None:
    """An adopted leader is polled, not waited for. Its new parent may be a subreaper that does
    not reap it (as a test runner that ran a supervisor is): its /proc entry stays, a zombie,
    and it has ended all the same."""
    loop = asyncio.get_running_loop()
    zombie = subprocess.Popen(["/bin/sh", "-c", "exit 0"])
    assert os.waitid(os.P_PID, zombie.pid, os.WEXITED | os.WNOWAIT) is not None  # a zombie, unreaped
    seen: asyncio.Future[None] = loop.create_future()
    LeaderPoll.of(loop).watch(zombie.pid, lambda: seen.set_result(None))
    try:
        await asyncio.wait_for(seen, 5)
    finally:
        assert zombie.wait(5) == 0


async def test_a_watched_child_reaped_by_other_code_is_found_by_a_sweep() -> None:
    """Other code in the process reaped a watched child first (an `os.wait()` of a library): no
    second SIGCHLD comes for it, and a pass finds no zombie. The housekeeping's sweep still
    tells its watcher, so its session ends rather than runs forever."""
    loop = asyncio.get_running_loop()
    watcher = ExitWatcher.of(loop)
    assert watcher is not None
    child = subprocess.Popen(["/bin/sh", "-c", "read x"], stdin=subprocess.PIPE)
    seen: asyncio.Future[None] = loop.create_future()
    watcher.watch(child.pid, lambda: seen.set_result(None))
    await asyncio.sleep(0)  # the pass that watch() asked for: nothing has exited yet
    assert not seen.done()
    assert child.stdin is not None
    child.stdin.close()  # EOF: it exits
    assert child.wait(5) == 1  # reaped here, behind the watcher's back (the loop has not run since)
    assert not seen.done()
    watcher.sweep()
    assert seen.done()
    assert len(watcher) == 0


async def test_a_polled_leader_whose_stat_cannot_be_read_has_not_ended(caplog: pytest.LogCaptureFixture) -> None:
    """An adopted leader's end is polled from /proc/PID/stat. With the descriptor table full (a
    burst of spawns) the read fails: that is "cannot tell", not "ended" (its session would end,
    and its tree be killed, under a leader still running). It is said once in the log, looked
    at again, and its real end is still seen once the table has room."""
    loop = asyncio.get_running_loop()
    leader = subprocess.Popen(["sleep", "30"])
    seen: asyncio.Future[None] = loop.create_future()
    try:
        LeaderPoll.of(loop).watch(leader.pid, lambda: seen.set_result(None))
        with caplog.at_level(logging.WARNING), full_table():
            # The poll's first look with the table full: it calls the leader ended, or says it cannot tell.
            deadline = time.monotonic() + 5
            while not seen.done() and "looked for again" not in caplog.text and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            said = caplog.text.count("looked for again")
            ended_blind = seen.done()
        assert not ended_blind, "a leader still running was called ended on a failed read"
        assert said == 1
        assert leader.poll() is None
    finally:
        leader.kill()
    await asyncio.wait_for(seen, 5)  # its real end, seen on a look that can read again
    assert leader.wait(5) == -9


# -- the handler goes with the last supervisor of its loop -------------------------------------------


def _wakeup_fd() -> int:
    """The process's signal wakeup descriptor now (-1: none), left as it was."""
    fd = signal.set_wakeup_fd(-1)
    if fd != -1:
        signal.set_wakeup_fd(fd, warn_on_full_buffer=False)  # as the watcher set it: the loop's close reads it
    return fd


def test_the_sigchld_handler_goes_with_the_last_supervisor_of_its_loop(tmp_path: Path, workspace: Path) -> None:
    """asyncio's loop closes its wakeup pipe before it removes its signal handlers: a child of
    ours ending in between had CPython's C handler write to a closed descriptor (an unraisable
    EBADF), or to the file that has its number by then. So the handler goes with the last
    supervisor of the loop: one closing while another is open leaves it (the other's exits are
    still seen), the last one removes it, a child ending right around its close included, and a
    supervisor opened after it on the same loop installs it again."""

    def settings(name: str) -> Settings:
        return load_settings(env={}, state_dir=tmp_path / name, workspace_root=workspace)

    async def run(opened: list[Supervisor]) -> None:
        first = await Supervisor(settings("first"), warm_shells=0).start()
        opened.append(first)
        second = await Supervisor(settings("second"), warm_shells=0).start()
        opened.append(second)
        session = await first.spawn(SpawnSpec("exit 4"), scope="a")
        assert await session.wait_finished(10)
        await first.aclose()
        assert signal.getsignal(signal.SIGCHLD) != signal.SIG_DFL  # the second one uses it still
        session = await second.spawn(SpawnSpec("exit 5"), scope="a")
        assert await session.wait_finished(10)
        assert session.exit_code == 5
        ending = await second.spawn(SpawnSpec("exit 0"), scope="a")  # ends as its supervisor closes
        await second.aclose()
        assert ending.finished
        assert signal.getsignal(signal.SIGCHLD) == signal.SIG_DFL
        assert _wakeup_fd() == -1  # no descriptor of the loop left for a signal to write to
        assert ExitWatcher.installed(asyncio.get_running_loop()) is None  # and a look installs none
        assert signal.getsignal(signal.SIGCHLD) == signal.SIG_DFL
        third = await Supervisor(settings("third"), warm_shells=0).start()
        opened.append(third)
        assert signal.getsignal(signal.SIGCHLD) != signal.SIG_DFL
        later = await third.spawn(SpawnSpec("exit 7"), scope="a")
        assert await later.wait_finished(10)
        assert later.exit_code == 7
        await third.aclose()
        assert signal.getsignal(signal.SIGCHLD) == signal.SIG_DFL

    async def close(opened: list[Supervisor]) -> None:
        for sup in opened:  # a failed test's (again: nothing)
            await sup.aclose()

    loop = asyncio.new_event_loop()
    opened: list[Supervisor] = []
    try:
        loop.run_until_complete(run(opened))
    finally:
        loop.run_until_complete(close(opened))
        loop.close()


async def test_children_watched_when_the_last_holder_lets_go_are_not_lost() -> None:
    """The last supervisor of the loop lets go while children are still watched (by a session
    that outlived its close, or code of its own): one that has ended, its SIGCHLD not yet
    handled, is found by the last sweep; one still running is polled, and its end is seen."""
    loop = asyncio.get_running_loop()
    watcher = ExitWatcher.of(loop)
    assert watcher is not None
    watcher.hold()
    ended = subprocess.Popen(["/bin/sh", "-c", "exit 3"])
    running = subprocess.Popen(["/bin/sh", "-c", "read x"], stdin=subprocess.PIPE)
    try:
        # Until it is a zombie, blocking: the loop must not run the watcher's pass meanwhile.
        assert os.waitid(os.P_PID, ended.pid, os.WEXITED | os.WNOWAIT) is not None
        seen: list[int] = []
        later: asyncio.Future[None] = loop.create_future()
        watcher.watch(ended.pid, lambda: seen.append(ended.pid))
        watcher.watch(running.pid, lambda: later.set_result(None))
        watcher.release()
        assert seen == [ended.pid]
        assert signal.getsignal(signal.SIGCHLD) == signal.SIG_DFL
        assert running.stdin is not None
        running.stdin.close()  # EOF: it exits
        await asyncio.wait_for(later, 5)
        assert running.wait(5) == 1
    finally:
        running.kill()  # a failed test's: it exited already otherwise
        running.wait(5)
        ended.wait(5)
