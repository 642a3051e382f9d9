"""process.run / monitor / kill / list / logs (spec 000): every field, default, state and error, on real processes."""

from __future__ import annotations

import asyncio
import datetime as dt
import shlex
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from procpilot.config import Settings
from procpilot.contract import ToolSpec
from procpilot.engine.supervisor import Supervisor
from procpilot.engine.trees import ScanTrees
from procpilot.errors import ProcpilotError
from procpilot.faces.capabilities import (
    AuditEvent,
    ProcessAPI,
    capability_tools,
)
from procpilot.policy.gate import Gate
from procpilot.transports.mcp import build_mcp_server

PROGRAMS = Path(__file__).parent.parent / "programs"
PY = sys.executable

RUN_FIELDS = {"exit_code", "stdout_summary", "stderr_summary", "duration_ms", "process_id", "state", "resource_usage"}
MONITOR_FIELDS = {"process_id", "command", "state", "exit_code", "duration_ms", "resource_usage", "started_at"}
KILL_FIELDS = {"killed", "signal_sent", "process_id", "state"}
LIST_FIELDS = {"processes", "total"}
ENTRY_FIELDS = {"process_id", "command", "state", "exit_code", "started_at", "duration_ms", "resource_usage"}
LOGS_FIELDS = {"stdout", "stderr", "stdout_size", "stderr_size", "truncated", "process_id", "state"}
LOGS_FIELDS |= {"stdout_next_offset", "stderr_next_offset"}  # beyond the spec: exact paging
USAGE_FIELDS = {"cpu_ms", "memory_peak_bytes", "io_read_bytes", "io_write_bytes"}
BUSY = "import time\nt = time.process_time()\nwhile time.process_time() - t < {sec}: pass\n"

Connect = Callable[[], Client]


@pytest.fixture(params=["legacy", "auto"])
def connect(request: pytest.FixtureRequest, supervisor: Supervisor) -> Connect:
    """A client factory: the SDK's client must be entered and exited in the test's own task."""
    server = build_mcp_server(capability_tools(supervisor), scope="agent-a")
    return lambda: Client(server, mode=request.param)


async def mcp_call(client: Client, tool: str, **args: Any) -> tuple[str, dict[str, Any], bool]:
    result = await client.call_tool(tool, args)
    text = result.content[0].text  # type: ignore[union-attr]
    return text, result.structured_content or {}, bool(result.is_error)


class Tools:
    """The process.* tools called as a transport would, in one scope."""

    def __init__(self, supervisor: Supervisor, scope: str = "agent-a", gate: Gate | None = None) -> None:
        tools = capability_tools(supervisor)
        self.by_name: dict[str, ToolSpec] = {t.name: t for t in (gate.wrap(tools) if gate else tools)}
        self.scope = scope

    async def __call__(self, tool: str, /, **args: Any) -> dict[str, Any]:
        result = await self.by_name[tool].call(args, self.scope)
        assert not result.is_error, result.text
        return result.data

    async def error(self, tool: str, /, **args: Any) -> dict[str, Any]:
        result = await self.by_name[tool].call(args, self.scope)
        assert result.is_error, result.text
        assert result.text.startswith(result.data["error"]) and "What to do next" in result.text
        return result.data


@pytest.fixture
def tools(supervisor: Supervisor) -> Tools:
    return Tools(supervisor)


def assert_usage(usage: dict[str, Any]) -> None:
    assert set(usage) == USAGE_FIELDS
    measured = {k: v for k, v in usage.items() if not (k == "memory_peak_bytes" and v is None)}  # null: unknown
    assert all(isinstance(v, int) and v >= 0 for v in measured.values())


def parse_iso(value: str) -> dt.datetime:
    parsed = dt.datetime.fromisoformat(value)
    assert parsed.tzinfo is not None
    return parsed


# -- listing -------------------------------------------------------------------------------------


async def test_tools_are_listed_with_spec_inputs_and_tiers(connect: Connect) -> None:
    async with connect() as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
        assert set(tools) == {"process.run", "process.monitor", "process.kill", "process.list", "process.logs"}
        props = {name: set(t.input_schema["properties"]) for name, t in tools.items()}
        assert props["process.run"] == {
            "command",
            "args",
            "working_directory",
            "environment",
            "timeout",
            "background",
            "stdin",
            "cpu_limit",
            "memory_limit",
            "stdout_lines",
            "restart",  # beyond the spec: a restart policy for background runs
            "max_restarts",
            "name",  # beyond the spec: a name every call takes in place of the process_id
        }
        assert props["process.monitor"] == {"process_id"}
        assert props["process.kill"] == {"process_id", "signal", "force_after"}
        assert props["process.list"] == {"state_filter", "limit", "offset"}  # offset: beyond spec 000, paging
        assert props["process.logs"] == {"process_id", "stream", "offset", "limit"}
        assert tools["process.run"].input_schema["required"] == ["command"]
        run_props = tools["process.run"].input_schema["properties"]
        # The lean schema leaves bounds to the face (definitions.lean_schema); the description says it.
        assert run_props["timeout"]["default"] == 300 and "max 3600" in run_props["timeout"]["description"]
        assert run_props["stdout_lines"]["default"] == 100 and run_props["background"].get("default", False) is False
        kill_props = tools["process.kill"].input_schema["properties"]
        assert kill_props["signal"]["default"] == "SIGTERM" and kill_props["force_after"]["default"] == 10
        list_props = tools["process.list"].input_schema["properties"]
        assert list_props["state_filter"]["default"] == "all" and list_props["limit"]["default"] == 50
        assert tools["process.logs"].input_schema["properties"]["stream"]["default"] == "both"
        tiers = {name: (t.meta or {}).get("procpilot/permission") for name, t in tools.items()}
        assert tiers == {
            "process.run": "notify",
            "process.kill": "notify",
            "process.monitor": "autonomous",
            "process.list": "autonomous",
            "process.logs": "autonomous",
        }


