"""Errors across the wire: a node replies with an error's code and message, the daemon raises it again.

``ProcpilotError`` carries keyword details that Ray's exception wrapping would not keep, and an
agent must get the same typed error (its HTTP status, proc/* code and hints) from a remote
session as from a local one.
"""

from __future__ import annotations

from typing import Any

from procpilot.errors import ProcpilotError, error_class

__all__ = ["error_reply", "raise_reply"]


def error_reply(exc: ProcpilotError) -> dict[str, Any]:
    return {"error": exc.code, "message": exc.message, "hints": exc.hints, "details": exc.details}


def raise_reply(reply: dict[str, Any]) -> None:
    """Raise the error a reply carries, as the class its code names; return if it carries none."""
    code = reply.get("error")
    if code is None:
        return
    cls = error_class(str(code)) or ProcpilotError
    raise cls(str(reply["message"]), hints=dict(reply.get("hints") or {}), **dict(reply.get("details") or {}))
