"""A hello into a holder whose descriptor table cannot take every copy back at once
(engine/holder.py ``_hello``, engine/stash.py ``room``). A message of its stash received into a
table too small for it would lose the rest (the kernel closes them): a session adopted without
its output end would read as ended while its command printed on, its stdin gone, and no one told.
Instead each session is handed back whole, as room is made by the ones sent before it; one that
cannot be is ended by the next server, which says why (its error, ``capabilities()["restarts"]``).

As in test_holder_full.py, the holder's limit is lowered under it (it raises its soft limit once,
at start) to leave exactly so many descriptors free beside the hello's connection (it takes the
one the first server's connection leaves). A session's copies: three or four (its stdout, stdin
and pidfd; its stderr unless a pty)."""

from __future__ import annotations

import asyncio
import json
import os
import resource
import socket
import subprocess
from pathlib import Path

from procpilot.config import Settings
from procpilot.engine.capture import Stream
from procpilot.engine.holder_client import HolderLink
from procpilot.engine.session import Session
from procpilot.engine.spawn import Spawned, SpawnSpec
from procpilot.engine.supervisor import Supervisor
from tests.conftest import marked_processes, until

A = "agent-a"
SESSIONS = 3


def _fds(pid: int) -> list[int]:
    return sorted(int(name) for name in os.listdir(f"/proc/{pid}/fd"))


def _idle(pid: int) -> bool:
    """Whether the holder sleeps in its poll: every message sent to it before is handled (a
    session's start sends its copies before its id leaves the engine), its copies parked."""
    with open(f"/proc/{pid}/wchan") as wchan:
        return wchan.read() == "do_epoll_wait"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _room_for(pid: int, more: int) -> None:
    """Lower ``pid``'s soft descriptor limit so that exactly ``more`` new descriptors fit."""
    taken = set(_fds(pid))
    free = [fd for fd in range(max(taken) + more + 2) if fd not in taken]
    hard = resource.prlimit(pid, resource.RLIMIT_NOFILE)[1]
    resource.prlimit(pid, resource.RLIMIT_NOFILE, (free[more], hard))


async def _held_then_restarted(settings: Settings, room: int) -> tuple[list[Session], int]:
    """Sessions waiting for a line, held while no server runs (no room to drain them: all stay in
    the holder's stash), the holder left ``room`` free descriptors beside the next one's connection."""
    first = await Supervisor(settings, owner="t").start()
    try:
        started = [await first.spawn(SpawnSpec('echo up; read a; echo "got $a"'), scope=A) for _ in range(SESSIONS)]
        assert await until(lambda: all(s.output[Stream.STDOUT].size == 3 for s in started)), "not all up"
        holder = int(first.capabilities()["restarts"]["holder_pid"])
        assert await until(lambda: _idle(holder)), "the holder did not take the sessions"
        _room_for(holder, room)
    finally:
        await first.detach()
    return started, holder


async def test_a_hello_with_room_for_few_copies_hands_every_session_back_whole(settings: Settings) -> None:
    # Room for one session's copies at a time: the others wait in flight until it is sent and parked.
    started, _ = await _held_then_restarted(settings, 7)
    async with Supervisor(settings, owner="t") as second:
        assert set(second.adopted) == {s.id for s in started}
        adopted = [second.get(A, s.id) for s in started]
        assert [s.error for s in adopted] == [None] * SESSIONS
        for session in adopted:
            await session.write(b"x\n")  # its stdin came back
        for session in adopted:
            assert await session.wait_finished(10), session.id
            # Its output end came back: what it printed after the hello is here, none of it cut.
            assert (session.exit_code, session.output[Stream.COMBINED].read(0, 1 << 16).data) == (0, b"up\ngot x\n")
        assert "unreturned" not in second.capabilities()["restarts"]
    assert not marked_processes()


