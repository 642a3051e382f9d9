"""transports/http/operators.py: an agent acts in its own scope; only operators name another's."""

from __future__ import annotations

import pytest

from procpilot.config import ServerSettings
from procpilot.errors import InvalidArgument, OperatorForbidden
from procpilot.transports.http.operators import acting_scope, is_operator

SERVER = ServerSettings(tokens={"t-a": "agent-a", "t-ops": "ops"}, operators=["ops"])


def test_operators_are_the_named_agents_or_everyone_on_an_open_daemon() -> None:
    assert is_operator(SERVER, "ops") and not is_operator(SERVER, "agent-a")
    assert is_operator(ServerSettings(), "default")  # no tokens: the one open agent


def test_the_scope_a_call_acts_in() -> None:
    assert acting_scope(SERVER, "agent-a", None) == "agent-a"
    assert acting_scope(SERVER, "agent-a", "agent-a") == "agent-a"
    assert acting_scope(SERVER, "ops", "agent-a") == "agent-a"
    with pytest.raises(OperatorForbidden):
        acting_scope(SERVER, "agent-a", "agent-b")
    with pytest.raises(InvalidArgument):
        acting_scope(SERVER, "ops", "x" * 201)
    with pytest.raises(InvalidArgument):
        acting_scope(SERVER, "ops", "")
