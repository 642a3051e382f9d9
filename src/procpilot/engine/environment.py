"""Which variables a caller may set for a command: the one place that decides it, for every face.

Some variables run code or pick programs before any command of the session is read: the dynamic
loader's (``LD_*``, ``DYLD_*``), the shell's start-up hooks (``ENV``, ``BASH_ENV``, exported
functions ``BASH_FUNC_*``, ``PS4`` with ``SHELLOPTS=xtrace``...) and the search paths
(``procpilot.shell.variables`` lists them; the command policy reads the same list when a command
line assigns one itself, ``BASH_ENV=x sh -c ...``).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from procpilot.errors import ProtectedVariable
from procpilot.shell.variables import sensitive_variable

__all__ = ["check_overrides", "is_protected"]


def is_protected(name: str, protected: Collection[str]) -> bool:
    """Whether a call may not override ``name``: the configured names, and always every variable
    that runs code first. Every LD_*/DYLD_* variable steers the loader, so no list of names could
    be complete. PATH alone stays configurable: the command policy resolves programs on the
    session's own PATH."""
    return name in protected or name.startswith(("LD_", "DYLD_")) or (name != "PATH" and sensitive_variable(name))


def check_overrides(overrides: Mapping[str, str], protected: Collection[str]) -> None:
    """Refuse overrides that name a protected variable, all of them named at once."""
    if not overrides:
        return  # the usual call: no generator and no sort on the spawn path
    refused = sorted(name for name in overrides if is_protected(name, protected))
    if refused:
        raise ProtectedVariable(
            "cannot override protected environment variable(s): " + ", ".join(refused),
            variables=refused,
        )
