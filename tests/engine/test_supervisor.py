"""The engine with real processes: lifecycle, capture, hand-over, kill, timeout, scopes, TTL."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from procpilot.config import Settings
from procpilot.engine.capture import Stream
from procpilot.engine.spawn import SpawnSpec
from procpilot.engine.states import SessionState
from procpilot.engine.supervisor import Supervisor
from procpilot.errors import (
    CommandNotFound,
    InvalidArgument,
    InvalidPattern,
    ProcessAlreadyExited,
    ProtectedVariable,
    SessionNotFound,
    SessionStillRunning,
    StdinClosed,
)
from tests.conftest import PROGRAMS, PY

A = "agent-a"


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False


async def test_foreground_run_captures_exit_and_output(supervisor: Supervisor) -> None:
    s = await supervisor.run(SpawnSpec("echo hello; echo oops >&2; exit 3"), scope=A, yield_ms=None)
    assert s.state is SessionState.EXITED_ERROR
    assert s.exit_code == 3
    assert s.output[Stream.STDOUT].read().data == b"hello\n"
    assert s.output[Stream.STDERR].read().data == b"oops\n"
    assert s.output[Stream.COMBINED].read().data == b"hello\noops\n"
    assert s.started_at is not None and s.ended_at is not None and s.ended_at >= s.started_at


async def test_argv_runs_without_a_shell(supervisor: Supervisor) -> None:
    s = await supervisor.run(SpawnSpec(("printf", "%s|", "a b", "$HOME")), scope=A, yield_ms=None)
    assert s.state is SessionState.EXITED_OK
    assert s.output[Stream.STDOUT].read().data == b"a b|$HOME|"


async def test_combined_view_keeps_arrival_order(supervisor: Supervisor) -> None:
    s = await supervisor.run(SpawnSpec((PY, str(PROGRAMS / "interleave.py"), "20")), scope=A, yield_ms=None)
    lines = s.output[Stream.COMBINED].read().data.decode().splitlines()
    assert lines == [f"line {i} {'out' if i % 2 == 0 else 'err'}" for i in range(20)]


async def test_yield_hands_over_the_same_process_without_losing_output(supervisor: Supervisor) -> None:
    script = "echo before; sleep 0.3; echo after"
    s = await supervisor.run(SpawnSpec(script), scope=A, yield_ms=50)
    assert s.state is SessionState.RUNNING and s.backgrounded
    pid = s.pid
    assert (await supervisor.wait(A, s.id, timeout=10)).reason == "exited"
    assert s.pid == pid
    assert s.output[Stream.COMBINED].read().data == b"before\nafter\n"
    assert s.state is SessionState.EXITED_OK


async def test_background_returns_at_once(supervisor: Supervisor) -> None:
    t0 = time.monotonic()
    s = await supervisor.run(SpawnSpec("sleep 5"), scope=A, yield_ms=0)
    assert time.monotonic() - t0 < 2
    assert s.is_running
    await supervisor.kill(A, s.id, wait=None)
    assert s.state is SessionState.KILLED


async def test_missing_command_is_command_not_found(supervisor: Supervisor) -> None:
    with pytest.raises(CommandNotFound):
        await supervisor.spawn(SpawnSpec("definitely-not-a-command-xyz --flag"), scope=A)
    with pytest.raises(CommandNotFound):
        await supervisor.spawn(SpawnSpec(("definitely-not-a-command-xyz",)), scope=A)
    assert supervisor.list(A) == []


async def test_missing_workdir_is_a_typed_error(supervisor: Supervisor, tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument):
        await supervisor.spawn(SpawnSpec("true", cwd=tmp_path / "nope"), scope=A)


async def test_env_merges_onto_a_clean_base(supervisor: Supervisor, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SECRET_TOKEN_FOR_TEST", "leak")
    s = await supervisor.run(SpawnSpec("env", env={"FOO": "bar"}), scope=A, yield_ms=None)
    env = s.output[Stream.STDOUT].read().data.decode()
    assert "FOO=bar" in env
    assert "SECRET_TOKEN_FOR_TEST" not in env
    assert "PATH=" in env


@pytest.mark.parametrize("name", ["PROCPILOT_SESSION", "PROCPILOT_SUPERVISOR"])
async def test_the_markers_cannot_be_overridden(supervisor: Supervisor, name: str) -> None:
    # Without a cgroup a tree is found by its marker: a command that renamed itself would escape kill.
    with pytest.raises(ProtectedVariable):
        await supervisor.run(SpawnSpec("sleep 30", env={name: "elsewhere"}), scope=A, yield_ms=None)


async def test_every_process_names_its_supervisor(supervisor: Supervisor) -> None:
    s = await supervisor.run(SpawnSpec("env"), scope=A, yield_ms=None)
    env = s.output[Stream.STDOUT].read().data.decode().splitlines()
    assert f"PROCPILOT_SESSION={s.id}" in env
    assert f"PROCPILOT_SUPERVISOR={supervisor.instance}" in env
    assert re.fullmatch(rf"procpilot-{os.getpid()}-[0-9a-f]+", supervisor.instance)


async def test_kill_ends_setsid_daemon_grandchild(supervisor: Supervisor, tmp_path: Path) -> None:
    pid_file = tmp_path / "daemon.pid"
    s = await supervisor.spawn(SpawnSpec((PY, str(PROGRAMS / "daemonize.py"), str(pid_file), "stay")), scope=A)
    assert (await supervisor.wait(A, s.id, timeout=10, pattern=re.compile("parent staying"))).reason == "pattern"
    for _ in range(100):
        if pid_file.exists():
            break
        await asyncio.sleep(0.02)
    daemon = int(pid_file.read_text())
    assert alive(daemon)
    assert os.getsid(daemon) != os.getsid(s.pid or 0)  # it really left the session
    await supervisor.kill(A, s.id, wait=None)
    for _ in range(100):
        if not alive(daemon):
            break
        await asyncio.sleep(0.02)
    assert not alive(daemon), "the setsid'd grandchild survived the kill"
    assert s.state is SessionState.KILLED


async def test_daemon_left_behind_by_finished_command_is_ended(supervisor: Supervisor, tmp_path: Path) -> None:
    pid_file = tmp_path / "daemon.pid"
    s = await supervisor.run(SpawnSpec((PY, str(PROGRAMS / "daemonize.py"), str(pid_file))), scope=A, yield_ms=None)
    assert s.state is SessionState.EXITED_OK
    daemon = int(pid_file.read_text())
    assert not alive(daemon)


async def test_kill_escalates_to_sigkill_after_grace(supervisor: Supervisor) -> None:
    s = await supervisor.spawn(SpawnSpec((PY, str(PROGRAMS / "ignore_term.py"))), scope=A)
    await supervisor.wait(A, s.id, timeout=10, pattern=re.compile("ready"))
    t0 = time.monotonic()
    await supervisor.kill(A, s.id, signal.SIGTERM, grace=0.3, wait=None)
    assert time.monotonic() - t0 >= 0.25
    assert s.state is SessionState.KILLED
    assert s.exit_signal == "SIGKILL"


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
async def test_a_signal_sent_as_the_session_starts_is_not_lost(supervisor: Supervisor, sig: int) -> None:
    """Signalled the moment it starts, its shell may still be forking the command: a child
    between fork and exec catches the signal with the shell's handler, then becomes ``sleep``,
    which never heard it. The signal reaches the command all the same, each start in a row."""
    for _ in range(25):
        s = await supervisor.spawn(SpawnSpec("sleep 30"), scope=A)
        await supervisor.kill(A, s.id, sig, grace=0, wait=0)
        finished = await s.wait_finished(5)
        assert finished and s.state is SessionState.KILLED, (s.state, s.pid)


async def test_what_a_trap_starts_after_a_later_signal_is_left_to_finish(supervisor: Supervisor) -> None:
    """Past a run's first second, a process that joins the tree after a signal is the tree's own
    answer to it (here a trap's cleanup), and is not signalled again."""
    command = "trap 'sleep 0.5 && echo cleaned; exit 0' TERM; echo ready; while :; do sleep 0.05; done"
    s = await supervisor.spawn(SpawnSpec(command), scope=A)
    await supervisor.wait(A, s.id, timeout=10, pattern=re.compile("ready"))
    await asyncio.sleep(1.1)  # the run is past its first second (not a wait for an event)
    await supervisor.kill(A, s.id, signal.SIGTERM, grace=0, wait=0)
    assert await s.wait_finished(10)
    assert b"cleaned" in s.output[Stream.COMBINED].read().data


async def test_kill_after_exit_is_process_already_exited(supervisor: Supervisor) -> None:
    s = await supervisor.run(SpawnSpec("true"), scope=A, yield_ms=None)
    with pytest.raises(ProcessAlreadyExited):
        await supervisor.kill(A, s.id)


async def test_timeout_ends_tree_and_keeps_partial_output(supervisor: Supervisor) -> None:
    s = await supervisor.run(SpawnSpec("echo partial; sleep 30", timeout=0.3), scope=A, yield_ms=None)
    assert s.state is SessionState.TIMED_OUT
    assert s.output[Stream.COMBINED].read().data == b"partial\n"
    assert s.duration_ms < 10_000


async def test_timeout_with_grandchild_holding_the_pipe_does_not_hang(supervisor: Supervisor) -> None:
    spec = SpawnSpec("(sleep 60; echo late) & echo started; wait", timeout=0.3)
    s = await supervisor.run(spec, scope=A, yield_ms=None)
    assert s.state is SessionState.TIMED_OUT
    assert b"started" in s.output[Stream.COMBINED].read().data


async def test_stdin_write_and_eof(supervisor: Supervisor) -> None:
    s = await supervisor.spawn(SpawnSpec("tr a-z A-Z"), scope=A)
    await supervisor.write(A, s.id, b"hello ")
    await supervisor.write(A, s.id, b"world\n", eof=True)
    assert (await supervisor.wait(A, s.id, timeout=10)).reason == "exited"
    assert s.output[Stream.STDOUT].read().data == b"HELLO WORLD\n"


async def test_waiting_for_input_is_detected(supervisor: Supervisor) -> None:
    s = await supervisor.spawn(SpawnSpec("read line; echo got $line"), scope=A)
    for _ in range(100):
        if s.waiting_for_input:
            break
        await asyncio.sleep(0.02)
    assert s.waiting_for_input
    await supervisor.write(A, s.id, b"x\n")
    await supervisor.wait(A, s.id, timeout=10)
    assert s.output[Stream.STDOUT].read().data == b"got x\n"


async def test_pty_session_gets_a_terminal_and_ctrl_c(supervisor: Supervisor) -> None:
    s = await supervisor.spawn(
        SpawnSpec(
            "tty; stty size; trap 'echo got-int; exit 7' INT; echo ready; while :; do sleep 0.05; done", pty=True
        ),
        scope=A,
    )
    assert (await supervisor.wait(A, s.id, timeout=10, pattern=re.compile("ready"))).reason == "pattern"
    out = s.output[Stream.COMBINED].read().data.decode()
    assert "/dev/pts/" in out
    assert "30 120" in out
    await supervisor.write(A, s.id, b"\x03")
    assert (await supervisor.wait(A, s.id, timeout=10)).reason == "exited"
    assert "got-int" in s.output[Stream.COMBINED].read().data.decode()
    assert s.exit_code == 7


async def test_scopes_are_isolated(supervisor: Supervisor) -> None:
    s = await supervisor.spawn(SpawnSpec("sleep 5"), scope=A)
    with pytest.raises(SessionNotFound):
        supervisor.get("agent-b", s.id)
    with pytest.raises(SessionNotFound):
        await supervisor.kill("agent-b", s.id)
    with pytest.raises(SessionNotFound):
        await supervisor.write("agent-b", s.id, b"x")
    assert supervisor.list("agent-b") == []
    assert s.is_running
    await supervisor.remove(A, s.id)


async def test_session_ids_are_random_and_unique(supervisor: Supervisor) -> None:
    ids = {(await supervisor.run(SpawnSpec("true"), scope=A, yield_ms=None)).id for _ in range(20)}
    assert len(ids) == 20
    assert all(re.fullmatch(r"[a-z0-9]{16}", i) for i in ids)


async def test_clear_and_remove(supervisor: Supervisor) -> None:
    running = await supervisor.spawn(SpawnSpec("sleep 5"), scope=A)
    with pytest.raises(SessionStillRunning):
        supervisor.clear(A, running.id)
    directory = running.output.directory
    await supervisor.remove(A, running.id)
    assert running.state is SessionState.KILLED
    assert not directory.exists()
    with pytest.raises(SessionNotFound):
        supervisor.get(A, running.id)
    done = await supervisor.run(SpawnSpec("true"), scope=A, yield_ms=None)
    supervisor.clear(A, done.id)
    assert supervisor.list(A) == []


async def test_ttl_sweep_removes_only_expired_finished_sessions(supervisor: Supervisor) -> None:
    done = await supervisor.run(SpawnSpec("echo x"), scope=A, yield_ms=None)
    running = await supervisor.spawn(SpawnSpec("sleep 5"), scope=A)
    ttl = supervisor.settings.exec.cleanup_ms / 1000
    assert supervisor.sweep(time.monotonic() + ttl / 2) == []
    assert supervisor.sweep(time.monotonic() + ttl + 1) == [done.id]
    assert not done.output.directory.exists()
    assert [s.id for s in supervisor.list(A)] == [running.id]
    await supervisor.remove(A, running.id)


async def test_exit_events_once_per_session(supervisor: Supervisor) -> None:
    seen = []
    supervisor.on_exit(seen.append)
    sub = supervisor.exit_events()
    s = await supervisor.run(SpawnSpec("echo bye; exit 2"), scope=A, yield_ms=None)
    event = await sub.get(timeout=5)
    assert event is not None and event.session_id == s.id
    assert event.exit_code == 2 and event.state is SessionState.EXITED_ERROR
    assert "bye" in event.tail
    assert await sub.get(timeout=0.2) is None
    assert [e.session_id for e in seen] == [s.id]
    sub.close()


async def test_wait_for_pattern_and_timeout(supervisor: Supervisor) -> None:
    s = await supervisor.spawn(SpawnSpec("echo boot; sleep 0.2; echo 'listening on 8080'; sleep 5"), scope=A)
    out = await supervisor.wait(A, s.id, timeout=10, pattern=re.compile(r"listening on (\d+)"))
    assert out.reason == "pattern" and out.match == "listening on 8080"
    assert s.is_running
    assert (await supervisor.wait(A, s.id, timeout=0.1)).reason == "timeout"
    await supervisor.remove(A, s.id)


async def test_utf8_split_across_reads_is_not_garbled(supervisor: Supervisor) -> None:
    # "é" is two bytes; printf writes them in two separate writes a moment apart.
    s = await supervisor.run(SpawnSpec(r"printf '\303'; sleep 0.1; printf '\251\n'"), scope=A, yield_ms=None)
    assert s.output[Stream.STDOUT].read().data.decode() == "é\n"


async def test_shutdown_ends_every_tree(settings, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    pid_file = tmp_path / "d.pid"
    sup = await Supervisor(settings).start()
    s = await sup.spawn(SpawnSpec((PY, str(PROGRAMS / "daemonize.py"), str(pid_file), "stay")), scope=A)
    await sup.wait(A, s.id, timeout=10, pattern=re.compile("staying"))
    for _ in range(100):
        if pid_file.exists():
            break
        await asyncio.sleep(0.02)
    daemon = int(pid_file.read_text())
    await sup.aclose()
    assert s.state is SessionState.KILLED
    assert not alive(daemon)


async def test_two_supervisors_in_one_process_do_not_touch_each_others_trees(
    settings,
    tmp_path: Path,  # type: ignore[no-untyped-def]
) -> None:
    from procpilot.config import load_settings

    other = load_settings(env={}, state_dir=tmp_path / "state2", workspace_root=settings.workspace_root)
    async with Supervisor(settings) as one:
        s = await one.spawn(SpawnSpec("sleep 30"), scope=A)
        async with Supervisor(other) as two:
            await two.run(SpawnSpec("true"), scope=A, yield_ms=None)
        # Closing the second left the first's session (and its cgroup) alone.
        assert s.is_running
        assert s.pid is not None and s.pid in one._tree_backend.pids(s.id, s.pid)
        await one.kill(A, s.id, signal.SIGKILL, wait=None)
        assert s.state is SessionState.KILLED


async def test_a_cancelled_aclose_still_ends_every_tree(settings) -> None:  # type: ignore[no-untyped-def]
    sup = await Supervisor(settings).start()
    s = await sup.spawn(SpawnSpec((PY, str(PROGRAMS / "ignore_term.py"))), scope=A)
    await sup.wait(A, s.id, timeout=10, pattern=re.compile("ready"))
    closing = asyncio.ensure_future(sup.aclose(grace=0.5))
    await asyncio.sleep(0.1)
    closing.cancel()  # the caller gives up; the shutdown must not
    with pytest.raises(asyncio.CancelledError):
        await closing
    assert s.is_running  # SIGTERM ignored, the grace not yet over
    await sup.aclose()  # a second call waits for the same shutdown
    assert s.state is SessionState.KILLED
    assert s.signal_sent == "SIGKILL"


async def test_transient_emfile_is_retried(supervisor: Supervisor) -> None:
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    in_use = len(os.listdir("/proc/self/fd"))
    # Leave too few descriptors for the pipes: the first attempt fails with EMFILE...
    resource.setrlimit(resource.RLIMIT_NOFILE, (in_use + 1, hard))
    loop = asyncio.get_running_loop()
    # ...and give them back while the supervisor backs off.
    loop.call_later(0.005, resource.setrlimit, resource.RLIMIT_NOFILE, (soft, hard))
    try:
        s = await supervisor.run(SpawnSpec("echo survived"), scope=A, yield_ms=None)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert s.output[Stream.STDOUT].read().data == b"survived\n"


async def test_the_store_keeps_each_sessions_latest_record(supervisor: Supervisor) -> None:
    from procpilot.engine.store import FileStore

    s = await supervisor.run(SpawnSpec("exit 5"), scope=A, yield_ms=None)
    await asyncio.sleep(0)  # without an owner, the end is written once the caller has run (store.py)
    records = FileStore(supervisor.settings.state_dir).load()
    assert records[s.id]["state"] == "exited_error"
    assert records[s.id]["exit_code"] == 5
    assert records[s.id]["pid"] == s.pid


async def test_a_spawn_failing_with_any_exception_leaves_no_files_and_frees_its_lane(supervisor: Supervisor) -> None:
    sessions = supervisor.settings.state_dir / "sessions"
    bad_env: Any = {"K": 1}  # not a str: a TypeError deep in the spawn path, not a ProcpilotError
    with pytest.raises(TypeError):
        await supervisor.spawn(SpawnSpec("true", env=bad_env, lane="main"), scope=A)
    with pytest.raises(InvalidArgument):
        await supervisor.spawn(SpawnSpec("echo a\0b", lane="main"), scope=A)
    assert not sessions.exists() or list(sessions.iterdir()) == []
    assert supervisor.list(A) == []
    s = await supervisor.spawn(SpawnSpec("true", lane="main"), scope=A)
    assert s.state is not SessionState.QUEUED  # the failed spawns gave their lane slot back
    await supervisor.wait(A, s.id, timeout=10)


async def test_a_write_blocked_on_a_full_pipe_ends_when_the_session_does(supervisor: Supervisor) -> None:
    s = await supervisor.spawn(SpawnSpec("sleep 0.5"), scope=A)
    with pytest.raises(StdinClosed) as caught:
        await asyncio.wait_for(supervisor.write(A, s.id, b"x" * (4 << 20)), timeout=10)
    assert 0 < caught.value.details["bytes_written"] < 4 << 20  # says how much got in before the end
    assert (await supervisor.wait(A, s.id, timeout=10)).reason == "exited"


async def test_pty_sessions_track_bracketed_paste_mode_from_their_output(supervisor: Supervisor) -> None:
    on = await supervisor.run(SpawnSpec(r"printf 'a\033[?1;2004hb'", pty=True), scope=A, yield_ms=None)
    off = await supervisor.run(SpawnSpec(r"printf '\033[?2004h x \033[?2004l'", pty=True), scope=A, yield_ms=None)
    pipe = await supervisor.run(SpawnSpec(r"printf '\033[?2004h'"), scope=A, yield_ms=None)
    assert on.terminal.bracketed_paste and not off.terminal.bracketed_paste and not pipe.terminal.bracketed_paste


async def test_wait_finds_a_pattern_across_a_scan_chunk_edge_inside_a_character(supervisor: Supervisor) -> None:
    # "é" is two bytes: the first is the last byte of the first 1 MiB scan chunk.
    script = "import sys; sys.stdout.buffer.write(b'a' * ((1 << 20) - 1) + 'éMARK'.encode()); sys.stdout.flush()"
    s = await supervisor.run(SpawnSpec((PY, "-c", script)), scope=A, yield_ms=None)
    outcome = await supervisor.wait(A, s.id, timeout=5, pattern=re.compile("aéMARK"))
    assert outcome.reason == "pattern" and outcome.match == "aéMARK"


async def test_remove_of_a_running_session_terminates_before_it_kills(supervisor: Supervisor) -> None:
    script = "trap 'echo cleaning up; exit 0' TERM; echo ready; while :; do sleep 0.05; done"
    s = await supervisor.spawn(SpawnSpec(script), scope=A)
    await supervisor.wait(A, s.id, timeout=10, pattern=re.compile("ready"))
    await supervisor.remove(A, s.id)
    assert s.signal_sent == "SIGTERM" and s.exit_code == 0  # it had its chance to clean up


async def test_a_big_command_is_checked_in_a_thread_that_does_not_stay(settings: Settings) -> None:
    seen: list[str] = []

    def spawn_filter(scope: str, spec: SpawnSpec, running: int) -> SpawnSpec:
        seen.append(threading.current_thread().name)
        if "refuse" in spec.display:
            raise InvalidArgument("refused by the filter")
        return spec

    def threads() -> int:
        # Not the reaper that runs after a last close (engine/children.py): it comes and goes with
        # what earlier tests left to reap, and adds nothing to a spawn.
        return sum(1 for t in threading.enumerate() if t.name != "procpilot-reaper")

    before = threads()
    async with Supervisor(settings, spawn_filter=spawn_filter) as sup:
        big = "true " + "# padding " * 1000  # over 4 KiB: checked off the loop
        done = await sup.run(SpawnSpec(big), scope=A, yield_ms=None)
        assert done.state is SessionState.EXITED_OK
        with pytest.raises(InvalidArgument, match="refused by the filter"):
            await sup.spawn(SpawnSpec(big + " refuse"), scope=A)
        await sup.run(SpawnSpec("true"), scope=A, yield_ms=None)  # small: on the loop
    assert seen[:2] == ["procpilot-check"] * 2 and seen[2] == threading.main_thread().name
    # no pool left behind: a thread that lives makes every later spawn of the process dearer
    assert threads() == before


async def test_a_catastrophic_wait_pattern_never_holds_the_event_loop(supervisor: Supervisor) -> None:
    # The scan gives up after half a second either way; what matters to every other agent is that
    # the loop keeps running meanwhile (it would not tick at all if the scan ran on it).
    s = await supervisor.spawn(SpawnSpec("printf '%060d' 0 | tr 0 a; echo b; sleep 30"), scope=A)
    await supervisor.wait(A, s.id, pattern=re.compile("b"), timeout=10)
    ticks = 0
    waiting = asyncio.ensure_future(supervisor.wait(A, s.id, pattern=re.compile("(a|aa)+$"), timeout=10))
    while not waiting.done():
        await asyncio.sleep(0.01)
        ticks += 1
    with pytest.raises(InvalidPattern, match="backtracking"):
        waiting.result()
    assert ticks >= 5, ticks
    await supervisor.kill(A, s.id, wait=None)


async def test_output_waits_in_its_pipe_while_no_descriptor_is_free(supervisor: Supervisor) -> None:
    import resource

    s = await supervisor.run(SpawnSpec('read line; echo "got $line"'), scope=A, yield_ms=0)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    # The log's file is opened at the first byte: with a limit of 3 (0-2 are open) it cannot be,
    # whatever other descriptors close meanwhile; those already open go on working.
    resource.setrlimit(resource.RLIMIT_NOFILE, (3, hard))
    try:
        await s.write(b"it\n")
        await asyncio.sleep(0.2)  # the command printed; its bytes must wait, not be dropped
        assert s.output[Stream.COMBINED].read().data == b""
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert await s.wait_finished(timeout=10)
    combined = s.output[Stream.COMBINED]
    assert combined.read().data == b"got it\n"
    assert combined.lost == 0
