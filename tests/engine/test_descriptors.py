"""A server's descriptor limit: it holds more running sessions than the soft limit it started with
allows, and its sessions get that soft limit back (engine/descriptors.py)."""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import resource
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from procpilot.config import Settings
from procpilot.engine import descriptors
from procpilot.engine.capture import Stream
from procpilot.engine.procfs import stat_fields
from procpilot.engine.session import Session
from procpilot.engine.spawn import SpawnSpec
from procpilot.engine.states import SessionState
from procpilot.engine.supervisor import Supervisor
from procpilot.engine.trees import (
    CgroupTrees,
    ScanTrees,
    TreeBackend,
    instance_name,
    own_unified_cgroup,
    probe_trees,
)
from procpilot.engine.warm import waiting_fds
from tests.conftest import open_fds, run_script, until

# Run in a child: the limit is the whole process's, and this one must start low.
_SERVER = """
import asyncio, json, resource, signal, sys
from procpilot.config import load_settings
from procpilot.engine.capture import Stream
from procpilot.engine.procfs import stat_fields
from procpilot.engine.session import Session
from procpilot.engine.spawn import SpawnSpec
from procpilot.engine.states import SessionState
from procpilot.engine.supervisor import Supervisor
from procpilot.engine.trees import (
    CgroupTrees,
    ScanTrees,
    TreeBackend,
    instance_name,
    own_unified_cgroup,
    probe_trees,
)

START_SOFT, SESSIONS, ROOT = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
resource.setrlimit(resource.RLIMIT_NOFILE, (START_SOFT, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))

async def main():
    settings = load_settings(env={}, state_dir=ROOT + "/state", workspace_root=ROOT)
    found = {}
    async with Supervisor(settings, descriptors_for=(SESSIONS, 0)) as sup:
        warm = await sup.run(SpawnSpec("ulimit -n"), scope="t", yield_ms=5000)
        sessions = [await sup.spawn(SpawnSpec("echo up; sleep 60"), scope="t") for _ in range(SESSIONS)]
        await asyncio.sleep(0.5)
        found["running"] = sum(1 for s in sessions if s.is_running)
        found["descriptors"] = sup.capabilities()["descriptors"]
        found["warm_ulimit"] = warm.output[Stream.STDOUT].read().data.decode()
    async with Supervisor(settings, warm_shells=0) as cold:
        run = await cold.run(SpawnSpec("ulimit -n"), scope="t", yield_ms=5000)
        found["cold_ulimit"] = run.output[Stream.STDOUT].read().data.decode()
    found["left"] = sum(1 for s in sessions if not s.finished)
    print(json.dumps(found))

asyncio.run(main())
"""


def _hard() -> int:
    return resource.getrlimit(resource.RLIMIT_NOFILE)[1]


@pytest.mark.skipif(_hard() < descriptors.needed_for(300), reason="the hard descriptor limit here is too low")
def test_a_server_holds_more_sessions_than_its_starting_soft_limit(tmp_path: Path) -> None:
    start_soft, sessions = 256, 300  # 256 descriptors hold about 60 sessions
    found = run_script(_SERVER, start_soft, sessions, tmp_path, timeout=120)
    assert found["running"] == sessions
    assert found["left"] == 0
    report = found["descriptors"]
    assert report["soft"] >= descriptors.needed_for(sessions)
    assert report["raised_from"] == [start_soft, _hard()]
    assert report["running_sessions_it_holds"] >= sessions
    assert report["quiet_parked_above"] == descriptors.park_above(report["soft"])  # half the table
    # Sessions get the soft limit the server started with, warm or cold.
    assert found["warm_ulimit"].strip() == str(start_soft)
    assert found["cold_ulimit"].strip() == str(start_soft)


