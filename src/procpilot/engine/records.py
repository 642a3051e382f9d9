"""A session's record (``SessionRecord``) and its spec as the journal keeps them, and read back.

A session is three parts: its record (what it is: identity, the spec as admitted, its life so
far, its exit, its restart counters, its TTL clock, its final usage, what faces keep of it), its
current run (session.Run: the process and descriptors of one run, replaced at each restart) and
its stdin writer (stdin.py). Whatever a face shows of a session comes from its record or from the
running process; the journal writes the record (``SessionRecord.to_json``) and every restart
path rebuilds sessions from it (``SessionRecord.from_json``, ``Session.from_record``).

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
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from procpilot.engine.isolation import FALLBACKS, Isolation
from procpilot.engine.limits import Limits
from procpilot.engine.restart import RestartPolicy
from procpilot.engine.spawn import SpawnSpec
from procpilot.engine.states import SessionState
from procpilot.engine.usage import Usage

__all__ = ["SessionRecord", "spec_from_record", "spec_record", "valid_session_id"]

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


@dataclass(slots=True)
class SessionRecord:
    """What a session is, apart from its current run and its stdin writer; times are wall-clock.

    The session keeps its record current as it lives (its fields are the session's: ``state``,
    ``exit_code``...); the parts that belong to the run or to a clock (``pid``, ``touched_at``,
    the restart cycle's times) are brought up to date when it is written."""

    # identity, and the spec as admitted (command, cwd, env, limits, box, lane, pty, name, policy)
    id: str
    scope: str
    spec: SpawnSpec
    state: SessionState = SessionState.QUEUED
    created_at: float = field(default_factory=time.time)
    started_at: float | None = None
    ended_at: float | None = None
    pid: int | None = None  # the leader of its current (or last) run
    node: str | None = None  # the cluster node that runs it; None: this host
    backgrounded: bool = False
    # exit info
    exit_code: int | None = None
    exit_signal: str | None = None
    error: str | None = None
    signal_sent: str | None = None  # the last signal procpilot sent its tree
    # every signal procpilot sent the tree, with when (ms since the run started)
    signals_sent: list[tuple[str, int]] = field(default_factory=list)
    timed_out_waiting_for_input: bool = False
    # the restart policy's counters
    restarts: int = 0  # runs after the first
    quick_failures: int = 0  # short runs in a row, for the backoff
    run_started_at: float | None = None
    next_run_at: float | None = None  # while its next run is due
    # the TTL clock: when it was last read (or ended, if later)
    touched_at: float | None = None
    # output accounting: its resources over its whole life, once ended (the output's own
    # accounting, sizes and what the cap dropped, is in its files)
    final_usage: Usage | None = None
    # What faces keep of it under their own names (a profile's id for it, a read cursor): JSON
    # values, written and restored as they are; the engine never reads them.
    face_data: dict[str, Any] = field(default_factory=dict)

    def to_json(self, custody: dict[str, Any] | None = None) -> dict[str, Any]:
        """The journal's form; ``custody``: what the supervisor keeps for the next server
        (owner, format, the tree's directories...), written beside it."""
        found: dict[str, Any] = {
            "id": self.id,
            "scope": self.scope,
            **spec_record(self.spec),
            "state": self.state.value,
            "pid": self.pid,
            "created_at": self.created_at,
            "started_at": self.started_at,
            "ended_at": self.ended_at,
            "exit_code": self.exit_code,
            "exit_signal": self.exit_signal,
            "backgrounded": self.backgrounded,
            "error": self.error,
            "name": self.spec.name,
            "restarts": self.restarts,
            "touched_at": self.touched_at,
            **(custody or {}),
        }
        if self.spec.restart is not None:
            found["quick_failures"] = self.quick_failures
            found["run_started_at"] = self.run_started_at
            if self.next_run_at is not None:
                found["next_run_at"] = self.next_run_at
        if self.signal_sent is not None:
            found["signal_sent"] = self.signal_sent
        if self.signals_sent:
            found["signals_sent"] = [[name, ms] for name, ms in self.signals_sent]
        if self.final_usage is not None:
            found["usage"] = self.final_usage.as_dict()
        if self.timed_out_waiting_for_input:
            found["timed_out_waiting_for_input"] = True
        if self.node is not None:
            found["node"] = self.node
        if self.face_data:
            found["face_data"] = dict(self.face_data)
        return found

    @classmethod
    def from_json(cls, record: dict[str, Any]) -> SessionRecord:
        """A record as the journal holds it, checked (TypeError, ValueError, KeyError or a
        ProcpilotError: damaged). A record of an earlier format lacks some fields: each is then
        what that format's adoption assumed (backgrounded, no counters)."""
        code, sig, error = record.get("exit_code"), record.get("exit_signal"), record.get("error")
        sent, node, kept = record.get("signal_sent"), record.get("node"), record.get("face_data")
        return cls(
            id=str(record["id"]),
            scope=str(record["scope"]),
            spec=spec_from_record(record),
            state=SessionState(record["state"]),
            created_at=_wall(record.get("created_at")) or time.time(),
            started_at=_wall(record.get("started_at")),
            ended_at=_wall(record.get("ended_at")),
            pid=_integer_or_none(record.get("pid")),
            node=node if isinstance(node, str) else None,
            backgrounded=bool(record.get("backgrounded", True)),
            exit_code=_integer_or_none(code),
            exit_signal=sig if isinstance(sig, str) else None,
            error=error if isinstance(error, str) else None,
            signal_sent=sent if isinstance(sent, str) else None,
            signals_sent=_signals(record.get("signals_sent")),
            timed_out_waiting_for_input=bool(record.get("timed_out_waiting_for_input")),
            restarts=int(record.get("restarts") or 0),
            quick_failures=int(record.get("quick_failures") or 0),
            run_started_at=_wall(record.get("run_started_at")),
            next_run_at=_wall(record.get("next_run_at")),
            touched_at=_wall(record.get("touched_at")),
            final_usage=_usage(record.get("usage")),
            face_data=dict(kept) if isinstance(kept, dict) else {},
        )


def _wall(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _integer_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _signals(found: Any) -> list[tuple[str, int]]:
    if not isinstance(found, list):
        return []
    return [
        (str(item[0]), int(item[1]))
        for item in found
        if isinstance(item, list) and len(item) == 2 and isinstance(item[0], str) and isinstance(item[1], int)
    ]


def _usage(found: Any) -> Usage | None:
    if not isinstance(found, dict):
        return None
    fields = ("cpu_ms", "memory_peak_bytes", "io_read_bytes", "io_write_bytes")
    values = [found.get(k, 0) for k in fields]
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values):
        return None
    return Usage(*values)
