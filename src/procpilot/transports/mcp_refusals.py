"""The JSON-RPC error a stdio line gets when it cannot be served: every line is answered.

The SDK's own transport hands a line it cannot parse to the server as an exception, and the
server only logs it: the client waits for an answer that never comes. So the stdio transport
answers such a line itself, with the id when one can be read from the line's head (a line that
does not parse has no id otherwise), and goes on serving.
"""

from __future__ import annotations

import json
import re

from pydantic import ValidationError

from procpilot import wire

__all__ = ["HEAD", "INVALID_REQUEST", "PARSE_ERROR", "SERVER_ERROR", "error_reply", "read_id", "refusal", "refusal_for"]

PARSE_ERROR = -32700  # JSON-RPC 2.0: not JSON (here: not JSON the SDK's parser reads)
INVALID_REQUEST = -32600  # JSON, but not a JSON-RPC message (or too long to be one)
SERVER_ERROR = -32000  # JSON-RPC 2.0: the first of the codes left to the server
HEAD = 4096  # bytes of a line searched for its id (all of it that a refusal needs)
# The top-level "id" member, after only scalar members (so never an "id" inside params): each
# alternative starts with a different character, so the search is linear in the head.
_ID = re.compile(rb'\A\s*\{(?:[^{}\[\]"]|"(?:[^"\\]|\\.)*")*?"id"\s*:\s*(-?\d{1,19}|"(?:[^"\\]|\\.){0,256}")')
_MESSAGE = 200  # characters of the parser's complaint quoted in the error


def read_id(line: bytes) -> str | int | None:
    """The request's id as far as the first ``HEAD`` bytes of ``line`` tell, or None."""
    found = _ID.match(line[:HEAD])
    if found is None:
        return None
    try:
        value = json.loads(found.group(1))
    except ValueError:  # a string with a bad escape or bytes that are not UTF-8
        return None
    return value if isinstance(value, str | int) else None


def error_reply(request_id: object, code: int, message: str, data: object = None) -> bytes:
    """A JSON-RPC error reply (one line) to the request ``request_id``."""
    error: dict[str, object] = {"code": code, "message": message}
    if data is not None:
        error["data"] = data
    reply = {"jsonrpc": "2.0", "id": request_id, "error": error}
    return wire.dumps_bytes(reply) + b"\n"  # the id may hold a lone surrogate: written as U+FFFD


def refusal(line: bytes, code: int, message: str) -> bytes:
    """The error reply (one line) to ``line``."""
    return error_reply(read_id(line), code, message)


def refusal_for(line: bytes, exc: Exception) -> bytes:
    """The error reply to a line the SDK's parser refused with ``exc``."""
    if isinstance(exc, ValidationError):
        first = exc.errors(include_url=False, include_input=False)[0]
        code = PARSE_ERROR if first["type"] == "json_invalid" else INVALID_REQUEST
        if code == PARSE_ERROR:
            return refusal(line, code, f"Parse error: {first['msg'][:_MESSAGE]}")
        where = ".".join(str(part) for part in first["loc"])
        return refusal(line, code, f"Invalid request: not a JSON-RPC 2.0 message ({where}: {first['msg'][:_MESSAGE]})")
    return refusal(line, PARSE_ERROR, f"Parse error: {str(exc)[:_MESSAGE]}")
