"""Permission tiers and approvals on real tool calls (the exec/process tools over a real supervisor)."""

from __future__ import annotations

import asyncio
import json
import logging
import re
from pathlib import Path
from typing import Any

import pytest

from procpilot.config import load_settings
from procpilot.contract import PermissionTier, ToolResult, ToolSpec, call_summary
from procpilot.engine.supervisor import Supervisor
from procpilot.errors import SessionNotFound
from procpilot.faces.exec_process import ExecParams, exec_process_tools
from procpilot.faces.proc_protocol import ProcHandler
from procpilot.policy.gate import DECIDED_KEPT, AuditEvent, Gate
from procpilot.transports.serve import make_supervisor


def policy_settings(tmp_path: Path, workspace: Path, toml: str) -> Any:
    cfg = tmp_path / "policy.toml"
    cfg.write_text(toml)
    return load_settings(cfg, env={}, state_dir=tmp_path / "state", workspace_root=workspace)


def tool(tools: list[ToolSpec], name: str) -> ToolSpec:
    return next(t for t in tools if t.name == name)


async def test_tiers_block_notify_and_audit(tmp_path: Path, workspace: Path) -> None:
    settings = policy_settings(tmp_path, workspace, '[policy.agents.locked]\ntiers = { exec = "blocked" }\n')
    async with Supervisor(settings) as sup:
        gate = Gate(settings)
        events: list[AuditEvent] = []
        gate.audit.add_callback(events.append)
        tools = gate.wrap(exec_process_tools(sup))
        ok = await tool(tools, "exec").call({"command": "echo hi"}, "free")
        assert not ok.is_error
        assert [(e.scope, e.tool, e.tier, e.outcome) for e in events] == [("free", "exec", "notify", "ok")]
        assert "echo hi" in events[0].summary
        blocked = await tool(tools, "exec").call({"command": "echo hi"}, "locked")
        assert blocked.is_error
        assert blocked.data["error"] == "PermissionDenied"
        assert events[-1].outcome == "blocked"
        listed = await tool(tools, "process").call({"action": "list"}, "free")
        assert not listed.is_error
        assert len(events) == 2  # autonomous calls are not audited


async def test_an_audit_event_names_the_process_and_hides_environment_values(tmp_path: Path, workspace: Path) -> None:
    from procpilot.faces.all_tools import all_tools

    settings = policy_settings(tmp_path, workspace, "")
    async with Supervisor(settings) as sup:
        gate = Gate(settings)
        events: list[AuditEvent] = []
        gate.audit.add_callback(events.append)
        tools = gate.wrap(all_tools(sup))
        run = await tool(tools, "process.run").call(
            {"command": "sleep 30", "background": True, "environment": {"TOKEN": "s3cret"}}, "a1"
        )
        pid = run.data["process_id"]
        await tool(tools, "process.kill").call({"process_id": pid, "signal": "SIGKILL"}, "a1")
        started, killed = events
        assert started.tool == "process.run" and started.process_id == pid and started.outcome == "ok"
        assert started.arguments is not None and started.arguments["environment"] == {"TOKEN": "<redacted>"}
        assert "s3cret" not in repr(started)
        assert killed.tool == "process.kill" and killed.process_id == pid
        assert pid in killed.summary and "SIGKILL" in killed.summary
        assert killed.duration_ms is not None


def held_requests(gate: Gate) -> asyncio.Queue[str]:
    """The id of each request the gate holds, as it is held (its audit event)."""
    held: asyncio.Queue[str] = asyncio.Queue()
    gate.audit.add_callback(lambda e: held.put_nowait(str(e.request_id)) if e.outcome == "awaiting_approval" else None)
    return held


