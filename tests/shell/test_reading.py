"""One call's shell text, read once: the preflight, the policy and the pre-check share its lexing."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import pytest

import procpilot.engine.precheck
import procpilot.shell.first
from procpilot.config import load_settings
from procpilot.engine.spawn import SpawnSpec
from procpilot.engine.supervisor import Supervisor
from procpilot.faces.exec_process import exec_process_tools
from procpilot.policy.spawn_filter import make_spawn_filter
from procpilot.shell.lexer import Lexer
from procpilot.shell.reading import ShellText
from tests.shell.test_first import PROGRAMS, SHELL_DECIDES


@pytest.mark.parametrize(("command", "program"), [*PROGRAMS, *((c, None) for c in SHELL_DECIDES)])
def test_the_first_program_read_from_tokens_is_the_fast_readers(command: str, program: str | None) -> None:
    """Where the policy or the preflight lexed the line, the pre-check reads its tokens: the
    answer must be the one the fast first-command pass gives when nothing else read it."""
    text = ShellText(command)
    text.lexed()
    assert text.first_program() == program


@pytest.mark.parametrize("command", ["$'ls' x", ">out ls", "{fd}>x ls", 'nosuch "x', "ls\\"])
def test_the_reading_from_tokens_steps_aside_where_the_shell_decides(command: str) -> None:
    text = ShellText(command)
    text.lexed()
    assert text.first_program() is None


def test_a_spec_travels_with_its_text_and_not_its_tokens() -> None:
    """A cluster pickles the spec to a node: the reading goes as its text (its lock cannot)."""
    spec = SpawnSpec("ls | wc -l")
    assert spec.shell is not None
    spec.shell.lexed()
    copy = pickle.loads(pickle.dumps(spec))  # noqa: S301 - our own bytes, as Ray sends them
    assert copy == spec
    assert copy.shell is not None and copy.shell.text == "ls | wc -l"
    assert copy.shell.commands() == [("ls", ()), ("wc", ("-l",))]
    assert SpawnSpec(("ls", "-l")).shell is None


async def test_one_exec_reads_its_shell_text_once(
    tmp_path: Path, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through the exec face with all three readers on (the openclaw profile's script preflight,
    an allowlist, the pre-check), the command's text is read once: one lexing, no second pass."""
    cfg = tmp_path / "policy.toml"
    cfg.write_text('[policy.agents.a]\nallow = ["python3", "cat"]\n')
    settings = load_settings(
        cfg, env={}, state_dir=tmp_path / "state", workspace_root=workspace, exec={"profile": "openclaw"}
    )
    (workspace / "ok.py").write_text("print('ran')\n")
    command = "python3 ok.py && cat ok.py"
    reads: list[str] = []

    real_init = Lexer.__init__

    def counting_init(self: Lexer, text: str, *args: Any, **kwargs: Any) -> None:
        if text == command and not args[2:] and not kwargs.get("pos"):  # the whole line, not a $( ) in it
            reads.append("lexer")
        real_init(self, text, *args, **kwargs)

    real_first = procpilot.shell.first.first_program

    def counting_first(text: str) -> str | None:
        reads.append("first")
        return real_first(text)

    monkeypatch.setattr(Lexer, "__init__", counting_init)
    monkeypatch.setattr(procpilot.shell.first, "first_program", counting_first)
    monkeypatch.setattr(procpilot.engine.precheck, "first_program", counting_first, raising=False)
    async with Supervisor(settings, spawn_filter=make_spawn_filter(settings)) as sup:
        exec_tool = next(tool for tool in exec_process_tools(sup) if tool.name == "exec")
        result = await exec_tool.call({"command": command, "yieldMs": 10_000}, "a")
    assert result.data["exitCode"] == 0 and "ran" in result.data["output"], result.text
    assert reads == ["lexer"]


def test_after_the_pre_check_only_a_short_lines_tokens_stay() -> None:
    """A session keeps its spec as long as it lives: a long line's tokens (megabytes at 120 KiB)
    must not stay with it; a short one's serve the session's display name."""
    short, long = ShellText("make -j4 && ./run"), ShellText("echo " + "word " * 1000)
    for text in (short, long):
        text.lexed()
        text.lexed("inner text a wrapper ran")
        text.first_program()
    assert short.lexed_already() is not None and long.lexed_already() is None
