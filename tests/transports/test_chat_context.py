"""The chat a call comes from (procpilot/chat_context.py), told by its caller over a real daemon:
the REST header and MCP's ``_meta``, recorded on the audit event, named by the openclaw profile's
elevated refusal as OpenClaw names it, and refused with a typed error when malformed."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest

from procpilot.transports.mcp_results import MODERN
from tests.daemon import PROCPILOT, TOKEN_A, JsonLines, Served, cli_env, start_daemon

CHAT = "provider=telegram session=agent:main:main"
REFUSAL = (
    "ElevationDenied: elevated is not available right now (runtime=direct).\n"
    "Failing gates: elevated_allowed (policy.default.elevated_allowed / policy.agents.<agent>.elevated_allowed)\n"
    "Context: provider=telegram session=agent:main:main\n"
    "Fix-it keys:\n"
    "- policy.default.elevated_allowed\n"
    "- policy.agents.<agent>.elevated_allowed\n"
    "What to do next:\n"
    "- Run without elevated: this agent's policy does not allow leaving its sandbox."
)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    daemon = start_daemon(tmp_path_factory.mktemp("chat"), exec_='profile = "openclaw"')
    yield daemon
    assert daemon.stop() == 0, daemon.log_text()


def _exec(served: Served, chat: str | bytes | list[str] | None, **arguments: Any) -> httpx2.Response:
    values = [chat] if isinstance(chat, str | bytes) else chat or []
    headers = [("X-Procpilot-Context", value) for value in values]
    with served.http() as http:
        return http.post("/v1/tools/exec", json=arguments, headers=httpx2.Headers(headers))


def _audit(served: Served) -> list[dict[str, Any]]:
    lines = (served.root / "state" / "audit.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def test_the_openclaw_elevated_refusal_names_the_chat_it_came_from(served: Served) -> None:
    answer = _exec(served, CHAT, command="echo hi", elevated=True)
    body = answer.json()
    assert (answer.status_code, body["error"]) == (403, "ElevationDenied")  # our type, status and hints
    assert body["text"] == REFUSAL
    assert body["chat"] == {"provider": "telegram", "session": "agent:main:main"}
    assert body["boxed"] is False


def test_an_elevated_refusal_without_a_chat_has_no_context_line(served: Served) -> None:
    body = _exec(served, None, command="echo hi", elevated=True).json()
    assert body["text"] == REFUSAL.replace("Context: provider=telegram session=agent:main:main\n", "")
    assert "chat" not in body
    # Only the parts the caller told, in OpenClaw's order.
    body = _exec(served, "session=agent:main:main", command="echo hi", elevated=True).json()
    assert "\nContext: session=agent:main:main\n" in body["text"]


def test_the_chat_is_recorded_on_the_calls_audit_event(served: Served) -> None:
    ran = _exec(served, "session=agent:main:discord:dm:42 provider=discord", command="echo audited-chat")
    assert ran.status_code == 200, ran.text
    refused = _exec(served, CHAT, command="echo refused-chat", elevated=True)
    assert refused.status_code == 403
    plain = _exec(served, None, command="echo no-chat")
    assert plain.status_code == 200
    events = {e["summary"]: e for e in _audit(served) if e["tool"] == "exec"}
    assert events["exec: echo audited-chat"]["chat"] == {"provider": "discord", "session": "agent:main:discord:dm:42"}
    assert events["exec: echo refused-chat"]["chat"] == {"provider": "telegram", "session": "agent:main:main"}
    assert events["exec: echo refused-chat"]["outcome"] == "error:ElevationDenied"
    assert events["exec: echo no-chat"]["chat"] is None


@pytest.mark.parametrize(
    ("chat", "problem"),
    [
        ("provider=" + "t" * 129, "provider must be 1-128 characters long, not 129"),
        ("provider=tele\tgram", "'gram' is not key=value"),
        ('provider=tele"gram', "provider holds a character outside"),
        ("session=agent:main:main;rm", "session holds a character outside"),
        ("provider=télégram".encode(), "provider holds a character outside"),  # UTF-8 on the wire
        ("provider=", "provider must be 1-128 characters long, not 0"),
        ("channel=general", "unknown key 'channel'"),
        ("provider=a provider=b", "provider is given twice"),
        ("", "it names no part"),
        ("session=" + "s" * 300, "the header is 308 characters long, at most 276"),
        (["provider=a", "session=b"], "the header is sent more than once"),
    ],
)
def test_a_malformed_chat_is_refused_before_the_call_runs(
    served: Served, chat: str | bytes | list[str], problem: str
) -> None:
    marker = served.root / "ws" / "ran"
    answer = _exec(served, chat, command="touch ran")
    body = answer.json()
    assert (answer.status_code, body["error"], body["field"]) == (422, "InvalidArgument", "X-Procpilot-Context")
    assert body["message"].startswith(f"the chat context is invalid: {problem}")
    assert "provider, session" in body["hints"]["fix_context"]
    assert not marker.exists()


async def test_mcp_tells_the_chat_in_meta_on_every_call(served: Served) -> None:
    """Over the daemon's /mcp: the SDK's path reads ``_meta``, and a call the fast path would
    answer (the same envelope again) is not answered without its chat."""
    meta: Any = {"procpilot/context": {"provider": "telegram", "session": "agent:main:main"}}
    async with served.mcp() as client:
        for _ in range(3):
            result = await client.call_tool("exec", {"command": "echo hi", "elevated": True}, meta=meta)
            assert result.is_error
            assert "\nContext: provider=telegram session=agent:main:main\n" in result.content[0].text  # type: ignore[union-attr]
        for bad in ({"provider": "telegram", "session": "a b"}, "provider=telegram", {"provider": 7}, {}):
            result = await client.call_tool("exec", {"command": "echo mcp-bad-chat"}, meta={"procpilot/context": bad})
            data = result.structured_content or {}
            assert result.is_error and (data["error"], data["field"]) == ("InvalidArgument", "_meta.procpilot/context")
        result = await client.call_tool("exec", {"command": "echo mcp-chat"}, meta=meta)
        assert not result.is_error
    events = {e["summary"]: e for e in _audit(served) if e["tool"] == "exec"}
    assert events["exec: echo mcp-chat"]["chat"] == {"provider": "telegram", "session": "agent:main:main"}
    assert "exec: echo mcp-bad-chat" not in events  # refused before the gate: nothing ran


class _Stdio(JsonLines):
    """``procpilot mcp --profile openclaw`` spoken to in 2026-07-28's era, every request under
    one envelope that tells the chat: the direct path (transports/mcp_direct.py) takes a call
    whose envelope the SDK has accepted, and this one it accepted with server/discover."""

    def __init__(self, tmp_path: Path) -> None:
        super().__init__()
        env = cli_env(
            HOME=str(tmp_path), PROCPILOT_STATE_DIR=str(tmp_path / "state"), PROCPILOT_WORKSPACE=str(tmp_path)
        )
        args = [PROCPILOT, "mcp", "--agent", "t", "--profile", "openclaw"]
        self.server = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
        self.envelope = {
            "io.modelcontextprotocol/protocolVersion": MODERN,
            "io.modelcontextprotocol/clientInfo": {"name": "t", "version": "0"},
            "io.modelcontextprotocol/clientCapabilities": {},
            "procpilot/context": {"provider": "telegram", "session": "agent:main:main"},
        }
        self.send({"jsonrpc": "2.0", "id": 0, "method": "server/discover", "params": {"_meta": self.envelope}})
        assert "result" in self.reply()


def test_stdio_answers_no_call_telling_a_chat_without_reading_it(tmp_path: Path) -> None:
    client = _Stdio(tmp_path)
    try:
        for request_id in (1, 2, 3):
            params = {"name": "exec", "arguments": {"command": "echo hi", "elevated": True}, "_meta": client.envelope}
            client.send({"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params})
            result = client.reply()["result"]
            assert result["isError"]
            assert "\nContext: provider=telegram session=agent:main:main\n" in result["content"][0]["text"]
    finally:
        assert client.server.stdin is not None and client.server.stdout is not None
        client.server.stdin.close()
        assert client.server.wait(timeout=30) == 0
        client.server.stdout.close()


def test_the_openapi_document_names_the_header(served: Served) -> None:
    with served.http() as http:
        document = http.get("/openapi.json").json()
    parameters = document["paths"]["/v1/tools/exec"]["post"]["parameters"]
    header = next(p for p in parameters if p["in"] == "header")
    assert (header["name"], header["schema"]["maxLength"]) == ("X-Procpilot-Context", 276)


def test_the_python_client_tells_its_chat_on_every_call(served: Served) -> None:
    """`Client(chat=...)`: a gateway holding one client per chat has each call recorded with it;
    a malformed chat is refused by the client itself, as the daemon would refuse it, before any
    request."""
    from procpilot import Client, InvalidArgument

    chat = {"provider": "slack", "session": "agent:main:slack:c42"}
    with Client(served.url, TOKEN_A, chat=chat) as client:
        assert client.exec("echo from-the-client").data["exitCode"] == 0
    events = {e["summary"]: e for e in _audit(served) if e["tool"] == "exec"}
    assert events["exec: echo from-the-client"]["chat"] == chat
    with pytest.raises(InvalidArgument) as refused:
        Client(served.url, TOKEN_A, chat={"provider": "bad value"})
    assert refused.value.details["field"] == "X-Procpilot-Context"
    assert "fix_context" in refused.value.hints


def test_the_cli_and_the_client_take_the_chat_from_procpilot_chat(served: Served) -> None:
    """PROCPILOT_CHAT, beside PROCPILOT_URL and PROCPILOT_TOKEN: a gateway that runs the CLI for a
    chat says it once in the environment. A malformed one is a typed error, not a traceback, and
    nothing runs."""
    env = cli_env(HOME="/nonexistent", PROCPILOT_URL=served.url, PROCPILOT_TOKEN=TOKEN_A)
    env["PROCPILOT_CHAT"] = "provider=cli session=agent:main:cli"
    ran = subprocess.run(
        [PROCPILOT, "run", "echo from-the-cli"], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout == "from-the-cli\n"
    told = [e for e in _audit(served) if e["summary"].endswith("echo from-the-cli")]
    assert told and all(e["chat"] == {"provider": "cli", "session": "agent:main:cli"} for e in told)
    env["PROCPILOT_CHAT"] = "provider=bad value"
    refused = subprocess.run(
        [PROCPILOT, "run", "echo never-from-the-cli"], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert refused.returncode != 0
    assert "InvalidArgument" in refused.stderr and "Traceback" not in refused.stderr
    assert not [e for e in _audit(served) if "never-from-the-cli" in e["summary"]]
