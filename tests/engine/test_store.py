"""The session journal: latest record per live session, tombstones, compaction, torn lines, sharing."""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from procpilot.engine import store as store_module
from procpilot.engine.spawn import SpawnSpec
from procpilot.engine.store import FileStore
from procpilot.engine.supervisor import Supervisor


@pytest.fixture
def store(tmp_path: Path) -> Iterator[FileStore]:
    s = FileStore(tmp_path)
    yield s
    s.close()


def rec(session_id: str, state: str, **extra: Any) -> dict[str, Any]:
    return {"id": session_id, "state": state, **extra}


def journal_lines(store: FileStore) -> list[bytes]:
    return store.journal.read_bytes().splitlines()


def test_load_gives_the_latest_record_of_each_live_session(store: FileStore) -> None:
    store.save("a", rec("a", "running", pid=10))
    store.save("b", rec("b", "running"))
    store.save("a", rec("a", "exited_ok", pid=10))
    store.save("c", rec("c", "queued"))
    store.delete("b")
    assert store.load() == {"a": rec("a", "exited_ok", pid=10), "c": rec("c", "queued")}
    assert len(journal_lines(store)) == 5  # one line per change, one tombstone
    assert stat.S_IMODE(store.journal.stat().st_mode) == 0o600


def test_a_fresh_store_reads_what_another_wrote_and_holds_no_fd(store: FileStore, tmp_path: Path) -> None:
    assert FileStore(tmp_path).load() == {}
    store.save("a", rec("a", "running"))
    assert FileStore(tmp_path).load() == {"a": rec("a", "running")}


def test_the_record_is_filed_under_the_id_it_is_saved_as(store: FileStore) -> None:
    store.save("a", {"state": "running"})
    assert store.load() == {"a": {"state": "running", "id": "a"}}


def test_a_torn_last_line_is_skipped_and_the_next_record_is_not_glued_to_it(tmp_path: Path) -> None:
    first = FileStore(tmp_path)
    first.save("a", rec("a", "running"))
    first.save("b", rec("b", "running"))
    first.close()
    with open(first.journal, "ab") as f:
        f.write(b'{"id":"a","state":"exi')  # a crash in the middle of a write
    assert FileStore(tmp_path).load() == {"a": rec("a", "running"), "b": rec("b", "running")}
    again = FileStore(tmp_path)
    again.save("c", rec("c", "running"))
    again.close()
    assert again.load() == {"a": rec("a", "running"), "b": rec("b", "running"), "c": rec("c", "running")}


