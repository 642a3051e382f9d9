"""Quiet sessions' output ends parked out of the descriptor table (engine/output_parking.py): a
server holds more running sessions than its limit allows at two descriptors each, and a parked
session's output, exit and kill are as any other's."""

from __future__ import annotations

import os
import resource
import shutil
import signal
import tempfile
from pathlib import Path

import pytest

from procpilot.config import Settings
from procpilot.engine import output_parking
from procpilot.engine.capture import Stream
from procpilot.engine.session import Session
from procpilot.engine.spawn import SpawnSpec
from procpilot.engine.states import SessionState
from procpilot.engine.supervisor import Supervisor
from tests.conftest import marked_processes, run_script, until

_SWEEP = 0.02  # seconds between sweeps here (1 s in a server)


def _park_everything(sup: Supervisor) -> None:
    """Park every quiet session after one quiet sweep, however few run (a server waits until
    half its descriptor table is in use)."""
    sup.output_parking.park_above = 0
    sup.output_parking.sweep_every = _SWEEP


def _text(session: Session, stream: Stream) -> bytes:
    return session.output[stream].read(0, 1 << 24).data


async def _release_and_check(adopted: list[Session]) -> None:
    """Let each adopted session print its second line and end: all of it read, in order."""
    for session in adopted:
        await session.write(b"\n")
    for session in adopted:
        assert await session.wait_finished(5)
        assert session.exit_code == 0
        assert _text(session, Stream.COMBINED) == b"before\nafter\n"


# A line, then quiet until its stdin says go (parked meanwhile), then more than its pipe holds
# (1 MiB: the writer blocks until the end is back), stderr too, quiet again, then a last line.
_BURSTS = "echo first; read a; seq 1 200000; seq 200001 210000 >&2; read b; echo last"
_STDOUT = b"first\n" + b"".join(b"%d\n" % i for i in range(1, 200001)) + b"last\n"
_STDERR = b"".join(b"%d\n" % i for i in range(200001, 210001))


async def test_output_of_parked_sessions_arrives_complete_and_in_order(settings: Settings) -> None:
    async with Supervisor(settings) as sup:
        _park_everything(sup)
        parking = sup.output_parking
        started = [await sup.spawn(SpawnSpec(_BURSTS), scope="t") for _ in range(8)]
        assert await until(lambda: all(parking.is_parked(s) for s in started)), "not all parked"
        for session in started:
            await session.write(b"go\n")
        assert await until(lambda: all(len(_text(s, Stream.STDERR)) == len(_STDERR) for s in started))
        # Quiet again after speaking: parked again (after twice as long).
        assert await until(lambda: all(parking.is_parked(s) for s in started)), "not parked again"
        for session in started:
            await session.write(b"go\n")
        for session in started:
            assert await session.wait_finished(10)
            assert session.exit_code == 0
            assert _text(session, Stream.STDOUT) == _STDOUT
            assert _text(session, Stream.STDERR) == _STDERR
            assert len(_text(session, Stream.COMBINED)) == len(_STDOUT) + len(_STDERR)
        assert len(parking) == 0
        # Each end came back through the number it was registered under: no registration is
        # left behind for the kernel to wake at every write of a session parked again and again.
        assert parking.left_behind == 0


