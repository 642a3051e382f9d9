"""The console's HTTP side without a browser: what is public, console sessions and Origin checks, the
operators' agent filter, bounded log pages, and that the page's files ship in the wheel."""

from __future__ import annotations

import base64
import json
import tomllib
from collections.abc import Iterator
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

import pytest

from procpilot.transports.http.console import STATIC_DIR
from tests.daemon import Served, post, start_daemon

TOKENS = {"tok-capi-alpha-0123456": "agent-a", "tok-capi-ops-01234567": "ops"}
TOKEN_A, TOKEN_OPS = list(TOKENS)
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    daemon = start_daemon(tmp_path_factory.mktemp("console-api"), TOKENS, server='operators = ["ops"]')
    yield daemon
    assert daemon.stop() == 0, daemon.log_text()


def test_the_banner_names_the_console(served: Served) -> None:
    lines = [line for line in served.log_text().splitlines() if "console" in line]
    assert any(f"{served.url}/console/" in line for line in lines), served.log_text()


def test_the_page_and_its_files_are_public_and_hold_no_data(served: Served) -> None:
    sid = None
    with served.http(TOKEN_A) as c:
        sid = post(c, "exec", command="sleep 3100 # private-text", yieldMs=0).json()["data"]["sessionId"]
    try:
        with served.http(None) as anon:
            assert anon.get("/").headers["location"] == "/console/"
            page = anon.get("/console/")
            assert page.status_code == 200 and "private-text" not in page.text
            assert "default-src 'self'" in page.headers["content-security-policy"]
            assert anon.get("/console/static/vendor/xterm/xterm.mjs").status_code == 200
            for path in ("/console/api/me", "/console/api/stream", f"/console/api/sessions/agent-a/{sid}/log"):
                assert anon.get(path).status_code == 401, path
            assert anon.get("/console/static/../api/me").status_code in (401, 404)
    finally:
        with served.http(TOKEN_A) as c:
            post(c, "process", action="remove", sessionId=sid)


def login(served: Served, token: str, cookie: str | None = None) -> tuple[str, str, str]:
    """A console login as a browser makes it (``cookie``: the Cookie header its browser holds):
    the cookie's name, its value, and the session's secret."""
    with served.http(None) as browser:
        r = browser.post("/console/api/login", json={"token": token}, headers={"Cookie": cookie} if cookie else {})
        assert r.status_code == 200, r.text
        name, _, rest = r.headers["set-cookie"].partition("=")
        return name, rest.split(";")[0], r.json()["session"]


def as_browser(name: str, bindings: list[str], secret: str | None) -> dict[str, str]:
    headers = {"Cookie": "; ".join(f"{name}={b}" for b in bindings)} if bindings else {}
    return headers | ({"X-Procpilot-Session": secret} if secret else {})


def test_a_login_is_a_secret_for_the_page_bound_to_a_cookie_that_alone_is_nobody(served: Served) -> None:
    with served.http(None) as browser:
        assert browser.post("/console/api/login", json={"token": "wrong"}).status_code == 401
        port = int(served.url.rsplit(":", 1)[1])
        elsewhere = {"Origin": f"http://localhost:{port + 1}"}
        assert browser.post("/console/api/login", json={"token": TOKEN_A}, headers=elsewhere).status_code == 403
        assert not browser.cookies  # nothing was set
        r = browser.post("/console/api/login", json={"token": TOKEN_A})
        assert r.status_code == 200 and r.json()["agent"] == "agent-a", r.text
        cookie = r.headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and TOKEN_A not in cookie
        secret = r.json()["session"]
        assert TOKEN_A not in secret
        # The cookie the browser sends on its own, alone: nobody, and no bearer token either.
        assert browser.get("/console/api/me").status_code == 401
        binding = next(iter(browser.cookies.values()))
        with served.http(binding) as as_bearer:
            assert as_bearer.get("/console/api/me").status_code == 401
        # The page's secret without that cookie: nobody either.
        with served.http(None) as fresh:
            assert fresh.get("/console/api/me", headers={"X-Procpilot-Session": secret}).status_code == 401
        # Both: agent-a, reading and changing, in the console and in the REST API.
        mine = {"X-Procpilot-Session": secret}
        assert browser.get("/console/api/me", headers=mine).json()["agent"] == "agent-a"
        # Other apps on localhost share the Cookie header, malformed cookies and all.
        name = cookie.split("=", 1)[0]
        crowded = {"Cookie": f'app={{"a": 1, "b": [2]}}; other="x y"; {name}={binding}; last=1', **mine}
        with served.http(None) as fresh:
            assert fresh.get("/console/api/me", headers=crowded).json()["agent"] == "agent-a"
        started = browser.post("/v1/tools/exec", json={"command": "sleep 3101", "yieldMs": 0}, headers=mine)
        assert started.status_code == 200, started.text
        session = started.json()["data"]["sessionId"]
        try:
            # Another loopback origin (a dev server an agent runs, say) may not use it.
            foreign = {"Origin": f"http://127.0.0.1:{port + 1}", **mine}
            assert browser.get("/console/api/me", headers=foreign).status_code == 403
            signal = f"/console/api/sessions/agent-a/{session}/signal"
            assert browser.post(signal, json={"signal": "SIGKILL"}, headers=foreign).status_code == 403
            done = browser.post(signal, json={"signal": "SIGKILL"}, headers=mine)
            assert done.status_code == 200 and done.json()["state"] == "killed"
        finally:
            with served.http(TOKEN_A) as c:
                post(c, "process", action="remove", sessionId=session)


