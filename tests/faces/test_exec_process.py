"""The exec + process tools, driven through the SDK's own MCP client (in memory, both eras)."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import re
import tracemalloc
from collections.abc import Callable
from typing import Any

import pytest
from mcp import Client

from procpilot.config import Settings
from procpilot.contract import ToolResult, ToolSpec, error_result, parse_arguments
from procpilot.engine.capture import Stream
from procpilot.engine.supervisor import Supervisor
from procpilot.errors import InvalidArgument
from procpilot.faces.all_tools import all_tools, served
from procpilot.faces.exec_process import CommandOnly, ExecParams, exec_params, exec_process_tools
from procpilot.transports.mcp import build_mcp_server

Connect = Callable[[], Client]


@pytest.fixture(params=["legacy", "auto"])
def connect(request: pytest.FixtureRequest, supervisor: Supervisor) -> Connect:
    """A client factory: the SDK's client must be entered and exited in the test's own task."""
    server = build_mcp_server(exec_process_tools(supervisor), scope="agent-a")
    return lambda: Client(server, mode=request.param)


async def call(client: Client, tool: str, **args: Any) -> tuple[str, dict[str, Any], bool]:
    result = await client.call_tool(tool, args)
    text = result.content[0].text  # type: ignore[union-attr]
    return text, result.structured_content or {}, bool(result.is_error)


async def test_tools_are_listed_with_spec_parameters(connect: Connect) -> None:
    async with connect() as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
        assert set(tools) == {"exec", "process"}
        exec_props = set(tools["exec"].input_schema["properties"])
        assert {"command", "workdir", "env", "yieldMs", "background", "timeout", "pty", "elevated"} <= exec_props
        proc_props = set(tools["process"].input_schema["properties"])
        assert {
            "action",
            "sessionId",
            "data",
            "eof",
            "keys",
            "hex",
            "literal",
            "text",
            "pattern",
            "stream",
            "offset",
            "limit",
            "timeout",
        } <= proc_props


async def test_foreground_exec_returns_output_and_status(connect: Connect) -> None:
    async with connect() as client:
        text, data, err = await call(client, "exec", command="echo hi; echo there >&2")
        assert not err
        assert data["status"] == "done" and data["exitCode"] == 0
        assert data["output"] == "hi\nthere\n" or data["output"].startswith("hi\nthere")
        assert "hi" in text and data["sessionId"] and data["pid"]
        assert isinstance(data["durationMs"], int) and data["cwd"]


async def test_failed_command_is_a_result_not_an_error(connect: Connect) -> None:
    async with connect() as client:
        _, data, err = await call(client, "exec", command="echo no >&2; exit 4")
        assert not err and data["status"] == "error" and data["exitCode"] == 4


async def test_yield_then_poll_and_wait(connect: Connect) -> None:
    async with connect() as client:
        _, data, _ = await call(client, "exec", command="echo one; sleep 0.4; echo two", yieldMs=50)
        assert data["status"] == "running"
        sid = data["sessionId"]
        _, waited, _ = await call(client, "process", action="wait", sessionId=sid, timeout=10_000)
        assert waited["reason"] == "exited" and waited["status"] == "done"
        _, polled, _ = await call(client, "process", action="poll", sessionId=sid)
        assert polled["output"] == "one\ntwo\n"
        _, again, _ = await call(client, "process", action="poll", sessionId=sid)
        assert again["output"] == ""
        _, log, _ = await call(client, "process", action="log", sessionId=sid)
        assert log["output"] == "one\ntwo" and log["totalLines"] == 2


async def test_poll_is_incremental_and_never_destroys_output(connect: Connect) -> None:
    async with connect() as client:
        _, data, _ = await call(
            client, "exec", command="for i in $(seq 1 400); do echo line$i; done; sleep 5", background=True
        )
        sid = data["sessionId"]
        await call(client, "process", action="wait", sessionId=sid, pattern="line400", timeout=10_000)
        _, polled, _ = await call(client, "process", action="poll", sessionId=sid)
        assert polled["cutChars"] > 0 and polled["output"].endswith("line400\n")
        assert len(polled["output"]) <= 500
        _, log, _ = await call(client, "process", action="log", sessionId=sid, offset=0, limit=3)
        assert log["output"] == "line1\nline2\nline3" and log["totalLines"] == 400
        _, empty, _ = await call(client, "process", action="poll", sessionId=sid)
        assert empty["output"] == "" and empty["retryInMs"] >= 1000
        await call(client, "process", action="remove", sessionId=sid)


async def test_results_name_the_log_file_past_10_kb(connect: Connect) -> None:
    async with connect() as client:
        _, small, _ = await call(client, "exec", command="echo small")
        assert "logPath" not in small
        text, big, _ = await call(client, "exec", command="head -c 20000 /dev/zero | tr '\\0' x")
        assert big["outputCutChars"] == 0 and big["logPath"] in text  # all shown, and where it lives
        with open(big["logPath"], "rb") as f:
            assert f.read() == b"x" * 20000  # an agent's file tools read the same bytes
        _, data, _ = await call(client, "exec", command="head -c 20000 /dev/zero | tr '\\0' y; sleep 30", yieldMs=10)
        sid = data["sessionId"]
        await call(client, "process", action="wait", sessionId=sid, pattern="y{20000}", timeout=10_000)
        text, polled, _ = await call(client, "process", action="poll", sessionId=sid)
        assert polled["cutChars"] > 0 and polled["logPath"] in text
        await call(client, "process", action="remove", sessionId=sid)


async def test_log_paging_rules(connect: Connect) -> None:
    async with connect() as client:
        _, data, _ = await call(client, "exec", command="seq 1 300")
        sid = data["sessionId"]
        _, default, _ = await call(client, "process", action="log", sessionId=sid)
        assert default["offset"] == 100 and default["lines"] == 200
        _, last, _ = await call(client, "process", action="log", sessionId=sid, limit=2)
        assert last["output"] == "299\n300"
        _, tail_from, _ = await call(client, "process", action="log", sessionId=sid, offset=297)
        assert tail_from["output"] == "298\n299\n300"
        _, window, _ = await call(client, "process", action="log", sessionId=sid, offset=10, limit=2)
        assert window["output"] == "11\n12"


async def test_write_and_eof(connect: Connect) -> None:
    async with connect() as client:
        _, data, _ = await call(client, "exec", command="cat", background=True)
        sid = data["sessionId"]
        await call(client, "process", action="write", sessionId=sid, data="ping\n", eof=True)
        _, waited, _ = await call(client, "process", action="wait", sessionId=sid, timeout=10_000)
        assert waited["status"] == "done"
        _, log, _ = await call(client, "process", action="log", sessionId=sid)
        assert log["output"] == "ping"


async def test_pty_send_keys(connect: Connect) -> None:
    async with connect() as client:
        _, data, _ = await call(client, "exec", command='read a; echo "got:$a"', pty=True, background=True)
        sid = data["sessionId"]
        await call(client, "process", action="send-keys", sessionId=sid, keys=["a", "b", "c", "BSpace", "Enter"])
        _, waited, _ = await call(client, "process", action="wait", sessionId=sid, timeout=10_000)
        assert waited["status"] == "done"
        _, log, _ = await call(client, "process", action="log", sessionId=sid)
        assert "got:ab" in log["output"]


async def test_send_keys_types_text_before_pressing_keys(tools: Tools) -> None:
    started = await tools["exec"].call({"command": 'read a; echo "got:$a"', "pty": True, "background": True}, "a")
    sid = started.data["sessionId"]
    sent = {"action": "send-keys", "sessionId": sid, "literal": "abc", "keys": ["Enter"]}
    await tools["process"].call(sent, "a")
    await tools["process"].call({"action": "wait", "sessionId": sid, "timeout": 10_000}, "a")
    log = await tools["process"].call({"action": "log", "sessionId": sid}, "a")
    assert "got:abc" in log.data["output"]  # Enter after the text, not before it


async def test_cursor_keys_follow_the_programs_cursor_key_mode(tools: Tools) -> None:
    # The program switches to application cursor mode (as vim and less do): Up must be ESC O A.
    script = "printf '\\033[?1hready\\n'; read -r line; printf '%s' \"$line\" | od -An -tx1"
    started = await tools["exec"].call({"command": script, "pty": True, "background": True}, "a")
    sid = started.data["sessionId"]
    await tools["process"].call({"action": "wait", "sessionId": sid, "pattern": "ready", "timeout": 10_000}, "a")
    await tools["process"].call({"action": "send-keys", "sessionId": sid, "keys": ["Up", "Enter"]}, "a")
    await tools["process"].call({"action": "wait", "sessionId": sid, "timeout": 10_000}, "a")
    log = await tools["process"].call({"action": "log", "sessionId": sid}, "a")
    assert "1b 4f 41" in log.data["output"]  # ESC O A, not ESC [ A


async def test_kill_reports_killed(connect: Connect) -> None:
    async with connect() as client:
        _, data, _ = await call(client, "exec", command="sleep 30", background=True)
        _, killed, _ = await call(client, "process", action="kill", sessionId=data["sessionId"])
        assert killed["status"] == "killed"


async def test_timeout_is_error_with_partial_output(connect: Connect) -> None:
    async with connect() as client:
        _, data, _ = await call(client, "exec", command="echo partial; sleep 30", timeout=1, yieldMs=5000)
        assert data["status"] == "error" and data["state"] == "timed_out"
        assert "partial" in data["output"]


async def test_list_shows_sessions_newest_first_with_names(connect: Connect) -> None:
    async with connect() as client:
        await call(client, "exec", command="echo first", background=True)
        await call(client, "exec", command="sleep 0.1 && echo second", background=True)
        _, listing, _ = await call(client, "process", action="list")
        names = [s["name"] for s in listing["sessions"]]
        assert names[0].startswith("sleep") and names[1].startswith("echo")


async def test_spec004_only_backgrounded_sessions_are_listed(connect: Connect) -> None:
    """Spec 004: "Only backgrounded sessions are listed": a run that ended in the foreground is
    not (its result held all of it), one that moved to the background is."""
    async with connect() as client:
        _, foreground, _ = await call(client, "exec", command="echo here")
        _, background, _ = await call(client, "exec", command="sleep 0.3; echo later", yieldMs=10)
        _, listing, _ = await call(client, "process", action="list")
        assert [s["sessionId"] for s in listing["sessions"]] == [background["sessionId"]]
        assert listing["total"] == 1
        _, logged, _ = await call(client, "process", action="log", sessionId=foreground["sessionId"])
        assert logged["output"] == "here"


@pytest.mark.parametrize(
    ("args", "code"),
    [
        ({"action": "explode", "sessionId": "x"}, "InvalidArgument"),
        ({"action": "poll"}, "InvalidArgument"),
        ({"action": "poll", "sessionId": "nope"}, "SessionNotFound"),
        ({"action": "log", "sessionId": "SID", "offset": -1}, "InvalidArgument"),
        ({"action": "wait", "sessionId": "SID", "pattern": "(unclosed"}, "InvalidPattern"),
        ({"action": "clear", "sessionId": "SID"}, "SessionStillRunning"),
        ({"action": "poll", "sessionId": "SID", "timout": 5}, "InvalidArgument"),  # a misspelt name
    ],
)
async def test_bad_input_gets_typed_errors(connect: Connect, args: dict[str, Any], code: str) -> None:
    async with connect() as client:
        _, data, _ = await call(client, "exec", command="sleep 10", background=True)
        args = {k: (data["sessionId"] if v == "SID" else v) for k, v in args.items()}
        text, err_data, is_error = await call(client, "process", **args)
        assert is_error
        assert err_data["error"] == code
        assert text.startswith(code) and "What to do next" in text
        await call(client, "process", action="remove", sessionId=data["sessionId"])


async def test_a_catastrophic_pattern_is_a_typed_error_not_a_stalled_server(connect: Connect) -> None:
    async with connect() as client:
        _, data, _ = await call(client, "exec", command="printf '%060d' 0 | tr 0 a; echo b; sleep 30", yieldMs=10)
        sid = data["sessionId"]
        await call(client, "process", action="wait", sessionId=sid, pattern="b", timeout=10_000)
        text, err, is_error = await call(
            client, "process", action="wait", sessionId=sid, pattern="(a|aa)+$", offset=0, timeout=10_000
        )
        assert is_error and err["error"] == "InvalidPattern" and "backtracking" in text
        _, listed, is_error = await call(client, "process", action="list")  # the server still answers
        assert not is_error and listed["sessions"][0]["sessionId"] == sid
        await call(client, "process", action="remove", sessionId=sid)


async def test_a_misspelt_argument_is_refused_not_silently_dropped(connect: Connect) -> None:
    async with connect() as client:
        text, data, is_error = await call(client, "exec", command="echo hi", timout=1)
        assert is_error and data["error"] == "InvalidArgument" and "timout" in text


async def test_missing_command_and_elevated_are_typed_errors(connect: Connect) -> None:
    async with connect() as client:
        text, data, is_error = await call(client, "exec", command="no-such-binary-qq arg")
        assert is_error and data["error"] == "CommandNotFound" and "which" in text
        _, data, is_error = await call(client, "exec", command="true", elevated=True)
        assert is_error and data["error"] == "NotSupported"


async def test_scope_isolation_across_servers(supervisor: Supervisor) -> None:
    a = build_mcp_server(exec_process_tools(supervisor), scope="agent-a")
    b = build_mcp_server(exec_process_tools(supervisor), scope="agent-b")
    async with Client(a) as ca, Client(b) as cb:
        _, data, _ = await call(ca, "exec", command="sleep 10", background=True)
        sid = data["sessionId"]
        for action in ("poll", "log", "kill", "write", "remove"):
            _, err, is_error = await call(cb, "process", action=action, sessionId=sid, data="x")
            assert is_error and err["error"] == "SessionNotFound", action
        _, listing, _ = await call(cb, "process", action="list")
        assert listing["sessions"] == []
        await call(ca, "process", action="remove", sessionId=sid)


async def test_process_tool_disabled_makes_exec_synchronous(settings: Settings) -> None:
    tools = settings.tools.model_copy(update={"process": settings.process.model_copy(update={"enabled": False})})
    sync_settings = settings.model_copy(update={"tools": tools})
    async with Supervisor(sync_settings) as sup:
        server = build_mcp_server(exec_process_tools(sup), scope="a")
        async with Client(server) as c:
            _, data, _ = await call(c, "exec", command="sleep 0.2; echo late", yieldMs=10, background=True)
            assert data["status"] == "done" and data["output"] == "late\n"


async def test_ansi_and_progress_redraws_are_cleaned_for_the_model(connect: Connect) -> None:
    async with connect() as client:
        _, data, _ = await call(client, "exec", command=r"printf '\033[31mred\033[0m\n10%%\r50%%\r100%%\n'")
        assert data["output"] == "red\n100%\n"


async def test_wait_for_pattern_keeps_session_running(connect: Connect) -> None:
    async with connect() as client:
        script = "echo booting; sleep 0.2; echo READY; sleep 10"
        _, data, _ = await call(client, "exec", command=script, background=True)
        sid = data["sessionId"]
        _, waited, _ = await call(client, "process", action="wait", sessionId=sid, pattern="READY", timeout=10_000)
        assert waited["reason"] == "pattern" and waited["status"] == "running" and waited["match"] == "READY"
        _, timed, _ = await call(client, "process", action="wait", sessionId=sid, timeout=50)
        assert timed["reason"] == "timeout"
        await call(client, "process", action="remove", sessionId=sid)
        await asyncio.sleep(0)
        assert re.fullmatch(r"[a-z0-9]{16}", sid)


async def test_polling_a_finished_session_returns_all_that_was_unread(connect: Connect) -> None:
    async with connect() as client:
        _, data, _ = await call(client, "exec", command="sleep 0.2; seq 1 2000", yieldMs=10)
        sid = data["sessionId"]
        await call(client, "process", action="wait", sessionId=sid, timeout=10_000)
        _, polled, _ = await call(client, "process", action="poll", sessionId=sid)
        assert polled["cutChars"] == 0
        assert polled["output"].startswith("1\n2\n3\n")
        assert polled["output"].endswith("1999\n2000\n")


Tools = dict[str, ToolSpec]


@pytest.fixture
def tools(supervisor: Supervisor) -> Tools:
    """The face's tools called directly: some inputs (lone surrogates) cannot cross a JSON client."""
    return {spec.name: spec for spec in exec_process_tools(supervisor)}