async def test_a_session_woken_again_and_again_is_parked_again_within_the_ceiling(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each wake doubles the quiet spell a session waits before it is parked again, up to
    ``_MAX_QUIET_SWEEPS``: however often it spoke, a quiet session leaves the table again within
    that many sweeps (and the one that first sees it quiet), and every line it speaks is read.
    The ceiling is lowered to 4 here (64 in a server) so that the doubling passes it quickly."""
    ceiling = 4
    monkeypatch.setattr(output_parking, "_MAX_QUIET_SWEEPS", ceiling)
    async with Supervisor(settings) as sup:
        _park_everything(sup)
        parking = sup.output_parking
        echo = await sup.spawn(SpawnSpec('while read line; do echo "$line"; done'), scope="t")
        assert await until(lambda: parking.is_parked(echo))
        spells = []
        for wake in range(6):  # without the ceiling the last spells would be 16, 32, 64 sweeps
            await echo.write(b"%d\n" % wake)
            said = b"".join(b"%d\n" % i for i in range(wake + 1))
            assert await until(lambda said=said: _text(echo, Stream.STDOUT) == said), "its line not read"
            woken_at = parking.sweeps
            assert await until(lambda: parking.is_parked(echo)), "not parked again"
            spells.append(parking.sweeps - woken_at)
            assert spells[-1] <= ceiling + 1, spells
        await echo.write(b"", eof=True)
        assert await echo.wait_finished(5)


async def test_a_parked_sessions_exit_comes_after_its_last_output(settings: Settings) -> None:
    """The leader's exit (seen through SIGCHLD, maybe before the epoll's report of its last
    bytes) takes the ends back; the session ends only once they are read to EOF."""
    async with Supervisor(settings) as sup:
        _park_everything(sup)
        parking = sup.output_parking
        talkers = [await sup.spawn(SpawnSpec("echo up; read a; printf 'last words' >&2; exit 3"), scope="t")]
        silent = [await sup.spawn(SpawnSpec("echo up; read a; exit 4"), scope="t")]
        both = talkers + silent
        assert await until(lambda: all(parking.is_parked(s) for s in both))
        tails: dict[str, str] = {}
        sup.on_exit(lambda info: tails.setdefault(info.session_id, info.tail))
        for session in both:
            await session.write(b"\n")
        for session in both:
            assert await session.wait_finished(5)
        assert talkers[0].exit_code == 3
        assert _text(talkers[0], Stream.COMBINED) == b"up\nlast words"
        assert silent[0].exit_code == 4
        assert _text(silent[0], Stream.COMBINED) == b"up\n"
        assert "last words" in tails[talkers[0].id]  # its exit was told with its output in
        assert len(parking) == 0


async def test_killing_parked_sessions_leaves_no_survivors(settings: Settings) -> None:
    sup = await Supervisor(settings).start()
    try:
        _park_everything(sup)
        parking = sup.output_parking
        started = [await sup.spawn(SpawnSpec("echo up; sleep 30 & sleep 30; wait"), scope="t") for _ in range(12)]
        assert await until(lambda: len(parking) == len(started))
        await sup.kill("t", started[0].id)
        assert await started[0].wait_finished(5)
        assert started[0].state is SessionState.KILLED
        assert _text(started[0], Stream.COMBINED) == b"up\n"
    finally:
        await sup.aclose()
    assert all(s.state is SessionState.KILLED for s in started)
    assert len(parking) == 0
    assert not marked_processes()


async def test_a_detached_parked_session_goes_on_under_the_next_server(settings: Settings) -> None:
    """The holder's copies are not the parked ones: a session parked when its server detaches
    is adopted by the next one, its output whole."""
    first = await Supervisor(settings, owner="t").start()
    try:
        _park_everything(first)
        started = [await first.spawn(SpawnSpec("echo before; read a; echo after"), scope="t") for _ in range(4)]
        assert await until(lambda: len(first.output_parking) == len(started))
    finally:
        await first.detach()
    async with Supervisor(settings, owner="t") as second:
        assert set(second.adopted) == {s.id for s in started}
        _park_everything(second)
        adopted = [second.get("t", s.id) for s in started]
        assert await until(lambda: len(second.output_parking) == len(started))
        await _release_and_check(adopted)


# Run in a child: the limit is the whole process's, and this one must be low (soft and hard).
_SERVER = """
import asyncio, json, os, resource, sys, time
from procpilot.config import load_settings
from procpilot.engine import segments
from procpilot.engine.capture import Stream
from procpilot.engine.spawn import SpawnSpec
from procpilot.engine.supervisor import Supervisor

LIMIT, SESSIONS, ROOT = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
resource.setrlimit(resource.RLIMIT_NOFILE, (LIMIT, LIMIT))
segments.WRITERS.limit = 32  # the log files kept open for writing, to this limit's scale (512 in a server)

SPOKEN = b"up\\n" + b"".join(b"%d\\n" % i for i in range(1, 20001))

