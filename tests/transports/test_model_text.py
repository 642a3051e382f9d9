"""What the text leaves out (issue 23, item 4), read as a model gets it over a real MCP transport.

Each finding is judged in both forms on its own: the text (what most clients show) and the
structured content as JSON (what Claude Code hands its model).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from mcp import Client

from tests.transports.test_model_view import as_claude_code_reads_it, stdio, text_of


async def call(client: Client, tool: str, **arguments: Any) -> tuple[Any, str, str, dict[str, Any]]:
    result = await client.call_tool(tool, arguments)
    structured = result.structured_content or {}
    return result, text_of(result), as_claude_code_reads_it(structured), structured


async def test_an_exec_that_backgrounds_at_a_prompt_says_it_waits_for_input(tmp_path: Path) -> None:
    # Finding: exec of a command waiting on stdin said only "running in the background".
    async with Client(stdio(tmp_path), mode="legacy") as client:
        _, text, seen, data = await call(client, "exec", command="read line; echo got $line", yieldMs=800)
        assert data["waitingForInput"] is True
        assert "waiting for input on stdin" in text
        assert "waiting for input on stdin" in data["note"] and "process write" in seen
        await call(client, "process", action="remove", sessionId=data["sessionId"])


async def test_python_output_reaches_wait_as_it_is_printed(tmp_path: Path) -> None:
    # Finding: `python3 -m http.server` in the background printed nothing for seconds (stdout
    # block-buffered into a pipe) and a wait for its banner timed out.
    script = "import time; print('serving', flush=False); time.sleep(30)"
    async with Client(stdio(tmp_path), mode="legacy") as client:
        _, _, _, started = await call(client, "exec", command=f'python3 -c "{script}"', background=True)
        sid = started["sessionId"]
        _, text, _, data = await call(client, "process", action="wait", sessionId=sid, pattern="serving", timeout=5000)
        assert data["reason"] == "pattern", text
        await call(client, "process", action="remove", sessionId=sid)


async def test_a_wait_that_times_out_on_silence_says_why(tmp_path: Path) -> None:
    # Finding: a wait timing out with an empty tail gave no hint of buffering.
    async with Client(stdio(tmp_path), mode="legacy") as client:
        _, _, _, started = await call(client, "exec", command="sleep 30", background=True)
        sid = started["sessionId"]
        _, text, seen, data = await call(client, "process", action="wait", sessionId=sid, timeout=200)
        assert data["reason"] == "timeout"
        for form in (text, data["note"]):
            assert "no output yet" in form and "buffering" in form, form
        assert "buffering" in seen
        await call(client, "process", action="remove", sessionId=sid)


async def test_wait_patterns_match_at_line_starts(tmp_path: Path) -> None:
    # Finding: `^42` missed a REPL's line "42" (patterns were not multiline).
    async with Client(stdio(tmp_path), mode="legacy") as client:
        _, _, _, started = await call(client, "exec", command="printf '>>> 6*7\\n42\\n'; sleep 30", background=True)
        sid = started["sessionId"]
        _, text, _, data = await call(client, "process", action="wait", sessionId=sid, pattern="^42$", timeout=5000)
        assert data["reason"] == "pattern" and data["match"] == "42", text
        assert "pattern matched: '42'" in text
        await call(client, "process", action="remove", sessionId=sid)


async def test_a_kill_says_what_it_sent_and_when_without_stuttering(tmp_path: Path) -> None:
    # Findings: kills and timeouts did not say which signals were sent; "killed: killed (SIGTERM)".
    async with Client(stdio(tmp_path), mode="legacy") as client:
        _, _, _, started = await call(client, "exec", command="sleep 30", background=True)
        _, text, seen, data = await call(client, "process", action="kill", sessionId=started["sessionId"])
        assert re.search(r"SIGTERM sent at \d+ ms", text), text
        assert "killed: killed" not in text and "killed: killed" not in seen
        assert re.search(r"SIGTERM sent at \d+ ms", data["note"])
        assert data["signalsSent"][0]["signal"] == "SIGTERM" and data["signalsSent"][0]["atMs"] >= 0
        # A tree that ignores SIGTERM: the SIGKILL after the grace period is told too.
        _, text, seen, data = await call(client, "exec", command="trap '' TERM; sleep 30", timeout=1)
        assert re.search(r"SIGTERM sent at \d+ ms, then SIGKILL sent at \d+ ms", text), text
        assert [s["signal"] for s in data["signalsSent"]] == ["SIGTERM", "SIGKILL"]
        assert "SIGKILL sent at" in data["note"]


async def test_a_misspelled_argument_gets_a_did_you_mean(tmp_path: Path) -> None:
    # Finding: misspelled argument names (`yieldms`) got no "did you mean".
    async with Client(stdio(tmp_path), mode="legacy") as client:
        result, text, _, _ = await call(client, "exec", command="true", yieldms=10)
        assert result.is_error
        assert "did you mean 'yieldMs'?" in text
        assert "Pass 'yieldMs' instead of 'yieldms'." in text


async def test_hints_read_as_actions_not_as_tool_names(tmp_path: Path) -> None:
    # Finding: hint keys such as `list_processes` looked like tool names in the text.
    async with Client(stdio(tmp_path), mode="legacy") as client:
        result, text, _, _ = await call(client, "process", action="poll", sessionId="nosuch")
        assert result.is_error and "What to do next" in text
        hints = text.split("What to do next:\n", 1)[1].splitlines()
        assert hints and all(not re.match(r"- [a-z]+_[a-z_]+:", line) for line in hints), hints
        assert "list_processes" not in text


async def test_an_empty_log_says_it_is_empty(tmp_path: Path) -> None:
    # Finding: an empty log said "showing the last 0 of 0 lines".
    async with Client(stdio(tmp_path), mode="legacy") as client:
        _, _, _, started = await call(client, "exec", command="sleep 30", background=True)
        sid = started["sessionId"]
        _, text, seen, data = await call(client, "process", action="log", sessionId=sid)
        assert "0 of 0" not in text and "0 of 0" not in seen
        assert "empty" in text and "empty" in data["note"]
        await call(client, "process", action="remove", sessionId=sid)
