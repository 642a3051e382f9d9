"""What a client sends has deadlines: a body half sent, a body nobody reads, the head after it.

Each test reproduces a way one slow client held what others need (issue 20, finding 3: sixteen
slow login bodies locked every operator out), against a real `procpilot serve`.
"""

from __future__ import annotations

import contextlib
import json
import socket
import time
from collections.abc import Iterator

import pytest

from tests.daemon import TOKEN_A, TOKEN_B, Served, cleanup, post, start_daemon

BODY_TIMEOUT = 3  # seconds; [server] body_timeout_sec of the daemon below
HEADER_TIMEOUT = 2


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    limits = f"body_timeout_sec = {BODY_TIMEOUT}\nheader_timeout_sec = {HEADER_TIMEOUT}\nrequests_per_agent = 2"
    daemon = start_daemon(tmp_path_factory.mktemp("deadlines"), server=limits)
    yield daemon
    assert daemon.stop() == 0, daemon.log_text()


def _connect(served: Served) -> socket.socket:
    host, port = served.url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=15)  # a hang fails the test, late


def _half_a_body(served: Served, path: str, token: str | None = None, declared: int = 1000) -> socket.socket:
    """A connection that sent a POST's head and half of the ``declared`` body, and then nothing."""
    host = served.url.removeprefix("http://")
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\n{auth}Content-Type: application/json\r\n"
        f"Content-Length: {declared}\r\n\r\n"
    )
    sock = _connect(served)
    sock.sendall(head.encode() + b'{"token": "' + b"x" * 500)
    return sock


def _response(sock: socket.socket) -> tuple[bytes, dict[str, object]]:
    """The status line and the JSON body of the one response on ``sock``."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"closed before a response: {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    fields = dict(line.partition(b": ")[::2] for line in head.lower().split(b"\r\n")[1:])
    while len(body) < int(fields[b"content-length"]):
        body += sock.recv(65536)
    return head.split(b"\r\n")[0], json.loads(body)


def _closed_by_daemon(sock: socket.socket) -> bool:
    """The daemon closed ``sock`` (before its 15 s socket timeout)."""
    try:
        return sock.recv(100) == b""
    except ConnectionResetError:
        return True


def _trickled_until_closed(sock: socket.socket, within: float) -> bool:
    """Send one more byte every half second, as a slowloris does (every byte used to put off
    uvicorn's keep-alive timeout), until the daemon closes ``sock``: True if it did ``within`` s."""
    deadline = time.monotonic() + within
    sock.settimeout(0.5)
    try:
        while time.monotonic() < deadline:
            sock.sendall(b"x")
            with contextlib.suppress(TimeoutError):
                if sock.recv(100) == b"":
                    return True
    except (BrokenPipeError, ConnectionResetError):
        return True
    return False


def test_slow_login_bodies_leave_a_real_login_and_an_agents_calls_served(served: Served) -> None:
    # The finding: 20 logins sending half of their body held the 16 slots logins share, and a
    # real login waited for as long as they stayed open.
    with contextlib.ExitStack() as stack:
        attackers = [stack.enter_context(_half_a_body(served, "/console/api/login")) for _ in range(20)]
        with served.http(None) as anonymous:  # a round trip after theirs: the daemon has them all
            assert anonymous.get("/console/").status_code == 200
        started = time.monotonic()
        with served.http(None) as browser:
            login = browser.post("/console/api/login", json={"token": TOKEN_A}, timeout=15)
        assert login.status_code == 200, login.text
        assert login.json()["agent"] == "agent-a"
        assert time.monotonic() - started < 10  # not "as long as they stay open"
        with served.http(TOKEN_B) as agent:  # an agent's calls go on meanwhile
            assert post(agent, "exec", command="echo served").json()["data"]["output"] == "served\n"
            cleanup(agent)
        # And each slow body is answered once its deadline passes, and its connection closed.
        for sock in attackers:
            status, body = _response(sock)
            assert status == b"HTTP/1.1 408 Request Timeout"
            assert body["error"] == "RequestTimeout" and body["hints"], body
            assert _closed_by_daemon(sock)


def test_an_agents_slow_body_holds_its_slot_only_until_the_deadline(served: Served) -> None:
    # Both of agent-a's slots (requests_per_agent = 2) held by calls whose bodies stop halfway:
    # its next call is served once they are cut, not when their clients give up.
    with (
        _half_a_body(served, "/v1/tools/exec", TOKEN_A),
        _half_a_body(served, "/v1/tools/exec", TOKEN_A),
        served.http(TOKEN_A) as agent,
    ):
        agent.timeout = 15  # a call behind bodies that never end fails here
        assert post(agent, "exec", command="echo next").json()["data"]["output"] == "next\n"
        cleanup(agent)


def test_a_body_answered_unread_is_cut_after_the_deadline(served: Served) -> None:
    # A 401 (or 413) reads none of the body: uvicorn goes on taking it in, as slowly as the client
    # sends, and no deadline covered that part of the connection's life.
    with _half_a_body(served, "/v1/tools/exec") as unread:
        status, body = _response(unread)
        assert status.startswith(b"HTTP/1.1 401") and body["error"] == "Unauthorized"
        assert _trickled_until_closed(unread, within=BODY_TIMEOUT + 10)
    with _half_a_body(served, "/v1/tools/exec", TOKEN_A, declared=2 << 20) as oversized:  # 413: none read
        status, body = _response(oversized)
        assert status.startswith(b"HTTP/1.1 413") and body["error"] == "RequestTooLarge"
        assert _trickled_until_closed(oversized, within=BODY_TIMEOUT + 10)


def test_the_head_after_a_body_answered_unread_has_the_deadline_too(served: Served) -> None:
    # Once such a body ended, the connection waited for its next head with no deadline at all.
    sent = len(b'{"token": "') + 500  # what _half_a_body sends of the body
    with _half_a_body(served, "/v1/tools/exec", declared=sent + 10) as finished:
        status, _ = _response(finished)
        assert status.startswith(b"HTTP/1.1 401")
        finished.sendall(b"x" * 10)  # the body ends: the connection waits for its next request
        finished.sendall(b"GET /v1/tools HTTP/1.1\r\n")  # whose head never ends
        assert _closed_by_daemon(finished)


def test_an_anonymous_body_is_bounded_far_below_an_agents(served: Served) -> None:
    # Bodies sent before any token is known are read before any slot is taken, so each one is
    # small: a login needs a few hundred bytes.
    with served.http(None) as browser:
        refused = browser.post(
            "/console/api/login", content=b" " * (65 * 1024), headers={"content-type": "application/json"}
        )
    assert refused.status_code == 413 and refused.json()["error"] == "RequestTooLarge"
    with served.http(TOKEN_A) as agent:  # an agent's 1 MiB cap is unchanged
        big = post(agent, "exec", command="echo " + "y" * (65 * 1024))
        assert big.status_code != 413, big.text
        cleanup(agent)