def test_whose_request_it_is_comes_from_the_pages_secret_never_from_a_cookie(served: Served) -> None:
    name, ops_binding, ops_secret = login(served, TOKEN_OPS)
    _, a_binding, a_secret = login(served, TOKEN_A)
    assert a_binding != ops_binding
    with served.http(None) as c:

        def me(bindings: list[str], secret: str) -> object:
            r = c.get("/console/api/me", headers=as_browser(name, bindings, secret))
            return r.json()["agent"] if r.status_code == 200 else r.status_code

        assert me([ops_binding], ops_secret) == "ops"
        assert me([a_binding], ops_secret) == 401  # agent-a's cookie planted: the operator's page is refused
        assert me([ops_binding], a_secret) == 401
        assert me([a_binding, ops_binding], ops_secret) == "ops"  # planted beside ours: still the operator
        assert me([a_binding, ops_binding], a_secret) == "agent-a"
    # A second tab of the operator's browser keeps its cookie (the first tab goes on working)...
    _, again, ops_secret_2 = login(served, TOKEN_OPS, f"{name}={ops_binding}")
    assert again == ops_binding
    # ...but a login as anyone else, or from a browser holding a planted cookie, gets a fresh one.
    _, other, _ = login(served, TOKEN_A, f"{name}={ops_binding}")
    _, fresh, _ = login(served, TOKEN_OPS, f"{name}={a_binding}")
    assert other not in (ops_binding, a_binding) and fresh not in (ops_binding, a_binding)
    with served.http(None) as c:
        for secret in (ops_secret, ops_secret_2):
            assert c.get("/console/api/me", headers=as_browser(name, [ops_binding], secret)).json()["agent"] == "ops"


def test_logout_ends_the_browsers_sessions_on_the_daemon(served: Served) -> None:
    name, binding, secret = login(served, TOKEN_A)
    _, same, second_tab = login(served, TOKEN_A, f"{name}={binding}")
    assert same == binding
    _, elsewhere, other_browser = login(served, TOKEN_A)
    held = as_browser(name, [binding], secret)
    with served.http(None) as c:
        assert c.get("/console/api/me", headers=held).status_code == 200
        # Without the session (the cookie alone, as any other page could send it): nothing ends.
        assert c.post("/console/api/logout", headers={"Cookie": f"{name}={binding}"}).json()["ended"] is False
        port = int(served.url.rsplit(":", 1)[1])
        foreign = {"Origin": f"http://127.0.0.1:{port + 1}", **held}
        assert c.post("/console/api/logout", headers=foreign).status_code == 403
        assert c.get("/console/api/me", headers=held).status_code == 200
        out = c.post("/console/api/logout", headers=held)
        assert out.status_code == 200 and out.json()["ended"] is True
        assert "Max-Age=0" in out.headers["set-cookie"]
        # What the browser held before, sent again: refused, in this tab and the other.
        assert c.get("/console/api/me", headers=held).status_code == 401
        assert c.get("/console/api/me", headers=as_browser(name, [binding], second_tab)).status_code == 401
        # Another browser of the same agent is not logged out.
        assert c.get("/console/api/me", headers=as_browser(name, [elsewhere], other_browser)).status_code == 200


