"""Network and filesystem isolation: a command prefix chosen by probing, failing closed.

* Network off (only loopback): ``unshare --map-root-user --net`` (a user namespace of its own, so
  the child's capabilities do not reach the host's namespaces), else ``bwrap --unshare-net
  --cap-drop ALL``, else ``unshare --net`` + ``setpriv`` dropping every capability. A candidate is
  taken only if a process inside it cannot ``setns`` back into our network namespace: a root child
  of a plain ``unshare --net`` can (``nsenter --net=/proc/1/ns/net``). Last, with no namespace to
  be had, a seccomp filter on socket families (``sandbox_exec --no-network``): it sees families,
  not addresses, so it means no IP at all, *not even loopback*. If none works, a request for no
  network is refused with ``IsolationUnavailable``; it never runs with the network silently on.
* Read-only root with only the workspace (and /tmp) writable: bubblewrap, with no
  capabilities (or ``mount -o remount,rw /`` undoes it), its own pid namespace and /proc (no
  handles on the host's processes and their namespaces) and, unless it runs on a pty of its own, a
  new session (no TIOCSTI into a terminal outside). Else Landlock (``sandbox_exec --landlock``):
  writes denied outside the writable paths, capabilities dropped, but no pid namespace and no
  private /tmp (the host's /tmp stays writable and shared). A private box needs bubblewrap.

Every mechanism is probed once, by a process that proves the restriction holds, not that the tool
runs. The prefix goes *after* the shell that joins the session's cgroups (joins need a writable
/sys); ``unshare`` and ``sandbox_exec`` exec in place, so the leader stays the process we spawned.
bubblewrap stays as a small parent and exits with its child.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from procpilot.engine import sandbox_exec
from procpilot.errors import IsolationUnavailable

__all__ = ["Isolation", "IsolationUnavailable", "isolation_capabilities", "isolation_prefix"]


@dataclass(frozen=True, slots=True)
class Isolation:
    network: bool = True  # False: only loopback, in a namespace of its own
    readonly_root: bool = False
    writable: tuple[Path, ...] = ()
    # A box of its own even with a writable root: a private pid namespace, no capabilities, the
    # cgroup tree and ``hidden`` paths out of sight. What keeps one agent from another's processes.
    private: bool = False
    # Out of sight inside the box: a directory under an empty tmpfs, a file (a config, a socket)
    # under an empty read-only one (/dev/null). The daemon's state, config and socket.
    hidden: tuple[Path, ...] = ()
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
        candidates.append([bwrap, "--dev-bind", "/", "/", "--unshare-net", "--cap-drop", "ALL", "--"])
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


# By path, not ``-m procpilot...``: importing the package would cost every spawn ~200 ms.
_SANDBOX_EXEC = Path(sandbox_exec.__file__)


def _sandbox(*options: str) -> list[str]:
    return [sys.executable, "-I", str(_SANDBOX_EXEC), *options, "--"]


# Exits 3 only if a write inside argv[1] works and one beside it, in argv[2], is refused, while
# reads elsewhere still work.
_LANDLOCK_PROBE = (
    "import os, sys\n"
    "open(os.path.join(sys.argv[1], 'in'), 'w').close()\n"
    "open('/proc/self/status').read()\n"
    "open('/dev/null', 'w').write('x')\n"
    "try:\n"
    "    open(os.path.join(sys.argv[2], 'out'), 'w').close()\n"
    "except PermissionError:\n"
    "    sys.exit(3)\n"
)


@cache
def _landlock() -> bool:
    """True if ``sandbox_exec --landlock`` really leaves only its writable paths writable here."""
    with tempfile.TemporaryDirectory(prefix="procpilot-landlock-") as tmp:
        inside, outside = Path(tmp, "inside"), Path(tmp, "outside")
        inside.mkdir()
        outside.mkdir()
        argv = _sandbox("--landlock", "--writable", str(inside))
        try:
            done = subprocess.run(
                [*argv, sys.executable, "-I", "-c", _LANDLOCK_PROBE, str(inside), str(outside)],
                capture_output=True,
                timeout=10,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired):
            return False
        return done.returncode == 3 and (inside / "in").exists() and not (outside / "out").exists()


# Exits 3 only if no IP socket can be made and a unix socketpair still works.
_SECCOMP_PROBE = (
    "import socket, sys\n"
    "for family in (socket.AF_INET, socket.AF_INET6):\n"
    "    try:\n"
    "        socket.socket(family, socket.SOCK_STREAM).close()\n"
    "    except OSError:\n"
    "        continue\n"
    "    sys.exit(1)\n"
    "a, b = socket.socketpair()\n"
    "a.send(b'x')\n"
    "sys.exit(3 if b.recv(1) == b'x' else 1)\n"
)


@cache
def _seccomp() -> bool:
    """True if ``sandbox_exec --no-network`` really takes IP sockets away here."""
    try:
        done = subprocess.run(
            [*_sandbox("--no-network"), sys.executable, "-I", "-c", _SECCOMP_PROBE],
            capture_output=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 3


def _network_mechanism() -> str | None:
    net = _network_prefix()
    if net is not None:
        return "bwrap" if "bwrap" in net[0] else " ".join(net[:-1])
    return "seccomp" if _seccomp() else None


def isolation_capabilities() -> dict[str, str | None]:
    """Which mechanism serves each kind of isolation here (None: unavailable)."""
    network = _network_mechanism()
    bwrap = _bwrap()
    readonly = "bwrap" if bwrap else ("landlock" if _landlock() else None)
    return {
        "network_off": network,
        # What "network off" leaves: a loopback of its own, or (seccomp) no IP at all.
        "network_off_loopback": None if network is None else ("none" if network == "seccomp" else "private"),
        "readonly_root": readonly,
        "private_box": "bwrap" if bwrap else None,
    }


def isolation_prefix(isolation: Isolation) -> list[str]:
    """The argv prefix that puts a command inside ``isolation``; raises if that cannot be had."""
    if isolation.empty:
        return []
    bwrap = _bwrap()
    if isolation.private and bwrap is None:
        raise IsolationUnavailable("a private box needs bubblewrap, which is not installed here")
    if bwrap is not None and (isolation.readonly_root or isolation.private):
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
            elif path.exists():
                argv += ["--ro-bind", "/dev/null", str(path)]
        if not isolation.network:
            argv.append("--unshare-net")
        # No --die-with-parent: bubblewrap's parent is the server, and a box must outlive a server
        # crash like any session (adopted by the next one); its tree kill ends it, not its parent.
        return [*argv, "--"]
    options: list[str] = []
    if isolation.readonly_root:
        if not _landlock():
            raise IsolationUnavailable(
                "a read-only root was asked for, but this host has neither bubblewrap nor Landlock: "
                "refusing to run with the root writable"
            )
        # No private tmpfs without a mount namespace: the host's /tmp, shared with everyone.
        options += ["--landlock", "--writable", "/tmp"]  # noqa: S108
        for path in isolation.writable:
            options += ["--writable", str(path)]
    prefix: list[str] = []
    if not isolation.network:
        net = _network_prefix()
        if net is not None:
            # Outside the wrapper: Landlock would refuse unshare its write to /proc/self/uid_map.
            prefix = list(net)
        elif _seccomp():
            options.append("--no-network")
        else:
            raise IsolationUnavailable(
                "network_disabled was asked for, but this host offers no way to take the network away "
                "(no network namespaces, no bubblewrap, no seccomp): refusing to run with the network on"
            )
    return [*prefix, *_sandbox(*options)] if options else prefix