def session_dirs(supervisor: Supervisor) -> set[str]:
    root = supervisor.settings.state_dir / "sessions"
    return {p.name for p in root.iterdir()} if root.exists() else set()


@pytest.mark.parametrize(
    ("tool", "args", "field"),
    [
        ("exec", {"command": "echo a\0b"}, "command"),
        ("exec", {"command": "true", "workdir": "a\0b"}, "workdir"),
        ("exec", {"command": "true", "env": {"K": "a\0b"}}, "env"),
        ("exec", {"command": "true", "env": {"K": "\ud800"}}, "env"),
        ("exec", {"command": "true", "env": {"K\0": "v"}}, "env"),
        ("exec", {"command": "true", "env": {"K\ud800": "v"}}, "env"),
        ("process", {"action": "write", "sessionId": "SID", "data": "\ud800"}, "data"),
        ("process", {"action": "paste", "sessionId": "SID", "text": "\ud800"}, "text"),
        ("process", {"action": "submit", "sessionId": "SID", "text": "\ud800"}, "text"),
        ("process", {"action": "send-keys", "sessionId": "SID", "literal": "\ud800"}, "literal"),
        ("process", {"action": "send-keys", "sessionId": "SID", "keys": ["\ud800"]}, "keys"),
    ],
)
async def test_nul_and_lone_surrogates_are_invalid_arguments_naming_the_field(
    tools: Tools, supervisor: Supervisor, tool: str, args: dict[str, Any], field: str
) -> None:
    cat = await tools["exec"].call({"command": "cat", "background": True}, "a")
    sid = cat.data["sessionId"]
    before = session_dirs(supervisor)
    args = {k: (sid if v == "SID" else v) for k, v in args.items()}
    result = await tools[tool].call(args, "a")
    assert result.is_error and result.data["error"] == "InvalidArgument", result.text
    assert result.data["field"] == field
    assert session_dirs(supervisor) == before  # a refused spawn leaves no session directory behind
    await tools["process"].call({"action": "remove", "sessionId": sid}, "a")


