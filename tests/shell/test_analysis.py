"""shell/analysis.py: every program a line runs, in order, wrapped ones included; what cannot be
checked is a problem, never a silent pass."""

from __future__ import annotations

import shlex

from procpilot.shell.analysis import analyze_argv, analyze_text, commands_in, control_flow_in
from procpilot.shell.lexer import Scan, Word


def read(text: str, realpath_of: dict[str, str] | None = None) -> Scan:
    known = realpath_of or {}
    scan = Scan(realpath_of=known.get)
    analyze_text(text, scan)
    return scan


def programs(scan: Scan) -> list[str]:
    return [p.word for p in scan.programs]


def test_every_command_of_a_line_in_order() -> None:
    scan = read("make -j4 && ./run | tee log; cd /tmp")
    assert programs(scan) == ["make", "./run", "tee", "cd"]
    assert [p.builtin for p in scan.programs] == [False, False, False, True]
    assert scan.programs[0].args == ("-j4",)
    assert scan.cwd_changed  # relative paths after it no longer mean what they did
    assert scan.problems == []


def test_wrapped_commands_are_read_as_well() -> None:
    scan = read("timeout 5 sh -c 'curl x | bash'")
    assert programs(scan) == ["timeout", "sh", "curl", "bash"]
    assert scan.programs[1].shell_c


def test_code_the_line_hides_is_a_problem() -> None:
    assert read('eval "$cmd"').problems == ['eval "$cmd": eval runs its arguments as shell code']
    assert read("$CMD arg").problems == ["the command word $CMD is only known at run time (variable, glob, brace or ~)"]
    assert read("LD_PRELOAD=/tmp/x.so ls").problems == [
        "assignment to LD_PRELOAD changes which program runs or what it loads"
    ]
    assert read("export PATH=/tmp").problems == ["assignment to PATH changes which program runs or what it loads"]


def test_nesting_is_followed_to_a_bound() -> None:
    text = "true"
    for _ in range(14):
        text = "sh -c " + shlex.quote(text)
    scan = read(text)
    assert scan.problems == ["shell code nested too deeply to check"]
    assert programs(scan) == ["sh"] * 12


def test_a_program_is_unwrapped_by_the_file_it_really_is() -> None:
    """A symlink named ``foo`` to env runs env: what it wraps is read too."""
    assert programs(read("foo python3 x", {"foo": "/usr/bin/env"})) == ["foo", "python3"]
    assert programs(read("foo python3 x")) == ["foo"]


def test_an_argv_is_not_read_by_a_shell() -> None:
    scan = Scan(realpath_of=lambda _word: None)
    analyze_argv([Word("eval", "eval"), Word("x", "x")], scan, in_shell=False)
    assert programs(scan) == ["eval"] and not scan.programs[0].builtin  # /usr/bin/eval, if any
    scan = Scan(realpath_of=lambda _word: None)
    analyze_argv([Word("eval", "eval"), Word("x", "x")], scan, in_shell=True)
    assert scan.programs[0].builtin and scan.problems


def test_commands_in_gives_programs_with_their_arguments() -> None:
    assert commands_in("sh -c 'cat x | python3 y.py'") == [
        ("sh", ("-c", "cat x | python3 y.py")),
        ("cat", ("x",)),
        ("python3", ("y.py",)),
    ]
    assert commands_in("python3 $SCRIPT") == [("python3", (None,))]  # known only at run time


def test_control_flow_in_sees_reserved_words_only_where_a_command_starts() -> None:
    for line in (
        "if true; then python3 x.py; fi",
        "true && while false; do :; done",
        "for f in a b; do echo $f; done",
        "x=1\nuntil true; do :; done",
        "! case a in a) :;; esac",
    ):
        assert control_flow_in(line), line
    for line in ("echo if then fi", "echo 'while'", "python3 x.py > if", "time python3 x.py", "'if' true"):
        assert not control_flow_in(line), line
