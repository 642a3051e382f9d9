"""Shared fixtures. After every test: no process this run's supervisors started survives, no fd leaked."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import procpilot
from procpilot.config import Settings, load_settings
from procpilot.engine.supervisor import Supervisor
from procpilot.engine.trees import MARKER_ENV, SUPERVISOR_ENV
from procpilot.engine.warm import waiting_fds, waiting_pids

PROGRAMS = Path(__file__).parent / "programs"
PY = sys.executable


def _environ(pid: int) -> dict[bytes, bytes] | None:
    """A live (not zombie) process's environment, or None."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = f.read()
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
    except OSError:
        return None
    if state == b"Z":
        return None
    return dict(item.partition(b"=")[::2] for item in env.split(b"\0") if item)


def _marked() -> dict[int, dict[bytes, bytes]]:
    """Every live process that some procpilot supervisor started, with its environment."""
    found = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (env := _environ(int(name))) is not None and MARKER_ENV.encode() in env:
            found[int(name)] = env
    return found


def _supervisors_of_marked() -> dict[int, bytes]:
    """Every live process that some procpilot supervisor started, with that supervisor's name."""
    return {pid: env.get(SUPERVISOR_ENV.encode(), b"") for pid, env in _marked().items()}


def _descends_from_us(pid: int) -> bool:
    while pid > 1:
        if pid == os.getpid():
            return True
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                pid = int(f.read().rsplit(b")", 1)[1].split()[1])
        except OSError:
            return False
    return False


# Supervisors that already had processes when the suite started: a daemon serving real agents.
_FOREIGN = set(_supervisors_of_marked().values())


# This run's temporary directory: every daemon a test starts has its HOME there (tests/daemon.py),
# and so have the sessions it starts.
_RUN_TEMP: list[bytes] = []


@pytest.fixture(scope="session", autouse=True)
def _run_temp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    _RUN_TEMP.append(str(tmp_path_factory.getbasetemp()).encode() + b"/")
    # The stdio servers' handshake cache (transports/mcp_handshake.py) of a test that keeps the
    # caller's HOME goes here, not into the user's ~/.cache.
    os.environ["XDG_CACHE_HOME"] = str(tmp_path_factory.mktemp("xdg-cache"))
    yield
    _end_waiting_holders()


def _end_waiting_holders() -> None:
    """A test that kills its server outright and starts no other leaves that server's holder
    waiting for the next one (up to an hour, for the exit records it keeps): as a crashed
    daemon's holder should. The run ends those of its own state directories, and no other."""
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")[:-1]
        except OSError:
            continue
        if len(argv) >= 2 and argv[-2].endswith(b"/engine/holder.py") and argv[-1].startswith(tuple(_RUN_TEMP)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(name), signal.SIGTERM)


def _ours(env: dict[bytes, bytes]) -> bool:
    """A process of this test run's supervisors: this process or a live descendant (a daemon a
    test started), or one that is gone but was not running before the suite and whose daemon
    lived in this run's temporary directory (a daemon a test killed outright; another test run
    on the machine may kill daemons of its own at the same time)."""
    supervisor = env.get(SUPERVISOR_ENV.encode(), b"")
    match = re.fullmatch(rb"procpilot-([0-9]+)-[0-9a-f]+", supervisor)
    if match is None or supervisor in _FOREIGN:
        return False
    pid = int(match[1])
    if _descends_from_us(pid):
        return True
    home = env.get(b"HOME", b"") + b"/"
    return not os.path.exists(f"/proc/{pid}") and any(home.startswith(temp) for temp in _RUN_TEMP)


def _pid_namespace(pid: int | str) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return None


def marked_processes() -> list[int]:
    """Pids of live processes started by this test run's supervisors. Those of any other
    supervisor on the machine (a daemon serving real agents) are none of a test's business, and
    neither is the pool of warm shells of a daemon that outlives one test (a module's fixture).

    A supervisor in another pid namespace (the cluster tests' nodes, or anyone's container)
    names itself by a pid of that namespace, which means nothing here: its processes are ours
    iff they descend from this run."""
    own = _pid_namespace("self")
    found = []
    for pid, env in _marked().items():
        elsewhere = _pid_namespace(pid) not in (own, None)
        # Elsewhere, the pool of a node's supervisor (alive while its module's cluster is) waits
        # on: its name says nothing here, but a shell still reading its token ran nothing.
        spared = _waiting_warm_shell(pid) if elsewhere else _pool_of_live_daemon(pid, env)
        if (_descends_from_us(pid) if elsewhere else _ours(env)) and not spared:
            found.append(pid)
    return found


def marked_processes_soon(timeout: float = 10.0) -> list[int]:
    """``marked_processes()`` once it finds any (or after ``timeout``). A session reported
    running is a warm shell handed its command: until it forks, it looks like one still waiting
    (same command line, same stdin pipe), which the count spares."""
    deadline = time.monotonic() + timeout
    found = marked_processes()
    while not found and time.monotonic() < deadline:
        time.sleep(0.05)
        found = marked_processes()
    return found


