"""The server's side of the holder (engine/holder_client.py), against a real holder process: it
is started on demand, keeps a session's pipes open across a disconnect, hands them back to the
next server of the same owner, exits once it holds nothing, and its death is heard at once."""

from __future__ import annotations

import asyncio
import os
import select
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from procpilot.engine.holder import SPOOL_HEADER
from procpilot.engine.holder_client import HolderLink, read_spool
from procpilot.engine.spawn import Spawned


def _ended(pid: int, timeout: float) -> bool:
    """Wait for our child ``pid`` (the holder: posix_spawn makes it ours) to exit, and reap it."""
    pidfd = os.pidfd_open(pid)
    try:
        ready, _, _ = select.select([pidfd], [], [], timeout)
    finally:
        os.close(pidfd)
    if ready:
        os.waitpid(pid, 0)
    return bool(ready)


@pytest.fixture
def holders() -> Iterator[list[int]]:
    """Pids of holders a test started: any still running at the end is killed and reaped."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            continue
        _ended(pid, 5)


async def test_the_holder_keeps_a_session_across_a_disconnect_and_hands_it_back(
    tmp_path: Path, holders: list[int]
) -> None:
    link = HolderLink(tmp_path, "owner-a")
    assert link.connect() == []  # a fresh holder holds nothing for us
    assert link.connected and link.problem is None
    holder_pid = link.pid
    assert holder_pid is not None and holder_pid != os.getpid()
    holders.append(holder_pid)

    child = subprocess.Popen(["sh", "-c", 'read line; echo "got $line"'], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert child.stdin is not None and child.stdout is not None
    spawned = Spawned(
        popen=child,
        pid=child.pid,
        pidfd=None,
        stdin_fd=child.stdin.fileno(),
        stdout_fd=child.stdout.fileno(),
        stderr_fd=None,
    )
    spool = tmp_path / "s1" / "outage.spool"
    assert link.add("s1", spawned, spool, 1 << 20, [])
    link.flush()  # the holder has its copies now
    link.close()  # a crash, as the holder sees it: the session was not forgotten

    # Our read end goes: without the holder's copy the child's echo would die of SIGPIPE.
    child.stdout.close()
    child.stdin.write(b"hi\n")
    child.stdin.close()
    assert child.wait(timeout=5) == 0

    link2 = HolderLink(tmp_path, "owner-a")
    held = link2.connect()
    try:
        assert link2.pid == holder_pid  # the same holder, not a new one
        assert [h.id for h in held] == ["s1"]
        one = held[0]
        # What the holder drained is in the spool; what it had not yet is still in the pipe.
        spooled = b"".join(data for tag, data in read_spool(spool) if tag == b"o" and isinstance(data, bytes))
        rest = b""
        if "stdout" in one.fds:
            os.set_blocking(one.fds["stdout"], False)
            try:
                rest = os.read(one.fds["stdout"], 4096)
            except BlockingIOError:
                rest = b""
        assert spooled + rest == b"got hi\n"
        one.close()
        link2.forget("s1")
        link2.flush()
    finally:
        link2.close()
    assert _ended(holder_pid, 5)  # it holds nothing and no server is connected: it exits


async def test_another_owner_gets_nothing_back(tmp_path: Path, holders: list[int]) -> None:
    link = HolderLink(tmp_path, "owner-a")
    link.connect()
    assert link.pid is not None
    holders.append(link.pid)
    child = subprocess.Popen(["sleep", "30"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert child.stdin is not None and child.stdout is not None
        spawned = Spawned(child, child.pid, None, child.stdin.fileno(), child.stdout.fileno(), None)
        link.add("s1", spawned, tmp_path / "s1.spool", 1 << 20, [])
        link.flush()
        link.close()
        other = HolderLink(tmp_path, "owner-b")
        try:
            assert other.connect() == []  # owner-a's session is not handed to owner-b
        finally:
            other.close()
    finally:
        child.kill()
        child.wait()
        child.stdin.close()  # type: ignore[union-attr]
        child.stdout.close()  # type: ignore[union-attr]


async def test_a_holder_that_dies_is_heard_at_once(tmp_path: Path, holders: list[int]) -> None:
    link = HolderLink(tmp_path, "owner-a")
    link.connect()
    pid = link.pid
    assert pid is not None
    holders.append(pid)
    lost = asyncio.Event()
    link.on_lost = lost.set
    os.kill(pid, signal.SIGKILL)
    await asyncio.wait_for(lost.wait(), 5)
    assert not link.connected
    assert link.problem == "the holder exited"
    # Nothing to hand it: a session's add is refused, so the caller knows it would not survive.
    spawned = Spawned(None, os.getpid(), None, None, -1, None)
    assert not link.add("s1", spawned, tmp_path / "s.spool", 1, [])


def test_a_state_directory_too_deep_for_a_socket_is_a_problem_not_an_error(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 120)
    link = HolderLink(deep, "owner-a")
    assert link.connect() == []
    assert not link.connected
    assert link.problem is not None and "too long" in link.problem


def test_read_spool_gives_records_in_order_and_stops_at_a_cut_one(tmp_path: Path) -> None:
    spool = tmp_path / "outage.spool"
    spool.write_bytes(
        SPOOL_HEADER.pack(b"o", 3) + b"out"
        + SPOOL_HEADER.pack(b"e", 3) + b"err"
        + SPOOL_HEADER.pack(b"d", 1234)
        + SPOOL_HEADER.pack(b"o", 10) + b"cut"  # a crash of the holder mid-record
    )  # fmt: skip
    assert list(read_spool(spool)) == [(b"o", b"out"), (b"e", b"err"), (b"d", 1234), (b"o", b"cut")]
    assert list(read_spool(tmp_path / "missing.spool")) == []  # no outage, no records
