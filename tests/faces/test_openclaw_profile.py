"""OpenClaw compatibility: each documented behaviour of OpenClaw's exec/process tools, through the
``openclaw`` profile, over MCP with the SDK's own client (in memory)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from procpilot.config import load_settings
from procpilot.engine.states import SessionState
from procpilot.engine.supervisor import Supervisor
from procpilot.errors import InvalidArgument, ProtectedVariable
from procpilot.faces.exec_process import exec_process_tools
from procpilot.faces.openclaw_profile import OPENCLAW, PROCPILOT, Profile, profile_for
from procpilot.transports.mcp import build_mcp_server

Connect = Callable[[], Client]


async def _supervisor(tmp_path: Path, workspace: Path, **exec_settings: Any) -> AsyncIterator[Supervisor]:
    settings = load_settings(env={}, state_dir=tmp_path / "state", workspace_root=workspace, exec=exec_settings)
    async with Supervisor(settings) as sup:
        yield sup


def _connect(sup: Supervisor) -> Connect:
    """A client factory: the SDK's client must be entered and exited in the test's own task."""
    server = build_mcp_server(exec_process_tools(sup), scope="a")
    return lambda: Client(server)


@pytest.fixture
async def openclaw(tmp_path: Path, workspace: Path) -> AsyncIterator[Connect]:
    async for sup in _supervisor(tmp_path / "oc", workspace, profile="openclaw"):
        yield _connect(sup)


@pytest.fixture
async def ours(tmp_path: Path, workspace: Path) -> AsyncIterator[Connect]:
    async for sup in _supervisor(tmp_path / "ours", workspace):
        yield _connect(sup)


async def call(client: Client, tool: str, **args: Any) -> tuple[str, dict[str, Any], bool]:
    result = await client.call_tool(tool, args)
    text = result.content[0].text  # type: ignore[union-attr]
    return text, result.structured_content or {}, bool(result.is_error)


async def run_bg(client: Client, command: str, **args: Any) -> str:
    _, data, _ = await call(client, "exec", command=command, background=True, **args)
    return str(data["sessionId"])


async def wait(client: Client, sid: str, **args: Any) -> tuple[str, dict[str, Any]]:
    text, data, _ = await call(client, "process", action="wait", sessionId=sid, timeout=10_000, **args)
    return text, data


# -- 1. exit status ------------------------------------------------------------------------------


async def test_a_non_zero_exit_is_completed_with_its_code_appended(openclaw: Connect) -> None:
    async with openclaw() as client:
        text, data, err = await call(client, "exec", command="echo oops; exit 3")
        assert not err
        assert (data["status"], data["exitCode"], data["state"]) == ("completed", 3, "exited_error")
        assert text == "oops\n\n(Command exited with code 3)"
        text, data, _ = await call(client, "exec", command="echo fine")
        assert (data["status"], text) == ("completed", "fine")


async def test_failed_is_kept_for_timeouts_signals_and_what_the_shell_cannot_run(openclaw: Connect) -> None:
    async with openclaw() as client:
        text, data, _ = await call(client, "exec", command="sleep 5", timeout=0.3)  # fractional, as OpenClaw's
        assert data["status"] == "failed" and data["state"] == "timed_out"
        assert "Command timed out after 0.3 seconds" in text
        _, data, _ = await call(client, "exec", command="exit 127")
        assert (data["status"], data["exitCode"]) == ("failed", 127)
        _, data, _ = await call(client, "exec", command="kill -TERM $$")
        assert data["status"] == "failed" and data["exitSignal"] == "SIGTERM"
        sid = await run_bg(client, "sleep 30")
        text, data, _ = await call(client, "process", action="kill", sessionId=sid)
        assert data["status"] == "failed" and data["state"] == "killed"
        text, data, _ = await call(client, "process", action="poll", sessionId=sid)
        assert text.endswith("Process exited with signal SIGTERM.")


async def test_a_timeout_says_to_rerun_with_a_higher_timeout(tmp_path: Path, workspace: Path) -> None:
    advice = "If this command is expected to take longer, re-run with a higher timeout (e.g., exec timeout=300)."
    async for sup in _supervisor(tmp_path / "t", workspace, profile="openclaw", timeout_sec=1):
        async with _connect(sup)() as client:
            text, data, _ = await call(client, "exec", command="sleep 30")  # the default timeout, 1 s here
            assert data["status"] == "failed"
            assert text == f"Command timed out after 1 seconds. {advice}"


async def test_the_default_timeout_ends_a_background_run_and_timeout_zero_does_not(
    tmp_path: Path, workspace: Path
) -> None:
    """OpenClaw's newest background-abort test: "background exec without explicit timeout applies
    default timeout", and "with timeout zero bypasses default timeout"."""
    async for sup in _supervisor(tmp_path / "t", workspace, profile="openclaw", timeout_sec=1):
        async with _connect(sup)() as client:
            bounded = await run_bg(client, "sleep 30")  # no timeout: the default, 1 s here
            unbounded = await run_bg(client, "sleep 30", timeout=0)
            text, data = await wait(client, bounded)
            assert (data["status"], data["state"]) == ("failed", "timed_out"), text
            # The default has passed and ended the other: this one is still running.
            _, data, _ = await call(client, "process", action="poll", sessionId=unbounded)
            assert data["status"] == "running"
            assert sup.get("a", unbounded).spec.timeout is None
            await call(client, "process", action="kill", sessionId=unbounded)


