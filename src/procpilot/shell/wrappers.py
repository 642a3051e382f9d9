"""Programs whose arguments name another program to run (``env``, ``sh -c``, ``xargs``,
``find -exec``, ``timeout``, ``sudo``...): each unwrapped the way it reads its options."""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass

from procpilot.shell.lexer import ASSIGNMENT, Program, Scan, Word, show, snippet
from procpilot.shell.variables import sensitive_variable

# ---------------------------------------------------------------------------------------------
# Wrappers: programs whose arguments name another program to run


@dataclass(frozen=True, slots=True)
class Reader:
    """How a wrapper hands on the command it runs: to the reading of commands (shell/analysis.py),
    which calls the wrappers and passes itself in, so neither module imports the other."""

    argv: Callable[[list[Word], Scan], None]  # an argv the wrapper execs directly (no builtins)
    text: Callable[[str, Scan], None]  # shell text the wrapper hands to a shell


Handler = Callable[[Program, list[Word], Scan, Reader], None]


@dataclass(frozen=True, slots=True)
class _Opts:
    """A getopt-style option table. Anything not in it is refused: an option we do not know might
    take a value, and then we would mistake the wrong word for the command."""

    short_flag: str = ""
    short_arg: str = ""  # value: rest of the cluster, or the next word
    short_opt: str = ""  # optional value, only attached (xargs -i{})
    long_flag: frozenset[str] = frozenset()
    long_arg: frozenset[str] = frozenset()
    long_opt: frozenset[str] = frozenset()  # optional value, only with =


def _options(spec: _Opts, args: list[Word], prog: str, scan: Scan) -> tuple[list[tuple[str, str]], int] | None:
    """Options as (name, value) and the index of the first operand (stops there, like getopt's '+'),
    or None (a problem is noted) when an option is unknown or a word before the operand is not static."""
    found: list[tuple[str, str]] = []
    i = 0
    while i < len(args):
        word = args[i]
        a = word.text
        if a == "--":
            i += 1
            break
        if not a.startswith("-") or a == "-":
            break
        if not word.static:
            scan.problem(f"{prog}: option {word.raw} is only known at run time")
            return None
        i += 1
        if a.startswith("--"):
            name, eq, value = a[2:].partition("=")
            known = spec.long_flag | spec.long_arg | spec.long_opt
            matches = sorted(o for o in known if o.startswith(name))
            full = name if name in known else matches[0] if len(matches) == 1 else None
            if full is None:
                scan.problem(f"{prog}: unknown option {word.raw}")
                return None
            if full in spec.long_arg and not eq:
                if i >= len(args) or not args[i].static:
                    scan.problem(f"{prog}: the value of {word.raw} is missing or only known at run time")
                    return None
                value = args[i].text
                i += 1
            found.append(("--" + full, value))
            continue
        for j in range(1, len(a)):
            ch = a[j]
            if ch in spec.short_arg:
                value = a[j + 1 :]
                if not value:
                    if i >= len(args) or not args[i].static:
                        scan.problem(f"{prog}: the value of -{ch} is missing or only known at run time")
                        return None
                    value = args[i].text
                    i += 1
                found.append(("-" + ch, value))
                break
            if ch in spec.short_opt:
                found.append(("-" + ch, a[j + 1 :]))
                break
            if ch not in spec.short_flag:
                scan.problem(f"{prog}: unknown option -{ch} in {word.raw}")
                return None
            found.append(("-" + ch, ""))
    return found, i


def _has(opts: list[tuple[str, str]], *names: str) -> bool:
    return any(o in names for o, _ in opts)


def _wrapped(prog: Program, args: list[Word], scan: Scan, read: Reader) -> None:
    """The wrapped command starts at ``args[0]``: its word must be static; it runs via exec."""
    if args:
        read.argv(args, scan)


def _standard(spec: _Opts, operands_before: int = 0) -> Handler:
    """A wrapper ``prog [options] [N operands] command [args]``."""

    def handler(prog: Program, args: list[Word], scan: Scan, read: Reader) -> None:
        parsed = _options(spec, args, prog.word, scan)
        if parsed is None:
            return
        opts, i = parsed
        if _has(opts, "--help", "--version", "-h", "-V"):
            return
        for word in args[i : i + operands_before]:
            if not word.static:
                scan.problem(f"{prog.word}: argument {word.raw} is only known at run time")
                return
        _wrapped(prog, args[i + operands_before :], scan, read)

    return handler


_TIMEOUT = _Opts(
    short_flag="v",
    short_arg="sk",
    long_flag=frozenset({"preserve-status", "foreground", "verbose", "help", "version"}),
    long_arg=frozenset({"signal", "kill-after"}),
)
_HELP = frozenset({"help", "version"})


