"""The contract between the layers above the engine: tool specs, tool results, permission tiers.

A face builds :class:`ToolSpec` objects; the policy gates them by :class:`PermissionTier`; a
transport (MCP, REST, CLI) advertises and calls them and renders :class:`ToolResult`. None of
them needs another's module for it, and faces never see a wire format.
"""

from __future__ import annotations

import contextlib
import difflib
import enum
import json
import logging
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import pydantic

from procpilot.errors import InternalError, InvalidArgument, ProcpilotError

__all__ = [
    "AuditEvent",
    "PermissionTier",
    "ToolResult",
    "ToolSpec",
    "audit_arguments",
    "call_summary",
    "error_result",
    "fields_named",
    "parse_arguments",
    "redact_environment",
    "rename_field",
]

_log = logging.getLogger(__name__)


class PermissionTier(enum.Enum):
    AUTONOMOUS = "autonomous"
    NOTIFY = "notify"
    APPROVAL = "approval_required"
    BLOCKED = "blocked"


@dataclass(frozen=True, slots=True)
class ToolResult:
    """``text`` for the model, ``data`` as structured content; ``is_error`` for typed failures.

    ``structured=False``: the text is the whole result, and a transport sends no structured form
    of it (an MCP client that shows ``structuredContent`` in place of the text, as Claude Code and
    Codex do, would otherwise hide the text); ``data`` stays for the audit and REST.
    """

    text: str
    data: dict[str, Any]
    is_error: bool = False
    structured: bool = True


Handler = Callable[[Mapping[str, Any], str], Awaitable[ToolResult]]


@dataclass(frozen=True, slots=True)
class ToolSpec:
    name: str
    description: str
    input_model: type[pydantic.BaseModel]
    handler: Handler
    tier: PermissionTier = PermissionTier.AUTONOMOUS
    meta: dict[str, Any] = field(default_factory=dict)
    # Actions (its ``action`` argument) of an autonomous tool that change a process's state: the
    # policy gate audits them as it audits a notify-tier call (``process`` kill, write, remove).
    audited_actions: frozenset[str] = frozenset()
    # Every result of this tool is its text alone (a harness profile's tools: faces/codex_profile.py,
    # faces/claude_profile.py), the policy gate's refusals included.
    text_only: bool = False
    # The input schema as served, when it is not the model's own: the strict form an OpenAI client
    # gets (faces/all_tools.served), whose arguments the handler takes back to the model's shape.
    wire_schema: Mapping[str, Any] | None = None

    def input_schema(self) -> dict[str, Any]:
        return self.input_model.model_json_schema()

    async def call(self, arguments: Mapping[str, Any], scope: str) -> ToolResult:
        """Run the tool; every error becomes a typed error result, never a raise.

        An exception that is not a ``ProcpilotError`` is a bug: the caller gets ``InternalError``
        (never the traceback, which can hold paths and other agents' data) and the server log
        gets the traceback. Cancellation is not an error and passes through.
        """
        try:
            result = await self.handler(arguments, scope)
        except Exception as exc:
            result = self.failed(exc, scope)
        if self.text_only and result.structured:
            result = ToolResult(result.text, result.data, result.is_error, structured=False)
        return result

    def failed(self, exc: Exception, scope: str) -> ToolResult:
        """The result of a call whose handler raised ``exc``: what :meth:`call` makes of it, for a
        wrapper that awaits the handler itself (the policy gate). Called in the ``except`` clause,
        so a bug's traceback is the one logged."""
        if isinstance(exc, ProcpilotError):
            return error_result(exc)
        _log.exception("tool %s failed (scope %s)", self.name, scope)
        return error_result(
            InternalError(f"the {self.name} tool failed unexpectedly ({type(exc).__name__})", tool=self.name)
        )


def error_result(exc: ProcpilotError) -> ToolResult:
    # The hints' keys are for programs; the model reads their sentences (a key such as
    # list_processes read as the name of a tool that does not exist).
    hints = "\n".join(f"- {text}" for text in exc.hints.values())
    text = f"{exc.code}: {exc.message}" + (f"\nWhat to do next:\n{hints}" if hints else "")
    return ToolResult(text, exc.to_dict(), is_error=True)


