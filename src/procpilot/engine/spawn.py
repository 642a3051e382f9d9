"""Starting one process: argv, environment, stdio and the platform seam.

Every session runs in a new session/process group (``start_new_session``), spawned with
``subprocess.Popen`` and no ``preexec_fn``, so CPython uses vfork/posix_spawn: spawn cost stays
flat however large the supervisor's heap grows (a real fork costs 50 ms at 1 GiB). Whatever has
to happen in the child before the user's command (joining the session's cgroup, taking the pty
as controlling terminal) is a line of ``/bin/sh`` that then ``exec``s it.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import errno
import fcntl
import os
import re
import shlex
import struct
import subprocess
import sys
import termios
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from procpilot.engine import children
from procpilot.engine.isolation import Isolation, isolation_prefix
from procpilot.engine.limits import Limits
from procpilot.engine.precheck import check_command, check_size, check_timeout
from procpilot.engine.restart import RestartPolicy
from procpilot.errors import (
    CommandNotFound,
    InvalidArgument,
    PathOutOfScope,
    ProtectedVariable,
    SpawnFailed,
)
from procpilot.shell.reading import ShellText

__all__ = [
    "Launcher",
    "SpawnSpec",
    "Spawned",
    "build_env",
    "check_os_string",
    "make_pipe",
    "open_pidfd",
    "resolve_workdir",
    "shell_argv",
    "spawn_process",
    "within",
]

_F_SETPIPE_SZ = 1031
_PIPE_SIZE = 1 << 20
_TRANSIENT = {errno.EAGAIN, errno.EMFILE, errno.ENFILE, errno.EBADF, errno.ENOMEM, errno.EINTR}
_RETRY_DELAYS = (0.01, 0.05, 0.2, 0.5)
_SHELL = "/bin/sh"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


@dataclass(frozen=True, slots=True)
class SpawnSpec:
    """What to run. A ``str`` command runs through ``/bin/sh -c``; a sequence is an argv, no shell."""

    command: str | tuple[str, ...]
    cwd: Path | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    timeout: float | None = None
    pty: bool = False
    pty_size: tuple[int, int] = (120, 30)
    stdin: Literal["pipe", "null"] = "pipe"
    stdin_data: bytes | None = None
    lane: str | None = None
    notify_on_exit: bool = True
    limits: Limits | None = None
    isolation: Isolation | None = None
    elevated: bool = False  # asks to run outside the agent's box; the spawn filter decides
    # With a workspace, ``cwd`` is resolved against it (None: the workspace itself) and must lie
    # inside it: checked here, and again on the very directory the child enters, so a path
    # swapped for a symlink after this check cannot lead it out.
    workspace: Path | None = None
    # What the agent calls the session (``web``); unique among its live sessions, so every verb
    # can take it in place of the id.
    name: str | None = None
    # Start the command again when it ends on its own (engine/restart.py); None: never.
    restart: RestartPolicy | None = None
    # A shell command's one reading, shared by the preflight, the policy and the pre-check (and
    # by the copies ``confined`` makes): the text is lexed once per call. None for an argv.
    shell: ShellText | None = field(init=False, repr=False, compare=False, default=None)

    def __post_init__(self) -> None:
        # Here, where every face builds its spec: nothing downstream (the policy's shell analysis
        # included) ever reads a command the kernel could not run anyway, or a directory outside
        # the workspace; and the spawn relies on it, checking none of it again.
        check_size(self.command)
        if isinstance(self.command, str):
            check_os_string("command", self.command)
            object.__setattr__(self, "shell", ShellText(self.command))
        else:
            for index, word in enumerate(self.command):
                check_os_string(f"command[{index}]", word, field="command")
        check_timeout(self.timeout)
        if self.name is not None and not _NAME.fullmatch(self.name):
            raise InvalidArgument(
                f"session name {self.name[:80]!r} is not 1-64 letters, digits, '.', '_' or '-' starting "
                "with a letter or digit",
                hints={"fix_name": "Use a short name such as 'web' or 'api-server'."},
                field="name",
            )
        if self.workspace is not None:
            object.__setattr__(self, "cwd", resolve_workdir(self.workspace, self.cwd))
        elif self.cwd is not None:
            check_os_string("cwd", str(self.cwd))

    def confined(self, limits: Limits | None, isolation: Isolation | None) -> SpawnSpec:
        """This spec with the policy's limits and box. Neither is checked by ``__post_init__``,
        so unlike ``dataclasses.replace`` the command and directory are not checked (and the
        directory not resolved on disk) a second time. Nothing to change (no limits, no box: the
        usual spawn): this spec itself, as a copy costs ~0.15 ms after an agent's idle gap."""
        if limits is self.limits and isolation is self.isolation:
            return self
        confined = copy.copy(self)
        object.__setattr__(confined, "limits", limits)
        object.__setattr__(confined, "isolation", isolation)
        return confined

    def without_lane(self) -> SpawnSpec:
        """This spec to run at once: for a supervisor that queued it behind its lane already (a
        cluster's daemon, whose lanes span its nodes)."""
        free = copy.copy(self)
        object.__setattr__(free, "lane", None)
        return free

    @property
    def display(self) -> str:
        if isinstance(self.command, str):
            return self.command
        return shlex.join(self.command)


