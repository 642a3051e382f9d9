"""transports/http/events.py: each SSE client's queue is bounded and says what it dropped."""

from __future__ import annotations

from procpilot.contract import AuditEvent
from procpilot.transports.http.events import EventQueue, audit_event, audit_scope, sse


def test_a_full_queue_drops_the_oldest_and_counts_them() -> None:
    queue = EventQueue(maxsize=3)
    for n in range(5):
        queue.put("exit", {"n": n})
    assert [data["n"] for _kind, data in queue.items] == [2, 3, 4]
    assert queue.dropped == 2 and queue.wakeup.is_set()


def test_an_event_on_the_wire() -> None:
    wire = 'id: 7\nevent: exit\ndata: {"sessionId":"s1","text":"é"}\n\n'
    assert sse("exit", {"sessionId": "s1", "text": "é"}, 7) == wire.encode()
    assert sse("ready", {}) == b"event: ready\ndata: {}\n\n"


def test_an_audit_event_goes_to_its_agent_in_camel_case() -> None:
    event = AuditEvent("agent-a", "exec", "notify", "ok", "exec: ls", process_id="s1", duration_ms=3)
    assert audit_scope(event) == "agent-a"
    data = audit_event(event)
    assert data["processId"] == "s1" and data["durationMs"] == 3 and data["tool"] == "exec"
