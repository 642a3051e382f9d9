"""transports/serve.py's record_audit: one JSON line per audit event, every field as it is."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from procpilot.contract import AuditEvent
from procpilot.engine.events import EventBus
from procpilot.transports.serve import record_audit


@dataclasses.dataclass(frozen=True, slots=True)
class _OneField:
    outcome: str


class _NotADataclass:
    pass


def test_each_event_is_a_line_of_its_class_name_and_every_field(tmp_path: Path) -> None:
    # The fields' names and getter are found once per class: a class seen again, a class of one
    # field and an object of no dataclass are each written as the walk over its fields wrote them.
    bus: EventBus[object] = EventBus()
    path = tmp_path / "state" / "audit.jsonl"
    stop = record_audit(bus, path)
    events: list[object] = [
        AuditEvent("agent-a", "exec", "notify", "ok", "exec: true", arguments={"command": "true"}, duration_ms=3),
        AuditEvent("agent-b", "process", "notify", "error:SessionNotFound", "process: kill", chat={"p": "x"}),
        _OneField("approved"),
        _NotADataclass(),
        _OneField("denied"),
    ]
    try:
        for event in events:
            bus.publish(event)
    finally:
        stop()
    lines = path.read_bytes().splitlines()
    assert len(lines) == len(events)
    for line, event in zip(lines, events, strict=True):
        fields = dataclasses.asdict(event) if dataclasses.is_dataclass(event) else {}  # type: ignore[arg-type]
        expected = {"event": type(event).__name__, **fields}
        assert line == json.dumps(expected, ensure_ascii=False, separators=(", ", ": ")).encode()
    assert path.stat().st_mode & 0o777 == 0o600
