"""A tool's result as the JSON of an MCP ``tools/call`` result, for the protocol version spoken.

The one definition of that shape: the SDK's path hands it to the SDK (which adds the 2026-07-28
envelope itself), and both direct paths (over stdio: mcp_direct.py, over the daemon's HTTP:
http/mcp_fast.py) write it as it is, so every path answers a call with the same fields.
"""

from __future__ import annotations

from typing import Any

from procpilot import wire
from procpilot.contract import ToolResult

__all__ = ["MODERN", "SHAPED_ALIKE", "STAMP_KEY", "call_result", "failed_call_result"]

# The handshake-era protocol versions, whose tools/call results have one shape.
SHAPED_ALIKE = frozenset({"2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"})
MODERN = "2026-07-28"  # per-request envelopes: the result adds resultType and the server's stamp
STAMP_KEY = "io.modelcontextprotocol/serverInfo"


def call_result(result: ToolResult, version: str, stamp: Any = None) -> dict[str, Any]:
    """``result`` as the ``result`` member of a ``tools/call`` reply in ``version`` (``stamp``: the
    server's info, which a 2026-07-28 result carries). Values are as the face made them (a path, a
    lone surrogate): the writer serialises through wire.py, which never raises."""
    shaped: dict[str, Any] = {"content": [{"type": "text", "text": result.text}]}
    if result.structured:  # a text-only result has none, not even a null
        shaped["structuredContent"] = result.data
    shaped["isError"] = result.is_error
    return _stamped(shaped, version, stamp)


def failed_call_result(exc: BaseException, version: str, stamp: Any = None) -> dict[str, Any]:
    """What the SDK answers for a tool that raised (ToolSpec.call makes errors results, so this
    is a bug): the exception's text as an error result."""
    return _stamped({"content": [{"type": "text", "text": wire.text(str(exc))}], "isError": True}, version, stamp)


def _stamped(shaped: dict[str, Any], version: str, stamp: Any) -> dict[str, Any]:
    if version == MODERN:
        shaped |= {"resultType": "complete", "_meta": {STAMP_KEY: stamp}}
    return shaped
