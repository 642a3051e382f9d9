"""Encode terminal input for a PTY session, in the spirit of ``tmux send-keys``.

Five encoders, one per way an agent can describe input:

* :func:`encode_keys` - key names (``Enter``, ``C-c``, ``Up``, ``F5``, ``M-x``) and single characters;
* :func:`encode_hex` - raw byte values (``["1b", "5b", "41"]``);
* :func:`encode_literal` - text sent as-is;
* :func:`encode_submit` - text followed by Enter;
* :func:`encode_paste` - text wrapped in bracketed-paste markers.

Cursor and function keys use xterm's encodings. Cursor keys (and Home/End) follow the program's
cursor-key mode: ``ESC [ A`` normally, ``ESC O A`` once it switched to application cursor mode
(DECCKM, ``ESC [?1h``; the session tracks it from the program's output, as a terminal would).
Keypad keys (``KPEnter``, ``KP0``-``KP9``, ``KP/ KP* KP- KP+ KP.``) are sent as the application
keypad sends them (``ESC O M`` ...).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from procpilot.errors import InvalidArgument

__all__ = [
    "PASTE_END",
    "PASTE_START",
    "TerminalModes",
    "encode_hex",
    "encode_hex_lenient",
    "encode_keys",
    "encode_literal",
    "encode_paste",
    "encode_submit",
]

PASTE_START = "\x1b[200~"
PASTE_END = "\x1b[201~"

# ESC [ ? <modes> h|l: a program setting (h) or resetting (l) terminal modes.
_DEC_MODE = re.compile(rb"\x1b\[\?([0-9;]{1,32})([hl])")
_DEC_MODE_MAX = 36


@dataclass(slots=True)
class TerminalModes:
    """The DEC private modes a program under a pty set for its input, followed from its output
    the way a terminal follows them.

    ``bracketed_paste`` is true iff the program asked for bracketed paste (``ESC[?2004h``) and did
    not take it back (``ESC[?2004l``) since: a paste is bracketed only then. ``app_cursor_keys``
    is true iff it switched the cursor keys to application mode (DECCKM, ``ESC[?1h``).
    ``started`` is true once the program wrote anything: before that, which cursor keys it will
    want is not known yet (a full-screen program switches them as it starts up).
    """

    bracketed_paste: bool = False
    app_cursor_keys: bool = False
    started: bool = False
    _carry: bytes = b""

    def feed(self, data: bytes) -> None:
        """Follow one chunk of output. A few bytes of the previous chunk are scanned again with
        this one, so a sequence split across two reads is still seen; seeing one twice is
        harmless, only the last one counts."""
        self.started = self.started or bool(data)
        text = self._carry + data
        for found in _DEC_MODE.finditer(text):
            modes, on = found.group(1).split(b";"), found.group(2) == b"h"
            if b"2004" in modes:
                self.bracketed_paste = on
            if b"1" in modes:
                self.app_cursor_keys = on
        self._carry = text[-_DEC_MODE_MAX:]


_SHIFT, _ALT, _CTRL = 1, 2, 4
_MODIFIER_BITS = {"S": _SHIFT, "M": _ALT, "C": _CTRL}

# Keys sent as CSI <letter>; with modifiers xterm uses CSI 1 ; <m> <letter>.
_CSI_LETTER_KEYS = {"up": "A", "down": "B", "right": "C", "left": "D", "home": "H", "end": "F"}

# Home and End as the VT220 editing keypad sends them (ESC [1~, ESC [4~: what tmux and OpenClaw
# send), for programs that read those rather than xterm's ESC [H / ESC [F.
_VT_HOME_END = {"home": 1, "end": 4}

# F1-F4 are SS3 sequences unmodified but CSI 1 ; <m> <letter> once a modifier is added.
_SS3_KEYS = {"f1": "P", "f2": "Q", "f3": "R", "f4": "S"}

# Keys sent as CSI <n> ~; with modifiers CSI <n> ; <m> ~.
_TILDE_KEYS = {
    "insert": 2,
    "ic": 2,
    "delete": 3,
    "dc": 3,
    "pageup": 5,
    "ppage": 5,
    "pgup": 5,
    "pagedown": 6,
    "npage": 6,
    "pgdn": 6,
    "f5": 15,
    "f6": 17,
    "f7": 18,
    "f8": 19,
    "f9": 20,
    "f10": 21,
    "f11": 23,
    "f12": 24,
}

# Keys that are a single control character. Space is deliberately a character so that
# C-Space reaches the control-code table below.
_CHAR_KEYS = {
    "enter": "\r",
    "return": "\r",
    "tab": "\t",
    "escape": "\x1b",
    "esc": "\x1b",
    "space": " ",
    "bspace": "\x7f",
    "backspace": "\x7f",
}

_BACKTAB = "\x1b[Z"

# The keypad in application mode: SS3 <letter> (xterm, and what tmux sends for its KP names).
_KEYPAD_KEYS = {
    "kpenter": "M",
    "kp*": "j",
    "kp+": "k",
    "kp-": "m",
    "kp.": "n",
    "kp/": "o",
    **{f"kp{digit}": chr(ord("p") + digit) for digit in range(10)},
}

_CONTROL_PUNCTUATION = {
    "@": "\x00",
    " ": "\x00",
    "[": "\x1b",
    "\\": "\x1c",
    "]": "\x1d",
    "^": "\x1e",
    "_": "\x1f",
    "?": "\x7f",
}

_USE_LITERAL_HINT = {
    "use_literal": (
        "keys takes key names (Enter, Tab, Escape, C-c, M-x, Up, PageDown, F5) or single characters; "
        "send text with `literal`, or with `submit` to press Enter after it."
    ),
}

_HEX_BYTE = re.compile(r"(?:0[xX])?([0-9a-fA-F]{1,2})")


def _utf8(text: str, field: str) -> bytes:
    """``text`` as UTF-8; a lone surrogate (valid JSON, not valid text) is an InvalidArgument."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidArgument(
            f"{field} contains a character with no UTF-8 encoding ({text[exc.start]!r}, a lone surrogate)",
            hints={"fix_text": f"Send {field} as valid Unicode (surrogates only in pairs), or raw bytes with hex."},
            field=field,
        ) from None


def _split_modifiers(name: str) -> tuple[int, str]:
    """Peel ``C-``/``M-``/``S-`` prefixes (any order, any case) off ``name``.

    A prefix is only taken when something follows it, so ``C--`` is Ctrl plus ``-`` and a
    bare ``C-`` stays a (unknown) name instead of becoming an empty key.
    """
    mods = 0
    rest = name
    while len(rest) > 2 and rest[1] == "-" and rest[0].upper() in _MODIFIER_BITS:
        mods |= _MODIFIER_BITS[rest[0].upper()]
        rest = rest[2:]
    return mods, rest


def _modifier_param(mods: int) -> int:
    return 1 + mods


def _no_encoding(name: str, why: str) -> InvalidArgument:
    return InvalidArgument(
        f"key {name!r} has no terminal encoding: {why}",
        hints={
            "drop_modifier": "Drop the modifier, or send the exact bytes the program expects with `hex`.",
        },
    )


def _encode_char(name: str, char: str, mods: int) -> str:
    if mods & _SHIFT:
        upper = char.upper()
        # Shift on a character without a single-character upper case (digits, punctuation,
        # 'ß') has nothing to add: the shifted symbol is already the character itself.
        if len(upper) == 1:
            char = upper
    if mods & _CTRL:
        if "a" <= char.lower() <= "z":
            char = chr(ord(char.upper()) & 0x1F)
        elif char in _CONTROL_PUNCTUATION:
            char = _CONTROL_PUNCTUATION[char]
        else:
            raise _no_encoding(name, "C- applies to letters, Space and @ [ \\ ] ^ _ ? only (e.g. C-c, C-[, C-?)")
    if mods & _ALT:
        # Meta is sent as an ESC prefix, the convention of xterm's metaSendsEscape and tmux.
        char = "\x1b" + char
    return char


def _encode_named_char_key(name: str, key: str, mods: int) -> str:
    base = _CHAR_KEYS[key]
    prefix = "\x1b" if mods & _ALT else ""
    mods &= ~_ALT
    if key == "space":
        return prefix + _encode_char(name, base, mods)
    if key == "tab" and mods == _SHIFT:
        return prefix + _BACKTAB
    if key in {"bspace", "backspace"} and mods == _CTRL:
        # Most terminals send ^H for Ctrl+Backspace, and readline binds it to delete-word.
        return prefix + "\x08"
    if mods:
        raise _no_encoding(name, "only S-Tab, C-BSpace and M- have a standard encoding for this key")
    return prefix + base


def _encode_one(name: str, app_cursor: bool = False, vt_home_end: bool = False) -> str:
    if name == "":
        raise InvalidArgument("empty key name in keys", hints=_USE_LITERAL_HINT)
    if len(name) == 1:
        return name
    mods, base = _split_modifiers(name)
    if len(base) == 1:
        return _encode_char(name, base, mods)
    key = base.lower()
    if key == "btab":
        # tmux's name for Shift+Tab.
        return ("\x1b" if mods & _ALT else "") + _BACKTAB
    if key in _CHAR_KEYS:
        return _encode_named_char_key(name, key, mods)
    if key in _VT_HOME_END and vt_home_end and not mods and not app_cursor:
        return f"\x1b[{_VT_HOME_END[key]}~"
    if key in _CSI_LETTER_KEYS:
        letter = _CSI_LETTER_KEYS[key]
        if mods:
            return f"\x1b[1;{_modifier_param(mods)}{letter}"
        return f"\x1bO{letter}" if app_cursor else f"\x1b[{letter}"
    if key in _KEYPAD_KEYS and not mods:
        return f"\x1bO{_KEYPAD_KEYS[key]}"
    if key in _SS3_KEYS:
        letter = _SS3_KEYS[key]
        return f"\x1b[1;{_modifier_param(mods)}{letter}" if mods else f"\x1bO{letter}"
    if key in _TILDE_KEYS:
        number = _TILDE_KEYS[key]
        return f"\x1b[{number};{_modifier_param(mods)}~" if mods else f"\x1b[{number}~"
    raise InvalidArgument(f"unknown key name {name!r}", hints=_USE_LITERAL_HINT, key=name)


def encode_keys(keys: Sequence[str], *, app_cursor: bool = False, vt_home_end: bool = False) -> bytes:
    """Encode key names into the bytes a terminal would send.

    Each element is one key:

    * a named key, case-insensitive: ``Enter``/``Return``, ``Tab``, ``BTab``, ``Escape``/``Esc``,
      ``Space``, ``BSpace``/``Backspace``, ``Up``/``Down``/``Left``/``Right``, ``Home``, ``End``,
      ``PageUp``/``PPage``/``PgUp``, ``PageDown``/``NPage``/``PgDn``, ``Insert``/``IC``,
      ``Delete``/``DC``, ``F1``-``F12``, ``KPEnter``, ``KP0``-``KP9``, ``KP/``, ``KP*``, ``KP-``,
      ``KP+``, ``KP.``;
    * optionally prefixed by ``C-`` (Ctrl), ``M-`` (Meta/Alt) and ``S-`` (Shift) in any
      combination and order: ``C-c`` -> ``\\x03``, ``M-a`` -> ``\\x1ba``, ``C-M-x`` -> ``\\x1b\\x18``,
      ``S-Tab`` -> ``\\x1b[Z``, ``C-Left`` -> ``\\x1b[1;5D``, ``S-F5`` -> ``\\x1b[15;2~``;
    * any other single character, sent literally as UTF-8 (so ``["y", "Enter"]`` answers a prompt).

    A bare string is taken as one key, not as a sequence of characters, so ``"Enter"`` presses
    Enter rather than typing E-n-t-e-r. ``app_cursor``: the program is in application cursor
    mode, so unmodified cursor keys and Home/End are ``ESC O <letter>``. ``vt_home_end``: outside
    that mode, Home and End are ``ESC [1~`` and ``ESC [4~`` (the VT220 keys) instead of xterm's.

    Raises :class:`InvalidArgument` for an unknown multi-character name (text belongs in
    ``literal``) and for a modifier the key cannot carry (``C-1``, ``C-Enter``).
    """
    if isinstance(keys, str):
        keys = [keys]
    return _utf8("".join(_encode_one(name, app_cursor, vt_home_end) for name in keys), "keys")


def encode_hex(hex_values: Sequence[str]) -> bytes:
    """Turn byte values written in hex (``"1b"``, ``"0x1b"``, ``"A"``) into bytes, one byte each.

    A bare string is taken as one value. Anything that is not one or two hex digits, with an
    optional ``0x`` prefix and surrounding whitespace, raises :class:`InvalidArgument`.
    """
    if isinstance(hex_values, str):
        hex_values = [hex_values]
    out = bytearray()
    for index, value in enumerate(hex_values):
        match = _HEX_BYTE.fullmatch(value.strip())
        if match is None:
            raise InvalidArgument(
                f"hex[{index}] = {value!r} is not a byte in hex",
                hints={"use_hex_bytes": 'Give one byte per element as 1-2 hex digits: ["1b", "5b", "41"].'},
                index=index,
            )
        out.append(int(match.group(1), 16))
    return bytes(out)


def encode_hex_lenient(hex_values: Sequence[str]) -> tuple[bytes, list[str]]:
    """Like :func:`encode_hex`, but an element that is not a byte is skipped and described in
    the returned warnings instead of failing the whole call (OpenClaw's behaviour)."""
    if isinstance(hex_values, str):
        hex_values = [hex_values]
    out = bytearray()
    warnings: list[str] = []
    for index, value in enumerate(hex_values):
        match = _HEX_BYTE.fullmatch(value.strip())
        if match is None:
            warnings.append(f"hex[{index}] = {value!r} is not a byte in hex: skipped")
            continue
        out.append(int(match.group(1), 16))
    return bytes(out), warnings


def encode_literal(text: str, field: str = "literal") -> bytes:
    """``text`` as UTF-8, with no key-name interpretation; ``field`` names it in errors."""
    return _utf8(text, field)


def encode_submit(text: str) -> bytes:
    """``text`` followed by Enter (``\\r``, what a terminal sends for the Return key)."""
    return _utf8(text + "\r", "text")


def encode_paste(text: str, bracketed: bool = True) -> bytes:
    """``text`` as a paste: wrapped in ``ESC [200~`` ... ``ESC [201~`` when ``bracketed``.

    Any end marker inside ``text`` is removed first, repeatedly, because removing one can join
    its neighbours into a new one (``ESC[20`` + ``ESC[201~`` + ``1~``); a surviving marker would
    end the paste early and let the rest be read as typed keys.
    """
    if not bracketed:
        return _utf8(text, "text")
    while PASTE_END in text:
        text = text.replace(PASTE_END, "")
    return _utf8(PASTE_START + text + PASTE_END, "text")
