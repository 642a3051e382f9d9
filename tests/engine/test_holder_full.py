"""A holder whose descriptor table is full (engine/holder.py): the copies of new sessions it
cannot receive whole are refused, and their server is told. Such a session runs on under its
server, nothing of it lost there, but it says that it would not survive a crash of that server,
and why (its view, ``capabilities()["restarts"]``, its record); the next server, finding it
gone, says the same. And a holder that a server takes sessions back from keeps no pidfd in its
table that nothing watches.

A table fills for real where the holder's copies cannot wait in flight (an unprivileged user's
in-flight cap, docs/performance.md); here its limit is lowered under it instead (it raises its
soft limit once, at start), to the lowest descriptor number it has free: nothing more fits."""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import subprocess
import threading
from pathlib import Path

import pytest

from procpilot.config import Settings
from procpilot.engine.capture import Stream
from procpilot.engine.holder import SPARE_FDS
from procpilot.engine.holder_client import HolderLink
from procpilot.engine.spawn import Spawned, SpawnSpec
from procpilot.engine.supervisor import Supervisor
from procpilot.faces.exec_process import exec_process_tools
from tests.conftest import marked_processes, until

A = "agent-a"


def _fds(pid: int) -> list[int]:
    return sorted(int(name) for name in os.listdir(f"/proc/{pid}/fd"))


def _room_for(pid: int, more: int) -> None:
    """Lower ``pid``'s soft descriptor limit so that exactly ``more`` new descriptors fit."""
    taken = set(_fds(pid))
    free = [fd for fd in range(max(taken) + more + 2) if fd not in taken]
    hard = resource.prlimit(pid, resource.RLIMIT_NOFILE)[1]
    resource.prlimit(pid, resource.RLIMIT_NOFILE, (free[more], hard))


def _pidfds(pid: int) -> int:
    found = 0
    for fd in _fds(pid):
        try:
            found += os.readlink(f"/proc/{pid}/fd/{fd}") == "anon_inode:[pidfd]"
        except FileNotFoundError:
            continue
    return found


def _not_held(supervisor: Supervisor) -> int:
    """How many running sessions the server says the holder refused."""
    return int(supervisor.capabilities()["restarts"].get("not_held", {}).get("sessions", 0))


async def test_sessions_a_full_holder_cannot_take_run_on_and_say_they_would_not_survive(settings: Settings) -> None:
    first = await Supervisor(settings, owner="t").start()
    try:
        holder = first.capabilities()["restarts"]["holder_pid"]
        _room_for(holder, 0)
        runs_on = await first.spawn(SpawnSpec('echo up; read a; echo "got $a"'), scope=A)
        left = await first.spawn(SpawnSpec("echo up; sleep 30"), scope=A)
        # Told, not silent: each says why, and so do the server's capabilities (procpilot doctor).
        assert await until(lambda: _not_held(first) == 2), first.capabilities()["restarts"]
        restarts = first.capabilities()["restarts"]
        why = restarts["not_held"]["why"]
        assert f"holder (pid {holder})" in why and "descriptor table" in why, why
        assert restarts["survive"] is True  # the holder runs and keeps what it could take
        assert restarts["not_held"] == {"sessions": 2, "ids": sorted([runs_on.id, left.id]), "why": why}
        _, process = exec_process_tools(first)
        poll = await process.call({"action": "poll", "sessionId": left.id}, A)
        assert poll.data["survive"] is False and poll.data["surviveWhy"] == why
        # Nothing of it is lost under this server: its stdin, its output, its exit.
        await runs_on.write(b"x\n")
        assert await runs_on.wait_finished(10)
        assert runs_on.exit_code == 0
        assert runs_on.output[Stream.COMBINED].read(0, 1 << 16).data == b"up\ngot x\n"
        assert first.capabilities()["restarts"]["not_held"]["ids"] == [left.id]  # only the running one
    finally:
        await first.detach()
    # The next server finds it gone (its pipes died with the first server) and says why.
    async with Supervisor(settings, owner="t") as second:
        gone = second.get(A, left.id)
        assert await gone.wait_finished(10)
        assert gone.error == f"it did not survive its server: {why}", gone.error
        assert "not_held" not in second.capabilities()["restarts"]
    assert not marked_processes()


async def test_a_refused_session_is_offered_again_and_survives_once_the_holder_has_room(settings: Settings) -> None:
    first = await Supervisor(settings, owner="t").start()
    try:
        holder = first.capabilities()["restarts"]["holder_pid"]
        limit = resource.prlimit(holder, resource.RLIMIT_NOFILE)
        _room_for(holder, 0)
        refused = await first.spawn(SpawnSpec('echo up; read a; echo "got $a"'), scope=A)
        assert await until(lambda: _not_held(first) == 1), first.capabilities()["restarts"]
        resource.prlimit(holder, resource.RLIMIT_NOFILE, limit)  # room again (an ended session's, say)
        # The next session to end is when the server offers it again, and the holder takes it now.
        assert (await first.run(SpawnSpec("true"), scope=A, yield_ms=None)).exit_code == 0
        assert await until(lambda: _not_held(first) == 0, timeout=5), first.capabilities()["restarts"]
        _, process = exec_process_tools(first)
        poll = await process.call({"action": "poll", "sessionId": refused.id}, A)
        assert "survive" not in poll.data and "surviveWhy" not in poll.data  # said only when false
    finally:
        await first.detach()
    # It outlives its server: the next one takes it over with its stdin and its output.
    async with Supervisor(settings, owner="t") as second:
        again = second.get(A, refused.id)
        assert again.is_running
        await second.write(A, refused.id, b"x\n")
        assert await again.wait_finished(10) and again.exit_code == 0
        assert again.output[Stream.COMBINED].read(0, 1 << 16).data == b"up\ngot x\n"
    assert not marked_processes()