async def test_copies_sent_back_together_come_back_a_few_at_a_time(
    tmp_path: Path, children: list[subprocess.Popen[bytes]]
) -> None:
    link = HolderLink(tmp_path, "owner-a")
    assert link.connect() == []
    holder = link.pid
    assert holder is not None and link.syncs
    try:
        for number in range(10):
            child = subprocess.Popen(["sleep", "30"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
            children.append(child)
            assert child.stdin is not None and child.stdout is not None
            spawned = Spawned(child, child.pid, None, child.stdin.fileno(), child.stdout.fileno(), None)
            assert link.add(f"s{number}", spawned, tmp_path / f"s{number}.spool", 1 << 20, [])
        link.flush()
        # One is forgotten: the holder opens the bucket its copies share with the other nine's
        # (27: stdout, stdin, pidfd each), which go back in flight. Sent back as one message,
        # a hello would need room for all 27 to take any of them out.
        link.forget("s9")
        link.flush()
        link.sync()  # handled
        _room_for(holder, 0)  # no drain when its server goes: every copy stays in flight
    finally:
        link.close()
    assert await until(lambda: _idle(holder)), "the holder did not see its server go"
    _room_for(holder, 20)
    again = HolderLink(tmp_path, "owner-a")
    held = again.connect()
    try:
        assert again.pid == holder
        assert sorted((h.id, sorted(h.fds)) for h in held) == [(f"s{n}", ["stdin", "stdout"]) for n in range(9)]
        assert again.unreturned == {}
    finally:
        for one in held:
            one.close()
            again.forget(one.id)
        again.flush()
        again.close()


async def test_sessions_the_holder_has_no_room_to_hand_back_are_ended_and_say_why(settings: Settings) -> None:
    # Room for one descriptor: no session's copies come back into the table whole.
    started, holder = await _held_then_restarted(settings, 1)
    async with Supervisor(settings, owner="t") as second:
        adopted = [second.get(A, s.id) for s in started]
        for session in adopted:
            assert await session.wait_finished(10), session.id
        errors = {s.error for s in adopted}
        assert len(errors) == 1, errors
        why = errors.pop()
        assert why is not None and why.startswith("this server could not take it over, so it was ended: "), why
        assert f"holder (pid {holder})" in why and "descriptor table" in why, why
        assert all(s.exit_code != 0 for s in adopted)  # ended by this server, not run to their end
        # Said where an operator looks (procpilot doctor), with the same reason.
        told = second.capabilities()["restarts"]["unreturned"]
        assert told["sessions"] == SESSIONS and sorted(told["ids"]) == sorted(s.id for s in started)
        assert why.endswith(told["why"])
    # Forgotten at the holder: it kept nothing of them for a next server, so with this one gone it exits.
    assert await until(lambda: not _alive(holder)), _fds(holder)
    assert not marked_processes()


async def test_a_holder_with_no_descriptor_free_still_answers_the_next_server(settings: Settings) -> None:
    first = await Supervisor(settings, owner="t").start()
    try:
        started = await first.spawn(SpawnSpec('echo up; read a; echo "got $a"'), scope=A)
        holder = int(first.capabilities()["restarts"]["holder_pid"])
        assert await until(lambda: _idle(holder)), "the holder did not take the session"
        _room_for(holder, 0)  # no drain in the outage either
        connected = len(_fds(holder))
    finally:
        await first.detach()
    assert await until(lambda: len(_fds(holder)) < connected and _idle(holder)), "the holder did not see its server go"
    _room_for(holder, 0)  # not even the next server's connection fits: it comes on the holder's spare
    async with Supervisor(settings, owner="t") as second:
        restarts = second.capabilities()["restarts"]
        assert restarts["survive"] is True and restarts["holder_pid"] == holder, restarts
        assert restarts["unreturned"]["ids"] == [started.id], restarts
        gone = second.get(A, started.id)
        assert await gone.wait_finished(10)
        assert gone.error == f"this server could not take it over, so it was ended: {restarts['unreturned']['why']}"
    assert not marked_processes()


def _cpu_ticks(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime and stime


async def test_a_holder_with_its_spare_spent_waits_for_a_descriptor_asleep_then_answers(tmp_path: Path) -> None:
    first = HolderLink(tmp_path, "owner-a")
    assert first.connect() == []
    holder = first.pid
    assert holder is not None
    second = HolderLink(tmp_path, "owner-b")
    third = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        _room_for(holder, 0)
        assert second.connect() == [] and second.pid == holder  # on the spare
        third.connect(first.path)  # queued by the kernel; the holder has nothing to accept it with
        third.sendall(json.dumps({"op": "hello", "owner": "owner-c"}).encode())
        assert await until(lambda: _idle(holder)), "the holder is not asleep"
        before = _cpu_ticks(holder)
        await asyncio.sleep(0.3)  # a span to measure, not to wait for anything
        assert _cpu_ticks(holder) - before <= 3, "the holder spins on a listener it cannot accept from"
        second.close()  # a descriptor free again: a spare, then the waiting server is answered
        third.settimeout(5)
        assert json.loads(third.recv(1 << 16))["op"] == "end"
    finally:
        third.close()
        second.close()
        first.close()
