"""Tool definitions for every agent framework: MCP, OpenAI (strict function calling), Anthropic.

* ``mcp`` — ``{name, description, inputSchema, outputSchema, annotations, _meta}`` as an MCP
  ``tools/list`` lists them (the same annotations and permission tier the MCP transport serves).
  The input schema is the lean form (:func:`lean_schema`): what a model reads, without pydantic's
  titles, ``X | None`` unions and overflow bounds; the face still validates every argument
  against its own model. ``outputSchema`` (:data:`RESULT_SCHEMA`, not for a text-only tool) is
  open: it declares the fields every model-facing result may carry (the output, its state and next
  step, the exits not told yet) and lets each tool add its own.
* ``openai`` — ``{"type": "function", "function": {name, description, parameters, "strict": true}}``.
  Names with dots become underscores (``process.run`` -> ``process_run``). The schema is rewritten to
  the strict subset: ``$ref`` inlined; every object closed (``additionalProperties: false``) with
  every property required, the optional ones nullable (null means "use the default"); ``default``,
  ``title`` and the validation keywords strict mode refuses dropped: a default or a format the
  description does not state yet is noted there, bounds are left to the face (which refuses an
  out-of-range value naming the field); a free-form map of strings (an environment) becomes an
  array of ``NAME=value`` strings, any other map (``{"type": "object", "additionalProperties":
  {...}}``) an array of ``{"name", "value"}`` pairs.
* ``anthropic`` — ``{name, description, input_schema}``, names matching ``^[a-zA-Z0-9_-]{1,64}$``.

Arguments a model sends back for a rewritten schema go through :func:`native_arguments` (nulls
dropped, ``NAME=value`` strings and pair arrays made maps again) before the tool is called;
:func:`find_tool` maps a wire name back to its tool.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from procpilot.contract import PermissionTier, ToolSpec

__all__ = [
    "RESULT_SCHEMA",
    "Format",
    "find_tool",
    "lean_schema",
    "native_arguments",
    "served_schema",
    "strict_schema",
    "tool_definitions",
    "wire_name",
]

Format = Literal["mcp", "openai", "anthropic"]
FORMATS: tuple[Format, ...] = ("mcp", "openai", "anthropic")

# What a client that shows its model the structured content (Claude Code, Codex) finds in every
# result: the same output, state and next step the text carries (docs/tools.md, "What a model reads").
# Kept short (every served tool repeats it): an exit's fields are the ones each result shows, so
# ``exits`` declares objects without listing them again.
RESULT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "output": {"type": "string", "description": "Within the result budget; a marker line where it was cut."},
        "note": {"type": "string", "description": "The state, in words."},
        "next": {"type": "string", "description": "The call to make next."},
        "exits": {"type": "array", "items": {"type": "object"}, "description": "Exits not told before, each once."},
        "exitsDropped": {"type": "integer"},
    },
    "additionalProperties": True,
}

_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
# Keywords strict mode does not accept (or not everywhere): dropped, and said in the description.
_CONSTRAINTS = (
    "minLength",
    "maxLength",
    "pattern",
    "format",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "multipleOf",
    "minItems",
    "maxItems",
    "uniqueItems",
    "minProperties",
    "maxProperties",
)
# Validation bounds: neither the lean nor the strict form shows them (see _strict and _lean).
_BOUNDS = frozenset(_CONSTRAINTS) - {"pattern", "format"}
_DROPPED = ("title", "examples", "$schema", "$id", "$comment", "readOnly", "writeOnly", "deprecated")


def wire_name(name: str, fmt: Format) -> str:
    """The tool's name in ``fmt``: dots become underscores where the format forbids them."""
    if fmt == "mcp":
        return name
    wire = name.replace(".", "_")
    if not _NAME.match(wire):
        raise ValueError(f"tool name {name!r} cannot be expressed as a {fmt} tool name ({_NAME.pattern})")
    return wire