def test_an_agents_logins_are_bounded_and_push_out_only_its_own(served: Served) -> None:
    from procpilot.transports.http.browser_auth import SESSIONS_PER_AGENT

    name, ops_binding, ops_secret = login(served, TOKEN_OPS)
    first = login(served, TOKEN_A)
    with served.http(None) as c:
        for _ in range(SESSIONS_PER_AGENT):
            assert c.post("/console/api/login", json={"token": TOKEN_A}).status_code == 200
        assert c.get("/console/api/me", headers=as_browser(name, [first[1]], first[2])).status_code == 401
        assert c.get("/console/api/me", headers=as_browser(name, [ops_binding], ops_secret)).status_code == 200


def test_operators_act_in_any_agents_scope_and_nobody_else_does(served: Served) -> None:
    with served.http(TOKEN_A) as a:
        sid = post(a, "exec", command="sleep 3102", yieldMs=0).json()["data"]["sessionId"]
        refused = a.post("/v1/tools/process?agent=ops", json={"action": "list"})
        assert refused.status_code == 403 and refused.json()["error"] == "OperatorForbidden"
    with served.http(TOKEN_OPS) as ops:
        assert sid not in ops.post("/v1/tools/process", json={"action": "list"}).text  # its own scope by default
        killed = ops.post("/v1/tools/process?agent=agent-a", json={"action": "kill", "sessionId": sid})
        assert killed.status_code == 200, killed.text
        page = ops.get(f"/console/api/sessions/agent-a/{sid}/log", params={"limit": 10_000_000})
        assert page.status_code == 200
        post(ops, "process?agent=agent-a", action="remove", sessionId=sid)
        # And follows another agent's event stream.
        with ops.stream("GET", "/v1/events", params={"agent": "agent-a"}) as events:
            assert events.status_code == 200
            assert '"agent":"agent-a"' in next(line for line in events.iter_lines() if line.startswith("data: "))
    with served.http(TOKEN_A) as a:
        assert a.get("/v1/events", params={"agent": "ops"}).status_code == 403


def test_a_log_page_is_bounded_whatever_is_asked(served: Served) -> None:
    with served.http(TOKEN_A) as a:
        r = post(a, "exec", command="head -c 600000 /dev/zero | tr '\\0' x", yieldMs=30_000)
        sid = r.json()["data"]["sessionId"]
        page = a.get(f"/console/api/sessions/agent-a/{sid}/log", params={"offset": 0, "limit": 10_000_000}).json()
        assert page["total"] == 600_000 and page["end"] - page["offset"] == 256 * 1024
        assert len(base64.b64decode(page["data"])) == 256 * 1024
        bad = a.get(f"/console/api/sessions/agent-a/{sid}/log", params={"offset": "1e9"})
        assert bad.status_code == 422 and bad.json()["error"] == "InvalidArgument"
        # The live stream of the same output: every byte once, in 64 KiB events, then the end.
        events: list[tuple[str, dict[str, Any]]] = []
        with a.stream("GET", f"/console/api/sessions/agent-a/{sid}/output", params={"from": 0}) as out:
            kind = ""
            for line in out.iter_lines():
                if line.startswith("event: "):
                    kind = line[7:]
                elif line.startswith("data: "):
                    events.append((kind, json.loads(line[6:])))
        assert [k for k, _ in events] == ["data"] * 10 + ["end"] and events[-1][1]["state"] == "exited_ok"
        streamed = b"".join(base64.b64decode(e["data"]) for k, e in events if k == "data")
        assert streamed == b"x" * 600_000
        post(a, "process", action="remove", sessionId=sid)


def test_every_file_of_the_page_ships_in_the_wheel() -> None:
    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["procpilot"]
    package = STATIC_DIR.parents[2]
    files = [p.relative_to(package).as_posix() for p in STATIC_DIR.rglob("*") if p.is_file()]
    assert files and all(any(fnmatch(f, g) for g in globs) for f in files), files
    for licence in ("vendor/xterm/LICENSE", "vendor/uplot/LICENSE"):
        assert (STATIC_DIR / licence).read_text().strip()


