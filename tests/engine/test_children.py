"""The orphan reaper and the children the engine claims (engine/children.py)."""

from __future__ import annotations

import asyncio
import ctypes
import os
import shlex
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from procpilot.config import Settings, load_settings
from procpilot.engine import children
from procpilot.engine.children import claimed, reap_orphans
from procpilot.engine.reaper import ExitWatcher
from procpilot.engine.spawn import SpawnSpec
from procpilot.engine.states import SessionState
from procpilot.engine.supervisor import Supervisor
from tests.conftest import PY
from tests.daemon import cli_env


def _zombie(pid: int) -> bool:
    return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None


async def test_an_orphan_reap_never_takes_another_supervisors_leader(tmp_path: Path) -> None:
    """Found by the benchmarks (a call that never returned, about once in 3,000 starts): with
    two supervisors in one process, one's orphan reaper reaped the other's leader in the moment
    between its exit and that supervisor's exit watcher; the watcher found no zombie then, and
    the session stayed running forever. Here the moment is held open: the loop is blocked while
    the leader ends, then an orphan reap runs first (as another supervisor's housekeeping,
    close or orphan-leaving session does)."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    settings_a = load_settings(env={}, state_dir=tmp_path / "state-a", workspace_root=tmp_path / "a")
    settings_b = load_settings(env={}, state_dir=tmp_path / "state-b", workspace_root=tmp_path / "b")
    async with Supervisor(settings_a), Supervisor(settings_b) as b:
        session = await b.spawn(SpawnSpec("exit 7"), scope="b")
        assert session.pid in claimed()
        deadline = time.monotonic() + 10
        while not _zombie(session.pid) and time.monotonic() < deadline:
            time.sleep(0.005)  # blocking on purpose: the loop must not run b's watcher meanwhile
        assert _zombie(session.pid)
        reap_orphans()
        assert _zombie(session.pid), "the reaper took a leader that a supervisor of this process watches"
        assert await session.wait_finished(10)
        assert session.state is SessionState.EXITED_ERROR
        assert session.exit_code == 7
        assert session.pid not in claimed()


def test_a_child_of_other_code_in_the_process_is_left_to_it() -> None:
    """A library user's own `subprocess` child (in this process's session) keeps its status for
    its own wait, even when it ends before an orphan reap."""
    child = subprocess.Popen(["/bin/sh", "-c", "exit 3"])
    assert os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT) is not None
    assert child.pid not in reap_orphans()
    assert child.wait(5) == 3


async def test_an_orphan_of_a_session_the_engine_began_is_reaped(supervisor: Supervisor) -> None:
    """What a tree the engine started leaves with us (an orphan in the session its leader began,
    that nobody claimed) is reaped: no zombie stays."""
    parent = children.popen([PY, "-c", _ORPHAN], stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True)
    assert parent.stdout is not None and parent.stdin is not None
    orphan = int(parent.stdout.readline())
    assert parent.wait(10) == 0
    children.release(parent.pid)
    parent.stdin.close()  # the orphan (ours now: we are the subreaper) ends
    parent.stdout.close()
    assert os.waitid(os.P_PID, orphan, os.WEXITED | os.WNOWAIT) is not None
    reaped = reap_orphans()
    assert orphan in reaped or _stat(orphan) is None  # or the supervisor's housekeeping came first
    assert _stat(orphan) is None


async def test_a_child_of_other_code_in_a_session_of_its_own_keeps_its_exit_status(settings: Settings) -> None:
    """A library user's own child started with ``start_new_session=True`` (for a group kill) looks,
    to the kernel, like an orphan our trees left. The orphan reaper took it (its ``Popen.wait()``
    then said 0 whatever it exited with), while a supervisor ran and after the last one closed."""
    sup = await Supervisor(settings).start()
    try:
        child = subprocess.Popen(["/bin/sh", "-c", "exit 3"], start_new_session=True)
        assert os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT) is not None
        assert child.pid not in reap_orphans()
        # an orphan the session's tree leaves: the close reaps what it adopted, and this is not it
        await sup.run(SpawnSpec("sleep 0.2 & exit 0"), scope="a", yield_ms=None)
        later = subprocess.Popen(["/bin/sh", "-c", "sleep 0.3; exit 4"], start_new_session=True)
    finally:
        await sup.aclose()
    assert child.wait(5) == 3
    time.sleep(0.6)  # the reaper that runs after the last close looks meanwhile (every 0.1 s at first)
    assert later.wait(5) == 4


async def test_a_leader_another_waiter_reaped_ends_lost_not_exited_0(supervisor: Supervisor) -> None:
    """Other code in the process took the leader's status (an `os.waitpid` of its own): the
    session still ends (the housekeeping's sweep finds the leader gone), and says its status is
    unknown rather than reporting exit 0."""
    session = await supervisor.spawn(SpawnSpec("exit 3"), scope="b")
    deadline = time.monotonic() + 10
    while not _zombie(session.pid) and time.monotonic() < deadline:
        time.sleep(0.005)  # blocking on purpose: the loop must not run the exit watcher meanwhile
    os.waitpid(session.pid, 0)  # the other waiter
    watcher = ExitWatcher.of(asyncio.get_running_loop())
    assert watcher is not None
    watcher.sweep()  # what the housekeeping does every 2 s
    assert await session.wait_finished(10)
    assert session.state is SessionState.LOST
    assert session.exit_code is None and session.exit_signal is None
    assert session.error is not None and "exit status is unknown" in session.error


# -- after the last supervisor closes: no zombie of ours in the process that embedded it ----------

_PR_GET_CHILD_SUBREAPER = 37


def _is_subreaper() -> bool:
    flag = ctypes.c_int(0)
    ctypes.CDLL(None, use_errno=True).prctl(_PR_GET_CHILD_SUBREAPER, ctypes.byref(flag), 0, 0, 0)
    return flag.value != 0


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, ppid) of ``pid``, None once it is gone (reaped)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except OSError:
        return None
    return fields[0].decode(), int(fields[1])


async def _reaped(pid: int, within: float = 5.0) -> bool:
    """True once ``pid`` is no longer in /proc (someone reaped it), False if it is still there
    (for the tests below: a zombie child of ours) after ``within`` seconds."""
    deadline = time.monotonic() + within
    while _stat(pid) is not None:
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.02)
    return True


# Forks a child that waits for EOF on stdin, prints its pid and exits: the child is an orphan.
_ORPHAN = "import os, sys\npid = os.fork()\nif pid:\n    print(pid, flush=True)\n    os._exit(0)\nsys.stdin.read()\n"


async def test_an_orphan_adopted_while_a_supervisor_ran_is_reaped_when_it_ends_after_the_close(
    settings: Settings,
) -> None:
    """Found by the benchmarks ("killed or reaped 1 stray child ... (1 zombies)" on the way out):
    the engine made its process a child subreaper and never gave that back, and reaped orphans only
    while a supervisor ran. An orphan adopted then that ends after the last close stayed a zombie
    in the embedding process for good. Now the role is held only while a supervisor is open, and
    what was adopted by then is reaped as it ends."""
    before = _is_subreaper()
    sup = await Supervisor(settings).start()
    assert _is_subreaper()
    # The engine's child but no session's: nothing the close ends. Its parent exits at once, so
    # it comes to us, in a session the engine began.
    parent = children.popen([PY, "-c", _ORPHAN], stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True)
    assert parent.stdout is not None and parent.stdin is not None
    orphan = int(parent.stdout.readline())
    assert parent.wait(10) == 0
    children.release(parent.pid)
    stat = _stat(orphan)
    assert stat is not None and stat[1] == os.getpid(), f"the orphan did not come to this process: {stat}"
    await sup.aclose()
    assert _is_subreaper() == before, "the subreaper role was not given back with the last supervisor"
    parent.stdin.close()  # the orphan ends now, no supervisor open
    parent.stdout.close()
    assert await _reaped(orphan), f"the orphan is left a zombie: {_stat(orphan)}"


async def test_a_detached_leader_that_ends_while_no_server_runs_is_reaped_and_its_status_kept(
    settings: Settings, tmp_path: Path
) -> None:
    """A session detached for a next server: its leader is still our child, and nothing waited
    for it once the supervisor closed (a zombie until a next server in this process, which may
    never come). Now it is reaped when it ends, its exit status written for the next server."""
    go = tmp_path / "go"
    os.mkfifo(go)
    first = await Supervisor(settings, owner="t").start()
    session = await first.spawn(SpawnSpec(f"read x < {shlex.quote(str(go))}; exit 7"), scope="b")
    assert session.pid is not None
    leader = session.pid
    await first.detach()
    with open(go, "w") as f:  # opens once the leader has opened its end: it ends now
        f.write("go\n")
    assert await _reaped(leader), f"the detached leader is left a zombie: {_stat(leader)}"
    async with Supervisor(settings, owner="t") as second:
        await second.wait("b", session.id, timeout=10)
        ended = second.get("b", session.id)
        assert (ended.state, ended.exit_code) == (SessionState.EXITED_ERROR, 7)


# A process that embeds a supervisor, as the benchmarks do: the isolation probes run (bubblewrap's
# first, whose init in its own pid namespace outlives the bwrap that is waited for) once while a
# supervisor is open, then after it closed; then its zombie children, if any, are printed.
_EMBEDDER = """
import asyncio, os, sys, time
from pathlib import Path
from procpilot.config import load_settings
from procpilot.engine import isolation
from procpilot.engine.supervisor import Supervisor

def zombies():
    found = []
    for tid in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{tid}/children") as f:
            for pid in f.read().split():
                try:
                    with open(f"/proc/{pid}/stat") as g:
                        if g.read().rsplit(")", 1)[1].split()[0] == "Z":
                            found.append(pid)
                except OSError:
                    pass
    return found

async def main():
    root = Path(sys.argv[1])
    box = isolation.Isolation(readonly_root=True, writable=(root,))
    settings = load_settings(env={}, state_dir=root / "state", workspace_root=root)
    async with Supervisor(settings):
        isolation.isolation_prefix(box)
    for probe in (isolation._bwrap, isolation._network_prefix):
        probe.cache_clear()
    isolation.isolation_prefix(box)
    deadline = time.monotonic() + 3
    while zombies() and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    print(" ".join(zombies()) or "none")

asyncio.run(main())
"""


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed on this host")
def test_a_process_that_embedded_a_supervisor_keeps_no_zombie_of_the_isolation_probes(tmp_path: Path) -> None:
    """The benchmarks' zombie: bubblewrap's init, orphaned by the probe's bwrap, came back to the
    process (a subreaper for good) in its own session, where no orphan reap takes a child. The
    probes now run in a session of their own, and the role is given back at the last close."""
    done = subprocess.run(
        [PY, "-c", _EMBEDDER, str(tmp_path)], capture_output=True, text=True, timeout=60, env=cli_env(), check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "none", f"zombie children left: {done.stdout.strip()}"
