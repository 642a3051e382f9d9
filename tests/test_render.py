from __future__ import annotations

import random
from collections.abc import Sequence

import pytest

from procpilot.errors import InvalidArgument
from procpilot.render import (
    collapse_cr,
    complete_utf8_prefix,
    derive_name,
    for_model,
    head_chars,
    plain_words,
    strip_ansi,
    tail_chars,
)
from procpilot.shell.lexer import simple_commands


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        # SGR colours around text.
        ("\x1b[31mred\x1b[0m plain", "red plain"),
        ("\x1b[1;32;40mbold green\x1b[m", "bold green"),
        ("\x1b[38;5;208morange\x1b[39m", "orange"),
        ("\x1b[38;2;255;0;0mtruecolor\x1b[0m", "truecolor"),
        ("ok \x1b[32m✓\x1b[0m done", "ok ✓ done"),
        # Private modes and cursor control.
        ("\x1b[?25lhidden cursor\x1b[?25h", "hidden cursor"),
        ("\x1b[?1049h\x1b[Hscreen\x1b[?1049l", "screen"),
        ("\x1b[2K\x1b[1Gline", "line"),
        ("a\x1b[3Db", "ab"),
        ("\x1b[>4;1m\x1b[=5uwith intermediates", "with intermediates"),
        # OSC 8 hyperlink, BEL- and ST-terminated: the link text stays.
        ("\x1b]8;;https://example.com\x07link\x1b]8;;\x07 after", "link after"),
        ("\x1b]8;id=1;https://example.com/a?b=c\x1b\\link\x1b]8;;\x1b\\", "link"),
        # OSC window title.
        ("\x1b]0;my title\x07prompt$ ", "prompt$ "),
        ("\x1b]2;title\x1b\\text", "text"),
        # Unterminated OSC stops at the next escape or newline instead of eating output.
        ("\x1b]0;title\x1b[31mred", "red"),
        ("\x1b]0;title\nnext line", "\nnext line"),
        # DCS and APC strings.
        ("\x1bPq#0;2;0;0;0\x1b\\after", "after"),
        ("\x1b_Gf=100;AAAA\x1b\\image", "image"),
        # Other escapes: two-character and charset selection.
        ("\x1b7saved\x1b8", "saved"),
        ("\x1b=keypad\x1b>", "keypad"),
        ("\x1b(Bascii\x1b)0", "ascii"),
        ("\x1bMreverse index", "reverse index"),
        # A CSI cut off at the end of a chunk leaves nothing behind.
        ("text\x1b[38;5", "text"),
        ("text\x1b", "text"),
        # C0 controls go, except newline, tab and carriage return.
        ("bell\x07!", "bell!"),
        ("a\x00b\x01c\x08d\x0be\x0cf\x0eg\x1fh\x7fi", "abcdefghi"),
        ("keep\ttab\nnewline\rcr", "keep\ttab\nnewline\rcr"),
        # C1 controls go too.
        ("a\x9b31mb\x85c", "a31mbc"),
        ("plain text, nothing to strip", "plain text, nothing to strip"),
        ("", ""),
    ],
)
def test_strip_ansi(raw: str, expected: str) -> None:
    assert strip_ansi(raw) == expected


def _tqdm_line(percent: int) -> str:
    done = percent // 10
    return f"{percent:3d}%|{'█' * done}{' ' * (10 - done)}| {percent}/100"


TQDM = "".join("\r" + _tqdm_line(p) for p in range(0, 101)) + "\n"


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("no carriage returns\nat all", "no carriage returns\nat all"),
        ("10%\r20%\r30%", "30%"),
        ("10%\r20%\r30%\ndone", "30%\ndone"),
        # \r\n is a plain newline (and \r\r\n from a PTY echoing a program's \r\n).
        ("one\r\ntwo\r\n", "one\ntwo\n"),
        ("one\r\r\ntwo", "one\ntwo"),
        # A trailing partial line keeps its last redraw, even when it ends in \r.
        ("header\n10%\r55%", "header\n55%"),
        ("header\n10%\r55%\r", "header\n55%"),
        ("\rleading", "leading"),
        ("\r", ""),
        # Each line is collapsed on its own.
        ("a\rb\nc\rd\n", "b\nd\n"),
        ("Downloading\n" + TQDM + "Done\n", "Downloading\n" + _tqdm_line(100) + "\nDone\n"),
    ],
)
def test_collapse_cr(raw: str, expected: str) -> None:
    assert collapse_cr(raw) == expected


