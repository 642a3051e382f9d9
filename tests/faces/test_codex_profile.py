"""The codex profile: Codex CLI's exec_command/write_stdin, result texts to the letter, over MCP
(the SDK's client in memory; a real ``procpilot mcp --profile codex`` for the stdio paths). The
cases follow Codex's own tests (codex-rs/core/tests/suite/unified_exec.rs)."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from mcp import Client
from pydantic import ValidationError

from procpilot.config import load_settings
from procpilot.engine.capture import Stream
from procpilot.engine.spawn import SpawnSpec
from procpilot.engine.supervisor import Supervisor
from procpilot.faces.codex_profile import CODEX_ENV, ExecCommandParams, WriteStdinParams, scan_for, truncate_middle
from tests.faces.profile_wire import Connect, assert_text_only_on_both_paths, call, connect, profile_supervisor

_HEAD = re.compile(r"Chunk ID: [0-9a-f]{6}\nWall time: (\d+\.\d{4}) seconds\n")


@pytest.fixture
async def sup(tmp_path: Path, workspace: Path) -> AsyncIterator[Supervisor]:
    async for supervisor in profile_supervisor(tmp_path, workspace, "codex"):
        yield supervisor


@pytest.fixture
def codex(sup: Supervisor) -> Connect:
    return connect(sup)


def parts(text: str) -> tuple[float, str]:
    """A result's wall time, and the rest of it after the chunk id and wall time lines."""
    head = _HEAD.match(text)
    assert head is not None, text
    return float(head.group(1)), text[head.end() :]


def session_id(text: str) -> int:
    found = re.search(r"^Process running with session ID (\d+)$", text, re.MULTILINE)
    assert found is not None, text
    return int(found.group(1))


async def start(client: Client, cmd: str, **args: object) -> int:
    text, _ = await call(client, "exec_command", cmd=cmd, yield_time_ms=250, **args)
    return session_id(text)


async def test_the_tools_are_codexs_and_a_result_carries_chunk_and_exit_metadata(codex: Connect) -> None:
    async with codex() as client:
        names = [tool.name for tool in (await client.list_tools()).tools]
        assert names[:2] == ["exec_command", "write_stdin"] and "exec" not in names and "process" not in names
        text, err = await call(client, "exec_command", cmd="echo hi; echo err >&2")
        assert not err
        assert parts(text)[1] == "Process exited with code 0\nOriginal token count: 2\nOutput:\nhi\nerr\n"
        text, err = await call(client, "exec_command", cmd="echo oops; exit 3")
        assert not err  # a failed command is an answer, not an error
        assert parts(text)[1] == "Process exited with code 3\nOriginal token count: 2\nOutput:\noops\n"
        text, _ = await call(client, "exec_command", cmd="echo $NO_COLOR $TERM $LC_ALL $PAGER $GIT_PAGER")
        assert parts(text)[1].endswith("Output:\n1 dumb C.UTF-8 cat cat\n")


async def test_pipes_close_stdin_and_a_tty_keeps_it_open(codex: Connect) -> None:
    async with codex() as client:
        text, _ = await call(client, "exec_command", cmd="tty; read x; echo got:$x")
        assert parts(text)[1].endswith("Output:\nnot a tty\ngot:\n")  # stdin read EOF at once
        sid = await start(client, "read x; echo got:$x", tty=True)
        text, _ = await call(client, "write_stdin", session_id=sid, chars="hi\n", yield_time_ms=5000)
        rest = parts(text)[1]
        assert rest.startswith("Process exited with code 0\n") and "got:hi" in rest
        sid = await start(client, "echo started; sleep 30")
        text, err = await call(client, "write_stdin", session_id=sid, chars="more\n")
        assert err
        assert text == (
            "write_stdin failed: stdin is closed for this session; rerun exec_command with tty=true to keep stdin open"
        )


async def test_a_call_returns_as_soon_as_the_process_exits(codex: Connect) -> None:
    async with codex() as client:
        text, _ = await call(client, "exec_command", cmd="sleep 0.2; echo done", yield_time_ms=30_000)
        wall, rest = parts(text)
        assert wall < 10 and rest == "Process exited with code 0\nOriginal token count: 2\nOutput:\ndone\n"
        sid = await start(client, "sleep 0.3; echo late")
        text, _ = await call(client, "write_stdin", session_id=sid)  # a poll: waits at least 5 s, unless it exits
        wall, rest = parts(text)
        assert wall < 5 and rest == "Process exited with code 0\nOriginal token count: 2\nOutput:\nlate\n"
        text, err = await call(client, "write_stdin", session_id=sid)
        assert err and text == f"write_stdin failed: Unknown process id {sid}"  # told once, then forgotten


async def test_a_session_takes_input_again_and_again_and_ctrl_d_ends_it(codex: Connect) -> None:
    async with codex() as client:
        sid = await start(client, 'while read line; do echo "[$line]"; done; echo bye', tty=True)
        text, _ = await call(client, "write_stdin", session_id=sid, chars="a\n")
        rest = parts(text)[1]
        assert rest.startswith(f"Process running with session ID {sid}\n") and "[a]" in rest
        text, _ = await call(client, "write_stdin", session_id=sid, chars="b\n")
        rest = parts(text)[1]
        assert "[b]" in rest and "[a]" not in rest  # only what came since the last call
        text, _ = await call(client, "write_stdin", session_id=sid, chars="\u0004", yield_time_ms=5000)
        rest = parts(text)[1]
        assert rest.startswith("Process exited with code 0\n") and rest.endswith("bye\r\n")