async def test_decided_requests_are_kept_in_a_ring_and_pending_ones_leave_with_their_call(
    tmp_path: Path, workspace: Path
) -> None:
    """A daemon that runs for months holds the newest DECIDED_KEPT decisions, not every request
    it was ever asked; a call that goes away (cancelled) takes its request out of the pending list."""
    settings = policy_settings(
        tmp_path,
        workspace,
        '[policy]\napproval_timeout_sec = 60\n[policy.default]\ntiers = { exec = "approval_required" }\n',
    )
    async with Supervisor(settings) as sup:
        gate = Gate(settings)
        held = held_requests(gate)
        exec_tool = tool(gate.wrap(exec_process_tools(sup)), "exec")
        ids = []
        for n in range(DECIDED_KEPT + 5):
            call = asyncio.ensure_future(exec_tool.call({"command": f"echo {n}"}, "a1"))
            ids.append(await held.get())
            gate.decide(ids[-1], False, approver="ops")
            assert (await call).data["error"] == "ApprovalDenied"
        kept = gate.decided(limit=10 * DECIDED_KEPT)
        assert [r.id for r in kept] == ids[::-1][:DECIDED_KEPT]  # the latest first, the oldest 5 gone
        assert gate.pending() == []

        call = asyncio.ensure_future(exec_tool.call({"command": "echo gone"}, "a1"))
        request_id = await held.get()
        assert [r.id for r in gate.pending()] == [request_id]
        call.cancel()
        await asyncio.wait({call})
        assert gate.pending() == []
        assert gate.decided(1)[0].id == request_id and gate.decided(1)[0].status == "expired"
        assert sup.list("a1") == []  # nothing ran


async def test_approval_holds_the_call_until_an_approver_decides(tmp_path: Path, workspace: Path) -> None:
    settings = policy_settings(
        tmp_path,
        workspace,
        '[policy]\napproval_timeout_sec = 0.3\n[policy.default]\ntiers = { exec = "approval_required" }\n',
    )
    async with Supervisor(settings) as sup:
        gate = Gate(settings)
        events: list[AuditEvent] = []
        gate.audit.add_callback(events.append)
        exec_tool = tool(gate.wrap(exec_process_tools(sup)), "exec")

        held = held_requests(gate)
        call = asyncio.ensure_future(exec_tool.call({"command": "echo approved"}, "a1"))
        await held.get()
        request = gate.pending("a1")[0]
        assert request.status == "awaiting_approval"
        assert gate.pending("someone-else") == []
        assert sup.list("a1") == []  # nothing ran yet
        gate.decide(request.id, True, approver="ops")
        result = await call
        assert result.data["output"] == "approved\n"

        call = asyncio.ensure_future(exec_tool.call({"command": "echo denied"}, "a1"))
        gate.decide(await held.get(), False, approver="ops", reason="not today")
        denied = await call
        assert denied.is_error
        assert denied.data["error"] == "ApprovalDenied"
        assert "not today" in denied.text

        expired = await exec_tool.call({"command": "echo late"}, "a1")
        assert expired.data["error"] == "ApprovalDenied"
        outcomes = [e.outcome for e in events]
        assert outcomes.count("awaiting_approval") == 3
        assert {"approved", "denied", "expired"} <= set(outcomes)
        assert len(sup.list("a1")) == 1  # only the approved command ever ran


async def test_stdin_writes_are_checked_when_the_policy_says_so(tmp_path: Path, workspace: Path) -> None:
    settings = policy_settings(
        tmp_path, workspace, '[policy.default]\nallow = ["sh", "echo", "ls", "cat"]\ncheck_stdin = true\n'
    )
    async with make_supervisor(settings) as sup:
        tools = Gate(settings).wrap(exec_process_tools(sup))
        started = await tool(tools, "exec").call({"command": "sh", "background": True}, "a1")
        sid = started.data["sessionId"]
        refused = await tool(tools, "process").call({"action": "write", "sessionId": sid, "data": "rm -rf x\n"}, "a1")
        assert refused.is_error
        assert refused.data["error"] == "CommandDenied"
        fine = await tool(tools, "process").call({"action": "write", "sessionId": sid, "data": "echo ok\n"}, "a1")
        assert not fine.is_error
        # Below every face: the same session written through spec 003's proc/write is checked too.
        handler = ProcHandler(sup, "a1")
        response = await handler.handle({"type": "proc/write/req", "proc_id": sid, "data": "rm -rf x\n"})
        assert response["error"]["code"] == "command_denied"
        mark = workspace / "written"
        response = await handler.handle({"type": "proc/write/req", "proc_id": sid, "data": f"touch {mark}\n"})
        assert response["error"]["code"] == "command_denied"
        response = await handler.handle({"type": "proc/write/req", "proc_id": sid, "data": "echo fine\n"})
        assert response.get("error") is None
        await tool(tools, "process").call({"action": "remove", "sessionId": sid}, "a1")
        assert not mark.exists()


