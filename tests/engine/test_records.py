"""A session's record holds the whole spec it was admitted with, and nothing read back is trusted."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import pytest

from procpilot.config import Settings
from procpilot.engine.capture import Stream
from procpilot.engine.isolation import Isolation
from procpilot.engine.limits import Limits
from procpilot.engine.records import SessionRecord, spec_from_record, spec_record, valid_session_id
from procpilot.engine.restart import RestartPolicy
from procpilot.engine.session import Session
from procpilot.engine.spawn import SpawnSpec
from procpilot.engine.states import SessionState
from procpilot.engine.store import FileStore
from procpilot.engine.supervisor import Supervisor
from procpilot.engine.usage import Usage
from procpilot.faces import console_view
from procpilot.faces.exec_process import exec_process_tools

# Fields of SpawnSpec that shape only the admission, never a run: the workspace is resolved into
# cwd, and "elevated" is the policy's to decide (its decision, the box or none, is in the record).
ADMISSION_ONLY = {"workspace", "elevated"}


def _everything() -> SpawnSpec:
    """A spec with every field that shapes a run set to something other than its default."""
    return SpawnSpec(
        ("python3", "-c", "print(1)"),
        cwd=Path("/tmp"),
        env={"A": "1", "B": "two"},
        timeout=12.5,
        pty=True,
        pty_size=(80, 24),
        stdin="null",
        stdin_data=b"\x00in\xff",
        lane="build",
        notify_on_exit=False,
        limits=Limits(memory_bytes=1 << 30, cpu_fraction=0.5, pids_max=64, address_space_bytes=1 << 32),
        isolation=Isolation(
            network=False,
            readonly_root=True,
            writable=(Path("/w"),),
            private=True,
            hidden=(Path("/secret"),),
            new_session=False,
        ),
        name="svc",
        restart=RestartPolicy("on-failure", max_restarts=3, backoff=0.5, max_backoff=8.0, stable_after=10.0),
    )


def test_every_field_a_run_is_started_from_comes_back_the_same_through_json() -> None:
    spec = _everything()
    # Any field added to SpawnSpec must be set above (and so kept), or be said to be admission-only.
    defaults = SpawnSpec("true")
    unset = {f.name for f in dataclasses.fields(SpawnSpec) if getattr(spec, f.name) == getattr(defaults, f.name)}
    assert unset == ADMISSION_ONLY
    back = spec_from_record(json.loads(json.dumps(spec_record(spec))))
    assert back == spec


def test_a_shell_command_and_defaults_make_a_short_record() -> None:
    spec = SpawnSpec("echo hi")
    assert spec_record(spec) == {"command": "echo hi", "cwd": None, "pty": False}
    assert spec_from_record(spec_record(spec)) == spec


@pytest.mark.parametrize(
    "damage",
    [{"command": 7}, {"env": {"A": 1}}, {"limits": {"memory_bytes": "1G"}}, {"restart": {"mode": "sometimes"}}],
)
def test_a_damaged_record_is_an_error_not_a_different_spec(damage: dict[str, object]) -> None:
    record = {**spec_record(_everything()), **damage}
    with pytest.raises((TypeError, ValueError)):
        spec_from_record(record)


@pytest.mark.parametrize("bad", ["..", ".", "../victim", "a/b", "", "x" * 65, "-x", "a\x00b", None, 7])
def test_an_id_that_is_not_one_path_component_is_invalid(bad: object) -> None:
    assert not valid_session_id(bad)


def test_the_store_never_reads_back_or_names_a_path_for_an_invalid_id(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    store.save("abcdefghijklmnop", {"state": "running"})
    with open(tmp_path / "sessions.jsonl", "a") as journal:
        journal.write(json.dumps({"id": "..", "state": "running"}) + "\n")
    assert set(store.load()) == {"abcdefghijklmnop"}
    for bad in ("..", "../x"):
        with pytest.raises(ValueError, match="not a session id"):
            store.session_dir(bad)
        with pytest.raises(ValueError, match="not a session id"):
            store.delete(bad)
    store.close()


async def test_an_ended_session_is_kept_by_the_next_server_until_its_ttl_then_forgotten_for_good(
    settings: Settings,
) -> None:
    """The TTL clock goes on across a restart: the next server lists the session, idle since it
    was last read under the first one, removes it when its TTL has passed, and a third server
    does not bring it back (the removal is in the journal)."""
    ttl = settings.engine.session_ttl_sec
    async with Supervisor(settings, owner="t") as first:
        done = await first.run(SpawnSpec("echo kept"), scope="a", yield_ms=None)
        first.get("a", done.id)
        read_at = time.monotonic()
        await first.detach()
    async with Supervisor(settings, owner="t") as second:
        [again] = second.list("a")
        assert again.id == done.id and again.output[Stream.COMBINED].read(0).data == b"kept\n"
        assert abs(again.idle_since - read_at) < 0.5
        assert second.sweep(read_at + ttl - 1) == []
        assert second.sweep(read_at + ttl + 1) == [done.id]
    async with Supervisor(settings, owner="t") as third:
        assert third.list("a") == []


async def test_a_read_of_an_ended_session_reaches_its_record_at_the_next_sweep(settings: Settings) -> None:
    """The TTL clock survives a crash as well as a hand-over: the periodic sweep writes the
    record of every ended session read since its last one (not every read: one line per poll)."""
    async with Supervisor(settings, owner="t") as sup:
        done = await sup.run(SpawnSpec("true"), scope="a", yield_ms=None)
        store = FileStore(settings.state_dir)
        ended_at = store.load()[done.id]["touched_at"]
        await asyncio.sleep(0.2)  # elapsed time between the end and the read, not a wait for an event
        sup.get("a", done.id)
        assert store.load()[done.id]["touched_at"] == ended_at  # a read alone writes nothing
        sup.sweep()
        assert store.load()[done.id]["touched_at"] >= ended_at + 0.2
        sup.sweep()  # nothing read since: nothing written
        lines = (settings.state_dir / "sessions.jsonl").read_text().count(done.id)
        sup.sweep()
        assert (settings.state_dir / "sessions.jsonl").read_text().count(done.id) == lines


# -- the session's whole record ----------------------------------------------------------------


A = "agent-a"


def _whole_record() -> SessionRecord:
    """A record with every field set to something other than its default."""
    return SessionRecord(
        id="abcdefghijklmnop",
        scope="agent-a/conv",
        spec=_everything(),
        state=SessionState.TIMED_OUT,
        created_at=1_700_000_000.5,
        started_at=1_700_000_001.25,
        ended_at=1_700_000_009.0,
        pid=4242,
        node="node-7",
        backgrounded=True,
        exit_code=3,
        exit_signal="SIGKILL",
        error="it took too long",
        signal_sent="SIGKILL",
        signals_sent=[("SIGTERM", 100), ("SIGKILL", 5100)],
        timed_out_waiting_for_input=True,
        restarts=2,
        quick_failures=1,
        run_started_at=1_700_000_005.0,
        next_run_at=1_700_000_010.0,
        touched_at=1_700_000_020.0,
        final_usage=Usage(cpu_ms=12, memory_peak_bytes=1 << 20, io_read_bytes=3, io_write_bytes=4),
        face_data={"claude": {"shell": 7}, "cursor": [1, 2]},
    )


def test_every_field_of_a_session_record_comes_back_the_same_through_json() -> None:
    record = _whole_record()
    # Any field added to SessionRecord must be set above, so that the journal keeps it too.
    defaults = SessionRecord("x", "y", SpawnSpec("true"))
    same = [f.name for f in dataclasses.fields(SessionRecord) if getattr(record, f.name) == getattr(defaults, f.name)]
    assert same == []
    assert SessionRecord.from_json(json.loads(json.dumps(record.to_json()))) == record


def test_a_record_keeps_the_custody_keys_beside_it_and_reads_earlier_formats() -> None:
    record = SessionRecord("abcdefghijklmnop", "a", SpawnSpec("echo hi"), state=SessionState.EXITED_OK)
    written = record.to_json({"owner": "serve", "format": 3})
    assert written["owner"] == "serve" and written["format"] == 3
    # A record of format 1 or 2 has none of the counters: each is what adoption assumed then.
    old = {"id": "abcdefghijklmnop", "scope": "a", "command": "echo hi", "state": "exited_ok", "pid": 12}
    back = SessionRecord.from_json(old)
    assert back.backgrounded and back.restarts == 0 and back.signals_sent == [] and back.face_data == {}
    assert back.pid == 12 and back.spec == SpawnSpec("echo hi")


def _close_in_duration(before: list[dict[str, Any]], after: list[dict[str, Any]], key: str) -> None:
    """Durations are kept as wall-clock start and end: read back they may differ by a rounding."""
    for old, new in zip(before, after, strict=True):
        assert abs(old.pop(key) - new.pop(key)) <= 5, (old, new)


async def test_every_field_a_face_shows_of_an_ended_session_comes_back_from_its_record(settings: Settings) -> None:
    """What the process list and the console show of ended sessions, before a restart and after:
    the same, field for field, since the next server has nothing but their records."""
    first = await Supervisor(settings, owner="faces", warm_shells=0).start()
    try:
        listing, rows, sessions, killed = await _ended_sessions_shown(first)
    except BaseException:
        await first.aclose()  # nothing left running for a next server that never comes
        raise
    await first.detach()
    async with Supervisor(settings, owner="faces", warm_shells=0) as second:
        again, rows_again = await _shown(second)
        assert second.get(A, killed.id).face_data == {"a-face": {"its-id": 7}}
    assert {r["sessionId"] for r in again} == {s.id for s in sessions}
    for key in ("durationMs", "runtimeMs"):
        _close_in_duration(listing, again, key)
    _close_in_duration(rows, rows_again, "durationMs")
    assert again == listing
    assert rows_again == rows


async def _shown(sup: Supervisor) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    tools = {t.name: t for t in exec_process_tools(sup)}
    listing = (await tools["process"].call({"action": "list"}, A)).data["sessions"]
    return listing, console_view.rows(sup, A)


async def _ended_sessions_shown(
    first: Supervisor,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[Session], Session]:
    quick = RestartPolicy("on-failure", max_restarts=2, backoff=0.01, max_backoff=0.01, stable_after=60)
    specs = [
        SpawnSpec("echo done"),
        SpawnSpec("echo oops >&2; exit 3", name="named"),
        SpawnSpec("exit 1", restart=quick),
        SpawnSpec("read x", timeout=0.3),  # times out waiting for input
        SpawnSpec("printf 'a\\r\\n'", pty=True),
    ]
    ended = [await first.run(spec, scope=A, yield_ms=0) for spec in specs]
    killed = await first.run(SpawnSpec("sleep 30"), scope=A, yield_ms=0)
    killed.face_data["a-face"] = {"its-id": 7}
    await first.kill(A, killed.id, wait=None)
    for session in ended:
        await first.wait(A, session.id, timeout=10)
    sessions = [*ended, killed]
    assert all(s.finished and s.backgrounded for s in sessions)
    assert killed.signals_sent and ended[2].restarts == 2 and ended[3].timed_out_waiting_for_input

    listing, rows = await _shown(first)
    assert {r["sessionId"] for r in listing} == {s.id for s in sessions}
    return listing, rows, sessions, killed