def open_fds():
    return len(os.listdir("/proc/self/fd"))

async def main():
    settings = load_settings(env={}, state_dir=ROOT + "/state", workspace_root=ROOT)
    found = {"refused": 0}
    # Each session opens this FIFO, which waits for a writer, then prints 108 KB: all at once.
    fifo = ROOT + "/go"
    os.mkfifo(fifo)
    command = f"echo up; : < {fifo}; seq 1 20000; sleep 60"
    async with Supervisor(settings, warm_shells=0) as sup:
        parking = getattr(sup, "output_parking", None)
        if parking is not None:
            parking.sweep_every = 0.02
        sessions = []
        while len(sessions) < SESSIONS:
            # A wave, then until the table has room for the next (its parking is what makes it).
            deadline = time.monotonic() + 3
            while open_fds() > LIMIT - 80 and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            for _ in range(20):
                try:
                    sessions.append(await sup.spawn(SpawnSpec(command), scope="t"))
                except Exception:
                    found["refused"] += 1
                    break
            if found["refused"]:
                break
        await asyncio.sleep(0.1)
        found["running"] = sum(1 for s in sessions if s.is_running)
        found["said_up"] = sum(1 for s in sessions if s.output[Stream.STDOUT].read().data == b"up\\n")
        # Every one speaks at once: more ends than the table can take back (the rest wait their
        # turn in their pipes), and every byte arrives.
        gate = os.open(fifo, os.O_RDWR)  # a writer: every open returns, a late one at once too
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if all(s.output[Stream.STDOUT].size >= len(SPOKEN) for s in sessions):
                break
            await asyncio.sleep(0.02)
        found["spoke_whole"] = sum(1 for s in sessions if s.output[Stream.STDOUT].read(0, 1 << 20).data == SPOKEN)
        found["running_after"] = sum(1 for s in sessions if s.is_running)
    os.close(gate)
    found["left"] = sum(1 for s in sessions if not s.finished)
    print(json.dumps(found))

asyncio.run(main())
"""


@pytest.mark.skipif(resource.getrlimit(resource.RLIMIT_NOFILE)[1] < 512, reason="the hard descriptor limit is too low")
def test_a_server_runs_more_sessions_than_two_descriptors_each_would_fit(tmp_path: Path) -> None:
    limit, sessions = 384, 240  # 480 descriptors at two a session
    found = run_script(_SERVER, limit, sessions, tmp_path, timeout=120)
    assert found["refused"] == 0, found
    assert found["running"] == sessions, found
    assert found["said_up"] == sessions, found  # each one's first line was read before it was parked
    assert found["spoke_whole"] == sessions, found
    assert found["running_after"] == sessions, found
    assert found["left"] == 0, found


async def test_a_new_holder_gets_copies_of_parked_ends(settings: Settings) -> None:
    """A holder killed while sessions are parked: the server hands the next holder every
    session again, parked ends taken back for the copies, so a detach after it loses nothing."""
    first = await Supervisor(settings, owner="t").start()
    try:
        _park_everything(first)
        started = [await first.spawn(SpawnSpec("echo before; read a; echo after"), scope="t") for _ in range(4)]
        assert await until(lambda: len(first.output_parking) == len(started))
        old = first.capabilities()["restarts"]["holder_pid"]
        os.kill(old, signal.SIGKILL)

        def replaced() -> bool:
            now = first.capabilities()["restarts"]
            return bool(now["survive"]) and now.get("holder_pid") not in (None, old)

        assert await until(replaced), "no new holder"
        assert await until(lambda: len(first.output_parking) == len(started))  # parked again
    finally:
        await first.detach()
    async with Supervisor(settings, owner="t") as second:
        adopted = [second.get("t", s.id) for s in started]
        await _release_and_check(adopted)


# Run in a child, for its low limit. Quiet sessions are parked, then the threshold is raised out
# of reach, so the sweep alone would park nothing more; more quiet sessions start, read by the
# loop; the table is filled (here by /dev/null, in a server by its own files, connections and
# written-to stdins) until no end can come back. Then the parked ones speak.
_FORCED = """
import asyncio, json, os, resource, sys, time
from procpilot.config import load_settings
from procpilot.engine import segments
from procpilot.engine.capture import Stream
from procpilot.engine.spawn import SpawnSpec
from procpilot.engine.supervisor import Supervisor

