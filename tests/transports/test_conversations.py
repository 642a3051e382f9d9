"""``[tools] isolate_conversations``: each MCP session of one token sees only the sessions it
started (spec 002: "Sessions are isolated by conversationId"), while the agent's policy still
counts and checks across all its conversations. Off (the default), they share them."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from tests.daemon import TOKEN_A, TOKEN_B, Served, start_daemon

POLICY = '[policy.agents.agent-a]\nmax_procs = 2\n[policy.agents.agent-b]\ntiers = { exec = "blocked" }\n'


def _daemon(root: Path, isolate: bool) -> Iterator[Served]:
    served = start_daemon(root, extra=f"[tools]\nisolate_conversations = {str(isolate).lower()}\n{POLICY}")
    try:
        yield served
    finally:
        served.stop()


@pytest.fixture(scope="module")
def isolated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    yield from _daemon(tmp_path_factory.mktemp("isolated"), True)


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    yield from _daemon(tmp_path_factory.mktemp("shared"), False)


async def _start(client: Client, command: str = "sleep 30") -> Any:
    result = await client.call_tool("exec", {"command": command, "background": True})
    return result


def _data(result: Any) -> dict[str, Any]:
    return dict(result.structured_content or {})


async def test_two_conversations_of_one_token_do_not_see_each_other(isolated: Served) -> None:
    async with isolated.mcp(TOKEN_A, mode="legacy") as a, isolated.mcp(TOKEN_A, mode="legacy") as b:
        sid = _data(await _start(a))["sessionId"]
        try:
            for args in (
                {"action": "poll", "sessionId": sid},
                {"action": "log", "sessionId": sid},
                {"action": "kill", "sessionId": sid},
            ):
                result = await b.call_tool("process", args)
                assert result.is_error and _data(result)["error"] == "SessionNotFound", args
            listed = await b.call_tool("process", {"action": "list"})
            assert sid not in json.dumps(listed.structured_content)
            with pytest.raises(Exception, match=r"(?i)not found|no session"):
                await b.read_resource(f"proc://{sid}")
            # Its own conversation still sees and acts on it.
            assert sid in json.dumps((await a.call_tool("process", {"action": "list"})).structured_content)
            assert _data(await a.call_tool("process", {"action": "poll", "sessionId": sid}))["status"] == "running"
        finally:
            await a.call_tool("process", {"action": "remove", "sessionId": sid})


async def test_without_the_switch_one_tokens_conversations_share_sessions(shared: Served) -> None:
    async with shared.mcp(TOKEN_A, mode="legacy") as a, shared.mcp(TOKEN_A, mode="legacy") as b:
        sid = _data(await _start(a))["sessionId"]
        try:
            assert _data(await b.call_tool("process", {"action": "poll", "sessionId": sid}))["status"] == "running"
            assert sid in json.dumps((await b.call_tool("process", {"action": "list"})).structured_content)
        finally:
            await b.call_tool("process", {"action": "remove", "sessionId": sid})


async def test_max_procs_counts_the_agents_sessions_across_conversations(isolated: Served) -> None:
    async with isolated.mcp(TOKEN_A, mode="legacy") as a, isolated.mcp(TOKEN_A, mode="legacy") as b:
        first = _data(await _start(a))["sessionId"]
        second = _data(await _start(b))["sessionId"]
        try:
            # Each conversation runs one session; the agent's limit (2) is reached all the same.
            refused = await _start(b)
            assert refused.is_error and _data(refused)["error"] == "ProcLimit"
            refused = await _start(a)
            assert refused.is_error and _data(refused)["error"] == "ProcLimit"
        finally:
            await a.call_tool("process", {"action": "remove", "sessionId": first})
            await b.call_tool("process", {"action": "remove", "sessionId": second})


async def test_the_console_reaches_a_conversations_session_under_its_agent(isolated: Served) -> None:
    async with isolated.mcp(TOKEN_A, mode="legacy") as a:
        sid = _data(await _start(a, "echo from-a-conversation; sleep 30"))["sessionId"]
        try:
            async with isolated.ahttp(TOKEN_A) as http:
                r = await http.get(f"/console/api/sessions/agent-a/{sid}/log")
                assert r.status_code == 200, r.text
                # ... while the agent's own scope (REST) does not list it: it is the conversation's.
                listed = await http.get("/v1/sessions")
                assert sid not in listed.text
        finally:
            await a.call_tool("process", {"action": "remove", "sessionId": sid})


async def test_the_agents_tiers_hold_in_each_conversation(isolated: Served) -> None:
    async with isolated.mcp(TOKEN_B, mode="legacy") as b:
        refused = await _start(b, "echo should-not-run")
        assert refused.is_error and _data(refused)["error"] == "PermissionDenied"
        assert "agent-b" in json.dumps(refused.structured_content)  # named as the agent, not a conversation
