"""Network and filesystem isolation: a command prefix chosen by probing, failing closed.

* Network off (only loopback): ``unshare --net`` where we may create network namespaces (root),
  ``bwrap --unshare-net`` where bubblewrap is installed, else ``unshare --map-root-user --net`` (an
  unprivileged user namespace). If none works, a request for no network is refused with
  ``IsolationUnavailable``; it never runs with the network silently on.
* Read-only root with only the workspace (and /tmp) writable: bubblewrap only.

The prefix goes *outside* the shell that joins the session's cgroups; ``unshare`` execs in place, so
the leader stays the process we spawned. bubblewrap stays as a small parent and exits with its child.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from procpilot.errors import NotSupported

__all__ = ["Isolation", "IsolationUnavailable", "isolation_capabilities", "isolation_prefix"]


class IsolationUnavailable(NotSupported):
    default_hints = {  # noqa: RUF012 - inherited ClassVar
        "install_bubblewrap": "Install bubblewrap (apt-get install bubblewrap) or run the server as root.",
        "drop_option": "Run without the isolation option if your policy allows it.",
    }


@dataclass(frozen=True, slots=True)
class Isolation:
    network: bool = True  # False: only loopback, in a namespace of its own
    readonly_root: bool = False
    writable: tuple[Path, ...] = ()

    @property
    def empty(self) -> bool:
        return self.network and not self.readonly_root


def _works(argv: list[str]) -> bool:
    try:
        return subprocess.run([*argv, "/bin/true"], capture_output=True, timeout=10, check=False).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@cache
def _network_prefix() -> tuple[str, ...] | None:
    unshare = shutil.which("unshare")
    bwrap = shutil.which("bwrap")
    candidates: list[list[str]] = []
    if unshare:
        candidates.append([unshare, "--net", "--"])
    if bwrap:
        candidates.append([bwrap, "--dev-bind", "/", "/", "--unshare-net", "--die-with-parent", "--"])
    if unshare:
        candidates.append([unshare, "--map-root-user", "--net", "--"])
    for argv in candidates:
        if _works(argv):
            return tuple(argv)
    return None


@cache
def _bwrap() -> str | None:
    bwrap = shutil.which("bwrap")
    if bwrap and _works([bwrap, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--"]):
        return bwrap
    return None


def isolation_capabilities() -> dict[str, str | None]:
    """Which mechanism serves each kind of isolation here (None: unavailable)."""
    net = _network_prefix()
    return {
        "network_off": None if net is None else ("bwrap" if "bwrap" in net[0] else " ".join(net[:-1])),
        "readonly_root": "bwrap" if _bwrap() else None,
    }


def isolation_prefix(isolation: Isolation) -> list[str]:
    """The argv prefix that puts a command inside ``isolation``; raises if that cannot be had."""
    if isolation.empty:
        return []
    if isolation.readonly_root:
        bwrap = _bwrap()
        if bwrap is None:
            raise IsolationUnavailable("a read-only root needs bubblewrap, which is not installed here")
        argv = [bwrap, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp"]  # noqa: S108 - a private tmpfs
        for path in isolation.writable:
            argv += ["--bind", str(path), str(path)]
        if not isolation.network:
            argv.append("--unshare-net")
        return [*argv, "--die-with-parent", "--"]
    net = _network_prefix()
    if net is None:
        raise IsolationUnavailable(
            "network_disabled was asked for, but this host offers no way to take the network away "
            "(no network namespaces, no bubblewrap): refusing to run with the network on"
        )
    return list(net)