@contextlib.contextmanager
def fields_named(names: Mapping[str, str]) -> Iterator[None]:
    """Errors of the engine's checks (made where every face builds its spec) name the engine's
    field; as they leave a face they name that face's parameter instead (working_directory ->
    workdir), so the agent is pointed at what it sent."""
    try:
        yield
    except ProcpilotError as exc:
        rename_field(exc, names)
        raise


def rename_field(exc: ProcpilotError, names: Mapping[str, str]) -> None:
    """``fields_named`` for a hot path: ``exc`` made to name the face's parameter in place of
    the engine's field, in an ``except`` clause that costs nothing until something is raised."""
    field = exc.details.get("field")
    if isinstance(field, str) and field in names:
        exc.details["field"] = names[field]


def parse_arguments(model: type[pydantic.BaseModel], arguments: Mapping[str, Any]) -> Any:
    """Validate raw arguments into ``model``; a failure is an InvalidArgument naming each field."""
    # Transports pass omitted fields as None; None means "use the default" everywhere here.
    cleaned = {k: v for k, v in arguments.items() if v is not None}
    try:
        return model.model_validate(cleaned)
    except pydantic.ValidationError as exc:
        problems = []
        fields = []
        hints: dict[str, str] = {}
        for err in exc.errors():
            where = ".".join(str(p) for p in err["loc"]) or "(arguments)"
            fields.append(where)
            problem = f"{where}: {err['msg']}"
            if err["type"] == "extra_forbidden" and (close := did_you_mean(model, where)) is not None:
                problem += f" (did you mean {close!r}?)"
                hints[f"use_{close}"] = f"Pass {close!r} instead of {where!r}."
            problems.append(problem)
        raise InvalidArgument(
            "invalid arguments: " + "; ".join(problems),
            hints=hints,
            fields=fields,
        ) from None


def did_you_mean(model: type[pydantic.BaseModel], name: str) -> str | None:
    """The argument of ``model`` closest to the unknown ``name`` (a misspelling, another casing:
    ``yieldms`` for ``yieldMs``), or None when none is close."""
    known: dict[str, str] = {}
    for field_name, info in model.model_fields.items():
        for spelling in (field_name, info.alias):
            if spelling:
                known[spelling.lower()] = spelling
    close = difflib.get_close_matches(name.lower(), list(known), n=1, cutoff=0.75)
    return known[close[0]] if close else None


def dumps(data: Mapping[str, Any]) -> str:
    return json.dumps(data, ensure_ascii=False, separators=(",", ":"))


_ENVIRONMENTS = frozenset({"environment", "env"})
# What a call writes to a process: in an audit trail its size, never its content (typed passwords).
_SIZED = frozenset({"stdin", "data", "text", "literal", "hex", "keys"})


def redact_environment(arguments: Mapping[str, Any]) -> dict[str, Any]:
    """The arguments with environment values hidden: their names are not secrets, values may be."""
    out = dict(arguments)
    for key in _ENVIRONMENTS:
        if isinstance(out.get(key), Mapping):
            out[key] = dict.fromkeys(out[key], "<redacted>")
    return out


def audit_arguments(arguments: Mapping[str, Any]) -> dict[str, Any]:
    """The arguments as an audit trail keeps them: environment values hidden, what is written to a
    process reduced to its size, omitted (None) ones left out, and the rest cut past
    ``AUDIT_ARGUMENTS_BUDGET`` characters and items in all. The trail keeps its last events in
    memory (the console's ring, listeners' queues): uncut, every refused 1 MB command an agent
    sent was a MB held there."""
    command = arguments.get("command")
    if type(command) is str and len(arguments) == 1 and len(command) <= _LONE_COMMAND_KEPT:
        return {"command": command}  # exec's usual call, within the budget: kept as it is
    budget = [AUDIT_ARGUMENTS_BUDGET]
    out: dict[str, Any] = {}
    # Copied with its values hidden only when it has an environment (most calls have none).
    shown = redact_environment(arguments) if not _ENVIRONMENTS.isdisjoint(arguments) else arguments
    for count, (key, value) in enumerate(shown.items()):
        if count >= _AUDIT_NAMES and budget[0] <= 0:
            out["..."] = f"<{len(arguments) - count} more arguments>"
            break
        if value is None:
            continue
        name = str(key)[:64]
        budget[0] -= 1 + len(name)
        if key in _SIZED:
            out[name] = f"<{len(value) if isinstance(value, str | list) else 1} items/chars>"
        else:
            out[name] = _cut(value, budget, 1)
    return out


