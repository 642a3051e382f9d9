"""The daemon's app in this process, for the REST and auth tests: no subprocess, no socket.

The app (``serve.daemon_app``: every face behind the gate, over a supervisor with the agents'
policy) runs on an event loop of its own in a thread (an anyio blocking portal), with its
lifespan entered as the server would; a synchronous ``httpx2.Client`` reaches it through a
transport that hands each request to httpx2's ASGI transport on that loop, as starlette's
TestClient does. What needs a real process (signals, shutdown, the Unix socket, streaming
responses such as SSE) stays on ``tests.daemon``'s subprocess.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
from anyio.from_thread import BlockingPortal, start_blocking_portal

from procpilot.config import load_settings
from procpilot.transports.serve import daemon_app, make_supervisor
from tests.conftest import OPEN_ROOTS
from tests.daemon import TOKEN_A, TOKENS, daemon_env, write_config

# What the Host check of a loopback daemon expects to see.
BASE_URL = "http://127.0.0.1:8765"


class _PortalTransport(httpx2.BaseTransport):
    """A synchronous transport into an ASGI app that runs on a portal's event loop."""

    def __init__(self, portal: BlockingPortal, app: Any) -> None:
        self._portal = portal
        self._asgi = httpx2.ASGITransport(app=app, client=("127.0.0.1", 50000))

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        body = request.read()
        return self._portal.call(self._send, request.method, str(request.url), list(request.headers.raw), body)

    async def _send(self, method: str, url: str, headers: list[tuple[bytes, bytes]], body: bytes) -> httpx2.Response:
        response = await self._asgi.handle_async_request(httpx2.Request(method, url, headers=headers, content=body))
        content = await response.aread()
        return httpx2.Response(response.status_code, headers=response.headers, content=content)


@dataclass
class InProcess:
    portal: BlockingPortal
    app: Any
    root: Path
    url: str = BASE_URL

    def headers(self, token: str | None = TOKEN_A) -> dict[str, str]:
        return {"Authorization": f"Bearer {token}"} if token else {}

    def http(self, token: str | None = TOKEN_A) -> httpx2.Client:
        return httpx2.Client(
            base_url=BASE_URL, headers=self.headers(token), transport=_PortalTransport(self.portal, self.app)
        )


@contextlib.asynccontextmanager
async def _running(root: Path, tokens: dict[str, str] | None, extra: str) -> AsyncIterator[Any]:
    settings = load_settings(write_config(root, tokens, extra=extra), env=daemon_env(root))
    settings.state_dir.mkdir(parents=True, exist_ok=True)
    async with make_supervisor(settings) as sup, daemon_app(sup, settings) as app, app.router.lifespan_context(app):
        yield app


@contextlib.contextmanager
def in_process_daemon(root: Path, tokens: dict[str, str] | None = TOKENS, *, extra: str = "") -> Iterator[InProcess]:
    """The daemon ``start_daemon`` would run, configured the same way, served in this process."""
    root.mkdir(parents=True, exist_ok=True)
    with start_blocking_portal() as portal, portal.wrap_async_context_manager(_running(root, tokens, extra)) as app:
        OPEN_ROOTS.add(str(root))
        try:
            yield InProcess(portal, app, root)
        finally:
            OPEN_ROOTS.discard(str(root))
