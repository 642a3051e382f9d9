"""The one place session state is persisted.

The supervisor hands every state change of a session to a :class:`SessionStore`; a
restart-survival issue will read the latest records back through ``load``. Output itself is never
held here: its segment files are already on disk, under ``session_dir``.

:class:`FileStore` keeps one journal, ``<state_dir>/sessions.jsonl``: a JSON line per state change
of any session, appended to an fd held open, and a tombstone line when a session is deleted. It
is rewritten with only the live records once the dead lines outnumber them (and 1,000), so it
stays proportional to the sessions kept. One append is ~1 µs; the per-session file it replaces
cost an open, append and close twice per session (~90 µs on ext4).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any, Protocol

from procpilot.engine.records import valid_session_id
from procpilot.engine.state_files import check_state_file, make_state_dir, open_state_file

__all__ = ["FileStore", "OrderedLater", "SessionStore"]

_log = logging.getLogger(__name__)
_JOURNAL = "sessions.jsonl"
_MIN_GARBAGE = 1000
_OPEN_FLAGS = os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC
# One encoder for every record: json.dumps with separators builds a new one per call.
_ENCODE = json.JSONEncoder(separators=(",", ":")).encode


class SessionStore(Protocol):
    """Where session records go: ``save`` on every state change, ``delete`` when a session is
    forgotten, ``load`` the latest record of every session not deleted (for a restart).
    ``session_dir`` names the directory that holds (or will hold) a session's output files; the
    supervisor calls ``close`` when it closes."""

    def session_dir(self, session_id: str) -> Path: ...

    def save(self, session_id: str, record: dict[str, Any]) -> None: ...

    def load(self) -> dict[str, dict[str, Any]]: ...

    def delete(self, session_id: str) -> None: ...

    def close(self) -> None: ...


def _read_all(fd: int) -> bytes:
    size = os.fstat(fd).st_size
    chunks: list[bytes] = []
    pos = 0
    while pos < size:
        chunk = os.pread(fd, size - pos, pos)
        if not chunk:
            break
        chunks.append(chunk)
        pos += len(chunk)
    return b"".join(chunks)


def _latest(data: bytes) -> tuple[dict[str, bytes], int]:
    """The last intact line of every session not deleted, and the count of lines read.

    A line that does not parse (torn by a crash mid-write) is skipped, never an error.
    """
    latest: dict[str, bytes] = {}
    lines = 0
    for raw in data.splitlines():
        lines += 1
        try:
            entry = json.loads(raw)
        except ValueError:
            continue
        if not isinstance(entry, dict):
            continue
        session_id = entry.get("id")
        if isinstance(session_id, str):
            latest[session_id] = raw
        elif isinstance(entry.get("deleted"), str):
            latest.pop(entry["deleted"], None)
    return latest, lines


def _checked(session_id: str) -> str:
    """``session_id`` if it names a direct child of ``sessions/``, else ValueError (never a path)."""
    if not valid_session_id(session_id):
        raise ValueError(f"not a session id: {session_id[:80]!r}")
    return session_id


class FileStore:
    """``<state_dir>/sessions.jsonl``: every session's records, newest last; output under
    ``<state_dir>/sessions/<id>/``.

    Several supervisors may share a state directory (a daemon and stdio servers): each appends
    whole lines with O_APPEND, so lines never interleave, and each holds a shared ``flock`` on the
    journal while it has it open. Only a supervisor that gets the lock exclusively rewrites the
    journal, so nobody's appends can land in a file that was just replaced.
    """

    def __init__(self, state_dir: Path) -> None:
        self.root = state_dir / "sessions"
        make_state_dir(self.root, "the sessions' output")
        self.journal = state_dir / _JOURNAL
        check_state_file(self.journal, "the session journal")  # at start, not at the first save
        self._journal = str(self.journal)
        self._root = str(self.root)
        # Opened at the first save: reading records (``load``) holds no fd.
        self._fd: int | None = None
        self._closed = False
        self._live: set[str] = set()
        self._lines = 0
        self._compact_at = 0
        self.write_error: str | None = None  # errno name of the last refused journal write

    def session_dir(self, session_id: str) -> Path:
        return self.root / _checked(session_id)

    # -- writing -------------------------------------------------------------------------------

    def save(self, session_id: str, record: dict[str, Any]) -> None:
        if record.get("id") != session_id:
            record = {**record, "id": session_id}
        self._append(_ENCODE(record).encode() + b"\n")
        self._live.add(session_id)

    def delete(self, session_id: str) -> None:
        path = f"{self._root}/{_checked(session_id)}"
        try:
            os.rmdir(path)  # the output files are gone already, or never were
        except FileNotFoundError:
            pass
        except OSError:
            shutil.rmtree(path, ignore_errors=True)
        if self._fd is None and not self._closed:
            # Nothing saved yet (a session restored from the journal and forgotten at once): its
            # record is in the file all the same, and without the tombstone it would come back.
            with contextlib.suppress(OSError):
                self._open()
        if session_id in self._live:
            self._append(json.dumps({"deleted": session_id}).encode() + b"\n")
            self._live.discard(session_id)

    def _append(self, line: bytes) -> None:
        try:
            fd = self._fd if self._fd is not None else self._open()
            try:
                os.write(fd, line)
                self._lines += 1
                if self._lines >= self._compact_at:
                    self._maybe_compact()
            finally:
                if self._closed and self._fd is not None:
                    # A session that ended after close() still gets its record, without keeping an fd.
                    self._release()
        except OSError as exc:
            # A full or failing disk: the supervisor keeps every session in memory and serves on;
            # only what a restart could read back is missing. Said once, not per record.
            if not self.write_error:
                _log.warning("cannot write the session journal %s: %s; sessions live on in memory", self.journal, exc)
            self.write_error = errno.errorcode.get(exc.errno or 0, type(exc).__name__)

    def _open(self) -> int:
        fd = self._open_locked()
        data = _read_all(fd)
        if data and not data.endswith(b"\n"):
            # A crash tore the last line: end it, so the next record is not glued onto it.
            os.write(fd, b"\n")
        latest, self._lines = _latest(data)
        self._live = set(latest)
        self._set_threshold()
        self._fd = fd
        return fd

    def _open_locked(self) -> int:
        """The journal's fd under a shared lock, and still the file at its path (not one that a
        compaction replaced between our open and our lock)."""
        while True:
            fd = os.open(self._journal, _OPEN_FLAGS, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_SH)
                if self._is_current(fd):
                    return fd
            except BaseException:
                os.close(fd)
                raise
            os.close(fd)

    def _is_current(self, fd: int) -> bool:
        try:
            here = os.stat(self._journal)
        except FileNotFoundError:
            return False
        mine = os.fstat(fd)
        return (here.st_dev, here.st_ino) == (mine.st_dev, mine.st_ino)

    def _set_threshold(self) -> None:
        live = len(self._live)
        self._compact_at = live + max(_MIN_GARBAGE, 2 * live) + 1

    def _maybe_compact(self) -> None:
        fd = self._fd
        if fd is None:
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            # Another supervisor has the journal open: leave it be, try again a while later. A
            # failed conversion may have dropped our shared lock: take it again, on the current file.
            self._relock()
            self._compact_at = self._lines + _MIN_GARBAGE
            return
        try:
            self._compact(fd)
        except OSError:
            # Disk full or the like: the journal is intact, only longer than it should be.
            with contextlib.suppress(OSError):
                os.unlink(self._journal + ".tmp")
            self._relock()
            self._compact_at = self._lines + _MIN_GARBAGE

    def _compact(self, fd: int) -> None:
        """Rewrite the journal with the latest record of each live session (we hold it exclusively).

        No fsync: the spawn path must not wait for the disk, and a power loss that cost the new
        journal would also have ended every session it describes.
        """
        latest, _ = _latest(_read_all(fd))
        tmp = self._journal + ".tmp"
        new = os.open(tmp, _OPEN_FLAGS | os.O_TRUNC, 0o600)
        try:
            body = b"".join(line + b"\n" for line in latest.values())
            view = memoryview(body)
            while view:
                view = view[os.write(new, view) :]
            fcntl.flock(new, fcntl.LOCK_SH)
            os.replace(tmp, self._journal)
        except BaseException:
            os.close(new)
            raise
        self._fd = new
        os.close(fd)  # drops the exclusive lock: anyone waiting on the old file re-opens the new one
        self._live = set(latest)
        self._lines = len(latest)
        self._set_threshold()

    def _relock(self) -> None:
        fd = self._fd
        if fd is None:
            return
        fcntl.flock(fd, fcntl.LOCK_SH)
        if not self._is_current(fd):
            os.close(fd)
            self._fd = self._open_locked()

    # -- reading -------------------------------------------------------------------------------

    def load(self) -> dict[str, dict[str, Any]]:
        """The latest intact record of every session not deleted, by id."""
        try:
            fd = open_state_file(self._journal, os.O_RDONLY, "the session journal")
        except FileNotFoundError:
            return {}
        with open(fd, "rb") as f:
            data = f.read()
        latest, _ = _latest(data)
        found: dict[str, dict[str, Any]] = {}
        for session_id, raw in latest.items():
            if not valid_session_id(session_id):
                # Damaged or planted: its id would name a path outside sessions/ (``..``) or a
                # cgroup not its own, which adoption kills and a removal deletes. Never read back.
                _log.warning("a record of the session journal has an invalid id %r: ignored", session_id[:80])
                continue
            found[session_id] = json.loads(raw)
        return found

    # -- closing -------------------------------------------------------------------------------

    def close(self) -> None:
        self._closed = True
        self._release()

    def _release(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)


class OrderedLater:
    """A store some of whose records may be written a moment later, never out of order.

    ``save_soon`` queues a record and writes it in a callback of the event loop's next turn;
    every other call (a save, a delete, a load, the close) writes what is queued first, so the
    journal reads exactly as if each had been written at once. A supervisor without an owner
    writes its sessions' end records this way (nothing reads its journal after a crash): the
    caller waiting for a session resumes first, and the write no longer lies on its path."""

    def __init__(self, inner: SessionStore) -> None:
        self.inner = inner
        self._due: list[tuple[str, dict[str, Any]]] = []
        self._handle: asyncio.Handle | None = None

    def save_soon(self, session_id: str, record: dict[str, Any]) -> None:
        self._due.append((session_id, record))
        if self._handle is None:
            self._handle = asyncio.get_running_loop().call_soon(self.flush)

    def flush(self) -> None:
        """Write what is queued, in the order it came."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        due, self._due = self._due, []
        for session_id, record in due:
            self.inner.save(session_id, record)

    def session_dir(self, session_id: str) -> Path:
        return self.inner.session_dir(session_id)

    def save(self, session_id: str, record: dict[str, Any]) -> None:
        self.flush()
        self.inner.save(session_id, record)

    def load(self) -> dict[str, dict[str, Any]]:
        self.flush()
        return self.inner.load()

    def delete(self, session_id: str) -> None:
        self.flush()
        self.inner.delete(session_id)

    def close(self) -> None:
        self.flush()
        self.inner.close()
