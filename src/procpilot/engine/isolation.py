"""Network and filesystem isolation: a command prefix chosen by probing, failing closed.

* Network off (only loopback): ``unshare --map-root-user --net`` (a user namespace of its own, so
  the child's capabilities do not reach the host's namespaces), else ``bwrap --unshare-net
  --cap-drop ALL``, else ``unshare --net`` + ``setpriv`` dropping every capability. A candidate is
  taken only if a process inside it cannot ``setns`` back into our network namespace: a root child
  of a plain ``unshare --net`` can (``nsenter --net=/proc/1/ns/net``). If none works, a request for
  no network is refused with ``IsolationUnavailable``; it never runs with the network silently on.
* Read-only root with only the workspace (and /tmp) writable: bubblewrap only, with no
  capabilities (or ``mount -o remount,rw /`` undoes it), its own pid namespace and /proc (no
  handles on the host's processes and their namespaces) and, unless it runs on a pty of its own, a
  new session (no TIOCSTI into a terminal outside).

The prefix goes *outside* the shell that joins the session's cgroups; ``unshare`` execs in place, so
the leader stays the process we spawned. bubblewrap stays as a small parent and exits with its child.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
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
    # A box of its own even with a writable root: a private pid namespace, no capabilities, the
    # cgroup tree and ``hidden`` paths out of sight. What keeps one agent from another's processes.
    private: bool = False
    hidden: tuple[Path, ...] = ()  # covered by an empty tmpfs inside the box (the state directory)
    # A session of its own inside the sandbox (bubblewrap --new-session). False for a pty session:
    # its terminal is its own, and without it as controlling terminal ^C and job control are gone.
    new_session: bool = True

    @property
    def empty(self) -> bool:
        return self.network and not self.readonly_root and not self.private


def _works(argv: list[str]) -> bool:
    try:
        return subprocess.run([*argv, "/bin/true"], capture_output=True, timeout=10, check=False).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


# Exits 0 only if it could join the network namespace of the process named by argv[1].
_SETNS_PROBE = (
    "import ctypes, os, sys\n"
    "try:\n"
    "    fd = os.open(f'/proc/{sys.argv[1]}/ns/net', os.O_RDONLY)\n"
    "except OSError:\n"
    "    sys.exit(3)\n"
    "sys.exit(0 if ctypes.CDLL(None, use_errno=True).setns(fd, 0x40000000) == 0 else 3)\n"
)


def _contains_network(argv: list[str]) -> bool:
    """True if a command run under ``argv`` cannot get back into our network namespace."""
    try:
        done = subprocess.run(
            [*argv, sys.executable, "-c", _SETNS_PROBE, str(os.getpid())], capture_output=True, timeout=10, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 3


@cache
def _network_prefix() -> tuple[str, ...] | None:
    unshare = shutil.which("unshare")
    bwrap = shutil.which("bwrap")
    setpriv = shutil.which("setpriv")
    candidates: list[list[str]] = []
    if unshare:
        candidates.append([unshare, "--map-root-user", "--net", "--"])
    if bwrap:
        candidates.append(
            [bwrap, "--dev-bind", "/", "/", "--unshare-net", "--cap-drop", "ALL", "--die-with-parent", "--"]
        )
    if unshare and setpriv:
        # An empty bounding set: not even root gets a capability back by exec'ing.
        candidates.append([unshare, "--net", "--", setpriv, "--bounding-set=-all", "--inh-caps=-all", "--"])
    for argv in candidates:
        if _works(argv) and _contains_network(argv):
            return tuple(argv)
    return None


# Without capabilities (no remount, no setns), in a pid namespace of its own (no handles on the
# host's processes). --new-session (no TIOCSTI into a terminal outside) is added per session.
_BWRAP_BOX = ("--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--unshare-pid", "--cap-drop", "ALL")
# The cgroup tree: root owns its files, so even without capabilities a process could move itself out
# of its session's cgroups (and their limits) or write another session's cgroup.kill.
_CGROUP_FS = Path("/sys/fs/cgroup")


@cache
def _bwrap() -> str | None:
    bwrap = shutil.which("bwrap")
    if bwrap and _works([bwrap, *_BWRAP_BOX, "--"]):
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
    if isolation.readonly_root or isolation.private:
        bwrap = _bwrap()
        if bwrap is None:
            what = "a read-only root" if isolation.readonly_root else "a private box"
            raise IsolationUnavailable(f"{what} needs bubblewrap, which is not installed here")
        if isolation.readonly_root:
            argv = [bwrap, *_BWRAP_BOX, "--tmpfs", "/tmp"]  # noqa: S108 - a private tmpfs
            for path in isolation.writable:
                argv += ["--bind", str(path), str(path)]
        else:
            argv = [bwrap, "--bind", "/", "/", *_BWRAP_BOX[3:]]
        if isolation.new_session:
            argv.append("--new-session")
        # After the binds: a hidden path inside a writable one (the state dir in the workspace) stays hidden.
        for path in (*isolation.hidden, _CGROUP_FS):
            if path.is_dir():
                argv += ["--tmpfs", str(path)]
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
