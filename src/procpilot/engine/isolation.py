"""Network and filesystem isolation: a command prefix chosen by probing, failing closed.

* Network off (only loopback): ``unshare --map-root-user --net`` (a user namespace of its own, so
  the child's capabilities do not reach the host's namespaces), else ``bwrap --unshare-net
  --cap-drop ALL``, else ``unshare --net`` + ``setpriv`` dropping every capability. A candidate is
  taken only if a process inside it cannot ``setns`` back into our network namespace: a root child
  of a plain ``unshare --net`` can (``nsenter --net=/proc/1/ns/net``). Last, with no namespace to
  be had and only if the box allows the ``seccomp`` fallback, a seccomp filter on socket families
  (``sandbox_exec --no-network``): it sees families, not addresses, so it means no IP at all, *not
  even loopback*, and the host's abstract unix sockets stay reachable. Otherwise a request for no
  network is refused with ``IsolationUnavailable``; it never runs with the network silently on.
* Read-only root with only the workspace (and /tmp) writable: bubblewrap, with no
  capabilities (or ``mount -o remount,rw /`` undoes it), its own pid namespace and /proc (no
  handles on the host's processes and their namespaces) and, unless it runs on a pty of its own, a
  new session (no TIOCSTI into a terminal outside). Else, only if the box allows the
  ``landlock`` fallback, Landlock (``sandbox_exec --landlock``): writes denied outside the
  writable paths, capabilities dropped, but no pid namespace, no private /tmp (the host's /tmp
  stays writable and shared) and nothing hidden. A private box needs bubblewrap.
* Hidden paths (bubblewrap): a directory under an empty tmpfs. A file, or a path that does not
  exist yet, by its directory: an empty tmpfs over the directory, every other entry in it bound
  back. A mask on the file itself would not last: a socket unlinked and bound again (a daemon's
  re-exec) or a config file replaced by rename detaches a mount on it, and a path that does not
  exist has nothing to mount on in a read-only root. The price: inside the box, entries made in
  that directory later (on either side) are not shared, and in a read-only box the directory's
  own top level is read-only even where it lies in a writable path.

Every mechanism is probed by a process that proves the restriction holds, not that the tool runs.
A definitive answer (it works, it is absent, it fails) is kept for the daemon's life; a probe that
gives none (it timed out on a loaded host, or the OS would not start it for now) is tried again at
once, then on the next call, and never read as "not installed". A box never silently becomes a
weaker one: Landlock for a read-only root, seccomp for no network, only where the box's
``fallback`` (the operator's ``isolation_fallback``) allows it, and :func:`weaker_box` says what
such a box lacks. A non-empty isolation always yields a non-empty prefix, or a typed refusal.

The prefix goes *after* the shell that joins the session's cgroups (joins need a writable
/sys); ``unshare`` and ``sandbox_exec`` exec in place, so the leader stays the process we spawned.
bubblewrap stays as a small parent and exits with its child.
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Generic, TypeVar

from procpilot.engine import children, sandbox_exec
from procpilot.errors import IsolationUnavailable

__all__ = [
    "FALLBACKS",
    "Isolation",
    "IsolationUnavailable",
    "isolation_capabilities",
    "isolation_prefix",
    "unrenamable",
    "weaker_box",
]

_T = TypeVar("_T")
# What each weaker mechanism lacks, as results and `doctor` say it.
FALLBACKS: dict[str, str] = {
    "landlock": (
        "read-only root by Landlock, not bubblewrap: no pid namespace of its own (the host's processes "
        "are visible), the host's /tmp is shared and writable, and the daemon's files are not hidden"
    ),
    "seccomp": (
        "network off by a seccomp filter, not a network namespace: no IP at all, not even loopback, "
        "and the host's abstract unix sockets stay reachable"
    ),
}


@dataclass(frozen=True, slots=True)
class Isolation:
    network: bool = True  # False: only loopback, in a namespace of its own
    readonly_root: bool = False
    writable: tuple[Path, ...] = ()
    # A box of its own even with a writable root: a private pid namespace, no capabilities, the
    # cgroup tree and ``hidden`` paths out of sight. What keeps one agent from another's processes.
    private: bool = False
    # Out of sight inside the box (bubblewrap), whether they exist yet or not: the daemon's state,
    # config and socket. Alone, they ask for a box with a writable root.
    hidden: tuple[Path, ...] = ()
    # A session of its own inside the sandbox (bubblewrap --new-session). False for a pty session:
    # its terminal is its own, and without it as controlling terminal ^C and job control are gone.
    new_session: bool = True
    # The weaker mechanisms the operator allowed where the strong one is missing (FALLBACKS);
    # empty: refuse rather than weaken.
    fallback: frozenset[str] = frozenset()

    @property
    def empty(self) -> bool:
        return self.network and not self.readonly_root and not self.private and not self.hidden


# -- probes --------------------------------------------------------------------------------------

# Private, for the tests' slow-probe runs: seconds a probe may take before it counts as no answer.
PROBE_TIMEOUT_ENV = "PROCPILOT_ISOLATION_PROBE_TIMEOUT"
_PROBE_TIMEOUT = 10.0
_PROBE_ATTEMPTS = 2  # a probe that gives no answer is run once more before the call is refused
# The OS would not start the probe now (a loaded host): no answer, not "absent".
_TRANSIENT = {errno.EAGAIN, errno.ENOMEM, errno.EMFILE, errno.ENFILE, errno.EINTR}


class ProbeUndecided(Exception):
    """A probe gave no answer (it timed out, or could not be started for now): nothing is known."""


def _probe_timeout() -> float:
    try:
        return max(0.1, float(os.environ[PROBE_TIMEOUT_ENV]))
    except (KeyError, ValueError):
        return _PROBE_TIMEOUT


def _run(argv: list[str], what: str) -> subprocess.CompletedProcess[bytes] | None:
    """The probe's run; None if it could not be run at all (no such program: a definitive no)."""
    timeout = _probe_timeout()
    try:
        # A session of its own, begun by the engine (children.popen): what the probe orphans
        # (bubblewrap's first process in a pid namespace outlives the bwrap we wait for) comes
        # back to a supervisor as an orphan of ours, which it reaps (engine/children.py).
        proc = children.popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    except OSError as exc:
        if exc.errno in _TRANSIENT:
            raise ProbeUndecided(f"the {what} probe could not start ({exc.strerror})") from None
        return None
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise ProbeUndecided(f"the {what} probe did not finish within {timeout:g} s") from None
    finally:
        if proc.returncode is not None:
            children.release(proc.pid)
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


