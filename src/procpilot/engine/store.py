"""The one place session state is persisted.

Today the supervisor writes each session's record (``meta.json``) beside its output files on
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
    """``<state_dir>/sessions/<id>/meta.json``, replaced atomically."""

    def __init__(self, state_dir: Path) -> None:
        self.root = state_dir / "sessions"
        self.root.mkdir(parents=True, exist_ok=True)

    def session_dir(self, session_id: str) -> Path:
        return self.root / session_id

    def save(self, session_id: str, record: dict[str, Any]) -> None:
        directory = self.session_dir(session_id)
        tmp = directory / "meta.json.tmp"
        tmp.write_text(json.dumps(record, separators=(",", ":")))
        os.replace(tmp, directory / "meta.json")

    def load_all(self) -> list[dict[str, Any]]:
        records: list[dict[str, Any]] = []
        for meta in self.root.glob("*/meta.json"):
            try:
                records.append(json.loads(meta.read_text()))
            except (OSError, ValueError):
                continue
        return records

    def delete(self, session_id: str) -> None:
        shutil.rmtree(self.session_dir(session_id), ignore_errors=True)