def test_tqdm_progress_keeps_only_final_state() -> None:
    collapsed = collapse_cr(TQDM)
    assert collapsed == _tqdm_line(100) + "\n"
    assert "99/100" not in collapsed


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (b"plain\n", "plain\n"),
        ("already text", "already text"),
        (b"\x1b[32mPASSED\x1b[0m 3 tests\r\n", "PASSED 3 tests\n"),
        ("caf\u00e9".encode(), "café"),
        # Invalid UTF-8 is replaced, not an error.
        (b"bad \xff byte", "bad \ufffd byte"),
        # Colours inside a redraw are stripped before the redraw is collapsed.
        (b"\x1b[33m 10%\x1b[0m\r\x1b[33m100%\x1b[0m\n", "100%\n"),
        (b"\x1b[2K\r\x1b[1Gbuilding... 1/3\r\x1b[2K\x1b[1Gbuilding... 3/3", "building... 3/3"),
        (b"\x1b]8;;file:///tmp/x\x07x\x1b]8;;\x07\n", "x\n"),
    ],
)
def test_for_model(raw: bytes | str, expected: str) -> None:
    assert for_model(raw) == expected


# 50 a's, a newline, 49 b's: 100 characters, one line boundary at index 50.
TWO_LINES = "a" * 50 + "\n" + "b" * 49


@pytest.mark.parametrize(
    ("text", "limit", "expected_text", "expected_cut"),
    [
        ("short", 10, "short", 0),
        ("exact", 5, "exact", 0),
        ("", 5, "", 0),
        ("abcdef", 0, "", 6),
        # No newline anywhere: a plain character cut.
        ("abcdefghij", 4, "ghij", 6),
        # The newline lies in the first 10% of the window: start on the fresh line.
        (TWO_LINES, 52, "b" * 49, 51),
        (TWO_LINES, 54, "b" * 49, 51),
        # The newline is further in than 10% of the window: keep the plain cut.
        (TWO_LINES, 56, TWO_LINES[44:], 44),
        (TWO_LINES, 60, TWO_LINES[40:], 40),
        # The cut already falls right after a newline.
        (TWO_LINES, 49, "b" * 49, 51),
        # Windows under 10 characters have no slack to move into.
        ("aaaa\nbbbbb", 7, "a\nbbbbb", 3),
    ],
)
def test_tail_chars(text: str, limit: int, expected_text: str, expected_cut: int) -> None:
    tail, cut = tail_chars(text, limit)
    assert (tail, cut) == (expected_text, expected_cut)
    assert text[cut:] == tail


@pytest.mark.parametrize(
    ("text", "limit", "expected_text", "expected_cut"),
    [
        ("short", 10, "short", 0),
        ("exact", 5, "exact", 0),
        ("abcdef", 0, "", 6),
        ("abcdefghij", 4, "abcd", 6),
        # The newline lies in the last 10% of the window: end on it.
        (TWO_LINES, 53, "a" * 50 + "\n", 49),
        (TWO_LINES, 55, "a" * 50 + "\n", 49),
        # Too far back: keep the plain cut.
        (TWO_LINES, 57, TWO_LINES[:57], 43),
        (TWO_LINES, 62, TWO_LINES[:62], 38),
        # Already on a boundary, before or after the newline.
        (TWO_LINES, 51, "a" * 50 + "\n", 49),
        (TWO_LINES, 50, "a" * 50, 50),
        ("aaaaa\nbbbb", 7, "aaaaa\nb", 3),
    ],
)
def test_head_chars(text: str, limit: int, expected_text: str, expected_cut: int) -> None:
    head, cut = head_chars(text, limit)
    assert (head, cut) == (expected_text, expected_cut)
    assert text[: len(text) - cut] == head


@pytest.mark.parametrize("function", [tail_chars, head_chars])
def test_negative_limit_is_rejected(function: object) -> None:
    assert callable(function)
    with pytest.raises(InvalidArgument, match="limit"):
        function("text", -1)


