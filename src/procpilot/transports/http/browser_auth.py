"""How a browser authenticates: a per-login secret the page keeps, bound to a cookie that alone authorizes nothing.

A browser sends a host's cookies to every port of it, and a page on any port may set cookies for
all of them (``SameSite`` does not separate ports: they are the same site). An agent's web server
on another loopback port therefore receives whatever cookie the console holds, and can plant one
of its own. So no cookie carries authority here:

* A login (a token, once) makes a *console session*: a random **secret**, sent once in the login
  response's body, which the page keeps in ``sessionStorage`` (per tab and per origin, and an
  origin includes the port, so no other port can read it) and sends as ``X-Procpilot-Session`` on
  every request; and a random **binding**, set as an ``HttpOnly`` cookie. The daemon keeps their
  hashes, the agent and an expiry; never the token.
* A request is the session's agent only when it carries the secret *and*, among its cookies of
  that name, the session's binding. Whose request it is comes from the secret alone: a planted
  cookie can make a request fail (the page then asks to log in), never make it another agent's.
  A leaked cookie lacks the secret; a leaked secret lacks the cookie of the browser it was made in.
* No page of another origin can send that header: a custom header on a cross-origin request needs
  a CORS grant, which the daemon never gives. That is also why no CSRF token is needed.

Sessions live in memory: a restart of the daemon ends them all. Each agent holds at most
``per_agent`` of them (its oldest goes first), so no agent's logins push out another's.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass

from starlette.types import Scope

from procpilot.transports.http.common import header

__all__ = [
    "SESSIONS_PER_AGENT",
    "SESSION_HEADER",
    "SESSION_LIFETIME",
    "BrowserAuth",
    "ConsoleSession",
    "is_public_path",
]

SESSION_HEADER = "x-procpilot-session"
SESSION_LIFETIME = 12 * 3600.0  # seconds: a console left open overnight logs in again
SESSIONS_PER_AGENT = 64  # live console logins one agent holds; past it its oldest ends
_MAX_COOKIE_HEADER = 8192  # parsed per request: bounded before it is split
_MAX_SECRET = 128  # a header longer than any secret made here is not looked up

# What a browser may fetch before logging in: the page's own static files (they hold no data:
# everything shown comes from the authenticated API) and the login/logout calls themselves.
_PUBLIC_EXACT = ("/", "/console", "/console/", "/console/api/login", "/console/api/logout", "/favicon.ico")
_PUBLIC_PREFIX = "/console/static/"


def is_public_path(path: str) -> bool:
    return path in _PUBLIC_EXACT or (path.startswith(_PUBLIC_PREFIX) and ".." not in path)


def _port_of(scope: Scope) -> str:
    host = header(scope, b"host") or ""
    name, colon, port = host.rpartition(":")
    return port if colon and port.isdigit() and not name.endswith("[") else "80"


def _digest(value: str) -> bytes:
    return hashlib.sha256(value.encode()).digest()


@dataclass(frozen=True)
class ConsoleSession:
    """One console login: whose it is, the hash of its browser's binding cookie, when it ends."""

    agent: str
    binding: bytes
    expires: float  # on ``BrowserAuth``'s clock


