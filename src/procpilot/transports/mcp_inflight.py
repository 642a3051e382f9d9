"""A bound on the requests the SDK serves at once on one stdio connection.

The SDK's server starts a task for each request it reads and has no bound of its own, so a
client that sends requests without waiting for replies (or one that never reads them) would have
it start work for each, without end. The direct path (transports/mcp_direct.py) takes at most its
own ``limit`` of calls and hands the rest to the SDK, so the bound belongs where lines reach the
SDK: a request is counted from the moment it is handed over until the SDK's answer to its id
goes out (or the client cancels it: the SDK answers no cancelled request), and one that would
pass ``limit`` is refused at once with ``TooManyRequests`` (a JSON-RPC error that names the limit
and says what to do), never queued, never dropped unanswered. Notifications always pass: a
client at its limit must still be able to cancel.
"""

from __future__ import annotations

import collections

from mcp_types import JSONRPCError, JSONRPCNotification, JSONRPCRequest, JSONRPCResponse

from procpilot.errors import TooManyRequests
from procpilot.transports.mcp_direct import Key, request_key
from procpilot.transports.mcp_refusals import SERVER_ERROR, error_reply

__all__ = ["SdkRequests"]


class SdkRequests:
    """The requests handed to the SDK and not answered yet, at most ``limit`` of them."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._open: collections.Counter[Key] = collections.Counter()  # a client may reuse an id
        self._count = 0

    def admit(self, message: object) -> bytes | None:
        """None when ``message`` may go to the SDK (and is counted, if a request); otherwise the
        refusal to write back instead."""
        if isinstance(message, JSONRPCRequest):
            key = request_key(message.id)
            if key is None:
                return None  # an id the SDK refuses itself (answered, never run)
            if self._count >= self.limit:
                return _refusal(message, self.limit)
            self._open[key] += 1
            self._count += 1
        elif isinstance(message, JSONRPCNotification) and message.method == "notifications/cancelled":
            params = message.params if isinstance(message.params, dict) else {}
            self._close(request_key(params.get("requestId")))
        return None

    def answered(self, message: object) -> None:
        """The SDK wrote ``message``: an answer frees its request's place."""
        if isinstance(message, JSONRPCResponse | JSONRPCError):
            self._close(request_key(message.id))

    def _close(self, key: Key | None) -> None:
        if key is not None and self._open[key] > 0:
            self._open[key] -= 1
            self._count -= 1
            if not self._open[key]:
                del self._open[key]


def _refusal(request: JSONRPCRequest, limit: int) -> bytes:
    error = TooManyRequests(
        f"{limit} requests are being served on this connection already; this one was not started",
        hints={"wait": "Wait for replies to your earlier requests before sending more, or cancel some."},
        limit=limit,
    )
    return error_reply(request.id, SERVER_ERROR, f"{error.code}: {error.message}", error.to_dict())
