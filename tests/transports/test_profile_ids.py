"""The codex and claude profiles' own ids (Codex's integers, Claude Code's ``b…`` task ids) are
kept with their sessions: a real daemon killed outright (kill -9), then a new one on the same
state directory, answers the old ids and goes on from where each read cursor was; with
``isolate_conversations`` each conversation has its own, and an id goes with its session."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

from mcp import Client

from tests.daemon import TOKEN_A, Served, start_daemon
from tests.transports.test_console_api import as_browser, login
from tests.transports.test_restarts import _kill_9, _leave_nothing


async def _text(client: Client, tool: str, **args: Any) -> str:
    result = await client.call_tool(tool, args)
    return str(result.content[0].text)  # type: ignore[union-attr]


def _codex_id(text: str) -> int:
    found = re.search(r"^Process running with session ID (\d+)$", text, re.MULTILINE)
    assert found is not None, text
    return int(found.group(1))


def _claude_id(text: str) -> str:
    found = re.match(r"Command running in background with ID: (b[0-9a-z]{8})\.", text)
    assert found is not None, text
    return found.group(1)


def _output(text: str) -> str:
    """What a Codex result shows of the output."""
    return text.split("\nOutput:\n", 1)[1]


async def test_codex_ids_and_cursors_outlive_a_kill_9(tmp_path: Path) -> None:
    root = tmp_path / "d"
    first = start_daemon(root, exec_='profile = "codex"')
    second: Served | None = None
    try:
        async with first.mcp() as client:
            text = await _text(
                client, "exec_command", cmd="echo ready; read x; echo got:$x", tty=True, yield_time_ms=1000
            )
            tty = _codex_id(text)
            assert "ready" in _output(text)
            text = await _text(client, "exec_command", cmd="echo a; read x; echo b", tty=True, yield_time_ms=1000)
            other = _codex_id(text)
            assert _output(text).strip() == "a"
        _kill_9(first)
        second = start_daemon(root, log_name="second.log", exec_='profile = "codex"')
        async with second.mcp() as client:
            text = await _text(client, "write_stdin", session_id=tty, chars="hi\n", yield_time_ms=5000)
            assert "Process exited with code 0" in text, text
            # From where the last call before the kill got to: "ready" was shown then, not again.
            shown = _output(text)
            assert "got:hi" in shown and "ready" not in shown, text
            text = await _text(client, "write_stdin", session_id=other, chars="\n", yield_time_ms=5000)
            assert "Process exited with code 0" in text and _output(text).split() == ["b"], text
            # Each exit was told once: the ids are forgotten now, in the record too.
            text = await _text(client, "write_stdin", session_id=tty, chars="")
            assert text == f"write_stdin failed: Unknown process id {tty}"
    finally:
        _leave_nothing(root, first, second)


async def test_claude_task_ids_and_bash_output_cursor_outlive_a_kill_9(tmp_path: Path) -> None:
    root = tmp_path / "d"
    first = start_daemon(root, exec_='profile = "claude"')
    second: Served | None = None
    try:
        async with first.mcp() as client:
            # It prints "second" only once the file appears: after the restart, on the test's word.
            gate = tmp_path / "go"
            command = f"echo first; until [ -e {gate} ]; do sleep 0.05; done; echo second"
            task = _claude_id(await _text(client, "Bash", command=command, run_in_background=True))
            stopped = _claude_id(await _text(client, "Bash", command="sleep 300", run_in_background=True))
            deadline = time.monotonic() + 30
            seen = ""
            while "first" not in seen:
                assert time.monotonic() < deadline, seen
                seen += await _text(client, "BashOutput", bash_id=task)
        _kill_9(first)
        second = start_daemon(root, log_name="second.log", exec_='profile = "claude"')
        async with second.mcp() as client:
            gate.touch()
            text = await _text(client, "TaskOutput", task_id=task, timeout=10_000)
            assert "<retrieval_status>success</retrieval_status>" in text, text
            assert f"<task_id>{task}</task_id>" in text and "<status>completed</status>" in text, text
            assert "<output>\nfirst\nsecond\n</output>" in text, text
            # BashOutput goes on from its last read before the kill: only the new line.
            text = await _text(client, "BashOutput", bash_id=task)
            assert "<stdout>\nsecond\n</stdout>" in text, text
            text = await _text(client, "TaskStop", task_id=stopped)
            assert f"Successfully stopped task: {stopped} (sleep 300)" in text, text
            # Told by TaskStop's caller: no notification of it, nor of the task read above.
            text = await _text(client, "TaskOutput", task_id=stopped, timeout=10_000)
            assert "<task-notification>" not in text and "<status>killed</status>" in text, text
    finally:
        _leave_nothing(root, first, second)


async def test_each_conversation_has_its_own_task_ids_and_one_goes_with_its_session(tmp_path: Path) -> None:
    served = start_daemon(tmp_path / "d", exec_='profile = "claude"', extra="[tools]\nisolate_conversations = true\n")
    try:
        async with served.mcp(TOKEN_A, mode="legacy") as a, served.mcp(TOKEN_A, mode="legacy") as b:
            text = await _text(a, "Bash", command="echo from-a", run_in_background=True)
            task = _claude_id(text)
            session_id = Path(text.rsplit(": ", 1)[1]).parent.name  # the file it writes to names it
            assert "<status>completed</status>" in await _text(a, "TaskOutput", task_id=task, timeout=10_000)
            assert await _text(b, "TaskOutput", task_id=task) == f"No task found with ID: {task}"
            assert "<task-notification>" not in await _text(b, "Bash", command="true")
            # A person removes the session in the console: its task id goes with it.
            name, cookie, secret = login(served, TOKEN_A)
            with served.http(None) as page:
                removed = page.post(
                    f"/console/api/sessions/agent-a/{session_id}/remove", headers=as_browser(name, [cookie], secret)
                )
                assert removed.status_code == 200, removed.text
            assert await _text(a, "TaskOutput", task_id=task) == f"No task found with ID: {task}"
    finally:
        assert served.stop() == 0, served.log_text()