async def test_ours_keeps_spec_002s_vocabulary(ours: Connect) -> None:
    async with ours() as client:
        text, data, _ = await call(client, "exec", command="exit 3")
        assert data["status"] == "error" and "(Command exited" not in text


# -- 4. aggregated, 9. result texts --------------------------------------------------------------


async def test_poll_and_log_carry_aggregated_and_openclaws_texts(openclaw: Connect) -> None:
    async with openclaw() as client:
        sid = await run_bg(client, "echo one; echo two; sleep 30")
        await wait(client, sid, pattern="two")
        text, data, _ = await call(client, "process", action="poll", sessionId=sid)
        assert data["aggregated"] == "one\ntwo\n" and data["status"] == "running"
        assert text.startswith("one\ntwo\n\nProcess still running.")
        text, data, _ = await call(client, "process", action="poll", sessionId=sid)
        assert text.startswith("(no new output)\n\nProcess still running.")
        assert data["aggregated"] == "one\ntwo\n"  # the whole output, not what is new
        _, data, _ = await call(client, "process", action="log", sessionId=sid)
        assert data["aggregated"] == "one\ntwo\n" and data["output"] == "one\ntwo"
        text, _, _ = await call(client, "process", action="list")
        assert text.startswith(f"{sid} running ") and text.endswith(":: echo one")  # OpenClaw's list line
        await call(client, "process", action="kill", sessionId=sid)
        await wait(client, sid)
        # A session that had ended: its output again (OpenClaw shows its tail), then how it ended.
        for _ in range(2):
            text, data, _ = await call(client, "process", action="poll", sessionId=sid)
            assert (text, data["status"]) == ("one\ntwo\n\nProcess exited with signal SIGTERM.", "failed")


async def test_a_backgrounded_command_is_said_to_be_unfinished(openclaw: Connect) -> None:
    async with openclaw() as client:
        text, data, _ = await call(client, "exec", command="echo started; sleep 30", yieldMs=200)
        assert data["status"] == "running"
        assert text.startswith(f"Command still running (session {data['sessionId']}, pid {data['pid']})")
        assert "confirm it completed" in text
        await call(client, "process", action="kill", sessionId=data["sessionId"])


async def test_log_says_showing_last_200_of_201_lines(openclaw: Connect) -> None:
    async with openclaw() as client:
        sid = await run_bg(client, "seq 1 201")
        await wait(client, sid)
        text, _, _ = await call(client, "process", action="log", sessionId=sid)
        assert text.startswith("2\n3\n")
        assert text.endswith("201\n[showing last 200 of 201 lines; pass offset/limit to page]")
        sid = await run_bg(client, "seq 1 3")
        await wait(client, sid)
        text, _, _ = await call(client, "process", action="log", sessionId=sid)
        assert text == "1\n2\n3"  # all of it shown: no note