# -- process.run ---------------------------------------------------------------------------------


async def test_run_returns_every_spec_field(connect: Connect) -> None:
    async with connect() as client:
        text, data, is_error = await mcp_call(client, "process.run", command="echo out; echo err >&2")
        assert not is_error
        assert set(data) == RUN_FIELDS
        assert data["exit_code"] == 0 and data["state"] == "completed"
        assert data["stdout_summary"] == "out\n" and data["stderr_summary"] == "err\n"
        assert isinstance(data["duration_ms"], int) and 0 <= data["duration_ms"] < 10_000
        assert isinstance(data["process_id"], str) and data["process_id"]
        assert_usage(data["resource_usage"])
        assert data["process_id"] in text


async def test_non_zero_exit_is_completed_not_an_error(tools: Tools) -> None:
    data = await tools("process.run", command="echo bad >&2; exit 3")
    assert data["state"] == "completed" and data["exit_code"] == 3 and data["stderr_summary"] == "bad\n"


async def test_args_run_without_a_shell(tools: Tools) -> None:
    shell = await tools("process.run", command="echo $HOME")
    assert shell["stdout_summary"] != "$HOME\n"  # the shell expanded it
    argv = await tools("process.run", command="echo", args=["$HOME", "a  b", "*"])
    assert argv["stdout_summary"] == "$HOME a  b *\n"
    empty = await tools("process.run", command="true", args=[])
    assert empty["exit_code"] == 0


async def test_stdin_is_fed_then_closed(tools: Tools) -> None:
    data = await tools("process.run", command="cat", stdin="hello\nwörld\n")
    assert data["stdout_summary"] == "hello\nwörld\n" and data["exit_code"] == 0
    counted = await tools(
        "process.run", command=PY, args=["-c", "import sys; print(len(sys.stdin.read()))"], stdin="x" * 300_000
    )
    assert counted["stdout_summary"] == "300000\n"


async def test_without_stdin_a_foreground_run_reads_eof(tools: Tools) -> None:
    t0 = time.monotonic()
    data = await tools("process.run", command="cat; echo done", timeout=20)
    assert data["state"] == "completed" and data["stdout_summary"] == "done\n"
    assert time.monotonic() - t0 < 10


async def test_stdout_lines_keeps_the_last_lines_of_each_stream(tools: Tools) -> None:
    data = await tools("process.run", command="seq 1 500; seq 1 300 >&2", stdout_lines=3)
    assert data["stdout_summary"] == "498\n499\n500\n"
    assert data["stderr_summary"] == "298\n299\n300\n"
    default = await tools("process.run", command="seq 1 500")
    assert default["stdout_summary"].splitlines() == [str(i) for i in range(401, 501)]
    none = await tools("process.run", command="seq 1 5", stdout_lines=0)
    assert none["stdout_summary"] == ""


async def test_timeout_returns_timed_out_with_partial_output(connect: Connect, supervisor: Supervisor) -> None:
    async with connect() as client:
        t0 = time.monotonic()
        text, data, is_error = await mcp_call(
            client, "process.run", command="echo partial; echo warn >&2; sleep 30", timeout=1
        )
        assert not is_error
        assert set(data) == RUN_FIELDS
        assert data["state"] == "timed_out" and data["exit_code"] is None
        assert data["stdout_summary"] == "partial\n" and data["stderr_summary"] == "warn\n"
        assert 900 <= data["duration_ms"] < 10_000 and time.monotonic() - t0 < 10
        assert "timed out" in text
        session = supervisor.get("agent-a", data["process_id"])
        assert session.finished and not supervisor._tree_backend.pids(session.id, session.pid)


async def test_timeout_bounds(tools: Tools) -> None:
    err = await tools.error("process.run", command="true", timeout=3601)
    assert err["error"] == "InvalidArgument" and "use_background" in err["hints"]
    err = await tools.error("process.run", command="true", timeout=0)
    assert err["error"] == "InvalidArgument"


