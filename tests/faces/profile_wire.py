"""A harness profile as its MCP client meets it: the SDK's client in memory, and a real
``procpilot mcp --profile NAME`` spoken to over its stdio pipes (where calls take the direct path,
transports/mcp_direct.py, unless a ``_meta`` sends them through the SDK)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from mcp import Client

from procpilot.config import load_settings
from procpilot.engine.supervisor import Supervisor
from procpilot.faces.all_tools import all_tools
from procpilot.transports.mcp import build_mcp_server
from tests.daemon import JsonLines, cli_env

Connect = Callable[[], Client]
SCOPE = "a"


async def profile_supervisor(tmp_path: Path, workspace: Path, profile: str) -> AsyncIterator[Supervisor]:
    # A home of its own: Codex's login shell (-lc) reads ~/.profile, and this machine's may not be quick.
    settings = load_settings(
        env={},
        state_dir=tmp_path / "state",
        workspace_root=workspace,
        exec={"profile": profile},
        base_env={"set": {"HOME": str(tmp_path)}},
    )
    async with Supervisor(settings) as sup:
        yield sup


def connect(sup: Supervisor) -> Connect:
    """A client factory: the SDK's client must be entered and exited in the test's own task."""
    server = build_mcp_server(all_tools(sup), scope=SCOPE)
    return lambda: Client(server)


async def call(client: Client, tool: str, **args: Any) -> tuple[str, bool]:
    """The text of a result, and whether it is an error; a profile's result has nothing else."""
    result = await client.call_tool(tool, args)
    assert result.structured_content is None, "a profile's result is its text alone"
    assert len(result.content) == 1
    return result.content[0].text, bool(result.is_error)  # type: ignore[union-attr]


class StdioServer(JsonLines):
    """A real ``procpilot mcp --profile NAME`` and a bare JSON-RPC client on its pipes."""

    def __init__(self, tmp_path: Path, profile: str) -> None:
        super().__init__()
        env = cli_env(
            HOME=str(tmp_path), PROCPILOT_STATE_DIR=str(tmp_path / "state"), PROCPILOT_WORKSPACE=str(tmp_path)
        )
        args = [str(Path(sys.executable).parent / "procpilot"), "mcp", "--agent", "t", "--profile", profile]
        self.server = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)

    def handshake(self) -> None:
        hello = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}
        self.send({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": hello})
        # The model is given its harness's own tools: no instructions speak of exec or process.
        assert "instructions" not in self.reply()["result"]
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})

    def request(self, request_id: int, method: str, params: dict[str, Any]) -> dict[str, Any]:
        self.send({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params})
        reply = self.reply()
        assert reply["id"] == request_id
        return dict(reply["result"])

    def close(self) -> None:
        assert self.server.stdin is not None and self.server.stdout is not None
        self.server.stdin.close()
        assert self.server.wait(timeout=30) == 0
        self.server.stdout.close()


def assert_text_only_on_both_paths(tmp_path: Path, profile: str, tool: str, arguments: dict[str, Any]) -> list[str]:
    """Lists the tools and calls ``tool`` on the direct path and through the SDK (a ``_meta``
    keeps it there): no output schema, no structured content either way. Returns both texts."""
    server = StdioServer(tmp_path, profile)
    try:
        server.handshake()
        listed = server.request(1, "tools/list", {})["tools"]
        mine = [t for t in listed if not t["name"].startswith("process.")]
        assert mine and all("outputSchema" not in t for t in mine)
        texts = []
        for request_id, extra in ((2, {}), (3, {"_meta": {}})):
            result = server.request(request_id, "tools/call", {"name": tool, "arguments": arguments, **extra})
            assert set(result) == {"content", "isError"}, result
            assert [c["type"] for c in result["content"]] == ["text"]
            texts.append(result["content"][0]["text"])
        return texts
    finally:
        server.close()