async def test_a_pending_request_is_plain_data(tmp_path: Path, workspace: Path) -> None:
    settings = policy_settings(
        tmp_path,
        workspace,
        '[policy]\napproval_timeout_sec = 5\n[policy.default]\ntiers = { exec = "approval_required" }\n',
    )
    async with Supervisor(settings) as sup:
        gate = Gate(settings)
        held = held_requests(gate)
        exec_tool = tool(gate.wrap(exec_process_tools(sup)), "exec")
        call = asyncio.ensure_future(exec_tool.call({"command": "echo hi", "env": {"A": "1"}}, "a1"))
        await held.get()
        request = gate.pending("a1")[0]
        public = request.public()
        assert json.loads(json.dumps(public)) == public
        assert "_decision" not in public
        assert public["id"] == request.id and public["status"] == "awaiting_approval"
        assert public["arguments"] == {"command": "echo hi", "env": {"A": "<redacted>"}}  # names, not values
        gate.decide(request.id, False, approver="ops")
        assert (await call).data["error"] == "ApprovalDenied"
        assert request.public()["status"] == "denied" and request.public()["decided_by"] == "ops"


async def test_send_keys_are_checked_whatever_their_encoding(tmp_path: Path, workspace: Path) -> None:
    settings = policy_settings(
        tmp_path, workspace, '[policy.default]\nallow = ["sh", "echo", "ls", "cat"]\ncheck_stdin = true\n'
    )
    mark = workspace / "typed"
    typed = f"touch {mark}"
    async with make_supervisor(settings) as sup:
        tools = Gate(settings).wrap(exec_process_tools(sup))
        process = tool(tools, "process")
        started = await tool(tools, "exec").call({"command": "sh", "background": True, "pty": True}, "a1")
        sid = started.data["sessionId"]
        tricks: list[dict[str, Any]] = [
            {"hex": [format(b, "02x") for b in (typed + "\r").encode()]},
            {"keys": [*typed, "Enter"]},
            {"keys": ["t", "o"], "literal": "uch " + str(mark) + "\r"},
            {"literal": typed + "\r"},
            {"hex": ["ff", "0d"]},  # not UTF-8: what a shell would make of it is unknown
        ]
        for args in tricks:
            refused = await process.call({"action": "send-keys", "sessionId": sid, **args}, "a1")
            assert refused.is_error and refused.data["error"] in ("CommandDenied", "UnanalyzableCommand"), args
        fine = await process.call({"action": "send-keys", "sessionId": sid, "keys": [*"echo ok", "Enter"]}, "a1")
        assert not fine.is_error, fine.text
        # What was refused never reached the shell; had any of it, the shell would have run it
        # before the "echo ok" typed after it (its output: "ok", not the echo of "echo ok").
        typed_after = await sup.wait("a1", sid, pattern=re.compile(r"(?<!echo )\bok\r?$", re.MULTILINE), timeout=10)
        assert typed_after.reason == "pattern"
        assert not mark.exists()
        interrupt = await process.call({"action": "send-keys", "sessionId": sid, "keys": ["C-c"]}, "a1")
        assert not interrupt.is_error, interrupt.text
        await process.call({"action": "remove", "sessionId": sid}, "a1")


