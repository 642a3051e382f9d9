"""A request the daemon refuses on /mcp before the MCP SDK sees it (too large, no token, not JSON)
reaches an MCP client as a JSON-RPC error with the typed error's name, message and hint, as it
does over stdio, not as "Server returned an error response" (issue 23, finding 7)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from mcp.shared.exceptions import MCPError

from tests.daemon import TOKEN_A, Served, start_daemon


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    daemon = start_daemon(tmp_path_factory.mktemp("refusals"))
    yield daemon
    assert daemon.stop() == 0, daemon.log_text()


async def test_a_too_large_call_is_a_typed_json_rpc_error(served: Served) -> None:
    async with served.mcp(TOKEN_A) as client:
        with pytest.raises(MCPError) as refused:
            await client.call_tool("exec", {"command": "echo " + "y" * 5_000_000})
        said = str(refused.value)
        assert "RequestTooLarge" in said and "bytes" in said, said
        assert "Send less at once" in said, said  # the hint
        assert "Server returned an error response" not in said
        # The connection is still good for the next call.
        result = await client.call_tool("exec", {"command": "echo still-here"})
        assert "still-here" in result.content[0].text  # type: ignore[union-attr]


async def test_no_token_and_not_json_are_json_rpc_errors(served: Served) -> None:
    with pytest.raises(Exception) as unauthorized:  # noqa: PT011 - the SDK wraps it in its own group
        async with served.mcp("not-a-token") as client:
            await client.list_tools()
    assert "Unauthorized" in repr(unauthorized.value) or "Unauthorized" in str(unauthorized.getrepr()), unauthorized
    headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
    async with served.ahttp(None) as nobody:
        refused = await nobody.post("/mcp", content=b"{}", headers=headers)
    assert refused.status_code == 401
    error = refused.json()["error"]
    assert refused.json()["jsonrpc"] == "2.0" and "Unauthorized" in error["message"]
    assert error["data"]["error"] == "Unauthorized"
    async with served.ahttp(TOKEN_A) as http:
        broken = await http.post("/mcp", content=b"{not json", headers=headers)
    assert broken.status_code == 400
    assert broken.json()["jsonrpc"] == "2.0" and broken.json()["error"]["message"], broken.text
