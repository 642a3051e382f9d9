"""A session's record holds the whole spec it was admitted with, and nothing read back is trusted."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from pathlib import Path

import pytest

from procpilot.config import Settings
from procpilot.engine.capture import Stream
from procpilot.engine.isolation import Isolation
from procpilot.engine.limits import Limits
from procpilot.engine.records import spec_from_record, spec_record, valid_session_id
from procpilot.engine.restart import RestartPolicy
from procpilot.engine.spawn import SpawnSpec
from procpilot.engine.store import FileStore
from procpilot.engine.supervisor import Supervisor

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