def find_tool(tools: Sequence[ToolSpec], name: str) -> ToolSpec:
    """The tool a wire name stands for (``process_run`` or ``process.run``)."""
    for spec in tools:
        if name in (spec.name, spec.name.replace(".", "_")):
            return spec
    raise KeyError(name)


# -- schema rewriting --------------------------------------------------------------------------


def _resolve(
    node: Mapping[str, Any], defs: Mapping[str, Any], seen: tuple[str, ...] = ()
) -> tuple[dict[str, Any], tuple[str, ...]]:
    """``node`` with a ``$ref`` into ``$defs`` replaced by the definition (its siblings kept on top),
    and the definitions passed through so far (a recursive schema cannot be inlined)."""
    out = dict(node)
    ref = out.pop("$ref", None)
    if ref is None:
        return out, seen
    prefix = "#/$defs/"
    if not isinstance(ref, str) or not ref.startswith(prefix) or ref[len(prefix) :] not in defs:
        raise ValueError(f"unsupported $ref {ref!r}")
    key = ref[len(prefix) :]
    if key in seen:
        raise ValueError(f"recursive schema through {ref!r} cannot be inlined")
    target, inner = _resolve(defs[key], defs, (*seen, key))
    return {**target, **out}, inner


def _is_map(node: Mapping[str, Any]) -> bool:
    return (
        node.get("type") == "object" and "properties" not in node and isinstance(node.get("additionalProperties"), dict)
    )


def _make_nullable(node: dict[str, Any]) -> dict[str, Any]:
    if "anyOf" in node:
        if not any(branch.get("type") == "null" for branch in node["anyOf"]):
            node["anyOf"] = [*node["anyOf"], {"type": "null"}]
        return node
    kind = node.get("type")
    if isinstance(kind, str):
        if kind != "null":
            node["type"] = [kind, "null"]
    elif isinstance(kind, list):
        if "null" not in kind:
            node["type"] = [*kind, "null"]
    else:
        raise ValueError(f"schema without a type cannot be made strict: {node!r}")
    if "enum" in node and None not in node["enum"]:
        node["enum"] = [*node["enum"], None]
    return node


def _strict(
    node: Mapping[str, Any], defs: Mapping[str, Any], *, nullable: bool, seen: tuple[str, ...] = ()
) -> dict[str, Any]:
    node, seen = _resolve(node, defs, seen)
    notes: list[str] = []
    described = str(node.get("description", ""))
    for key in (*_CONSTRAINTS, "default"):
        if key not in node:
            continue
        value = node.pop(key)
        # Bounds are the face's to enforce (an out-of-range value is an InvalidArgument naming the
        # field); a note is kept for a default and a format, unless the description says it already.
        if key in _BOUNDS or value is None or value is False or _number_text(value) in described:
            continue
        notes.append(f"{key}: {json.dumps(value)}")
    for key in _DROPPED:
        node.pop(key, None)
    node.pop("$defs", None)
    if "oneOf" in node:
        node["anyOf"] = node.pop("oneOf")
    if "allOf" in node:
        parts = node.pop("allOf")
        if len(parts) != 1:
            raise ValueError("allOf with several schemas cannot be made strict")
        node = {**_resolve(parts[0], defs, seen)[0], **node}
    if "anyOf" in node:
        branches = [_strict(b, defs, nullable=False, seen=seen) for b in node["anyOf"] if b.get("type") != "null"]
        has_null = any(b.get("type") == "null" for b in node["anyOf"])
        if len(branches) == 1 and not {k for k in node if k not in ("anyOf", "description")}:
            # X | None: the plain nullable form reads better and is the same schema.
            descriptions = [d for d in (node.get("description"), branches[0].get("description")) if d]
            node = branches[0]
            if descriptions:
                node["description"] = " ".join(descriptions)
            nullable = nullable or has_null
        else:
            node["anyOf"] = branches + ([{"type": "null"}] if has_null else [])
    if _is_map(node) and _resolve(node["additionalProperties"], defs)[0].get("type") == "string":
        # A map of strings (an environment) as NAME=value strings: the form a model knows from
        # `env` and `docker -e`, and a third the size of {name, value} pairs in every definition.
        described = node.get("description", "")
        node = {
            "type": "array",
            "description": (described + " " if described else "") + "As NAME=value.",
            "items": {"type": "string"},
        }
    elif _is_map(node):
        value = _strict(node["additionalProperties"], defs, nullable=False, seen=seen)
        described = node.get("description", "")
        node = {
            "type": "array",
            "description": (described + " " if described else "") + "Given as a list of {name, value} pairs.",
            "items": {
                "type": "object",
                "properties": {"name": {"type": "string"}, "value": value},
                "required": ["name", "value"],
                "additionalProperties": False,
            },
        }
    elif node.get("type") == "object" or "properties" in node:
        properties = node.get("properties", {})
        required = set(node.get("required", []))
        node["type"] = "object"
        node["properties"] = {
            name: _strict(prop, defs, nullable=name not in required, seen=seen) for name, prop in properties.items()
        }
        node["required"] = list(properties)
        extra = node.get("additionalProperties", False)
        if extra not in (False, None) and properties:
            raise ValueError("an object with both properties and additional properties cannot be made strict")
        node["additionalProperties"] = False
    elif node.get("type") == "array" or "items" in node:
        if "items" in node:
            node["items"] = _strict(node["items"], defs, nullable=False, seen=seen)
        elif "prefixItems" in node:
            raise ValueError("tuple schemas (prefixItems) cannot be made strict")
    if notes:
        node["description"] = (node.get("description", "").rstrip() + f" ({'; '.join(notes)})").strip()
    if nullable:
        node = _make_nullable(node)
    return node


