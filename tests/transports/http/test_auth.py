"""transports/http/auth.py: a bearer token names the agent; nothing else does."""

from __future__ import annotations

from procpilot.transports.http.auth import TokenAuth


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
