"""Command allowlists and denylists, matched on the programs a command line would really run.

An agent's policy may name the programs it may run (an allowlist) or must not run (a denylist). A
shell command line hides programs in many places: after ``;`` ``&&`` ``|`` ``&`` or a newline, in
``$(...)`` and backticks, behind wrappers (``env``, ``sh -c``, ``xargs``, ``find -exec``, ``timeout``
...), behind quoting (``"r"m``, ``r\\m``) and behind paths (``/bin/rm``, a copy in ``/tmp``). So this
module reads the text the way ``sh`` and ``bash`` would (a small lexer for POSIX sh plus the
bash-isms agents write), finds every command word, unwraps the wrappers, and resolves each program
to the real path of the file that would run (PATH lookup, then every symlink followed). A program
is allowed iff its real path is the real path of an allowlist entry: a copy of ``rm`` named ``ls``
is refused, a symlink to ``/usr/bin/ls`` is allowed.

Where ``sh`` (dash) and ``bash`` read a line differently (``&>``, ``[[ a || b ]]``, ``$'...'``) the
reading that finds more commands wins. What cannot be known before the line runs (a command word
built from a variable, ``eval``, ``source``, a command substitution, a function definition...) is
refused under an allowlist as :class:`UnanalyzableCommand`: when we cannot know what will run,
refusing is the only safe answer. Refusals name what was refused and why, so an agent can rewrite.

An allowlist is not a sandbox. An allowed program that runs other programs runs them unchecked:
allowing a shell (to read a script or stdin), an interpreter (python, node, perl, awk...) or a tool
with its own command hooks (git aliases and hooks, make, npm scripts, vim, less...) allows
everything. Programs that take a command as an argument are unwrapped only for the wrappers listed
in ``wrappers.WRAPPERS``; any other (ssh, su, script, unshare, chroot, parallel...) must itself be allowed,
and allowing it allows what it runs. Use isolation (read-only root, no network, a separate user) to
limit what programs can do; use the allowlist to keep an agent to the tools it was meant to use.

The reading itself is ``procpilot.shell``'s (lexer, analysis, wrappers); this module resolves
what it found and decides.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from procpilot.errors import CommandDenied, UnanalyzableCommand
from procpilot.shell.analysis import analyze_argv, analyze_text
from procpilot.shell.lexer import Scan, Word, snippet
from procpilot.shell.reading import ShellText
from procpilot.shell.wrappers import MULTICALL, SHELLS

__all__ = ["CommandDenied", "CommandPolicy", "UnanalyzableCommand", "programs_in"]

# ---------------------------------------------------------------------------------------------
# The policy


def _executable(path: str) -> str | None:
    if "\0" in path:
        return None
    if os.path.isfile(path) and os.access(path, os.X_OK):
        return os.path.realpath(path)
    return None


def _lookup(word: str, path: str, cwd: str) -> str | None:
    """The real path of the file ``word`` runs: a name is searched on ``path`` (relative entries
    against ``cwd``, as the shell does), a name with a slash is taken as is (relative to ``cwd``)."""
    if not word or "\0" in word:
        return None
    if "/" in word:
        return _executable(os.path.join(cwd, word))
    for entry in path.split(os.pathsep):
        found = _executable(os.path.join(cwd, entry or ".", word))
        if found:
            return found
    return None


def _system_path() -> str:
    try:
        return os.confstr("CS_PATH") or "/bin:/usr/bin"
    except (ValueError, OSError, AttributeError):
        return "/bin:/usr/bin"


def _interactive_problems(text: str) -> list[str]:
    """What an interactive shell (a terminal, readline) does to input before it is a command line."""
    found: list[str] = []
    control = sorted({c for c in text if c not in "\n " and not c.isprintable()})
    if control:
        shown = ", ".join(f"U+{ord(c):04X}" for c in control)
        found.append(f"control characters ({shown}): line editing and completion change what a terminal runs")
    if re.search(r"!(?![\s=(]|$)", text):
        found.append("history expansion (!...) re-runs earlier commands in an interactive shell")
    if re.search(r"(?m)^[ \t]*\^", text):
        found.append("^old^new re-runs the previous command in an interactive shell")
    stripped = text[:-1] if text.endswith("\n") else text
    if (len(stripped) - len(stripped.rstrip("\\"))) % 2 == 1:
        found.append("the line continues (trailing \\) into a later write, which is checked on its own")
    return found


@dataclass(frozen=True)
class CommandPolicy:
    """An agent's command allowlist and denylist.

    ``allow``: program names or paths the agent may run; ``None`` allows everything. Each entry is
    resolved once, here, the way a command word is (a bare name: looked up on ``path``, then its
    real path; a path: its real path), and a program is allowed iff its real path is one of these.
    An entry that is not found is kept as a bare name, which no real path ever equals: it allows
    nothing (until the policy is built again on a PATH where it exists).

    ``deny``: refused programs, resolved the same way (a bare entry also refuses any program of that
    name). A denylist alone is always bypassable (copy the binary under another name, or use an
    interpreter that is not denied): it is advisory, a guard against mistakes, not against intent.
    An allowlist is not a sandbox either: see the module docstring.

    ``path``: the PATH the session will run with, used to resolve names.
    """

    allow: tuple[str, ...] | None = None
    deny: tuple[str, ...] = ()
    path: str = os.defpath
    _allowed: frozenset[str] = field(init=False, repr=False, compare=False, default=frozenset())
    _allowed_applets: dict[str, set[str]] = field(init=False, repr=False, compare=False, default_factory=dict)
    _denied: frozenset[str] = field(init=False, repr=False, compare=False, default=frozenset())
    _denied_applets: dict[str, set[str]] = field(init=False, repr=False, compare=False, default_factory=dict)
    _denied_names: frozenset[str] = field(init=False, repr=False, compare=False, default=frozenset())
    _shells: frozenset[str] = field(init=False, repr=False, compare=False, default=frozenset())

    def __post_init__(self) -> None:
        try:
            cwd = os.getcwd()
        except OSError:
            cwd = "/"
        allowed, allowed_applets = self._resolve_entries(self.allow or (), cwd)
        denied, denied_applets = self._resolve_entries(self.deny, cwd)
        object.__setattr__(self, "_allowed", allowed)
        object.__setattr__(self, "_allowed_applets", allowed_applets)
        object.__setattr__(self, "_denied", denied)
        object.__setattr__(self, "_denied_applets", denied_applets)
        object.__setattr__(self, "_denied_names", frozenset(e for e in self.deny if "/" not in e))
        # Shells trusted to run a checked -c string without being allowed themselves: only those in
        # the system's own directories, never whatever a session PATH (maybe writable) finds first.
        system = _system_path()
        shells = {found for name in SHELLS if (found := _lookup(name, system, "/"))}
        object.__setattr__(self, "_shells", frozenset(shells))

    def _resolve_entries(self, entries: Sequence[str], cwd: str) -> tuple[frozenset[str], dict[str, set[str]]]:
        reals: set[str] = set()
        applets: dict[str, set[str]] = {}
        for entry in entries:
            real = _lookup(entry, self.path, cwd)
            if real is None:
                # Kept as written: a bare name never equals a real path; a missing absolute path
                # matches only if that very file appears later.
                reals.add(os.path.normpath(entry) if entry.startswith("/") else entry)
                continue
            reals.add(real)
            if os.path.basename(real) in MULTICALL:
                # busybox & co.: every applet has the same real path; argv[0] picks the applet.
                applets.setdefault(real, set()).add(os.path.basename(entry))
        return frozenset(reals), applets

    # -- public ---------------------------------------------------------------------------------

    def check(self, command: ShellText | str | Sequence[str], cwd: Path | None = None) -> list[str]:
        """Refuse ``command`` unless every program it would run passes the policy.

        A ``str`` is shell text (it will run through ``/bin/sh -c``), and so is a ``ShellText``
        (a spec's, read here through what its earlier readers lexed); a sequence is an argv that
        is exec'd directly. Returns the real paths of the programs it will run, in order (shell
        builtins, which run no program, are not listed). Raises :class:`UnanalyzableCommand` (under
        an allowlist) when the text hides what it runs, :class:`CommandDenied` when a program is
        refused or does not exist.
        """
        base = str(cwd) if cwd is not None else os.getcwd()
        scan = self._scan(base, interactive=False)
        if isinstance(command, str | ShellText):
            (ShellText(command) if isinstance(command, str) else command).analyze(scan)
        else:
            argv = list(command)
            if not argv:
                raise CommandDenied("the command is empty", hints=self._hints())
            analyze_argv([Word(a, a) for a in argv], scan, in_shell=False)
        return self._decide(scan)

    def check_input(self, data: str, cwd: Path | None = None) -> None:
        """Check text written to an interactive shell's stdin: each line is a command line.

        Same rules as :meth:`check`, plus what a terminal does to input: carriage returns end
        lines, a trailing partial line is checked as it stands (the words it has must pass already),
        and under an allowlist control characters (line editing, completion), history expansion,
        ``^old^new`` and a line continued into a later write are refused. The shell's working
        directory is not known here (it may have run ``cd``), so relative program paths are refused.
        """
        text = data.replace("\r\n", "\n").replace("\r", "\n")
        base = str(cwd) if cwd is not None else os.getcwd()
        scan = self._scan(base, interactive=True)
        if self.allow is not None:
            for found in _interactive_problems(text):
                scan.problem(found)
        analyze_text(text, scan)
        self._decide(scan)

    # -- internals ------------------------------------------------------------------------------

    def _scan(self, base: str, *, interactive: bool) -> Scan:
        # One lookup per distinct word and check: a line of 20,000 `| cat` resolves cat once.
        @functools.cache
        def realpath_of(word: str) -> str | None:
            return _lookup(word, self.path, base)

        return Scan(realpath_of=realpath_of, interactive=interactive)

    def _is_allowed(self, word: str, real: str) -> bool:
        if real not in self._allowed:
            return False
        applets = self._allowed_applets.get(real)
        return applets is None or os.path.basename(word) in applets

    def _is_denied(self, word: str, real: str) -> bool:
        if os.path.basename(word) in self._denied_names or os.path.basename(real) in self._denied_names:
            return True
        if real not in self._denied:
            return False
        applets = self._denied_applets.get(real)
        return applets is None or os.path.basename(word) in applets

    def _hints(self) -> dict[str, str]:
        hints: dict[str, str] = {}
        if self.allow is not None:
            hints["allowed"] = "Allowed here: " + (", ".join(self.allow) or "nothing") + " (and shell builtins)."
        if self.deny:
            hints["denied"] = "Denied here: " + ", ".join(self.deny) + "."
        return hints

    def _decide(self, scan: Scan) -> list[str]:
        # Each distinct reason once (dicts keep their order): a refusal names a program once,
        # however often the line runs it.
        problems = dict.fromkeys(scan.problems)
        cwd_unknown = scan.cwd_changed or scan.interactive
        relative_path = any(not os.path.isabs(entry) for entry in self.path.split(os.pathsep))
        refusals: dict[str, None] = {}
        resolved: dict[str, None] = {}
        for prog in scan.programs:
            word = prog.word
            if prog.builtin:
                if word in self._denied_names:
                    refusals[f"{word} (a shell builtin) is denied"] = None
                continue
            relative = ("/" in word and not word.startswith("/")) or ("/" not in word and relative_path)
            if cwd_unknown and relative:
                why = "the shell may have changed directory" if scan.cwd_changed else "the shell's directory is unknown"
                problems[f"{snippet(word)}: a relative program path, and {why}"] = None
            real = scan.realpath_of(word)
            if real is None:
                if self.allow is not None:
                    refusals[f"{snippet(word)}: not found"] = None
                continue
            if self._is_denied(word, real):
                refusals[f"{snippet(word)} ({real}) is denied"] = None
                continue
            exempt = prog.shell_c and real in self._shells
            if self.allow is not None and not exempt and not self._is_allowed(word, real):
                refusals[f"{snippet(word)} ({real}) is not allowed"] = None
                continue
            resolved[real] = None
        return self._verdict(list(problems), list(refusals), list(resolved))

    def _verdict(self, problems: list[str], refused: list[str], resolved: list[str]) -> list[str]:
        if self.allow is not None and problems:
            message = "cannot check this command before it runs: " + "; ".join(problems)
            if refused:
                message += "; refused: " + "; ".join(refused)
            raise UnanalyzableCommand(message, hints=self._hints(), problems=problems, refused=refused)
        if refused:
            raise CommandDenied("command refused: " + "; ".join(refused), hints=self._hints(), refused=refused)
        return resolved


def programs_in(command: str) -> list[str]:
    """The command words a shell would run for ``command``, in order, after quote removal.

    Wrapped commands are included after their wrapper (``env rm x`` -> ``["env", "rm"]``,
    ``sh -c 'ls | wc'`` -> ``["sh", "ls", "wc"]``), and so are shell builtins. Raises
    :class:`UnanalyzableCommand` when the text hides what it runs (the same rules as an allowlist).
    """
    scan = Scan(realpath_of=lambda _word: None)
    analyze_text(command, scan)
    if scan.problems:
        raise UnanalyzableCommand("cannot tell what this command runs: " + "; ".join(scan.problems))
    return [p.word for p in scan.programs]