def strict_schema(schema: Mapping[str, Any]) -> dict[str, Any]:
    """``schema`` (an object schema, as pydantic writes it) rewritten to OpenAI's strict subset."""
    defs = schema.get("$defs", {})
    out = _strict(copy.deepcopy(dict(schema)), defs, nullable=False)
    if out.get("type") != "object":
        raise ValueError("a strict tool schema must be an object at the root")
    return out


def _number_text(value: Any) -> str:
    """How a description would write ``value`` (``3600``, not ``3600.0``); a non-number never matches."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return "\0"
    return f"{value:g}" if isinstance(value, float) else str(value)


def _lean(node: Any) -> Any:
    if isinstance(node, list):
        return [_lean(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {k: _lean(v) for k, v in node.items() if k != "title" and k not in _BOUNDS}
    branches = out.get("anyOf")
    if isinstance(branches, list) and out.get("default") is None:
        # An optional ``X | None`` (default None): not sending it is how a model says "none",
        # so the schema says X and leaves the name out of ``required``.
        kept = [b for b in branches if b != {"type": "null"}]
        if len(kept) == 1 and len(kept) < len(branches) and isinstance(kept[0], dict):
            del out["anyOf"]
            out = {**kept[0], **out}
    if "default" in out and (out["default"] is None or out["default"] is False):
        del out["default"]  # an optional flag is off unless sent; "none" is not sending it
    return out


def lean_schema(schema: Mapping[str, Any]) -> dict[str, Any]:
    """``schema`` as a model needs to read it: shapes, enums, descriptions and real defaults.

    No ``title``; an optional ``X | None`` is X (leaving the name out says "none"); no null or
    false default; no bounds (``maximum``, ``maxLength``…): the face checks them and refuses an
    out-of-range value with an ``InvalidArgument`` naming the field, so a model learns a bound
    the one time it matters instead of reading every bound on every turn.
    """
    result: dict[str, Any] = _lean(_inline_refs(schema))
    return result


def _inline_refs(schema: Mapping[str, Any]) -> dict[str, Any]:
    """``schema`` with every ``$ref`` into ``$defs`` replaced by its definition (no other change)."""
    defs = schema.get("$defs", {})

    def walk(node: Any, seen: tuple[str, ...]) -> Any:
        if isinstance(node, dict):
            resolved, inner = _resolve(node, defs, seen)
            return {k: walk(v, inner) for k, v in resolved.items() if k != "$defs"}
        if isinstance(node, list):
            return [walk(item, seen) for item in node]
        return node

    result: dict[str, Any] = walk(dict(schema), ())
    return result


# -- arguments back ----------------------------------------------------------------------------


def _native(schema: Mapping[str, Any], value: Any, defs: Mapping[str, Any]) -> Any:
    node = _resolve(schema, defs)[0]
    if value is None:
        return None
    for option in node.get("anyOf", []) + node.get("oneOf", []):
        branch = _resolve(option, defs)[0]
        if (_is_map(branch) and isinstance(value, list)) or (
            branch.get("type") in ("object", "array") and isinstance(value, dict | list)
        ):
            return _native(branch, value, defs)
    if _is_map(node) and isinstance(value, list):
        inner = node["additionalProperties"]
        native: dict[str, Any] = {}
        for item in value:
            if isinstance(item, Mapping) and "name" in item:
                native[item["name"]] = _native(inner, item.get("value"), defs)
            elif isinstance(item, str):
                # NAME=value; an item without "=" is a name with an empty value, as `env NAME=` has it
                name, _, text = item.partition("=")
                native[name] = text
        return native
    if isinstance(value, dict) and "properties" in node:
        props = node["properties"]
        return {k: _native(props.get(k, {}), v, defs) for k, v in value.items() if v is not None}
    if isinstance(value, list) and isinstance(node.get("items"), dict):
        return [_native(node["items"], item, defs) for item in value]
    return value


def native_arguments(spec: ToolSpec, arguments: Mapping[str, Any]) -> dict[str, Any]:
    """Arguments sent for the strict schema, as the tool takes them: nulls dropped, pairs made maps."""
    schema = spec.input_schema()
    result: dict[str, Any] = _native(schema, dict(arguments), schema.get("$defs", {}))
    return result


# -- definitions -------------------------------------------------------------------------------


def served_schema(spec: ToolSpec) -> dict[str, Any]:
    """The input schema an MCP server lists for ``spec``: the one its serving chose (the strict
    form, for OpenAI clients), else the lean form of the face's own."""
    return dict(spec.wire_schema) if spec.wire_schema is not None else lean_schema(spec.input_schema())