def test_audited_arguments_are_cut_and_say_so() -> None:
    from procpilot.contract import AUDIT_ARGUMENTS_BUDGET, audit_arguments

    kept = audit_arguments(
        {"command": "x" * 100_000, "env": {f"V{i}": "s" for i in range(100_000)}, "stdin": "pw", "timeout": 5}
    )
    shown, _, cut = kept["command"].partition("…")
    assert set(shown) == {"x"} and len(shown) <= AUDIT_ARGUMENTS_BUDGET
    assert cut == f"[{100_000 - len(shown)} more chars]"
    assert kept["env"] == "<100000 items>" and kept["stdin"] == "<2 items/chars>" and kept["timeout"] == 5
    many = audit_arguments({f"k{i}": i for i in range(100_000)})
    assert len(json.dumps(many)) < 4 * AUDIT_ARGUMENTS_BUDGET and many["..."].endswith("more arguments>")
    small = {"command": "ls", "args": ["-l", "src"], "env": {"A": "secret"}}
    assert audit_arguments(small) == {"command": "ls", "args": ["-l", "src"], "env": {"A": "<redacted>"}}


async def test_process_calls_that_change_a_session_are_audited_and_reads_are_not(
    tmp_path: Path, workspace: Path
) -> None:
    # Issue 23, item 9: process kill, write and remove were not audited, while process.kill was.
    settings = policy_settings(tmp_path, workspace, "")
    async with Supervisor(settings) as sup:
        gate = Gate(settings)
        events: list[AuditEvent] = []
        gate.audit.add_callback(events.append)
        tools = gate.wrap(exec_process_tools(sup))
        process = tool(tools, "process")
        started = await tool(tools, "exec").call({"command": "cat", "background": True}, "a1")
        sid = started.data["sessionId"]
        for action, more in (
            ("poll", {}),
            ("write", {"data": "s3cret\n"}),
            ("log", {}),
            ("list", {}),
            ("kill", {"signal": "SIGKILL"}),
            ("remove", {}),
        ):
            result = await process.call({"action": action, "sessionId": sid, **more}, "a1")
            assert not result.is_error, result.text
        audited = [(e.tool, (e.arguments or {}).get("action"), e.process_id, e.tier, e.outcome) for e in events[1:]]
        assert audited == [
            ("process", "write", sid, "notify", "ok"),
            ("process", "kill", sid, "notify", "ok"),
            ("process", "remove", sid, "notify", "ok"),
        ]
        assert "s3cret" not in repr(events)  # what is written is audited by its size only


async def test_the_claude_profiles_kills_are_audited(tmp_path: Path, workspace: Path) -> None:
    # Issue 23, item 9: TaskStop and KillShell end a process, as process.kill does, unaudited.
    from procpilot.faces.claude_profile import claude_tools

    settings = policy_settings(tmp_path, workspace, "")
    async with Supervisor(settings) as sup:
        gate = Gate(settings)
        events: list[AuditEvent] = []
        gate.audit.add_callback(events.append)
        tools = gate.wrap(claude_tools(sup))
        for stop, key in (("TaskStop", "task_id"), ("KillShell", "shell_id")):
            started = await tool(tools, "Bash").call({"command": "sleep 30", "run_in_background": True}, "a1")
            task = re.search(r"\bb[a-z0-9]{8}\b", started.text)
            assert task is not None, started.text
            assert not (await tool(tools, stop).call({key: task.group(0)}, "a1")).is_error
        assert [(e.tool, e.outcome) for e in events] == [
            ("Bash", "ok"),
            ("TaskStop", "ok"),
            ("Bash", "ok"),
            ("KillShell", "ok"),
        ]


async def test_each_agent_gets_its_own_tier_and_new_settings_apply_at_once(tmp_path: Path, workspace: Path) -> None:
    """A gated tool keeps each scope's tier between calls: per agent (a conversation scope is its
    agent's), and read again when the gate's settings are replaced."""
    settings = policy_settings(tmp_path, workspace, '[policy.agents.locked]\ntiers = { exec = "blocked" }\n')
    async with Supervisor(settings) as sup:
        gate = Gate(settings)
        exec_tool = tool(gate.wrap(exec_process_tools(sup)), "exec")
        for scope in ("free", "locked", "free", "locked", "locked\x1fchat-1", "free\x1fchat-1"):
            result = await exec_tool.call({"command": "true"}, scope)
            assert result.is_error == scope.startswith("locked"), scope
        gate.settings = policy_settings(tmp_path, workspace, '[policy.agents.free]\ntiers = { exec = "blocked" }\n')
        assert (await exec_tool.call({"command": "true"}, "free")).is_error
        assert not (await exec_tool.call({"command": "true"}, "locked")).is_error


