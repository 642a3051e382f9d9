"""What a model reads of a result, over a real MCP transport (issue 23, items 1 and 2).

Clients choose which form of a result reaches the model: Claude Code hands it
``JSON.stringify(structuredContent)`` and drops the text, others show the text. So each form is
judged here on its own: bounded, holding the start and the end of the output, the state, and
what to do next; and exits the agent was not told of head the next result of any tool.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from tests.daemon import start_daemon
from tests.transports.test_cli_mcp import PROCPILOT, server_env, start_http

BUDGET = 30_000  # the default result budget, in characters of output
SLACK = 2_000  # the status line, the marker and the fields around the output
# In JSON each newline is two characters: the structured form of 30,000 characters of short lines
# is up to a quarter longer. Either form stays far under Claude Code's 25,000 tokens.
JSON_BOUND = (BUDGET + SLACK) * 5 // 4


MARKER = r"…\[([\d,]+) lines, ([\d,]+) characters cut here; (process log [^\]]+) reads them\]…"


def as_claude_code_reads_it(structured: dict[str, Any] | None) -> str:
    """What Claude Code gives its model for a non-error result: the structured content as JSON."""
    return json.dumps(structured, ensure_ascii=False, separators=(",", ":"))


def text_of(result: Any) -> str:
    return "".join(part.text for part in result.content if part.type == "text")


def stdio(tmp_path: Path) -> StdioServerParameters:
    return StdioServerParameters(command=PROCPILOT, args=["mcp", "--agent", "a1"], env=server_env(tmp_path))


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_a_flood_reaches_the_model_whole_ended_and_bounded_in_each_form(tmp_path: Path, mode: str) -> None:
    # Finding 1: `exec seq 1 200000` was a 458 KB reply, only its tail shown, and Claude Code
    # replaced it by an error for being over 25,000 tokens.
    async with Client(stdio(tmp_path), mode=mode) as client:
        result = await client.call_tool("exec", {"command": "seq 1 200000"})
        assert not result.is_error
        text, structured = text_of(result), result.structured_content or {}
        seen = as_claude_code_reads_it(structured)
        for form, output in (("text", text), ("json", structured["output"])):
            assert output.startswith("1\n2\n3\n"), form  # the first lines, as a test run's configuration
            assert "199999\n200000" in output, form  # and the last ones
            marker = re.search(MARKER, output)
            assert marker is not None, form
        assert len(text) <= BUDGET + SLACK and len(seen) <= JSON_BOUND
        assert "[done: exit code 0" in text
        assert structured["note"].startswith("done: exit code 0") and structured["next"] == marker.group(3)
        # The marker's call reads exactly the lines it stands for.
        offset, limit = (int(n) for n in re.findall(r"(?:offset|limit)=(\d+)", structured["next"]))
        shown = structured["output"].split("\n")
        first_cut = int(shown[shown.index(marker.group(0)) - 1]) + 1  # the line after the head's last
        assert offset == first_cut - 1  # lines are 0-based; seq's line N holds N
        assert offset + limit == int(shown[shown.index(marker.group(0)) + 1]) - 1
        assert int(marker.group(1).replace(",", "")) == limit
        page = await client.call_tool(
            "process", {"action": "log", "sessionId": structured["sessionId"], "offset": offset, "limit": 3}
        )
        assert (page.structured_content or {})["output"] == f"{first_cut}\n{first_cut + 1}\n{first_cut + 2}"


async def test_every_face_keeps_the_budget(tmp_path: Path) -> None:
    # poll of a finished flood, and log of its whole range: both ends, the budget, a next call.
    async with Client(stdio(tmp_path), mode="legacy") as client:
        started = await client.call_tool("exec", {"command": "seq 1 200000; sleep 0.3", "yieldMs": 10})
        sid = (started.structured_content or {})["sessionId"]
        await client.call_tool("process", {"action": "wait", "sessionId": sid, "timeout": 20_000})
        for args in ({"action": "poll"}, {"action": "log", "offset": 0}):
            result = await client.call_tool("process", {"sessionId": sid, **args})
            structured = result.structured_content or {}
            assert len(text_of(result)) <= BUDGET + SLACK, args
            assert len(as_claude_code_reads_it(structured)) <= JSON_BOUND, args
            assert structured["output"].startswith("1\n2\n") and "200000" in structured["output"], args
            assert structured["next"].startswith(f"process log sessionId={sid}"), args


async def test_binary_output_is_said_never_silently_empty(tmp_path: Path) -> None:
    # Finding 1 (and item 4): 100,000 NUL bytes arrived as "output": "" with no word of why.
    async with Client(stdio(tmp_path), mode="legacy") as client:
        result = await client.call_tool("exec", {"command": "head -c 100000 /dev/zero"})
        structured = result.structured_content or {}
        for form in (text_of(result), structured["output"]):
            assert "100,000 bytes of binary output" in form and "not shown" in form


async def test_an_exit_over_stdio_is_pushed_and_heads_the_next_result_once(tmp_path: Path) -> None:
    # Finding 2: over stdio "its exit is not announced, so wait or poll". A handshake-era client
    # (Claude Code, Codex) is pushed the exit at once, and its model reads it in the next result.
    pushed: list[dict[str, Any]] = []
    arrived = anyio.Event()

    async def on_message(message: Any) -> None:
        params = getattr(message, "params", None)
        if getattr(message, "method", None) == "notifications/message" and params.logger == "procpilot/exit":
            pushed.append(params.data)
            arrived.set()

    async with Client(stdio(tmp_path), mode="legacy", message_handler=on_message) as client:
        started = await client.call_tool("exec", {"command": "exit 3", "background": True})
        sid = (started.structured_content or {})["sessionId"]
        assert "not announced" not in text_of(started)
        with anyio.fail_after(10):
            await arrived.wait()
        assert pushed[0]["sessionId"] == sid and pushed[0]["exitCode"] == 3
        after = await client.call_tool("exec", {"command": "echo next"})
        text, structured = text_of(after), after.structured_content or {}
        first = text.split("\n", 1)[0]
        assert first.startswith(f"[session {sid} (exit 3) ended: error, exit code 3")
        assert f"process log sessionId={sid}" in first
        assert [e["sessionId"] for e in structured["exits"]] == [sid]
        assert structured["exits"][0]["exitCode"] == 3 and structured["output"] == "next\n"
        again = await client.call_tool("exec", {"command": "true"})
        assert sid not in text_of(again) and "exits" not in (again.structured_content or {})


async def test_an_exit_over_stdio_heads_the_next_result_for_the_default_client(tmp_path: Path) -> None:
    # The SDK's default client speaks 2026-07-28 over stdio, where a server may not push a log
    # notification unasked: the next result of any tool tells it.
    async with Client(stdio(tmp_path)) as client:
        started = await client.call_tool("exec", {"command": "sleep 0.2", "background": True})
        sid = (started.structured_content or {})["sessionId"]
        # No wait or poll: a foreground command waits until the server has reaped the process.
        pid = (started.structured_content or {})["pid"]
        results = [
            await client.call_tool("exec", {"command": f"while kill -0 {pid} 2>/dev/null; do sleep 0.01; done"}),
            await client.call_tool("exec", {"command": "true"}),
        ]
        telling = [r for r in results if "exits" in (r.structured_content or {})]
        assert len(telling) == 1
        assert text_of(telling[0]).startswith(f"[session {sid} (sleep 0.2) ended: done, exit code 0")


async def test_an_exit_over_http_heads_the_next_result_for_the_default_client(tmp_path: Path) -> None:
    # Finding 2: the SDK's default client (mode="auto") heard nothing of an exit over HTTP.
    proc, url = start_http(tmp_path)
    try:
        async with Client(url) as client:
            started = await client.call_tool("exec", {"command": "sleep 0.2", "background": True})
            structured = started.structured_content or {}
            sid, pid = structured["sessionId"], structured["pid"]
            # Ends once the background session's process is gone (reaped by the server): the
            # exit is told by this call's result, or else by the next one; once.
            results = [
                await client.call_tool("exec", {"command": f"while kill -0 {pid} 2>/dev/null; do sleep 0.01; done"}),
                await client.call_tool("exec", {"command": "true"}),
            ]
            telling = [r for r in results if "exits" in (r.structured_content or {})]
            assert len(telling) == 1
            assert text_of(telling[0]).startswith(f"[session {sid} (sleep 0.2) ended: done, exit code 0")
            assert [e["sessionId"] for e in (telling[0].structured_content or {})["exits"]] == [sid]
    finally:
        proc.terminate()
        proc.wait(10)
        assert proc.stderr is not None
        proc.stderr.close()


async def test_an_exit_over_the_daemons_mcp_heads_the_next_result_for_the_default_client(tmp_path: Path) -> None:
    # Finding 2, against `procpilot serve`: its MCP endpoint with the SDK 2.3 client's default mode,
    # which heard no notification of an exit.
    daemon = start_daemon(tmp_path)
    try:
        async with daemon.mcp() as client:  # mode="auto"
            started = await client.call_tool("exec", {"command": "sleep 0.2", "background": True})
            sid, pid = ((started.structured_content or {})[k] for k in ("sessionId", "pid"))
            # A foreground command that ends once the server has reaped the session's process.
            results = [
                await client.call_tool("exec", {"command": f"while kill -0 {pid} 2>/dev/null; do sleep 0.01; done"}),
                await client.call_tool("exec", {"command": "true"}),
                await client.call_tool("exec", {"command": "true"}),
            ]
            telling = [r for r in results if "exits" in (r.structured_content or {})]
            assert len(telling) == 1
            assert text_of(telling[0]).startswith(f"[session {sid} (sleep 0.2) ended: done, exit code 0")
    finally:
        assert daemon.stop() == 0, daemon.log_text()