@dataclass(slots=True)
class Spawned:
    """A started child and the parent's ends of its stdio."""

    popen: subprocess.Popen[bytes] | None  # None: started by a warm shell (engine/warm.py), or adopted
    pid: int
    pidfd: int | None
    stdin_fd: int | None
    stdout_fd: int
    stderr_fd: int | None  # None under a pty: one terminal carries both streams
    stdin_target: str | None = None  # what /proc/PID/fd/0 shows for our stdin: "pipe:[ino]" or a pts path
    # Our stdin write end parked in the supervisor's stash (engine/stdin.py), not in the table:
    # an adopted run's, parked as the holder handed it back.
    stdin_token: int | None = None


def build_env(
    base_passthrough: Sequence[str],
    base_set: Mapping[str, str],
    overrides: Mapping[str, str],
    *,
    markers: Mapping[str, str],
    pty: bool,
    pty_size: tuple[int, int],
    source: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """A clean base (a few passthrough variables) plus fixed values, overrides, then the markers.

    The markers (which session, which supervisor) are how a tree is found without cgroups: an
    override of one would let a command hide from its own kill, so it is refused."""
    if source is None:
        env = _passed_through(base_passthrough)
    else:
        env = {name: source[name] for name in base_passthrough if name in source}
    env.setdefault("PATH", os.defpath)
    env.update(base_set)
    if pty:
        env["TERM"] = "xterm-256color"
        env["COLUMNS"], env["LINES"] = str(pty_size[0]), str(pty_size[1])
    else:
        env.setdefault("TERM", "dumb")
    for key, value in overrides.items():
        if not key or "=" in key or "\0" in key:
            raise InvalidArgument(f"env: invalid variable name {key!r}", field="env")
        if key in markers:
            raise ProtectedVariable(f"cannot override protected environment variable(s): {key}", variables=[key])
        check_os_string("a variable name in env", key, field="env")  # a lone surrogate: no bytes to pass
        check_os_string(f"env.{key}", value, field="env")
        env[key] = value
    env.update(markers)
    return env


# os.environ's own store: its keys and values as the OS holds them (bytes), kept up to date by
# every change made through os.environ. os.environ's lookups are Python code (an encoding of the
# name, a KeyError for each variable that is not set); this is one dict lookup per name, for the
# ten names passed through on every spawn. None where the interpreter keeps it otherwise.
_ENVIRON_DATA: dict[bytes, bytes] | None = (
    data if isinstance(data := getattr(os.environ, "_data", None), dict) else None
)
_FS_ENCODING = sys.getfilesystemencoding()
_ENCODED_NAMES: dict[tuple[str, ...], tuple[tuple[str, bytes], ...]] = {}


def _passed_through(names: Sequence[str]) -> dict[str, str]:
    """The server's own value of each of ``names`` that it has, read now (never cached: a
    variable changed since is passed on as it is), exactly as ``os.environ`` would give them."""
    data = _ENVIRON_DATA
    if data is None:
        environ = os.environ
        return {name: environ[name] for name in names if name in environ}
    key = names if isinstance(names, tuple) else tuple(names)
    encoded = _ENCODED_NAMES.get(key)
    if encoded is None:
        if len(_ENCODED_NAMES) >= 64:  # one tuple per configuration: a handful
            _ENCODED_NAMES.clear()
        encoded = _ENCODED_NAMES[key] = tuple((name, name.encode(_FS_ENCODING, "surrogateescape")) for name in key)
    env: dict[str, str] = {}
    for name, raw_name in encoded:
        value = data.get(raw_name)
        if value is not None:
            env[name] = value.decode(_FS_ENCODING, "surrogateescape")
    return env


def check_os_string(name: str, value: str, *, field: str | None = None) -> None:
    """Refuse what the OS cannot take as an argument, path or variable: a NUL byte, or a lone
    surrogate that has no byte encoding. ``name`` appears in the message; ``field`` (default
    ``name``) is the request field the error points at."""
    if "\0" in value:
        raise InvalidArgument(
            f"{name} contains a NUL byte, which no command, path or variable can hold",
            hints={"remove_nul": f"Remove the NUL (\\0) character from {name}."},
            field=field or name,
        )
    if value.isascii():
        return  # every ASCII text encodes: no encoding made (and thrown away) for the usual command
    try:
        os.fsencode(value)
    except UnicodeEncodeError as exc:
        raise InvalidArgument(
            f"{name} contains a character with no UTF-8 encoding ({value[exc.start]!r}, a lone surrogate)",
            hints={"fix_text": f"Send {name} as valid Unicode text (surrogates must come in pairs)."},
            field=field or name,
        ) from None


def shell_argv(command: str | tuple[str, ...], prelude: list[str], prefix: list[str]) -> list[str]:
    """The child's argv: our shell lines (cgroup joins, pty) first, then the isolation prefix, then
    the user's command. Joins must happen outside the isolation, where /sys is still writable."""
    if isinstance(command, str) and not prefix:
        if not prelude:
            return [_SHELL, "-c", command]
        # The user's text is appended after our lines, unquoted: it stays exactly the script they wrote.
        return [_SHELL, "-c", "\n".join([*prelude, command])]
    inner = [_SHELL, "-c", command] if isinstance(command, str) else list(command)
    inner = [*prefix, *inner]
    if not prelude:
        return inner
    return [_SHELL, "-c", "\n".join([*prelude, 'exec "$@"']), "procpilot", *inner]


def make_pipe() -> tuple[int, int]:
    r, w = os.pipe2(os.O_CLOEXEC)
    # Capped by /proc/sys/fs/pipe-max-size for non-root: the default 64 KiB works too.
    with contextlib.suppress(OSError):
        fcntl.fcntl(r, _F_SETPIPE_SZ, _PIPE_SIZE)
    return r, w


# Hands a checked spec to a process that is already running (a warm shell): the spec, its
# environment, the shell lines to run first, and the working directory as checked (None: none given).
Launcher = Callable[[SpawnSpec, Mapping[str, str], Sequence[str], str | None], Spawned]


async def spawn_process(
    spec: SpawnSpec,
    env: Mapping[str, str],
    *,
    prelude: Sequence[str] = (),
    launch: Launcher | None = None,
) -> Spawned:
    """Start the child, retrying transient OS errors with backoff; or, given ``launch``, hand the
    checked spec to it instead (the same checks first, so a warm start refuses what a cold one would)."""
    cwd_fd, entered = _open_workdir(spec.cwd, spec.workspace) if spec.cwd is not None else (None, None)
    try:
        check_command(spec.shell or spec.command, env, spec.cwd)
        isolation = spec.isolation
        prefix = [] if isolation is None or isolation.empty else await _box(isolation)  # no coroutine for none
        if launch is not None:
            if cwd_fd is not None and entered is None:
                entered = os.readlink(f"/proc/self/fd/{cwd_fd}")
            return launch(spec, env, prelude, entered)
        return await _spawn_with_retries(spec, env, prelude, cwd_fd, prefix)
    finally:
        if cwd_fd is not None:
            os.close(cwd_fd)


async def _box(isolation: Isolation | None) -> list[str]:
    """The isolation prefix, built in a worker thread: a mechanism whose probe has not answered
    yet may take seconds to probe, and hidden paths are listed on disk; every other session goes
    on meanwhile. isolation_prefix keeps the exec point's invariant: an isolation asked for is a
    prefix, or a refusal."""
    if isolation is None or isolation.empty:
        return []
    return await asyncio.to_thread(isolation_prefix, isolation)


# workspace: its real path (and that as text), its (dev, inode), when checked
_ROOTS: dict[Path, tuple[Path, str, int, int, float]] = {}
_MAX_ROOTS = 256
_ROOT_RECHECK = 1.0  # seconds a resolved workspace is trusted without a look


def _real_root(workspace: Path) -> tuple[Path, str]:
    """``workspace`` with symlinks followed, as ``resolve()`` gives it (and as text), without a
    system call when resolved in the last second and with two (stats of it and of what it
    resolved to, against one per path component) when both still name the same directory: this
    runs twice on every spawn, where each system call after an agent's idle gap costs 20-50 µs.
    A workspace repointed since (a symlink swapped) or moved is resolved again; until then,
    commands stay confined to where it led (the check that confines them is the kernel's path
    of the directory entered, compared with this)."""
    now = time.monotonic()
    known = _ROOTS.get(workspace)
    if known is not None and now - known[4] < _ROOT_RECHECK:
        return known[0], known[1]
    try:
        st = os.stat(workspace)
        same = known is not None and known[2:4] == (st.st_dev, st.st_ino) == _identity(known[0])
    except OSError:
        root = workspace.resolve()
        return root, str(root)
    if known is not None and same:
        _ROOTS[workspace] = (known[0], known[1], st.st_dev, st.st_ino, now)
        return known[0], known[1]
    root = workspace.resolve()
    if len(_ROOTS) >= _MAX_ROOTS:
        _ROOTS.clear()
    _ROOTS[workspace] = (root, str(root), st.st_dev, st.st_ino, now)
    return root, str(root)


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def within(path: str, root: str) -> bool:
    """Whether ``path`` is ``root`` or lies under it; both absolute and canonical (symlinks
    followed, no ``.``, ``..``, doubled or trailing ``/``: what ``resolve()`` and the kernel's
    ``/proc/self/fd`` links give). Compared as text, a component at a time as ``Path.parents``
    would: ``/ws-evil`` is not under ``/ws``; everything absolute is under ``/``."""
    if path == root:
        return True
    if not path.startswith(root):
        return False
    # The next character must begin a component of its own: "/" after the root, or the root
    # itself ends with one (only "/" does, canonical).
    return root.endswith("/") or path[len(root)] == "/"


def resolve_workdir(workspace: Path, value: Path | str | None) -> Path:
    """``value`` resolved against the workspace (``..`` collapsed, symlinks followed) and checked
    to be an existing directory inside it; None is the workspace itself."""
    root, root_text = _real_root(workspace)
    if value is None or str(value) == "":
        return root
    check_os_string("working_directory", str(value))
    given = Path(value).expanduser()
    try:
        resolved = (given if given.is_absolute() else root / given).resolve()
    except (OSError, RuntimeError) as exc:  # a symlink loop
        raise InvalidArgument(
            f"working_directory {str(value)!r} cannot be resolved: {exc}", field="working_directory"
        ) from None
    if not within(str(resolved), root_text):
        raise PathOutOfScope(
            f"working_directory {str(value)!r} resolves to {resolved}, outside the workspace root {root}",
            working_directory=str(value),
            workspace_root=root_text,
        )
    if not resolved.is_dir():
        raise InvalidArgument(
            f"working_directory {str(value)!r} does not exist or is not a directory",
            hints={"fix_working_directory": "Pass an existing directory inside the workspace, or omit it."},
            field="working_directory",
        )
    return resolved


def _open_workdir(cwd: Path, workspace: Path | None) -> tuple[int, str | None]:
    """A descriptor of the working directory, checked to lie inside ``workspace``, and the path
    the kernel says it has (None when there was no workspace to check it against).

    The child enters the directory through this descriptor, never by its path again: whatever
    happens to the path after the check (a component swapped for a symlink), the directory
    checked is the directory the command runs in. The kernel's path and the resolved root are
    both canonical, so they are compared as text (``within``): no Path is built on the spawn path.
    """
    check_os_string("workdir", str(cwd))
    try:
        fd = os.open(cwd, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        raise InvalidArgument(
            f"workdir does not exist or is not a directory: {cwd}",
            hints={"fix_workdir": "Pass an existing directory, or omit workdir to use the default."},
            field="workdir",
        ) from None
    if workspace is None:
        return fd, None
    entered = os.readlink(f"/proc/self/fd/{fd}")
    root = _real_root(workspace)[1]
    if not within(entered, root):
        os.close(fd)
        raise PathOutOfScope(
            f"workdir {cwd} leads to {entered}, outside the workspace root {root}",
            working_directory=str(cwd),
            workspace_root=root,
        )
    return fd, entered


async def _spawn_with_retries(
    spec: SpawnSpec, env: Mapping[str, str], prelude: Sequence[str], cwd_fd: int | None, prefix: list[str]
) -> Spawned:
    for attempt, delay in enumerate((0.0, *_RETRY_DELAYS)):
        if delay:
            await asyncio.sleep(delay)  # the loop keeps serving every other session meanwhile
        try:
            return _spawn_once(spec, env, prelude, cwd_fd, prefix)
        except OSError as exc:
            if exc.errno in _TRANSIENT and attempt < len(_RETRY_DELAYS):
                continue
            if isinstance(exc, FileNotFoundError):
                raise CommandNotFound(f"command not found: {spec.display}", command=spec.display) from exc
            reason = exc.strerror or str(exc)
            raise SpawnFailed(f"could not start {spec.display!r}: {reason}", errno=exc.errno) from exc
    raise AssertionError("unreachable")


def _spawn_once(
    spec: SpawnSpec, env: Mapping[str, str], lines: Sequence[str], cwd_fd: int | None, prefix: list[str]
) -> Spawned:
    # Shell lines run in the child before the user's command: joining cgroups, taking the pty.
    prelude = list(lines)
    to_close: list[int] = []
    parent_fds: list[int] = []
    try:
        if spec.pty:
            master, slave = os.openpty()
            parent_fds.append(master)
            to_close.append(slave)
            _set_winsize(master, spec.pty_size)
            # A session leader that opens a terminal without O_NOCTTY takes it as its controlling tty.
            prelude.append(f': <>"{os.ttyname(slave)}"')
            stdin: int = slave
            stdout: int = slave
            stderr: int = slave
            pty_stdin = os.dup(master)
            parent_fds.append(pty_stdin)
            stdin_fd: int | None = pty_stdin
            stdin_target: str | None = os.ttyname(slave)
            stdout_fd, stderr_fd = master, None
        else:
            if spec.stdin == "pipe":
                r_in, w_in = make_pipe()
                to_close.append(r_in)
                parent_fds.append(w_in)
                stdin, stdin_fd = r_in, w_in
                stdin_target = f"pipe:[{os.fstat(r_in).st_ino}]"
            else:
                stdin, stdin_fd, stdin_target = subprocess.DEVNULL, None, None
            r_out, w_out = make_pipe()
            r_err, w_err = make_pipe()
            to_close += [w_out, w_err]
            parent_fds += [r_out, r_err]
            stdout, stderr = w_out, w_err
            stdout_fd, stderr_fd = r_out, r_err
        popen = children.popen(
            shell_argv(spec.command, prelude, prefix),
            stdin=stdin,
            stdout=stdout,
            stderr=stderr,
            # The child changes directory before it closes its inherited descriptors, so this
            # /proc/self link is still ours to follow there (see _open_workdir).
            cwd=None if cwd_fd is None else f"/proc/self/fd/{cwd_fd}",
            env=dict(env),
            start_new_session=True,
            close_fds=True,
        )
    except BaseException:
        for fd in to_close + parent_fds:
            os.close(fd)
        raise
    for fd in to_close:
        os.close(fd)
    for fd in parent_fds:
        os.set_blocking(fd, False)
    # No pidfd: the session watches its exit (Session.attach: one SIGCHLD watcher, or its own pidfd).
    return Spawned(popen, popen.pid, None, stdin_fd, stdout_fd, stderr_fd, stdin_target)


def open_pidfd(pid: int) -> int | None:
    """A pidfd for ``pid`` (readable when it exits), or None where the kernel or Python has none:
    the session then polls for the exit."""
    try:
        return os.pidfd_open(pid)
    except (OSError, AttributeError):
        return None


def _set_winsize(fd: int, size: tuple[int, int]) -> None:
    cols, rows = size
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
