"""Console sessions in time: they end at their expiry, whatever the cookie's own Max-Age says
(a browser may keep a cookie longer: the daemon decides, not the cookie)."""

from __future__ import annotations

from starlette.types import Scope

from procpilot.transports.http.browser_auth import BrowserAuth


def request(auth: BrowserAuth, bindings: list[str], secret: str | None) -> Scope:
    host = b"127.0.0.1:8765"
    headers = [(b"host", host)]
    if bindings:
        cookie = "; ".join(f"{auth.cookie_name({'headers': headers})}={b}" for b in bindings)
        headers.append((b"cookie", cookie.encode()))
    if secret is not None:
        headers.append((b"x-procpilot-session", secret.encode()))
    return {"type": "http", "method": "GET", "headers": headers}


def test_a_session_ends_at_its_expiry_and_its_binding_is_not_reused_after() -> None:
    now = [1000.0]
    auth = BrowserAuth(lifetime=60, clock=lambda: now[0])
    secret, binding = auth.login(request(auth, [], None), "ops")
    assert auth.agent_of(request(auth, [binding], secret)) == "ops"
    now[0] += 59.9
    assert auth.agent_of(request(auth, [binding], secret)) == "ops"
    assert "Max-Age=60" in auth.set_cookie(request(auth, [], None), binding)
    now[0] += 0.1
    assert auth.agent_of(request(auth, [binding], secret)) is None
    assert len(auth) == 0  # forgotten, not only refused
    _, fresh = auth.login(request(auth, [binding], None), "ops")
    assert fresh != binding


def test_a_secret_too_long_to_be_ours_is_not_looked_up() -> None:
    auth = BrowserAuth()
    secret, binding = auth.login(request(auth, [], None), "ops")
    assert auth.agent_of(request(auth, [binding], secret + "x" * 200)) is None
    assert auth.agent_of(request(auth, [binding], None)) is None