_PENDING: dict[str, str] = {}  # probe -> why it has no answer yet (until it gets one)


class _Decided(Generic[_T]):
    """A probe whose definitive answer is kept for the process's life, and whose lack of one is not."""

    def __init__(self, name: str, probe: Callable[[], _T]) -> None:
        self.name = name
        self._probe = probe
        self._found: list[_T] = []
        # One probe at a time: a second caller waits for the first one's answer, not a second run.
        self._lock = threading.Lock()

    @property
    def known(self) -> bool:
        return bool(self._found)

    def __call__(self, *, wait: bool = True) -> _T:
        """The answer, probing for it if none is had; ``wait=False`` (a report on the event loop):
        never wait for a probe another thread runs now, say there is no answer yet instead."""
        if self._found:
            return self._found[0]
        if not self._lock.acquire(blocking=wait):
            raise ProbeUndecided(f"the {self.name} probe is running now")
        try:
            if self._found:
                return self._found[0]
            why = ProbeUndecided(f"the {self.name} probe was not run")
            for _ in range(_PROBE_ATTEMPTS):
                try:
                    value = self._probe()
                except ProbeUndecided as exc:
                    _PENDING[self.name] = str(exc)
                    why = exc
                    continue
                _PENDING.pop(self.name, None)
                self._found.append(value)
                return value
            raise why
        finally:
            self._lock.release()

    def cache_clear(self) -> None:
        self._found.clear()


def _decided(name: str) -> Callable[[Callable[[], _T]], _Decided[_T]]:
    return lambda probe: _Decided(name, probe)


def _works(argv: list[str], what: str) -> bool:
    done = _run([*argv, "/bin/true"], what)
    return done is not None and done.returncode == 0


# Exits 0 only if it could join the network namespace of the process named by argv[1].
_SETNS_PROBE = (
    "import ctypes, os, sys\n"
    "try:\n"
    "    fd = os.open(f'/proc/{sys.argv[1]}/ns/net', os.O_RDONLY)\n"
    "except OSError:\n"
    "    sys.exit(3)\n"
    "sys.exit(0 if ctypes.CDLL(None, use_errno=True).setns(fd, 0x40000000) == 0 else 3)\n"
)


