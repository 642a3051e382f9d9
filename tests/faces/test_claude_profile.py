"""The claude profile: Claude Code's Bash/TaskOutput/TaskStop (and BashOutput/KillShell), result
texts to the letter, over MCP (the SDK's client in memory; a real ``procpilot mcp --profile
claude`` for the stdio paths)."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from mcp import Client

from procpilot.engine.session import Session
from procpilot.engine.supervisor import Supervisor
from tests.faces.profile_wire import SCOPE, Connect, assert_text_only_on_both_paths, call, connect, profile_supervisor

_BACKGROUND = re.compile(r"Command running in background with ID: (b[0-9a-z]{8})\. Output is being written to: (\S+)")


@pytest.fixture
async def sup(tmp_path: Path, workspace: Path) -> AsyncIterator[Supervisor]:
    async for supervisor in profile_supervisor(tmp_path, workspace, "claude"):
        yield supervisor


@pytest.fixture
def claude(sup: Supervisor) -> Connect:
    return connect(sup)


async def background(client: Client, command: str, **args: object) -> tuple[str, str]:
    """Starts ``command`` in the background: its task id and the file its output goes to."""
    text, err = await call(client, "Bash", command=command, run_in_background=True, **args)
    found = _BACKGROUND.fullmatch(text)
    assert not err and found is not None, text
    return found.group(1), found.group(2)


def newest(sup: Supervisor) -> Session:
    return sup.list(SCOPE)[0]


async def test_bash_merges_the_streams_and_a_failure_starts_with_its_exit_code(claude: Connect) -> None:
    async with claude() as client:
        names = [tool.name for tool in (await client.list_tools()).tools]
        assert names[:5] == ["Bash", "TaskOutput", "TaskStop", "BashOutput", "KillShell"] and "exec" not in names
        assert await call(client, "Bash", command="echo out; echo err >&2; echo out2") == ("out\nerr\nout2", False)
        assert await call(client, "Bash", command="echo oops; exit 3") == ("Exit code 3\noops", True)


async def test_the_timeout_is_bounded_and_ends_the_command(claude: Connect) -> None:
    async with claude() as client:
        text, err = await call(client, "Bash", command="true", timeout=600_001)
        assert err and text.startswith("InvalidArgument: timeout 600001 ms is more than the most, 600000 ms")
        assert await call(client, "Bash", command="true", timeout=600_000) == ("", False)
        text, err = await call(client, "Bash", command="echo before; sleep 30", timeout=300)
        assert (text, err) == ("Exit code 143\nbefore\nCommand timed out after 300 ms", True)
        # TaskOutput's wait is bounded the same way, by its schema: once cut to 600 s in silence.
        text, err = await call(client, "TaskOutput", task_id="b00000000", timeout=600_001)
        assert err and text.startswith("InvalidArgument") and "timeout" in text


async def test_output_past_30000_characters_keeps_the_head_and_the_tail(claude: Connect) -> None:
    twice = "head -c {0} /dev/zero | tr '\\0' a; head -c {0} /dev/zero | tr '\\0' b; echo"
    async with claude() as client:
        text, _ = await call(client, "Bash", command=twice.format(20_000))
        assert text == "a" * 15_000 + "\n\n... [10000 characters, 1 lines truncated] ...\n\n" + "b" * 15_000
        text, _ = await call(client, "Bash", command=twice.format(100_000))  # only its ends are read
        assert text == "a" * 15_000 + "\n\n... [170000 characters, 1 lines truncated] ...\n\n" + "b" * 15_000


async def test_a_background_task_is_read_with_task_output_blocking_or_not(claude: Connect, sup: Supervisor) -> None:
    async with claude() as client:
        task, path = await background(client, "echo started; sleep 30")
        session = newest(sup)
        assert path == str(session.output.directory / "combined.000000")
        await sup.wait(SCOPE, session.id, timeout=10, pattern=re.compile("started"))
        text, _ = await call(client, "TaskOutput", task_id=task, block=False)
        assert text == (
            f"<retrieval_status>not_ready</retrieval_status>\n\n<task_id>{task}</task_id>\n\n"
            "<task_type>local_bash</task_type>\n\n<status>running</status>\n\n<output>\nstarted\n</output>"
        )
        text, _ = await call(client, "TaskOutput", task_id=task, timeout=100)
        assert text.startswith("<retrieval_status>timeout</retrieval_status>")
        await sup.kill(SCOPE, session.id, wait=None)  # stopped elsewhere (the console): TaskOutput says so
        text, _ = await call(client, "TaskOutput", task_id=task)
        assert text.startswith("<retrieval_status>success</retrieval_status>") and "<status>killed</status>" in text
        task, path = await background(client, "sleep 0.2; echo done")
        text, _ = await call(client, "TaskOutput", task_id=task)  # blocks until it ends
        assert text == (
            f"<retrieval_status>success</retrieval_status>\n\n<task_id>{task}</task_id>\n\n"
            "<task_type>local_bash</task_type>\n\n<status>completed</status>\n\n<exit_code>0</exit_code>\n\n"
            "<output>\ndone\n</output>"
        )
        assert Path(path).read_text() == "done\n"


async def test_task_output_past_32000_characters_shows_the_tail_and_where_the_rest_is(claude: Connect) -> None:
    async with claude() as client:
        task, path = await background(client, "seq 1 10000")
        text, _ = await call(client, "TaskOutput", task_id=task)
    output = text.split("<output>\n", 1)[1].removesuffix("\n</output>")
    note, shown = output.split("\n", 1)
    assert note == f"[Truncated: the last 32000 characters. The full output is in {path}]"
    assert len(shown) == 32_000 and shown.endswith("9999\n10000")


async def test_task_stop_answers_claude_codes_json_and_its_errors(claude: Connect) -> None:
    async with claude() as client:
        task, _ = await background(client, "sleep 30")
        text, err = await call(client, "TaskStop", task_id=task)
        assert not err and json.loads(text) == {
            "message": f"Successfully stopped task: {task} (sleep 30)",
            "task_id": task,
            "task_type": "local_bash",
            "command": "sleep 30",
        }
        assert await call(client, "TaskStop", task_id=task) == (f"Task {task} is not running (status: killed)", True)
        assert await call(client, "TaskStop", task_id="bnosuchid") == ("No task found with ID: bnosuchid", True)


async def test_the_older_names_still_answer(claude: Connect, sup: Supervisor) -> None:
    async with claude() as client:
        task, _ = await background(client, "echo one; echo skip; echo two >&2; sleep 30")
        session = newest(sup)
        await sup.wait(SCOPE, session.id, timeout=10, pattern=re.compile("two"))
        text, _ = await call(client, "BashOutput", bash_id=task, filter="o")
        assert re.fullmatch(
            r"<status>running</status>\n\n<stdout>\none\ntwo\n</stdout>\n\n<timestamp>\S+</timestamp>",
            text,
        ), text
        text, _ = await call(client, "BashOutput", bash_id=task)
        assert "<stdout>" not in text  # only what is new, and nothing is (the filtered-out line was read)
        text, err = await call(client, "KillShell", shell_id=task)
        command = "echo one; echo skip; echo two >&2; sleep 30"
        assert not err and json.loads(text)["message"] == f"Successfully stopped task: {task} ({command})"
        text, _ = await call(client, "BashOutput", bash_id=task)
        assert text.startswith("<status>killed</status>\n\n<exit_code>143</exit_code>")


async def test_a_background_end_is_told_once_at_the_top_of_the_next_result(claude: Connect, sup: Supervisor) -> None:
    async with claude() as client:
        failed, failed_path = await background(client, "sleep 0.1; exit 4", description="Fail on purpose")
        ok, ok_path = await background(client, "sleep 0.1")
        for session in sup.list(SCOPE):
            await sup.wait(SCOPE, session.id, timeout=10)
        text, _ = await call(client, "Bash", command="echo next")
        assert text == (
            f"<task-notification>\n<task-id>{failed}</task-id>\n<output-file>{failed_path}</output-file>\n"
            '<status>failed</status>\n<summary>Background command "Fail on purpose" failed with exit code 4</summary>\n'
            "</task-notification>\n"
            f"<task-notification>\n<task-id>{ok}</task-id>\n<output-file>{ok_path}</output-file>\n"
            '<status>completed</status>\n<summary>Background command "sleep 0.1" completed (exit code 0)</summary>\n'
            "</task-notification>\n\nnext"
        )
        assert await call(client, "Bash", command="echo again") == ("again", False)  # told once
        stopped, _ = await background(client, "sleep 30")
        await sup.kill(SCOPE, newest(sup).id, wait=None)  # not by the model: it is told
        text, err = await call(client, "TaskStop", task_id="bnosuchid")
        assert err and '<summary>Background command "sleep 30" was stopped</summary>' in text
        assert text.endswith("</task-notification>\n\nNo task found with ID: bnosuchid") and stopped in text
        read, _ = await background(client, "true")
        await call(client, "TaskOutput", task_id=read)  # the model saw it end: nothing to tell
        assert await call(client, "Bash", command="echo quiet") == ("quiet", False)


def test_no_structured_content_or_output_schema_on_either_stdio_path(tmp_path: Path) -> None:
    assert assert_text_only_on_both_paths(tmp_path, "claude", "Bash", {"command": "echo hi"}) == ["hi", "hi"]
