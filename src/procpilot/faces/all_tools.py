"""Every tool procpilot serves, in one list: what the transports (MCP, ``procpilot tools``) carry."""

from __future__ import annotations

import json

from procpilot.config import Settings, load_settings
from procpilot.contract import ToolSpec
from procpilot.engine.supervisor import Supervisor
from procpilot.faces.capabilities import capability_tools
from procpilot.faces.definitions import Format, tool_definitions
from procpilot.faces.exec_process import exec_process_tools

__all__ = ["all_tools", "definitions_json"]


def all_tools(supervisor: Supervisor, *, audit: bool = True, notifies_exit: bool | None = None) -> list[ToolSpec]:
    """``exec`` + ``process`` (specs 001/002/004) and ``process.*`` (spec 000), over one supervisor.

    ``audit=False`` leaves the Notify-tier audit events to a wrapper that publishes its own (the
    policy gate), so none is published twice. ``notifies_exit`` is whether the transport announces
    session exits to its clients (see ``exec_process_tools``).
    """
    return [
        *exec_process_tools(supervisor, notifies_exit=notifies_exit),
        *capability_tools(supervisor, audit=audit),
    ]


def definitions_json(fmt: Format, settings: Settings | None = None) -> str:
    """What ``procpilot tools --format FMT`` prints: every tool's definition, as a JSON array.

    Building the tools needs a supervisor object but never starts it: nothing is spawned.
    """
    supervisor = Supervisor(settings or load_settings())
    return json.dumps(tool_definitions(all_tools(supervisor), fmt), indent=2, ensure_ascii=False)