async def test_tool_descriptions_send_the_agent_to_process_to_confirm_completion(openclaw: Connect) -> None:
    async with openclaw() as client:
        tools = {t.name: t.description or "" for t in (await client.list_tools()).tools}
        assert "confirm it completed" in tools["exec"]
        assert "completed or failed" in tools["process"]
        # OpenClaw's own guidance: what each tool is for, and what not to use it for.
        assert "Use process whenever you need logs, status, input, or intervention." in tools["exec"]
        assert "Do not use exec sleep or delay loops for reminders." in tools["exec"]
        assert "Use pty=true for TTY-required commands." in tools["exec"]
        assert "Use write/send-keys/submit/paste/kill for input or intervention." in tools["process"]
        assert "Do not use process polling to emulate timers." in tools["process"]


# -- 5. OPENCLAW_SHELL ---------------------------------------------------------------------------


async def test_commands_see_openclaw_shell_exec(openclaw: Connect, ours: Connect) -> None:
    for connect, seen in ((openclaw, "[exec]\n"), (ours, "[]\n")):
        async with connect() as client:
            _, data, _ = await call(client, "exec", command='echo "[$OPENCLAW_SHELL]"')
            assert data["output"] == seen


# -- 6, 7. keys ----------------------------------------------------------------------------------

_HEXDUMP = "read -r line; printf '%s' \"$line\" | od -An -tx1"


async def test_home_end_are_vt_keys_and_a_bad_hex_element_is_skipped_with_a_warning(openclaw: Connect) -> None:
    async with openclaw() as client:
        # without a terminal its stdin is closed; cursor keys wait for the program's first output
        sid = await run_bg(client, "echo ready; " + _HEXDUMP, pty=True)
        await wait(client, sid, pattern="ready")
        sent = {"literal": "a", "hex": ["62", "zz"], "keys": ["Home", "End"]}
        text, data, err = await call(client, "process", action="send-keys", sessionId=sid, **sent)
        assert not err and data["warnings"] == ["hex[1] = 'zz' is not a byte in hex: skipped"]
        # OpenClaw's answer: the bytes that went (a, b, ESC[1~, ESC[4~), then the warnings listed.
        assert text == f"Sent 10 bytes to session {sid}.\nWarnings:\n- hex[1] = 'zz' is not a byte in hex: skipped"
        await call(client, "process", action="write", sessionId=sid, data="\n")
        await wait(client, sid)
        _, log, _ = await call(client, "process", action="log", sessionId=sid)
        # literal, hex, keys, in that order: a b ESC[1~ ESC[4~ (after the terminal's echo of them)
        assert "61 62 1b 5b 31 7e 1b 5b 34 7e" in log["output"]


async def test_send_keys_answers_sent_n_bytes_to_session(openclaw: Connect, ours: Connect) -> None:
    for connect, expected in ((openclaw, "Sent 3 bytes to session {}."), (ours, "wrote 3 bytes to session {}")):
        async with connect() as client:
            sid = await run_bg(client, "sleep 30", pty=True)
            text, data, err = await call(client, "process", action="send-keys", sessionId=sid, keys=["C-a", "x", "y"])
            assert not err and text == expected.format(sid) and data["bytesWritten"] == 3
            await call(client, "process", action="kill", sessionId=sid)


async def test_cursor_keys_wait_for_the_programs_first_output(openclaw: Connect, ours: Connect) -> None:
    # OpenClaw's send-keys refuses an arrow, Home or End while the program under the terminal
    # has not said which cursor keys it wants (ESC [A or ESC O A): a model trained on it polls,
    # then sends them again. Other keys, and modified ones, go at once.
    async with openclaw() as client:
        sid = await run_bg(client, "read -r line; echo got:$line; read -r line", pty=True)
        text, data, err = await call(client, "process", action="send-keys", sessionId=sid, keys=["x", "Up"])
        assert not err and data == {"status": "failed", "sessionId": sid}
        assert text == (
            f"Session {sid} cursor key mode is not known yet. "
            "Poll or log until startup output appears, then retry send-keys."
        )
        text, _, err = await call(client, "process", action="send-keys", sessionId=sid, keys=["C-Up", "y", "Enter"])
        assert not err and text == f"Sent 8 bytes to session {sid}."
        await wait(client, sid, pattern="got:")
        text, _, err = await call(client, "process", action="send-keys", sessionId=sid, keys=["Up", "Enter"])
        assert not err and text == f"Sent 4 bytes to session {sid}."  # ESC [A and CR: normal mode
        await wait(client, sid)
    async with ours() as client:
        sid = await run_bg(client, "read -r line", pty=True)
        text, _, err = await call(client, "process", action="send-keys", sessionId=sid, keys=["Up", "Enter"])
        assert not err and text == f"wrote 4 bytes to session {sid}"
        await wait(client, sid)


