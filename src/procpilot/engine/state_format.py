"""Which procpilot wrote a state directory, so a server reads only files it understands.

A state directory outlives the servers that use it (sessions are adopted across restarts and
upgrades), so its layout (the session journal, output files, the holder's spool, the exit
status files) is versioned as a whole: ``<state_dir>/format.json`` says the format and the
procpilot that first wrote it. A server that meets a format it cannot read refuses to start and
says why, rather than misread another version's files (or adopt processes it cannot serve);
a marker that is not a file or not one procpilot wrote is damage (StateDirDamaged).
A directory without the file is format 1: every release before the file existed wrote that.

Format 2: a session's journal record is the whole session (the spec as admitted, box and restart
policy included, its restart counters, its TTL clock), and ended sessions are read back too
(engine/records.py). Format 1 is read (its records have less in them: what they lack takes its
default, as a format-1 server's adoption did) and then marked 2: a procpilot that reads only
format 1 would adopt the sessions written now without their box or restart policy, so it must
refuse the directory, and does, saying which procpilot wrote it.
"""

from __future__ import annotations

import contextlib
import json
import os
from importlib import metadata
from pathlib import Path

from procpilot.engine.state_files import damaged, open_state_file
from procpilot.errors import StateDirIncompatible

__all__ = ["FORMAT", "READABLE", "check_state_format"]

FORMAT = 2  # what this procpilot writes
READABLE = frozenset({1, 2})  # what it can adopt and read
_MARKER = "format.json"
_MAX_MARKER = 4096
_WHAT = "the state directory's format marker"


def _version() -> str:
    try:
        return metadata.version("procpilot")
    except metadata.PackageNotFoundError:
        return "unknown"


def check_state_format(state_dir: Path) -> None:
    """Refuse a state directory in a format this procpilot cannot read; mark a new one."""
    marker = state_dir / _MARKER
    try:
        fd = open_state_file(marker, os.O_RDONLY, _WHAT)
    except FileNotFoundError:
        _write(marker)
        return
    try:
        with open(fd, "rb") as f:
            raw = f.read(_MAX_MARKER)
    except OSError as exc:
        raise damaged(marker, _WHAT, f"cannot be read: {exc.strerror or exc}") from None
    try:
        found = json.loads(raw)
        written, by = found["format"], str(found.get("written_by", "an unknown version"))
        if not isinstance(written, int) or isinstance(written, bool):
            raise TypeError(written)
    except (ValueError, KeyError, TypeError):
        refusal = damaged(marker, _WHAT, "is not one procpilot wrote")
        refusal.hints["check"] = f"Check that {state_dir} is a procpilot state directory (state_dir in the config)."
        raise refusal from None
    if written in READABLE:
        if written < FORMAT:
            _upgrade(marker)
        return
    raise _refusal(
        state_dir,
        f"it holds format {written}, written by procpilot {by}; this procpilot ({_version()}) reads "
        f"format {', '.join(map(str, sorted(READABLE)))}",
        newer=written > FORMAT,
    )


def _write(marker: Path) -> None:
    # Written once, atomically: servers of other agents may start on the same directory at once.
    tmp = marker.with_name(f".{_MARKER}.{os.getpid()}")
    try:
        tmp.write_text(json.dumps({"format": FORMAT, "written_by": _version()}) + "\n")
        os.link(tmp, marker)  # never replaces a marker another server wrote meanwhile
    except FileExistsError:
        pass
    except OSError as exc:
        raise damaged(marker, _WHAT, f"cannot be written: {exc.strerror or exc}") from None
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()


def _upgrade(marker: Path) -> None:
    """Mark a directory of an older readable format as this one's, from now on: replaced
    atomically (a server of another agent upgrading it at once writes the same)."""
    tmp = marker.with_name(f".{_MARKER}.{os.getpid()}")
    try:
        tmp.write_text(json.dumps({"format": FORMAT, "written_by": _version()}) + "\n")
        os.replace(tmp, marker)
    except OSError as exc:
        raise _refusal(marker.parent, f"its {_MARKER} cannot be upgraded: {exc.strerror}") from None
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()


def _refusal(state_dir: Path, why: str, *, newer: bool | None = None) -> StateDirIncompatible:
    """``newer``: True for a newer format, False for an older one, None when none could be read."""
    if newer is None:
        hints = {"check": f"Check that {state_dir} is a procpilot state directory (state_dir in the config)."}
    elif newer:
        hints = {"upgrade": "Run the procpilot that wrote it (or a newer one) on this directory."}
    else:
        hints = {"finish": "Let the procpilot that wrote it finish its sessions there, then remove the directory."}
    return StateDirIncompatible(f"cannot use state directory {state_dir}: {why}", hints=hints, state_dir=str(state_dir))