async def test_a_session_refused_again_is_offered_less_often_and_said_once(
    settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    first = await Supervisor(settings, owner="t").start()
    try:
        _room_for(first.capabilities()["restarts"]["holder_pid"], 0)
        left = await first.spawn(SpawnSpec("sleep 30"), scope=A)
        assert await until(lambda: _not_held(first) == 1)
        journal = settings.engine.state_dir / "sessions.jsonl"
        records = journal.read_text().count(left.id)
        caplog.clear()
        # A session's end: it is offered again at once, and refused again (still no room).
        await first.run(SpawnSpec("true"), scope=A, yield_ms=None)
        assert await until(lambda: first._reoffer_every == 2.0), "a refusal again must slow the offers"
        assert _not_held(first) == 1
        assert not [r for r in caplog.records if "would not survive" in r.getMessage()]  # said once, at first
        assert journal.read_text().count(left.id) == records  # and recorded once
        await first.kill(A, left.id, wait=None)
    finally:
        await first.aclose()


async def test_a_hand_over_hears_what_the_holder_refused_before_it_leaves_the_record(settings: Settings) -> None:
    first = await Supervisor(settings, owner="t").start()
    holder = first.capabilities()["restarts"]["holder_pid"]
    _room_for(holder, 0)
    # The holder answers late: stopped until the hand-over has begun, so a server that did not
    # wait for its answer would be gone before it came.
    os.kill(holder, signal.SIGSTOP)
    resume = threading.Timer(0.2, os.kill, (holder, signal.SIGCONT))
    try:
        left = await first.spawn(SpawnSpec("echo up; sleep 30"), scope=A)
        resume.start()
        await first.detach()
    finally:
        resume.cancel()
        # Resumed already, its server gone and nothing of it held: it may have exited by now.
        with contextlib.suppress(ProcessLookupError):
            os.kill(holder, signal.SIGCONT)
    async with Supervisor(settings, owner="t") as second:
        gone = second.get(A, left.id)
        assert await gone.wait_finished(10)
        assert gone.error is not None and gone.error.startswith("it did not survive its server: the holder (pid")
        assert "descriptor table" in gone.error, gone.error
    assert not marked_processes()


async def test_a_batch_the_holder_can_take_in_part_keeps_the_whole_sessions_and_refuses_the_rest(
    tmp_path: Path, children: list[subprocess.Popen[bytes]]
) -> None:
    link = HolderLink(tmp_path, "owner-a")
    assert link.connect() == []
    holder = link.pid
    assert holder is not None
    refused: list[tuple[list[str], str]] = []
    link.on_refused = lambda ids, why: refused.append((ids, why))
    for _ in range(3):
        child = subprocess.Popen(["sleep", "30"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        children.append(child)
    # Each session's copies: its stdout, its stdin and a pidfd. Room for one and a half.
    _room_for(holder, 4)
    try:
        for number, child in enumerate(children, 1):
            assert child.stdin is not None and child.stdout is not None
            spawned = Spawned(child, child.pid, None, child.stdin.fileno(), child.stdout.fileno(), None)
            assert link.add(f"s{number}", spawned, tmp_path / f"s{number}.spool", 1 << 20, [])
        link.flush()  # one message: all three sessions' descriptors
        assert await until(lambda: bool(refused))
        assert [ids for ids, _ in refused] == [["s2", "s3"]]
    finally:
        link.close()
    # What it kept, it hands back whole: the first session, and only it.
    hard = resource.prlimit(holder, resource.RLIMIT_NOFILE)[1]
    resource.prlimit(holder, resource.RLIMIT_NOFILE, (hard, hard))
    again = HolderLink(tmp_path, "owner-a")
    held = again.connect()
    try:
        assert again.pid == holder
        assert [(h.id, sorted(h.fds)) for h in held] == [("s1", ["stdin", "stdout"])]
        for one in held:
            one.close()
            again.forget(one.id)
        again.flush()
    finally:
        again.close()


async def test_a_holder_keeps_no_pidfd_in_its_table_for_a_session_it_does_not_watch(settings: Settings) -> None:
    first = await Supervisor(settings, owner="t").start()
    try:
        started = [await first.spawn(SpawnSpec('echo up; read a; echo "got $a"'), scope=A) for _ in range(3)]
        assert await until(lambda: all(s.output[Stream.STDOUT].size == 3 for s in started)), "not all up"
        holder = first.capabilities()["restarts"]["holder_pid"]
        _, process = exec_process_tools(first)
        poll = await process.call({"action": "poll", "sessionId": started[0].id}, A)
        assert "survive" not in poll.data and "not_held" not in first.capabilities()["restarts"]  # held
        # No room for an outage's drain (holder.SPARE_FDS are kept free): every session stays in
        # flight, undrained, its exit unwatched.
        taken = len(_fds(holder))
        hard = resource.prlimit(holder, resource.RLIMIT_NOFILE)[1]
        resource.prlimit(holder, resource.RLIMIT_NOFILE, (taken + SPARE_FDS, hard))
    finally:
        await first.detach()
    async with Supervisor(settings, owner="t") as second:
        assert set(second.adopted) == {s.id for s in started}
        assert _pidfds(holder) == 0
        for session in started:
            adopted = second.get(A, session.id)
            await adopted.write(b"x\n")
            assert await adopted.wait_finished(10)
            assert adopted.output[Stream.COMBINED].read(0, 1 << 16).data == b"up\ngot x\n"
    assert not marked_processes()
