"""Tool definitions for MCP, OpenAI (strict) and Anthropic, checked against each format's rules."""

from __future__ import annotations

import json
import re
from typing import Any, Literal

import pytest
from mcp import Client
from pydantic import BaseModel, Field

from procpilot.config import Settings, load_settings
from procpilot.contract import PermissionTier, ToolResult, ToolSpec, parse_arguments
from procpilot.engine.supervisor import Supervisor
from procpilot.faces.all_tools import all_tools, definitions_json, served
from procpilot.faces.definitions import (
    find_tool,
    lean_schema,
    native_arguments,
    strict_schema,
    tool_definitions,
    wire_name,
)
from procpilot.transports.mcp import build_mcp_server

ANTHROPIC_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
TYPES = {"string", "number", "integer", "boolean", "object", "array", "null"}
# Keywords OpenAI's strict mode refuses (or refused: older models still do).
FORBIDDEN = {
    "default",
    "$ref",
    "$defs",
    "definitions",
    "title",
    "oneOf",
    "allOf",
    "not",
    "if",
    "then",
    "else",
    "patternProperties",
    "propertyNames",
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
    "prefixItems",
}
EXPECTED_NAMES = ["exec", "process", "process.run", "process.monitor", "process.kill", "process.list", "process.logs"]


def assert_openai_strict(schema: Any, path: str = "$", depth: int = 0, counts: list[int] | None = None) -> None:
    """Walk a schema and assert OpenAI's strict function-calling rules at every node."""
    root = counts is None
    counts = [0] if counts is None else counts
    assert isinstance(schema, dict), path
    assert depth <= 10, f"{path}: nested deeper than 10 levels"
    bad = FORBIDDEN & set(schema)
    assert not bad, f"{path}: keywords strict mode refuses: {sorted(bad)}"
    if root:
        assert schema.get("type") == "object", f"{path}: the root must be a plain object"
        assert "anyOf" not in schema, f"{path}: the root must not be anyOf"
    if "anyOf" in schema:
        for i, branch in enumerate(schema["anyOf"]):
            assert_openai_strict(branch, f"{path}.anyOf[{i}]", depth + 1, counts)
        return
    assert "type" in schema, f"{path}: every schema needs a type"
    kinds = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
    assert kinds and set(kinds) <= TYPES, f"{path}: bad type {schema['type']!r}"
    if "enum" in schema:
        for value in schema["enum"]:
            kind = {str: "string", int: "integer", float: "number", bool: "boolean", type(None): "null"}[type(value)]
            assert kind in kinds, f"{path}: enum value {value!r} does not match type {kinds}"
    if "object" in kinds:
        assert schema.get("additionalProperties") is False, f"{path}: additionalProperties must be false"
        props = schema.get("properties")
        assert isinstance(props, dict), f"{path}: an object needs properties"
        required = schema.get("required")
        assert isinstance(required, list) and sorted(required) == sorted(props), f"{path}: every property required"
        assert len(required) == len(set(required)), f"{path}: duplicate required entries"
        counts[0] += len(props)
        for name, prop in props.items():
            assert_openai_strict(prop, f"{path}.{name}", depth + 1, counts)
    if "array" in kinds:
        assert "items" in schema, f"{path}: an array needs items"
        assert_openai_strict(schema["items"], f"{path}[]", depth + 1, counts)
    if root:
        assert counts[0] <= 5000, "more than 5000 properties"


@pytest.fixture
def tools(supervisor: Supervisor) -> list[ToolSpec]:
    return all_tools(supervisor)


# -- the validator itself ----------------------------------------------------------------------------


def test_validator_refuses_non_strict_schemas(tools: list[ToolSpec]) -> None:
    for spec in tools:  # the raw pydantic schemas have defaults and optional properties
        with pytest.raises(AssertionError):
            assert_openai_strict(spec.input_schema())
    with pytest.raises(AssertionError, match="additionalProperties"):
        assert_openai_strict({"type": "object", "properties": {}, "required": []})
    with pytest.raises(AssertionError, match="every property required"):
        assert_openai_strict(
            {"type": "object", "properties": {"a": {"type": "string"}}, "required": [], "additionalProperties": False}
        )
    with pytest.raises(AssertionError, match="needs a type"):
        assert_openai_strict(
            {"type": "object", "properties": {"a": {}}, "required": ["a"], "additionalProperties": False}
        )


# -- OpenAI ----------------------------------------------------------------------------------------------


def test_openai_definitions_are_strict(tools: list[ToolSpec]) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    definitions = tool_definitions(tools, "openai")
    assert [d["function"]["name"] for d in definitions] == [n.replace(".", "_") for n in EXPECTED_NAMES]
    for definition in definitions:
        assert definition["type"] == "function" and set(definition) == {"type", "function"}
        function = definition["function"]
        assert set(function) == {"name", "description", "parameters", "strict"}
        assert function["strict"] is True and function["description"]
        assert re.fullmatch(r"[a-zA-Z0-9_-]{1,64}", function["name"])
        assert_openai_strict(function["parameters"])
        jsonschema.Draft202012Validator.check_schema(function["parameters"])
    json.dumps(definitions)  # plain JSON all the way down


