"""Warm shells (engine/warm.py): a session started on one behaves as a cold one would."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from procpilot.config import Settings
from procpilot.engine import supervisor as supervisor_module
from procpilot.engine.capture import Stream
from procpilot.engine.spawn import SpawnSpec
from procpilot.engine.states import SessionState
from procpilot.engine.supervisor import Supervisor
from procpilot.engine.trees import MARKER_ENV, SUPERVISOR_ENV
from procpilot.engine.warm import waiting_fds, waiting_pids
from procpilot.errors import StdinClosed

A = "agent-a"

# Everything a command can observe of how it was started, but its session's own names.
PROBE = r"""
env | grep -v -e '^PROCPILOT_SESSION=' -e '^PROCPILOT_SUPERVISOR=' | sort
pwd; echo "0=$0 #=$# -=$-"; ls /proc/self/fd | sort -n | tr '\n' ' '; echo
umask; ulimit -a; trap; set | grep -c '^__pp' ; cat /proc/self/status | grep -e '^SigIgn' -e '^SigBlk'
[ "$(ps -o sid= -p $$)" -eq $$ ] && echo leader
read line && echo "stdin: $line"
echo 'it'\''s' "a
b" >&2
exit 3
"""


@pytest.fixture
async def warm(settings: Settings) -> AsyncIterator[Supervisor]:
    async with Supervisor(settings, warm_shells=2) as sup:
        yield sup


@pytest.fixture
async def cold(settings: Settings) -> AsyncIterator[Supervisor]:
    async with Supervisor(settings, warm_shells=0) as sup:
        yield sup


def _fill(sup: Supervisor) -> None:
    """Refill the pool now (it refills on its own once a session ends, or after 50 ms)."""
    assert sup._warm is not None
    sup._warm.fill()


async def _observed(sup: Supervisor, spec: SpawnSpec) -> tuple[int | None, bytes, bytes]:
    session = await sup.spawn(spec, scope=A)
    with contextlib.suppress(StdinClosed):  # a command that reads nothing may be gone already
        await sup.write(A, session.id, b"hello\n", eof=True)
    await sup.wait(A, session.id, timeout=None)
    return session.exit_code, session.output[Stream.STDOUT].read().data, session.output[Stream.STDERR].read().data


async def test_a_command_sees_what_a_cold_start_gives_it(warm: Supervisor, cold: Supervisor, workspace: Path) -> None:
    (workspace / "sub").mkdir()
    for spec in (
        SpawnSpec(PROBE, cwd=workspace / "sub", workspace=workspace),
        SpawnSpec(PROBE, env={"GREETING": "a 'quoted'\nvalue", "LANG": "C"}),
    ):
        _fill(warm)
        started = warm.warm_shells()["sessions_started_warm"]
        assert await _observed(warm, spec) == await _observed(cold, spec)
        assert warm.warm_shells()["sessions_started_warm"] == started + 1
    # argv commands go through the warm shell as an exec of the same argv
    argv = SpawnSpec(("/bin/sh", "-c", 'echo "$0" "$@"', "x", "y z"))
    _fill(warm)
    assert await _observed(warm, argv) == await _observed(cold, argv)


async def test_a_warm_session_is_its_own_tree(warm: Supervisor) -> None:
    # A daemon that double-forks out of the session is in its cgroup all the same, and ends with it.
    session = await warm.spawn(SpawnSpec("setsid sh -c 'sleep 60 & sleep 60' & echo started; sleep 60"), scope=A)
    assert warm.warm_shells()["sessions_started_warm"] == 1
    await warm.wait(A, session.id, timeout=10, pattern=re.compile("started"))
    await warm.kill(A, session.id, signal.SIGTERM, wait=None)
    assert session.state is SessionState.KILLED  # and the leak check finds none of the three sleeps


async def test_warm_shells_carry_their_session_markers(warm: Supervisor) -> None:
    session = await warm.run(SpawnSpec(f'echo "${MARKER_ENV} ${SUPERVISOR_ENV}"'), scope=A, yield_ms=None)
    assert session.output[Stream.STDOUT].read().data.decode().split() == [session.id, warm.instance]


async def test_a_command_not_found_reads_as_the_shell_says_it(warm: Supervisor) -> None:
    session = await warm.run(SpawnSpec("x=$(echo 1) nosuchprog-xyz"), scope=A, yield_ms=None)
    assert session.exit_code == 127
    assert b"nosuchprog-xyz: not found" in session.output[Stream.STDERR].read().data


async def test_a_stranger_cannot_hand_a_warm_shell_its_command(warm: Supervisor, tmp_path: Path) -> None:
    # Another process of our user opens the shell's stdin through /proc and writes a
    # command: without the token written when the shell started, the shell ends, running nothing.
    pool = warm._warm
    assert pool is not None
    victim = pool._ready[0]
    proof = tmp_path / "ran"
    with open(f"/proc/{victim.pid}/fd/0", "wb") as pipe:
        pipe.write(f"__pp_s= __pp_c='touch {proof}'\n".encode())
    for _ in range(200):
        if not victim.alive():
            break
        await asyncio.sleep(0.01)
    assert not victim.alive()
    # the pool passes over the dead shell: the next session runs warm on a live one, as itself
    session = await warm.run(SpawnSpec("echo mine"), scope=A, yield_ms=None)
    assert session.output[Stream.STDOUT].read().data == b"mine\n"
    assert not proof.exists()


async def test_a_refused_spawn_leaves_its_warm_shell_in_the_pool(warm: Supervisor) -> None:
    pool = warm._warm
    assert pool is not None
    before = {shell.pid for shell in pool._ready}
    with pytest.raises(Exception, match="not found"):
        await warm.spawn(SpawnSpec("nosuchprog-xyz --flag"), scope=A)
    assert {shell.pid for shell in pool._ready} >= before
    assert all(shell.alive() for shell in pool._ready)


async def test_what_a_warm_shell_cannot_do_the_same_way_starts_cold(warm: Supervisor) -> None:
    for spec in (SpawnSpec("tty", pty=True), SpawnSpec("echo $IFS", env={"IFS": ":"}), SpawnSpec("true " * 4000)):
        session = await warm.run(spec, scope=A, yield_ms=None)
        assert session.finished
    assert warm.warm_shells()["sessions_started_warm"] == 0


async def test_closing_the_supervisor_ends_the_pool(settings: Settings) -> None:
    sup = await Supervisor(settings, warm_shells=3).start()
    pool = sup._warm
    assert pool is not None and pool.ready == 3
    pids = [shell.pid for shell in pool._ready]
    await sup.aclose()
    for pid in pids:
        assert not os.path.exists(f"/proc/{pid}")  # reaped, not a zombie
    assert sup.warm_shells()["ready"] == 0


async def test_capabilities_report_the_pool_and_the_hosts_cgroup_option(warm: Supervisor) -> None:
    found = warm.capabilities()["warm_shells"]
    assert found["size"] == 2 and found["ready"] == 2
    with open("/proc/self/mountinfo") as f:
        cgroup2 = [line for line in f if " - cgroup2 " in line]
    if warm.tree_mechanism != "cgroup2" or not cgroup2:
        assert found["cgroup_favordynmods"] is None
        return
    # read, never set: whatever the host has is what is reported, with a pointer when it is off
    assert found["cgroup_favordynmods"] == any("favordynmods" in line for line in cgroup2)
    assert ("note" in found) is (found["cgroup_favordynmods"] is False)


async def test_the_leak_check_spares_only_the_shells_an_open_pool_holds(settings: Settings) -> None:
    sup = await Supervisor(settings, warm_shells=2).start()
    assert sup._warm is not None
    ready = {shell.pid for shell in sup._warm._ready}
    assert ready <= waiting_pids() and len(ready) == 2
    assert len(waiting_fds() & {shell.stdout_fd for shell in sup._warm._ready}) == 2
    session = await sup.run(SpawnSpec("true"), scope=A, yield_ms=None)
    assert session.pid not in waiting_pids()  # taken: a session now, no longer spared
    await sup.aclose()
    assert not ready & waiting_pids()


async def test_an_owned_supervisors_warm_start_has_its_sessions_exit_trap(settings: Settings) -> None:
    # A server whose sessions outlive it has each shell record its exit for an outage: a warm
    # shell runs that line itself (made with its session id), as the cold path puts it first.
    async with Supervisor(settings, owner="t") as sup:
        session = await sup.run(SpawnSpec("trap"), scope=A, yield_ms=None)
        assert sup.warm_shells()["sessions_started_warm"] == 1
    shown = session.output[Stream.STDOUT].read().data.decode()
    assert shown.count("EXIT") == 1 and f"/sessions/{session.id}.exit" in shown


async def test_a_warm_shells_own_trap_runs_only_for_a_launch_that_asks_for_it(warm: Supervisor) -> None:
    pool = warm._warm
    assert pool is not None
    line = "trap 'echo trapped' EXIT"
    pool._exit_trap = lambda _session_id: line
    while pool._ready:  # the shells made before have no trap: made again with it
        pool.discard(pool._ready.popleft())
    pool.fill()
    assert [shell.exit_trap for shell in pool._ready] == [line, line]
    # a launch whose setup ends with that line: the shell runs it, where the setup would have
    spec = SpawnSpec("echo ran")
    shell = pool.take(spec)
    assert shell is not None
    spawned = shell.launch(spec, shell.env, [line], None)
    assert await asyncio.to_thread(shell.popen.wait) == 0
    assert os.read(spawned.stdout_fd, 4096) == b"ran\ntrapped\n"
    pool.discard(shell)
    # one without it (this supervisor has no owner, so its starts have no trap): skipped
    session = await warm.run(SpawnSpec("echo ran; trap"), scope=A, yield_ms=None)
    assert warm.warm_shells()["sessions_started_warm"] == 2
    assert session.output[Stream.STDOUT].read().data == b"ran\n"


async def test_a_shell_made_before_the_servers_environment_changed_gives_the_new_value(
    warm: Supervisor, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The shells' base environment is read once, not per shell: one made from it after the
    # server's passthrough variable changed still hands the command the value of its call.
    monkeypatch.setenv("TZ", "UTC")
    await warm.run(SpawnSpec("true"), scope=A, yield_ms=None)  # the pool's base is read by now
    monkeypatch.setenv("TZ", "Europe/Paris")
    for _ in range(3):  # the shells made before the change, then one made after it
        _fill(warm)
        before = warm.warm_shells()["sessions_started_warm"]
        session = await warm.run(SpawnSpec('echo "$TZ"'), scope=A, yield_ms=None)
        assert warm.warm_shells()["sessions_started_warm"] == before + 1
        assert session.output[Stream.STDOUT].read(0).data == b"Europe/Paris\n"
    monkeypatch.delenv("TZ")
    _fill(warm)
    session = await warm.run(SpawnSpec('echo "${TZ-unset}"'), scope=A, yield_ms=None)
    assert session.output[Stream.STDOUT].read(0).data == b"unset\n"


async def test_a_waiting_shell_costs_the_server_its_three_pipes_and_no_pidfd(warm: Supervisor) -> None:
    # Its exit comes through the loop's SIGCHLD watcher, as every leader's does: a pidfd opened at
    # each refill would only be closed again on the call's path.
    _fill(warm)
    held = waiting_fds()
    assert len(held) == 3 * warm.warm_shells()["ready"] == 6
    assert all(os.readlink(f"/proc/self/fd/{fd}").startswith("pipe:") for fd in held)
    session = await warm.run(SpawnSpec("echo ok"), scope=A, yield_ms=None)
    assert session.exit_code == 0 and session.output[Stream.STDOUT].read(0).data == b"ok\n"
    assert warm.warm_shells()["sessions_started_warm"] == 1


async def test_a_warm_shell_refuses_a_directory_that_leads_elsewhere_as_it_enters(
    warm: Supervisor, workspace: Path, tmp_path: Path
) -> None:
    # The check is the script's own function now (a call sends only the path): a path that
    # resolves elsewhere by the time the shell enters it (here a symlink from the start) is
    # refused there, running nothing, and the function is gone before any command runs.
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    proof = tmp_path / "real" / "ran"
    pool = warm._warm
    assert pool is not None
    spec = SpawnSpec(f"touch {proof}")
    shell = pool.take(spec)
    assert shell is not None
    shell.launch(spec, dict(shell.env), [], str(tmp_path / "link"))
    assert shell.popen.wait(10) == 125
    assert b"the working directory changed" in os.read(shell.stderr_fd, 4096)
    assert not proof.exists()
    pool.discard(shell)
    spec = SpawnSpec("command -v __pp_cd || echo none; pwd", cwd=workspace, workspace=workspace)
    session = await warm.run(spec, scope=A, yield_ms=None)
    assert warm.warm_shells()["sessions_started_warm"] == 2
    assert session.output[Stream.STDOUT].read(0).data == f"none\n{workspace.resolve()}\n".encode()


async def test_a_warm_start_refills_the_pool_on_its_own(warm: Supervisor) -> None:
    # The refill's timer is set once the command has started (not before, on the call's path):
    # it must still be set, by a start that ends at once and by one that runs on.
    for command in ("true", "sleep 0.2"):
        assert warm.warm_shells()["ready"] == 2
        before = warm.warm_shells()["sessions_started_warm"]
        session = await warm.run(SpawnSpec(command), scope=A, yield_ms=None)
        assert session.exit_code == 0 and warm.warm_shells()["sessions_started_warm"] == before + 1
        async with asyncio.timeout(5):
            while warm.warm_shells()["ready"] < 2:  # a timer of the pool's: nothing to await but time
                await asyncio.sleep(0.005)


async def test_a_session_that_cannot_be_made_after_its_warm_start_leaves_nothing(
    warm: Supervisor, settings: Settings, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # A warm start hands the command over before the session's objects are made. Should making
    # them fail (no memory, a bug: forced here), the command's tree is ended and reaped at once,
    # and what it held (its lane slot, its cgroup) is free again: as after a refusal.
    pool = warm._warm
    assert pool is not None and pool.ready == 2
    shells = {shell.pid: shell.session_id for shell in pool._ready}

    def no_memory(*args: object, **kwargs: object) -> None:
        raise MemoryError

    proof = tmp_path / "sleeper"
    with monkeypatch.context() as patch:
        patch.setattr(supervisor_module, "SessionOutput", no_memory)
        with pytest.raises(MemoryError):
            await warm.run(SpawnSpec(f"sleep 30 & echo $! > {proof}; wait", lane="l"), scope=A, yield_ms=None)
    (taken,) = set(shells) - {shell.pid for shell in pool._ready}
    assert not os.path.exists(f"/proc/{taken}")  # ended and reaped, not a zombie
    if proof.exists() and proof.read_text().strip():  # the command got as far as its sleep
        assert not os.path.exists(f"/proc/{proof.read_text().strip()}")
    assert not any(_marked_with(shells[taken]))
    assert not (settings.engine.state_dir / "sessions" / shells[taken]).exists()
    # The lane's one slot is free again: the next command of that lane starts at once.
    session = await warm.run(SpawnSpec("echo ok", lane="l"), scope=A, yield_ms=1000)
    assert session.exit_code == 0 and session.output[Stream.STDOUT].read(0).data == b"ok\n"


def _marked_with(session_id: str) -> list[int]:
    """Live processes whose environment names ``session_id`` (its tree's marker)."""
    found = []
    marker = f"{MARKER_ENV}={session_id}".encode()
    for name in os.listdir("/proc"):
        if name.isdigit():
            with contextlib.suppress(OSError), open(f"/proc/{name}/environ", "rb") as f:
                if marker in f.read().split(b"\0"):
                    found.append(int(name))
    return found
