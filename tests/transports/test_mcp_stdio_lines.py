"""A real ``procpilot mcp`` on pipes answers every line it is sent, whatever the line, and goes on
serving (issue 20, finding 7): a parse error, a line nested past the parser's bound (on the direct
path's markers too), a lone surrogate, bytes that are not UTF-8, JSON that is no JSON-RPC
message, and a line past the 16 MiB cap each get a JSON-RPC error with the id when it can be read."""

from __future__ import annotations

import json
import os
import select
from collections.abc import Iterator
from typing import Any

import pytest
from mcp_types import JSONRPCResponse

from tests.transports.test_mcp_direct import Bare

PARSE_ERROR, INVALID_REQUEST = -32700, -32600  # JSON-RPC 2.0's codes

ECHO = {"name": "exec", "arguments": {"command": "echo still-serving"}}
_CALL = b'{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":'


def _deep(request_id: int, method: bytes, depth: int) -> bytes:
    return b'{"jsonrpc":"2.0","id":%d,"method":"%s","params":{"a":' % (request_id, method) + (
        b"[" * depth + b'"tools/call"' + b"]" * depth + b"}}"
    )


HOSTILE: dict[str, tuple[bytes, object, int]] = {
    # line, the id the error must carry, its code
    "not JSON": (b"not json at all", None, PARSE_ERROR),
    "nested 100,000 deep, a tools/call": (_deep(11, b"tools/call", 100_000), 11, PARSE_ERROR),
    "nested 50,000 deep, an initialize": (_deep(12, b"initialize", 50_000), 12, PARSE_ERROR),
    "a lone surrogate in the id": (
        b'{"jsonrpc":"2.0","id":"\\ud800","method":"tools/call","params":{"name":"exec","arguments":{}}}',
        "\ufffd",
        PARSE_ERROR,
    ),
    "a lone surrogate in the arguments": (
        _CALL % 13 + b'{"name":"exec","arguments":{"command":"echo \\ud800"}}}',
        13,
        PARSE_ERROR,
    ),
    "bytes that are not UTF-8": (_CALL % 14 + b'{"name":"exec","arguments":{"command":"echo \xff"}}}', 14, PARSE_ERROR),
    "JSON, not a message": (b"[1, 2]", None, INVALID_REQUEST),
    "a request without a method": (b'{"jsonrpc":"2.0","id":15}', 15, INVALID_REQUEST),
}


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Bare]]:
    """One server for the module (each start costs seconds), replaced when a line has ended it
    (started here, before the leak check of the first test counts descriptors)."""
    running = [Bare(tmp_path_factory.mktemp("mcp-lines"), "2025-06-18")]
    yield running
    running[-1].close()


@pytest.fixture
def bare(servers: list[Bare], tmp_path_factory: pytest.TempPathFactory) -> Bare:
    if servers[-1].server.poll() is not None:  # ended by the last test's line, which has failed
        servers.append(Bare(tmp_path_factory.mktemp("mcp-lines"), "2025-06-18"))
    return servers[-1]


def _send_raw(bare: Bare, line: bytes) -> None:
    assert bare.server.stdin is not None
    bare.server.stdin.write(line + b"\n")
    bare.server.stdin.flush()


def _still_serving(bare: Bare, request_id: int) -> None:
    answer = bare.call(request_id, ECHO)
    assert answer["id"] == request_id and "still-serving" in answer["result"]["content"][0]["text"], answer


@pytest.mark.parametrize("name", list(HOSTILE))
def test_every_line_is_answered_and_the_server_goes_on(bare: Bare, name: str) -> None:
    line, request_id, code = HOSTILE[name]
    _send_raw(bare, line)
    # A bounded wait: a line the server leaves unanswered fails here instead of hanging.
    error: dict[str, Any] = bare.reply(timeout=10)
    assert error["jsonrpc"] == "2.0" and error["id"] == request_id, error
    assert error["error"]["code"] == code and error["error"]["message"], error
    _still_serving(bare, 99)


def test_a_line_past_the_cap_is_answered_at_once_and_the_server_goes_on(bare: Bare) -> None:
    # 17 MiB, past the 16 MiB cap: refused, with its id, before its end has even been sent.
    head = _CALL % 21 + b'{"name":"exec","arguments":{"command":"echo '
    assert bare.server.stdin is not None
    bare.server.stdin.write(head + b"x" * (17 << 20))
    bare.server.stdin.flush()
    error = bare.reply(timeout=30)
    assert error["id"] == 21 and error["error"]["code"] == INVALID_REQUEST, error
    assert "longer than" in error["error"]["message"]
    _send_raw(bare, b'"}}}')  # the rest of that line: dropped, not answered again
    _still_serving(bare, 22)


def test_a_client_that_does_not_read_its_replies_is_not_read_either(bare: Bare) -> None:
    # Each line is refused with a reply; once the client's stdout is full, the server must stop
    # reading its stdin (so the client's writes block), not take in its lines without end.
    line = b"x" * 999 + b"\n"  # under PIPE_BUF: a non-blocking write takes all of it or none
    assert bare.server.stdin is not None and bare.server.stdout is not None
    fd = bare.server.stdin.fileno()
    os.set_blocking(fd, False)
    sent = 0
    try:
        while sent < 8 << 20:
            try:
                sent += os.write(fd, line)
            except BlockingIOError:
                if not select.select([], [fd], [], 0.5)[1]:
                    break  # the server no longer reads
    finally:
        os.set_blocking(fd, True)
    # about 600 refusals fill a 64 KiB pipe; then the server's read buffer and its stdin pipe
    assert sent < 2 << 20, f"{sent} bytes taken from a client that reads no reply"
    for _ in range(sent // len(line)):
        assert bare.reply()["error"]["code"] == PARSE_ERROR
    _still_serving(bare, 31)


def test_the_id_of_an_unreadable_line_is_read_from_its_head_only() -> None:
    from procpilot.transports.mcp_refusals import read_id

    assert read_id(b'{"jsonrpc":"2.0","id":"a\\"b","method":') == 'a"b'
    assert read_id(b'  {"id": -3, "jsonrpc"') == -3
    # an "id" inside params is not the request's
    assert read_id(b'{"jsonrpc":"2.0","params":{"id":5},"id":6') is None
    assert read_id(b'{"jsonrpc":"2.0","method":"x","id":true}') is None
    assert read_id(b'{"pad":"' + b"x" * 5000 + b'","id":7}') is None  # past the 4 KiB head


def test_a_reply_the_sdk_made_with_a_lone_surrogate_is_written() -> None:
    from procpilot.transports.mcp_stdio import reply_line

    made = JSONRPCResponse(jsonrpc="2.0", id=1, result={"cwd": "/ws/\udcff"})
    line = reply_line(made)
    assert line.endswith(b"\n") and json.loads(line)["result"] == {"cwd": "/ws/\ufffd"}
    plain = JSONRPCResponse(jsonrpc="2.0", id=2, result={"ok": "é"})  # the SDK's own bytes, as before
    assert reply_line(plain) == (plain.model_dump_json(by_alias=True, exclude_unset=True) + "\n").encode()
