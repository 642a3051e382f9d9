"""Agents take turns at a real daemon (procpilot/turns.py): one agent's flood of calls waits behind
its own calls, never before another agent's, and past its queue it is told so at once.

The daemon here keeps a call's turn for the whole run of its command (``requests_short_run_ms``
of 30 s; 100 ms by default), so a command that waits for the test's word holds its agent's one
turn (``requests_working_per_agent = 1``) for as long as the test likes: what is asserted is the
order in which calls are worked on, never how long they took.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from websockets.asyncio.client import ClientConnection, connect

from tests.daemon import TOKEN_A, TOKEN_B, Served, cleanup, post, start_daemon

SERVER = (
    "requests_per_agent = 3\nrequests_queued_per_agent = 1\nrequests_working_per_agent = 1\n"
    "requests_short_run_ms = 30000"
)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    daemon = start_daemon(tmp_path_factory.mktemp("turns"), server=SERVER)
    yield daemon
    assert daemon.stop() == 0, daemon.log_text()


def _until(name: str) -> str:
    """A command that runs until the test creates ``name`` in the workspace (at most 20 s)."""
    return f"for i in $(seq 2000); do [ -e {name} ] && exit 0; sleep 0.01; done; exit 1"


def _exec(served: Served, token: str, command: str) -> httpx2.Response:
    with served.http(token) as client:
        return post(client, "exec", command=command, yieldMs=60_000)


def test_a_quiet_agents_call_is_worked_on_before_a_flooding_agents_queued_calls(served: Served) -> None:
    ws = served.root / "ws"
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        # agent-a's turn is held by a command that runs until the test says so...
        holding = pool.submit(_exec, served, TOKEN_A, f"touch a1-running; {_until('release-a1')}")
        _wait_for(ws / "a1-running", holding)
        # ...and its next call waits for that turn: its command has not started,
        queued = pool.submit(_exec, served, TOKEN_A, "touch a2-ran")
        # while agent-b's call is worked on at once: its command looks for a2-ran for a second
        # and sees none (before: both agents' calls ran at once, and it saw a2-ran at once).
        seen = _exec(
            served, TOKEN_B, "for i in $(seq 100); do [ -e a2-ran ] && echo saw && exit; sleep 0.01; done; echo none"
        )
        assert seen.status_code == 200 and seen.json()["data"]["output"] == "none\n", seen.text
        assert not (ws / "a2-ran").exists() and not queued.done()
        (ws / "release-a1").touch()
        assert holding.result(60).status_code == 200
        assert queued.result(60).status_code == 200 and (ws / "a2-ran").exists()
    with served.http(TOKEN_A) as a, served.http(TOKEN_B) as b:
        cleanup(a)
        cleanup(b)


def test_past_its_queue_an_agents_call_is_refused_at_once_and_the_rest_are_served(served: Served) -> None:
    ws = served.root / "ws"
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        holding = pool.submit(_exec, served, TOKEN_A, f"touch q-running; {_until('release-q')}")
        _wait_for(ws / "q-running", holding)
        # Six more calls of agent-a: two take its last two places, one the one queue slot, and
        # the three left over are refused at once with a typed error (never dropped, never an
        # unbounded queue), whatever order they arrive in.
        more = [pool.submit(_exec, served, TOKEN_A, "true") for _ in range(6)]
        answered: set[concurrent.futures.Future[httpx2.Response]] = set()
        while len(answered) < 3:
            done, _ = concurrent.futures.wait(
                set(more) - answered, timeout=30, return_when=concurrent.futures.FIRST_COMPLETED
            )
            assert done, "no call of agent-a was refused"
            answered |= done
        for response in (f.result() for f in answered):
            assert response.status_code == 429 and response.json()["error"] == "TooManyRequests", response.text
            assert response.json()["hints"]
        with served.http(TOKEN_B) as b:  # the other agent is served meanwhile
            assert post(b, "exec", command="echo b").json()["data"]["output"] == "b\n"
        (ws / "release-q").touch()
        assert holding.result(60).status_code == 200
        statuses = sorted(f.result(60).status_code for f in more)
        assert statuses == [200, 200, 200, 429, 429, 429]
    with served.http(TOKEN_A) as a, served.http(TOKEN_B) as b:
        cleanup(a)
        cleanup(b)


async def test_an_mcp_call_waiting_on_output_lets_its_agents_next_call_work(served: Served) -> None:
    # The MCP SDK runs a POST's tool in a task of its own: the call's turn must still be given
    # back while the tool waits, as a REST call's is. Kept, agent-a's one turn would stay with
    # the waiting poll, and its REST call below would wait the poll's 60 s out.
    waiting = asyncio.Event()

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        waiting.set()  # sent once the tool has waited a second: the poll is in its wait

    async with served.mcp(TOKEN_A, mode="legacy") as a:
        started = await a.call_tool("exec", {"command": "sleep 60", "background": True})
        session = (started.structured_content or {})["sessionId"]
        arguments = {"action": "poll", "sessionId": session, "timeout": 60_000}
        poll = asyncio.ensure_future(a.call_tool("process", arguments, progress_callback=on_progress))
        async with served.ahttp(TOKEN_A) as rest:
            try:
                await asyncio.wait_for(waiting.wait(), 30)
                answered = await rest.post("/v1/tools/exec", json={"command": "echo next"})
                assert answered.json()["data"]["output"] == "next\n" and not poll.done()
            finally:
                await rest.post("/v1/tools/process", json={"action": "kill", "sessionId": session})
            assert (await asyncio.wait_for(poll, 30)).structured_content is not None
            await rest.post("/v1/tools/process", json={"action": "remove", "sessionId": session})


async def test_a_proc_request_waits_for_its_own_agents_turn_and_never_for_anothers(served: Served) -> None:
    # proc/* requests take the same turns: agent-a's spawn waits while agent-a's REST call holds
    # its turn, and agent-b's spawn runs meanwhile (before: both ran at once).
    ws = served.root / "ws"
    marker = ws / "p-a-ran"
    url = served.url.replace("http://", "ws://") + "/v1/proc"
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        holding = pool.submit(_exec, served, TOKEN_A, f"touch p-running; {_until('release-p')}")
        await asyncio.to_thread(_wait_for, ws / "p-running", holding)
        async with (
            connect(url, additional_headers=served.headers(TOKEN_A)) as a,
            connect(url, additional_headers=served.headers(TOKEN_B)) as b,
        ):
            await a.send(json.dumps({"type": "proc/spawn/req", "id": "a", "cmd": ["touch", str(marker)]}))
            look = f"for i in $(seq 100); do [ -e {marker} ] && echo saw && exit; sleep 0.01; done; echo none"
            await b.send(json.dumps({"type": "proc/spawn/req", "id": "b", "cmd": ["sh", "-c", look]}))
            frames = await _frames_until(b, lambda f: f.get("type") == "proc/exit/event")
            assert "".join(f.get("data", "") for f in frames if f["type"] == "proc/read/event") == "none\n"
            assert not marker.exists()
            (ws / "release-p").touch()
            assert (await asyncio.wrap_future(holding)).status_code == 200
            answered = await _frames_until(a, lambda f: f.get("id") == "a")
            assert answered[-1]["type"] == "proc/spawn/resp" and not answered[-1].get("error"), answered
            await _frames_until(a, lambda f: f.get("type") == "proc/exit/event")
            assert marker.exists()


async def _frames_until(ws: ClientConnection, last: Callable[[dict[str, Any]], bool]) -> list[dict[str, Any]]:
    frames: list[dict[str, Any]] = []
    while not frames or not last(frames[-1]):
        frames.append(json.loads(await asyncio.wait_for(ws.recv(), 30)))
    return frames


def _wait_for(path: Path, call: concurrent.futures.Future[httpx2.Response]) -> None:
    """Until the command has made ``path`` (its call failing first fails the test)."""
    for _ in range(3000):
        if path.exists():
            return
        if call.done():
            pytest.fail(f"the call ended before {path.name} appeared: {call.result().text}")
        concurrent.futures.wait([call], timeout=0.01)
    pytest.fail(f"{path.name} never appeared")
