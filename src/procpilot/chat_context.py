"""The chat a tool call comes from, as its caller tells it: a provider and a session.

A gateway that runs agents for chats (OpenClaw: Telegram, Discord, ...) may say which chat a call
is made for: over REST the header ``X-Procpilot-Context: provider=telegram session=agent:main:main``,
over MCP the request's ``_meta`` entry ``"procpilot/context": {"provider": "telegram", "session":
"agent:main:main"}``. It is the caller's word, never an identity: the token alone decides the agent
and what it may do. The policy gate records it on the call's audit event (an operator sees which
chat asked), and the openclaw profile's elevated refusal names it, as OpenClaw's does.

The transport parses it once (:func:`from_header`, :func:`from_meta`: a few known keys, short
values from a small character set, anything else an ``InvalidArgument``) and holds it for the call
(:func:`calling_from`); the layers under it read it with :func:`current` (a context variable, as
the calling agent is one for the HTTP routes), so no tool's signature carries it.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass

from procpilot.errors import InvalidArgument

__all__ = [
    "HEADER",
    "KEYS",
    "MAX_HEADER",
    "MAX_VALUE",
    "META_KEY",
    "ChatContext",
    "calling_from",
    "current",
    "current_parts",
    "from_header",
    "from_meta",
    "header_value",
]

HEADER = "X-Procpilot-Context"
META_KEY = "procpilot/context"
KEYS = ("provider", "session")  # in the order the text form names them
MAX_VALUE = 128
# What chat providers and session keys are spelled with (telegram, agent:main:telegram:dm:-1001,
# user@host); no space, quote, '=' or control character, so the text form reads back unchanged
# and no writer of it (audit file, console, a refusal's text) has anything to escape.
_VALUE = re.compile(r"[A-Za-z0-9._:@+#/-]+")
MAX_HEADER = len(KEYS) * (len("provider=") + MAX_VALUE + 1)  # both parts at their longest, spaced

_current: ContextVar[ChatContext | None] = ContextVar("procpilot_chat_context", default=None)


@dataclass(frozen=True, slots=True)
class ChatContext:
    """Which chat asked: at least one part is known."""

    provider: str | None = None
    session: str | None = None

    def parts(self) -> dict[str, str]:
        """The known parts, in ``KEYS`` order (as the audit event keeps them)."""
        return {key: value for key in KEYS if (value := getattr(self, key)) is not None}

    def text(self) -> str:
        """``provider=telegram session=agent:main:main``: the header's form, and OpenClaw's."""
        return " ".join(f"{key}={value}" for key, value in self.parts().items())


def current() -> ChatContext | None:
    """The chat the call being served comes from; None when its caller said nothing."""
    return _current.get()


def current_parts() -> dict[str, str] | None:
    """:func:`current` as an audit event keeps it (its known parts), or None."""
    context = _current.get()
    return None if context is None else context.parts()


@contextlib.contextmanager
def calling_from(context: ChatContext | None) -> Iterator[None]:
    """Serve a call (everything awaited inside, in this task) as coming from ``context``."""
    token = _current.set(context)
    try:
        yield
    finally:
        _current.reset(token)


def _refuse(problem: str, form: str) -> InvalidArgument:
    return InvalidArgument(
        f"the chat context is invalid: {problem}",
        hints={
            "fix_context": (
                f"Send {form}, with only the keys {', '.join(KEYS)}, each at most once, each value 1-{MAX_VALUE} "
                "characters of letters, digits and . _ : @ + # / -; or leave it out."
            )
        },
        field=HEADER if form.startswith(HEADER) else f"_meta.{META_KEY}",
    )


_HEADER_FORM = f"{HEADER}: provider=NAME session=KEY"
_META_FORM = f'_meta "{META_KEY}": {{"provider": NAME, "session": KEY}}'


def _context(pairs: list[tuple[str, object]], form: str) -> ChatContext:
    values: dict[str, str] = {}
    for key, value in pairs:
        if key not in KEYS:
            raise _refuse(f"unknown key {key[:40]!r}", form)
        if key in values:
            raise _refuse(f"{key} is given twice", form)
        if not isinstance(value, str):
            raise _refuse(f"{key} must be a string", form)
        if not 0 < len(value) <= MAX_VALUE:
            raise _refuse(f"{key} must be 1-{MAX_VALUE} characters long, not {len(value)}", form)
        if not _VALUE.fullmatch(value):
            raise _refuse(f"{key} holds a character outside letters, digits and . _ : @ + # / -", form)
        values[key] = value
    if not values:
        raise _refuse("it names no part", form)
    return ChatContext(**values)


def from_header(values: list[str]) -> ChatContext | None:
    """The context the ``X-Procpilot-Context`` header(s) of a request say; None without one."""
    if not values:
        return None
    if len(values) > 1:
        raise _refuse("the header is sent more than once", _HEADER_FORM)
    text = values[0]
    if len(text) > MAX_HEADER:  # before any splitting: the bound is on what is read at all
        raise _refuse(f"the header is {len(text)} characters long, at most {MAX_HEADER}", _HEADER_FORM)
    pairs: list[tuple[str, object]] = []
    for item in text.split():
        key, equals, value = item.partition("=")
        if not equals:
            raise _refuse(f"{item[:40]!r} is not key=value", _HEADER_FORM)
        pairs.append((key, value))
    return _context(pairs, _HEADER_FORM)


def from_meta(meta: Mapping[str, object] | None) -> ChatContext | None:
    """The context an MCP request's ``_meta`` says under ``procpilot/context``; None without it."""
    if meta is None or META_KEY not in meta:
        return None
    value = meta[META_KEY]
    if not isinstance(value, Mapping):
        raise _refuse("it must be an object", _META_FORM)
    if len(value) > len(KEYS):  # the bound comes before reading each entry
        raise _refuse(f"it has {len(value)} entries, at most {len(KEYS)}", _META_FORM)
    return _context([(str(key), item) for key, item in value.items()], _META_FORM)


def header_value(parts: Mapping[str, object]) -> str:
    """The ``X-Procpilot-Context`` value for ``parts`` (``{"provider": ..., "session": ...}``),
    checked as the daemon checks it: a client refuses what the daemon would, before sending."""
    return _context([(str(key), value) for key, value in parts.items()], _HEADER_FORM).text()
