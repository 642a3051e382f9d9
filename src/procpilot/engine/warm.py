"""Warm shells: a few ``/bin/sh`` processes started ahead of time, each already inside the fresh
cgroup of the session it will become, blocked reading its command.

Why: moving a process into a cgroup (the ``echo $$ > cgroup.procs`` that starts a cold session)
takes the kernel's cgroup threadgroup lock for writing, which waits for an RCU grace period unless
one was taken moments ago. Back to back that costs ~0.1 ms; after 100 ms of idle, which is how an
agent's calls arrive (the model thinks in between), 8-20 ms here, ten times the whole spawn. A warm
shell paid for its join while nobody was waiting, and it is already running: a call costs one
line written to a pipe, and the shell runs the command itself (``eval``), with no fork or exec.

What a command sees is what the cold path gives it: the same ``/bin/sh``, started the same way
(``Popen``, a new session, the same stdio pipes), the same environment (the session's markers were
in the shell's environment from the start; overrides are exported, and so is every variable the
call's environment differs in from the shell's, whose base the supervisor reads once, not per
shell: a passthrough variable of the server changed since still reaches the command as it is
now), working directory (entered physically, then checked: a path swapped for a symlink after the
workspace check is refused, not followed), cgroup, and descriptors. What differs: a shell's own
error messages say ``eval:`` (``/bin/sh: 1: eval: foo: not found``), and the leader's command line in ``ps`` is the warm
shell's. A shell-special variable (``IFS``, ``PWD``, ...) among the overrides, a pty, limits or a
command over 8 KiB take the cold path.

The command arrives on the session's own stdin, ahead of what the session will read there: two
lines, read a byte at a time by ``read`` so not one byte more is taken: a random token written when
the shell starts, then ``<token> <command> [<setup> [1]]``, single-quoted words. A second line
without the token ends the shell (125): another process of the same user that writes to the pipe
through ``/proc/PID/fd/0`` before the supervisor does cannot make it run anything.

The pool is bounded (``size`` shells, 3 descriptors each in the supervisor: no pidfd, the
session's exit comes through the loop's SIGCHLD watcher, engine/reaper.py), refilled after each
take (once the taken session ends, or 50 ms on), and ended by :meth:`WarmPool.close` (the
Supervisor's ``aclose``). A shell whose supervisor dies reads end-of-file and exits.
"""

from __future__ import annotations

import asyncio
import os
import re
import secrets
import shlex
import subprocess
import time
import weakref
from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from procpilot.engine import children, descriptors
from procpilot.engine.fairness import AgentGroups
from procpilot.engine.isolation import isolation_prefix

# The cold path's own pipe and argv makers: a warm session must get exactly what a cold one gets.
from procpilot.engine.spawn import Spawned, SpawnSpec, make_pipe, shell_argv
from procpilot.engine.trees import TreeBackend

__all__ = ["WarmPool", "WarmShell", "WarmShellGone", "favordynmods", "waiting_fds", "waiting_pids"]

_MAX_COMMAND = 8192  # dash reads its line a byte per read(2): past this the cold path is cheaper
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Variables the shell itself reads or sets: as overrides, the cold path hands them to a shell at
# its start, which is not the same as exporting them into a running one.
_SHELL_SPECIAL = frozenset(
    {"IFS", "PS1", "PS2", "PS4", "ENV", "PPID", "PWD", "OLDPWD", "OPTIND", "OPTARG", "LINENO", "CDPATH", "HOME"}
)
_RETRY_AFTER = 1.0  # seconds without refills after the OS refused one (EAGAIN, EMFILE...)
# A refill waits for the taken session to end (refill_soon), or this long if it runs on: a new
# shell's join holds the kernel's cgroup mutex through its grace period, and the ending session's
# rmdir would wait behind it, on the event loop.
_REFILL_AFTER = 0.05
_REFILL_AFTER_END = 0.005
# Takes closer together than this are back to back: a migration moments ago keeps the next one
# cheap (no grace period to wait for), so the refill starts at once, while the taken session
# runs, rather than landing on the next call's path. (1 ms later instead, so that a command that
# ends at once gets its result out first, was measured: fewer starts found a warm shell, 634 of
# 1,020 against 744, and back to back went from 0.98-1.00x to 1.07-1.28x.)
_BACK_TO_BACK = 0.02
_MOVED = "procpilot: the working directory changed while the command started"