def _contains_network(argv: list[str], what: str) -> bool:
    """True if a command run under ``argv`` cannot get back into our network namespace."""
    done = _run([*argv, sys.executable, "-c", _SETNS_PROBE, str(os.getpid())], what)
    return done is not None and done.returncode == 3


@_decided("network namespace")
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
    undecided: ProbeUndecided | None = None
    for argv in candidates:
        # Every candidate is a namespace: one that gives no answer leaves the others as good.
        try:
            if _works(argv, "network namespace") and _contains_network(argv, "network namespace"):
                return tuple(argv)
        except ProbeUndecided as exc:
            undecided = exc
    if undecided is not None:
        raise undecided  # "none here" is only said when every candidate answered
    return None


# Without capabilities (no remount, no setns), in a pid namespace of its own (no handles on the
# host's processes). --new-session (no TIOCSTI into a terminal outside) is added per session.
_BWRAP_BOX = ("--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--unshare-pid", "--cap-drop", "ALL")
# The cgroup tree: root owns its files, so even without capabilities a process could move itself out
# of its session's cgroups (and their limits) or write another session's cgroup.kill.
_CGROUP_FS = Path("/sys/fs/cgroup")
_TMP = Path("/tmp")  # noqa: S108 - a private tmpfs in a read-only box


@_decided("bubblewrap")
def _bwrap() -> str | None:
    bwrap = shutil.which("bwrap")
    if bwrap and _works([bwrap, *_BWRAP_BOX, "--"], "bubblewrap"):
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


@_decided("Landlock")
def _landlock() -> bool:
    """True if ``sandbox_exec --landlock`` really leaves only its writable paths writable here."""
    with tempfile.TemporaryDirectory(prefix="procpilot-landlock-") as tmp:
        inside, outside = Path(tmp, "inside"), Path(tmp, "outside")
        inside.mkdir()
        outside.mkdir()
        argv = _sandbox("--landlock", "--writable", str(inside))
        done = _run([*argv, sys.executable, "-I", "-c", _LANDLOCK_PROBE, str(inside), str(outside)], "Landlock")
        return done is not None and done.returncode == 3 and (inside / "in").exists() and not (outside / "out").exists()


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


@_decided("seccomp")
def _seccomp() -> bool:
    """True if ``sandbox_exec --no-network`` really takes IP sockets away here."""
    done = _run([*_sandbox("--no-network"), sys.executable, "-I", "-c", _SECCOMP_PROBE], "seccomp")
    return done is not None and done.returncode == 3


def _answer(probe: Callable[[], _T]) -> _T:
    """The probe's answer, or a refusal that says the truth: no answer yet, not "not installed"."""
    try:
        return probe()
    except ProbeUndecided as exc:
        raise _undecided(str(exc)) from None


def _undecided(why: str) -> IsolationUnavailable:
    exc = IsolationUnavailable(
        f"{why} (a host under load?): this box cannot be built right now, and the probe is not "
        "taken for an answer; it runs again on the next call",
        probe="no_answer",
    )
    # Not the default hints: nothing is missing here, and nothing need be installed.
    exc.hints = {"retry": "Call again in a few seconds: the mechanism is probed again then."}
    return exc


# -- reports -------------------------------------------------------------------------------------


def _now(probe: Callable[[], _T]) -> _T:
    """The probe's answer without waiting on one another thread is probing for (a report)."""
    return probe(wait=False) if isinstance(probe, _Decided) else probe()


def _network_mechanism() -> str | None:
    net = _now(_network_prefix)
    if net is not None:
        return "bwrap" if "bwrap" in net[0] else " ".join(net[:-1])
    return "seccomp" if _now(_seccomp) else None


def _or_none(probe: Callable[[], _T], pending: set[str]) -> _T | None:
    try:
        return _now(probe)
    except ProbeUndecided as exc:
        pending.add(str(exc))
        return None


def isolation_capabilities() -> dict[str, object]:
    """Which mechanism serves each kind of isolation here (None: unavailable, or no answer yet:
    ``pending`` lists the probes that gave none, which run again on next use)."""
    pending: set[str] = set()  # probes that another thread runs now; then those that gave no answer
    network = _or_none(_network_mechanism, pending)
    bwrap = _or_none(_bwrap, pending)
    readonly = "bwrap" if bwrap else ("landlock" if _or_none(_landlock, pending) else None)
    return {
        "network_off": network,
        # What "network off" leaves: a loopback of its own, or (seccomp) no IP at all.
        "network_off_loopback": None if network is None else ("none" if network == "seccomp" else "private"),
        "readonly_root": readonly,
        "private_box": "bwrap" if bwrap else None,
        "pending": sorted(pending | set(_PENDING.values())),
    }