def _described(before: set[int]) -> list[str]:
    found = []
    for fd in open_fds() - waiting_fds() - before:
        try:
            found.append(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            continue
    return sorted(found)


async def test_a_running_session_costs_the_server_at_most_two_descriptors(settings: Settings) -> None:
    """Its stdout and stderr read ends, no more: its exit is seen through the one SIGCHLD watcher
    (no pidfd) and its unwritten stdin is parked out of the table (engine/stdin.py). With an
    owner, so the holder's connection and its copies are part of it; stdin still works after."""
    sessions = 30
    async with Supervisor(settings, owner="t") as sup:
        # Whatever a first session opens once (the holder's connection, the journal) is not per session.
        first = await sup.run(SpawnSpec("true"), scope="t", yield_ms=5000)
        assert first.exit_code == 0
        holder = sup.capabilities()["restarts"]["holder_pid"]
        holder_before = len(os.listdir(f"/proc/{holder}/fd"))
        before = open_fds() - waiting_fds()
        started = [await sup.spawn(SpawnSpec("cat"), scope="t") for _ in range(sessions)]

        def added() -> int:
            return len(_described(before))  # open now: not listdir's own, gone by then

        # Parking waits 50 ms after a start; the stash's one socket pair holds up to 200 of them.
        settled = await until(lambda: added() <= 2 * sessions + 2)
        assert settled, f"{added()} descriptors for {sessions} running sessions: {_described(before)}"
        assert all(s.is_running for s in started)
        # The holder keeps its copies (three pipes and a pidfd each) in flight too: its own
        # limit is no larger than ours. Its stash's one socket pair, and nothing per session.
        held = len(os.listdir(f"/proc/{holder}/fd")) - holder_before
        assert held <= 4, f"the holder holds {held} more descriptors for {sessions} sessions"
        # A parked stdin is written to and closed as before: the child reads, then sees EOF.
        one = started[7]
        assert await one.write(b"hello\n", eof=True) == 6
        assert await one.wait_finished(5)
        assert one.exit_code == 0
        assert one.output[Stream.STDOUT].read().data == b"hello\n"
        assert all(s.is_running for s in started if s is not one)  # nobody else's stdin closed


async def test_an_adopted_session_costs_the_next_server_at_most_two_descriptors(settings: Settings) -> None:
    """A restart takes every running session back under the same limit: the holder hands back
    each one's stdin and pidfd too, but the stdin is parked as it arrives and the pidfd closed
    (an adopted leader is not our child: its exit is polled for, engine/reaper.py)."""
    sessions = 20
    first = await Supervisor(settings, owner="t").start()
    started = [await first.spawn(SpawnSpec("cat"), scope="t") for _ in range(sessions)]
    await first.detach()
    before = open_fds() - waiting_fds()
    async with Supervisor(settings, owner="t") as second:
        assert set(second.adopted) == {s.id for s in started}
        # Beside two a session: the second server's own (its cgroup directories and owner lock,
        # the holder's socket, the stash's socket pair: 9 here), the same for 1 session as for 1,000.
        added = len(_described(before))
        assert added <= 2 * sessions + 10, f"{added} descriptors for {sessions} adopted sessions: {_described(before)}"
        one = second.get("t", started[3].id)
        assert await one.write(b"again\n", eof=True) == 6
        assert await one.wait_finished(5)
        assert one.exit_code == 0
        assert b"again" in one.output[Stream.COMBINED].read().data


# Run in a child, for its low limit: spawns back to back (the loop never turns, so no stdin is
# parked) until the table is full and a spawn is refused, then the supervisor closes. Each
# session prints: its log's files stay open for writing too (segments.WRITERS), so the table
# is still full when the close walks /proc.
_FULL = """
import asyncio, json, os, resource, sys
from procpilot.config import load_settings
from procpilot.engine.spawn import SpawnSpec
from procpilot.engine.supervisor import Supervisor
from procpilot.engine.trees import ScanTrees
from procpilot.errors import SpawnFailed

LIMIT, ROOT = int(sys.argv[1]), sys.argv[2]
resource.setrlimit(resource.RLIMIT_NOFILE, (LIMIT, LIMIT))

def alive(ids):
    found = []
    for name in os.listdir("/proc"):
        try:
            env = open(f"/proc/{name}/environ", "rb").read().split(b"\\0")
            state = open(f"/proc/{name}/stat", "rb").read().rsplit(b")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state != b"Z" and any(b"PROCPILOT_SESSION=" + i.encode() in env for i in ids):
            found.append(int(name))
    return found

async def main():
    settings = load_settings(env={}, state_dir=ROOT + "/state", workspace_root=ROOT)
    found = {"refused": None}
    sessions = []
    async with Supervisor(settings, warm_shells=0, trees=ScanTrees()) as sup:
        sup.output_parking.park_above = 1 << 20
        while found["refused"] is None and len(sessions) < LIMIT:
            try:
                sessions.append(await sup.spawn(SpawnSpec("echo up; sleep 60 & sleep 60; wait"), scope="t"))
            except SpawnFailed as exc:
                found["refused"] = str(exc)
        found["spawned"] = len(sessions)
    found["left"] = sum(1 for s in sessions if not s.finished)
    found["alive"] = alive([s.id for s in sessions])
    print(json.dumps(found))

asyncio.run(main())
"""


def test_a_supervisor_whose_table_is_full_still_ends_every_tree_it_has_to_scan_for(tmp_path: Path) -> None:
    """Without a cgroup a session's tree is found by walking /proc, which takes a descriptor:
    one is kept for it, so a supervisor closing with its table full (a spawn refused for want
    of one) ends every session, the processes they forked too, and raises nothing."""
    found = run_script(_FULL, 128, tmp_path)
    assert found["refused"] and "Too many open files" in found["refused"], found
    assert found["spawned"] > 10, found
    assert found["left"] == 0, found
    assert found["alive"] == [], found


@contextlib.contextmanager
def full_table(below: int | None = None) -> Iterator[None]:
    """This process's descriptor table full: the soft limit lowered to ``below`` (else a few above
    its highest descriptor) and every number under it taken, so an open fails with EMFILE (as
    after a burst of spawns), even once a descriptor at or above ``below`` is closed. All given
    back on the way out: the limit is the whole pytest worker's."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    fillers: list[int] = []
    resource.setrlimit(resource.RLIMIT_NOFILE, (below or max(open_fds()) + 8, hard))
    try:
        while True:
            try:
                fillers.append(os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC))
            except OSError as exc:
                if exc.errno != errno.EMFILE:
                    raise
                break
        yield
    finally:
        for fd in fillers:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def _running(pid: int) -> bool:
    """Alive and not a zombie (read with the table free)."""
    fields = stat_fields(pid)
    return fields is not None and fields[0] not in (b"Z", b"X")


# The leader exits 0 on SIGUSR1 (delivered by the test: no descriptor needed), leaving its
# background child, which holds none of our pipes, running.
_LEAVES_A_CHILD = "trap 'exit 0' USR1; sleep 30 >/dev/null 2>&1 </dev/null & echo ready; wait"


async def _leader_and_child(sup: Supervisor) -> tuple[Session, int, int]:
    """The session, its child, and the lowest of its output descriptors: a table full below it
    stays full when the leader's exit closes them (they are read to EOF before, or after, the
    engine's look at the tree)."""
    sup.output_parking.park_above = 1 << 20  # its pipes stay in the table, where they are
    s = await sup.spawn(SpawnSpec(_LEAVES_A_CHILD), scope="t")
    await sup.wait("t", s.id, timeout=5, pattern=re.compile("ready"))  # its trap is set
    assert s.pid is not None and s.spawned is not None
    members = sup._tree_backend.pids(s.id, s.pid)
    assert len(members) == 2, members
    (child,) = members - {s.pid}
    return s, child, min(fd for fd in (s.spawned.stdout_fd, s.spawned.stderr_fd) if fd is not None)


def _cgroup_trees() -> CgroupTrees:
    trees = probe_trees()
    if not isinstance(trees, CgroupTrees):
        trees.close()
        pytest.skip("no writable cgroup v2 hierarchy here")
    return trees


async def test_a_leader_that_exits_while_the_table_is_full_has_its_cgroup_tree_ended_first(settings: Settings) -> None:
    """A session's end is decided by reading its cgroup's members, which takes a descriptor:
    one is kept for it. With the table full as the leader exits, the child it left running is
    still found and ended before the session ends (read as empty, it ran on: an orphan)."""
    async with Supervisor(settings, warm_shells=0, trees=_cgroup_trees()) as sup:
        s, child, pipes = await _leader_and_child(sup)
        with full_table(below=pipes):
            os.kill(s.pid or 0, signal.SIGUSR1)
            finished = await s.wait_finished(5)
        assert finished
        assert not _running(child), "the session ended with its child still running"
        assert s.state is SessionState.EXITED_OK
        assert s.left_orphans


def _backend_without_spare(kind: str) -> TreeBackend:
    """A tree backend made while the table was full: it could keep no spare descriptor."""
    if kind == "scan":
        with full_table():
            return ScanTrees()
    root = own_unified_cgroup()
    if root is None:
        pytest.skip("no cgroup v2 hierarchy here")
    directory = root / instance_name()
    directory.mkdir()
    with full_table():
        return CgroupTrees(directory)


@pytest.mark.parametrize("kind", ["cgroup", "scan"])
async def test_a_tree_that_cannot_be_read_is_waited_for_never_called_empty(
    settings: Settings, caplog: pytest.LogCaptureFixture, kind: str
) -> None:
    """Without even the kept descriptor, a failed read of the members is "unknown": the session
    does not end while the child it left may live (read as empty, it would run on, an orphan;
    a /proc walk's error escaping, the session would never end), says so once in the log, and
    once the table has room it ends the child and ends."""
    trees = _backend_without_spare(kind)
    async with Supervisor(settings, warm_shells=0, trees=trees) as sup:
        s, child, pipes = await _leader_and_child(sup)
        with caplog.at_level(logging.WARNING), full_table(below=pipes):
            os.kill(s.pid or 0, signal.SIGUSR1)
            # The engine's first look after the exit: it ends the session, or says it cannot tell.
            looked = await until(lambda: s.finished or "ends once its tree can be read" in caplog.text)
            ended_blind = s.finished
        assert looked
        assert not ended_blind, "the session was ended on a failed read of its tree"
        assert _running(child)
        assert await s.wait_finished(5)
        assert not _running(child)
        assert s.state is SessionState.EXITED_OK
        assert s.left_orphans
        assert caplog.text.count("ends once its tree can be read") == 1