def test_openai_schema_keeps_the_meaning(tools: list[ToolSpec]) -> None:
    run = tool_definitions([find_tool(tools, "process.run")], "openai")[0]["function"]["parameters"]
    props = run["properties"]
    assert props["command"]["type"] == "string"  # required stays non-nullable
    assert props["timeout"]["type"] == ["integer", "null"]
    assert "300" in props["timeout"]["description"]  # the bound (3600) is the face's to refuse
    assert props["args"]["type"] == ["array", "null"] and props["args"]["items"] == {"type": "string"}
    env = props["environment"]
    assert env["type"] == ["array", "null"] and env["items"] == {"type": "string"}
    assert "NAME=value" in env["description"]
    kill = tool_definitions([find_tool(tools, "process.kill")], "openai")[0]["function"]["parameters"]
    assert kill["properties"]["signal"]["enum"][-1] is None and "SIGKILL" in kill["properties"]["signal"]["enum"]


def test_strict_arguments_come_back_native_and_run(tools: list[ToolSpec]) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    spec = find_tool(tools, "process_run")
    schema = tool_definitions([spec], "openai")[0]["function"]["parameters"]
    sent = dict.fromkeys(schema["required"])
    sent |= {"command": 'echo "$GREETING"', "environment": ["GREETING=hi there", "EMPTY"]}
    jsonschema.validate(sent, schema)  # what a strict model would send
    native = native_arguments(spec, sent)
    assert native == {"command": 'echo "$GREETING"', "environment": {"GREETING": "hi there", "EMPTY": ""}}
    params = parse_arguments(spec.input_model, native)
    assert params.environment == {"GREETING": "hi there", "EMPTY": ""} and params.timeout == 300
    # {name, value} pairs, the strict form before NAME=value, still come back as a map
    pairs = native_arguments(spec, {"environment": [{"name": "GREETING", "value": "a=b"}]})
    assert pairs == {"environment": {"GREETING": "a=b"}}


async def test_strict_arguments_drive_a_real_call(tools: list[ToolSpec]) -> None:
    spec = find_tool(tools, "process_run")
    schema = tool_definitions([spec], "openai")[0]["function"]["parameters"]
    sent = dict.fromkeys(schema["required"]) | {
        "command": 'echo "$GREETING"',
        "environment": ["GREETING=hi there"],
    }
    result: ToolResult = await spec.call(native_arguments(spec, sent), "agent-d")
    assert not result.is_error and result.data["stdout_summary"] == "hi there\n"


class Inner(BaseModel):
    mode: Literal["a", "b"] = "a"
    count: int = Field(1, ge=1)


class Outer(BaseModel):
    name: str
    inner: Inner | None = None
    items: list[Inner] = Field(default_factory=list)
    tags: dict[str, int] | None = None
    either: int | str = 0


class Node(BaseModel):
    children: list[Node] = Field(default_factory=list)


def test_nested_models_are_inlined_and_strict() -> None:
    schema = Outer.model_json_schema()
    assert "$defs" in schema
    strict = strict_schema(schema)
    assert_openai_strict(strict)
    inner = strict["properties"]["inner"]
    assert inner["type"] == ["object", "null"] and inner["properties"]["mode"]["enum"] == ["a", "b", None]
    assert strict["properties"]["items"]["items"]["required"] == ["mode", "count"]
    assert {b["type"] for b in strict["properties"]["either"]["anyOf"]} == {"integer", "string", "null"}
    spec = ToolSpec("t", "d", Outer, _never)
    sent = {
        "name": "n",
        "inner": {"mode": None, "count": 3},
        "items": [{"mode": "b", "count": None}],
        "tags": [{"name": "x", "value": 1}],
        "either": None,
    }
    native = native_arguments(spec, sent)
    assert native == {"name": "n", "inner": {"count": 3}, "items": [{"mode": "b"}], "tags": {"x": 1}}
    assert Outer.model_validate(native).tags == {"x": 1}


def test_recursive_models_are_refused() -> None:
    with pytest.raises(ValueError, match="recursive"):
        strict_schema(Node.model_json_schema())


async def _never(arguments: Any, scope: str) -> ToolResult:
    raise AssertionError("not called")


# -- MCP and Anthropic ------------------------------------------------------------------------------------


async def test_mcp_definitions_match_what_the_server_lists(supervisor: Supervisor, tools: list[ToolSpec]) -> None:
    definitions = tool_definitions(tools, "mcp")
    assert [d["name"] for d in definitions] == EXPECTED_NAMES
    server = build_mcp_server(tools, scope="agent-d")
    async with Client(server) as client:
        listed = {t.name: t.model_dump(by_alias=True, exclude_none=True) for t in (await client.list_tools()).tools}
    for definition in definitions:
        served = listed[definition["name"]]
        assert set(definition) == {"name", "description", "inputSchema", "outputSchema", "annotations", "_meta"}
        assert definition["inputSchema"] == served["inputSchema"]
        assert definition["outputSchema"] == served["outputSchema"]
        assert definition["description"] == served["description"]
        assert definition["_meta"] == served["_meta"]
        assert definition["annotations"] == served["annotations"]
    tiers = {d["name"]: d["_meta"]["procpilot/permission"] for d in definitions}
    assert tiers["process.run"] == tiers["process.kill"] == tiers["exec"] == "notify"
    assert tiers["process.monitor"] == tiers["process.list"] == tiers["process.logs"] == "autonomous"