async def test_ctrl_c_interrupts_a_command_without_a_tty(codex: Connect) -> None:
    async with codex() as client:
        sid = await start(client, "sleep 30")
        text, err = await call(client, "write_stdin", session_id=sid, chars="\u0003", yield_time_ms=5000)
        assert not err
        assert parts(text)[1] == "Process exited with code 130\nOriginal token count: 0\nOutput:\n"


async def test_output_past_the_budget_keeps_head_and_tail_with_codexs_marker(codex: Connect) -> None:
    raw = "".join(f"{n}\n" for n in range(1, 3001)).encode()
    async with codex() as client:
        text, _ = await call(client, "exec_command", cmd="seq 1 3000", max_output_tokens=50)
    cut = -(-(len(raw) - 200) // 4)
    expected = (
        f"Process exited with code 0\nOriginal token count: {-(-len(raw) // 4)}\nOutput:\nTotal output lines: 3000\n\n"
        f"{raw[:100].decode()}…{cut} tokens truncated…{raw[-100:].decode()}"
    )
    assert parts(text)[1] == expected
    async with codex() as client:  # just past the budget: the tail reaches back into the first half
        text, _ = await call(client, "exec_command", cmd="printf '%0250d' 0", max_output_tokens=50)
    expected = "Total output lines: 1\n\n" + "0" * 100 + "…13 tokens truncated…" + "0" * 100
    assert parts(text)[1] == f"Process exited with code 0\nOriginal token count: 63\nOutput:\n{expected}"


async def test_workdir_is_relative_to_the_workspace_and_kept_inside_it(codex: Connect, workspace: Path) -> None:
    (workspace / "sub").mkdir()
    async with codex() as client:
        text, _ = await call(client, "exec_command", cmd="pwd", workdir="sub")
        assert parts(text)[1].endswith(f"Output:\n{workspace.resolve()}/sub\n")
        text, err = await call(client, "exec_command", cmd="pwd", workdir="../..")
        assert err and text.startswith("exec_command failed for `pwd`: ") and "outside the workspace" in text
        text, err = await call(client, "exec_command", cmd="true", shell="/no/such/shell")
        assert (text, err) == ("exec_command failed for `true`: command not found: /no/such/shell", True)


async def test_past_64_live_sessions_the_least_recently_used_is_pruned(codex: Connect, sup: Supervisor) -> None:
    async with codex() as client:
        used, oldest = await start(client, "cat", tty=True), await start(client, "cat", tty=True)
        rest = await asyncio.gather(*(start(client, "sleep 30") for _ in range(62)))
        await call(client, "write_stdin", session_id=used, chars="x\n")  # now the most recently used
        newest = await start(client, "sleep 30")
        text, err = await call(client, "write_stdin", session_id=oldest, chars="y\n")
        assert err and text == f"write_stdin failed: Unknown process id {oldest}"
        text, err = await call(client, "write_stdin", session_id=used, chars="z\n")
        assert not err and "z" in parts(text)[1]
        assert len({used, oldest, newest, *rest}) == 65
        assert sum(s.is_running for s in sup.list("a")) == 64  # the pruned one was ended, not left behind


def test_no_structured_content_or_output_schema_on_either_stdio_path(tmp_path: Path) -> None:
    direct, through_sdk = assert_text_only_on_both_paths(tmp_path, "codex", "exec_command", {"cmd": "echo hi"})
    for text in (direct, through_sdk):
        assert parts(text)[1] == "Process exited with code 0\nOriginal token count: 1\nOutput:\nhi\n"


# -- the module's own helpers (faces/codex_profile.py), without the MCP wire -------------------


async def test_truncate_middle_cuts_as_codex_does(tmp_path: Path) -> None:
    settings = load_settings(env={}, state_dir=tmp_path / "state", workspace_root=tmp_path)
    async with Supervisor(settings) as sup:
        s = await sup.run(SpawnSpec("seq 1 1000"), scope="a", yield_ms=None)
        size = s.output[Stream.COMBINED].size  # 3,893 bytes
        chunk = await scan_for(s, 0, size, 100)  # 100 tokens: 400 bytes
        text = truncate_middle(chunk, 100)
        head, _, rest = text.partition("…")
        cut, _, tail = rest.partition("…")
        assert head.startswith("Total output lines: 1000\n\n1\n2\n")
        assert len(head) - len("Total output lines: 1000\n\n") == 200  # half the budget
        assert cut == f"{-(-(size - 400) // 4)} tokens truncated"  # what is left out, in tokens
        assert tail.endswith("999\n1000\n") and len(tail) == 200
        whole = truncate_middle(await scan_for(s, 0, size, 10_000), 10_000)
        assert whole == "".join(f"{i}\n" for i in range(1, 1001))  # within budget: as written


def test_exec_command_params_are_codexs_and_refuse_others() -> None:
    params = ExecCommandParams(cmd="ls")
    assert (params.tty, params.login, params.yield_time_ms, params.shell) == (False, True, None, None)
    with pytest.raises(ValidationError):
        ExecCommandParams(cmd="ls", command="ls")  # type: ignore[call-arg]
    with pytest.raises(ValidationError):
        WriteStdinParams(session_id=1, max_output_tokens=-1)
    assert WriteStdinParams(session_id=7).chars == ""  # empty: only poll


def test_codex_env_turns_off_colour_and_pagers() -> None:
    assert CODEX_ENV["NO_COLOR"] == "1" and CODEX_ENV["TERM"] == "dumb"
    assert CODEX_ENV["PAGER"] == CODEX_ENV["GIT_PAGER"] == "cat"
    with pytest.raises(TypeError):
        CODEX_ENV["X"] = "1"  # type: ignore[index]  # shared by every command: never changed by one
