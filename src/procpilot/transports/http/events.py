"""Server-sent events: exits and audit events of the caller's scope, each client's queue bounded."""

from __future__ import annotations

import asyncio
import dataclasses
from collections import deque
from collections.abc import Mapping
from typing import Any

from procpilot import wire
from procpilot.contract import AuditEvent
from procpilot.transports.http.common import EVENT_QUEUE

# -- events ------------------------------------------------------------------------------------


def audit_scope(event: AuditEvent) -> str:
    """The agent an audit event is about."""
    return event.scope


def audit_event(event: AuditEvent) -> dict[str, Any]:
    """An audit event as JSON for its agent's stream (the agent itself is left out)."""
    data = dataclasses.asdict(event)
    data.pop("scope")
    return {"type": "audit", **{_camel(k): v for k, v in data.items()}}


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.capitalize() for part in rest)


class EventQueue:
    """One SSE client's events: bounded, oldest dropped first, with a count of what was dropped."""

    def __init__(self, maxsize: int = EVENT_QUEUE) -> None:
        self.items: deque[tuple[str, dict[str, Any]]] = deque()
        self.maxsize = maxsize
        self.dropped = 0
        self.wakeup = asyncio.Event()

    def put(self, kind: str, data: dict[str, Any]) -> None:
        if len(self.items) >= self.maxsize:
            self.items.popleft()
            self.dropped += 1
        self.items.append((kind, data))
        self.wakeup.set()


def sse(kind: str, data: Mapping[str, Any], event_id: int | None = None) -> bytes:
    head = f"id: {event_id}\n" if event_id is not None else ""
    # wire.dumps: an agent's lone surrogate in one event must not close the stream (and, replayed,
    # every later one); JSON escapes every line break, so the body is one data line
    return f"{head}event: {kind}\ndata: ".encode() + wire.dumps_bytes(data) + b"\n\n"