def _env(prog: Program, args: list[Word], scan: Scan, read: Reader) -> None:
    spec = _Opts(
        short_flag="i0v",
        short_arg="uCS",
        long_flag=frozenset({"ignore-environment", "null", "debug", "list-signal-handling"}) | _HELP,
        long_arg=frozenset({"unset", "chdir", "split-string"}),
        long_opt=frozenset({"block-signal", "default-signal", "ignore-signal"}),
    )
    parsed = _options(spec, args, prog.word, scan)
    if parsed is None:
        return
    opts, i = parsed
    for opt, value in opts:
        if opt in ("-C", "--chdir"):
            scan.cwd_changed = True
        if opt in ("-S", "--split-string"):
            scan.problem(f"{prog.word} {opt} {snippet(value)}: env splits a string into a command")
            try:
                split = [Word(s, s) for s in shlex.split(value)]
            except ValueError:
                split = []
            read.argv(split + args[i:], scan)
            return
    if i < len(args) and args[i].text == "-":
        i += 1
    while i < len(args) and "=" in args[i].text:
        word = args[i]
        if not word.static:
            scan.problem(f"{prog.word}: argument {word.raw} is only known at run time")
            return
        if sensitive_variable(word.text.partition("=")[0]):
            scan.problem(f"{prog.word} {word.raw} changes which program runs or what it loads")
        i += 1
    _wrapped(prog, args[i:], scan, read)


def _nice(prog: Program, args: list[Word], scan: Scan, read: Reader) -> None:
    if args and args[0].static and re.fullmatch(r"-[+-]?[0-9]+", args[0].text):
        args = args[1:]  # the old `nice -5 cmd`
    _standard(_Opts(short_arg="n", long_arg=frozenset({"adjustment"}), long_flag=_HELP))(prog, args, scan, read)


def _chrt(prog: Program, args: list[Word], scan: Scan, read: Reader) -> None:
    spec = _Opts(
        short_flag="bdfiorRampvhV",
        short_arg="TPD",
        long_flag=frozenset({"batch", "deadline", "fifo", "idle", "other", "rr", "reset-on-fork", "all-tasks",
                             "max", "pid", "verbose"}) | _HELP,
        long_arg=frozenset({"sched-runtime", "sched-period", "sched-deadline"}),
    )  # fmt: skip
    parsed = _options(spec, args, prog.word, scan)
    if parsed is None:
        return
    opts, i = parsed
    if _has(opts, "-p", "--pid", "-m", "--max", "-h", "--help", "-V", "--version"):
        return
    if i < len(args) and not args[i].static:
        scan.problem(f"{prog.word}: argument {args[i].raw} is only known at run time")
        return
    if i < len(args) and args[i].text.isdigit():
        i += 1  # the priority
    _wrapped(prog, args[i:], scan, read)


def _ionice(prog: Program, args: list[Word], scan: Scan, read: Reader) -> None:
    spec = _Opts(
        short_flag="thV",
        short_arg="cnpPu",
        long_flag=frozenset({"ignore"}) | _HELP,
        long_arg=frozenset({"class", "classdata", "pid", "pgid", "uid"}),
    )
    parsed = _options(spec, args, prog.word, scan)
    if parsed is None:
        return
    opts, i = parsed
    if not _has(opts, "-p", "-P", "-u", "--pid", "--pgid", "--uid", "-h", "--help", "-V", "--version"):
        _wrapped(prog, args[i:], scan, read)


def _flock(prog: Program, args: list[Word], scan: Scan, read: Reader) -> None:
    spec = _Opts(
        short_flag="sexunoFvhV",
        short_arg="wEc",
        long_flag=frozenset({"shared", "exclusive", "unlock", "nonblock", "nb", "close", "no-fork", "verbose"}) | _HELP,
        long_arg=frozenset({"timeout", "wait", "conflict-exit-code", "command"}),
    )
    parsed = _options(spec, args, prog.word, scan)
    if parsed is None:
        return
    opts, i = parsed
    strings = [v for o, v in opts if o in ("-c", "--command")]
    rest = args[i + 1 :]  # after the lock file (or fd)
    if i < len(args) and not args[i].static:
        scan.problem(f"{prog.word}: argument {args[i].raw} is only known at run time")
        return
    if rest and rest[0].text in ("-c", "--command"):
        if len(rest) < 2 or not rest[1].static:
            scan.problem(f"{prog.word}: the -c command is missing or only known at run time")
            return
        strings.append(rest[1].text)
        rest = []
    for s in strings:  # flock runs these with /bin/sh -c
        read.text(s, scan)
    if not strings:
        _wrapped(prog, rest, scan, read)


