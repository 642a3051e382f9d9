"""wire.py: every serialisation of agent-supplied text is total, and reads the same to every parser."""

from __future__ import annotations

import json
from typing import Any

import pydantic_core
import pytest

from procpilot import wire


class Unprintable:
    def __str__(self) -> str:
        raise RuntimeError("no text")


def test_a_lone_surrogate_is_the_replacement_character_in_utf8() -> None:
    data = {"command": "echo \ud800 \udcff", "key\udc80": ["\udfff"]}
    written = wire.dumps_bytes(data)
    # Strict parsers read it too (pydantic's, the MCP SDK's, refuses a \ud800 escape).
    assert pydantic_core.from_json(written) == {"command": "echo \ufffd \ufffd", "key\ufffd": ["\ufffd"]}
    assert wire.dumps(data).encode() == written
    assert wire.text("a\ud800b") == "a\ufffdb" and wire.encode("\udcff") == "\ufffd".encode()


def test_text_that_encodes_is_left_as_it_is() -> None:
    text = "naïve 😀 \x1b[31m"
    assert wire.text(text) is text
    assert json.loads(wire.dumps({"t": text})) == {"t": text}


def test_nul_and_control_characters_are_escaped() -> None:
    written = wire.dumps_bytes({"t": "a\0b\x1b\n\r\u2028"})
    assert b"\0" not in written and b"\n" not in written and b"\r" not in written
    assert json.loads(written) == {"t": "a\0b\x1b\n\r\u2028"}


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({"n": float("nan"), "i": float("-inf")}, {"n": "nan", "i": "-inf"}),
        ({1: "a", (2, 3): "b"}, {"1": "a", "(2, 3)": "b"}),
        ({"big": 10**5000}, {"big": "<an integer of 16610 bits>"}),
        ({"odd": Unprintable()}, {"odd": "<Unprintable>"}),
    ],
)
def test_what_json_cannot_hold_is_written_as_text(data: Any, expected: Any) -> None:
    assert pydantic_core.from_json(wire.dumps_bytes(data)) == expected


def test_a_cycle_or_deep_nesting_is_cut_not_raised() -> None:
    cycle: list[Any] = []
    cycle.append(cycle)
    written = json.loads(wire.dumps(cycle))
    depth = 0
    while isinstance(written, list):
        written, depth = written[0], depth + 1
    assert depth == wire.MAX_DEPTH and "nested deeper" in written