def test_garbage_lines_and_a_missing_journal_are_never_errors(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    assert store.load() == {}
    store.journal.write_bytes(b'\n[1,2]\n"x"\n{"no":"id"}\n\xff\xfe\n{"id":"a","state":"ok"}\n{"deleted":7}\n')
    assert store.load() == {"a": {"id": "a", "state": "ok"}}


def test_compaction_keeps_only_live_latest_records(store: FileStore, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(store_module, "_MIN_GARBAGE", 20)
    store.save("keep", rec("keep", "running"))
    for i in range(30):
        sid = f"s{i}"
        store.save(sid, rec(sid, "running"))
        store.save(sid, rec(sid, "exited_ok"))
        if i % 3:
            store.delete(sid)
    store.save("keep", rec("keep", "exited_ok"))
    expected = {"keep": rec("keep", "exited_ok")} | {
        f"s{i}": rec(f"s{i}", "exited_ok") for i in range(30) if i % 3 == 0
    }
    assert store.load() == expected
    lines = journal_lines(store)
    assert len(lines) < 30 * 3  # rewritten at least once: far fewer than the 81 lines appended
    assert len(lines) <= len(expected) + 2 * 20 + 1
    assert FileStore(store.journal.parent).load() == expected
    assert not Path(str(store.journal) + ".tmp").exists()


def test_the_journal_never_grows_without_bound(store: FileStore, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(store_module, "_MIN_GARBAGE", 50)
    for i in range(2000):
        sid = f"s{i}"
        store.save(sid, rec(sid, "running"))
        store.save(sid, rec(sid, "exited_ok"))
        store.delete(sid)
    assert len(journal_lines(store)) <= 51
    assert store.load() == {}


def test_a_torn_line_before_compaction_is_dropped_by_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(store_module, "_MIN_GARBAGE", 5)
    first = FileStore(tmp_path)
    first.save("a", rec("a", "running"))
    first.close()
    with open(first.journal, "ab") as f:
        f.write(b'{"id":"a","sta')
    store = FileStore(tmp_path)
    for i in range(10):
        store.save("b", rec("b", f"n{i}"))
    store.close()
    assert store.load() == {"a": rec("a", "running"), "b": rec("b", "n9")}
    assert all(json.loads(line) for line in journal_lines(store))


def test_a_journal_shared_with_a_live_store_is_not_rewritten(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(store_module, "_MIN_GARBAGE", 5)
    one, two = FileStore(tmp_path), FileStore(tmp_path)
    try:
        one.save("x", rec("x", "running"))
        two.save("y", rec("y", "running"))
        for i in range(40):
            one.save("x", rec("x", f"n{i}"))  # plenty of garbage, but `two` holds the journal too
            two.save("y", rec("y", f"n{i}"))
        assert one.load() == {"x": rec("x", "n39"), "y": rec("y", "n39")}
        assert len(journal_lines(one)) == 82
        two.close()
        for i in range(40, 60):
            one.save("x", rec("x", f"n{i}"))  # alone now: it compacts, keeping the other's records
        assert one.load() == {"x": rec("x", "n59"), "y": rec("y", "n39")}
        assert len(journal_lines(one)) < 30
    finally:
        one.close()
        two.close()


def test_a_store_that_opened_a_replaced_journal_reopens_the_current_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = FileStore(tmp_path)
    first.save("a", rec("a", "running"))
    first.close()
    real_flock = fcntl.flock
    replaced: list[int] = []

    def flock_after_a_compaction(fd: int, op: int) -> None:
        if not replaced:
            # Another supervisor compacts between this one's open and its lock.
            replacement = tmp_path / "replacement"
            replacement.write_bytes(first.journal.read_bytes())
            os.replace(replacement, first.journal)
            replaced.append(fd)
        real_flock(fd, op)

    monkeypatch.setattr(store_module.fcntl, "flock", flock_after_a_compaction)
    store = FileStore(tmp_path)
    store.save("b", rec("b", "running"))
    store.close()
    assert replaced
    assert store.load() == {"a": rec("a", "running"), "b": rec("b", "running")}


def test_saving_after_close_still_records_and_keeps_no_fd(store: FileStore) -> None:
    store.save("a", rec("a", "running"))
    store.close()
    store.save("a", rec("a", "exited_ok"))
    store.delete("gone-never-saved")
    assert str(store.journal) not in open_files()
    assert store.load() == {"a": rec("a", "exited_ok")}


def test_delete_removes_the_output_directory_and_copes_with_none(store: FileStore) -> None:
    directory = store.session_dir("a")
    directory.mkdir()
    (directory / "combined.000000").write_bytes(b"x")
    store.save("a", rec("a", "exited_ok"))
    store.delete("a")
    assert not directory.exists()
    store.delete("never")  # neither a directory nor a record: nothing to do, no tombstone
    assert store.load() == {}
    assert len(journal_lines(store)) == 2


async def test_the_supervisor_records_each_session_in_the_journal_and_closes_it(
    supervisor: Supervisor,
) -> None:
    done = await supervisor.run(SpawnSpec("true"), scope="a", yield_ms=None)
    gone = await supervisor.run(SpawnSpec("echo x"), scope="a", yield_ms=None)
    supervisor.clear("a", gone.id)
    journal = supervisor.settings.state_dir / "sessions.jsonl"
    states = [json.loads(line).get("state") for line in journal.read_bytes().splitlines()]
    assert states == ["running", "exited_ok", "running", "exited_ok", None]
    records = FileStore(supervisor.settings.state_dir).load()
    assert list(records) == [done.id]
    assert records[done.id]["state"] == "exited_ok"
    await supervisor.aclose()
    assert str(journal) not in open_files()


def open_files() -> set[str]:
    found = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            found.add(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            continue  # the directory listing's own fd
    return found


async def test_without_an_owner_the_end_record_follows_the_callers_resumption_in_order(
    supervisor: Supervisor,
) -> None:
    # Nothing reads an unowned supervisor's journal after a crash: a session's end is written
    # once the caller waiting for it has run, in the same turn of the loop, and never after a
    # record that came later (a removal right after the call still follows the end).
    journal = supervisor.settings.state_dir / "sessions.jsonl"

    def states() -> list[str | None]:
        return [json.loads(line).get("state") for line in journal.read_bytes().splitlines()]

    done = await supervisor.run(SpawnSpec("true"), scope="a", yield_ms=None)
    assert done.finished and states() == ["running"]  # the caller runs first
    await asyncio.sleep(0)
    assert states() == ["running", "exited_ok"]
    gone = await supervisor.run(SpawnSpec("true"), scope="a", yield_ms=None)
    supervisor.clear("a", gone.id)  # before its end's turn: the end is written first, then the removal
    assert states() == ["running", "exited_ok", "running", "exited_ok", None]
    assert list(FileStore(supervisor.settings.state_dir).load()) == [done.id]