async def test_background_returns_at_once_without_timeout(tools: Tools, supervisor: Supervisor) -> None:
    t0 = time.monotonic()
    data = await tools("process.run", command="sleep 2; echo late", background=True, timeout=1, stdin="ignored")
    assert time.monotonic() - t0 < 1.0
    assert set(data) == RUN_FIELDS and data["state"] == "running" and data["exit_code"] is None
    session = supervisor.get("agent-a", data["process_id"])
    assert session.spec.timeout is None and session.spec.stdin_data is None and session.backgrounded
    await asyncio.sleep(1.3)  # past the foreground timeout it was given: still running
    assert (await tools("process.monitor", process_id=data["process_id"]))["state"] == "running"
    await session.wait_finished(10)
    done = await tools("process.monitor", process_id=data["process_id"])
    assert done["state"] == "completed" and done["exit_code"] == 0
    logs = await tools("process.logs", process_id=data["process_id"])
    assert logs["stdout"] == "late\n"


async def test_command_not_found_has_the_spec_hints(connect: Connect) -> None:
    async with connect() as client:
        _, data, is_error = await mcp_call(client, "process.run", command="no-such-binary-qq", args=["x"])
        assert is_error and data["error"] == "CommandNotFound"
        assert set(data["hints"]) == {"check_path", "use_full_path"}
        assert "process.run(command='which'" in data["hints"]["check_path"]
        _, data, is_error = await mcp_call(client, "process.run", command="no-such-binary-qq --flag")
        assert is_error and data["error"] == "CommandNotFound"


async def test_a_program_that_cannot_be_executed_is_spawn_failed(connect: Connect, workspace: Path) -> None:
    script = workspace / "noexec.sh"
    script.write_text("#!/bin/sh\necho ran\n")
    script.chmod(0o644)
    async with connect() as client:
        for command in ("./noexec.sh", str(workspace)):
            text, data, is_error = await mcp_call(client, "process.run", command=command, args=[])
            assert is_error and data["error"] == "SpawnFailed", text
            assert "check_permissions" in data["hints"]
        _, data, is_error = await mcp_call(client, "process.run", command="./noexec.sh")  # through the shell
        assert is_error and data["error"] == "SpawnFailed"


async def test_working_directory_inside_the_workspace(tools: Tools, workspace: Path) -> None:
    (workspace / "sub" / "deeper").mkdir(parents=True)
    data = await tools("process.run", command="pwd")
    assert data["stdout_summary"] == f"{workspace.resolve()}\n"
    data = await tools("process.run", command="pwd", working_directory="sub/deeper")
    assert data["stdout_summary"] == f"{(workspace / 'sub' / 'deeper').resolve()}\n"
    data = await tools("process.run", command="pwd", working_directory=str(workspace / "sub"))
    assert data["stdout_summary"] == f"{(workspace / 'sub').resolve()}\n"
    data = await tools("process.run", command="pwd", working_directory="sub/../sub/deeper/..")
    assert data["stdout_summary"] == f"{(workspace / 'sub').resolve()}\n"


