"""A state directory says which format it holds; a server reads only what it understands."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from procpilot.config import Settings
from procpilot.engine.capture import Stream
from procpilot.engine.spawn import SpawnSpec
from procpilot.engine.state_format import FORMAT, check_state_format
from procpilot.engine.supervisor import Supervisor
from procpilot.errors import StateDirDamaged, StateDirIncompatible


async def test_a_new_directory_is_marked_and_a_marked_one_is_used_again(settings: Settings) -> None:
    async with Supervisor(settings) as sup:
        await sup.run(SpawnSpec("echo hi"), scope="a", yield_ms=None)
    marker = json.loads((settings.state_dir / "format.json").read_text())
    assert marker["format"] == FORMAT and marker["written_by"]
    async with Supervisor(settings):
        pass


async def test_a_directory_from_before_the_marker_is_format_1_read_and_marked_as_now(settings: Settings) -> None:
    settings.state_dir.mkdir(parents=True)
    (settings.state_dir / "sessions.jsonl").write_text("")  # what releases without format.json left
    async with Supervisor(settings):
        pass
    assert json.loads((settings.state_dir / "format.json").read_text())["format"] == FORMAT == 2


async def test_a_format_1_journal_is_read_whole_and_the_directory_marked_2(settings: Settings) -> None:
    """A format-1 directory's records had only what adoption needed (no spec beyond command, cwd
    and pty; no TTL clock): they are read, what they lack takes its default, and an ended
    session is listed and readable. Then the directory is format 2, which a format-1 procpilot
    refuses (it would adopt sessions without their box or restart policy)."""
    async with Supervisor(settings, owner="serve") as sup:
        ended = await sup.run(SpawnSpec("echo from-format-1; exit 3"), scope="a", yield_ms=None)
    journal = settings.state_dir / "sessions.jsonl"
    old_keys = {"id", "scope", "command", "cwd", "pty", "state", "pid", "created_at", "started_at", "ended_at"}
    old_keys |= {"exit_code", "exit_signal", "backgrounded", "error", "name", "restarts", "owner", "format"}
    lines = [json.loads(line) for line in journal.read_text().splitlines()]
    journal.write_text("".join(json.dumps({k: v for k, v in r.items() if k in old_keys}) + "\n" for r in lines))
    (settings.state_dir / "format.json").write_text(json.dumps({"format": 1, "written_by": "0.9.0"}))
    async with Supervisor(settings, owner="serve") as sup:
        again = sup.get("a", ended.id)
        assert (again.state.value, again.exit_code) == ("exited_error", 3)
        assert again.output[Stream.COMBINED].read(0).data == b"from-format-1\n"
    assert json.loads((settings.state_dir / "format.json").read_text())["format"] == 2


@pytest.mark.parametrize(("written", "hint"), [(FORMAT + 1, "upgrade"), (0, "finish")])
def test_a_format_it_cannot_read_is_refused_with_what_wrote_it_and_what_to_do(
    tmp_path: Path, written: int, hint: str
) -> None:
    (tmp_path / "format.json").write_text(json.dumps({"format": written, "written_by": "9.0.0"}))
    with pytest.raises(StateDirIncompatible) as info:
        check_state_format(tmp_path)
    assert f"format {written}, written by procpilot 9.0.0" in info.value.message
    assert set(info.value.hints) == {"separate", hint}


@pytest.mark.parametrize("content", ["{", '{"format": "1"}', '{"format": true}', "[]", '{"written_by": "x"}'])
def test_a_marker_procpilot_did_not_write_is_refused(tmp_path: Path, content: str) -> None:
    (tmp_path / "format.json").write_text(content)
    with pytest.raises(StateDirDamaged, match="not one procpilot wrote") as info:
        check_state_format(tmp_path)
    assert set(info.value.hints) == {"look", "move_aside", "check"}


def test_the_server_refuses_to_start_on_it_with_a_clear_message(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    (state / "format.json").write_text(json.dumps({"format": FORMAT + 1, "written_by": "9.0.0"}))
    config = tmp_path / "procpilot.toml"
    config.write_text(f'state_dir = "{state}"\nworkspace_root = "{tmp_path}"\n[server]\nport = 0\n')
    done = subprocess.run(
        [str(Path(sys.executable).parent / "procpilot"), "serve", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "HOME": str(tmp_path)},
    )
    assert done.returncode == 2, done.stderr
    assert "StateDirIncompatible" in done.stderr and "written by procpilot 9.0.0" in done.stderr
    assert "Traceback" not in done.stderr