def _watch(prog: Program, args: list[Word], scan: Scan, read: Reader) -> None:
    spec = _Opts(
        short_flag="bceCgprtwxhv",
        short_arg="nqs",
        short_opt="d",
        long_flag=frozenset({"beep", "color", "no-color", "errexit", "chgexit", "precise", "no-rerun",
                             "no-title", "no-wrap", "exec"}) | _HELP,
        long_arg=frozenset({"interval", "equexit", "shotsdir"}),
        long_opt=frozenset({"differences"}),
    )  # fmt: skip
    parsed = _options(spec, args, prog.word, scan)
    if parsed is None:
        return
    opts, i = parsed
    if _has(opts, "-x", "--exec"):
        _wrapped(prog, args[i:], scan, read)
        return
    rest = args[i:]
    if not all(w.static for w in rest):
        scan.problem(f"{show([*args])}: watch runs a command line that is only known at run time")
        return
    if rest:
        read.text(" ".join(w.text for w in rest), scan)  # watch runs it with sh -c


def _sudo(prog: Program, args: list[Word], scan: Scan, read: Reader) -> None:
    spec = _Opts(
        short_flag="AbEeHiKklnPSsVvh",
        short_arg="CDgprRtTUu",
        long_flag=frozenset({"askpass", "background", "edit", "set-home", "login", "remove-timestamp",
                             "reset-timestamp", "list", "non-interactive", "preserve-groups", "stdin", "shell",
                             "validate", "bell"}) | _HELP,
        long_arg=frozenset({"close-from", "chdir", "group", "host", "prompt", "chroot", "role", "type",
                            "command-timeout", "other-user", "user"}),
        long_opt=frozenset({"preserve-env"}),
    )  # fmt: skip
    parsed = _options(spec, args, prog.word, scan)
    if parsed is None:
        return
    opts, i = parsed
    if _has(opts, "-e", "--edit"):
        scan.problem(f"{show([*args])}: sudo -e runs an editor")
    if _has(opts, "-s", "--shell", "-i", "--login"):
        scan.problem(f"{prog.word} -s/-i runs a shell that reads its startup files")
    if _has(opts, "-R", "--chroot"):
        scan.problem(f"{prog.word} -R: the command is looked up in another root")
    if _has(opts, "-D", "--chdir"):
        scan.cwd_changed = True
    while i < len(args) and ASSIGNMENT.match(args[i].raw):
        if not args[i].static:
            scan.problem(f"{prog.word}: argument {args[i].raw} is only known at run time")
            return
        if sensitive_variable(args[i].text.partition("=")[0]):
            scan.problem(f"{prog.word} {args[i].raw} changes which program runs or what it loads")
        i += 1
    _wrapped(prog, args[i:], scan, read)


def _doas(prog: Program, args: list[Word], scan: Scan, read: Reader) -> None:
    parsed = _options(_Opts(short_flag="nsL", short_arg="Cu"), args, prog.word, scan)
    if parsed is None:
        return
    opts, i = parsed
    if _has(opts, "-s"):
        scan.problem(f"{prog.word} -s runs a shell")
    if not _has(opts, "-C"):
        _wrapped(prog, args[i:], scan, read)


def _xargs(prog: Program, args: list[Word], scan: Scan, read: Reader) -> None:
    spec = _Opts(
        short_flag="0oprtx",
        short_arg="adEILnPs",
        short_opt="eil",
        long_flag=frozenset({"null", "open-tty", "interactive", "no-run-if-empty", "verbose", "exit",
                             "show-limits"}) | _HELP,
        long_arg=frozenset({"arg-file", "delimiter", "max-args", "max-procs", "max-chars", "process-slot-var"}),
        long_opt=frozenset({"eof", "replace", "max-lines"}),
    )  # fmt: skip
    parsed = _options(spec, args, prog.word, scan)
    if parsed is None:
        return
    opts, i = parsed
    if _has(opts, "--help", "--version", "--show-limits"):
        return
    rest = args[i:] or [Word("echo", "echo")]  # no command: xargs runs echo
    replace = [v or "{}" for o, v in opts if o in ("-I", "-i", "--replace")]
    if any(r and r in rest[0].text for r in replace):
        scan.problem(f"{show([*args])}: xargs would run programs named in its input")
        return
    _wrapped(prog, rest, scan, read)


def _find(prog: Program, args: list[Word], scan: Scan, read: Reader) -> None:
    for word in args:
        if not word.static:
            scan.problem(f"{prog.word}: argument {word.raw} is only known at run time (it could be -exec)")
            return
    i = 0
    while i < len(args):
        action = args[i].text
        i += 1
        if action not in ("-exec", "-execdir", "-ok", "-okdir"):
            continue
        command: list[Word] = []
        while i < len(args):
            text = args[i].text
            if text == ";" or (text == "+" and command and command[-1].text == "{}"):
                break
            command.append(args[i])
            i += 1
        i += 1
        if not command:
            continue
        head = command[0].text
        if "{}" in head:
            scan.problem(f"{prog.word} {action} {command[0].raw}: find would run the files it finds")
            continue
        if action in ("-execdir", "-okdir") and "/" in head and not head.startswith("/"):
            scan.problem(f"{prog.word} {action} {head}: a relative path, run from each file's directory")
        read.argv(command, scan)


