"""transports/http/common.py: the calling agent, JSON in and out, the status of each error."""

from __future__ import annotations

import json

import pytest
from starlette.requests import Request
from starlette.types import Message

from procpilot.errors import InvalidArgument, UnsupportedMediaType
from procpilot.transports.http.common import (
    MAX_BODY,
    WS_MAX_MESSAGE,
    current_agent,
    error_response,
    header,
    json_body,
    json_response,
    request_agent,
    status_for_error,
)


def request(body: bytes, content_type: str | None = "application/json") -> Request:
    headers = [(b"content-type", content_type.encode())] if content_type else []

    async def receive() -> Message:
        return {"type": "http.request", "body": body, "more_body": False}

    return Request({"type": "http", "method": "POST", "path": "/", "headers": headers}, receive)


def test_each_error_code_has_its_class_status() -> None:
    assert status_for_error("SessionNotFound") == 404
    assert status_for_error("CommandDenied") == 403
    assert status_for_error("NoSuchError") == 500  # unknown: a server error, never a 200


def test_responses_are_compact_json() -> None:
    response = json_response({"a": "é", "n": 1}, 201, {"X-Y": "z"})
    assert (response.status_code, response.body, response.headers["x-y"]) == (201, '{"a":"é","n":1}'.encode(), "z")
    error = error_response("SessionNotFound", "no session x", sessionId="x")
    assert error.status_code == 404
    assert json.loads(error.body) == {
        "error": "SessionNotFound",
        "message": "no session x",
        "hints": {},
        "sessionId": "x",
    }


async def test_a_body_is_a_json_object_or_a_typed_error() -> None:
    assert await json_body(request(b'{"command": "ls"}')) == {"command": "ls"}
    assert await json_body(request(b"  ", content_type=None)) == {}  # empty: no arguments
    with pytest.raises(UnsupportedMediaType):
        await json_body(request(b"{}", content_type="text/plain"))
    with pytest.raises(InvalidArgument, match="not valid JSON"):
        await json_body(request(b"{"))
    with pytest.raises(InvalidArgument, match="must be a JSON object"):
        await json_body(request(b"[1]"))
    with pytest.raises(InvalidArgument, match="nested too deeply"):
        await json_body(request(b"[" * 100_000 + b"]" * 100_000))


def test_headers_are_found_by_their_lowercase_name() -> None:
    scope = {"headers": [(b"host", b"127.0.0.1:8765"), (b"x-a", b"\xe9")]}
    assert header(scope, b"host") == "127.0.0.1:8765"
    assert header(scope, b"x-a") == "é"  # latin-1, as HTTP defines header bytes
    assert header(scope, b"origin") is None


def test_the_agent_is_the_one_the_middleware_set() -> None:
    with pytest.raises(RuntimeError):
        request_agent()  # a route served without the auth middleware has no agent
    token = current_agent.set("agent-a")
    try:
        assert request_agent() == "agent-a"
    finally:
        current_agent.reset(token)


def test_one_websocket_frame_may_carry_what_one_body_may() -> None:
    assert WS_MAX_MESSAGE == MAX_BODY == 1024 * 1024