def _known(probe: Callable[[], _T]) -> bool:
    return not isinstance(probe, _Decided) or probe.known


def weaker_box(isolation: Isolation | None) -> str | None:
    """What ``isolation`` lacks on this host because an allowed fallback serves it (None: nothing).

    Reads only answers already had (a session that started had them): never probes."""
    if isolation is None or isolation.empty or not isolation.fallback:
        return None
    used: list[str] = []
    landlock = "landlock" in isolation.fallback and isolation.readonly_root and not isolation.private
    if landlock and _known(_bwrap) and _bwrap() is None:
        used.append(FALLBACKS["landlock"])
    if "seccomp" in isolation.fallback and not isolation.network:
        bwrap_serves = isolation.readonly_root and _known(_bwrap) and _bwrap() is not None
        if not bwrap_serves and _known(_network_prefix) and _network_prefix() is None:
            used.append(FALLBACKS["seccomp"])
    return "; ".join(used) or None


@lru_cache(maxsize=64)
def unrenamable(writable: tuple[Path, ...], hidden: tuple[Path, ...]) -> tuple[Path, ...]:
    """Every directory between a writable path and a hidden path inside it, outermost first.

    The hidden path is a mount point in the box (a tmpfs, /dev/null) and so is the writable one
    (its bind): neither can be renamed (EBUSY). A directory between them could, and the real one
    would move on the host with the daemon's files in it (``mv .venv elsewhere`` with the config
    in ``.venv/procpilot-run/``), the daemon then writing a fresh state directory at the old path,
    in the box's reach. Bound onto itself, each of them is a mount point too: still writable, but
    never renamed or removed while the box lives. Resolved paths: a mount goes on the real one.
    Cached (the realpaths cost ~0.3 ms, a box's spawn ~3 ms): the daemon's paths and an agent's
    writable ones are settings, and the directories above an existing file stay while it does."""
    roots = [Path(os.path.realpath(path)) for path in writable]
    found: dict[Path, None] = {}
    for path in hidden:
        target = Path(os.path.realpath(path))
        inside = [root for root in roots if target != root and target.is_relative_to(root)]
        if not inside:
            continue
        outermost = min(inside, key=lambda root: len(root.parts))
        between = (parent for parent in target.parents if parent != outermost and parent.is_relative_to(outermost))
        # Only what exists: bubblewrap refuses a bind of nothing, and nothing there cannot be moved.
        found.update(dict.fromkeys(parent for parent in between if parent.is_dir()))
    return tuple(sorted(found, key=lambda path: len(path.parts)))


# -- prefixes ------------------------------------------------------------------------------------


def isolation_prefix(isolation: Isolation) -> list[str]:
    """The argv prefix that puts a command inside ``isolation``; raises if that cannot be had.

    Blocks while a mechanism is probed (up to twice the probe timeout): call it off the event
    loop until the probes have answered."""
    if isolation.empty:
        return []
    prefix = _prefix(isolation)
    if not prefix:  # the invariant every caller relies on: a box asked for is a box, or a refusal
        raise IsolationUnavailable(f"no mechanism was chosen for {isolation!r}: refusing to run it unconfined")
    return prefix


def _prefix(isolation: Isolation) -> list[str]:
    bwrap = _answer(_bwrap)
    if bwrap is not None and (isolation.readonly_root or isolation.private or isolation.hidden):
        return _bwrap_prefix(bwrap, isolation)
    if isolation.private or (isolation.hidden and not isolation.readonly_root):
        raise IsolationUnavailable(
            "a private box (or paths hidden from a command) needs bubblewrap, which is not installed "
            "or does not work here"
        )
    options: list[str] = []
    if isolation.readonly_root:
        if "landlock" not in isolation.fallback:
            raise IsolationUnavailable(
                "a read-only root needs bubblewrap, which is not installed or does not work here, and this "
                f"policy does not allow the weaker Landlock box ({FALLBACKS['landlock']})",
                hints={"allow_fallback": 'An operator may allow it: isolation_fallback = ["landlock"] in the policy.'},
            )
        if not _answer(_landlock):
            raise IsolationUnavailable(
                "a read-only root was asked for, but this host has neither bubblewrap nor Landlock: "
                "refusing to run with the root writable"
            )
        # No private tmpfs without a mount namespace: the host's /tmp, shared with everyone.
        options += ["--landlock", "--writable", str(_TMP)]
        for path in isolation.writable:
            options += ["--writable", str(path)]
    prefix: list[str] = []
    if not isolation.network:
        net = _answer(_network_prefix)
        if net is not None:
            # Outside the wrapper: Landlock would refuse unshare its write to /proc/self/uid_map.
            prefix = list(net)
        elif "seccomp" not in isolation.fallback:
            raise IsolationUnavailable(
                "network_disabled needs a network namespace (unshare or bubblewrap), which this host does "
                f"not offer, and this policy does not allow the seccomp filter instead ({FALLBACKS['seccomp']})",
                hints={"allow_fallback": 'An operator may allow it: isolation_fallback = ["seccomp"] in the policy.'},
            )
        elif _answer(_seccomp):
            options.append("--no-network")
        else:
            raise IsolationUnavailable(
                "network_disabled was asked for, but this host offers no way to take the network away "
                "(no network namespaces, no bubblewrap, no seccomp): refusing to run with the network on"
            )
    return [*prefix, *_sandbox(*options)] if options else prefix


