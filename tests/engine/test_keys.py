from __future__ import annotations

from typing import Any

import pytest

from procpilot.engine.keys import (
    encode_hex,
    encode_keys,
    encode_literal,
    encode_paste,
    encode_submit,
)
from procpilot.errors import InvalidArgument

NAMED_KEYS = [
    ("Enter", b"\r"),
    ("Return", b"\r"),
    ("Tab", b"\t"),
    ("BTab", b"\x1b[Z"),
    ("Escape", b"\x1b"),
    ("Esc", b"\x1b"),
    ("Space", b" "),
    ("BSpace", b"\x7f"),
    ("Backspace", b"\x7f"),
    ("Up", b"\x1b[A"),
    ("Down", b"\x1b[B"),
    ("Right", b"\x1b[C"),
    ("Left", b"\x1b[D"),
    ("Home", b"\x1b[H"),
    ("End", b"\x1b[F"),
    ("PageUp", b"\x1b[5~"),
    ("PPage", b"\x1b[5~"),
    ("PageDown", b"\x1b[6~"),
    ("NPage", b"\x1b[6~"),
    ("Insert", b"\x1b[2~"),
    ("IC", b"\x1b[2~"),
    ("Delete", b"\x1b[3~"),
    ("DC", b"\x1b[3~"),
    ("F1", b"\x1bOP"),
    ("F2", b"\x1bOQ"),
    ("F3", b"\x1bOR"),
    ("F4", b"\x1bOS"),
    ("F5", b"\x1b[15~"),
    ("F6", b"\x1b[17~"),
    ("F7", b"\x1b[18~"),
    ("F8", b"\x1b[19~"),
    ("F9", b"\x1b[20~"),
    ("F10", b"\x1b[21~"),
    ("F11", b"\x1b[23~"),
    ("F12", b"\x1b[24~"),
]


@pytest.mark.parametrize(("name", "expected"), NAMED_KEYS)
def test_named_key(name: str, expected: bytes) -> None:
    assert encode_keys([name]) == expected


@pytest.mark.parametrize(("name", "expected"), NAMED_KEYS)
def test_named_keys_are_case_insensitive(name: str, expected: bytes) -> None:
    assert encode_keys([name.lower()]) == expected
    assert encode_keys([name.upper()]) == expected


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        # Ctrl on letters, either case.
        ("C-a", b"\x01"),
        ("C-c", b"\x03"),
        ("C-z", b"\x1a"),
        ("C-A", b"\x01"),
        ("C-Z", b"\x1a"),
        # Ctrl on the punctuation that has a control code.
        ("C-@", b"\x00"),
        ("C-Space", b"\x00"),
        ("C-[", b"\x1b"),
        ("C-\\", b"\x1c"),
        ("C-]", b"\x1d"),
        ("C-^", b"\x1e"),
        ("C-_", b"\x1f"),
        ("C-?", b"\x7f"),
        # Meta is an ESC prefix.
        ("M-a", b"\x1ba"),
        ("M-A", b"\x1bA"),
        ("M-.", b"\x1b."),
        ("M--", b"\x1b-"),
        ("M-Enter", b"\x1b\r"),
        ("M-Escape", b"\x1b\x1b"),
        ("M-Tab", b"\x1b\t"),
        ("M-BSpace", b"\x1b\x7f"),
        ("M-Space", b"\x1b "),
        ("M-BTab", b"\x1b\x1b[Z"),
        # Combined modifiers, any order, any case.
        ("C-M-x", b"\x1b\x18"),
        ("M-C-x", b"\x1b\x18"),
        ("c-m-x", b"\x1b\x18"),
        ("C-S-a", b"\x01"),
        # Shift upper-cases characters and leaves caseless ones alone.
        ("S-a", b"A"),
        ("S-1", b"1"),
        ("S-Space", b" "),
        ("M-S-a", b"\x1bA"),
        ("S-Tab", b"\x1b[Z"),
        ("M-S-Tab", b"\x1b\x1b[Z"),
        ("C-BSpace", b"\x08"),
        # Cursor keys: xterm CSI 1 ; <1 + shift + 2*alt + 4*ctrl> <letter>.
        ("S-Up", b"\x1b[1;2A"),
        ("M-Down", b"\x1b[1;3B"),
        ("C-Left", b"\x1b[1;5D"),
        ("C-Right", b"\x1b[1;5C"),
        ("C-S-Right", b"\x1b[1;6C"),
        ("C-M-Up", b"\x1b[1;7A"),
        ("C-M-S-Up", b"\x1b[1;8A"),
        ("S-Home", b"\x1b[1;2H"),
        ("C-End", b"\x1b[1;5F"),
        # Tilde keys: CSI <n> ; <m> ~.
        ("C-Delete", b"\x1b[3;5~"),
        ("S-PageUp", b"\x1b[5;2~"),
        ("M-NPage", b"\x1b[6;3~"),
        ("S-F5", b"\x1b[15;2~"),
        ("C-F12", b"\x1b[24;5~"),
        # F1-F4 switch from SS3 to CSI 1 ; <m> once modified.
        ("S-F1", b"\x1b[1;2P"),
        ("C-F4", b"\x1b[1;5S"),
    ],
)
def test_modified_key(name: str, expected: bytes) -> None:
    assert encode_keys([name]) == expected