async def until(check: Callable[[], bool], timeout: float = 10.0) -> bool:
    """True once ``check()`` is, False if it is still not after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.005)
    return True


def run_script(script: str, *args: object, timeout: float = 60) -> Any:
    """``script`` run by this Python in a child process of its own (limits lowered, a user
    changed: never in the process the suite shares), with procpilot on its path; what it printed,
    as JSON. A child that does not exit 0 fails the test with the end of its stderr."""
    env = {**os.environ, "PYTHONPATH": str(Path(procpilot.__file__).parents[1])}
    argv = [sys.executable, "-c", script, *map(str, args)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


@pytest.fixture
def children() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Processes a test starts itself (append them): killed and waited for after it."""
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for child in started:
        child.kill()
        child.wait()
        for pipe in (child.stdin, child.stdout):
            if pipe is not None:
                pipe.close()


def _pool_of_live_daemon(pid: int, env: dict[bytes, bytes]) -> bool:
    """A warm shell (engine/warm.py) still waiting for its command, of a supervisor that is open:
    in this process, one of an open pool (a module's in-process daemon; a supervisor a test forgot
    to close is collected, and its pool's descriptors fail the fd check), elsewhere one whose
    process lives (a module's daemon)."""
    match = re.fullmatch(rb"procpilot-([0-9]+)-[0-9a-f]+", env.get(SUPERVISOR_ENV.encode(), b""))
    if match is not None and int(match[1]) == os.getpid():
        return pid in waiting_pids()
    if match is None or not os.path.exists(f"/proc/{int(match[1])}"):
        return False
    return _waiting_warm_shell(pid)


def _waiting_warm_shell(pid: int) -> bool:
    """A warm shell that has not been handed a command: it reads its token from a pipe."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            waiting = b"read -r __pp_t" in f.read()
        return waiting and os.readlink(f"/proc/{pid}/fd/0").startswith("pipe:")
    except OSError:
        return False


# The roots of the in-process daemons open now (tests/inprocess.py). Each one's journal descriptor
# is opened by a test's first record and stays open until the daemon closes; whether a later
# record reopens it (a compaction releases it) depends on when records are written, so it is no
# test's leak.
OPEN_ROOTS: set[str] = set()


def open_fds() -> set[int]:
    return {int(fd) for fd in os.listdir("/proc/self/fd")}


@pytest.fixture(autouse=True)
def _no_leaks() -> Iterator[None]:
    before = open_fds()
    yield
    # The verdict is the look that ended the wait, never a second one: a module's in-process
    # daemon refills its warm pool on a thread of its own, and a shell caught between its fork and
    # its place in the pool (waiting_pids) is a leak only if it is still there 50 ms later.
    deadline = time.monotonic() + 5
    survivors = marked_processes()
    while survivors and time.monotonic() < deadline:
        time.sleep(0.05)
        survivors = marked_processes()
    assert not survivors, f"processes outlived the test: {[(p, _cmd(p)) for p in survivors]}"
    # The descriptors of the warm shells an open supervisor keeps ready (a module's in-process
    # daemon refills its pool during a test) are accounted for: they close with it.
    leaked = open_fds() - before - waiting_fds() - open_journals()
    # An fd closed by the kernel lags nothing; a leaked one stays: give GC one chance first.
    if leaked:
        import gc

        gc.collect()
        # A module's in-process daemon runs on a thread of its own: a refill it is in the middle
        # of (pipes made, shell not yet in the pool) settles within moments; a leak stays.
        deadline = time.monotonic() + 2
        while True:
            accounted = waiting_fds() | open_journals()
            leaked = {fd for fd in open_fds() - before - accounted if os.path.exists(f"/proc/self/fd/{fd}")}
            if not leaked or time.monotonic() > deadline:
                break
            time.sleep(0.05)
    assert not leaked, f"file descriptors leaked: {[(fd, _describe(fd)) for fd in leaked]}"


def open_journals() -> set[int]:
    """The session journals of the in-process daemons still open (tests/inprocess.py): they close
    with their daemon, at the end of its module."""
    found = set()
    for fd in open_fds():
        target = _describe(fd)
        if target.endswith("/sessions.jsonl") and any(target.startswith(root + "/") for root in OPEN_ROOTS):
            found.add(fd)
    return found


def _describe(fd: int) -> str:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return "?"


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    return ws


@pytest.fixture
def settings(tmp_path: Path, workspace: Path) -> Settings:
    return load_settings(env={}, state_dir=tmp_path / "state", workspace_root=workspace)


@pytest.fixture
async def supervisor(settings: Settings) -> AsyncIterator[Supervisor]:
    async with Supervisor(settings) as sup:
        yield sup


def _cmd(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read()[:300]
        with open(f"/proc/{pid}/stat", "rb") as f:
            ppid = f.read().rsplit(b")", 1)[1].split()[1]
        return f"{cmd!r} ppid={ppid.decode()}"
    except OSError:
        return "?"


# The guest's tests (one qemu boot for both, minutes under software emulation) start first: a
# worker runs them while the others take the rest, and steal its queue once they are done. Work
# stealing hands each worker a contiguous slice at the start, so both land on the first worker and
# share the boot of their module-scoped fixture.
_FIRST = ("tests/engine/test_cgroup2_vm.py::",)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: not item.nodeid.startswith(_FIRST))
