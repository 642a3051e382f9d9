"""Text for the wire that always encodes: every writer of agent-supplied text goes through here.

An agent's text reaches us as Python strings, and a string can hold what UTF-8 cannot: a lone
surrogate (``"\\ud800"`` in a JSON request, a file name decoded with ``surrogateescape``). Written
as it is, ``str.encode`` raises, and a writer that raises closes the stream it was writing to, for
every reader of it. So each serialisation here is total:

- a surrogate code point becomes U+FFFD (the replacement character) and the JSON is UTF-8
  (``ensure_ascii=False``). Not the ``\\ud800`` escape ``ensure_ascii=True`` would write: that is
  JSON text, but I-JSON (RFC 7493) forbids it and strict parsers (Rust's serde_json, .NET's
  System.Text.Json) refuse the whole document, and pydantic's parser (the MCP SDK's) does too, so
  one event would still blind a reader. U+FFFD reads the same to every parser; what is lost is
  only which unpaired half it was, which no UTF-8 reader could have been told anyway;
- NUL and the other control characters are escaped by the JSON encoder itself (``\\u0000``);
- what JSON cannot hold (NaN, infinities, a non-string key, an object the encoder does not know,
  a cycle, nesting past ``MAX_DEPTH``) is written as text instead of raising; that slower walk
  runs only after the fast encoder has refused.

Bytes that are not UTF-8 never get this far: every reader decodes them first (the HTTP body
parser refuses them as invalid JSON, the stdio server answers them with a parse error).
"""

from __future__ import annotations

import functools
import json
import math
import re
from typing import Any

__all__ = ["MAX_DEPTH", "REPLACEMENT", "dumps", "dumps_bytes", "encode", "text"]

REPLACEMENT = "\ufffd"
MAX_DEPTH = 200  # nesting kept by the fallback walk; deeper is written as a marker
_SURROGATE = re.compile("[\ud800-\udfff]")
_COMPACT = (",", ":")
_MAX_INT_BITS = 10_000  # about 3,000 digits


def text(value: str) -> str:
    """``value`` with every surrogate code point replaced: a string UTF-8 can always encode."""
    if value.isascii() or _SURROGATE.search(value) is None:
        return value
    return _SURROGATE.sub(REPLACEMENT, value)


def encode(value: str) -> bytes:
    """``value`` as UTF-8, surrogates replaced (the common case costs one ``encode``)."""
    try:
        return value.encode()
    except UnicodeEncodeError:
        return _SURROGATE.sub(REPLACEMENT, value).encode()


def dumps(data: Any, *, separators: tuple[str, str] = _COMPACT) -> str:
    """``data`` as JSON text that encodes to UTF-8 and every JSON parser reads; never raises."""
    return text(_json(data, separators))


def dumps_bytes(data: Any, *, separators: tuple[str, str] = _COMPACT) -> bytes:
    """``dumps`` as UTF-8 bytes."""
    return encode(_json(data, separators))


@functools.cache
def _encoder(separators: tuple[str, str]) -> json.JSONEncoder:
    """One encoder per layout: ``json.dumps`` with options builds a new one on every call (~13 µs
    of every result after idle). An encoder keeps no state between calls."""
    return json.JSONEncoder(ensure_ascii=False, separators=separators, default=str, allow_nan=False)


def _json(data: Any, separators: tuple[str, str]) -> str:
    """JSON text of ``data``; it may still hold surrogates, which the callers replace."""
    try:
        return _encoder(separators).encode(data)
    except Exception:  # NaN, a key, a cycle, depth, an object whose __str__ raises: the walk writes it
        return json.dumps(_plain(data, 0), ensure_ascii=False, separators=separators)


def _plain(value: Any, depth: int) -> Any:
    """``value`` as what ``json.dumps`` takes without refusing: the fallback after it refused."""
    if value is None or isinstance(value, bool | str):
        return value
    if isinstance(value, int):  # past ~4,300 digits Python refuses to write an int as text
        return value if value.bit_length() < _MAX_INT_BITS else f"<an integer of {value.bit_length()} bits>"
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if depth >= MAX_DEPTH:
        return f"<nested deeper than {MAX_DEPTH} levels>"
    if isinstance(value, dict):
        return {_key(k): _plain(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v, depth + 1) for v in value]
    try:
        return str(value)
    except Exception:  # a broken __str__ must not cost the line it is in
        return f"<{type(value).__name__}>"


def _key(key: Any) -> str:
    if isinstance(key, str):
        return key
    try:
        return str(key)
    except Exception:  # as in _plain: a key that cannot be written is named by its type
        return f"<{type(key).__name__}>"