# The warm shell's script; its stdin is the session's. __pp_nl lets a command's newlines travel on
# one line (read -r stops at the first). The command runs last, in the shell itself, so its exit
# status is the shell's, and ``exit``, traps and ``$0`` behave as under ``sh -c``. ``{trap}`` is
# the supervisor's last setup line when it is the same for every command this shell could run (the
# exit trap of a server whose sessions outlive it, engine/adoption.py): set here, where it is part
# of the script, rather than sent with the command, where the shell would read it a byte per
# read(2) after idle (each byte of the line costs ~3 µs of the command's start there). A launch
# that must not have it says so with a third word (1). For the same reason the working
# directory's check is a function of the script (``__pp_cd DIR``: enter it physically, then
# refuse a path that led elsewhere), gone before the command runs; a call sends only its path;
# and the line is the token and then words, not assignments: the command, then the setup if
# any (positional parameters of the line's ``set --``, cleared before the command runs).
_SCRIPT = """\
{join}
__pp_cd() {{ cd -P -- "$1" && [ "$PWD" = "$1" ] || {{ echo '{moved}' >&2; exit 125; }}; unset OLDPWD; }}
IFS= read -r __pp_t || exit 125
IFS= read -r __pp_l || exit 125
case $__pp_l in "$__pp_t "*) ;; *) exit 125;; esac
__pp_nl='
'
eval "set -- ${{__pp_l#"$__pp_t "}}"
__pp_c=$1 __pp_s=${{2-}} __pp_x=${{3-}}
set --
unset __pp_t __pp_l __pp_nl
eval "$__pp_s"
unset -f __pp_cd
{trap}
eval "unset __pp_s __pp_c __pp_x; $__pp_c"
"""


class WarmShellGone(Exception):
    """The warm shell cannot take its command (it died): start the session cold instead."""


def _one_line(text: str) -> str:
    """``text`` as a single-quoted shell word on one line (newlines come from ``$__pp_nl``)."""
    return "'" + text.replace("'", "'\\''").replace("\n", "'\"$__pp_nl\"'") + "'"


@dataclass(slots=True)
class WarmShell:
    """One waiting shell, and the supervisor's ends of its pipes."""

    session_id: str
    popen: subprocess.Popen[bytes]
    stdin_fd: int
    stdout_fd: int
    stderr_fd: int
    stdin_target: str
    env: dict[str, str]
    token: str
    launched: bool = False
    # The agent whose group it waits in (engine/fairness.py); None: made before any agent was
    # known, it joins the group of the agent that takes it, with the command.
    agent: str | None = None
    join: list[str] | None = None  # that join, set when such a shell is taken
    # The last setup line its script runs itself (``{trap}`` in _SCRIPT), None: none.
    exit_trap: str | None = None

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        """Still waiting for its command (reaped here if it died: someone killed it)."""
        if self.popen.poll() is None:
            return True
        children.release(self.pid)
        return False

    def launch(self, spec: SpawnSpec, env: Mapping[str, str], prelude: Sequence[str], cwd: str | None) -> Spawned:
        """Hand the shell its command: ``cwd`` is the working directory as the workspace check
        resolved it (None: stay where the supervisor is), ``prelude`` the shell lines to run first
        (rlimits), ``env`` the environment the cold path would have given."""
        prelude, keep_trap = list(prelude), True
        if self.exit_trap is not None:
            if prelude and prelude[-1] == self.exit_trap:
                prelude.pop()  # the script runs it after the setup, where it would have come
            else:
                keep_trap = False  # not this command's: the script skips it
        setup: list[str] = []
        if spec.stdin == "null":
            setup.append("exec 0</dev/null")
        if cwd is not None:
            # cd sets OLDPWD, which a cold shell would not have: __pp_cd unsets it (a line the
            # shell would read a byte per read(2) otherwise), and it comes back if the call has one.
            setup.append(f"__pp_cd {shlex.quote(cwd)}")
            old = env.get("OLDPWD")
            if old is not None:
                setup.append(f"export OLDPWD={shlex.quote(old)}")
        if env != self.env:  # the usual call's is the shell's own: no walk over either
            setup += [f"export {k}={shlex.quote(v)}" for k, v in env.items() if self.env.get(k) != v]
            setup += [f"unset {k}" for k in self.env if k not in env]
        setup += prelude
        if self.join:
            setup = [*self.join, *setup]
        command = spec.command
        if isinstance(command, str) and spec.isolation is None:
            text = command
        else:
            prefix = isolation_prefix(spec.isolation) if spec.isolation is not None else []
            text = "exec " + shlex.join(shell_argv(command, [], prefix))
        words = [self.token, _one_line(text)]
        if setup or not keep_trap:
            words.append(_one_line("\n".join(setup)))
        if not keep_trap:
            words.append("1")
        line = (" ".join(words) + "\n").encode()
        self.launched = True
        try:
            written = os.write(self.stdin_fd, line)
        except OSError:  # EPIPE: it died; EAGAIN: something else filled its pipe
            raise WarmShellGone from None
        if written != len(line):  # half a line reads as a refusal: start cold
            raise WarmShellGone
        stdin_fd: int | None = self.stdin_fd
        target: str | None = self.stdin_target
        if spec.stdin == "null":
            os.close(self.stdin_fd)
            self.stdin_fd = -1
            stdin_fd = target = None
        # No pidfd: our unreaped child, watched as every leader is (Session._watch_leader).
        return Spawned(self.popen, self.pid, None, stdin_fd, self.stdout_fd, self.stderr_fd, target)

    def close_fds(self) -> None:
        for fd in (self.stdin_fd, self.stdout_fd, self.stderr_fd):
            if fd >= 0:
                os.close(fd)
        self.stdin_fd = self.stdout_fd = self.stderr_fd = -1


