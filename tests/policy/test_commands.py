"""Command allow/deny lists: a corpus of known allowlist bypasses, each refused, and plain commands that pass.

Every check resolves real files: /usr/bin programs, and copies, symlinks and fake binaries made in tmp_path.
Only the arithmetic tricks are executed (in bash, against a file in tmp_path), to prove each one is live.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from procpilot.errors import InvalidArgument, ProcpilotError
from procpilot.policy.commands import CommandDenied, CommandPolicy, UnanalyzableCommand, programs_in

PATH = "/usr/bin:/bin"
LS = os.path.realpath(shutil.which("ls", path=PATH) or "/usr/bin/ls")
CAT = os.path.realpath(shutil.which("cat", path=PATH) or "/usr/bin/cat")
RM = shutil.which("rm", path=PATH) or "/usr/bin/rm"


@pytest.fixture
def cwd(tmp_path: Path) -> Path:
    """A working directory holding what the tricks point at: a copy of rm, a script, a copy of ls."""
    shutil.copy(RM, tmp_path / "rm")
    (tmp_path / "evil.sh").write_text("rm -rf x\n")
    (tmp_path / "copies").mkdir()
    shutil.copy(LS, tmp_path / "copies" / "ls")
    return tmp_path


@pytest.fixture
def policy() -> CommandPolicy:
    return CommandPolicy(allow=("ls", "echo", "cat"), path=PATH)


# (trick, what the refusal must name). All try to run rm, curl or a shell under allow=(ls, echo, cat).
BYPASSES: list[tuple[str, str]] = [
    ("ls; rm x", "rm"),
    ("ls && rm x", "rm"),
    ("ls || rm x", "rm"),
    ("ls | rm x", "rm"),
    ("ls |& rm x", "rm"),
    ("ls & rm x", "rm"),
    ("ls\nrm x", "rm"),
    ("ls\r\nrm x", "rm"),
    ("ls > /dev/null; rm x", "rm"),
    ("ls #\nrm x", "rm"),
    ("ls &>/dev/null rm x", "rm"),  # dash reads `ls &` then `>/dev/null rm x`
    ("$(rm x)", "rm"),
    ("echo $(rm x)", "rm"),
    ("echo `rm x`", "rm"),
    ('echo "$(rm x)"', "rm"),
    ("X=$(rm x) ls", "rm"),
    ("cat <<EOF\n$(rm x)\nEOF", "rm"),
    ("cat <(rm x)", "rm"),
    ("echo >(rm x)", "rm"),
    ("echo hi > >(rm x)", "rm"),
    ("eval rm x", "rm"),
    ("sh -c 'rm x'", "rm"),
    ('bash -c "ls; rm x"', "rm"),
    ("sh -c \"sh -c 'curl evil.example'\"", "curl"),
    ("/bin/rm x", "rm"),
    ("/usr/bin/../bin/rm x", "rm"),
    ("/usr/bin/env rm x", "rm"),
    ("env rm x", "rm"),
    ("exec rm x", "rm"),
    ("command rm x", "rm"),
    ("time rm x", "rm"),
    ("nohup rm x", "rm"),
    ("timeout 5 rm x", "rm"),
    ("xargs rm <<< x", "rm"),
    ("find . -exec rm {} \\;", "rm"),
    ("X=rm; $X x", "$X"),
    ("${X:-rm} x", "${X:-rm}"),
    ('"r"m x', "rm"),
    ("r\\m x", "rm"),
    ("\\rm x", "rm"),
    ("'rm' x", "rm"),
    ("r\\\nm x", "rm"),  # a line continuation inside the word
    ("$'\\x72\\x6d' x", "$'\\x72\\x6d'"),
    ("/bin/r? x", "/bin/r?"),
    ("{r,}m x", "{r,}m"),
    ("(rm x)", "rm"),
    ("{ rm x; }", "rm"),
    ("! rm x", "rm"),
    ("if true; then rm x; fi", "rm"),
    ("while false; do :; done; rm x", "rm"),
    ("until rm x; do :; done", "rm"),
    ("for i in 1; do rm x; done", "rm"),
    ("case x in x) rm x;; esac", "rm"),
    ("alias ls=rm", "alias"),
    ("f() { rm x; }; f", "rm"),
    ("function f { rm x; }", "function"),
    ("trap 'rm x' EXIT", "trap"),
    ("builtin eval rm", "builtin"),
    (". ./evil.sh", "evil.sh"),
    ("source evil.sh", "source"),
    ("cat x | sh", "sh"),
    ("sh evil.sh", "sh"),
    ("./rm x", "./rm"),
    ("curl https://evil.example", "curl"),
    ("PATH=/tmp/evil ls", "PATH"),
    ("export PATH=.:$PATH; ls", "PATH"),
    ("LD_PRELOAD=/tmp/evil.so ls", "LD_PRELOAD"),
    ("set -k; ls LD_PRELOAD=/tmp/evil.so", "-k"),
    ("shopt -u interactive_comments", "shopt"),
    # bash evaluates these as arithmetic, and `a[$(cmd)]` in a variable's value runs cmd
    ("x='a[$(rm x)]'; [[ $x -eq 1 ]]", "-eq"),
    ("echo ${!x}", "${!x}"),
    ("echo ${x@P}", "${x@P}"),
    ("echo ${x:0:x}", "${x:0:x}"),
    ("echo $((x))", "$((x))"),
    ('read "$x" <<< 1', '"$x"'),
    ('declare "$x=1"', '"$x=1"'),
    ('printf -v "$x" 1', '"$x"'),
    ('[ -v "$x" ]', "-v"),
    ("let x=1", "let"),
    # names bash assigns through a subscript (arithmetic): `{NAME}>` redirections and `wait -p NAME`
    ("x='a[$(rm x)]'; ls {b[x]}>/dev/null", "{b[x]}"),
    ("x='a[$(rm x)]'; echo {b[x]}>/dev/null", "{b[x]}"),
    ("echo {b[$x]}<<<hi", "{b[$x]}"),
    ("{b[x]}>/dev/null ls", "{b[x]}"),
    ("echo {PATH}>/dev/null", "PATH"),
    ("ls >/dev/null & wait -n -p 'b[x]'", "wait -p"),
    ("ls & wait -np b[x]", "wait -p"),
    ("ls & wait -n -pb[x]", "wait -p"),
    ("read -a 'b[$(rm x)]' <<< 1", "read -a"),
    ("printf -v 'b[$(rm x)]' 1", "printf -v"),
    ("declare 'b[$(rm x)]=1'", "b[$(rm x)]"),
    ("local 'b[$(rm x)]'", "local"),
    ("export 'b[$(rm x)]'", "export"),
    ("echo ${b[$(rm x)]}", "rm"),
    ("(( b[x] ))", "("),
    ("[[ -v b[x] ]]", "-v"),
    ("test -v 'b[x]'", "-v"),
    ("mapfile -t 'b[$(rm x)]' <<< 1", "mapfile"),
    ("o=-v; printf \"$o\" 'b[x]' 1", "b[x]"),
    ("o=-v; [ \"$o\" 'b[x]' ]", "b[x]"),
    ("o=-p; ls & wait -n $o 'b[x]'", "b[x]"),
]

# Sinks where bash evaluates a name's subscript as arithmetic, so `x='a[$(cmd)]'` runs cmd. Each is
# run in a real bash first, to prove the trick is live, then must be refused.
ARITHMETIC_SINKS = [
    "ls {b[x]}>/dev/null",
    "echo {b[x]}>/dev/null",
    'echo {b["x"]}>>/dev/null',
    "echo {b[x]}<>/dev/null",
    "echo {b[x]}</dev/null",
    "echo {b[x]}>|/dev/null",
    "echo {b[x]}<<<hi",
    "{b[x]}>/dev/null ls",
    "exec {b[x]}>/dev/null",
    "ls >/dev/null & wait -n -p 'b[x]'",
    "ls >/dev/null & wait -np 'b[x]'",
    "ls >/dev/null & wait -n -pb[x]",
    "ls >/dev/null & wait -p 'b[x]' -n",
    "o=-p; ls >/dev/null & wait -n $o 'b[x]'",
    "read 'b[x]' <<< 1",
    "printf -v 'b[x]' 1",
    "o=-v; printf \"$o\" 'b[x]' 1",
    "declare 'b[x]=1'",
    "typeset 'b[x]=1'",
    "echo ${b[x]}",
    "(( b[x] ))",
    "[[ -v b[x] ]]",
    "test -v 'b[x]'",
    "[ -v 'b[x]' ]",
    "o=-v; test \"$o\" 'b[x]'",
    'o=-v; v=\'b[x]\'; [ "$o" "$v" ]',
    "b[x]=1",
    "echo $((x))",
]


def test_the_corpus_is_big_enough() -> None:
    assert len(BYPASSES) >= 35


@pytest.mark.parametrize(("trick", "needle"), BYPASSES, ids=[repr(t)[1:-1][:40] for t, _ in BYPASSES])
def test_bypass_is_refused(policy: CommandPolicy, cwd: Path, trick: str, needle: str) -> None:
    with pytest.raises(CommandDenied) as refused:
        policy.check(trick, cwd)
    assert needle in refused.value.message
    assert refused.value.code in ("CommandDenied", "UnanalyzableCommand")


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash is not installed")
@pytest.mark.parametrize("sink", ARITHMETIC_SINKS)
def test_arithmetic_in_a_name_runs_code_in_bash_and_is_refused(
    policy: CommandPolicy, tmp_path: Path, sink: str
) -> None:
    mark = tmp_path / "ran"
    text = f"x='a[$(touch {mark})]'; {sink}"
    subprocess.run(
        ["bash", "-c", text], cwd=tmp_path, stdin=subprocess.DEVNULL, capture_output=True, timeout=10, check=False
    )
    assert mark.exists(), "bash no longer runs this trick: it does not belong in the corpus"
    for command in (["bash", "-c", text], "bash -c " + shlex.quote(text), text):
        with pytest.raises(CommandDenied):
            policy.check(command, tmp_path)


def test_a_copy_of_an_allowed_program_is_refused(policy: CommandPolicy, cwd: Path) -> None:
    copy = cwd / "copies" / "ls"
    with pytest.raises(CommandDenied, match="not allowed") as refused:
        policy.check(f"{copy} -la", cwd)
    assert str(copy) in refused.value.message
    with pytest.raises(CommandDenied):
        policy.check("copies/ls", cwd)
    with pytest.raises(CommandDenied):
        policy.check([str(copy)], cwd)


def test_a_fake_shell_is_not_trusted_with_a_c_string(policy: CommandPolicy, tmp_path: Path) -> None:
    shutil.copy(RM, tmp_path / "bash")  # rm under a shell's name
    with pytest.raises(CommandDenied, match="not allowed"):
        policy.check(f"{tmp_path}/bash -c ls", tmp_path)
    # a real shell that reads its startup files is not exempt either
    with pytest.raises(CommandDenied, match="bash"):
        policy.check("bash -ic ls", tmp_path)


# (trick, needle) under a wider allowlist that includes the wrappers themselves.
WRAPPED: list[tuple[str, str]] = [
    ("env rm x", "rm"),
    ("env -i FOO=1 rm x", "rm"),
    ("env -- rm x", "rm"),
    ("env -S 'rm x'", "-S"),
    ("env PATH=/tmp/evil ls", "PATH"),
    ("env LD_PRELOAD=/tmp/evil.so ls", "LD_PRELOAD"),
    ("env --frobnicate rm x", "--frobnicate"),  # an option we do not know might take a value
    ("nice -n 5 env rm x", "rm"),
    ("nohup sh -c 'rm x'", "rm"),
    ("timeout -s KILL 5 rm x", "rm"),
    ("timeout --kill-after 1 5 rm x", "rm"),
    ("timeout {5,rm} ls", "{5,rm}"),  # brace expansion makes it `timeout 5 rm ls`
    ('X="5 rm"; timeout $X ls', "$X"),  # word splitting makes it `timeout 5 rm ls`
    ("find . $X", "$X"),  # X could hold -exec
    ("find . -execdir rm {} +", "rm"),
    ("find . -name x -ok rm {} ';'", "rm"),
    ("find . -exec {} \\;", "{}"),  # runs the files it finds
    ("find . -exec sh -c 'rm \"$1\"' _ {} \\;", "rm"),
    ("xargs -0 -n1 rm", "rm"),
    ("xargs sh -c 'rm x'", "rm"),
    ("xargs -I{} {} x", "xargs"),  # runs the programs named in its input
]


@pytest.mark.parametrize(("trick", "needle"), WRAPPED, ids=[t[:40] for t, _ in WRAPPED])
def test_wrapped_commands_are_checked_too(cwd: Path, trick: str, needle: str) -> None:
    policy = CommandPolicy(allow=("ls", "echo", "cat", "env", "timeout", "xargs", "find", "nohup", "nice"), path=PATH)
    with pytest.raises(CommandDenied) as refused:
        policy.check(trick, cwd)
    assert needle in refused.value.message


def test_a_wrapper_is_unwrapped_by_what_it_really_is(tmp_path: Path) -> None:
    env = os.path.realpath(shutil.which("env", path=PATH) or "/usr/bin/env")
    (tmp_path / "innocent").symlink_to(env)
    policy = CommandPolicy(allow=("ls", "env"), path=PATH)
    with pytest.raises(CommandDenied, match="rm"):
        policy.check(f"{tmp_path}/innocent rm x", tmp_path)
    assert policy.check(f"{tmp_path}/innocent ls", tmp_path) == [env, LS]


def test_wrappers_that_run_allowed_programs_pass(cwd: Path) -> None:
    policy = CommandPolicy(allow=("ls", "echo", "cat", "env", "timeout", "xargs", "find", "nohup"), path=PATH)
    assert policy.check("env FOO=1 ls", cwd)[-1] == LS
    assert policy.check("timeout -s TERM 5 ls -la", cwd)[-1] == LS
    assert policy.check("find . -name '*.sh' -exec cat {} +", cwd)[-1] == CAT
    assert policy.check("echo a b | xargs -n1 ls", cwd)[-1] == LS
    assert policy.check("nohup ls", cwd)[-1] == LS
    assert policy.check("ls | xargs", cwd)[-1].endswith("/echo")  # no command: xargs runs echo


ALLOWED = [
    "ls -la",
    "ls -la | cat -n",
    "echo \"a; b\" 'c && d'",
    "ls | cat",
    "FOO=1 ls",
    "ls > out.txt 2>&1",
    "cat < evil.sh >> out.txt",
    "cat <<'EOF'\nhello $(not a command: the quoted here-doc body is text)\nEOF",
    "cat <<EOF\nhello $HOME ${USER:-me}\nEOF\nls",
    "cat <<< 'here string'",
    "echo 'it''s'",
    "echo it\\'s",
    "cd copies && ls",
    "if [ -d copies ]; then ls copies; else echo none; fi",
    'for f in a b; do cat "$f"; done',
    'ls "$HOME" ${HOME:-/root} $((1 + 2))',
    "sh -c 'ls | cat'",
    "bash -euc 'ls'",
    "ls # a comment; rm x",
    "set -euo pipefail; ls",
    'read -r line < evil.sh; echo "$line"',
    "export FOO=bar; ls",
    "time ls",
    "command -v rm",
    "true && ls || echo failed",
]


@pytest.mark.parametrize("command", ALLOWED, ids=[c[:40] for c in ALLOWED])
def test_plain_commands_pass(policy: CommandPolicy, cwd: Path, command: str) -> None:
    for program in policy.check(command, cwd):
        assert os.path.isabs(program)


def test_the_resolved_programs_are_returned_in_order(policy: CommandPolicy, cwd: Path) -> None:
    assert policy.check("ls -la", cwd) == [LS]
    assert policy.check("ls | cat; ls", cwd) == [LS, CAT]
    assert policy.check(["ls", "-la"], cwd) == [LS]
    assert policy.check("echo hi", cwd) == []  # a builtin runs no program


def test_a_symlink_to_an_allowed_program_is_allowed(policy: CommandPolicy, tmp_path: Path) -> None:
    (tmp_path / "mylist").symlink_to(LS)
    assert policy.check(f"{tmp_path}/mylist -la", tmp_path) == [LS]
    assert policy.check("./mylist", tmp_path) == [LS]


def test_argv_commands_are_checked_without_a_shell(policy: CommandPolicy, cwd: Path) -> None:
    with pytest.raises(CommandDenied, match="rm"):
        policy.check(["rm", "x"], cwd)
    with pytest.raises(CommandDenied, match="rm"):
        policy.check(["sh", "-c", "rm x"], cwd)
    with pytest.raises(CommandDenied, match="not allowed"):
        policy.check(["env", "ls"], cwd)  # the wrapper must be allowed too
    assert policy.check(["ls", "; rm x"], cwd) == [LS]  # no shell: `; rm x` is just an argument
    with pytest.raises(CommandDenied, match="empty"):
        policy.check([], cwd)


def test_a_missing_program_is_refused_as_not_found(policy: CommandPolicy, cwd: Path) -> None:
    with pytest.raises(CommandDenied, match="not found") as refused:
        policy.check("no-such-program-here --help", cwd)
    assert "no-such-program-here" in refused.value.message
    nothing = CommandPolicy(allow=("no-such-program-here",), path=PATH)
    (cwd / "no-such-program-here").write_text("#!/bin/sh\n")
    (cwd / "no-such-program-here").chmod(0o755)
    with pytest.raises(CommandDenied, match="not allowed"):  # an entry not found allows nothing
        nothing.check("./no-such-program-here", cwd)


def test_relative_paths_after_cd_cannot_be_checked(policy: CommandPolicy, cwd: Path) -> None:
    (cwd / "list").symlink_to(LS)
    assert policy.check("./list", cwd) == [LS]
    with pytest.raises(UnanalyzableCommand, match="changed directory"):
        policy.check("cd /tmp && ./list", cwd)


def test_errors_say_what_is_allowed_and_how_it_matches(policy: CommandPolicy, cwd: Path) -> None:
    with pytest.raises(CommandDenied) as refused:
        policy.check("rm -rf x", cwd)
    error = refused.value
    assert isinstance(error, ProcpilotError)
    assert not isinstance(error, UnanalyzableCommand)
    assert error.code == "CommandDenied"
    assert "ls, echo, cat" in error.hints["allowed"]
    assert "resolved" in error.hints["resolved_match"]
    assert error.to_dict()["refused"] == [f"rm ({os.path.realpath(RM)}) is not allowed"]
    with pytest.raises(UnanalyzableCommand) as hidden:
        policy.check("eval ls", cwd)
    assert hidden.value.code == "UnanalyzableCommand"
    assert "write_it_plainly" in hidden.value.hints
    assert "allowed" in hidden.value.hints


def test_multicall_binaries_are_matched_per_applet(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    busybox = bin_dir / "busybox"
    busybox.write_text("#!/bin/sh\n")
    busybox.chmod(0o755)
    for applet in ("ls", "rm"):
        (bin_dir / applet).symlink_to(busybox)
    (tmp_path / "other").symlink_to(busybox)
    policy = CommandPolicy(allow=("ls",), path=str(bin_dir))
    assert policy.check("ls -la", tmp_path) == [str(busybox)]
    with pytest.raises(CommandDenied, match="rm"):
        policy.check("rm x", tmp_path)  # the same file as ls, but busybox runs the applet argv[0] names
    with pytest.raises(CommandDenied, match="busybox"):
        policy.check("busybox rm x", tmp_path)
    with pytest.raises(CommandDenied, match="other"):
        policy.check("./other", tmp_path)


# -- stdin of an interactive shell


def test_check_input_checks_each_line(policy: CommandPolicy, cwd: Path) -> None:
    policy.check_input("ls\n", cwd)
    policy.check_input("ls -la | cat\necho done\n", cwd)
    policy.check_input("cat <<'EOF'\nrm x\nEOF\n", cwd)  # a here-doc body is text, not a command
    with pytest.raises(CommandDenied, match="rm"):
        policy.check_input("rm x\n", cwd)
    with pytest.raises(CommandDenied, match="rm"):
        policy.check_input("rm x", cwd)  # a partial line: the Enter may come in the next write
    with pytest.raises(CommandDenied, match="rm"):
        policy.check_input("ls\nrm", cwd)
    with pytest.raises(CommandDenied, match="rm"):
        policy.check_input("ls\rrm x\r", cwd)  # a terminal turns CR into Enter


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        ("ls \x15rm x\n", "control characters"),  # ^U erases `ls `, the shell runs `rm x`
        ("ls\x7f\x7fecho\n", "control characters"),
        ("ls\t\n", "control characters"),  # completion
        ("^ls^rm\n", "^old^new"),
        ("!rm\n", "history expansion"),
        ("echo !!\n", "history expansion"),
        ("ls \\\n", "continues"),
        ("./list\n", "directory is unknown"),
    ],
)
def test_check_input_refuses_what_a_terminal_rewrites(policy: CommandPolicy, cwd: Path, data: str, needle: str) -> None:
    (cwd / "list").symlink_to(LS)
    with pytest.raises(UnanalyzableCommand, match=re.escape(needle)):
        policy.check_input(data, cwd)


# -- denylists and no policy


def test_a_denylist_refuses_the_program_however_it_is_named(cwd: Path) -> None:
    policy = CommandPolicy(deny=("rm",), path=PATH)
    for command in ("rm x", "/bin/rm x", 'sh -c "rm x"', "\\rm x", "env rm x", "./rm x", "echo $(rm x)"):
        with pytest.raises(CommandDenied, match="denied"):
            policy.check(command, cwd)
    assert policy.check("ls", cwd) == [LS]
    assert policy.check("echo $(ls) `cat evil.sh`; eval echo", cwd) == [LS, CAT]  # advisory: no allowlist to enforce
    assert policy.check("no-such-program-here", cwd) == []
    with pytest.raises(CommandDenied, match="builtin"):
        CommandPolicy(deny=("echo",), path=PATH).check("echo hi", cwd)
    with pytest.raises(CommandDenied, match="rm"):
        policy.check_input("rm x\n", cwd)


def test_no_policy_allows_everything(cwd: Path) -> None:
    policy = CommandPolicy(path=PATH)
    assert policy.check("rm x", cwd) == [os.path.realpath(RM)]
    assert policy.check("echo $(ls)", cwd) == [LS]
    policy.check_input("rm x\n", cwd)


# -- programs_in


@pytest.mark.parametrize(
    ("command", "programs"),
    [
        ("ls | grep x && wc -l", ["ls", "grep", "wc"]),
        ("FOO=1 env BAR=2 timeout 5 nice -n 3 make test > log 2>&1", ["env", "timeout", "nice", "make"]),
        ("sh -c 'a | b'; c", ["sh", "a", "b", "c"]),
        ("if true; then ls; fi", ["true", "ls"]),
        ("find . -name '*.py' -exec grep -l x {} +", ["find", "grep"]),
        ("\"r\"m -f x & 'l's", ["rm", "ls"]),
        ("cat <<EOF | wc\nnot a command\nEOF", ["cat", "wc"]),
        ("xargs < list", ["xargs", "echo"]),
        ("", []),
    ],
)
def test_programs_in(command: str, programs: list[str]) -> None:
    assert programs_in(command) == programs


@pytest.mark.parametrize("command", ["echo $(ls)", "$CMD x", "eval ls", "f() { ls; }", "cat <(ls)"])
def test_programs_in_refuses_what_it_cannot_read(command: str) -> None:
    with pytest.raises(UnanalyzableCommand):
        programs_in(command)


@pytest.mark.parametrize(
    "body",
    [
        "EO\\\nF\nrm x\nEOF\n",  # bash joins EO\ + F into the delimiter: rm x runs in bash
        "foo\\\nEOF\nrm x\nEOF\n",  # dash ends the body at the EOF line after foo\: rm x runs in dash
        "\tEOF\nrm x\n",  # <<- strips the tabs before comparing
    ],
)
def test_a_here_doc_ends_where_either_shell_ends_it(policy: CommandPolicy, cwd: Path, body: str) -> None:
    operator = "<<-" if body.startswith("\t") else "<<"
    with pytest.raises(CommandDenied, match="rm"):
        policy.check(f"cat {operator}EOF\n{body}", cwd)


def test_deep_nesting_is_an_invalid_argument_not_a_crash() -> None:
    policy = CommandPolicy(allow=("echo",))
    deep = "echo " + "$(" * 2000 + "echo x" + ")" * 2000
    with pytest.raises(InvalidArgument, match="nested"):
        policy.check(deep)
    with pytest.raises(InvalidArgument, match="nested"):
        policy.check_input(deep + "\n")  # what is typed into a shell never passes through a SpawnSpec


def test_a_refusal_names_each_program_once() -> None:
    policy = CommandPolicy(allow=("echo",))
    with pytest.raises(CommandDenied) as refused:
        policy.check("echo a" + " | cat" * 20_000)
    assert refused.value.message.count("cat") == 2  # "cat (/usr/bin/cat) is not allowed", once