def _bwrap_prefix(bwrap: str, isolation: Isolation) -> list[str]:
    if isolation.readonly_root:
        argv = [bwrap, *_BWRAP_BOX, "--tmpfs", str(_TMP)]
        for path in isolation.writable:
            argv += ["--bind", str(path), str(path)]
        for path in unrenamable(isolation.writable, isolation.hidden):
            argv += ["--bind", str(path), str(path)]
    else:
        argv = [bwrap, "--bind", "/", "/", *_BWRAP_BOX[3:]]
    if isolation.new_session:
        argv.append("--new-session")
    # After the binds: a hidden path inside a writable one (the state dir in the workspace) stays hidden.
    argv += _masks(isolation)
    if not isolation.network:
        argv.append("--unshare-net")
    # No --die-with-parent: bubblewrap's parent is the server, and a box must outlive a server
    # crash like any session (adopted by the next one); its tree kill ends it, not its parent.
    return [*argv, "--"]


def _under(path: Path, top: Path) -> bool:
    return path == top or top in path.parents


def _masks(isolation: Isolation) -> list[str]:
    """bubblewrap options that put every hidden path out of sight, whether it exists yet or not."""
    dirs = [p for p in isolation.hidden if p.is_dir()]
    # An existing directory -> the names in it to hide: a file's own, or for a path whose
    # directory does not exist yet either, the first missing component's.
    names: dict[Path, set[str]] = {}
    for path in isolation.hidden:
        if path in dirs:
            continue
        missing = path
        while not missing.parent.is_dir() and missing.parent != missing:
            missing = missing.parent
        names.setdefault(missing.parent, set()).add(missing.name)
    writable = isolation.writable
    argv: list[str] = []
    for parent in sorted(names, key=lambda p: len(p.parts)):
        # Already empty in the box: under a hidden directory, or the private /tmp (unless a
        # writable path brings part of it back).
        if any(_under(parent, d) for d in dirs):
            continue
        if isolation.readonly_root and _under(parent, _TMP) and not any(_under(parent, w) for w in writable):
            continue
        if parent.parent == parent:
            raise IsolationUnavailable(f"cannot hide {sorted(names[parent])} directly under /: move them")
        argv += ["--tmpfs", str(parent)]
        try:
            entries = sorted(os.scandir(parent), key=lambda e: e.name)
        except OSError as exc:
            raise IsolationUnavailable(f"cannot list {parent} to hide paths in it: {exc.strerror}") from None
        for entry in entries:
            if entry.name in names[parent]:
                continue
            target = Path(entry.path)
            if entry.is_symlink():
                argv += ["--symlink", os.readlink(target), str(target)]
                continue
            # -try: an entry removed meanwhile is simply not there, not a failed start.
            open_ = not isolation.readonly_root or any(_under(target, w) for w in writable)
            argv += ["--bind-try" if open_ else "--ro-bind-try", str(target), str(target)]
            for w in writable:  # a writable path deeper inside a read-only entry, writable again
                if target in w.parents:
                    argv += ["--bind", str(w), str(w)]
        if isolation.readonly_root:
            # The tmpfs itself read-only too (its entries keep their own mounts): a write there
            # fails as anywhere outside the writable paths, rather than vanishing with the box.
            argv += ["--remount-ro", str(parent)]
    for path in (*dirs, _CGROUP_FS):
        if path.is_dir():
            argv += ["--tmpfs", str(path)]
    return argv
