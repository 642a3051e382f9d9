"""A session's spec as the journal keeps it, and read back: what was admitted, whole.

A restarted server rebuilds every session of its owner from the journal (Supervisor._adopt). A
session that starts another run there (a restart policy) runs exactly what was admitted the
first time: the same command, directory, environment, limits, box and lane. The policy's
checks are not made again, so nothing they decided (a read-only root, no network, a memory
cap) may be lost on the way through the file: every field of :class:`SpawnSpec` that shapes a
run is written here, and read back into the same types.

What a record read back from disk says is not trusted: a session id must be one this
procpilot could have made (:func:`valid_session_id`), since it names paths under the state
directory and cgroups that are killed and removed.
"""

from __future__ import annotations

import base64
import re
from pathlib import Path
from typing import Any

from procpilot.engine.isolation import FALLBACKS, Isolation
from procpilot.engine.limits import Limits
from procpilot.engine.restart import RestartPolicy
from procpilot.engine.spawn import SpawnSpec

__all__ = ["spec_from_record", "spec_record", "valid_session_id"]

# One path component and nothing else: no "." or "..", no "/", no NUL, short. Every id procpilot
# makes (16 base32 characters) fits; a record with any other id is a damaged or planted one.
_SESSION_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")


def valid_session_id(session_id: object) -> bool:
    """True iff ``session_id`` can safely name a directory under ``sessions/`` (and a cgroup)."""
    return isinstance(session_id, str) and _SESSION_ID.fullmatch(session_id) is not None


def spec_record(spec: SpawnSpec) -> dict[str, Any]:
    """The fields of ``spec`` a run is started from, as JSON values."""
    found: dict[str, Any] = {
        "command": spec.command if isinstance(spec.command, str) else list(spec.command),
        "cwd": str(spec.cwd) if spec.cwd else None,
        "pty": spec.pty,
    }
    # Written only when not the default: most sessions' records stay as short as before.
    if spec.env:
        found["env"] = dict(spec.env)
    if spec.pty and spec.pty_size != (120, 30):
        found["pty_size"] = list(spec.pty_size)
    if spec.stdin != "pipe":
        found["stdin"] = spec.stdin
    if spec.lane is not None:
        found["lane"] = spec.lane
    if spec.timeout:
        found["timeout"] = spec.timeout
    if not spec.notify_on_exit:
        found["notify_on_exit"] = False
    if spec.limits is not None:
        found["limits"] = {
            "memory_bytes": spec.limits.memory_bytes,
            "cpu_fraction": spec.limits.cpu_fraction,
            "pids_max": spec.limits.pids_max,
            "address_space_bytes": spec.limits.address_space_bytes,
        }
    if spec.isolation is not None:
        box = spec.isolation
        found["isolation"] = {
            "network": box.network,
            "readonly_root": box.readonly_root,
            "writable": [str(p) for p in box.writable],
            "private": box.private,
            "hidden": [str(p) for p in box.hidden],
            "new_session": box.new_session,
            "fallback": sorted(box.fallback),
        }
    if spec.restart is not None:
        policy = spec.restart
        found["restart"] = {
            "mode": policy.mode,
            "max_restarts": policy.max_restarts,
            "backoff": policy.backoff,
            "max_backoff": policy.max_backoff,
            "stable_after": policy.stable_after,
        }
        if spec.stdin_data is not None:
            # Fed to every run again: a restart needs it (only then is it kept, once per record).
            found["stdin_data"] = base64.b64encode(spec.stdin_data).decode()
    if spec.name is not None:
        found["name"] = spec.name
    return found


def _number(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"not a number: {value!r}")
    return float(value)


def _integer(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"not an integer: {value!r}")
    return value


def _paths(values: Any) -> tuple[Path, ...]:
    if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
        raise TypeError(f"not a list of paths: {values!r}")
    return tuple(Path(v) for v in values)


def _limits(found: Any) -> Limits | None:
    if found is None:
        return None
    if not isinstance(found, dict):
        raise TypeError(f"limits: {found!r}")
    return Limits(
        memory_bytes=_integer(found.get("memory_bytes")),
        cpu_fraction=_number(found.get("cpu_fraction")),
        pids_max=_integer(found.get("pids_max")),
        address_space_bytes=_integer(found.get("address_space_bytes")),
    )


def _isolation(found: Any) -> Isolation | None:
    if found is None:
        return None
    if not isinstance(found, dict):
        raise TypeError(f"isolation: {found!r}")
    return Isolation(
        network=bool(found.get("network", True)),
        readonly_root=bool(found.get("readonly_root", False)),
        writable=_paths(found.get("writable", [])),
        private=bool(found.get("private", False)),
        hidden=_paths(found.get("hidden", [])),
        new_session=bool(found.get("new_session", True)),
        # Only the weaker mechanisms this procpilot knows: a record cannot widen what a box may be.
        fallback=frozenset(str(name) for name in found.get("fallback", ()) if name in FALLBACKS),
    )


def _restart(found: Any) -> RestartPolicy | None:
    if found is None:
        return None
    if not isinstance(found, dict) or found.get("mode") not in ("on-failure", "always"):
        raise TypeError(f"restart: {found!r}")
    return RestartPolicy(
        found["mode"],
        max_restarts=_integer(found.get("max_restarts")) or 0,
        backoff=_number(found.get("backoff")) or 0.0,
        max_backoff=_number(found.get("max_backoff")) or 0.0,
        stable_after=_number(found.get("stable_after")) or 0.0,
    )


def spec_from_record(record: dict[str, Any]) -> SpawnSpec:
    """The spec ``record`` was written from (TypeError, ValueError or a ProcpilotError: damaged).

    A record of the previous format (before the whole spec was kept) has only command, cwd, pty,
    timeout and notify_on_exit: the rest is then the default, as that format's adoption did."""
    command = record["command"]
    if isinstance(command, list) and all(isinstance(c, str) for c in command):
        command = tuple(command)
    elif not isinstance(command, str):
        raise TypeError(f"command: {command!r}")
    env = record.get("env") or {}
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise TypeError("env is not a map of strings")
    size = record.get("pty_size") or [120, 30]
    stdin = record.get("stdin", "pipe")
    if stdin not in ("pipe", "null"):
        raise TypeError(f"stdin: {stdin!r}")
    data = record.get("stdin_data")
    name, lane, cwd = record.get("name"), record.get("lane"), record.get("cwd")
    for key, value in (("name", name), ("lane", lane), ("cwd", cwd)):
        if value is not None and not isinstance(value, str):
            raise TypeError(f"{key}: {value!r}")
    return SpawnSpec(
        command,
        cwd=Path(cwd) if cwd else None,
        env=env,
        timeout=_number(record.get("timeout")),
        pty=bool(record.get("pty")),
        pty_size=(int(size[0]), int(size[1])),
        stdin=stdin,
        stdin_data=base64.b64decode(data) if isinstance(data, str) else None,
        lane=lane,
        notify_on_exit=bool(record.get("notify_on_exit", True)),
        limits=_limits(record.get("limits")),
        isolation=_isolation(record.get("isolation")),
        name=name,
        restart=_restart(record.get("restart")),
    )
