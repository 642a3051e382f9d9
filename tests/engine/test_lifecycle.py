"""The supervisor's lifecycle (engine/lifecycle.py): new -> running -> closing -> closed, each edge
taken by the real Supervisor, and every way of starting work refused once it is closing or closed."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from procpilot.config import Settings
from procpilot.engine.lifecycle import IllegalLifecycleMove, Lifecycle, SupervisorState
from procpilot.engine.spawn import SpawnSpec
from procpilot.engine.states import SessionState
from procpilot.engine.supervisor import Supervisor
from procpilot.errors import StateDirDamaged, SupervisorClosed

A = "agent-a"
NEW, RUNNING, CLOSING, CLOSED = (
    SupervisorState.NEW,
    SupervisorState.RUNNING,
    SupervisorState.CLOSING,
    SupervisorState.CLOSED,
)


@pytest.mark.parametrize(
    ("path", "refused"),
    [
        ((RUNNING, CLOSING, CLOSED), None),
        ((CLOSED,), None),
        ((CLOSING,), CLOSING),  # a supervisor that never ran has nothing to close
        ((RUNNING, RUNNING), RUNNING),
        ((RUNNING, CLOSED), CLOSED),  # closing always passes through its shutdown
        ((RUNNING, CLOSING, CLOSED, RUNNING), RUNNING),  # a closed one never runs again
        ((CLOSED, NEW), NEW),
    ],
)
def test_the_table_allows_only_its_edges(path: tuple[SupervisorState, ...], refused: SupervisorState | None) -> None:
    life = Lifecycle()
    for step in path[:-1]:
        life.move(step)
    if refused is None:
        life.move(path[-1])
        assert life.state is path[-1]
    else:
        with pytest.raises(IllegalLifecycleMove, match=f"to {refused.value}"):
            life.move(path[-1])
        assert life.state is (path[-2] if len(path) > 1 else NEW)  # where it was


def test_only_closing_and_closed_are_ending() -> None:
    assert [s for s in SupervisorState if s.is_ending] == [CLOSING, CLOSED]


async def test_start_then_aclose_pass_through_every_state(settings: Settings) -> None:
    sup = Supervisor(settings, warm_shells=0)
    assert sup.state is NEW
    assert await sup.start() is sup
    assert sup.state is RUNNING
    assert await sup.start() is sup  # again while running: nothing
    s = await sup.spawn(SpawnSpec("sleep 30"), scope=A)
    closing = asyncio.ensure_future(sup.aclose(grace=1))
    await asyncio.sleep(0)  # the shutdown has begun: its trees are ending
    assert sup.state is CLOSING
    with pytest.raises(SupervisorClosed):  # nothing new starts while the old ends
        await sup.spawn(SpawnSpec("true"), scope=A)
    await closing
    assert sup.state is CLOSED
    assert s.state is SessionState.KILLED
    await sup.aclose()  # idempotent
    assert sup.state is CLOSED


async def test_a_spawn_after_close_is_refused_with_a_hint(settings: Settings) -> None:
    sup = await Supervisor(settings, warm_shells=0).start()
    await sup.aclose()
    with pytest.raises(SupervisorClosed) as refused:
        await sup.run(SpawnSpec("echo late"), scope=A, yield_ms=None)
    assert refused.value.code == "SupervisorClosed" and refused.value.http_status == 503
    assert refused.value.details == {"state": "closed"} and "retry" in refused.value.hints
    assert sup.list(A) == []
    with pytest.raises(SupervisorClosed):
        await sup.start()  # a closed supervisor never starts again


async def test_a_supervisor_closed_before_it_started_starts_nothing(settings: Settings) -> None:
    """No state directory, no warm shell, no housekeeping: the refusal comes before any of them."""
    sup = Supervisor(settings, warm_shells=2)
    await sup.aclose()
    assert sup.state is CLOSED
    with pytest.raises(SupervisorClosed, match="closed"):
        await sup.spawn(SpawnSpec("echo never"), scope=A)
    with pytest.raises(SupervisorClosed):
        async with sup:
            pass
    assert sup.state is CLOSED
    assert not settings.engine.state_dir.exists()
    assert sup.warm_shells()["size"] == 0


async def test_a_failed_start_leaves_it_new_and_a_later_spawn_tries_again(settings: Settings) -> None:
    state_dir = settings.engine.state_dir
    state_dir.write_text("not a directory")
    sup = Supervisor(settings, warm_shells=0)
    with pytest.raises(StateDirDamaged):
        await sup.start()
    assert sup.state is NEW
    state_dir.unlink()
    s = await sup.run(SpawnSpec("echo up"), scope=A, yield_ms=None)
    assert sup.state is RUNNING and s.state is SessionState.EXITED_OK
    await sup.aclose()
    assert sup.state is CLOSED


async def test_detach_passes_through_closing_to_closed(settings: Settings, tmp_path: Path) -> None:
    sup = await Supervisor(settings, owner="lifecycle", warm_shells=0).start()
    assert sup.can_detach
    detaching = asyncio.ensure_future(sup.detach())
    await asyncio.sleep(0)
    assert sup.state is CLOSING
    await detaching
    assert sup.state is CLOSED
    with pytest.raises(SupervisorClosed):
        await sup.spawn(SpawnSpec("true"), scope=A)
    async with Supervisor(settings, owner="lifecycle", warm_shells=0) as nxt:  # the lock is free again
        assert nxt.state is RUNNING