MIXED = "aé€😀z"  # 1-, 2-, 3- and 4-byte characters
MIXED_BYTES = MIXED.encode()
# Byte offsets where a character starts (or the data ends).
MIXED_BOUNDARIES = [0, 1, 3, 6, 10, 11]


@pytest.mark.parametrize("cut", range(len(MIXED_BYTES) + 1))
def test_complete_utf8_prefix_at_every_split(cut: int) -> None:
    data = MIXED_BYTES[:cut]
    expected = max(boundary for boundary in MIXED_BOUNDARIES if boundary <= cut)
    assert complete_utf8_prefix(data) == expected
    # The prefix decodes cleanly and the held-back bytes complete it.
    assert data[:expected].decode() == MIXED[: len(data[:expected].decode())]


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"", 0),
        (b"ascii", 5),
        (b"\xc3", 0),
        (b"x\xc3", 1),
        (b"x\xe2\x82", 1),
        (b"x\xf0\x9f\x98", 1),
        (b"x\xf0\x9f\x98\x80", 5),
        # Invalid bytes count as complete: more data cannot fix them.
        (b"x\xff", 2),
        (b"x\x80", 2),
        (b"x\x80\x80\x80", 4),
        (b"x\xc0", 2),
        (b"x\xf5", 2),
        (b"x\xe0\x80", 3),
        (b"x\xed\xa0", 3),
        (b"x\xf0\x80", 3),
        (b"x\xf4\x90", 3),
        (b"x\xf0\x9f\x98\xff", 5),
        # Second bytes that are valid for these leads keep the sequence pending.
        (b"x\xe0\xa0", 1),
        (b"x\xed\x9f", 1),
        (b"x\xf4\x8f\xbf", 1),
        (b"\xf0\x9f", 0),
        # A complete 4-byte character is not confused by its continuation bytes.
        ("😀".encode() * 3, 12),
    ],
)
def test_complete_utf8_prefix(data: bytes, expected: int) -> None:
    assert complete_utf8_prefix(data) == expected


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        # The examples the spec asks for.
        ("python -m pytest -q tests", "pytest tests"),
        ("npm run build", "npm build"),
        ("sleep 5 && echo done", "sleep 5"),
        ("cd app && make test", "make test"),
        ("./scripts/deploy.sh prod", "deploy.sh prod"),
        # Subcommands and targets past options and their values.
        ("make -C dir test", "make test"),
        ("make -j 4 test", "make test"),
        ("git commit -m x", "git commit"),
        ("git -C repo status", "git status"),
        ("cargo test", "cargo test"),
        ("cargo +nightly build --release", "cargo build"),
        ("yarn run x", "yarn x"),
        ("npm --prefix web run lint", "npm lint"),
        ("pytest -k 'a and b' tests/unit/", "pytest tests/unit"),
        ("head -n 5 file.txt", "head file.txt"),
        ("docker compose up -d", "docker compose"),
        ("ls", "ls"),
        # Assignments and wrappers are skipped.
        ("FOO=1 BAR=2 npm test", "npm test"),
        ("sudo -u me cargo test", "cargo test"),
        ("env -i PATH=/bin make", "make"),
        ("nohup ./server --port 80", "server"),
        ("time make all", "make all"),
        ("exec node app.js", "app.js"),
        ("timeout 30 npm test", "npm test"),
        ("/usr/bin/env python3 tool.py run", "tool.py run"),
        # Runners name what they run.
        ("uv run pytest -x tests", "pytest tests"),
        ("poetry run python -m mypy src", "mypy src"),
        ("npx vitest run", "vitest run"),
        ("bundle exec rspec spec", "rspec spec"),
        # Interpreters are looked through.
        ("python manage.py runserver", "manage.py runserver"),
        ("python3.11 -mhttp.server 8000", "http.server 8000"),
        ("python -c 'print(1)'", "python"),
        ("node -e 'x'", "node"),
        ("bash -c 'yarn run lint'", "yarn lint"),
        ("bash -lc 'cd a && make x'", "make x"),
        ("sh scripts/setup.sh", "setup.sh"),
        # Shell syntax: pipes, subshells, redirections, newlines.
        ("cat log.txt | grep error", "cat log.txt"),
        ("(cd a; make)", "make"),
        ("make test > out.log 2>&1", "make test"),
        ("sleep 5 > /dev/null", "sleep 5"),
        ("ls 2>/dev/null", "ls"),
        ("cd a\nmake x", "make x"),
        ("cd app", "cd app"),
        # Targets: URLs become hosts, ./ and trailing / go.
        ("curl -s https://example.com/health", "curl example.com"),
        ("cat ./notes/", "cat notes"),
        # Odd input still gets a name.
        ("FOO=1", "FOO=1"),
        ("sudo", "sudo"),
        ('echo "unbalanced', 'echo "unbalanced'),
        # An argv is not shell syntax.
        (["echo", "&&", "x"], "echo &&"),
        (["python", "-m", "pytest", "tests"], "pytest tests"),
        (["sh", "-c", "cd x && make all"], "make all"),
        (("cargo", "build"), "cargo build"),
    ],
)
def test_derive_name(command: str | Sequence[str], expected: str) -> None:
    assert derive_name(command) == expected


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        # A long path shrinks to its last component before anything is truncated.
        ("pytest tests/integration/very/deep/directory/test_x.py", "pytest test_x.py"),
        ("x" * 60, "x" * 39 + "…"),
        ("verb " + "y" * 60, "verb " + "y" * 34 + "…"),
    ],
)
def test_derive_name_is_at_most_40_characters(command: str, expected: str) -> None:
    name = derive_name(command)
    assert name == expected
    assert len(name) <= 40