@pytest.mark.parametrize("where", ["dotdot", "absolute", "symlink", "symlink_parent", "home"])
async def test_working_directory_escapes_are_path_out_of_scope(
    tools: Tools, workspace: Path, tmp_path: Path, where: str
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (workspace / "link").symlink_to(outside)
    (workspace / "sub").mkdir()
    value = {
        "dotdot": "sub/../../outside",
        "absolute": str(outside),
        "symlink": "link",
        "symlink_parent": "link/../outside",
        "home": "~",
    }[where]
    err = await tools.error("process.run", command="pwd", working_directory=value)
    assert err["error"] == "PathOutOfScope"
    assert set(err["hints"]) == {"check_scope"}
    assert err["working_directory"] == value


async def test_missing_working_directory_is_invalid_argument(tools: Tools) -> None:
    err = await tools.error("process.run", command="pwd", working_directory="nope")
    assert err["error"] == "InvalidArgument" and err["field"] == "working_directory"


async def test_environment_merges_and_protected_variables_are_refused(tools: Tools) -> None:
    data = await tools("process.run", command='echo "$FOO:$BAR"', environment={"FOO": "one", "BAR": "two words"})
    assert data["stdout_summary"] == "one:two words\n"
    base = await tools("process.run", command='echo "$PAGER"')
    assert base["stdout_summary"] == "cat\n"  # the base environment is still there
    for name in ("LD_PRELOAD", "PATH", "HOME", "LD_LIBRARY_PATH", "PYTHONPATH", "LD_AUDIT", "DYLD_INSERT_LIBRARIES"):
        err = await tools.error("process.run", command="true", environment={"OK": "1", name: "/tmp/x"})
        assert err["error"] == "ProtectedVariable", name
        assert err["variables"] == [name] and name in err["message"]


async def test_memory_and_cpu_limits_are_accepted(tools: Tools) -> None:
    data = await tools("process.run", command="echo limited", memory_limit=256 * 1024 * 1024, cpu_limit=0.5)
    assert data["state"] == "completed" and data["stdout_summary"] == "limited\n"
    err = await tools.error("process.run", command="true", cpu_limit=0)
    assert err["error"] == "InvalidArgument"


# -- process.monitor -------------------------------------------------------------------------------


async def test_monitor_returns_every_spec_field(tools: Tools) -> None:
    before = dt.datetime.now(dt.UTC)
    started = await tools("process.run", command="sleep 30", background=True)
    data = await tools("process.monitor", process_id=started["process_id"])
    assert set(data) == MONITOR_FIELDS
    assert data["process_id"] == started["process_id"] and data["command"] == "sleep 30"
    assert data["state"] == "running" and data["exit_code"] is None
    assert isinstance(data["duration_ms"], int)
    assert_usage(data["resource_usage"])
    assert abs((parse_iso(data["started_at"]) - before).total_seconds()) < 5
    await asyncio.sleep(0.2)
    later = await tools("process.monitor", process_id=started["process_id"])
    assert later["duration_ms"] >= data["duration_ms"] + 150
    await tools("process.kill", process_id=started["process_id"], signal="SIGKILL")
    killed = await tools("process.monitor", process_id=started["process_id"])
    assert killed["state"] == "killed" and killed["exit_code"] is None
    assert killed["started_at"] == data["started_at"]


async def test_unknown_process_is_process_not_found(connect: Connect) -> None:
    async with connect() as client:
        for tool, extra in (("process.monitor", {}), ("process.kill", {}), ("process.logs", {})):
            text, data, is_error = await mcp_call(client, tool, process_id="nope", **extra)
            assert is_error and data["error"] == "ProcessNotFound", tool
            assert data["hints"] == {"see_your_sessions": "Use process.list to see all tracked processes."}
            assert data["process_id"] == "nope" and text.startswith("ProcessNotFound")


async def test_other_scopes_cannot_see_a_process(supervisor: Supervisor) -> None:
    a, b = Tools(supervisor, "agent-a"), Tools(supervisor, "agent-b")
    started = await a("process.run", command="sleep 30", background=True)
    for tool in ("process.monitor", "process.kill", "process.logs"):
        err = await b.error(tool, process_id=started["process_id"])
        assert err["error"] == "ProcessNotFound"
    assert (await b("process.list"))["total"] == 0
    await a("process.kill", process_id=started["process_id"], signal="SIGKILL")


# -- process.kill ----------------------------------------------------------------------------------


async def test_kill_sigterm_by_default(connect: Connect) -> None:
    async with connect() as client:
        _, started, _ = await mcp_call(client, "process.run", command="sleep 30", background=True)
        _, data, is_error = await mcp_call(client, "process.kill", process_id=started["process_id"])
        assert not is_error and set(data) == KILL_FIELDS
        assert data == {
            "killed": True,
            "signal_sent": "SIGTERM",
            "process_id": started["process_id"],
            "state": "killed",
        }


async def test_kill_escalates_to_sigkill_after_force_after(tools: Tools) -> None:
    started = await tools("process.run", command=PY, args=[str(PROGRAMS / "ignore_term.py")], background=True)
    pid = started["process_id"]
    await wait_for_output(tools, pid, "ready")
    t0 = time.monotonic()
    data = await tools("process.kill", process_id=pid, force_after=1)
    assert 0.9 <= time.monotonic() - t0 < 8
    assert data == {"killed": True, "signal_sent": "SIGKILL", "process_id": pid, "state": "killed"}


async def test_kill_without_escalation_leaves_a_term_ignoring_process_running(tools: Tools) -> None:
    started = await tools("process.run", command=PY, args=[str(PROGRAMS / "ignore_term.py")], background=True)
    pid = started["process_id"]
    await wait_for_output(tools, pid, "ready")
    data = await tools("process.kill", process_id=pid, force_after=0)
    assert data["killed"] is False and data["signal_sent"] == "SIGTERM" and data["state"] == "running"
    forced = await tools("process.kill", process_id=pid, signal="SIGKILL")
    assert forced == {"killed": True, "signal_sent": "SIGKILL", "process_id": pid, "state": "killed"}


@pytest.mark.parametrize("name", ["SIGINT", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "sigkill", "TERM"])
async def test_kill_accepts_the_spec_signals(tools: Tools, name: str) -> None:
    started = await tools("process.run", command="sleep 30", background=True)
    data = await tools("process.kill", process_id=started["process_id"], signal=name)
    expected = name.upper() if name.upper().startswith("SIG") else "SIG" + name.upper()
    assert data["signal_sent"] == expected and data["killed"] is True and data["state"] == "killed"


async def test_kill_errors(tools: Tools) -> None:
    started = await tools("process.run", command="sleep 30", background=True)
    err = await tools.error("process.kill", process_id=started["process_id"], signal="SIGSTOP")
    assert err["error"] == "InvalidArgument" and err["field"] == "signal"
    err = await tools.error("process.kill", process_id=started["process_id"], force_after=-1)
    assert err["error"] == "InvalidArgument"
    await tools("process.kill", process_id=started["process_id"])
    err = await tools.error("process.kill", process_id=started["process_id"])
    assert err["error"] == "ProcessAlreadyExited"
    assert err["hints"] == {"check_status": "Use process.monitor to see the final state and exit code."}
    done = await tools("process.run", command="true")
    err = await tools.error("process.kill", process_id=done["process_id"])
    assert err["error"] == "ProcessAlreadyExited" and err["state"] == "completed"


async def test_kill_refused_by_the_os_is_kill_failed(
    tools: Tools, supervisor: Supervisor, monkeypatch: pytest.MonkeyPatch
) -> None:
    started = await tools("process.run", command="sleep 30", background=True)

    def refuse(*args: Any, **kwargs: Any) -> int:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(supervisor._tree_backend, "signal", refuse)
    err = await tools.error("process.kill", process_id=started["process_id"])
    assert err["error"] == "KillFailed" and err["hints"] == {"force_kill": "Retry with signal='SIGKILL'."}
    monkeypatch.undo()
    await tools("process.kill", process_id=started["process_id"], signal="SIGKILL")


# -- process.list ----------------------------------------------------------------------------------


async def test_list_filters_and_orders(tools: Tools) -> None:
    completed = await tools("process.run", command="true")
    killed = await tools("process.run", command="sleep 30", background=True)
    await tools("process.kill", process_id=killed["process_id"])
    timed_out = await tools("process.run", command="sleep 30", timeout=1)
    running = await tools("process.run", command="sleep 30", background=True)
    data = await tools("process.list")
    assert set(data) == LIST_FIELDS and data["total"] == 4
    ids = [p["process_id"] for p in data["processes"]]
    assert ids == [running["process_id"], timed_out["process_id"], killed["process_id"], completed["process_id"]]
    for entry in data["processes"]:
        assert set(entry) == ENTRY_FIELDS
        assert_usage(entry["resource_usage"])
        parse_iso(entry["started_at"])
    for state, expected in (
        ("running", running),
        ("completed", completed),
        ("killed", killed),
        ("timed_out", timed_out),
    ):
        filtered = await tools("process.list", state_filter=state)
        assert filtered["total"] == 1 and filtered["processes"][0]["process_id"] == expected["process_id"], state
        assert filtered["processes"][0]["state"] == state
    limited = await tools("process.list", limit=2)
    assert limited["total"] == 4 and [p["process_id"] for p in limited["processes"]] == ids[:2]
    assert (await tools("process.list", limit=0))["processes"] == []
    assert [p["exit_code"] for p in data["processes"]] == [None, None, None, 0]
    await tools("process.kill", process_id=running["process_id"])


async def test_default_list_limit_is_50(tools: Tools) -> None:
    for _ in range(52):
        await tools("process.run", command="true")
    data = await tools("process.list")
    assert data["total"] == 52 and len(data["processes"]) == 50


async def test_list_pages_with_an_offset_and_names_the_next_page(tools: Tools) -> None:
    """Issue 23: process.list had no offset, so the processes past ``limit`` could not be listed."""
    started = [(await tools("process.run", command="true"))["process_id"] for _ in range(5)]
    newest_first = started[::-1]
    result = await tools.by_name["process.list"].call({"limit": 2}, tools.scope)
    assert result.data["next"] == "process.list limit=2 offset=2"
    assert result.text.endswith("[3 more not shown here: process.list limit=2 offset=2]")
    seen, arguments = [], {"limit": 2}
    while True:
        page = await tools("process.list", **arguments)
        assert page["total"] == 5
        seen += [p["process_id"] for p in page["processes"]]
        if "next" not in page:
            break
        arguments = {"limit": 2, "offset": int(page["next"].rsplit("=", 1)[1])}
    assert seen == newest_first  # every process once, in order, and the last page names no next
    narrowed = await tools("process.list", state_filter="completed", limit=4)
    assert narrowed["next"] == "process.list state_filter=completed limit=4 offset=4"
    past = await tools("process.list", offset=99)
    assert past["processes"] == [] and past["total"] == 5 and "next" not in past
    for bad in (-1, 2**63):
        err = await tools.error("process.list", offset=bad)
        assert err["error"] == "InvalidArgument" and "offset" in err["message"]


@pytest.mark.parametrize("value", ["done", "RUNNING", "exited", ""])
async def test_invalid_filter(tools: Tools, value: str) -> None:
    err = await tools.error("process.list", state_filter=value)
    assert err["error"] == "InvalidFilter"
    assert err["hints"] == {"use_valid_filter": "Use one of: 'running', 'completed', 'killed', 'timed_out', 'all'."}


# -- process.logs ----------------------------------------------------------------------------------


async def test_logs_streams_and_every_field(connect: Connect) -> None:
    async with connect() as client:
        _, run, _ = await mcp_call(client, "process.run", command="printf 'out1\\nout2\\n'; printf 'err1\\n' >&2")
        pid = run["process_id"]
        _, both, is_error = await mcp_call(client, "process.logs", process_id=pid)
        assert not is_error and set(both) == LOGS_FIELDS
        assert both == {
            "stdout": "out1\nout2\n",
            "stderr": "err1\n",
            "stdout_size": 10,
            "stderr_size": 5,
            "truncated": False,
            "process_id": pid,
            "state": "completed",
            "stdout_next_offset": 10,
            "stderr_next_offset": 5,
        }
        _, out, _ = await mcp_call(client, "process.logs", process_id=pid, stream="stdout")
        assert out["stdout"] == "out1\nout2\n" and out["stderr"] == "" and out["stderr_size"] == 5
        assert out["stderr_next_offset"] is None
        _, err, _ = await mcp_call(client, "process.logs", process_id=pid, stream="stderr")
        assert err["stdout"] == "" and err["stderr"] == "err1\n" and err["stdout_size"] == 10


async def test_logs_paging_with_limit_and_truncated(tools: Tools) -> None:
    run = await tools("process.run", command="printf 0123456789abcdefghij")
    pid = run["process_id"]
    first = await tools("process.logs", process_id=pid, stream="stdout", offset=0, limit=8)
    assert first["stdout"] == "01234567" and first["truncated"] is True and first["stdout_size"] == 20
    second = await tools("process.logs", process_id=pid, stream="stdout", offset=8, limit=8)
    assert second["stdout"] == "89abcdef" and second["truncated"] is True
    last = await tools("process.logs", process_id=pid, stream="stdout", offset=16, limit=8)
    assert last["stdout"] == "ghij" and last["truncated"] is False
    past = await tools("process.logs", process_id=pid, stream="stdout", offset=100)
    assert past["stdout"] == "" and past["truncated"] is False
    result = await tools.by_name["process.logs"].call({"process_id": pid, "offset": 0, "limit": 8}, "agent-a")
    assert "next offset 8" in result.text


async def test_logs_limit_never_splits_a_character(tools: Tools) -> None:
    run = await tools("process.run", command="printf 'aé€z'")  # 1 + 2 + 3 + 1 bytes
    pid = run["process_id"]
    page = await tools("process.logs", process_id=pid, stream="stdout", offset=0, limit=2)
    assert page["stdout"] == "a" and page["truncated"] is True
    assert page["stdout_next_offset"] == 1  # not 2: the cut "é" comes whole on the next page
    result = await tools.by_name["process.logs"].call(
        {"process_id": pid, "stream": "stdout", "offset": 1, "limit": 4}, "agent-a"
    )
    assert result.data["stdout"] == "é" and "next offset 3" in result.text
    rest = await tools("process.logs", process_id=pid, stream="stdout", offset=3)
    assert rest["stdout"] == "€z"


async def test_logs_stdout_size_is_the_next_offset_of_a_running_process(tools: Tools, supervisor: Supervisor) -> None:
    run = await tools("process.run", command="echo first; read line; echo second $line", background=True)
    pid = run["process_id"]
    await wait_for_output(tools, pid, "first\n")
    page = await tools("process.logs", process_id=pid, stream="stdout", offset=0)
    assert page["stdout"] == "first\n" and page["state"] == "running" and page["truncated"] is False
    await supervisor.write("agent-a", pid, b"go\n")
    await supervisor.get("agent-a", pid).wait_finished(10)
    rest = await tools("process.logs", process_id=pid, stream="stdout", offset=page["stdout_size"])
    assert rest["stdout"] == "second go\n" and rest["state"] == "completed"


@pytest.mark.parametrize("value", ["combined", "STDOUT", "all", ""])
async def test_invalid_stream(tools: Tools, value: str) -> None:
    run = await tools("process.run", command="true")
    err = await tools.error("process.logs", process_id=run["process_id"], stream=value)
    assert err["error"] == "InvalidStream"
    assert err["hints"] == {"use_valid_stream": "Use one of: 'stdout', 'stderr', 'both'."}


async def test_logs_bad_offsets(tools: Tools) -> None:
    run = await tools("process.run", command="true")
    err = await tools.error("process.logs", process_id=run["process_id"], offset=-1)
    assert err["error"] == "InvalidArgument"


# -- resource usage ----------------------------------------------------------------------------------


async def test_cpu_of_a_grandchild_counts(tools: Tools) -> None:
    # sh forks python (the `; true` keeps sh from exec'ing it): the work is done by a grandchild.
    script = f"{PY} -c '{BUSY.format(sec=0.3)}'; true"
    data = await tools("process.run", command="sh", args=["-c", script])
    assert data["exit_code"] == 0
    assert data["resource_usage"]["cpu_ms"] >= 250


@pytest.mark.parametrize("backend", ["probed", "scan"])
async def test_cpu_of_an_orphaned_grandchild_counts(settings: Settings, backend: str) -> None:
    # The subshell exits at once: the first python is re-parented to the supervisor, so no process
    # of the tree reaps it and the leader's rusage never includes it; the second is sh's own child,
    # busy after the first has gone. Both must count: neither alone reaches 1.2 s (the first is
    # counted as last sampled, up to a sampling interval short of its end).
    trees = ScanTrees() if backend == "scan" else None
    async with Supervisor(settings, trees=trees) as sup:
        api = ProcessAPI(sup, "a")
        first, second = (f"{PY} -c '{BUSY.format(sec=sec)}'" for sec in (1.0, 0.5))
        out = await api.run("sh", args=["-c", f"({first} &); sleep 1.3; {second}; true"])
        assert out.state == "completed"
        assert out.resource_usage.cpu_ms >= 1200, out.resource_usage


async def test_usage_is_sampled_while_running(tools: Tools, supervisor: Supervisor) -> None:
    script = f"{PY} -c '{BUSY.format(sec=5)}'; true"
    run = await tools("process.run", command="sh", args=["-c", script], background=True)
    pid = run["process_id"]
    deadline = time.monotonic() + 10
    usage: dict[str, Any] = {}
    while time.monotonic() < deadline:
        usage = (await tools("process.monitor", process_id=pid))["resource_usage"]
        if usage["cpu_ms"] >= 200:
            break
        await asyncio.sleep(0.1)
    assert usage["cpu_ms"] >= 200 and usage["memory_peak_bytes"] > 1_000_000
    assert usage["io_read_bytes"] > 0  # python read its own modules
    listed = (await tools("process.list", state_filter="running"))["processes"][0]["resource_usage"]
    assert listed["cpu_ms"] >= usage["cpu_ms"]
    await tools("process.kill", process_id=pid, signal="SIGKILL")
    final = (await tools("process.monitor", process_id=pid))["resource_usage"]
    assert final["cpu_ms"] >= listed["cpu_ms"]  # never goes down


async def test_io_write_bytes_count(tools: Tools, workspace: Path) -> None:
    script = f'{PY} -c \'import time\nopen("big", "wb").write(bytes(3_000_000))\ntime.sleep(0.6)\'; true'
    data = await tools("process.run", command="sh", args=["-c", script])
    assert data["resource_usage"]["io_write_bytes"] >= 3_000_000
    assert (workspace / "big").stat().st_size == 3_000_000


# -- audit -------------------------------------------------------------------------------------------


async def test_notify_calls_are_audited(supervisor: Supervisor) -> None:
    """By the policy gate, the one audit wrapper: the event carries what the face's own wrapper
    (there is none now) used to add, the session's state after the call and its start time."""
    events: list[AuditEvent] = []
    gate = Gate(supervisor.settings)
    tools = Tools(supervisor, gate=gate)
    remove = gate.audit.add_callback(events.append)
    before = dt.datetime.now(dt.UTC)
    run = await tools("process.run", command="sleep 30", background=True, environment={"TOKEN": "secret"}, stdin="pw")
    await tools("process.monitor", process_id=run["process_id"])
    await tools("process.list")
    await tools("process.logs", process_id=run["process_id"])
    await tools("process.kill", process_id=run["process_id"])
    await tools.error("process.kill", process_id="nope")
    await tools.error("process.run", command="no-such-binary-qq")
    remove()
    assert [e.tool for e in events] == ["process.run", "process.kill", "process.kill", "process.run"]
    ok_run, ok_kill, bad_kill, bad_run = events
    assert ok_run.scope == "agent-a" and ok_run.outcome == "ok" and ok_run.tier == "notify"
    assert ok_run.process_id == run["process_id"] and ok_run.state == "running"
    assert ok_run.arguments["command"] == "sleep 30"
    assert ok_run.arguments["environment"] == {"TOKEN": "<redacted>"} and "pw" not in str(ok_run.arguments)
    assert ok_run.at >= before.timestamp() - 1
    assert ok_kill.outcome == "ok" and ok_kill.state == "killed" and ok_kill.process_id == run["process_id"]
    assert bad_kill.outcome == "error:ProcessNotFound" and bad_kill.process_id == "nope"
    assert bad_run.outcome == "error:CommandNotFound"


async def test_a_notify_call_cut_short_is_audited_as_cancelled(supervisor: Supervisor) -> None:
    events: list[AuditEvent] = []
    gate = Gate(supervisor.settings)
    gate.audit.add_callback(events.append)
    run = {t.name: t for t in gate.wrap(capability_tools(supervisor))}["process.run"]
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(run.call({"command": "sleep 30"}, "agent-a"), 0.2)
    assert [(e.tool, e.outcome) for e in events] == [("process.run", "error:Cancelled")]


# -- Python API ----------------------------------------------------------------------------------------


async def test_python_api(supervisor: Supervisor) -> None:
    api = ProcessAPI(supervisor, "py")
    out = await api.run("echo", args=["hi"])
    assert out.stdout_summary == "hi\n" and out.state == "completed"
    bg = await api.run("sleep 30", background=True)
    assert (await api.monitor(bg.process_id)).state == "running"
    listing = await api.list(state_filter="running")
    assert [p.process_id for p in listing.processes] == [bg.process_id]
    killed = await api.kill(bg.process_id, signal="SIGKILL")
    assert killed.killed and killed.state == "killed"
    logs = await api.logs(out.process_id, stream="stdout")
    assert logs.stdout == "hi\n"
    with pytest.raises(ProcpilotError) as info:
        await api.monitor("nope")
    assert info.value.code == "ProcessNotFound"
    with pytest.raises(ProcpilotError) as info:
        await api.list(state_filter="bogus")
    assert info.value.code == "InvalidFilter"


async def test_cancelled_foreground_run_ends_its_tree(supervisor: Supervisor) -> None:
    api = ProcessAPI(supervisor, "py")
    task = asyncio.ensure_future(api.run("sleep 30"))
    await asyncio.sleep(0.3)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    (session,) = supervisor.list("py")
    assert await session.wait_finished(10)
    assert (await api.monitor(session.id)).state == "killed"


# -- helpers -----------------------------------------------------------------------------------------


async def wait_for_output(tools: Tools, process_id: str, text: str, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        logs = await tools("process.logs", process_id=process_id, stream="stdout")
        if text in logs["stdout"]:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"{text!r} never appeared")


MEMORY_HOG = (
    "import sys, time\nprint('before the hog', flush=True)\nchunks = []\n"
    "while True:\n    chunks.append(bytearray(8 << 20))\n    time.sleep(0.005)\n"
)


@pytest.mark.parametrize("shell_survives", [False, True], ids=["hog", "hog-then-echo"])
async def test_a_memory_kill_is_resource_limit_exceeded_with_the_peak(
    supervisor: Supervisor, tools: Tools, shell_survives: bool
) -> None:
    if "memory" not in supervisor.capabilities()["limits"]["enforced"]:
        pytest.skip("no memory limit mechanism here")
    limit = 96 << 20
    command = f"python3 -c {shlex.quote(MEMORY_HOG)}" + ("; echo done" if shell_survives else "")
    err = await tools.error("process.run", command=command, memory_limit=limit, timeout=60)
    assert err["error"] == "ResourceLimitExceeded", err
    assert err["limit"] == "memory" and err["limit_bytes"] == limit
    assert err["memory_peak_bytes"] is not None and err["memory_peak_bytes"] >= limit // 2
    assert {"increase_limits", "optimize"} <= set(err["hints"])
    process_id = err["process_id"]
    # The partial output is still there, and monitor says the same.
    logs = await tools("process.logs", process_id=process_id)
    assert "before the hog" in logs["stdout"]
    if shell_survives:
        assert "done" in logs["stdout"]  # the shell outlived its child: still a limit kill
    again = await tools.error("process.monitor", process_id=process_id)
    assert again["error"] == "ResourceLimitExceeded" and again["process_id"] == process_id
    listed = await tools("process.list")
    assert [p["state"] for p in listed["processes"] if p["process_id"] == process_id] == ["killed"]


async def test_a_name_and_restarts_beyond_the_spec_show_only_where_a_process_has_them(tools: Tools) -> None:
    named = await tools("process.run", command="sleep 30", background=True, name="web")
    crashing = await tools("process.run", command="exit 3", background=True, restart="on-failure", max_restarts=1)
    plain = await tools("process.run", command="true")
    monitored = await tools("process.monitor", process_id="web")  # the name in place of the id
    assert monitored["process_id"] == named["process_id"] and monitored["name"] == "web"
    assert set(monitored) == MONITOR_FIELDS | {"name"}
    for _ in range(100):
        again = await tools("process.monitor", process_id=crashing["process_id"])
        if again["state"] != "running":
            break
        await asyncio.sleep(0.05)
    assert again["restarts"] == 1 and again["exit_code"] == 3 and "name" not in again
    rows = {p["process_id"]: p for p in (await tools("process.list"))["processes"]}
    assert rows[named["process_id"]]["name"] == "web" and "restarts" not in rows[named["process_id"]]
    assert rows[crashing["process_id"]]["restarts"] == 1
    assert set(rows[plain["process_id"]]) == ENTRY_FIELDS  # spec 000's shape, nothing added
    err = await tools.error("process.run", command="true", name="web")
    assert err["error"] == "SessionNameInUse"
    await tools("process.kill", process_id="web", signal="SIGKILL")


async def test_spec000_memory_peak_bytes_is_null_when_not_measured(tools: Tools) -> None:
    """``memory_peak_bytes`` of a tree too short to be sampled (and below the supervisor's own
    peak, so wait4's figure says nothing) is null, unknown, not 0 (no process uses no memory)."""
    data = await tools("process.run", command="true")
    assert data["resource_usage"]["memory_peak_bytes"] is None
    listed = await tools("process.list", state_filter="all")
    assert listed["processes"][0]["resource_usage"]["memory_peak_bytes"] is None