def _mcp(spec: ToolSpec) -> dict[str, Any]:
    return {
        "name": spec.name,
        "description": spec.description,
        "inputSchema": served_schema(spec),
        **({} if spec.text_only else {"outputSchema": RESULT_SCHEMA}),
        "annotations": {"title": spec.name, "destructiveHint": spec.tier is not PermissionTier.AUTONOMOUS},
        "_meta": {"procpilot/permission": spec.tier.value, **spec.meta},
    }


def _openai(spec: ToolSpec) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": wire_name(spec.name, "openai"),
            "description": spec.description,
            "parameters": strict_schema(spec.input_schema()),
            "strict": True,
        },
    }


def _anthropic(spec: ToolSpec) -> dict[str, Any]:
    return {
        "name": wire_name(spec.name, "anthropic"),
        "description": spec.description,
        "input_schema": lean_schema(spec.input_schema()),
    }


def tool_definitions(tools: Sequence[ToolSpec], fmt: Format) -> list[dict[str, Any]]:
    """The JSON definitions of ``tools`` for ``fmt`` (see the module docstring)."""
    build = {"mcp": _mcp, "openai": _openai, "anthropic": _anthropic}.get(fmt)
    if build is None:
        raise ValueError(f"unknown format {fmt!r}; use one of {', '.join(FORMATS)}")
    definitions = [build(spec) for spec in tools]
    names = [d["function"]["name"] if fmt == "openai" else d["name"] for d in definitions]
    clashes = sorted({n for n in names if names.count(n) > 1})
    if clashes:
        raise ValueError(f"tool names collide in {fmt} format: {', '.join(clashes)}")
    return definitions
