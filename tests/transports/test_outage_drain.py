"""The holder's drain in an outage is bounded by its descriptor limit (engine/holder.py): a real
daemon killed -9 with more sessions than that limit has room for. The holder drains as many as
fit (their output pipes and pidfd in its table, their output into their spools); the rest wait
in flight, unread, their commands blocked on a full pipe, and the next server gets every one
back with its whole output, in order, nothing left running."""

from __future__ import annotations

import contextlib
import functools
import os
import resource
import time
from collections.abc import Callable
from pathlib import Path

import httpx2

from procpilot.config import load_settings
from procpilot.engine import holder
from procpilot.engine.capture import Stream
from procpilot.engine.holder_client import read_spool
from procpilot.engine.supervisor import Supervisor
from tests.conftest import marked_processes
from tests.daemon import end_all_left, marked, post, start_daemon

SESSIONS, DRAINED = 8, 3
PIPE = 1 << 20  # a session's output pipe (engine/spawn.py): a writer past it blocks until it is read
# More than the pipe holds, one line of 121 bytes at a time: numbered, so order is checked too.
LINES = 9000
OUT = b"".join(b"%0120d\n" % i for i in range(1, LINES + 1))
AGENT = "agent-a"


def _until(check: Callable[[], bool], what: str, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.02)


def _fds(pid: int) -> list[str]:
    found = []
    for name in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(FileNotFoundError):
            found.append(os.readlink(f"/proc/{pid}/fd/{name}"))
    return found


def _writer(session_id: str) -> int | None:
    """The session's ``seq``: the process that writes its output."""
    for pid in marked(session_id):
        with contextlib.suppress(FileNotFoundError):
            if Path(f"/proc/{pid}/comm").read_text().strip() == "seq":
                return pid
    return None


def _written(pid: int) -> int:
    for line in Path(f"/proc/{pid}/io").read_text().splitlines():
        if line.startswith("wchar:"):
            return int(line.split()[1])
    raise AssertionError("no wchar")


def _said_up(c: httpx2.Client, session_id: str) -> bool:
    return "up" in post(c, "process", action="poll", sessionId=session_id).json()["text"]


def _blocked(session_id: str) -> bool:
    """Whether the session's writer has filled its pipe; an error if the session died."""
    assert marked(session_id), f"{session_id} died in the outage"
    writer = _writer(session_id)
    return writer is not None and _written(writer) >= PIPE


def _spooled(spool: Path) -> bytes:
    return b"".join(data for tag, data in read_spool(spool) if tag == b"o" and isinstance(data, bytes))


async def test_an_outage_drains_what_the_holders_limit_has_room_for_and_the_rest_waits_unread(tmp_path: Path) -> None:
    root = tmp_path / "d"
    gate = root / "go"  # each session waits on this FIFO until the test opens it, after the kill
    first = start_daemon(root)
    os.mkfifo(gate)
    command = f"echo up; : < {gate}; seq -f '%0120.0f' 1 {LINES}; echo done >&2"
    opened: int | None = None
    try:
        with first.http() as c:
            ids = []
            for _ in range(SESSIONS):
                data = post(c, "exec", command=command, background=True).json()["data"]
                assert data["status"] == "running", data
                ids.append(str(data["sessionId"]))
            for sid in ids:
                _until(functools.partial(_said_up, c, sid), f"{sid} to start")
            holder_pid = int(c.get("/v1/capabilities").json()["restarts"]["holder_pid"])
        # Every session's copies are in the holder's stash (its one socket pair, 32 descriptors
        # in flight): its table holds only its own from now on.
        _until(lambda: sum(f.startswith("socket:") for f in _fds(holder_pid)) >= 4, "the holder's stash")
        assert not any(f.startswith("pipe:") or "pidfd" in f for f in _fds(holder_pid))
        # Its limit, lowered so that DRAINED sessions' output pipes and pidfd (3 each) fit in
        # the room an outage leaves (holder.SPARE_FDS kept free), and a third of one more: the
        # table as counted at the disconnect (its connection closed, the count's own directory
        # open) is this one.
        in_table = len(_fds(holder_pid))
        soft = in_table + holder.SPARE_FDS + 3 * DRAINED + 1
        hard = resource.prlimit(holder_pid, resource.RLIMIT_NOFILE)[1]
        resource.prlimit(holder_pid, resource.RLIMIT_NOFILE, (soft, hard))

        first.proc.kill()
        first.proc.wait()
        # The drain: these sessions' pidfds in its table (a bucket opened for them brings the
        # rest in for a moment: counted once the count holds still).
        counts = [-1]

        def settled() -> bool:
            counts.append(sum("pidfd" in f for f in _fds(holder_pid)))
            return counts[-1] > 0 and counts[-1] == counts[-2]

        _until(settled, "the drain to begin")
        assert counts[-1] == DRAINED, f"drained {counts[-1]} sessions, room for {DRAINED}"
        opened = os.open(gate, os.O_RDWR)  # every session prints its lines now, nobody serving
        spools = {sid: root / "state" / "sessions" / sid / holder.SPOOL_NAME for sid in ids}
        _until(lambda: len([s for s in ids if _spooled(spools[s]) == OUT]) == DRAINED, "the drained ones' output")
        drained = [sid for sid in ids if spools[sid].exists()]
        waiting = [sid for sid in ids if sid not in drained]
        assert len(drained) == DRAINED and len(waiting) == SESSIONS - DRAINED
        _until(lambda: not any(marked(s) for s in drained), "the drained ones to end")
        # The rest: their command blocked on a full pipe nobody reads, its output in flight, lost
        # to nobody; nothing of theirs in the holder's table.
        for sid in waiting:
            _until(functools.partial(_blocked, sid), f"{sid}'s writer to fill its pipe")
        for sid in waiting:
            writer = _writer(sid)
            assert writer is not None and _written(writer) == PIPE, f"{sid}'s writer went past its pipe"
        assert not any(spools[s].exists() for s in waiting)
        assert sum(f.startswith("pipe:") for f in _fds(holder_pid)) == 0  # the drained ones' closed at EOF

        # The next server: every session back, every byte of each, in order, and how it ended.
        settings = load_settings(root / "procpilot.toml", env={})
        async with Supervisor(settings, owner="serve") as second:
            assert set(second.adopted) == set(ids)
            for sid in ids:
                session = second.get(AGENT, sid)
                assert await session.wait_finished(20), sid
                assert session.exit_code == 0, (sid, session.state)
                assert session.output[Stream.STDOUT].read(0, 1 << 24).data == b"up\n" + OUT, sid
                assert session.output[Stream.STDERR].read(0, 1 << 24).data == b"done\n", sid
        assert not marked_processes()
    finally:
        if opened is not None:
            os.close(opened)
        if first.proc.poll() is None:
            first.proc.kill()
            first.proc.wait()
        end_all_left(root)
