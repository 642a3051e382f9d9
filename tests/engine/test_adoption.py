"""Adoption inside one process: a supervisor detaches (its sessions left running to the holder),
the next one of the same owner takes them over; the owner lock; logs rebuilt from their files.
The crash itself (kill -9 of a real server) is tests/transports/test_restarts.py."""

from __future__ import annotations

import asyncio
import os
import re
import resource
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from procpilot.config import Settings, load_settings
from procpilot.engine.adoption import status_line
from procpilot.engine.capture import SessionOutput, Stream
from procpilot.engine.exit_records import probe
from procpilot.engine.limits import Limits
from procpilot.engine.ownership import OwnerLock
from procpilot.engine.spawn import SpawnSpec
from procpilot.engine.states import SessionState
from procpilot.engine.supervisor import Supervisor
from procpilot.engine.trees import ScanTrees
from procpilot.errors import ProcpilotError, StateDirBusy

A = "agent-a"


def test_a_log_rebuilt_from_its_files_reads_and_grows_like_the_one_that_wrote_them(tmp_path: Path) -> None:
    cap = 128 * 1024  # 16 KiB segments: 300 KiB rolls the tail past the cap
    for size in (5_000, 300_000):
        directory = tmp_path / str(size)
        written = SessionOutput(directory, cap)
        for i in range(size // 10):
            written.append(Stream.STDOUT if i % 3 else Stream.STDERR, f"line{i:05d}\n".encode())
        written.mark_closed()
        rebuilt = SessionOutput.recover(directory, cap)
        for stream in Stream:
            old, new = written[stream], rebuilt[stream]
            assert (new.size, new.dropped) == (old.size, old.dropped)
            assert new.read(0).data == old.read(0).data
            if not old.dropped:  # rolled segments took their line count with them (said in recover)
                assert new.total_lines == old.total_lines
                assert new.read_lines(7, 3).lines == old.read_lines(7, 3).lines
        rebuilt.append(Stream.STDOUT, b"after\n")
        view = rebuilt[Stream.COMBINED]
        assert view.read(view.size - 6).data == b"after\n"
        rebuilt.mark_closed()


def test_one_live_server_per_owner(tmp_path: Path) -> None:
    first = OwnerLock(tmp_path, "serve")
    try:
        with pytest.raises(StateDirBusy, match=f"pid {os.getpid()}") as refused:
            OwnerLock(tmp_path, "serve")
        assert refused.value.hints and refused.value.details["owner"] == "serve"
        OwnerLock(tmp_path, "mcp:a/b c").release()  # another owner: no conflict (and any agent id)
    finally:
        first.release()
    OwnerLock(tmp_path, "serve").release()  # free again once released (or its holder died)


async def test_a_detached_supervisors_sessions_are_adopted_with_stdin_output_and_exit(settings: Settings) -> None:
    first = await Supervisor(settings, owner="t").start()
    assert first.can_detach and first.capabilities()["restarts"]["survive"]
    printer = await first.spawn(SpawnSpec("for i in $(seq 1 30); do echo n$i; sleep 0.02; done; exit 5"), scope=A)
    reader = await first.spawn(SpawnSpec("read x; echo got-$x; exit 3"), scope=A)
    tty = await first.spawn(SpawnSpec("cat", pty=True), scope=A)
    await first.wait(A, printer.id, timeout=10, pattern=re.compile("n3"))
    await first.detach()
    await asyncio.sleep(0.3)  # printing goes on into the holder's spool meanwhile
    async with Supervisor(settings, owner="t") as second:
        assert set(second.adopted) == {printer.id, reader.id, tty.id}
        again = second.get(A, printer.id)
        await second.wait(A, printer.id, timeout=10)
        assert again.state is SessionState.EXITED_ERROR and again.exit_code == 5
        text = again.output[Stream.COMBINED].read().data.decode()
        assert text.split() == [f"n{i}" for i in range(1, 31)]  # every line, in order, once

        await second.write(A, reader.id, b"it\n")
        await second.wait(A, reader.id, timeout=10)
        done = second.get(A, reader.id)
        assert (done.state, done.exit_code) == (SessionState.EXITED_ERROR, 3)
        assert b"got-it" in done.output[Stream.COMBINED].read().data

        await second.write(A, tty.id, b"typed\r")
        found = await second.wait(A, tty.id, timeout=10, pattern=re.compile("typed"))
        assert found.reason == "pattern"
    # Leaving the context ended the tty's cat: nothing is left (the leak check says so too).
    assert all(s.finished for s in second.all_sessions())


async def test_two_hundred_sessions_are_adopted_at_once(settings: Settings) -> None:
    first = await Supervisor(settings, owner="t").start()
    started = [await first.spawn(SpawnSpec("sleep 60"), scope=A) for _ in range(200)]
    await first.detach()
    async with Supervisor(settings, owner="t") as second:
        assert sorted(second.adopted) == sorted(s.id for s in started)
        assert all(s.is_running for s in second.list(A))
        one = await second.kill(A, started[0].id, wait=None)
        assert one.state is SessionState.KILLED


HOG = "import time\nchunks=[]\nwhile True:\n    chunks.append(bytearray(8 << 20))\n    time.sleep(0.005)\n"


async def test_a_session_its_memory_limit_ends_while_no_server_runs_is_limit_exceeded(settings: Settings) -> None:
    first = await Supervisor(settings, owner="t").start()
    if first.limit_mechanism == "watchdog":
        await first.aclose()
        pytest.skip("no cgroup enforces memory here: the watchdog does not outlive its server")
    spec = SpawnSpec(f"sleep 0.3; python3 -c {shlex.quote(HOG)}", limits=Limits(memory_bytes=96 << 20))
    hog = await first.spawn(spec, scope=A)
    await first.detach()
    await _ended_in_the_outage(settings, hog.id, within=20)  # the kernel's OOM killer, nobody serving
    async with Supervisor(settings, owner="t") as second:
        await second.wait(A, hog.id, timeout=10)
        ended = second.get(A, hog.id)
        assert ended.state is SessionState.LIMIT_EXCEEDED
        assert ended.accounting.limit_report is not None and ended.accounting.limit_report.oom_killed


def test_the_exit_trap_writes_only_once_its_server_no_longer_owns_the_state_dir(tmp_path: Path) -> None:
    odd = tmp_path / "a dir with 'quotes' and $signs"
    lock = OwnerLock(odd, "serve")
    assert lock.probe_fd is not None
    exit_file = odd / "s.exit"
    line = status_line(exit_file, os.getpid(), lock.probe_fd, lock.path)
    try:
        ran = subprocess.run(["/bin/sh", "-c", f"{line}\nexit 3"], check=False)
        assert ran.returncode == 3 and not exit_file.exists()  # its server is there: it waits for it
    finally:
        lock.release()
    ran = subprocess.run(["/bin/sh", "-c", f"{line}\nexit 3"], check=False)
    assert ran.returncode == 3 and exit_file.read_text() == "3\n"  # nobody holds the lock: recorded


def test_the_owner_lock_is_taken_under_a_descriptor_limit_below_its_probes_usual_number(tmp_path: Path) -> None:
    """A server whose limit is at most the probe's usual number (900: a container's hard limit
    of 512, say) still starts: its probe is another number, and the exit trap reads that one."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    low = 512
    if len(os.listdir("/proc/self/fd")) > low - 16 or hard < low:
        pytest.skip("this process's descriptors do not fit under the low limit")
    resource.setrlimit(resource.RLIMIT_NOFILE, (low, hard))
    try:
        lock = OwnerLock(tmp_path, "serve")
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    exit_file = tmp_path / "s.exit"
    try:
        assert lock.probe_fd is not None and lock.probe_fd < low
        line = status_line(exit_file, os.getpid(), lock.probe_fd, lock.path)
        ran = subprocess.run(["/bin/sh", "-c", f"{line}\nexit 3"], check=False)
        assert ran.returncode == 3 and not exit_file.exists()  # its server is there: it waits for it
    finally:
        lock.release()
    ran = subprocess.run(["/bin/sh", "-c", f"{line}\nexit 3"], check=False)
    assert ran.returncode == 3 and exit_file.read_text() == "3\n"


async def _ended_in_the_outage(settings: Settings, session_id: str, *, within: float) -> None:
    """Until the session's shell has written its exit status (it ended while no server ran), or
    ``within`` seconds: the next server's adoption then reads whatever is there."""
    exit_file = settings.state_dir / "sessions" / f"{session_id}.exit"
    for _ in range(int(within / 0.05)):
        if exit_file.exists():
            return
        await asyncio.sleep(0.05)


def _holder_with(settings: Settings, change: str) -> subprocess.Popen[bytes]:
    """The state directory's holder, started as a server would, with one of its constants changed;
    returns once it listens."""
    from procpilot.engine import holder

    settings.state_dir.mkdir(parents=True)
    sock = settings.state_dir / "holder.sock"
    script = f"import sys; sys.path.insert(0, {os.path.dirname(holder.__file__)!r}); import holder\n"
    script += f"holder.{change}\nsys.exit(holder.main({str(sock)!r}))\n"
    proc = subprocess.Popen([sys.executable, "-I", "-S", "-c", script], stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.read(1) == b"R"
    return proc


async def test_a_holder_of_another_protocol_is_left_alone_and_said_so(settings: Settings) -> None:
    """After an upgrade the old holder still runs: a server that cannot speak its protocol serves
    without it (its own sessions end with it) and neither adopts nor ends what that holder keeps."""
    proc = _holder_with(settings, "PROTOCOL = 0")
    try:
        async with Supervisor(settings, owner="t") as sup:
            restarts = sup.capabilities()["restarts"]
            assert restarts["survive"] is False and "protocol 0" in restarts["why"]
            ran = await sup.run(SpawnSpec("echo still-serves"), scope=A, yield_ms=None)
            assert ran.state is SessionState.EXITED_OK
    finally:
        proc.wait(timeout=10)  # it held nothing and its only server left: it went by itself
        if proc.stdout is not None:
            proc.stdout.close()


async def test_a_holder_keeps_what_ended_in_an_outage_for_the_next_server_a_while_then_goes(
    settings: Settings,
) -> None:
    """An ended session's entry (and the cgroup locks that keep its OOM trace from a starting
    server's sweep) waits for the next server, but not for ever: here half a second."""
    proc = _holder_with(settings, "_KEEP_ENDED = 0.5")
    try:
        first = await Supervisor(settings, owner="t").start()
        ended = await first.spawn(SpawnSpec(("sh", "-c", "sleep 0.3; exit 3")), scope=A)
        await asyncio.sleep(0.2)  # past the batch window: the holder has it
        await first.detach()
        assert await asyncio.to_thread(proc.wait, 15) == 0  # no server came: it let the record go
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
    assert (settings.state_dir / "sessions" / f"{ended.id}.exit.json").exists() == (probe()[0] is not None)
    async with Supervisor(settings, owner="t") as second:
        await second.wait(A, ended.id, timeout=10)
        again = second.get(A, ended.id)
        assert (again.state, again.exit_code) == (SessionState.EXITED_ERROR, 3)


CRASHING_SCAN = """
import asyncio, sys
from pathlib import Path
from procpilot.config import load_settings
from procpilot.engine.spawn import SpawnSpec
from procpilot.engine.supervisor import Supervisor
from procpilot.engine.trees import ScanTrees

async def main():
    settings = load_settings(env={}, state_dir=Path(sys.argv[1]), workspace_root=Path(sys.argv[2]))
    sup = await Supervisor(settings, owner="t", trees=ScanTrees()).start()
    s = await sup.spawn(SpawnSpec("setsid sleep 300 & echo up; sleep 300"), scope="agent-a")
    await sup.wait("agent-a", s.id, timeout=10, pattern=__import__("re").compile("up"))
    await asyncio.sleep(0.2)  # past the holder's batch window
    print(s.id, flush=True)
    await asyncio.sleep(600)

asyncio.run(main())
"""


async def test_without_cgroups_an_adopted_tree_is_found_and_ended_whole(settings: Settings, tmp_path: Path) -> None:
    """The /proc scan fallback: the crashed server's setsid'd grandchild went to init, not to us;
    the marker in its environment still makes it the session's, and the kill reaches it."""
    script = tmp_path / "crash.py"
    script.write_text(CRASHING_SCAN)
    child = subprocess.Popen(
        [sys.executable, str(script), str(settings.state_dir), str(settings.workspace_root)],
        stdout=subprocess.PIPE,
        env={**os.environ, "HOME": str(tmp_path)},
    )
    try:
        assert child.stdout is not None
        session_id = (await asyncio.to_thread(child.stdout.readline)).decode().strip()
    finally:
        child.kill()  # SIGKILL: the crash
        child.wait()
        if child.stdout is not None:
            child.stdout.close()
    async with Supervisor(settings, owner="t", trees=ScanTrees()) as sup:
        assert sup.adopted == [session_id]
        assert len(_carrying(session_id)) >= 3  # sh, its sleep, the setsid'd one
        adopted = await sup.kill(A, session_id, wait=None)
        assert adopted.state is SessionState.KILLED
        assert not _carrying(session_id)


async def test_a_detach_without_cgroups_hands_over_and_keeps_no_descriptor(settings: Settings) -> None:
    """The /proc scan keeps a descriptor for its walk (engine/trees.py): a detach lets it go
    with the rest (the fixture counts this process's descriptors after the test)."""
    first = await Supervisor(settings, owner="t", trees=ScanTrees()).start()
    started = await first.spawn(SpawnSpec('echo up; read a; echo "got $a"'), scope=A)
    await first.wait(A, started.id, timeout=10, pattern=re.compile("up"))
    await first.detach()
    async with Supervisor(settings, owner="t", trees=ScanTrees()) as second:
        adopted = second.get(A, started.id)
        await adopted.write(b"x\n")
        assert await adopted.wait_finished(10)
        assert adopted.output[Stream.COMBINED].read().data == b"up\ngot x\n"


def _carrying(session_id: str) -> list[int]:
    """Live processes whose environment names the session."""
    marker = f"PROCPILOT_SESSION={session_id}".encode()
    found = []
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                if marker in f.read().split(b"\0"):
                    with open(f"/proc/{name}/stat", "rb") as st:
                        if st.read().rsplit(b")", 1)[1].split()[0] != b"Z":
                            found.append(int(name))
        except OSError:
            continue
    return found


async def test_output_past_the_cap_while_no_server_runs_is_counted_not_kept(tmp_path: Path) -> None:
    cap = 64 << 10
    settings = load_settings(env={}, state_dir=tmp_path / "state", workspace_root=tmp_path, exec={"max_log_bytes": cap})
    first = await Supervisor(settings, owner="t").start()
    talker = await first.spawn(SpawnSpec("sleep 0.2; head -c 300000 /dev/zero; echo end"), scope=A)
    await first.detach()  # it prints once no server runs: 300 KB against a spool of 64 KiB
    await _ended_in_the_outage(settings, talker.id, within=10)
    async with Supervisor(settings, owner="t") as second:
        await second.wait(A, talker.id, timeout=10)
        done = second.get(A, talker.id)
        assert (done.state, done.exit_code) == (SessionState.EXITED_OK, 0)  # never blocked, never killed
        view = done.output[Stream.COMBINED]
        assert view.size == 300_004  # every byte is accounted for at its offset...
        assert view.lost == 300_004 - cap  # ...and what the holder could not keep is counted
        note = done.output.lost_note()
        assert note is not None and "while no server ran" in note


async def test_owners_share_a_state_dir_and_its_holder_but_adopt_only_their_own(settings: Settings) -> None:
    daemon = await Supervisor(settings, owner="serve").start()
    stdio = await Supervisor(settings, owner="mcp:a").start()
    mine = await stdio.spawn(SpawnSpec("sleep 30"), scope=A)
    theirs = await daemon.spawn(SpawnSpec("sleep 30"), scope=A)
    await stdio.detach()
    try:
        async with Supervisor(settings, owner="mcp:a") as next_stdio:
            assert next_stdio.adopted == [mine.id]  # the daemon's session is not its to take
            assert daemon.get(A, theirs.id).is_running  # and the daemon's own went on undisturbed
    finally:
        await daemon.aclose()


async def test_waits_in_flight_when_a_server_hands_over_end_with_a_retry_error(settings: Settings) -> None:
    first = await Supervisor(settings, owner="t").start()
    sleeper = await first.spawn(SpawnSpec("sleep 30"), scope=A)
    plain = asyncio.ensure_future(first.wait(A, sleeper.id, timeout=None))
    pattern = asyncio.ensure_future(first.wait(A, sleeper.id, timeout=None, pattern=re.compile("never")))
    await asyncio.sleep(0.05)
    await first.detach()
    for waiting in (plain, pattern):
        with pytest.raises(ProcpilotError, match="handed session") as handed:
            await asyncio.wait_for(waiting, 5)  # at once, not when the session ends
        assert "retry" in handed.value.hints
    async with Supervisor(settings, owner="t") as second:
        assert second.get(A, sleeper.id).is_running