async def test_an_audited_call_that_raises_is_a_typed_error_result_and_its_event_says_so(
    tmp_path: Path, workspace: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The gate awaits an audited tool's handler itself: a typed error is its error result, a bug
    is InternalError (its traceback in the server log only), and a text-only tool's result is
    text-only, exactly as the tool's own call makes them; each is audited with its outcome."""

    async def refuses(arguments: Any, scope: str) -> ToolResult:
        raise SessionNotFound("no session nope", session_id="nope")

    async def breaks(arguments: Any, scope: str) -> ToolResult:
        raise KeyError("secret-internal-detail")

    async def answers(arguments: Any, scope: str) -> ToolResult:
        return ToolResult("done", {"sessionId": "s1", "state": "exited_ok"})

    gate = Gate(policy_settings(tmp_path, workspace, ""))
    events: list[AuditEvent] = []
    gate.audit.add_callback(events.append)
    specs = [
        ToolSpec("refuses", "", ExecParams, refuses, PermissionTier.NOTIFY),
        ToolSpec("breaks", "", ExecParams, breaks, PermissionTier.NOTIFY),
        ToolSpec("answers", "", ExecParams, answers, PermissionTier.NOTIFY, text_only=True),
    ]
    for spec, gated in zip(specs, gate.wrap(specs), strict=True):
        with caplog.at_level(logging.ERROR):
            caplog.clear()
            # what the wrappers between the gate and the transport get (exit notices, progress)
            result = await gated.handler({"command": "x"}, "a1")
            assert result == await spec.call({"command": "x"}, "a1")
            assert [r.exc_info is not None for r in caplog.records] == ([True, True] if spec.name == "breaks" else [])
    assert [(e.tool, e.outcome, e.process_id, e.state) for e in events] == [
        ("refuses", "error:SessionNotFound", None, None),
        ("breaks", "error:InternalError", None, None),
        ("answers", "ok", "s1", "exited_ok"),
    ]


@pytest.mark.parametrize(
    ("tool_name", "arguments", "summary"),
    [
        ("exec", {"command": "true"}, "exec: true"),
        ("exec", {"command": "x" * 300}, "exec: " + "x" * 200),
        ("exec", {"command": "sleep 1", "workdir": "sub"}, "exec: sleep 1"),
        ("exec", {"command": "sleep 1", "sessionId": "s1"}, "exec: sleep 1 s1"),
        ("exec", {"command": None, "action": "list"}, "exec: list"),
        ("process.run", {"command": "ls", "args": ["-l", 3]}, "process.run: ls -l 3"),
        ("t", {"cmd": ["a", "b"], "proc_id": "p"}, "t: a b p"),
        ("process", {"action": "kill", "sessionId": "s1", "signal": "SIGKILL"}, "process: kill s1 SIGKILL"),
        ("t", {"command": 5}, "t: 5"),
        ("t", {}, "t"),
    ],
)
def test_a_calls_summary_names_what_it_runs_and_the_session_it_touches(
    tool_name: str, arguments: dict[str, Any], summary: str
) -> None:
    assert call_summary(tool_name, arguments) == summary


def test_a_lone_command_is_audited_whole_up_to_the_budget_its_name_leaves() -> None:
    from procpilot.contract import AUDIT_ARGUMENTS_BUDGET, audit_arguments

    room = AUDIT_ARGUMENTS_BUDGET - 1 - len("command")
    assert audit_arguments({"command": "x" * room}) == {"command": "x" * room}
    assert audit_arguments({"command": "x" * (room + 1)}) == {"command": "x" * room + "…[1 more chars]"}
    assert audit_arguments({"command": "ls", "env": {"A": "secret"}}) == {"command": "ls", "env": {"A": "<redacted>"}}
    assert audit_arguments({"command": "ls", "timeout": None}) == {"command": "ls"}
