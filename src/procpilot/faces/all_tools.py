"""Every tool procpilot serves, in one list: what the transports (MCP, ``procpilot tools``) carry."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from typing import Any

from procpilot.config import Settings, load_settings
from procpilot.contract import ToolResult, ToolSpec
from procpilot.engine.supervisor import Supervisor
from procpilot.errors import ConfigError
from procpilot.faces.capabilities import capability_tools
from procpilot.faces.claude_profile import claude_tools
from procpilot.faces.codex_profile import codex_tools
from procpilot.faces.definitions import Format, native_arguments, strict_schema, tool_definitions, wire_name
from procpilot.faces.exec_process import exec_process_tools

__all__ = ["MCP_DEFAULT_TOOLS", "all_tools", "definitions_json", "served", "with_default_tools"]

# What ``procpilot mcp`` serves unless told ([tools] serve, --tools), in both profiles: exec and
# process do everything process.* does, and process.* says it again in spec 000's words. Two sets
# would double what a model reads before its first call (docs/tools.md, "What a model reads").
# The codex and claude profiles serve their harness's shell tools alone: what those models were
# trained on, and nothing else to read.
MCP_DEFAULT_TOOLS = ("exec", "process")
_PROFILE_DEFAULT_TOOLS = {
    "codex": ("exec_command", "write_stdin"),
    "claude": ("Bash", "TaskOutput", "TaskStop", "BashOutput", "KillShell"),
}


def all_tools(supervisor: Supervisor, *, notifies_exit: bool | None = None) -> list[ToolSpec]:
    """``exec`` + ``process`` (specs 001/002/004), or the profile's shell tools in their place,
    and ``process.*`` (spec 000), over one supervisor. Unaudited: the policy gate
    (``policy/gate.py``) is the one audit wrapper, around all of them.

    ``notifies_exit`` is whether the transport announces session exits to its clients (see
    ``exec_process_tools``).
    """
    return [
        *_shell_tools(supervisor, notifies_exit),
        *capability_tools(supervisor),
    ]


def _shell_tools(supervisor: Supervisor, notifies_exit: bool | None) -> list[ToolSpec]:
    """The agent's shell tools: exec + process, or a harness's own in their place (the profile)."""
    profile = supervisor.settings.exec.profile
    if profile == "codex":
        return codex_tools(supervisor)
    if profile == "claude":
        return claude_tools(supervisor)
    return exec_process_tools(supervisor, notifies_exit=notifies_exit)


def definitions_json(fmt: Format, settings: Settings | None = None) -> str:
    """What ``procpilot tools --format FMT`` prints: every tool's definition, as a JSON array.

    Building the tools needs a supervisor object but never starts it: nothing is spawned.
    """
    supervisor = Supervisor(settings or load_settings())
    return json.dumps(tool_definitions(all_tools(supervisor), fmt), indent=2, ensure_ascii=False)


def with_default_tools(settings: Settings) -> Settings:
    """``settings`` serving the profile's default set (:data:`MCP_DEFAULT_TOOLS` for ours and
    OpenClaw's) when they name no tool set of their own."""
    if settings.served_tools is not None:
        return settings
    default = _PROFILE_DEFAULT_TOOLS.get(settings.exec.profile, MCP_DEFAULT_TOOLS)
    if not settings.process.enabled:
        # [tools.process] off: no process tool is built, so the default set must not ask for one.
        default = tuple(name for name in default if name != "process")
    return settings.model_copy(update={"tools": settings.tools.model_copy(update={"serve": default})})


def served(tools: Sequence[ToolSpec], settings: Settings) -> list[ToolSpec]:
    """The tools ``[tools] serve`` picks (a name, or a face's tools with ``process.*``), named as
    ``[tools] names`` says (``underscore``: ``process.run`` -> ``process_run``, for OpenAI).

    Served with underscore names, a tool's schema is OpenAI's strict form (what
    ``procpilot tools --format openai`` prints), so the OpenAI Agents SDK and strict function
    calling take it as it is; the arguments sent for it (nulls, ``NAME=value`` strings) are
    made the model's own again before the face sees them, and a map still works.
    """
    picked = list(tools)
    if settings.served_tools is not None:
        wanted = set(settings.served_tools)
        known = {spec.name for spec in tools} | {"process.*"}
        unknown = sorted(wanted - known - {name.replace(".", "_") for name in known})
        if unknown:
            raise ConfigError(
                f"tools.serve: no tool named {', '.join(unknown)}; the tools are {', '.join(sorted(known))}",
                key="tools.serve",
            )
        names = {name.replace("_", ".", 1) if name.startswith("process_") else name for name in wanted}
        picked = [
            spec for spec in picked if spec.name in names or ("process.*" in names and spec.name.startswith("process."))
        ]
    if settings.tool_names == "underscore":
        picked = [_strict_form(spec) for spec in picked]
    return picked


def _strict_form(spec: ToolSpec) -> ToolSpec:
    async def handler(arguments: Mapping[str, Any], scope: str) -> ToolResult:
        return await spec.handler(native_arguments(spec, arguments), scope)

    return dataclasses.replace(
        spec,
        name=wire_name(spec.name, "openai"),
        handler=handler,
        wire_schema=strict_schema(spec.input_schema()),
    )
