"""The one place session state is persisted.

Today the supervisor appends each session's record (``meta.jsonl``) beside its output files on
every state change; a restart-survival issue will read them back through ``load_all``. Output
itself is never held here: the segment files are already on disk.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any, Protocol

__all__ = ["FileStore", "SessionStore"]


class SessionStore(Protocol):
    def session_dir(self, session_id: str) -> Path: ...

    def save(self, session_id: str, record: dict[str, Any]) -> None: ...

    def load_all(self) -> list[dict[str, Any]]: ...

    def delete(self, session_id: str) -> None: ...


class FileStore:
    """``<state_dir>/sessions/<id>/meta.jsonl``: the session's records, newest last."""

    def __init__(self, state_dir: Path) -> None:
        self.root = state_dir / "sessions"
        self.root.mkdir(parents=True, exist_ok=True)

    def session_dir(self, session_id: str) -> Path:
        return self.root / session_id

    def save(self, session_id: str, record: dict[str, Any]) -> None:
        # One appended line per state change: no temp file and rename on the spawn path, and a
        # torn last line after a crash leaves the previous record intact.
        line = json.dumps(record, separators=(",", ":")).encode() + b"\n"
        fd = os.open(
            f"{self.root}/{session_id}/meta.jsonl", os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600
        )
        try:
            os.write(fd, line)
        finally:
            os.close(fd)

    def load_all(self) -> list[dict[str, Any]]:
        """The latest intact record of every session on disk."""
        records: list[dict[str, Any]] = []
        for meta in self.root.glob("*/meta.jsonl"):
            try:
                lines = meta.read_bytes().splitlines()
            except OSError:
                continue
            for raw in reversed(lines):
                try:
                    records.append(json.loads(raw))
                    break
                except ValueError:
                    continue
        return records

    def delete(self, session_id: str) -> None:
        shutil.rmtree(self.session_dir(session_id), ignore_errors=True)