AUDIT_ARGUMENTS_BUDGET = 4096
_AUDIT_NAMES = 32  # argument names kept past the budget (a schema's worth), each as a short marker
_LONE_COMMAND_KEPT = AUDIT_ARGUMENTS_BUDGET - 1 - len("command")  # the budget its name leaves a command


def _cut(value: Any, budget: list[int], depth: int) -> Any:
    """``value`` with what lies past ``budget[0]`` characters and items (spent as it goes) cut,
    and said: a string ends ``…[N more chars]``, a list or a mapping with ``<N more items>``."""
    if isinstance(value, str):
        keep = max(0, min(len(value), budget[0]))
        budget[0] -= keep
        return value if keep == len(value) else f"{value[:keep]}…[{len(value) - keep} more chars]"
    if not isinstance(value, Mapping | list | tuple):
        return value
    if depth >= 4 or budget[0] <= 0:
        return f"<{len(value)} items>"
    pairs = value.items() if isinstance(value, Mapping) else enumerate(value)
    kept: list[tuple[Any, Any]] = []
    for key, item in pairs:  # stops at the budget: a 100,000-item list is never copied whole
        if budget[0] <= 0:
            break
        budget[0] -= 1
        kept.append((_cut(key, budget, depth + 1), _cut(item, budget, depth + 1)))
    more = len(value) - len(kept)
    if isinstance(value, Mapping):
        return dict(kept) | ({"...": f"<{more} more items>"} if more else {})
    return [item for _, item in kept] + ([f"<{more} more items>"] if more else [])


# -- audit -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AuditEvent:
    """Who did what, when, and what came of it: a notify-tier call or an approval decision, as
    the policy gate (``policy/gate.py``, the one audit wrapper) saw it."""

    scope: str  # the agent
    tool: str
    tier: str
    outcome: str  # ok | error:<Code> | blocked | awaiting_approval | approved | denied | expired
    summary: str
    at: float = field(default_factory=time.time)
    request_id: str | None = None
    decided_by: str | None = None
    process_id: str | None = None  # the session the call touched, or started
    arguments: dict[str, Any] | None = None  # as an audit trail keeps them (audit_arguments)
    duration_ms: int | None = None
    state: str | None = None  # the session's state after the call, where the result says
    # The chat the call came from, as its caller said (procpilot/chat_context.py): provider, session.
    chat: dict[str, str] | None = None


ID_KEYS = ("sessionId", "process_id", "proc_id")  # where a call names the session it touches
_RUN_KEYS = ("command", "cmd", "action")  # what a call runs or does: the first one given is named
_SUMMARY_KEYS = (*ID_KEYS, "signal")  # and every one of these given


def call_summary(tool: str, arguments: Mapping[str, Any]) -> str:
    """One line for people: the tool and what it was asked to run or touch."""
    command = arguments.get("command")
    if type(command) is str and len(arguments) == 1:  # exec's usual call: nothing else to name
        return f"{tool}: {command[:200]}"
    words = []
    for key in _RUN_KEYS:
        value = arguments.get(key)
        if value is not None:
            text = " ".join(map(str, value)) if isinstance(value, list) else str(value)
            extra = arguments.get("args")
            if key == "command" and isinstance(extra, list):
                text += " " + " ".join(map(str, extra))
            words.append(text[:200])
            break
    for key in _SUMMARY_KEYS:
        value = arguments.get(key)
        if value is not None:
            words.append(str(value))
    return f"{tool}: {' '.join(words)}" if words else tool
