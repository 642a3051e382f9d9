"""A real ``procpilot mcp`` on pipes serves at most 256 requests at once through the SDK: the SDK
starts a task for each request it reads and has no bound of its own, so a client that sends
requests without waiting for replies is refused past 256 (``TooManyRequests``, a JSON-RPC error
naming the limit), at once, and served again as soon as one is answered or cancelled. The direct
path's calls and notifications are not held by it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.transports.test_mcp_direct import Bare

LIMIT = 256


def _call(bare: Bare, request_id: int, arguments: dict[str, Any], *, through_sdk: bool) -> None:
    tool = "process" if "action" in arguments else "exec"
    params = bare.params({"name": tool, "arguments": arguments}, through_sdk=through_sdk)
    bare.send({"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params})


def _answer(bare: Bare) -> dict[str, Any]:
    """The next reply to a request (the exit's notification may come between two)."""
    while "method" in (message := bare.reply()):
        pass
    return message


def _text(reply: dict[str, Any]) -> str:
    return str(reply["result"]["content"][0]["text"])


def test_past_256_requests_in_the_sdk_the_next_is_refused_until_one_is_answered_or_cancelled(tmp_path: Path) -> None:
    bare = Bare(tmp_path, "2025-06-18")
    try:
        _call(bare, 1, {"command": "sleep 60", "background": True}, through_sdk=False)
        started = bare.reply()
        session = started["result"]["structuredContent"]["sessionId"]
        waiting = range(1000, 1000 + LIMIT)
        for request_id in waiting:  # each waits for output that never comes, in the SDK's hands
            wait = {"action": "wait", "sessionId": session, "pattern": "never printed", "timeout": 60_000}
            _call(bare, request_id, wait, through_sdk=True)

        _call(bare, 2000, {"command": "echo not-run"}, through_sdk=True)
        refused = bare.reply()  # at once: every wait is still running
        assert refused["id"] == 2000 and "result" not in refused, refused
        assert refused["error"]["code"] == -32000
        assert refused["error"]["data"]["error"] == "TooManyRequests"
        assert refused["error"]["data"]["limit"] == LIMIT and refused["error"]["data"]["hints"]
        bare.send({"jsonrpc": "2.0", "id": 2001, "method": "ping"})
        assert bare.reply()["error"]["data"]["error"] == "TooManyRequests"

        # The direct path is not the SDK's: its calls are still served.
        _call(bare, 2002, {"command": "echo direct-served"}, through_sdk=False)
        direct = bare.reply()
        assert direct["id"] == 2002 and "direct-served" in _text(direct), direct

        # A cancelled request is never answered by the SDK: its place is free at once.
        bare.send({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 1000}})
        bare.send({"jsonrpc": "2.0", "id": 2003, "method": "ping"})
        assert bare.reply() == {"jsonrpc": "2.0", "id": 2003, "result": {}}

        # The waits end with their session, each answered; then the SDK serves again.
        _call(bare, 2004, {"action": "kill", "sessionId": session}, through_sdk=False)
        answered = {_answer(bare)["id"] for _ in range(LIMIT)}  # the kill's reply and 255 waits'
        assert answered == {2004, *waiting} - {1000}
        _call(bare, 2005, {"command": "echo served-again"}, through_sdk=True)
        again = bare.reply()
        assert again["id"] == 2005 and "served-again" in _text(again), again
    finally:
        bare.close()
