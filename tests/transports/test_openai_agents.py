"""The OpenAI Agents SDK drives `procpilot mcp` as a user configures it: every tool name is one
OpenAI's function names accept, every schema passes the SDK's own strict check unchanged, and a
call made the strict way (nulls, environment as pairs) goes through."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest

from tests.daemon import PROCPILOT, cli_env

agents_mcp = pytest.importorskip("agents.mcp", reason="the openai-agents package (dev extra) is not installed")
strict_schema = pytest.importorskip("agents.strict_schema")
mcp_util = pytest.importorskip("agents.mcp.util")

OPENAI_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
# Issue 23, finding 6: a definition (name + description + input schema) a model reads, lean or
# strict (every property required and nullable), is at most about 1,500 characters.
DEFINITION_CHARS = 1_500


def _size(name: str, description: str | None, schema: dict[str, object]) -> int:
    return len(name) + len(description or "") + len(json.dumps(schema, separators=(",", ":"), ensure_ascii=False))


def _env(tmp_path: Path) -> dict[str, str]:
    return cli_env(HOME=str(tmp_path), PROCPILOT_STATE_DIR=str(tmp_path / "state"))


async def test_every_served_tool_is_strict_as_the_sdk_checks_it(tmp_path: Path) -> None:
    """Finding 5: with --tool-names underscore, exec and process_run carried open `env` maps, so
    the SDK's strict conversion failed and it silently served them non-strict."""
    args = ["mcp", "--agent", "sdk", "--tool-names", "underscore", "--tools", "exec,process,process.*"]
    params = {"command": PROCPILOT, "args": [*args, "--workspace", str(tmp_path)], "env": _env(tmp_path)}
    async with agents_mcp.MCPServerStdio(params=params, client_session_timeout_seconds=30) as server:
        tools = await server.list_tools()
        names = [tool.name for tool in tools]
        assert {"exec", "process", "process_run", "process_logs"} <= set(names)
        for tool in tools:
            assert OPENAI_NAME.match(tool.name), tool.name
            served = tool.input_schema
            # The SDK's own check, as it runs on every MCP tool with convert_schemas_to_strict.
            function = mcp_util.MCPUtil.to_function_tool(tool, server, convert_schemas_to_strict=True)
            assert function.strict_json_schema, f"{tool.name} served non-strict"
            assert function.params_json_schema == served, f"{tool.name}: the SDK had to change the schema"
            assert strict_schema.ensure_strict_json_schema(copy.deepcopy(served)) == served
            size = _size(tool.name, tool.description, served)
            assert size <= DEFINITION_CHARS, (tool.name, size)
        # A strict caller sends every property: nulls for the unset, the environment as NAME=value.
        exec_props = next(t for t in tools if t.name == "exec").input_schema["properties"]
        arguments = {name: None for name in exec_props}
        arguments |= {"command": "echo $GREETING", "env": ["GREETING=strict-hello"]}
        result = await server.call_tool("exec", arguments)
        assert not result.is_error, result.content[0].text
        assert "strict-hello" in result.content[0].text


async def test_the_default_set_is_small_and_the_instructions_say_what_it_is_for(tmp_path: Path) -> None:
    """Finding 6: seven tools of 11,800-13,900 characters were served to every agent, and a client
    with a tool search showed the first 200 characters of instructions promising exit notices."""
    from mcp import Client
    from mcp.client.stdio import StdioServerParameters

    for profile in ("procpilot", "openclaw"):
        args = ["mcp", "--agent", "a", "--profile", profile, "--workspace", str(tmp_path)]
        params = StdioServerParameters(command=PROCPILOT, args=args, env=_env(tmp_path))
        async with Client(params) as client:
            instructions = client.instructions or ""
            tools = (await client.list_tools()).tools
        assert [tool.name for tool in tools] == ["exec", "process"], profile
        sizes = {t.name: _size(t.name, t.description, t.input_schema) for t in tools}
        assert all(size <= DEFINITION_CHARS for size in sizes.values()), (profile, sizes)
        first = instructions[:200]
        assert first.startswith("procpilot runs shell commands"), first
        assert "announc" not in instructions and "notif" not in instructions  # no client is promised exits


def test_the_readme_example_runs_from_a_venv_of_its_own(tmp_path: Path) -> None:
    """Finding 11: the README's example found procpilot next to its own python, which is wrong in
    a virtual environment that has openai-agents but not procpilot's scripts."""
    import subprocess
    import sys
    import sysconfig

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    code = next(block for block in re.findall(r"^```python\n(.*?)^```$", readme, re.M | re.S) if "agents.mcp" in block)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    # The new venv sees the packages of this one (openai-agents among them), not its scripts.
    site = Path(sysconfig.get_paths(vars={"base": str(venv), "platbase": str(venv)})["purelib"])
    (site / "outer.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    script = tmp_path / "example.py"
    script.write_text(code)
    # procpilot on PATH, installed elsewhere; the SDK starts it with a clean environment, so the
    # wrapper carries this checkout's PYTHONPATH (tests.daemon.cli_env) itself.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    wrapper = bin_dir / "procpilot"
    pythonpath = _env(tmp_path).get("PYTHONPATH", "")
    wrapper.write_text(f'#!/bin/sh\nPYTHONPATH="{pythonpath}" exec "{PROCPILOT}" "$@"\n')
    wrapper.chmod(0o755)
    env = _env(tmp_path) | {"PATH": f"{bin_dir}:/usr/bin:/bin"}
    done = subprocess.run(
        [str(venv / "bin" / "python"), str(script)], env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "['exec', 'process']" in done.stdout
