"""How a browser authenticates: the token in an HttpOnly cookie, and a CSRF token on every change.

A browser cannot be given a bearer header by a page it loads without keeping the token where
scripts (and so injected scripts) can read it; the console's login sets it instead as an
``HttpOnly; SameSite=Strict`` cookie, never in a URL. A cookie is sent by the browser on its own,
so a request authenticated by one is trusted only when:

* it changes nothing (GET, HEAD), or it carries ``X-Procpilot-CSRF``: an HMAC of the token under a
  secret made at start-up, which only a page that read ``/console/api/me`` (same origin: a foreign
  page gets no CORS grant to read it) can know; and
* its ``Origin``, where the browser sends one (always on a WebSocket), names the host it was sent
  to, so no other site can open the event stream or a socket with the cookie.

The cookie's name carries the port: cookies ignore ports, and two daemons on one host (a test
daemon beside the one serving real agents) must not overwrite each other's.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from http.cookies import SimpleCookie

from starlette.types import Scope

from procpilot.transports.http.common import _header

__all__ = ["CSRF_HEADER", "BrowserAuth", "is_public_path"]

CSRF_HEADER = "x-procpilot-csrf"
_SAFE_METHODS = ("GET", "HEAD", "OPTIONS")
_COOKIE_MAX_AGE = 12 * 3600  # a console left open overnight logs in again
_MAX_COOKIE_HEADER = 8192  # parsed per request: bounded before the parser sees it

# What a browser may fetch before logging in: the page's own static files (they hold no data:
# everything shown comes from the authenticated API) and the login/logout calls themselves.
_PUBLIC_EXACT = ("/", "/console", "/console/", "/console/api/login", "/console/api/logout")
_PUBLIC_PREFIX = "/console/static/"


def is_public_path(path: str) -> bool:
    return path in _PUBLIC_EXACT or (path.startswith(_PUBLIC_PREFIX) and ".." not in path)


def _port_of(scope: Scope) -> str:
    host = _header(scope, b"host") or ""
    name, colon, port = host.rpartition(":")
    return port if colon and port.isdigit() and not name.endswith("[") else "80"


class BrowserAuth:
    """The cookie's name and attributes, and the CSRF token of a session token."""

    def __init__(self) -> None:
        self._secret = secrets.token_bytes(32)  # new each start: a restart invalidates old pages' CSRF tokens

    def cookie_name(self, scope: Scope) -> str:
        return f"procpilot_token_{_port_of(scope)}"

    def token_from_cookie(self, scope: Scope) -> str | None:
        raw = _header(scope, b"cookie")
        if not raw or len(raw) > _MAX_COOKIE_HEADER:
            return None
        # Split by hand: every app on localhost shares this header, and SimpleCookie stops at the
        # first cookie it finds malformed (a dev server's JSON value), losing ours after it.
        name = self.cookie_name(scope)
        for pair in raw.split(";"):
            key, eq, value = pair.strip().partition("=")
            if eq and key == name and value:
                return value
        return None

    def set_cookie(self, scope: Scope, token: str) -> str:
        jar: SimpleCookie = SimpleCookie()
        name = self.cookie_name(scope)
        jar[name] = token
        jar[name]["httponly"] = True
        jar[name]["samesite"] = "Strict"
        jar[name]["path"] = "/"
        jar[name]["max-age"] = _COOKIE_MAX_AGE
        return jar[name].OutputString()

    def clear_cookie(self, scope: Scope) -> str:
        return f"{self.cookie_name(scope)}=; HttpOnly; SameSite=Strict; Path=/; Max-Age=0"

    def csrf_for(self, token: str) -> str:
        """The CSRF token that goes with a session token ('' when no tokens are configured)."""
        return hmac.new(self._secret, b"csrf:" + token.encode(), hashlib.sha256).hexdigest()

    def csrf_ok(self, scope: Scope, token: str) -> bool:
        if scope["type"] == "http" and scope["method"] in _SAFE_METHODS:
            return True
        presented = _header(scope, CSRF_HEADER.encode()) or ""
        return hmac.compare_digest(presented.encode(), self.csrf_for(token).encode())

    @staticmethod
    def same_origin(scope: Scope) -> bool:
        """A browser's ``Origin`` (absent: not a cross-site request) names the host it was sent to."""
        origin = _header(scope, b"origin")
        if origin is None:
            return True
        host = _header(scope, b"host") or ""
        return origin in (f"http://{host}", f"https://{host}")
