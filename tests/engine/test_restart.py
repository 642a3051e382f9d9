"""Restart policies: a long-lived session started again when it ends on its own, same id, same log."""

from __future__ import annotations

import re
from pathlib import Path

from procpilot.config import Settings
from procpilot.engine.capture import Stream
from procpilot.engine.restart import RestartPolicy
from procpilot.engine.session import ExitInfo, Session
from procpilot.engine.spawn import SpawnSpec
from procpilot.engine.states import SessionState
from procpilot.engine.supervisor import Supervisor


def log(session: Session) -> str:
    view = session.output[Stream.COMBINED]
    return view.read(0, view.size).data.decode()


async def test_on_failure_restarts_until_the_limit_then_ends_as_the_last_run(supervisor: Supervisor) -> None:
    exits: list[ExitInfo] = []
    supervisor.on_exit(exits.append)
    policy = RestartPolicy("on-failure", max_restarts=2, backoff=0.01)
    session = await supervisor.spawn(SpawnSpec("echo run; exit 3", restart=policy), scope="a")
    await session.wait_finished(20)
    assert (session.state, session.exit_code, session.restarts) == (SessionState.EXITED_ERROR, 3, 2)
    text = log(session)
    assert text.count("run\n") == 3
    assert "[procpilot] ended with exit code 3; restart 1 of 2" in text and "restart 2 of 2" in text
    assert [e.session_id for e in exits] == [session.id]  # one exit, at the very end
    assert supervisor.get("a", session.id) is session


async def test_on_failure_stops_at_a_clean_exit_and_always_restarts_it(supervisor: Supervisor, workspace: Path) -> None:
    # Fails on its first run only (a counter file), then exits 0.
    script = 'n=$(cat count 2>/dev/null || echo 0); echo $((n+1)) > count; echo "run $n"; [ "$n" -ge 1 ]'
    policy = RestartPolicy("on-failure", max_restarts=5, backoff=0.01)
    session = await supervisor.spawn(SpawnSpec(script, cwd=workspace, restart=policy), scope="a")
    await session.wait_finished(20)
    assert (session.state, session.restarts) == (SessionState.EXITED_OK, 1)
    assert log(session).startswith("run 0\n[procpilot] ended with exit code 1; restart 1 of 5")
    always = RestartPolicy("always", max_restarts=2, backoff=0.01)
    session = await supervisor.spawn(SpawnSpec("echo up", restart=always), scope="a")
    await session.wait_finished(20)
    assert (session.state, session.restarts, log(session).count("up\n")) == (SessionState.EXITED_OK, 2, 3)


async def test_kill_stops_restarting_while_running_and_between_runs(supervisor: Supervisor) -> None:
    policy = RestartPolicy("always", max_restarts=5, backoff=0.01)
    running = await supervisor.spawn(SpawnSpec("sleep 30", restart=policy), scope="a")
    await supervisor.kill("a", running.id, wait=None)
    assert (running.state, running.restarts) == (SessionState.KILLED, 0)
    slow = RestartPolicy("on-failure", max_restarts=5, backoff=60)
    waiting = await supervisor.spawn(SpawnSpec("echo once; exit 1", restart=slow), scope="a")
    outcome = await supervisor.wait("a", waiting.id, timeout=20, pattern=re.compile("restart 1 of 5"))
    assert outcome.reason == "pattern" and waiting.is_running and waiting.pid is None  # between two runs
    assert waiting.state is SessionState.RESTARTING
    await supervisor.kill("a", waiting.id, wait=None)
    assert (waiting.state, waiting.restarts, waiting.exit_code) == (SessionState.KILLED, 1, 1)
    assert log(waiting).count("once\n") == 1


async def test_shutting_down_ends_a_session_waiting_to_restart(settings: Settings) -> None:
    slow = RestartPolicy("always", max_restarts=5, backoff=60)
    async with Supervisor(settings) as sup:
        session = await sup.spawn(SpawnSpec("true", restart=slow), scope="a")
        await sup.wait("a", session.id, timeout=20, pattern=re.compile("restart 1 of 5"))
    assert (session.state, session.restarts) == (SessionState.KILLED, 1)


async def test_a_restart_that_cannot_start_ends_the_session_saying_why(supervisor: Supervisor, workspace: Path) -> None:
    script = workspace / "run.sh"
    script.write_text("#!/bin/sh\nrm -f run.sh\necho gone\nexit 4\n")
    script.chmod(0o755)
    policy = RestartPolicy("on-failure", max_restarts=3, backoff=0.01)
    session = await supervisor.spawn(SpawnSpec("./run.sh", cwd=workspace, restart=policy), scope="a")
    await session.wait_finished(20)
    assert (session.state, session.exit_code, session.restarts) == (SessionState.EXITED_ERROR, 4, 1)
    assert session.error is not None and session.error.startswith("restart 1 could not start: CommandNotFound")
