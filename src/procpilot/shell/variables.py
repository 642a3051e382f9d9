"""Variables that decide which program runs, what it loads, or what the shell runs by itself."""

from __future__ import annotations

__all__ = ["sensitive_variable"]

_SENSITIVE = frozenset({
    "PATH", "ENV", "BASH_ENV", "CDPATH", "SHELLOPTS", "BASHOPTS", "PS0", "PS1", "PS2", "PS3",
    "PS4", "PROMPT_COMMAND", "EXECIGNORE", "FPATH", "ZDOTDIR", "GCONV_PATH", "BASH_LOADABLES_PATH",
})  # fmt: skip
_SENSITIVE_PREFIXES = ("LD_", "DYLD_", "BASH_FUNC_")


def sensitive_variable(name: str) -> bool:
    """Whether setting ``name`` can change which program runs, what it loads or what a shell runs."""
    return name in _SENSITIVE or name.startswith(_SENSITIVE_PREFIXES)
