"""Text an agent sends that UTF-8 cannot hold (a lone surrogate) or that nests past the parser's
bound, against a real `procpilot serve`: written everywhere as U+FFFD, never an exception that
closes a stream (issue 20, finding 2)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import AsyncIterator, Iterator
from typing import Any

import anyio
import pytest
from websockets.asyncio.client import connect

from tests.daemon import PROCPILOT, Served, cli_env, start_daemon

TOKENS = {"tok-hostile-alpha-01234": "agent-a", "tok-hostile-ops-012345": "ops"}
TOKEN_A, TOKEN_OPS = list(TOKENS)
# Raw bodies: json.dumps would write the escape, but this is what a hostile client sends.
SURROGATE_EXEC = b'{"command":"echo \\ud800 lone"}'
JSON = {"content-type": "application/json"}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    daemon = start_daemon(tmp_path_factory.mktemp("hostile"), TOKENS, server='operators = ["ops"]')
    yield daemon
    assert daemon.stop() == 0, daemon.log_text()


async def _events(lines: AsyncIterator[str]) -> AsyncIterator[tuple[str, Any]]:
    """(kind, data) of each server-sent event, until the stream ends."""
    kind = ""
    async for line in lines:
        if line.startswith("event: "):
            kind = line[7:]
        elif line.startswith("data: "):
            yield kind, json.loads(line[6:])


async def _until(events: AsyncIterator[tuple[str, Any]], kind: str, needle: str) -> Any:
    """The data of the first ``kind`` event whose JSON holds ``needle``; fails if the stream ends."""
    with anyio.fail_after(15):
        async for seen, data in events:
            if seen == kind and needle in json.dumps(data, ensure_ascii=False):
                return data
    raise AssertionError(f"the stream ended before a {kind} event with {needle!r}")


async def test_a_lone_surrogate_closes_no_stream_and_is_in_the_audit_file(served: Served) -> None:
    async with (
        served.ahttp(TOKEN_A) as agent,
        served.ahttp(TOKEN_OPS) as ops,
        agent.stream("GET", "/v1/events") as open_stream,
    ):
        events = _events(open_stream.aiter_lines())
        await _until(events, "ready", "agent-a")
        refused = await agent.post("/v1/tools/exec", content=SURROGATE_EXEC, headers=JSON)
        assert refused.status_code == 422, refused.text
        # The stream that was open hears of it, U+FFFD in place of the surrogate...
        audit = await _until(events, "audit", "lone")
        assert audit["arguments"]["command"] == "echo \ufffd lone"
        # ...and stays open: a later call's event comes through it.
        assert (await agent.post("/v1/tools/exec", json={"command": "echo after-surrogate"})).status_code == 200
        await _until(events, "audit", "after-surrogate")
        # A console that connects later is replayed the event, and is not closed by it.
        async with ops.stream("GET", "/console/api/stream") as console:
            replayed = _events(console.aiter_lines())
            row = (await _until(replayed, "audit", "lone"))["events"]
            assert any(e["arguments"]["command"] == "echo \ufffd lone" for e in row)
            await agent.post("/v1/tools/exec", json={"command": "echo after-console"})
            await _until(replayed, "audit", "after-console")
    lines = (served.root / "state" / "audit.jsonl").read_bytes().splitlines()
    written = [json.loads(line) for line in lines if b"lone" in line]
    assert [w["arguments"]["command"] for w in written] == ["echo \ufffd lone"]


def test_an_agents_text_echoed_in_an_error_is_no_500(served: Served) -> None:
    # The refusal quotes the variable's name back: it used to fail to encode, a bare 500.
    with served.http(TOKEN_A) as c:
        body = b'{"command":"echo ok","env":{"X\\ud800":"v"}}'
        r = c.post("/v1/tools/exec", content=body, headers=JSON)
        assert r.status_code == 422, r.text
        assert r.json()["error"] == "InvalidArgument"


async def test_the_websocket_answers_a_frame_nested_past_the_parsers_bound(served: Served) -> None:
    url = served.url.replace("http://", "ws://") + "/v1/proc"
    headers = {"Authorization": f"Bearer {TOKEN_A}"}
    async with connect(url, additional_headers=headers, max_size=2**24) as ws:
        await ws.send("[" * 100_000 + "]" * 100_000)
        with anyio.fail_after(15):
            refused = json.loads(await ws.recv())
        assert refused["type"] == "proc/error" and refused["error"]["code"] == "invalid_request", refused
        # A lone surrogate in a frame is answered too...
        await ws.send('{"type":"proc/spawn/req","id":"lone","cmd":["echo","\\ud800"]}')
        with anyio.fail_after(15):
            answer = json.loads(await ws.recv())
        assert answer["id"] == "lone", answer
        # ...and the socket still serves.
        await ws.send(json.dumps({"type": "proc/status/req", "id": "after", "proc_id": "none"}))
        with anyio.fail_after(15):
            answer = json.loads(await ws.recv())
        assert answer["id"] == "after", answer


def test_the_cli_refuses_an_argument_that_is_not_utf8(served: Served) -> None:
    # Such bytes reach Python as lone surrogates: the request could not be encoded, a traceback.
    env = cli_env(HOME="/nonexistent", PROCPILOT_URL=served.url, PROCPILOT_TOKEN=TOKEN_A)
    for args in ([b"run", b"echo \xff"], [b"logs", b"id\xed\xa0\x80"]):
        result = subprocess.run([PROCPILOT.encode(), *args], env=env, capture_output=True, timeout=60, check=False)
        assert result.returncode != 0 and b"Traceback" not in result.stderr, result.stderr
        assert b"InvalidArgument" in result.stderr and b"not valid UTF-8" in result.stderr, result.stderr
