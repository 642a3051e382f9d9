"""A holder started while sessions run (the last one died: killed, OOM) inherits none of their
descriptors. The server starts it with ``posix_spawn``, which closes only what is close-on-exec;
a descriptor received with SCM_RIGHTS (a stdin taken back from the stash for a write, an
adopted session's ends from the hello) is not, unless asked for. An inherited stdin write end
is one the holder does not know it has: the session's command never sees EOF."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
from pathlib import Path

from procpilot.config import Settings
from procpilot.engine.capture import Stream
from procpilot.engine.holder_client import HolderLink
from procpilot.engine.spawn import Spawned, SpawnSpec
from procpilot.engine.supervisor import Supervisor
from tests.conftest import marked_processes, until

A = "agent-a"


def _held_by_a_new_holder(sup: Supervisor, old: int) -> bool:
    restarts = sup.capabilities()["restarts"]
    return restarts["survive"] is True and restarts.get("holder_pid") not in (None, old)


async def test_a_holder_started_while_sessions_run_inherits_none_of_their_descriptors(settings: Settings) -> None:
    async with Supervisor(settings, owner="t") as sup:
        session = await sup.spawn(SpawnSpec('cat; echo "eof seen"'), scope=A)
        spawned = session.run.spawned
        assert spawned is not None
        assert await until(lambda: spawned.stdin_fd is None)  # its stdin parked in the stash
        await session.write(b"hi\n")  # and received back from it, for the write
        old = sup.capabilities()["restarts"]["holder_pid"]
        os.kill(old, signal.SIGKILL)
        assert await until(lambda: _held_by_a_new_holder(sup, old)), sup.capabilities()["restarts"]
        # The command sees EOF once its stdin is closed: no copy lives on in the new holder.
        await session.write(b"", eof=True)
        assert await session.wait_finished(5), "cat never saw EOF"
        assert session.output[Stream.COMBINED].read(0, 1 << 16).data == b"hi\neof seen\n"
    assert not marked_processes()


async def test_what_the_hello_hands_back_is_close_on_exec(tmp_path: Path) -> None:
    """An adopted session's ends, received from the holder, are not inherited by a process the
    server starts (the next holder)."""
    link = HolderLink(tmp_path, "owner-a")
    link.connect()
    holder = link.pid
    child = subprocess.Popen(["sleep", "30"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert child.stdin is not None and child.stdout is not None and child.stderr is not None
        ends = (child.stdin.fileno(), child.stdout.fileno(), child.stderr.fileno())
        assert link.add("s1", Spawned(child, child.pid, None, *ends), tmp_path / "s1.spool", 1 << 20, [])
        link.flush()
        link.close()
        again = HolderLink(tmp_path, "owner-a")
        held = again.connect()
        try:
            assert again.pid == holder
            assert [sorted(h.fds) for h in held] == [["stderr", "stdin", "stdout"]]
            assert [role for role, fd in held[0].fds.items() if os.get_inheritable(fd)] == []
        finally:
            for one in held:
                one.close()
            again.forget("s1")
            again.flush()
            again.close()
    finally:
        child.kill()
        child.wait()
        for pipe in (child.stdin, child.stdout, child.stderr):
            if pipe is not None:
                pipe.close()
    assert holder is not None and _ended(holder)


def _ended(pid: int) -> bool:
    """Our child ``pid`` (a holder HolderLink started) exited within 5 s (and is reaped)."""
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True  # gone, and reaped already
    try:
        ready, _, _ = select.select([pidfd], [], [], 5)
    finally:
        os.close(pidfd)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)
    return bool(ready)
