"""transports/http/auth.py: a bearer token names the agent; nothing else does."""

from __future__ import annotations

import asyncio

from starlette.types import Message, Receive, Scope, Send

from procpilot.transports.http.auth import AuthMiddleware, TokenAuth
from procpilot.turns import Turns


def test_a_token_names_its_agent() -> None:
    auth = TokenAuth({"secret-a": "agent-a", "secret-b": "agent-b"}, open_agent="default")
    assert auth.required and auth.open_agent is None  # tokens configured: nobody is let in unnamed
    assert auth.agent_for("Bearer secret-a") == "agent-a"
    assert auth.agent_for("bearer  secret-b ") == "agent-b"
    for wrong in (None, "", "Bearer", "Bearer secret-c", "Basic secret-a", "secret-a"):
        assert auth.agent_for(wrong) is None, wrong


def test_with_no_tokens_every_caller_is_the_open_agent() -> None:
    auth = TokenAuth({}, open_agent="default")
    assert not auth.required
    assert auth.agent_for(None) == auth.agent_for("Bearer anything") == "default"


async def test_a_call_whose_client_takes_its_answer_slowly_leaves_its_agents_turn() -> None:
    # The auth middleware serves each POST in its agent's turn (one at a time here), and gives
    # the turn back while the server writes the answer: a client that does not read holds its
    # call's place, never its agent's next call. Through the calls' own routes (call_routes)
    # and through the router alike.
    working: list[str] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        working.append(scope["path"])
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    async def receive() -> Message:
        return {"type": "http.request", "body": b"{}", "more_body": False}

    def request() -> Scope:
        headers = [(b"authorization", b"Bearer t"), (b"content-length", b"2")]
        return {"type": "http", "method": "POST", "path": "/v1/tools/exec", "root_path": "", "headers": headers}

    turns = Turns(places_per_agent=4, working_per_agent=1)
    for calls in (None, lambda scope: app):
        middleware = AuthMiddleware(app, TokenAuth({"t": "agent-a"}), loopback_only=False, turns=turns, calls=calls)
        working.clear()
        reads, answering = asyncio.Event(), asyncio.Event()

        async def slow_client(
            message: Message, reads: asyncio.Event = reads, answering: asyncio.Event = answering
        ) -> None:
            answering.set()
            await reads.wait()

        async def quick_client(message: Message) -> None:
            pass

        stuck = asyncio.ensure_future(middleware(request(), receive, slow_client))
        await asyncio.wait_for(answering.wait(), 1)
        assert turns.counts("agent-a") == (1, 0, 0)  # its place held, its turn given back
        await asyncio.wait_for(middleware(request(), receive, quick_client), 1)
        assert working == ["/v1/tools/exec", "/v1/tools/exec"] and not stuck.done()
        reads.set()
        await asyncio.wait_for(stuck, 1)
        assert turns.counts("agent-a") == (0, 0, 0)