async def test_a_running_poll_suggests_openclaws_backoff(openclaw: Connect, ours: Connect) -> None:
    # OpenClaw's retryInMs: 5, 10, 30, then 60 s for polls in a row with no new output, back to
    # 5 s with output, none once the session ended. Ours keeps 1, 2, 5, 10, 30 s and no hint
    # after output.
    for connect, empty_steps, after_output in (
        (openclaw, [5_000, 10_000, 30_000, 60_000, 60_000], 5_000),
        (ours, [1_000, 2_000, 5_000, 10_000, 30_000], None),
    ):
        async with connect() as client:
            sid = await run_bg(client, "read -r line; echo got:$line; sleep 30", pty=True)
            steps = [
                (await call(client, "process", action="poll", sessionId=sid))[1].get("retryInMs") for _ in range(5)
            ]
            assert steps == empty_steps
            await call(client, "process", action="write", sessionId=sid, data="x\n")
            _, data, _ = await call(client, "process", action="poll", sessionId=sid, timeout=5_000)
            assert data["output"] and data.get("retryInMs") == after_output
            await call(client, "process", action="kill", sessionId=sid)
            _, data, _ = await call(client, "process", action="poll", sessionId=sid)
            assert data["status"] != "running" and "retryInMs" not in data


async def test_ours_refuses_a_bad_hex_element(ours: Connect) -> None:
    async with ours() as client:
        sid = await run_bg(client, "sleep 30")
        text, _, err = await call(client, "process", action="send-keys", sessionId=sid, hex=["zz"])
        assert err and "InvalidArgument" in text
        await call(client, "process", action="kill", sessionId=sid)


async def test_home_end_follow_cursor_key_mode(openclaw: Connect) -> None:
    async with openclaw() as client:
        sid = await run_bg(client, "printf '\\033[?1hready\\n'; " + _HEXDUMP, pty=True)
        await wait(client, sid, pattern="ready")
        await call(client, "process", action="send-keys", sessionId=sid, keys=["Home", "End", "Enter"])
        await wait(client, sid)
        _, log, _ = await call(client, "process", action="log", sessionId=sid)
        assert "1b 4f 48 1b 4f 46" in log["output"]  # ESC O H, ESC O F


# -- 8. script preflight -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "command",
    ["python3 bad.py", "echo x | python3 -u bad.py", "timeout 5 node bad.js"],
)
async def test_scripts_holding_shell_syntax_are_refused_before_they_run(
    openclaw: Connect, workspace: Path, command: str
) -> None:
    (workspace / "bad.py").write_text("import json\n# an agent wrote shell:\npayload = $DM_JSON\nprint(payload)\n")
    (workspace / "bad.js").write_text("const s = `${1 + 1}`;\nconst payload = $DM_JSON;\n")
    async with openclaw() as client:
        text, _, err = await call(client, "exec", command=command)
        assert err and text.startswith("ScriptHasShellSyntax")
        assert "$DM_JSON" in text


async def test_a_script_with_dollars_only_in_strings_runs(openclaw: Connect, workspace: Path) -> None:
    (workspace / "ok.py").write_text('price = "$5"  # costs $5\nprint(price)\n')
    async with openclaw() as client:
        _, data, err = await call(client, "exec", command="python3 ok.py")
        assert not err and data["output"] == "$5\n"


async def test_the_refusal_reads_as_openclaws(openclaw: Connect, workspace: Path) -> None:
    (workspace / "bad.py").write_text("import json\n# an agent wrote shell:\npayload = $DM_JSON\n")
    async with openclaw() as client:
        text, _, err = await call(client, "exec", command="python3 bad.py")
        assert err
        assert "exec preflight: detected likely shell variable injection ($DM_JSON) in python script: bad.py:3." in text
        assert 'In Python, use os.environ.get("DM_JSON") instead of raw $DM_JSON.' in text


@pytest.mark.parametrize(
    "command",
    [
        "node --require ./bad.js app.js",
        "node -r bad.js",
        "node --import bad.js",
        "node --require=bad.js -e 'console.log(1)'",
        "node --import=./bad.js -e 'console.log(1)'",
    ],
)
async def test_node_preload_modules_are_checked_like_the_script(
    openclaw: Connect, workspace: Path, command: str
) -> None:
    (workspace / "bad.js").write_text("const value = $DM_JSON;\n")
    (workspace / "app.js").write_text("console.log('ok');\n")
    async with openclaw() as client:
        text, _, err = await call(client, "exec", command=command)
        assert err and "exec preflight: detected likely shell variable injection ($DM_JSON) in node script" in text