def test_without_tokens_the_page_shows_everything_and_changes_need_its_secret(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    root = tmp_path_factory.mktemp("console-open")
    # An audit trail left by an earlier daemon: the console shows it from the start.
    (root / "state").mkdir()
    earlier = {"event": "AuditEvent", "scope": "default", "tool": "exec", "tier": "notify", "outcome": "ok"}
    (root / "state" / "audit.jsonl").write_text(json.dumps({**earlier, "summary": "exec: make earlier"}) + "\n")
    daemon = start_daemon(root, None, server="websockets_per_agent = 2")
    try:
        with daemon.http(None) as page:
            me = page.get("/console/api/me").json()
            assert me["agent"] == "default" and me["operator"] and not me["tokensRequired"] and me["session"]
            sid = post(page, "exec", command="sleep 3103", yieldMs=0).json()["data"]["sessionId"]
            signal = f"/console/api/sessions/default/{sid}/signal"
            refused = page.post(signal, json={"signal": "SIGKILL"})
            assert refused.status_code == 403 and refused.json()["error"] == "CsrfRejected"
            done = page.post(signal, json={"signal": "SIGKILL"}, headers={"X-Procpilot-Session": me["session"]})
            assert done.status_code == 200, done.text
            with page.stream("GET", "/console/api/stream") as events:
                seen = ""
                lines = events.iter_lines()  # not left by a break, which would close the connection
                while not ("make earlier" in seen and sid in seen and "console.signal" in seen):
                    seen += next(lines) + "\n"
                # Two streams are this agent's limit: a third is refused while they are open...
                running = post(page, "exec", command="sleep 3104", yieldMs=0).json()["data"]["sessionId"]
                with page.stream("GET", f"/console/api/sessions/default/{running}/output") as output:
                    assert output.status_code == 200
                    third = page.get("/console/api/stream", timeout=10)
                    assert third.status_code == 429 and third.json()["error"] == "TooManyConnections"
                post(page, "process", action="remove", sessionId=running)
            post(page, "process", action="remove", sessionId=sid)
            # ...and once they are closed, streams are counted no more.
            with page.stream("GET", "/console/api/stream") as again:
                assert again.status_code == 200
    finally:
        assert daemon.stop() == 0, daemon.log_text()


def first_snapshot(served: Served, token: str) -> list[dict[str, Any]]:
    """The sessions' rows the console's stream sends first, as the page gets them."""
    name, cookie, secret = login(served, token)
    with (
        served.http(None) as browser,
        browser.stream("GET", "/console/api/stream", headers=as_browser(name, [cookie], secret)) as events,
    ):
        lines = events.iter_lines()
        while next(lines) != "event: sessions":
            pass
        rows: list[dict[str, Any]] = json.loads(next(lines)[len("data: ") :])
        return rows


def test_rows_name_their_session_and_tell_how_it_ended(served: Served) -> None:
    # Issue 23, item 10: session names appeared nowhere; a killed restart session showed exit 0.
    with served.http(TOKEN_A) as a:
        named = post(a, "exec", command="sleep 3105", name="web-server", yieldMs=0).json()["data"]["sessionId"]
        looping = post(a, "exec", command="true", restart="always", background=True).json()["data"]["sessionId"]
        # Between two runs (the backoff after "restart 1 of ..."), the last run's exit code is 0.
        waited = post(a, "process", action="wait", sessionId=looping, pattern="restart 1 of", timeout=20_000)
        assert waited.json()["data"]["reason"] == "pattern"
        assert post(a, "process", action="kill", sessionId=looping).status_code == 200
        try:
            rows = {r["id"]: r for r in first_snapshot(served, TOKEN_A)}
            assert rows[named]["name"] == "web-server"
            killed = rows[looping]
            assert killed["state"] == "killed" and killed["exitCode"] == 0  # what the column showed
            assert killed["exit"].startswith("killed") and killed["exit"] != "0", killed
        finally:
            for sid in (named, looping):
                post(a, "process", action="remove", sessionId=sid)


def test_browsers_get_a_favicon(served: Served) -> None:
    # Issue 23, item 10: /favicon.ico was a 404 on every page load.
    with served.http(None) as anon:
        icon = anon.get("/favicon.ico")
        assert icon.status_code == 200 and icon.headers["content-type"].startswith("image/svg+xml")
        assert icon.content.startswith(b"<svg")
        assert 'rel="icon"' in anon.get("/console/").text
