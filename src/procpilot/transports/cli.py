"""The ``procpilot`` command line."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import sys
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from procpilot.config import load_settings
from procpilot.engine.supervisor import Supervisor
from procpilot.errors import ProcpilotError
from procpilot.faces.exec_process import exec_process_tools
from procpilot.transports.mcp import build_mcp_server

app = typer.Typer(add_completion=False, no_args_is_help=True, help="A process supervisor for AI agents.")
_err = Console(stderr=True)



@app.callback()
def _root() -> None:
    """procpilot: run commands for agents, inside limits, with nothing lost and nothing left behind."""


_SHUTDOWN_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


async def _serve_until_signal(
    sup: Supervisor, serve: Callable[[], Awaitable[None]], stop: Callable[[], None] | None = None
) -> None:
    """Run ``serve``; on SIGTERM/SIGINT/SIGHUP/SIGQUIT end every session tree, then return."""
    loop = asyncio.get_running_loop()
    received: list[int] = []
    task = asyncio.ensure_future(serve())

    def on_signal(sig: int) -> None:
        received.append(sig)
        (stop or task.cancel)()

    for sig in _SHUTDOWN_SIGNALS:
        loop.add_signal_handler(sig, on_signal, sig)
    try:
        with contextlib.suppress(asyncio.CancelledError):
            await task
    finally:
        for sig in _SHUTDOWN_SIGNALS:
            loop.remove_signal_handler(sig)
        # Forward the signal we got (as the spec's signal bridge does), then SIGKILL after grace.
        await sup.aclose(received[0] if received else signal.SIGTERM)


@app.command()
def mcp(
    agent: Annotated[str, typer.Option(help="The scope this server's sessions belong to.")] = "default",
    config: Annotated[Path | None, typer.Option(help="A TOML configuration file.")] = None,
    http: Annotated[bool, typer.Option(help="Serve streamable HTTP instead of stdio.")] = False,
    host: Annotated[str, typer.Option(help="HTTP bind address.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="HTTP port (0 = any free port).")] = 0,
) -> None:
    """Serve the tools to an MCP client over stdio (default) or streamable HTTP."""
    try:
        settings = load_settings(config)
    except ProcpilotError as exc:
        _err.print(f"[red]{exc.code}[/red]: {exc.message}")
        raise typer.Exit(2) from None

    async def main() -> None:
        async with Supervisor(settings) as sup:
            server = build_mcp_server(exec_process_tools(sup), scope=agent)
            if not http:
                await _serve_until_signal(sup, server.run_stdio_async)
                return
            import uvicorn

            bound = port or _free_port(host)
            starlette_app = server.streamable_http_app(host=host)
            config_ = uvicorn.Config(starlette_app, host=host, port=bound, log_level="warning")
            url = f"http://{host}:{bound}/mcp"
            _err.print(f"procpilot MCP server on [bold]{url}[/bold] (agent scope: {agent})")
            _err.print(f"Connect a client, e.g.: claude mcp add --transport http procpilot {url}")
            _err.print(f"state: {settings.state_dir}   workspace: {settings.workspace_root}")
            server_ = _quiet_uvicorn()(config_)
            await _serve_until_signal(sup, server_.serve, lambda: setattr(server_, "should_exit", True))

    asyncio.run(main())


def _quiet_uvicorn() -> type:
    import uvicorn

    class QuietUvicorn(uvicorn.Server):
        """Leaves signals to us: uvicorn would re-raise them after serving, before sessions end."""

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield

    return QuietUvicorn


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