# Words near the edge of "plain": shell keywords, assignments, options, and characters the shell
# reads specially (quotes, escapes, comments, operators, expansions) mixed into plain ones.
_KEYWORDS = ["if", "then", "fi", "do", "done", "for", "in", "case", "esac", "time", "function", "coproc"]
_KEYWORDS += ["{", "}", "!", "[[", "]]", "--", "-", "=", "a=b", "A_1=x", "x=", "2", "%1", "@", "sudo", "env"]
_PLAIN_CHARS = "abz09_./:,@%+=-AZ"
_SPECIAL_CHARS = "'\"$`\\*?[]{}~#!<>|&;()^ \t\n\r\x00é"


def test_plain_words_are_the_lexers_words() -> None:
    """The lexer-free reading of plain commands (what names ``true`` or ``npm test`` without the
    lexer) gives the lexer's very words, or declines: never a quote, an escape or a comment read
    as a plain character."""
    rng = random.Random(24)
    plain = 0
    for _ in range(5000):
        words = [
            rng.choice(_KEYWORDS)
            if rng.random() < 0.3
            else "".join(
                rng.choice(_PLAIN_CHARS if rng.random() < 0.93 else _SPECIAL_CHARS) for _ in range(rng.randint(1, 6))
            )
            for _ in range(rng.randint(1, 4))
        ]
        text = rng.choice([" ", "  ", "\t"]).join(words)
        got = plain_words(text)
        if got is not None:
            plain += 1
            assert [got] == simple_commands(text), text
            assert derive_name(text) == derive_name(simple_commands(text)[0])
    assert plain > 1000  # the lexer-free path was taken often enough to be tested


@pytest.mark.parametrize("command", ["", "   ", "&&", [], "\n"])
def test_derive_name_rejects_empty_command(command: str | list[str]) -> None:
    with pytest.raises(InvalidArgument, match="empty"):
        derive_name(command)


def test_cut_marker_names_lines_characters_and_the_call() -> None:
    from procpilot.render import cut_marker

    marker = cut_marker(171_429, 1_200_345, "process log sessionId=x offset=10 limit=171429")
    assert marker == (
        "…[171,429 lines, 1,200,345 characters cut here; process log sessionId=x offset=10 limit=171429 reads them]…"
    )
    assert cut_marker(0, 50, "c") == "…[50 characters cut here; c reads them]…"


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (b"plain text\n\tand tabs\r\n", 0),
        (b"\x1b[31mred\x1b[0m \x07\x08", 0),  # a terminal's own controls are text
        (b"\x00" * 100, 100),
        (b"ok \xff\xfe ok", 2),
        ("h\u00e9 \ufffd".encode(), 0),  # a real U+FFFD is text
        (b"\x01\x02abc\x00", 3),
    ],
)
def test_binary_bytes(raw: bytes, expected: int) -> None:
    from procpilot.render import binary_bytes

    assert binary_bytes(raw) == expected
