"""The lifecycle table: every edge it allows, and that every other one is a bug caught at once."""

from __future__ import annotations

import itertools

import pytest

from procpilot.engine.states import END_STATES, IllegalTransition, SessionState, check_transition

S = SessionState
ALLOWED = {
    (S.QUEUED, S.RUNNING),
    (S.QUEUED, S.FAILED_TO_START),  # the lane slot was cancelled, or the spawn failed
    (S.QUEUED, S.KILLED),  # killed while it waited for its lane
    (S.QUEUED, S.LOST),  # on a cluster: its node died while it waited there
    *((S.RUNNING, end) for end in END_STATES - {S.FAILED_TO_START}),
    (S.RUNNING, S.RESTARTING),  # a run ended on its own and its restart policy wants another
    (S.RESTARTING, S.RUNNING),  # the next run started
    *((S.RESTARTING, end) for end in END_STATES - {S.FAILED_TO_START}),  # killed, or no next run could start
}


@pytest.mark.parametrize(("current", "new"), sorted(ALLOWED, key=str))
def test_allowed_edges(current: SessionState, new: SessionState) -> None:
    check_transition(current, new)


@pytest.mark.parametrize(("current", "new"), [pair for pair in itertools.product(S, S) if pair not in ALLOWED], ids=str)
def test_every_other_edge_is_illegal(current: SessionState, new: SessionState) -> None:
    # An end state is final (a session ends exactly once) and nothing goes back to queued.
    with pytest.raises(IllegalTransition, match=f"from {current.value} to {new.value}"):
        check_transition(current, new)


def test_end_states_are_the_ones_with_no_way_out() -> None:
    assert {state for state in S if state.is_end} == set(END_STATES)
    assert not S.QUEUED.is_end and not S.RUNNING.is_end and not S.RESTARTING.is_end