@pytest.mark.parametrize("command", ["cat bad.py | python3", "python3 <(cat bad.py)"])
async def test_a_script_the_preflight_cannot_read_fails_closed(
    openclaw: Connect, workspace: Path, command: str
) -> None:
    (workspace / "bad.py").write_text("print('fine')\n")  # refused for the form, whatever it holds
    async with openclaw() as client:
        text, _, err = await call(client, "exec", command=f"bash -c {command!r}")
        assert err and text.startswith("ScriptNotCheckable")
        assert "exec preflight: complex interpreter invocation detected" in text
        # An interpreter that reads no script on the other side of a pipe is left alone.
        _, data, err = await call(client, "exec", command="echo bad.py | python3 --version")
        assert not err and data["exitCode"] == 0


@pytest.mark.parametrize(
    "command",
    [
        'bash -c "python3 bad.py"',
        "bash -xc 'python3 bad.py'",
        'env bash --norc -c "node bad.js"',
        "if true; then python3 bad.py; fi",
        "while false; do\nnode bad.js\ndone",
    ],
)
async def test_a_script_run_inside_sh_c_or_control_flow_fails_closed_as_in_openclaw(
    tmp_path: Path, workspace: Path, command: str
) -> None:
    (workspace / "bad.py").write_text("print('fine')\n")  # refused for the form, whatever it holds
    (workspace / "bad.js").write_text("console.log('fine');\n")
    async for sup in _supervisor(tmp_path / "oc", workspace, profile="openclaw"):
        async with _connect(sup)() as client:
            text, _, err = await call(client, "exec", command=command)
            assert err and text.startswith("ScriptNotCheckable: exec preflight: complex interpreter invocation"), text
            # Interpreter words that run no script are left alone.
            text, data, err = await call(client, "exec", command='bash -c "echo python; python3 --version"')
            assert not err and data["exitCode"] == 0 and text.startswith("python"), text
    async for sup in _supervisor(tmp_path / "ours", workspace, script_preflight=True):
        async with _connect(sup)() as client:
            # Ours reads through both: the script is checked like a direct one, and it is sound.
            _, data, err = await call(client, "exec", command=command)
            assert not err and data["exitCode"] == 0, data


async def test_without_a_terminal_stdin_is_closed_as_in_openclaw(openclaw: Connect, ours: Connect) -> None:
    async with openclaw() as client:
        text, data, err = await call(client, "exec", command="cat; echo after", yieldMs=5_000)
        assert not err and data["status"] == "completed" and text == "after"  # cat read end of file at once
        sid = await run_bg(client, "cat", pty=True)  # a terminal's stdin stays open for process write
        await call(client, "process", action="write", sessionId=sid, data="typed\n")
        _, found = await wait(client, sid, pattern="typed")
        assert found["reason"] == "pattern", found
        await call(client, "process", action="kill", sessionId=sid)
    async with ours() as client:
        _, data, _ = await call(client, "exec", command="cat; echo after", yieldMs=300)
        assert data["status"] == "running"  # ours keeps a pipe the process tool writes to
        await call(client, "process", action="write", sessionId=data["sessionId"], data="x\n", eof=True)
        assert (await wait(client, data["sessionId"]))[1]["exitCode"] == 0


async def test_a_protected_env_override_is_refused_in_openclaws_words(openclaw: Connect, ours: Connect) -> None:
    async with openclaw() as client:
        for env, words in (
            ({"PATH": "/x"}, "Security Violation: Custom 'PATH' variable is forbidden during host execution."),
            (
                {"LD_DEBUG": "1"},
                "Security Violation: Environment variable 'LD_DEBUG' is forbidden during host execution.",
            ),
        ):
            text, data, err = await call(client, "exec", command="true", env=env)
            assert err and data["error"] == "ProtectedVariable" and text.startswith(f"ProtectedVariable: {words}")
    async with ours() as client:
        text, _, err = await call(client, "exec", command="true", env={"LD_DEBUG": "1"})
        assert err and "cannot override protected environment variable(s): LD_DEBUG" in text