async def test_an_unexpected_exception_is_an_internal_error_result(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def broken(arguments: Any, scope: str) -> ToolResult:
        raise KeyError("secret-internal-detail")

    spec = ToolSpec("broken", "", ExecParams, broken)
    with caplog.at_level(logging.ERROR):
        result = await spec.call({}, "a")
    assert result.is_error and result.data["error"] == "InternalError"
    assert "Traceback" not in result.text and "secret-internal-detail" not in result.text
    assert result.data["hints"]
    assert any(r.exc_info for r in caplog.records)  # the traceback goes to the server log only


async def test_write_to_a_child_that_never_reads_returns_by_its_deadline_saying_what_was_not_sent(
    tools: Tools,
) -> None:
    started = await tools["exec"].call({"command": "sleep 30", "background": True}, "a")
    sid = started.data["sessionId"]
    payload = "x" * (4 << 20)  # more than any pipe buffer holds
    t0 = asyncio.get_running_loop().time()
    result = await asyncio.wait_for(
        tools["process"].call({"action": "write", "sessionId": sid, "data": payload, "eof": True, "timeout": 300}, "a"),
        timeout=10,
    )
    assert asyncio.get_running_loop().time() - t0 < 5
    assert not result.is_error
    written = result.data["bytesWritten"]
    assert 0 < written < len(payload) and result.data["bytesNotWritten"] == len(payload) - written
    assert f"only {written} of {len(payload)}" in result.text and "NOT sent" in result.text
    assert result.data["stdinClosed"] is False  # eof not applied: it would cut off the unsent part
    # A second write queues behind nothing: the pipe is still full, so it too ends by its deadline.
    again = await asyncio.wait_for(
        tools["process"].call({"action": "write", "sessionId": sid, "data": "y", "timeout": 100}, "a"), timeout=10
    )
    assert again.data["bytesWritten"] == 0
    await tools["process"].call({"action": "remove", "sessionId": sid}, "a")


@pytest.mark.parametrize("enables", [False, True])
async def test_paste_is_bracketed_only_when_the_program_enabled_bracketed_paste(tools: Tools, enables: bool) -> None:
    # The mode sequence is printed in two writes, so the tracker must see it across reads.
    prelude = r"printf '\033[?20'; sleep 0.1; printf '04h'; " if enables else ""
    command = prelude + r"echo ready; IFS= read -r a; printf '%s' \"$a\" | od -An -tx1 | tr -d ' \n'; echo"
    started = await tools["exec"].call({"command": command, "pty": True, "background": True}, "a")
    sid = started.data["sessionId"]
    await tools["process"].call({"action": "wait", "sessionId": sid, "pattern": "ready", "timeout": 10_000}, "a")
    await tools["process"].call({"action": "paste", "sessionId": sid, "text": "hi"}, "a")
    await tools["process"].call({"action": "submit", "sessionId": sid, "text": ""}, "a")
    await tools["process"].call({"action": "wait", "sessionId": sid, "timeout": 10_000}, "a")
    log = (await tools["process"].call({"action": "log", "sessionId": sid}, "a")).data["output"]
    bracketed = "1b5b3230307e68691b5b3230317e"  # ESC[200~ hi ESC[201~
    assert (bracketed in log) is enables, log
    if not enables:
        assert "6869" in log.splitlines()[-1] and "200~" not in log


async def test_with_the_process_tool_disabled_stdin_is_empty_and_process_is_not_offered(settings: Settings) -> None:
    tools = settings.tools.model_copy(update={"process": settings.process.model_copy(update={"enabled": False})})
    sync_settings = settings.model_copy(update={"tools": tools})
    async with Supervisor(sync_settings) as sup:
        specs = {spec.name: spec for spec in exec_process_tools(sup)}
        assert set(specs) == {"exec"}  # nothing to come back with: the tool is not advertised
        t0 = asyncio.get_running_loop().time()
        result = await specs["exec"].call({"command": "read x; echo got=$x; echo end", "timeout": 5}, "a")
        assert asyncio.get_running_loop().time() - t0 < 4  # read saw EOF at once, no hang until the timeout
        assert result.data["state"] == "exited_ok" and result.data["output"] == "got=\nend\n"


async def test_a_timeout_while_waiting_for_input_says_so(tools: Tools) -> None:
    result = await tools["exec"].call({"command": "echo asking; read x", "timeout": 1, "yieldMs": 10_000}, "a")
    assert result.data["state"] == "timed_out"
    assert "it was waiting for input on stdin" in result.text
    assert result.data["timedOutWaitingForInput"] is True
    plain = await tools["exec"].call({"command": "sleep 5", "timeout": 1, "yieldMs": 10_000}, "a")
    assert plain.data["state"] == "timed_out" and "waiting for input" not in plain.text


@pytest.mark.parametrize("notifies", [None, False, True])
async def test_exec_promises_an_exit_notification_only_when_one_will_come(
    supervisor: Supervisor, notifies: bool | None
) -> None:
    (exec_tool, _) = exec_process_tools(supervisor, notifies_exit=notifies)
    result = await exec_tool.call({"command": "sleep 5", "background": True}, "a")
    # None decides by whether anything listens for exits: nothing does here (a stdio server).
    assert ("you will be notified when it exits" in result.text) is bool(notifies)
    if not notifies:
        assert "not announced" in result.text
    remove = supervisor.on_exit(lambda info: None)  # what the HTTP daemon does at start-up
    auto = await exec_tool.call({"command": "sleep 5", "background": True}, "a")
    assert ("you will be notified" in auto.text) is (notifies is not False)
    quiet = await exec_tool.call({"command": "sleep 5", "background": True, "notifyOnExit": False}, "a")
    assert "you will be notified" not in quiet.text
    remove()
    for sid in (result.data["sessionId"], auto.data["sessionId"], quiet.data["sessionId"]):
        await supervisor.remove("a", sid)


async def test_log_of_an_empty_slice_reports_zero_lines_and_says_why(tools: Tools) -> None:
    seq = await tools["exec"].call({"command": "seq 1 3"}, "a")
    silent = await tools["exec"].call({"command": "true"}, "a")

    async def log(sid: str, **args: Any) -> ToolResult:
        return await tools["process"].call({"action": "log", "sessionId": sid, **args}, "a")

    past = await log(seq.data["sessionId"], offset=10)
    assert past.data["lines"] == 0 and past.data["output"] == ""
    assert "past the end" in past.text and "3 lines" in past.text
    assert (await log(seq.data["sessionId"], limit=0)).data["lines"] == 0
    assert (await log(silent.data["sessionId"])).data["lines"] == 0


async def test_log_of_the_newest_lines_keeps_their_end(tools: Tools) -> None:
    # The newest text is what an agent asks for with `limit` alone: a 1 MB line must not push
    # the last line out of the result.
    done = await tools["exec"].call({"command": "head -c 1000000 /dev/zero | tr '\\0' x; echo; echo END"}, "a")
    sid = done.data["sessionId"]

    async def log(**args: Any) -> ToolResult:
        return await tools["process"].call({"action": "log", "sessionId": sid, **args}, "a")

    newest = await log(limit=2)
    assert newest.data["output"].endswith("x\nEND") and "characters cut here" in newest.text
    assert (await log()).data["output"].endswith("END")
    oldest = await log(offset=0, limit=2)  # a range too long for one result keeps both its ends
    assert oldest.data["output"].startswith("xxx") and oldest.data["output"].endswith("END")
    assert "characters cut here" in oldest.text and oldest.data["next"].startswith(f"process log sessionId={sid}")


BIG = 40_000_000  # bytes of output: the reads below must cost a small fraction of it


def peak_bytes_during(coro: Any) -> Any:
    async def run() -> tuple[Any, int]:
        tracemalloc.start()
        try:
            result = await coro
            return result, tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    return run()


async def test_reads_after_a_huge_burst_are_memory_bounded(tools: Tools, supervisor: Supervisor) -> None:
    command = f"head -c {BIG} /dev/zero | tr '\\0' x | fold -w 100; echo END; sleep 30"
    started = await tools["exec"].call({"command": command, "background": True}, "a")
    sid = started.data["sessionId"]
    session = supervisor.get("a", sid)
    view = session.output[Stream.COMBINED]
    for _ in range(600):
        if view.size >= BIG * 101 // 100:
            break
        await asyncio.sleep(0.05)

    async def process(**args: Any) -> ToolResult:
        return await tools["process"].call({"sessionId": sid, **args}, "a")

    poll, peak = await peak_bytes_during(process(action="poll"))
    assert peak < BIG // 5, f"poll allocated {peak} bytes"
    assert poll.data["output"].endswith("END\n") and poll.data["cutChars"] >= BIG
    assert (await process(action="poll", timeout=10)).data["output"] == ""  # the cursor went to the end
    log, peak = await peak_bytes_during(process(action="log", offset=0))
    assert peak < BIG // 5, f"log allocated {peak} bytes"
    assert log.data["output"].startswith("x" * 100 + "\n") and len(log.data["output"]) <= 200_000
    wait, peak = await peak_bytes_during(process(action="wait", pattern="NEVER", timeout=200))
    assert peak < BIG // 5, f"wait allocated {peak} bytes"
    assert wait.data["reason"] == "timeout"
    found = await process(action="wait", pattern="END", timeout=10_000)
    assert found.data["reason"] == "pattern"
    await process(action="remove")


async def test_a_finished_exec_with_huge_output_reads_only_its_tail(tools: Tools) -> None:
    command = f"head -c {BIG} /dev/zero | tr '\\0' x | fold -w 100; echo END"
    result, peak = await peak_bytes_during(tools["exec"].call({"command": command, "yieldMs": 60_000}, "a"))
    assert result.data["status"] == "done"
    assert peak < BIG // 5, f"exec allocated {peak} bytes"
    assert result.data["output"].endswith("xEND\n") and result.data["outputCutChars"] >= BIG - 200_000


async def test_a_repeated_pattern_wait_waits_for_new_output(tools: Tools) -> None:
    command = "echo READY 1; sleep 0.5; echo READY 2; sleep 30"
    started = await tools["exec"].call({"command": command, "background": True}, "a")
    sid = started.data["sessionId"]

    async def wait(**args: Any) -> ToolResult:
        return await tools["process"].call({"action": "wait", "sessionId": sid, "pattern": r"READY \d", **args}, "a")

    assert (await wait(timeout=10_000)).data["match"] == "READY 1"
    second = await wait(timeout=10_000)
    assert second.data["reason"] == "pattern" and second.data["match"] == "READY 2"
    assert (await wait(timeout=200)).data["reason"] == "timeout"  # nothing new since
    assert (await wait(timeout=200, offset=0)).data["match"] == "READY 1"  # an explicit offset rescans
    await tools["process"].call({"action": "remove", "sessionId": sid}, "a")


async def test_poll_with_limit_zero_shows_nothing_and_per_session_state_is_pruned(
    tools: Tools, supervisor: Supervisor
) -> None:
    started = await tools["exec"].call({"command": "echo hello; sleep 30", "background": True}, "a")
    sid = started.data["sessionId"]
    await tools["process"].call({"action": "wait", "sessionId": sid, "pattern": "hello", "timeout": 10_000}, "a")
    zero = await tools["process"].call({"action": "poll", "sessionId": sid, "limit": 0}, "a")
    assert zero.data["output"] == "" and zero.data["cutChars"] == len("hello\n")
    assert "hello" not in zero.text
    await tools["process"].call({"action": "poll", "sessionId": sid}, "a")  # empty: counted for backoff
    face = tools["process"].handler.__self__  # type: ignore[attr-defined]
    assert sid in face._empty_polls
    await tools["process"].call({"action": "remove", "sessionId": sid}, "a")
    assert sid not in face._empty_polls and sid not in face._wait_cursors


@pytest.mark.parametrize(
    ("args", "code"),
    [
        ({"workdir": "/etc"}, "PathOutOfScope"),
        ({"workdir": "../../.."}, "PathOutOfScope"),
        ({"workdir": "out"}, "PathOutOfScope"),  # a symlink leading out of the workspace
        ({"env": {"LD_PRELOAD": "/tmp/x.so"}}, "ProtectedVariable"),
        ({"env": {"PATH": "/tmp"}}, "ProtectedVariable"),
    ],
)
async def test_exec_keeps_to_the_workspace_and_protected_variables(
    tools: Tools, supervisor: Supervisor, args: dict[str, Any], code: str
) -> None:
    (supervisor.settings.workspace_root / "out").symlink_to("/etc")
    result = await tools["exec"].call({"command": "pwd", **args}, "a")
    assert result.is_error and result.data["error"] == code, result.text


async def test_exec_resolves_a_relative_workdir_against_the_workspace(tools: Tools, supervisor: Supervisor) -> None:
    root = supervisor.settings.workspace_root.resolve()
    (root / "sub").mkdir()
    result = await tools["exec"].call({"command": "pwd", "workdir": "sub"}, "a")
    assert result.data["output"] == f"{root / 'sub'}\n"


async def test_spec001_timeout_default_1800s_bounds_background_runs(tools: Tools, supervisor: Supervisor) -> None:
    """Specs 001/002/004: ``timeout`` defaults to 1800 s, for ``background: true`` too (timeout 0
    lets a dev server run on); the openclaw profile too, as OpenClaw's own exec now has it."""
    background = await tools["exec"].call({"command": "sleep 30", "background": True}, "a")
    unbounded = await tools["exec"].call({"command": "sleep 30", "background": True, "timeout": 0}, "a")
    foreground = await tools["exec"].call({"command": "sleep 0.1", "yieldMs": 10, "timeout": 0.05}, "a")
    assert supervisor.get("a", background.data["sessionId"]).spec.timeout == 1800
    assert supervisor.get("a", unbounded.data["sessionId"]).spec.timeout is None
    assert supervisor.get("a", foreground.data["sessionId"]).spec.timeout == 0.05  # fractions are seconds
    for started in (background, unbounded):
        await tools["process"].call({"action": "kill", "sessionId": started.data["sessionId"]}, "a")
    tools_settings = supervisor.settings.tools.model_copy(
        update={"exec": supervisor.settings.exec.model_copy(update={"profile": "openclaw"})}
    )
    async with Supervisor(supervisor.settings.model_copy(update={"tools": tools_settings})) as openclaw:
        oc_tools = {spec.name: spec for spec in exec_process_tools(openclaw)}
        started = await oc_tools["exec"].call({"command": "sleep 30", "background": True}, "a")
        assert openclaw.get("a", started.data["sessionId"]).spec.timeout == 1800
        await oc_tools["process"].call({"action": "kill", "sessionId": started.data["sessionId"]}, "a")


async def test_list_says_which_sessions_wait_for_input(tools: Tools) -> None:
    asking = await tools["exec"].call({"command": "echo name?; read x", "background": True}, "a")
    sleeping = await tools["exec"].call({"command": "sleep 30", "background": True}, "a")
    ask_id, sleep_id = asking.data["sessionId"], sleeping.data["sessionId"]
    await tools["process"].call({"action": "wait", "sessionId": ask_id, "pattern": "name", "timeout": 10_000}, "a")
    for _ in range(100):  # until the shell reaches its read(2)
        rows = {r["sessionId"]: r for r in (await tools["process"].call({"action": "list"}, "a")).data["sessions"]}
        if rows[ask_id].get("waitingForInput"):
            break
        await asyncio.sleep(0.05)
    assert rows[ask_id]["waitingForInput"] is True
    assert rows[sleep_id]["waitingForInput"] is False
    # answered, it ends
    await tools["process"].call({"action": "write", "sessionId": ask_id, "data": "bob\n", "eof": True}, "a")
    await tools["process"].call({"action": "wait", "sessionId": ask_id, "timeout": 10_000}, "a")
    for sid in (ask_id, sleep_id):
        await tools["process"].call({"action": "remove", "sessionId": sid}, "a")


def _results_of_2000_chars(settings: Settings) -> Settings:
    exec_ = settings.exec.model_copy(update={"result_max_chars": 2000})
    return settings.model_copy(update={"tools": settings.tools.model_copy(update={"exec": exec_})})


async def _six_long_sessions(tools: dict[str, Any]) -> list[Any]:
    """Six running sessions, oldest first, each listed with a command of 300+ characters."""
    command = "sleep 30 # {} " + "x" * 300
    return [(await tools["exec"].call({"command": command.format(n), "background": True}, "a")).data for n in range(6)]


async def test_list_keeps_within_the_result_budget(settings: Settings) -> None:
    # A result is read whole: a list of many sessions (or of long commands) keeps the newest.
    async with Supervisor(_results_of_2000_chars(settings)) as sup:
        tools = {spec.name: spec for spec in exec_process_tools(sup)}
        started = await _six_long_sessions(tools)
        listed = await tools["process"].call({"action": "list"}, "a")
        shown = [row["sessionId"] for row in listed.data["sessions"]]
        assert shown == [s["sessionId"] for s in reversed(started)][: len(shown)] and 1 <= len(shown) < 6
        assert listed.data["total"] == 6 and listed.data["omitted"] == 6 - len(shown)
        assert f"[{6 - len(shown)} older sessions not listed" in listed.text


async def test_list_pages_past_the_budget_with_an_offset(settings: Settings) -> None:
    """Issue 23: a list cut to its result budget said "N older sessions not listed" and no call
    could list them: offset pages on, and the result names the call for the next page."""
    async with Supervisor(_results_of_2000_chars(settings)) as sup:
        tools = {spec.name: spec for spec in exec_process_tools(sup)}
        started = await _six_long_sessions(tools)
        seen: list[str] = []
        arguments: dict[str, Any] = {"action": "list"}
        for _ in range(6):
            listed = await tools["process"].call(arguments, "a")
            assert not listed.is_error and listed.data["total"] == 6
            seen += [row["sessionId"] for row in listed.data["sessions"]]
            if "next" not in listed.data:
                break
            call = listed.data["next"]
            assert call == f"process list offset={len(seen)}" and call in listed.text
            arguments = {"action": "list", "offset": len(seen)}
        assert seen == [s["sessionId"] for s in reversed(started)]  # each once, newest first, all reached
        past = await tools["process"].call({"action": "list", "offset": 6}, "a")
        assert past.data["sessions"] == [] and past.text.startswith("No sessions past offset 6 (6 in all).")
        refused = await tools["process"].call({"action": "list", "offset": -1}, "a")
        assert refused.is_error and refused.data["error"] == "InvalidArgument" and "offset" in refused.text


async def test_a_list_row_clips_a_long_command_and_poll_shows_it_whole(supervisor: Supervisor) -> None:
    # A list is for finding sessions: one 100 KB command must not take the result's budget from
    # every other session (nor a test's cleanup from the sessions it could not see).
    tools = {spec.name: spec for spec in exec_process_tools(supervisor)}
    command = "sleep 30 # " + "x" * 100_000
    started = (await tools["exec"].call({"command": command, "background": True}, "a")).data
    others = [(await tools["exec"].call({"command": "sleep 30", "background": True}, "a")).data for _ in range(3)]
    listed = await tools["process"].call({"action": "list"}, "a")
    rows = {row["sessionId"]: row for row in listed.data["sessions"]}
    assert set(rows) == {started["sessionId"], *(o["sessionId"] for o in others)} and "omitted" not in listed.data
    assert rows[started["sessionId"]]["command"].endswith("…[99,811 more chars]")
    polled = await tools["process"].call({"action": "poll", "sessionId": started["sessionId"]}, "a")
    assert polled.data["command"] == command
    for sid in rows:
        await tools["process"].call({"action": "remove", "sessionId": sid}, "a")


def _with_exec(settings: Settings, **exec_keys: Any) -> Settings:
    tools = settings.tools.model_copy(update={"exec": settings.exec.model_copy(update=exec_keys)})
    return settings.model_copy(update={"tools": tools})


async def test_spec001_yieldms_null_stays_in_foreground(settings: Settings) -> None:
    """Spec 001: ``yieldMs`` "(null = stay foreground)": the call waits for the end, past the
    default yield, where an omitted yieldMs backgrounds at it."""
    async with Supervisor(_with_exec(settings, background_ms=50)) as sup:
        tools = {spec.name: spec for spec in exec_process_tools(sup)}
        held = await tools["exec"].handler({"command": "sleep 0.4; echo late", "yieldMs": None}, "a")
        assert held.data["status"] == "done" and held.data["output"] == "late\n"
        moved = await tools["exec"].handler({"command": "sleep 0.4; echo late"}, "a")
        assert moved.data["status"] == "running"
        await tools["process"].handler({"action": "remove", "sessionId": moved.data["sessionId"]}, "a")


_IGNORES_TERM = "trap '' TERM; echo up; sleep 30"


async def test_spec001_timeout_sigkill_finalized_1s_later(tools: Tools) -> None:
    """Spec 001, "Timeout Enforcement": SIGKILL when the timeout expires, finalized 1 s later. A
    tree that ignores SIGTERM is gone within the 1 s grace of the SIGTERM sent first, and the
    text names the signals (it once overran a 2 s timeout by 5 s and said "after 6002 ms")."""
    result = await tools["exec"].handler({"command": _IGNORES_TERM, "timeout": 0.5, "yieldMs": None}, "a")
    assert result.data["state"] == "timed_out" and result.data["exitSignal"] == "SIGKILL"
    assert result.data["durationMs"] < 0.5 * 1000 + 1000 + 700
    assert "timed out at the 0.5 s limit; the process tree was ended (SIGTERM sent at" in result.text
    assert re.search(r"SIGTERM sent at \d+ ms, then SIGKILL sent at \d+ ms", result.text), result.text


async def test_spec001_kill_sends_sigkill(tools: Tools) -> None:
    """Spec 001: ``kill`` "Send SIGKILL to process": a tree that ignores SIGTERM is SIGKILLed
    within the 1 s grace, and the result says so."""
    started = await tools["exec"].handler({"command": _IGNORES_TERM, "background": True}, "a")
    sid = started.data["sessionId"]
    await tools["process"].handler({"action": "wait", "sessionId": sid, "pattern": "up", "timeout": 10_000}, "a")
    loop = asyncio.get_running_loop()
    begun = loop.time()
    killed = await tools["process"].handler({"action": "kill", "sessionId": sid}, "a")
    assert loop.time() - begun < 1.7
    assert killed.data["status"] == "killed" and killed.data["exitSignal"] == "SIGKILL"
    assert re.search(r"SIGTERM sent at \d+ ms, then SIGKILL sent at \d+ ms", killed.text), killed.text


async def test_spec001_kill_grace_zero_is_sigkill_at_once(settings: Settings) -> None:
    """Spec 001's letter behind ``killGraceSec = 0``: kill and timeout send SIGKILL first (no
    SIGTERM that, with no grace, would never be followed by SIGKILL)."""
    async with Supervisor(_with_exec(settings, kill_grace_sec=0.0)) as sup:
        tools = {spec.name: spec for spec in exec_process_tools(sup)}
        timed = await tools["exec"].handler({"command": _IGNORES_TERM, "timeout": 0.3, "yieldMs": 5000}, "a")
        assert timed.data["state"] == "timed_out" and timed.data["exitSignal"] == "SIGKILL"
        started = await tools["exec"].handler({"command": _IGNORES_TERM, "background": True}, "a")
        killed = await tools["process"].handler({"action": "kill", "sessionId": started.data["sessionId"]}, "a")
        assert killed.data["status"] == "killed" and killed.data["signalSent"] == "SIGKILL"


async def test_spec004_process_tool_not_served_exec_runs_synchronously(settings: Settings) -> None:
    """Spec 004: "If the process tool is disallowed, exec runs synchronously and ignores
    yieldMs/background", also when it is left out of the served set (--tools exec,process.run):
    a sessionId handed back then named a run nothing could manage."""
    picked = settings.model_copy(update={"tools": settings.tools.model_copy(update={"serve": ("exec", "process.run")})})
    async with Supervisor(picked) as sup:
        tools = {spec.name: spec for spec in served(all_tools(sup), picked)}
        assert set(tools) == {"exec", "process.run"}
        result = await tools["exec"].call({"command": "sleep 0.2; echo late", "background": True}, "a")
        assert result.data["status"] == "done" and result.data["output"] == "late\n"


async def test_spec001_tail_last_2000_chars(tools: Tools) -> None:
    """Spec 001: "tail: Last 2000 chars (quick preview for status responses)": a backgrounded
    exec shows them (it showed 400)."""
    printed = "".join(f"{n}\n" for n in range(1, 1001))
    result = await tools["exec"].call({"command": "seq 1 1000; sleep 30", "yieldMs": 1000}, "a")
    assert result.data["status"] == "running"
    tail = result.data["tail"]  # whole lines, within the last 2000 characters
    assert printed.endswith(tail) and 2000 - 5 <= len(tail) <= 2000
    await tools["process"].call({"action": "kill", "sessionId": result.data["sessionId"]}, "a")


# -- what is accepted is what is applied --------------------------------------------------------


@pytest.mark.parametrize(
    ("tool", "args", "field"),
    [
        ("exec", {"command": "true", "yieldMs": 120_001}, "yieldMs"),  # once accepted to 2**53, cut to 120 s
        ("exec", {"command": "true", "yieldMs": -1}, "yieldMs"),
        ("process", {"action": "wait", "sessionId": "SID", "timeout": 600_001}, "timeout"),  # once cut to 600 s
        ("process", {"action": "write", "sessionId": "SID", "data": "x", "timeout": 2**40}, "timeout"),
    ],
)
async def test_a_value_past_the_bound_that_is_applied_is_refused(
    tools: Tools, tool: str, args: dict[str, Any], field: str
) -> None:
    cat = await tools["exec"].call({"command": "cat", "background": True}, "a")
    sid = cat.data["sessionId"]
    args = {k: (sid if v == "SID" else v) for k, v in args.items()}
    result = await tools[tool].call(args, "a")
    assert result.is_error and result.data["error"] == "InvalidArgument", result.text
    assert field in result.text
    await tools["process"].call({"action": "remove", "sessionId": sid}, "a")


async def test_a_value_the_face_raises_or_lowers_is_stated_in_the_result(tools: Tools) -> None:
    """yieldMs under 10 waits 10 ms (OpenClaw's floor), poll blocks at most 30 s: the result says so."""
    started = await tools["exec"].call({"command": "cat", "yieldMs": 0}, "a")
    assert started.data["yieldMsApplied"] == 10, started.text
    sid = started.data["sessionId"]
    await tools["process"].call({"action": "write", "sessionId": sid, "data": "hi\n", "eof": True}, "a")
    await tools["process"].call({"action": "wait", "sessionId": sid, "timeout": 10_000}, "a")
    polled = await tools["process"].call({"action": "poll", "sessionId": sid, "timeout": 45_000}, "a")
    assert polled.data["timeoutApplied"] == 30_000, polled.text
    asked = await tools["exec"].call({"command": "true", "yieldMs": 5_000}, "a")
    assert "yieldMsApplied" not in asked.data  # applied as asked: nothing to say
    await tools["process"].call({"action": "remove", "sessionId": sid}, "a")


def test_a_lone_command_is_read_with_exec_params_fields_and_defaults() -> None:
    """``{"command": ...}`` is read without pydantic: the same fields, defaults and values."""
    fields = {f.name: f.default for f in dataclasses.fields(CommandOnly)}
    assert fields.pop("command") is dataclasses.MISSING
    assert fields == {name: info.default for name, info in ExecParams.model_fields.items() if name != "command"}
    for command in ("true", " ", "x" * 5000, "é ⚡ $(x)"):
        read = exec_params({"command": command})
        assert isinstance(read, CommandOnly)  # the pydantic-free reading was taken
        model = ExecParams.model_validate({"command": command})
        assert {name: getattr(read, name) for name in ExecParams.model_fields} == model.model_dump()


class _Text(str):
    pass


@pytest.mark.parametrize(
    "arguments",
    [{"command": ""}, {"command": 5}, {"command": None}, {"comand": "true"}, {"command": ["true"]}, {}],
)
async def test_exec_refuses_what_a_lone_command_is_not_with_the_validators_own_error(
    tools: Tools, arguments: dict[str, Any]
) -> None:
    with pytest.raises(InvalidArgument) as refused:
        parse_arguments(ExecParams, arguments)
    result = await tools["exec"].call(arguments, "agent-a")
    assert result.is_error and result == error_result(refused.value)


async def test_a_lone_command_of_a_str_subclass_runs_as_its_text(tools: Tools) -> None:
    assert not isinstance(exec_params({"command": _Text("true")}), CommandOnly)  # pydantic converts it
    result = await tools["exec"].call({"command": _Text("echo hi")}, "agent-a")
    assert not result.is_error and result.data["output"] == "hi\n"