LIMIT, ROOT = int(sys.argv[1]), sys.argv[2]
resource.setrlimit(resource.RLIMIT_NOFILE, (LIMIT, LIMIT))
segments.WRITERS.limit = 8
SPOKEN = b"up\\n" + b"".join(b"%d\\n" % i for i in range(1, 20001))

def used():
    return os.stat("/proc/self/fd").st_size or len(os.listdir("/proc/self/fd"))

async def until(check, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.01)
    return True

async def main():
    settings = load_settings(env={}, state_dir=ROOT + "/state", workspace_root=ROOT)
    fifo = ROOT + "/go"
    os.mkfifo(fifo)
    found = {}
    filler = []
    async with Supervisor(settings, warm_shells=0) as sup:
        parking = sup.output_parking
        parking.sweep_every = 0.02
        parking.park_above = 0
        speaker = SpawnSpec(f"echo up; : < {fifo}; seq 1 20000; sleep 60")
        speakers = [await sup.spawn(speaker, scope="t") for _ in range(8)]
        found["speakers_parked"] = await until(lambda: all(parking.is_parked(s) for s in speakers))
        parking.park_above = 1 << 20  # from now on the threshold parks nothing
        quiet = [await sup.spawn(SpawnSpec("echo up; sleep 60"), scope="t") for _ in range(10)]
        found["quiet_said_up"] = await until(lambda: all(s.output[Stream.STDOUT].size == 3 for s in quiet))
        await asyncio.sleep(0.1)  # sweeps it would run, if the threshold asked for any
        found["quiet_parked_by_threshold"] = sum(parking.is_parked(s) for s in quiet)
        # Filled until the room for ends coming back (OutputParking._room) is below one
        # session's two: a sixteenth of the limit for a bucket, an eighth for the server's own.
        while LIMIT - used() - LIMIT // 16 - LIMIT // 8 > -4:
            filler.append(os.open(os.devnull, os.O_RDONLY))
        gate = os.open(fifo, os.O_RDWR)
        found["spoke_whole"] = await until(
            lambda: all(s.output[Stream.STDOUT].read(0, 1 << 20).data == SPOKEN for s in speakers)
        )
        found["spoke"] = sum(s.output[Stream.STDOUT].read(0, 1 << 20).data == SPOKEN for s in speakers)
        found["quiet_parked"] = sum(parking.is_parked(s) for s in quiet)
        found["over_threshold"] = 2 * len(quiet) > parking.threshold()
        found["running"] = sum(s.is_running for s in speakers + quiet)
    os.close(gate)
    for fd in filler:
        os.close(fd)
    print(json.dumps(found))

asyncio.run(main())
"""


@pytest.mark.skipif(resource.getrlimit(resource.RLIMIT_NOFILE)[1] < 256, reason="the hard descriptor limit is too low")
def test_sessions_waiting_for_room_get_the_quiet_parked_whatever_the_threshold(tmp_path: Path) -> None:
    """Parked sessions that speak when the table has no room for their ends wait in their pipes;
    the sweep then parks the quiet sessions the loop reads, though the threshold does not ask
    for it, and the room they leave lets the speakers be read: every byte arrives."""
    found = run_script(_FORCED, 256, tmp_path)
    assert found["speakers_parked"] and found["quiet_said_up"], found
    assert found["quiet_parked_by_threshold"] == 0, found  # the threshold alone parks none of them
    assert not found["over_threshold"], found
    assert found["spoke"] == 8, found
    assert found["quiet_parked"] > 0, found  # parked to make the room
    assert found["running"] == 18, found


# Run in a child. First as root (no in-flight cap: every quiet session parked), then as nobody,
# whose descriptors in flight the kernel caps at its RLIMIT_NOFILE (ETOOMANYREFS past it,
# counted per user: stdins and output ends alike; here no stdin, so only the output ends count,
# and twice the sessions is past the cap whatever is parked first). Modules are imported as root
# first: nobody may not read this Python's own directory, and so it starts no holder either.
_UNPRIVILEGED = """
import asyncio, json, os, resource, sys, time
from procpilot.config import load_settings
from procpilot.engine import segments
from procpilot.engine.capture import Stream
from procpilot.engine.spawn import SpawnSpec
from procpilot.engine.supervisor import Supervisor