@pytest.mark.parametrize(
    ("char", "expected"),
    [
        ("a", b"a"),
        ("A", b"A"),
        ("1", b"1"),
        ("-", b"-"),
        (" ", b" "),
        ("é", "é".encode()),
        ("€", "€".encode()),
        ("😀", "😀".encode()),
        # A single character is never a key name, even one that starts a modifier.
        ("C", b"C"),
        ("M", b"M"),
    ],
)
def test_single_character_is_literal(char: str, expected: bytes) -> None:
    assert encode_keys([char]) == expected


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("KPEnter", b"\x1bOM"),
        ("kp0", b"\x1bOp"),
        ("KP9", b"\x1bOy"),
        ("KP/", b"\x1bOo"),
        ("kp*", b"\x1bOj"),
        ("KP-", b"\x1bOm"),
        ("KP+", b"\x1bOk"),
        ("KP.", b"\x1bOn"),
    ],
)
def test_keypad_keys_are_sent_as_the_application_keypad_does(name: str, expected: bytes) -> None:
    assert encode_keys([name]) == expected


@pytest.mark.parametrize(
    ("name", "normal", "application"),
    [
        ("Up", b"\x1b[A", b"\x1bOA"),
        ("Left", b"\x1b[D", b"\x1bOD"),
        ("Home", b"\x1b[H", b"\x1bOH"),
        ("End", b"\x1b[F", b"\x1bOF"),
        ("C-Up", b"\x1b[1;5A", b"\x1b[1;5A"),
        ("PageUp", b"\x1b[5~", b"\x1b[5~"),
    ],
)
def test_cursor_keys_follow_the_cursor_key_mode(name: str, normal: bytes, application: bytes) -> None:
    assert encode_keys([name]) == normal
    assert encode_keys([name], app_cursor=True) == application  # modified keys and the rest stay as they are


def test_sequence_concatenates() -> None:
    assert encode_keys(["y", "e", "s", "Enter", "C-c", "Up"]) == b"yes\r\x03\x1b[A"


def test_bare_string_is_one_key_not_characters() -> None:
    assert encode_keys("Enter") == b"\r"


def test_empty_sequence_sends_nothing() -> None:
    assert encode_keys([]) == b""


@pytest.mark.parametrize("name", ["hello", "Enterr", "F13", "C-", "Ctrl-c", "C-M-", "ls -la"])
def test_unknown_name_is_rejected_with_literal_hint(name: str) -> None:
    with pytest.raises(InvalidArgument) as raised:
        encode_keys(["Enter", name])
    assert repr(name) in raised.value.message
    assert "literal" in raised.value.hints["use_literal"]


def test_empty_name_is_rejected() -> None:
    with pytest.raises(InvalidArgument, match="empty key name"):
        encode_keys([""])


@pytest.mark.parametrize("name", ["C-1", "C-é", "C-Enter", "S-Enter", "C-Tab", "C-Escape", "S-BSpace"])
def test_modifier_without_encoding_is_rejected(name: str) -> None:
    with pytest.raises(InvalidArgument, match="no terminal encoding"):
        encode_keys([name])


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        (["1b", "5b", "41"], b"\x1b[A"),
        (["0x1b", "0X5B", "0x41"], b"\x1b[A"),
        (["A"], b"\x0a"),
        (["ff", "00"], b"\xff\x00"),
        ([" 1b "], b"\x1b"),
        ([], b""),
        ("03", b"\x03"),
    ],
)
def test_encode_hex(values: list[str] | str, expected: bytes) -> None:
    assert encode_hex(values) == expected


@pytest.mark.parametrize("bad", ["zz", "", "0x", "100", "1b5b", "-1", "+1", "1_0", "0x1g", "0b1"])
def test_encode_hex_rejects_non_bytes(bad: str) -> None:
    with pytest.raises(InvalidArgument) as raised:
        encode_hex(["41", bad])
    assert "hex[1]" in raised.value.message
    assert raised.value.details["index"] == 1


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Enter", b"Enter"),
        ("C-c", b"C-c"),
        ("héllo\n", "héllo\n".encode()),
        ("\x1b[A", b"\x1b[A"),
        ("", b""),
    ],
)
def test_encode_literal_does_not_interpret(text: str, expected: bytes) -> None:
    assert encode_literal(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("ls -la", b"ls -la\r"),
        ("", b"\r"),
        ("café", "café\r".encode()),
    ],
)
def test_encode_submit_appends_enter(text: str, expected: bytes) -> None:
    assert encode_submit(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("hello", b"\x1b[200~hello\x1b[201~"),
        ("a\nb", b"\x1b[200~a\nb\x1b[201~"),
        ("", b"\x1b[200~\x1b[201~"),
        # An embedded end marker would end the paste early and run the rest as keys.
        ("x\x1b[201~rm -rf /\r", b"\x1b[200~xrm -rf /\r\x1b[201~"),
        ("\x1b[201~\x1b[201~", b"\x1b[200~\x1b[201~"),
        # Removing one marker must not leave a new one assembled from its neighbours.
        ("\x1b[20\x1b[201~1~", b"\x1b[200~\x1b[201~"),
        ("é", "\x1b[200~é\x1b[201~".encode()),
    ],
)
def test_encode_paste_bracketed(text: str, expected: bytes) -> None:
    assert encode_paste(text) == expected
    assert encode_paste(text).count(b"\x1b[201~") == 1


def test_encode_paste_unbracketed_is_plain_text() -> None:
    assert encode_paste("a\x1b[201~b", bracketed=False) == b"a\x1b[201~b"


@pytest.mark.parametrize(
    ("encode", "field"),
    [
        (encode_literal, "literal"),
        (lambda t: encode_literal(t, "data"), "data"),
        (encode_submit, "text"),
        (encode_paste, "text"),
        (lambda t: encode_paste(t, bracketed=False), "text"),
        (lambda t: encode_keys(["a", t[-1]]), "keys"),
    ],
)
def test_a_lone_surrogate_is_an_invalid_argument_naming_the_field(encode: Any, field: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        encode("a\ud800")
    assert caught.value.details["field"] == field
