"""The ``procpilot`` command's entry point, kept light: the commands are in cli_app.py.

``procpilot mcp`` over stdio starts answering its client's handshake (transports/mcp_handshake.py)
before the command line, the settings, the engine and the MCP SDK are imported, which is most
of its start-up time; every other command starts as before.
"""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["main"]


def main() -> None:
    if sys.argv[1:2] == ["mcp"]:
        from procpilot.transports.mcp_handshake import start_front

        start_front(sys.argv[2:])
    from procpilot.transports.cli_app import main as run

    run()


def __getattr__(name: str) -> Any:
    # What this module held before its commands moved (``app`` and the rest), for its importers.
    # Not a dunder: the import system asks for ``__path__`` and the like on every import from here.
    if name.startswith("__"):
        raise AttributeError(name)
    from procpilot.transports import cli_app

    return getattr(cli_app, name)


if __name__ == "__main__":
    main()