LIMIT, SESSIONS, ROOT, NOBODYS = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
resource.setrlimit(resource.RLIMIT_NOFILE, (LIMIT, LIMIT))
segments.WRITERS.limit = 8
SPOKEN = b"up\\n" + b"".join(b"%d\\n" % i for i in range(1, 20001))

def used():
    return os.stat("/proc/self/fd").st_size or len(os.listdir("/proc/self/fd"))

async def until(check, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.01)
    return True

async def run(where):
    os.makedirs(where, exist_ok=True)
    settings = load_settings(env={}, state_dir=where + "/state", workspace_root=where)
    fifo = where + "/go"
    os.mkfifo(fifo)
    found = {}
    async with Supervisor(settings, warm_shells=0) as sup:
        parking = sup.output_parking
        parking.sweep_every = 0.02
        parking.park_above = 0
        sessions = []
        while len(sessions) < SESSIONS:
            # A wave, once the table has room for it (the parking is what makes the room).
            await until(lambda: used() < LIMIT - 60, 3)
            spec = SpawnSpec(f"echo up; : < {fifo}; seq 1 20000; sleep 60", stdin="null")
            wave = [await sup.spawn(spec, scope="t") for _ in range(10)]
            await until(lambda: all(s.output[Stream.STDOUT].size == 3 for s in wave))
            sessions += wave
        # Quiet now: every one parked, or refused by the kernel and read by the loop as before.
        await until(lambda: len(parking) == SESSIONS, 1)
        found["parked"] = len(parking)
        gate = os.open(fifo, os.O_RDWR)
        await until(lambda: all(s.output[Stream.STDOUT].size >= len(SPOKEN) for s in sessions), 20)
        found["spoke_whole"] = sum(s.output[Stream.STDOUT].read(0, 1 << 20).data == SPOKEN for s in sessions)
        found["running"] = sum(s.is_running for s in sessions)
    os.close(gate)
    found["left"] = sum(not s.finished for s in sessions)
    return found

found = {"root": asyncio.run(run(ROOT + "/root"))}
os.setgroups([])
os.setgid(65534)
os.setuid(65534)
found["nobody"] = asyncio.run(run(NOBODYS + "/run"))
print(json.dumps(found))
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="becoming another user (nobody) needs root")
def test_an_unprivileged_servers_in_flight_cap_leaves_the_rest_read_by_the_loop(tmp_path: Path) -> None:
    """An unprivileged server may keep no more descriptors in flight than its limit: past it
    the stash refuses (stash.py: ETOOMANYREFS), and those sessions' ends stay in the table,
    read by the loop; every byte of every session still arrives."""
    limit, sessions = 128, 80  # 160 output ends in flight would be past the cap (by a bucket at most)
    # Nobody's state: where nobody can reach it (pytest's directory is root's alone).
    nobodys = Path(tempfile.mkdtemp(prefix="procpilot-nobody-"))
    try:
        os.chown(nobodys, 65534, 65534)
        found = run_script(_UNPRIVILEGED, limit, sessions, tmp_path, nobodys, timeout=90)
    finally:
        shutil.rmtree(nobodys, ignore_errors=True)
    root, nobody = found["root"], found["nobody"]
    assert root["parked"] == sessions, found  # no cap for root: every quiet session parked
    # The cap: the stash stops once the limit is passed, by one bucket's message at most.
    assert 0 < nobody["parked"] < sessions, found
    assert 2 * nobody["parked"] <= limit + limit // 16, found
    for run in (root, nobody):
        assert run["spoke_whole"] == sessions, found
        assert run["running"] == sessions, found
        assert run["left"] == 0, found