async def test_a_session_id_it_does_not_know_is_a_failed_status_as_in_openclaw(
    openclaw: Connect, ours: Connect
) -> None:
    async with openclaw() as client:
        for action in ("poll", "log", "kill"):
            text, data, err = await call(client, "process", action=action, sessionId="nosuchsession")
            assert (text, data["status"], err) == ("No session found for nosuchsession", "failed", False)
    async with ours() as client:
        text, data, err = await call(client, "process", action="poll", sessionId="nosuchsession")
        assert err and data["error"] == "SessionNotFound"


async def test_a_shell_line_saved_as_a_script_is_refused(openclaw: Connect, workspace: Path) -> None:
    # $TMPDIR is inside a string, but on the first line of code: the whole line is shell, not JavaScript.
    (workspace / "bad.js").write_text('// written by an agent\nNODE "$TMPDIR/hot.json"\nconsole.log("hi");\n')
    (workspace / "ok.js").write_text('console.log("ok");\nconst s = "$HOME";\n')  # later lines: strings are text
    async with openclaw() as client:
        text, _, err = await call(client, "exec", command="node bad.js")
        assert err and "shell variable injection ($TMPDIR) in node script: bad.js:2." in text
        _, data, err = await call(client, "exec", command="node ok.js")
        assert not err and data["output"] == "ok\n"


async def test_only_scripts_inside_the_workdir_are_read(openclaw: Connect, workspace: Path) -> None:
    (workspace / "sub").mkdir()
    (workspace / "outside.py").write_text("payload = $DM_JSON\n")
    async with openclaw() as client:
        _, data, err = await call(client, "exec", command="python3 ../outside.py", workdir="sub")
        assert not err and data["exitCode"] == 1  # it ran: Python's own SyntaxError, as in OpenClaw
        (workspace / "sub" / "link.py").symlink_to(workspace / "outside.py")  # a link does not lead it out
        _, data, err = await call(client, "exec", command="python3 link.py", workdir="sub")
        assert not err and data["exitCode"] == 1
        text, _, err = await call(client, "exec", command="python3 outside.py")  # the same file, from its own dir
        assert err and "$DM_JSON" in text


@pytest.mark.parametrize(
    ("source", "token"),
    [('text = "ok"\rpayload = $C\n', "$C"), ('text = "ok\rpayload = $E\n', "$E"), ("# note\rpayload = $D\n", "$D")],
)
async def test_a_lone_cr_ends_a_line_as_python_reads_it(
    openclaw: Connect, workspace: Path, source: str, token: str
) -> None:
    (workspace / "bad.py").write_bytes(source.encode())
    (workspace / "ok.py").write_bytes(b'continued = "text \\\r\n$U"\r\nprint(continued)\r\n')  # a continued string
    async with openclaw() as client:
        text, _, err = await call(client, "exec", command="python3 bad.py")
        assert err and f"shell variable injection ({token})" in text
        _, data, err = await call(client, "exec", command="python3 ok.py")
        assert not err and data["output"] == "text $U\n"


async def test_preflight_is_opt_in_outside_the_profile(tmp_path: Path, workspace: Path, ours: Connect) -> None:
    (workspace / "bad.py").write_text("payload = $DM_JSON\n")
    async with ours() as client:
        _, data, err = await call(client, "exec", command="python3 bad.py")
        assert not err and data["exitCode"] == 1  # Python's own SyntaxError
    async for sup in _supervisor(tmp_path / "opt", workspace, script_preflight=True):
        async with _connect(sup)() as client:
            text, _, err = await call(client, "exec", command="python3 bad.py")
            assert err and text.startswith("ScriptHasShellSyntax")


# -- switching it on -----------------------------------------------------------------------------


async def test_procpilot_mcp_profile_openclaw_and_the_config_key(tmp_path: Path) -> None:
    from mcp.client.stdio import StdioServerParameters

    from tests.transports.test_cli_mcp import PROCPILOT, server_env

    args = ["mcp", "--agent", "a1", "--profile", "openclaw"]
    async with Client(StdioServerParameters(command=PROCPILOT, args=args, env=server_env(tmp_path))) as client:
        text, data, _ = await call(client, "exec", command="exit 2")
        assert (data["status"], text) == ("completed", "(Command exited with code 2)")
    config = tmp_path / "procpilot.toml"
    config.write_text('[tools.exec]\nprofile = "openclaw"\nscriptPreflight = false\n')
    settings = load_settings(config, env={})
    assert (settings.exec.profile, settings.exec.script_preflight) == ("openclaw", False)


