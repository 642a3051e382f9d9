"""shell/wrappers.py: each wrapper reads its own options and hands on the command it runs, through
the Reader it is given; an option it does not know stops it (the command word might be a value)."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from procpilot.shell.lexer import Program, Scan, Word
from procpilot.shell.wrappers import MULTICALL, SHELLS, WRAPPERS, Reader


@dataclass
class Handed:
    """What a wrapper handed on: argvs (as plain words) and shell texts."""

    argvs: list[list[str]] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)

    def reader(self) -> Reader:
        return Reader(
            argv=lambda words, _scan: self.argvs.append([w.text for w in words]),
            text=lambda text, _scan: self.texts.append(text),
        )


def unwrap(line: str) -> tuple[Handed, Scan]:
    prog, *args = line.split(" ")
    handed, scan = Handed(), Scan(realpath_of=lambda _word: None)
    WRAPPERS[prog](Program(prog), [Word(a, a) for a in args], scan, handed.reader())
    return handed, scan


@pytest.mark.parametrize(
    ("line", "argv"),
    [
        ("env -i FOO=1 python3 x.py", ["python3", "x.py"]),
        ("nohup ./serve", ["./serve"]),
        ("nice -n 5 make", ["make"]),
        ("timeout -s KILL 5 pytest -q", ["pytest", "-q"]),
        ("stdbuf -oL grep x", ["grep", "x"]),
        ("sudo -u root rm -rf /", ["rm", "-rf", "/"]),
        ("xargs -0 rm", ["rm"]),
        ("find . -name *.py -exec grep -l x {} +", ["grep", "-l", "x", "{}"]),
        ("busybox wget x", ["wget", "x"]),
        ("ionice -c 3 du -sh", ["du", "-sh"]),
    ],
)
def test_the_wrapped_argv_is_handed_on(line: str, argv: list[str]) -> None:
    handed, scan = unwrap(line)
    assert handed.argvs == [argv]
    assert handed.texts == [] and scan.problems == []


@pytest.mark.parametrize(
    ("line", "text"),
    [("sh -c curl x", "curl"), ("bash -c ls", "ls"), ("watch -n1 ls", "ls"), ("flock /tmp/l -c make", "make")],
)
def test_the_wrapped_shell_text_is_handed_on(line: str, text: str) -> None:
    handed, scan = unwrap(line)
    assert handed.texts == [text]
    assert handed.argvs == [] and scan.problems == []


def test_an_unknown_option_stops_the_unwrapping() -> None:
    handed, scan = unwrap("env --bogus ls")
    assert handed == Handed()
    assert scan.problems == ["env: unknown option --bogus"]


def test_a_variable_that_changes_what_runs_is_a_problem() -> None:
    handed, scan = unwrap("sudo LD_PRELOAD=/tmp/x.so ls")
    assert handed.argvs == [["ls"]]
    assert scan.problems and "LD_PRELOAD" in scan.problems[0]


def test_help_runs_nothing() -> None:
    handed, scan = unwrap("timeout --help")
    assert handed == Handed() and scan.problems == []


def test_the_tables() -> None:
    assert {"sh", "bash", "dash", "zsh"} <= SHELLS <= WRAPPERS.keys()
    assert {"busybox", "toybox"} <= MULTICALL <= WRAPPERS.keys()
