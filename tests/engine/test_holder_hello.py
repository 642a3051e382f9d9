"""A holder hands back more sessions than its descriptor table could hold at once: their copies
wait in flight in its stash and come into the table a chunk of sessions at a time for the hello
(engine/holder.py, ``_CHUNK``), each chunk parked again once sent. The next server gets every
session whole: its output read ends and its stdin."""

from __future__ import annotations

import resource

from procpilot.config import Settings
from procpilot.engine.capture import Stream
from procpilot.engine.spawn import SpawnSpec
from procpilot.engine.supervisor import Supervisor
from tests.conftest import marked_processes, until

A = "agent-a"
# Four copies a session (stdout, stderr, stdin, pidfd): 560 in all, past a holder limit of 520.
# A chunk of 64 sessions (256 copies), with a bucket of its stash opened beside them (200), fits.
SESSIONS, HOLDER_LIMIT = 140, 520


async def test_a_hello_hands_back_more_sessions_than_the_holders_table_holds_at_once(settings: Settings) -> None:
    first = await Supervisor(settings, owner="t").start()
    try:
        started = [await first.spawn(SpawnSpec('echo up; read a; echo "got $a"'), scope=A) for _ in range(SESSIONS)]
        assert await until(lambda: all(s.output[Stream.STDOUT].size == 3 for s in started)), "not all up"
        holder = first.capabilities()["restarts"]["holder_pid"]
        hard = resource.prlimit(holder, resource.RLIMIT_NOFILE)[1]
        resource.prlimit(holder, resource.RLIMIT_NOFILE, (HOLDER_LIMIT, hard))
    finally:
        await first.detach()
    async with Supervisor(settings, owner="t") as second:
        assert set(second.adopted) == {s.id for s in started}
        adopted = [second.get(A, s.id) for s in started]
        assert all(s.is_running for s in adopted)
        for session in adopted:
            await session.write(b"x\n")
        for session in adopted:
            assert await session.wait_finished(10), session.id
            assert session.exit_code == 0
            assert session.output[Stream.COMBINED].read(0, 1 << 16).data == b"up\ngot x\n", session.id
    assert not marked_processes()
