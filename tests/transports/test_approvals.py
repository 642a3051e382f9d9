"""Approvals over the daemon: calls held by the policy gate are listed to approvers and decided by
them (REST and CLI), never by the requesting agent itself; every decision reaches its SSE stream."""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import Iterator
from typing import Any

import httpx2
import pytest

from tests.daemon import PROCPILOT, Served, cli_env, start_daemon

TOKENS = {"tok-appr-alpha-012345": "agent-a", "tok-appr-bravo-012345": "agent-b", "tok-appr-carol-012345": "agent-c"}
TOKEN_A, TOKEN_B, TOKEN_C = list(TOKENS)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    pytest.importorskip("procpilot.policy.gate")
    policy = '[policy]\napproval_timeout_sec = 60\n[policy.default]\ntiers = { exec = "approval_required" }\n'
    daemon = start_daemon(
        tmp_path_factory.mktemp("approvals"), TOKENS, extra=policy, server='approvers = ["agent-a", "agent-b"]'
    )
    yield daemon
    assert daemon.stop() == 0, daemon.log_text()


def cli(served: Served, token: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = cli_env(HOME="/nonexistent", COLUMNS="200")
    env |= {"PROCPILOT_URL": served.url, "PROCPILOT_TOKEN": token}
    return subprocess.run([PROCPILOT, *args], env=env, capture_output=True, text=True, timeout=60, check=False)


async def _pending(served: Served, token: str, agent: str) -> dict[str, Any]:
    """The request ``agent`` is waiting on, as an approver sees it (once the gate holds it)."""
    async with served.ahttp(token) as c:
        for _ in range(300):
            r = await c.get("/v1/approvals")
            assert r.status_code == 200, r.text
            mine = [a for a in r.json()["approvals"] if a["scope"] == agent]
            if mine:
                return mine[0]
            await asyncio.sleep(0.1)
    raise AssertionError(f"no request of {agent} was held")


async def _sse_until(lines: Any, predicate: Any, seen: list[dict[str, Any]]) -> None:
    kind = None
    async with asyncio.timeout(30):
        async for line in lines:
            if line.startswith("event: "):
                kind = line[7:]
            elif line.startswith("data: ") and kind == "audit":
                seen.append(json.loads(line[6:]))
                if predicate(seen[-1]):
                    return


async def test_approvers_decide_held_calls_and_the_requester_hears_it(served: Served) -> None:
    async with served.ahttp(TOKEN_C) as c_http, c_http.stream("GET", "/v1/events") as events:
        lines = events.aiter_lines()
        call = asyncio.ensure_future(c_http.post("/v1/tools/exec", json={"command": "echo let-me-run"}))
        held = await _pending(served, TOKEN_A, "agent-c")
        assert held["tool"] == "exec" and "let-me-run" in held["summary"]
        assert held["status"] == "awaiting_approval"

        # Not an approver: cannot see or decide anything.
        assert (await c_http.get("/v1/approvals")).status_code == 403
        refused = await c_http.post(f"/v1/approvals/{held['id']}", json={"decision": "approve"})
        assert (refused.status_code, refused.json()["error"]) == (403, "ApprovalForbidden")
        assert not call.done()

        async with served.ahttp(TOKEN_A) as a_http:
            bad = await a_http.post(f"/v1/approvals/{held['id']}", json={"decision": "maybe"})
            assert bad.status_code == 422
            unknown = await a_http.post("/v1/approvals/nosuchrequest0", json={"decision": "deny"})
            assert unknown.status_code == 404 and unknown.json()["error"] == "ApprovalNotFound"
            ok = await a_http.post(f"/v1/approvals/{held['id']}", json={"decision": "approve"})
            assert ok.status_code == 200, ok.text
            assert ok.json()["approval"]["status"] == "approved" and ok.json()["approval"]["decided_by"] == "agent-a"
            again = await a_http.post(f"/v1/approvals/{held['id']}", json={"decision": "deny"})
            assert again.status_code == 404  # decided once, for good

        result = await asyncio.wait_for(call, 30)
        assert result.status_code == 200 and result.json()["data"]["output"] == "let-me-run\n"
        seen: list[dict[str, Any]] = []
        await _sse_until(lines, lambda e: e.get("outcome") == "ok", seen)
        outcomes = [(e["outcome"], e.get("decidedBy"), e.get("requestId")) for e in seen]
        assert ("awaiting_approval", None, held["id"]) in outcomes
        assert ("approved", "agent-a", held["id"]) in outcomes
        sid = result.json()["data"]["sessionId"]
        await c_http.post("/v1/tools/process", json={"action": "remove", "sessionId": sid})


async def test_an_approver_never_decides_its_own_request_and_the_cli_decides(served: Served) -> None:
    async with served.ahttp(TOKEN_A) as a_http:
        call = asyncio.ensure_future(a_http.post("/v1/tools/exec", json={"command": "echo mine"}))
        held = await _pending(served, TOKEN_B, "agent-a")
        own = await a_http.post(f"/v1/approvals/{held['id']}", json={"decision": "approve"})
        assert (own.status_code, own.json()["error"]) == (403, "SelfApprovalDenied")
        own_cli = await asyncio.to_thread(cli, served, TOKEN_A, "approve", held["id"])
        assert own_cli.returncode == 1 and "SelfApprovalDenied" in own_cli.stderr

        listed = await asyncio.to_thread(cli, served, TOKEN_B, "approvals")
        assert listed.returncode == 0 and held["id"] in listed.stdout and "agent-a" in listed.stdout
        not_approver = await asyncio.to_thread(cli, served, TOKEN_C, "approvals")
        assert not_approver.returncode == 1 and "ApprovalForbidden" in not_approver.stderr
        denied = await asyncio.to_thread(cli, served, TOKEN_B, "deny", held["id"], "--reason", "not today")
        assert denied.returncode == 0, denied.stderr

        result = await asyncio.wait_for(call, 30)
        assert result.status_code == 403
        assert result.json()["error"] == "ApprovalDenied" and "not today" in result.json()["message"]


async def test_cli_approve(served: Served) -> None:
    async with served.ahttp(TOKEN_B) as b_http:
        call = asyncio.ensure_future(b_http.post("/v1/tools/exec", json={"command": "echo via-cli"}))
        held = await _pending(served, TOKEN_A, "agent-b")
        approved = await asyncio.to_thread(cli, served, TOKEN_A, "approve", held["id"])
        assert approved.returncode == 0 and "approved" in approved.stderr, approved.stderr
        result = await asyncio.wait_for(call, 30)
        assert result.json()["data"]["output"] == "via-cli\n"
        sid = result.json()["data"]["sessionId"]
        await b_http.post("/v1/tools/process", json={"action": "remove", "sessionId": sid})


def test_non_approvers_are_forbidden(served: Served) -> None:
    with httpx2.Client(base_url=served.url, headers={"Authorization": f"Bearer {TOKEN_C}"}, timeout=30) as c:
        r = c.get("/v1/approvals")
        assert r.status_code == 403 and r.json()["error"] == "ApprovalForbidden" and r.json()["message"]


async def test_a_held_call_names_its_chat_to_the_approver_and_on_every_event(served: Served) -> None:
    """A gateway's call that says which chat it comes from (X-Procpilot-Context): the approver
    sees that chat on the held request, and the request's events, decided ones too (published in
    the approver's request, not the caller's), carry it."""
    chat = {"provider": "telegram", "session": "agent:main:main"}
    headers = {"X-Procpilot-Context": "provider=telegram session=agent:main:main"}
    async with served.ahttp(TOKEN_C) as c_http, c_http.stream("GET", "/v1/events") as events:
        lines = events.aiter_lines()
        call = asyncio.ensure_future(
            c_http.post("/v1/tools/exec", json={"command": "echo from-a-chat"}, headers=headers)
        )
        held = await _pending(served, TOKEN_A, "agent-c")
        assert held["chat"] == chat
        async with served.ahttp(TOKEN_A) as a_http:
            denied = await a_http.post(f"/v1/approvals/{held['id']}", json={"decision": "deny"})
            assert denied.status_code == 200, denied.text
        assert (await asyncio.wait_for(call, 30)).json()["error"] == "ApprovalDenied"
        seen: list[dict[str, Any]] = []
        await _sse_until(lines, lambda e: e.get("outcome") == "denied", seen)
        mine = [e for e in seen if e.get("requestId") == held["id"]]
        assert {e["outcome"] for e in mine} == {"awaiting_approval", "denied"}
        assert all(e["chat"] == chat for e in mine)
