"""When the holder exits (engine/holder.py): once it holds nothing and no server is connected
(one that no server reached, after its idle period), and never while a server is connected or
while it holds a session, running or ended, however long it is idle. After it exits, the next
server starts another and everything works as before.

The holder here is started by the test, as a server would start it, with its idle period
shortened through its internal environment variable (``IDLE_EXIT_ENV``, 10 s in a server); the
test plays "the server that started it" and connects (or not) with a real ``HolderLink``."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from procpilot.config import Settings
from procpilot.engine import holder as holder_module
from procpilot.engine.capture import Stream
from procpilot.engine.holder_client import HolderLink, read_spool
from procpilot.engine.spawn import Spawned, SpawnSpec
from procpilot.engine.supervisor import Supervisor
from tests.conftest import marked_processes, until

A = "agent-a"
_IDLE = 0.1  # the holder's idle period here (seconds)
_WINDOW = 4 * _IDLE  # idle for longer than that, and still running: not a close call


@pytest.fixture
def started() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Holders a test started: any still running at the end is killed and reaped."""
    holders: list[subprocess.Popen[bytes]] = []
    yield holders
    for holder in holders:
        if holder.poll() is None:
            holder.kill()
            holder.wait()


def _start_holder(state_dir: Path, started: list[subprocess.Popen[bytes]]) -> subprocess.Popen[bytes]:
    """A holder for ``state_dir``, started as a server starts one (by path, ``-I -S``, in a
    session of its own), once it listens."""
    state_dir.mkdir(parents=True, exist_ok=True)
    env = {"PATH": os.environ.get("PATH", os.defpath), "LANG": "C.UTF-8", holder_module.IDLE_EXIT_ENV: str(_IDLE)}
    holder = subprocess.Popen(
        [sys.executable, "-I", "-S", holder_module.__file__, str(state_dir / "holder.sock")],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=env,
        start_new_session=True,
    )
    started.append(holder)
    assert holder.stdout is not None
    with holder.stdout:
        assert holder.stdout.read(1) == b"R"  # it listens
    return holder


def _stays(holder: subprocess.Popen[bytes]) -> None:
    """``holder`` is still running after several of its idle periods."""
    with pytest.raises(subprocess.TimeoutExpired):
        holder.wait(timeout=_WINDOW)


def _spooled(spool: Path) -> bytes:
    return b"".join(data for tag, data in read_spool(spool) if tag == b"o" and isinstance(data, bytes))


async def test_a_holder_no_server_reaches_exits_after_its_idle_period_and_the_next_server_starts_another(
    settings: Settings, started: list[subprocess.Popen[bytes]]
) -> None:
    before = time.monotonic()
    holder = _start_holder(settings.state_dir, started)  # and its server died before connecting
    assert holder.wait(timeout=5) == 0
    assert time.monotonic() - before >= _IDLE  # it waited for a server first
    assert not (settings.state_dir / "holder.sock").exists()

    first = await Supervisor(settings, owner="t").start()
    try:
        restarts = first.capabilities()["restarts"]
        assert restarts["survive"] is True, restarts
        assert restarts["holder_pid"] not in (None, holder.pid)  # a new one
        session = await first.spawn(SpawnSpec('echo up; read a; echo "got $a"'), scope=A)
    finally:
        await first.detach()
    # The new holder kept it across the hand-over: the next server adopts it whole.
    async with Supervisor(settings, owner="t") as second:
        adopted = second.get(A, session.id)
        await adopted.write(b"x\n")
        assert await adopted.wait_finished(10)
        assert adopted.exit_code == 0
        assert adopted.output[Stream.COMBINED].read(0, 1 << 16).data == b"up\ngot x\n"
    assert not marked_processes()


async def test_a_holder_does_not_exit_while_a_server_is_connected_however_long_it_is_idle(
    tmp_path: Path, started: list[subprocess.Popen[bytes]]
) -> None:
    holder = _start_holder(tmp_path, started)
    link = HolderLink(tmp_path, "owner-a")
    try:
        assert link.connect() == []  # it holds nothing
        assert link.pid == holder.pid
        _stays(holder)
        assert link.connected
    finally:
        link.close()
    assert holder.wait(timeout=5) == 0  # its server gone, nothing held: it goes


async def test_a_holder_does_not_exit_while_it_holds_a_session_however_long_no_server_comes(
    tmp_path: Path, started: list[subprocess.Popen[bytes]]
) -> None:
    holder = _start_holder(tmp_path, started)
    link = HolderLink(tmp_path, "owner-a")
    assert link.connect() == []
    child = subprocess.Popen(["sh", "-c", 'read line; echo "got $line"'], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert child.stdin is not None and child.stdout is not None
    spawned = Spawned(child, child.pid, None, child.stdin.fileno(), child.stdout.fileno(), None)
    spool = tmp_path / "s1" / "outage.spool"
    try:
        assert link.add("s1", spawned, spool, 1 << 20, [])
        link.flush()
        link.close()  # a crash, as the holder sees it: the session was not forgotten
        child.stdout.close()  # the holder's copy is the pipe's only reader now
        _stays(holder)  # a running session, no server
        child.stdin.write(b"hi\n")
        child.stdin.close()
        assert child.wait(timeout=5) == 0  # its echo had a reader: no SIGPIPE
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert await until(lambda: _spooled(spool) == b"got hi\n")  # drained by the holder
    _stays(holder)  # an ended session, kept for the next server: still no server

    link2 = HolderLink(tmp_path, "owner-a")
    try:
        held = link2.connect()
        assert link2.pid == holder.pid
        assert [(h.id, h.exited) for h in held] == [("s1", True)]
        for one in held:
            one.close()
        link2.forget("s1")
        link2.flush()
    finally:
        link2.close()
    assert holder.wait(timeout=5) == 0  # nothing held, nobody connected: it goes