def waiting_pids() -> set[int]:
    """The shells every open pool of this process holds ready: processes that are accounted for
    while their supervisor is open (a leak check leaves these alone, and nothing else)."""
    return {shell.pid for pool in list(_OPEN_POOLS) for shell in pool._ready}


def waiting_fds() -> set[int]:
    """The descriptors this process holds for those shells (their pipes)."""
    return {
        fd
        for pool in list(_OPEN_POOLS)
        for shell in pool._ready
        for fd in (shell.stdin_fd, shell.stdout_fd, shell.stderr_fd)
        if fd >= 0
    }


class WarmPool:
    """At most ``size`` warm shells, each already in its session's tree (with cgroups: its cgroup).

    With agents' CPU groups (``groups``, engine/fairness.py), a shell is made for one agent and
    waits in its group: joining a group with the command would put a cgroup migration, and the
    wait for a grace period that comes with it after idle, back on the call's path. The pool
    shares its shells among the agents that took one last, most recent first, one each before
    any has two; a shell of an agent past its share is ended to make room. The first shells,
    made at start, belong to nobody and join the group of whoever takes them."""

    def __init__(
        self,
        trees: TreeBackend,
        size: int,
        *,
        make_env: Callable[[str], dict[str, str]],
        new_id: Callable[[], str],
        groups: AgentGroups | None = None,
        exit_trap: Callable[[str], str | None] | None = None,
    ) -> None:
        """``exit_trap(session_id)``: the line a launch's prelude ends with for that session, if
        it is known when the shell starts (None: not known then, or none)."""
        self._trees = trees
        self._exit_trap = exit_trap
        self.size = max(0, size)
        self._make_env = make_env
        self._new_id = new_id
        self._groups = groups if groups is not None and groups.active else None
        # The agents that took a shell, least recent first (None: any agent, or no groups).
        self._recent: OrderedDict[str | None, None] = OrderedDict({None: None})
        # Oldest first: the oldest shell has had the longest to finish joining its cgroup.
        self._ready: deque[WarmShell] = deque()
        self._refill: asyncio.TimerHandle | None = None
        self._refill_due: float | None = None  # a take's refill delay, its timer not set yet
        self._last_take = 0.0
        self._quiet_until = 0.0
        self._closed = False
        self.taken = 0  # how many sessions started warm (for doctor and the benchmarks)
        _OPEN_POOLS.add(self)

    @property
    def ready(self) -> int:
        return len(self._ready)

    @staticmethod
    def fits(spec: SpawnSpec) -> bool:
        """Whether a warm shell runs ``spec`` exactly as the cold path would."""
        if spec.pty or spec.limits is not None:
            return False
        size = len(spec.command) if isinstance(spec.command, str) else sum(len(w) + 3 for w in spec.command)
        if size > _MAX_COMMAND:
            return False
        return all(_NAME.fullmatch(k) and k not in _SHELL_SPECIAL and not k.startswith("__pp_") for k in spec.env)

    def take(self, spec: SpawnSpec, agent: str | None = None, *, refill: bool = True) -> WarmShell | None:
        """A live warm shell for ``spec`` run by ``agent``, or None (none is ready for that agent,
        or ``spec`` needs the cold path). ``refill=False``: the refill's timer is set by
        :meth:`refill_after_take`, which the caller calls once the shell has its command: a timer
        made here would lie on the call's path, before the command even starts."""
        if self._closed or not self.fits(spec):
            return None
        key = agent if self._groups is not None else None
        shell = None
        for owner in dict.fromkeys((key, None)):
            for candidate in [c for c in self._ready if c.agent == owner]:
                self._ready.remove(candidate)
                if candidate.alive():
                    shell = candidate
                    break
                self.discard(candidate)
            if shell is not None:
                break
        if shell is not None and shell.agent != key and key is not None and self._groups is not None:
            try:
                placement = self._groups.enter(key, shell.session_id)
                line = self._trees.prepare(shell.session_id, placement.tree_group) if placement.tree_group else None
            except OSError:
                self._ready.appendleft(shell)  # the cold path tries again, and says why it cannot
                shell = None
            else:
                # The agent's now: given back unlaunched (give_back), it waits for this agent, its join pending.
                shell.agent, shell.join = key, [*([line] if line else []), *placement.lines]
        if key is not None:
            self._recent.pop(None, None)  # shells for anyone were for the start only
        self._recent[key] = None
        self._recent.move_to_end(key)
        while len(self._recent) > max(1, self.size):
            self._recent.popitem(last=False)
        now = time.monotonic()
        self._refill_due = 0.0 if now - self._last_take < _BACK_TO_BACK else _REFILL_AFTER
        self._last_take = now
        if refill:
            self.refill_after_take()
        if shell is not None:
            self.taken += 1
        return shell

    def refill_after_take(self) -> None:
        """Set the refill's timer the last :meth:`take` asked for, if not set yet."""
        delay, self._refill_due = self._refill_due, None
        if delay is not None:
            self._refill_in(delay)

    def give_back(self, shell: WarmShell) -> None:
        """Return a shell whose session was refused before it was handed a command."""
        if self._closed or len(self._ready) >= self.size or shell.launched:
            self.discard(shell)
        else:
            self.taken -= 1
            self._ready.appendleft(shell)

    def fill(self) -> None:
        """Start shells until ``size`` are waiting (not past a refusal by the OS, retried later).

        It does not wait for a cgroup join in flight, although its fork then waits for it on the
        loop: measured, waiting emptied the pool when calls come back to back, and each cold
        start's fork waits just the same (docs/performance.md, "Back to back")."""
        if self._refill is not None:
            self._refill.cancel()
            self._refill = None
        if self._closed or time.monotonic() < self._quiet_until or not self.size:
            return
        wanted = list(reversed(self._recent))  # most recent first
        target: Counter[str | None] = Counter(wanted[i % len(wanted)] for i in range(self.size))
        have = Counter(shell.agent for shell in self._ready)
        for agent in wanted:
            while have[agent] < target[agent]:
                if len(self._ready) >= self.size:
                    spare = next((s for s in self._ready if have[s.agent] > target[s.agent]), None)
                    if spare is None:
                        break
                    self._ready.remove(spare)
                    self.discard(spare)
                    have[spare.agent] -= 1
                try:
                    self._ready.append(self._start_one(agent))
                except OSError:
                    self._quiet_until = time.monotonic() + _RETRY_AFTER
                    return
                have[agent] += 1

    def refill_soon(self) -> None:
        """A session ended: refill shortly, rather than when the timer of :meth:`take` fires.

        Not at once: the ended session's result is still on its way out (the reply to the
        client is written by tasks that run after this callback), and a spawn takes ~0.5 ms of
        this thread, more after idle."""
        if self._refill is not None:
            self._refill_in(_REFILL_AFTER_END)

    def _refill_in(self, delay: float) -> None:
        """Have :meth:`fill` run within ``delay`` seconds (an earlier one already due stands)."""
        if self._closed:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no running loop: the next take refills
            return
        if self._refill is not None:
            if self._refill.when() <= loop.time() + delay:
                return
            self._refill.cancel()
        self._refill = loop.call_later(delay, self.fill)

    def _start_one(self, agent: str | None = None) -> WarmShell:
        session_id = self._new_id()
        lines: list[str] = []
        tree_group = None
        if agent is not None and self._groups is not None:
            placement = self._groups.enter(agent, session_id)
            tree_group, lines = placement.tree_group, placement.lines
        try:
            tree_line = self._trees.prepare(session_id, tree_group)
        except OSError:
            self._leave(session_id)
            raise
        join = "\n".join([tree_line or "", *lines, *descriptors.child_lines()])
        parent: list[int] = []  # stdin, stdout, stderr: the supervisor's ends
        child: list[int] = []  # the shell's ends
        try:
            for index in range(3):
                r, w = make_pipe()
                ours, theirs = (w, r) if index == 0 else (r, w)
                parent.append(ours)
                child.append(theirs)
            env = self._make_env(session_id)
            exit_trap = self._exit_trap(session_id) if self._exit_trap is not None else None
            trap = "" if exit_trap is None else f'[ "${{__pp_x-}}" = 1 ] || {exit_trap}'
            popen = children.popen(
                ["/bin/sh", "-c", _SCRIPT.format(join=join, trap=trap, moved=_MOVED)],
                stdin=child[0],
                stdout=child[1],
                stderr=child[2],
                env=env,
                start_new_session=True,
                close_fds=True,
            )
        except BaseException:
            for fd in parent + child:
                os.close(fd)
            self._trees.release(session_id)
            self._leave(session_id)
            raise
        for fd in child:
            os.close(fd)
        w_in, r_out, r_err = parent
        token = secrets.token_hex(16)
        os.write(w_in, f"{token}\n".encode())  # an empty pipe: never blocks
        for fd in parent:
            os.set_blocking(fd, False)
        stdin_target = f"pipe:[{os.fstat(w_in).st_ino}]"
        return WarmShell(
            session_id, popen, w_in, r_out, r_err, stdin_target, env, token, agent=agent, exit_trap=exit_trap
        )

    def _leave(self, session_id: str) -> None:
        if self._groups is not None:
            self._groups.leave(session_id)

    def discard(self, shell: WarmShell, *, keep_cgroup: bool = False) -> None:
        """End a shell that will run nothing; its cgroup goes with it, unless a cold start of the
        same session is to use it."""
        if shell.popen.poll() is None:
            shell.popen.kill()  # our unreaped child: its pid is still its own
            shell.popen.wait()  # at once: SIGKILL cannot be caught
        children.release(shell.pid)
        shell.close_fds()
        if not keep_cgroup:
            self._trees.release(shell.session_id)
            self._leave(shell.session_id)

    def close(self) -> None:
        self._closed = True
        _OPEN_POOLS.discard(self)
        if self._refill is not None:
            self._refill.cancel()
            self._refill = None
        while self._ready:
            self.discard(self._ready.popleft())


_OPEN_POOLS: weakref.WeakSet[WarmPool] = weakref.WeakSet()


def favordynmods(cgroup: Path) -> bool | None:
    """Whether the cgroup2 mount holding ``cgroup`` has ``favordynmods`` (None: not found).

    With it (Linux 6.0+, a mount option of the whole host) a migration no longer waits for an RCU
    grace period, and cold starts after idle cost about what warm ones do. procpilot only reads it:
    it is the operator's to set (docs/performance.md says how).
    """
    best: tuple[int, bool] | None = None
    target = str(cgroup)
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                left, _, right = line.partition(" - ")
                fields, fs = left.split(), right.split()
                if len(fields) < 5 or len(fs) < 3 or fs[0] != "cgroup2":
                    continue
                mount_point = fields[4]
                if target == mount_point or target.startswith(mount_point.rstrip("/") + "/"):
                    options = set(fs[2].split(",")) | set(fields[5].split(",") if len(fields) > 5 else ())
                    if best is None or len(mount_point) > best[0]:
                        best = (len(mount_point), "favordynmods" in options)
    except OSError:
        return None
    return None if best is None else best[1]