def _strace(prog: Program, args: list[Word], scan: Scan, read: Reader) -> None:
    spec = _Opts(
        short_flag="cCdDfFhiknqrtTvVwxyzZ",
        short_arg="abeEIoOpPsSuUX",
        long_flag=frozenset({"follow-forks", "output-separately", "summary-only", "summary", "no-abbrev"}) | _HELP,
        long_arg=frozenset({"output", "trace", "env", "user", "attach", "string-limit", "signal", "status"}),
    )
    parsed = _options(spec, args, prog.word, scan)
    if parsed is None:
        return
    opts, i = parsed
    for opt, value in opts:
        if opt in ("-o", "--output") and value.startswith(("|", "!")):
            scan.problem(f"{prog.word} -o {value}: strace pipes its output to a shell command")
            read.text(value[1:], scan)
        if opt in ("-E", "--env") and sensitive_variable(value.partition("=")[0]):
            scan.problem(f"{prog.word} -E {value} changes which program runs or what it loads")
    if not _has(opts, "-h", "--help", "-V", "--version"):
        _wrapped(prog, args[i:], scan, read)


def _multicall(prog: Program, args: list[Word], scan: Scan, read: Reader) -> None:
    """``busybox APPLET args``: the applet is the command (looked up by name, as an approximation)."""
    if not args:
        return
    first = args[0]
    if not first.static:
        scan.problem(f"{prog.word}: applet {first.raw} is only known at run time")
        return
    if first.text.startswith("--coreutils-prog="):
        applet = first.text.partition("=")[2]
        read.argv([Word(applet, applet), *args[1:]], scan)
    elif not first.text.startswith("-"):
        read.argv(args, scan)


SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh", "ksh93", "mksh", "lksh", "pdksh", "ash", "yash", "posh",
                     "rbash"})  # fmt: skip
_SHELL_LONG_SAFE = frozenset({"--norc", "--noprofile", "--posix", "--restricted", "--verbose", "--noediting",
                              "--help", "--version"})  # fmt: skip


def _shell(prog: Program, args: list[Word], scan: Scan, read: Reader) -> None:
    """``sh -c STRING``: the string is read as shell code too. Anything else (a script, stdin, -i,
    --rcfile, a login shell) runs code we cannot see: the shell itself must then be allowed."""
    command_mode = False
    reads_files = False
    i = 0
    while i < len(args):
        word = args[i]
        a = word.text
        if not word.static:
            if a.startswith(("-", "+")):
                scan.problem(f"{prog.word}: option {word.raw} is only known at run time")
                return
            break
        if a in ("--", "-"):
            i += 1
            break
        if a.startswith("--"):
            if a in ("--rcfile", "--init-file"):
                i += 1
            reads_files = reads_files or a not in _SHELL_LONG_SAFE
            i += 1
            continue
        if not a.startswith(("-", "+")) or len(a) == 1:
            break
        i += 1
        for ch in a[1:]:
            if ch == "c" and a[0] == "-":
                command_mode = True
            elif ch in "oO":
                i += 1  # the option's name
            elif ch in "il":
                reads_files = True
    if not command_mode:
        return
    if i >= len(args):
        return
    string = args[i]
    if not string.static:
        scan.problem(f"{prog.word} -c {string.raw}: the command string is only known at run time")
        return
    prog.shell_c = not reads_files
    read.text(string.text, scan)


MULTICALL = frozenset({"busybox", "toybox", "coreutils"})

WRAPPERS: dict[str, Handler] = {
    "env": _env,
    "nohup": _standard(_Opts(long_flag=_HELP)),
    "nice": _nice,
    "timeout": _standard(_TIMEOUT, operands_before=1),
    "stdbuf": _standard(_Opts(short_arg="ioe", long_arg=frozenset({"input", "output", "error"}), long_flag=_HELP)),
    "setsid": _standard(_Opts(short_flag="cfwhV", long_flag=frozenset({"ctty", "fork", "wait"}) | _HELP)),
    "time": _standard(
        _Opts(
            short_flag="apqvV",
            short_arg="fo",
            long_flag=frozenset({"append", "portability", "quiet", "verbose"}) | _HELP,
            long_arg=frozenset({"format", "output"}),
        )
    ),
    "chrt": _chrt,
    "ionice": _ionice,
    "flock": _flock,
    "watch": _watch,
    "sudo": _sudo,
    "doas": _doas,
    "xargs": _xargs,
    "find": _find,
    "strace": _strace,
    **dict.fromkeys(MULTICALL, _multicall),
    **dict.fromkeys(SHELLS, _shell),
}