class BrowserAuth:
    """The console's sessions, and the cookie and header that present one.

    ``clock`` is a monotonic clock in seconds (``time.monotonic`` unless a test needs another).
    """

    def __init__(
        self,
        *,
        lifetime: float = SESSION_LIFETIME,
        per_agent: int = SESSIONS_PER_AGENT,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.lifetime = lifetime
        self.per_agent = per_agent
        self._clock = clock
        # hash(secret) -> session, oldest login first (dicts keep insertion order).
        self._sessions: dict[bytes, ConsoleSession] = {}
        # With no tokens configured every caller is the open agent; this per-start value, which
        # only a page of the daemon's own origin can read (from /console/api/me), is what a change
        # made from the console must carry, so a page on another port cannot make one.
        self.open_secret = secrets.token_urlsafe(32)

    def __len__(self) -> int:
        return len(self._sessions)

    # -- the cookie --

    def cookie_name(self, scope: Scope) -> str:
        # The port is in the name: two daemons on one host (a test daemon beside the one serving
        # real agents) must not overwrite each other's, since cookies ignore ports.
        return f"procpilot_console_{_port_of(scope)}"

    def cookie_values(self, scope: Scope) -> list[str]:
        """Every value of the console's cookie in the request: a page on another port may have
        added its own beside ours (at another path), so there can be several."""
        raw = header(scope, b"cookie")
        if not raw or len(raw) > _MAX_COOKIE_HEADER:
            return []
        # Split by hand: every app on localhost shares this header, and SimpleCookie stops at the
        # first cookie it finds malformed (a dev server's JSON value), losing ours after it.
        name = self.cookie_name(scope)
        values = []
        for pair in raw.split(";"):
            key, eq, value = pair.strip().partition("=")
            if eq and key == name and value:
                values.append(value)
        return values

    def set_cookie(self, scope: Scope, binding: str) -> str:
        return f"{self.cookie_name(scope)}={binding}; HttpOnly; SameSite=Strict; Path=/; Max-Age={int(self.lifetime)}"

    def clear_cookie(self, scope: Scope) -> str:
        return f"{self.cookie_name(scope)}=; HttpOnly; SameSite=Strict; Path=/; Max-Age=0"

    # -- sessions --

    def login(self, scope: Scope, agent: str) -> tuple[str, str]:
        """A new session of ``agent`` for the browser of this request: ``(secret, binding)``.

        The browser's binding is kept when it already binds live sessions of this same agent (the
        console open in another tab, which would otherwise lose its cookie); any other cookie
        value (unknown, expired, another agent's, a planted one) gets a fresh binding."""
        self._prune()
        binding = next((v for v in self.cookie_values(scope) if self._binds(_digest(v), agent)), None)
        if binding is None:
            binding = secrets.token_urlsafe(32)
        secret = secrets.token_urlsafe(32)
        self._sessions[_digest(secret)] = ConsoleSession(agent, _digest(binding), self._clock() + self.lifetime)
        mine = [key for key, s in self._sessions.items() if s.agent == agent]
        for key in mine[: max(0, len(mine) - self.per_agent)]:
            del self._sessions[key]
        return secret, binding

    def session_of(self, scope: Scope) -> ConsoleSession | None:
        """The session this request presents: its secret in the header and its binding among the
        cookies, before it expires. None for anything else."""
        secret = header(scope, SESSION_HEADER.encode())
        if not secret or len(secret) > _MAX_SECRET:
            return None
        key = _digest(secret)
        session = self._sessions.get(key)
        if session is None:
            return None
        if session.expires <= self._clock():
            del self._sessions[key]
            return None
        bound = False
        for value in self.cookie_values(scope):  # every one compared: no early exit
            bound |= hmac.compare_digest(_digest(value), session.binding)
        return session if bound else None

    def agent_of(self, scope: Scope) -> str | None:
        session = self.session_of(scope)
        return None if session is None else session.agent

    def logout(self, scope: Scope) -> bool:
        """End the request's session and every other of its browser (all one agent's, since a
        binding holds one agent's only). False when the request presents no live session."""
        session = self.session_of(scope)
        if session is None:
            return False
        for key in [k for k, s in self._sessions.items() if s.binding == session.binding]:
            del self._sessions[key]
        return True

    def _binds(self, binding: bytes, agent: str) -> bool:
        """``binding`` is that of live sessions, all of them ``agent``'s."""
        agents = {s.agent for s in self._sessions.values() if s.binding == binding}
        return agents == {agent}

    def _prune(self) -> None:
        now = self._clock()
        for key in [k for k, s in self._sessions.items() if s.expires <= now]:
            del self._sessions[key]

    # -- the open daemon (no tokens) --

    def open_secret_ok(self, scope: Scope) -> bool:
        presented = header(scope, SESSION_HEADER.encode()) or ""
        return hmac.compare_digest(presented.encode(), self.open_secret.encode())

    @staticmethod
    def same_origin(scope: Scope) -> bool:
        """A browser's ``Origin`` (absent: not a cross-site request) names the host it was sent to."""
        origin = header(scope, b"origin")
        if origin is None:
            return True
        host = header(scope, b"host") or ""
        return origin in (f"http://{host}", f"https://{host}")