def test_anthropic_definitions(tools: list[ToolSpec]) -> None:
    definitions = tool_definitions(tools, "anthropic")
    assert [d["name"] for d in definitions] == [n.replace(".", "_") for n in EXPECTED_NAMES]
    for definition, spec in zip(definitions, tools, strict=True):
        assert set(definition) == {"name", "description", "input_schema"}
        assert ANTHROPIC_NAME.match(definition["name"])
        assert definition["input_schema"] == lean_schema(spec.input_schema())
        assert definition["input_schema"]["type"] == "object"


def test_anthropic_schema_inlines_refs() -> None:
    spec = ToolSpec("x.y", "d", Outer, _never)
    (definition,) = tool_definitions([spec], "anthropic")
    assert definition["name"] == "x_y"
    text = json.dumps(definition["input_schema"])
    assert "$ref" not in text and "$defs" not in text


# -- names and formats ------------------------------------------------------------------------------------


def test_names_and_lookup(tools: list[ToolSpec]) -> None:
    assert wire_name("process.run", "openai") == "process_run"
    assert wire_name("process.run", "anthropic") == "process_run"
    assert wire_name("process.run", "mcp") == "process.run"
    assert find_tool(tools, "process_logs").name == find_tool(tools, "process.logs").name == "process.logs"
    with pytest.raises(KeyError):
        find_tool(tools, "process_nope")
    with pytest.raises(ValueError, match="cannot be expressed"):
        wire_name("x" * 65, "openai")
    with pytest.raises(ValueError, match="cannot be expressed"):
        wire_name("has space", "anthropic")


def test_name_collisions_and_unknown_formats_are_refused() -> None:
    a = ToolSpec("a.b", "d", Inner, _never, PermissionTier.AUTONOMOUS)
    b = ToolSpec("a_b", "d", Inner, _never, PermissionTier.AUTONOMOUS)
    assert len(tool_definitions([a, b], "mcp")) == 2
    for fmt in ("openai", "anthropic"):
        with pytest.raises(ValueError, match="collide"):
            tool_definitions([a, b], fmt)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown format"):
        tool_definitions([a], "gemini")  # type: ignore[arg-type]


@pytest.mark.parametrize("fmt", ["mcp", "openai", "anthropic"])
def test_definitions_json_for_the_cli(settings: Settings, fmt: Literal["mcp", "openai", "anthropic"]) -> None:
    printed = json.loads(definitions_json(fmt, settings))
    assert len(printed) == len(EXPECTED_NAMES)
    if fmt == "openai":
        for definition in printed:
            assert_openai_strict(definition["function"]["parameters"])
    else:
        names = [d["name"] for d in printed]
        assert names == (EXPECTED_NAMES if fmt == "mcp" else [n.replace(".", "_") for n in EXPECTED_NAMES])


DEFINITION_CHARS = 1_500  # issue 23: "each tool's definition (description + schema) at most about 1,500"
OUTPUT_SCHEMA_CHARS = 450  # the result schema every structured tool repeats


def _compact(value: object) -> int:
    return len(json.dumps(value, separators=(",", ":"), ensure_ascii=False))


@pytest.mark.parametrize("profile", ["procpilot", "openclaw", "codex", "claude"])
def test_every_definition_a_model_reads_is_small(profile: str) -> None:
    """Issue 23, finding 6: exec, process and process.run were 2,600-3,700 characters each, and
    then still 1,631 (process.run, lean) and 2,024 (strict): every tool of every profile, as each
    format prints it and as MCP serves it lean and strict, is name + description + input schema
    within 1,500 characters, and the output schema it adds is small."""
    for names in ("dotted", "underscore"):
        settings = load_settings(env={}, exec={"profile": profile}, tool_names=names)
        tools = all_tools(Supervisor(settings))
        printed = [json.loads(definitions_json(fmt, settings)) for fmt in ("mcp", "openai", "anthropic")]
        for definition in [*tool_definitions(served(tools, settings), "mcp"), *(d for fmt in printed for d in fmt)]:
            body = definition.get("function", definition)
            schema = body.get("inputSchema") or body.get("input_schema") or body.get("parameters")
            size = len(body["name"]) + len(body["description"]) + _compact(schema)
            assert size <= DEFINITION_CHARS, (names, body["name"], size)
            assert '"title"' not in json.dumps(schema)
            if "outputSchema" in body:
                assert _compact(body["outputSchema"]) <= OUTPUT_SCHEMA_CHARS, body["name"]
