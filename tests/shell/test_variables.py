"""Which variables decide what program runs, what it loads, or what a shell runs by itself
(shell/variables.py): those an agent's override must never set quietly."""

from __future__ import annotations

import pytest

from procpilot.shell.variables import sensitive_variable


@pytest.mark.parametrize(
    "name",
    ["PATH", "BASH_ENV", "ENV", "PROMPT_COMMAND", "PS4", "LD_PRELOAD", "LD_LIBRARY_PATH", "DYLD_INSERT_LIBRARIES",
     "BASH_FUNC_ls%%", "GCONV_PATH", "ZDOTDIR", "SHELLOPTS"],
)  # fmt: skip
def test_variables_that_choose_or_load_code_are_sensitive(name: str) -> None:
    assert sensitive_variable(name)


@pytest.mark.parametrize("name", ["HOME", "LANG", "TERM", "MY_PATH", "path", "LDFLAGS", "PS", "BASH", "NODE_ENV"])
def test_ordinary_variables_are_not(name: str) -> None:
    # Names only: a variable is sensitive by its exact name (case counts) or its prefix, no more.
    assert not sensitive_variable(name)
