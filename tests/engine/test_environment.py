"""Which variables a call may set: the engine's one check, whatever face or policy is in front."""

from __future__ import annotations

from pathlib import Path

import pytest

from procpilot.config import load_settings
from procpilot.engine.environment import check_overrides, is_protected
from procpilot.errors import ProtectedVariable


@pytest.mark.parametrize(
    ("name", "protected"),
    [
        ("LD_FOO", True),
        ("LD_PRELOAD", True),
        ("DYLD_X", True),
        ("DYLD_INSERT_LIBRARIES", True),
        ("PATH", True),
        ("PYTHONPATH", True),
        ("FOO", False),
        ("PATHS", False),
        ("MY_LD_FOO", False),
        ("ld_foo", False),
    ],
)
def test_is_protected(name: str, protected: bool) -> None:
    assert is_protected(name, load_settings(env={}).env.protected) is protected


def test_configured_protected_list_and_prefixes(tmp_path: Path) -> None:
    cfg = tmp_path / "procpilot.toml"
    cfg.write_text('[env]\nprotected = ["SECRET"]\n')
    protected = load_settings(cfg, env={}).env.protected
    assert is_protected("SECRET", protected)
    assert not is_protected("PATH", protected)  # the list is replaced, not extended
    assert is_protected("LD_ANYTHING", protected)  # the loader prefixes are always protected
    assert is_protected("DYLD_ANYTHING", protected)


def test_shell_hooks_are_protected_whatever_the_configured_list() -> None:
    for name in ("BASH_ENV", "ENV", "BASH_FUNC_ls%%", "PS4", "SHELLOPTS", "BASHOPTS", "PROMPT_COMMAND", "LD_AUDIT"):
        assert is_protected(name, ("SECRET",)), name
    assert not is_protected("PATH", ("SECRET",))  # configurable: the policy resolves on the session's PATH
    assert not is_protected("ENVIRONMENT", ("SECRET",))


def test_every_refused_name_is_named_at_once() -> None:
    with pytest.raises(ProtectedVariable) as info:
        check_overrides({"LD_PRELOAD": "x", "FOO": "1", "BASH_ENV": "y"}, ("PATH",))
    assert info.value.details["variables"] == ["BASH_ENV", "LD_PRELOAD"]
    check_overrides({"FOO": "1", "PATHS": "2"}, ("PATH",))  # nothing protected: no error
