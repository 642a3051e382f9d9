"""Closing a stream or stopping the daemon's app while the caller itself is cancelled: the caller ends
cancelled. Awaiting a cancelled task inside ``suppress(BaseException)`` used to hand the caller's
cancellation to that task and swallow it, so the caller ran on as if never asked to stop."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from procpilot.client import ProcsClient, WebSocketTransport
from procpilot.config import load_settings
from procpilot.transports.http import daemon_of
from procpilot.transports.serve import daemon_app, make_supervisor
from tests.daemon import TOKEN_A, TOKENS, Served, daemon_env, start_daemon, write_config


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    daemon = start_daemon(tmp_path_factory.mktemp("cancel"))
    yield daemon
    assert daemon.stop() == 0, daemon.log_text()


async def _cancel_inside(closing: asyncio.Task[None]) -> None:
    """Cancel ``closing`` once it waits for the task it cancelled; it must end cancelled."""
    # One turn of the loop runs the new task up to its first suspension (asyncio runs ready
    # callbacks in order): it has cancelled its own task and waits for it to end.
    await asyncio.sleep(0)
    assert not closing.done()
    closing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await closing
    assert closing.cancelled()


async def test_a_cancelled_aclose_of_the_websocket_transport_ends_cancelled(served: Served) -> None:
    transport = WebSocketTransport(served.url, TOKEN_A)
    await transport.connect()
    await _cancel_inside(asyncio.ensure_future(transport.aclose()))
    assert transport.closed_error is not None  # and the reader ended all the same


async def test_a_cancelled_aclose_of_the_procs_client_ends_cancelled(served: Served) -> None:
    procs = ProcsClient(served.url, TOKEN_A)
    await procs.connect()
    await _cancel_inside(asyncio.ensure_future(procs.aclose()))
    await procs.aclose()  # a second close is harmless


@pytest.fixture
async def app(tmp_path: Path) -> AsyncIterator[object]:
    settings = load_settings(write_config(tmp_path, TOKENS), env=daemon_env(tmp_path))
    settings.state_dir.mkdir(parents=True, exist_ok=True)
    async with make_supervisor(settings) as sup, daemon_app(sup, settings) as app:
        yield app


async def test_a_cancelled_shutdown_of_the_app_ends_cancelled(app: object) -> None:
    """The lifespan's exit cancels the daemon's own tasks and waits for them; a cancellation of the
    shutdown itself while it waits is not mistaken for one of theirs."""
    told, release = asyncio.Event(), asyncio.Event()

    async def slow_to_stop() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            told.set()
            await release.wait()
            raise

    entered, leave = asyncio.Event(), asyncio.Event()

    async def serving() -> None:
        async with app.router.lifespan_context(app):  # type: ignore[attr-defined]
            daemon_of(app).spawn(slow_to_stop())  # type: ignore[arg-type]
            entered.set()
            await leave.wait()

    server = asyncio.ensure_future(serving())
    await entered.wait()
    leave.set()
    await told.wait()  # the shutdown waits for the slow task now
    server.cancel()
    with pytest.raises(asyncio.CancelledError):
        await server
    release.set()
