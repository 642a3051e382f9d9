"""Errors across the wire (cluster/replies.py): what a node's reply carries comes back as the same
typed error, hints and details included, through JSON as a reply travels; no Ray needed."""

from __future__ import annotations

import json

import pytest

from procpilot.cluster.replies import error_reply, raise_reply
from procpilot.errors import ProcpilotError, SessionNotFound, StdinClosed


def _over_the_wire(reply: dict[str, object]) -> dict[str, object]:
    return dict(json.loads(json.dumps(reply)))


def test_a_typed_error_comes_back_as_itself() -> None:
    sent = StdinClosed("session s1 closed its stdin after 3 of 9 bytes", bytes_written=3)
    reply = _over_the_wire(error_reply(sent))
    with pytest.raises(StdinClosed) as info:
        raise_reply(reply)
    got = info.value
    assert (got.code, got.message, got.hints, got.details) == (sent.code, sent.message, sent.hints, sent.details)
    assert got.details == {"bytes_written": 3}
    assert got.http_status == sent.http_status and got.to_dict() == sent.to_dict()


def test_its_own_hints_survive() -> None:
    sent = SessionNotFound("no session x", hints={"list": "Call process list."}, session_id="x")
    with pytest.raises(SessionNotFound) as info:
        raise_reply(_over_the_wire(error_reply(sent)))
    assert info.value.hints == sent.hints and info.value.details == {"session_id": "x"}


def test_a_reply_without_an_error_returns() -> None:
    raise_reply({"ok": True, "sessionId": "s1"})  # nothing raised


def test_an_unknown_code_is_still_a_procpilot_error() -> None:
    # A node of a newer procpilot may name a class this daemon lacks: still a typed error.
    with pytest.raises(ProcpilotError, match="from the future") as info:
        raise_reply({"error": "BrandNewError", "message": "from the future", "hints": None})
    assert type(info.value) is ProcpilotError