# -- the Profile objects themselves (faces/openclaw_profile.py), without a face around them -----


def test_profile_for_picks_the_profile_the_settings_name(tmp_path: Path, workspace: Path) -> None:
    def named(profile: str) -> Profile:
        return profile_for(
            load_settings(env={}, state_dir=tmp_path, workspace_root=workspace, exec={"profile": profile})
        )

    assert named("openclaw") is OPENCLAW
    assert named("procpilot") is PROCPILOT
    # codex and claude replace the exec face's tools: what it still says stays in our vocabulary.
    assert named("codex") is PROCPILOT and named("claude") is PROCPILOT


@pytest.mark.parametrize(
    ("state", "code", "signal", "status"),
    [
        (SessionState.EXITED_OK, 0, None, "completed"),
        (SessionState.EXITED_ERROR, 3, None, "completed"),  # ran to its end: the code says the rest
        (SessionState.EXITED_ERROR, 127, None, "failed"),  # the shell could not find it
        (SessionState.EXITED_ERROR, 126, None, "failed"),
        (SessionState.KILLED, None, "SIGKILL", "failed"),
        (SessionState.TIMED_OUT, None, "SIGTERM", "failed"),
        (SessionState.RESTARTING, None, None, "running"),
        (SessionState.QUEUED, None, None, "running"),
    ],
)
def test_openclaw_status_is_completed_for_any_run_to_its_end(
    state: SessionState, code: int | None, signal: str | None, status: str
) -> None:
    assert OPENCLAW.status(state, code, signal) == status


def test_ours_keeps_done_error_killed_and_never_calls_lost_done() -> None:
    assert PROCPILOT.status(SessionState.EXITED_OK, 0, None) == "done"
    assert PROCPILOT.status(SessionState.EXITED_ERROR, 3, None) == "error"
    assert PROCPILOT.status(SessionState.KILLED, None, "SIGKILL") == "killed"
    assert PROCPILOT.status(SessionState.LOST, None, None) == "lost"


def test_send_keys_bytes_hex_leniency_and_home_end() -> None:
    payload, warnings = OPENCLAW.encode_input("a", ["1b", "zz", "0x41"], ["Home", "End"], app_cursor=False)
    assert payload == b"a\x1bA\x1b[1~\x1b[4~"  # the bad element skipped, Home/End as VT keys
    assert len(warnings) == 1 and "zz" in warnings[0]
    with pytest.raises(InvalidArgument):
        PROCPILOT.encode_input(None, ["zz"], None, app_cursor=False)  # ours refuses it
    payload, warnings = PROCPILOT.encode_input("a", ["1b"], ["Enter"], app_cursor=False)
    assert payload == b"a\x1b\r" and warnings == []


def test_openclaw_words_for_a_protected_variable_and_an_unknown_session() -> None:
    one = OPENCLAW.refused_env(ProtectedVariable("ours", variables=["PATH"]))
    assert one.message == "Security Violation: Custom 'PATH' variable is forbidden during host execution."
    assert one.details == {"variables": ["PATH"]}
    other = OPENCLAW.refused_env(ProtectedVariable("ours", variables=["LD_PRELOAD"]))
    assert "'LD_PRELOAD' is forbidden" in other.message
    several = ProtectedVariable("ours", variables=["PATH", "LD_PRELOAD"])
    assert OPENCLAW.refused_env(several) is several  # ours names them all
    assert OPENCLAW.unknown_session("abc") == ("No session found for abc", {"status": "failed", "sessionId": "abc"})
    assert PROCPILOT.unknown_session("abc") is None  # ours refuses it (SessionNotFound)
    assert OPENCLAW.env == {"OPENCLAW_SHELL": "exec"} and PROCPILOT.env == {}


def test_log_notes() -> None:
    assert OPENCLAW.log_note(200, 201) == "showing last 200 of 201 lines; pass offset/limit to page"
    assert OPENCLAW.log_note(5, 5) is None  # everything shown: no note
    assert PROCPILOT.log_note(0, 0) == "the log is empty: the session has written no output yet"
