"""shell/lexer.py: words with their quoting and expansions, operators, redirections, substitutions,
and the Scan that collects what a line runs."""

from __future__ import annotations

import pytest

from procpilot.errors import InvalidArgument
from procpilot.shell.lexer import ASSIGNMENT, Lexer, Op, Redir, Scan, Token, Word, show, simple_commands, snippet


def lex(text: str) -> tuple[list[Token], list[list[Token]], Scan]:
    scan = Scan(realpath_of=lambda _word: None)
    nested: list[list[Token]] = []
    return Lexer(text, scan, nested).run(), nested, scan


def test_words_keep_their_quoting_and_expansions() -> None:
    tokens, nested, scan = lex("""echo 'a b' "$HOME" x*.py""")
    echo, quoted, home, glob = tokens
    assert (echo.text, echo.static) == ("echo", True)
    assert isinstance(quoted, Word) and (quoted.text, quoted.raw, quoted.quoted) == ("a b", "'a b'", True)
    assert isinstance(home, Word) and home.expands and not home.static  # only known at run time
    assert isinstance(glob, Word) and glob.pattern and not glob.static  # may become other words
    assert nested == [] and scan.problems == []


def test_operators_and_redirections_are_their_own_tokens() -> None:
    tokens, _nested, _scan = lex("make >out 2>&1 | grep -v y; ls")
    assert tokens == [
        Word("make", "make"),
        Redir(">"),
        Word("out", "out"),
        Redir(">&"),
        Word("1", "1"),
        Op("|"),
        Word("grep", "grep"),
        Word("-v", "-v"),
        Word("y", "y"),
        Op(";"),
        Word("ls", "ls"),
    ]


def test_a_substitution_is_lexed_too_and_noted() -> None:
    tokens, nested, scan = lex("echo $(date) `id`")
    assert [t.text for t in tokens if isinstance(t, Word)] == ["echo", "$(date)", "`id`"]
    assert nested == [[Word("date", "date")], [Word("id", "id")]]  # what they run, for the analysis
    assert scan.problems == [
        "command substitution $(date) runs a command we cannot check",
        "command substitution `id` runs a command we cannot check",
    ]


def test_malformed_text_is_a_problem_or_a_typed_error() -> None:
    _tokens, _nested, scan = lex("echo 'unterminated")
    assert scan.problems == ["unterminated ' quote in 'unterminated"]
    with pytest.raises(InvalidArgument, match="nested more than 100 deep"):
        lex("echo " + "$(" * 200 + "x" + ")" * 200)


def test_simple_commands_as_plain_words() -> None:
    assert simple_commands("FOO=1 make -j4 && echo 'done' | tee log") == [
        ["FOO=1", "make", "-j4"],
        ["echo", "done"],
        ["tee", "log"],
    ]


def test_text_for_messages_is_escaped_and_cut() -> None:
    assert snippet("ls\r") == "ls\\r"
    assert snippet("x" * 100, 10) == "xxxxxxx..."
    assert show([Word("a b", "'a b'"), Word("c", "c")]) == "'a b' c"


def test_assignment_words() -> None:
    assert [bool(ASSIGNMENT.match(w)) for w in ("A=1", "A+=1", "A[2]=x", "1A=2", "=x", "a")] == [
        True,
        True,
        True,
        False,
        False,
        False,
    ]
    match = ASSIGNMENT.match("ARR[2]=x")
    assert match is not None and match.groups() == ("ARR", "[2]")


def test_the_scan_counts_substitutions_and_keeps_each_problem_once() -> None:
    scan = Scan(realpath_of=lambda _word: None)
    scan.problem("bad\x1b")
    scan.problem("bad\x1b")
    assert scan.problems == ["bad\\x1b"]
    for _ in range(100):
        scan.enter_substitution()
    with pytest.raises(InvalidArgument):
        scan.enter_substitution()
    assert scan.substitutions == 100
