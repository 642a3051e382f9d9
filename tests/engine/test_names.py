"""Named sessions and id prefixes: every verb takes a session's name or a unique prefix of its id."""

from __future__ import annotations

import collections

import pytest

from procpilot.engine.spawn import SpawnSpec
from procpilot.engine.supervisor import Supervisor
from procpilot.errors import AmbiguousSession, InvalidArgument, SessionNameInUse, SessionNotFound


async def test_a_name_finds_the_live_session_and_is_unique_among_live_ones(supervisor: Supervisor) -> None:
    web = await supervisor.spawn(SpawnSpec("sleep 30", name="web"), scope="a")
    assert supervisor.get("a", "web") is web
    with pytest.raises(SessionNameInUse) as refused:
        await supervisor.spawn(SpawnSpec("sleep 30", name="web"), scope="a")
    assert web.id in refused.value.message
    other = await supervisor.spawn(SpawnSpec("true", name="web"), scope="b")  # another agent's own namespace
    with pytest.raises(SessionNotFound):
        supervisor.get("c", "web")
    await supervisor.kill("a", "web", wait=None)
    again = await supervisor.spawn(SpawnSpec("sleep 30", name="web"), scope="a")  # free once it ended
    assert supervisor.get("a", "web") is again  # the live one wins over the ended one
    await supervisor.kill("a", again.id, wait=None)
    assert supervisor.get("a", "web") is again  # then the newest ended one
    await supervisor.wait("b", other.id, timeout=10)


async def test_an_id_prefix_finds_one_session_and_an_ambiguous_one_lists_them(supervisor: Supervisor) -> None:
    # 33 ids over 32 first characters: two of them must share one.
    sessions = [await supervisor.spawn(SpawnSpec("true"), scope="a") for _ in range(33)]
    by_first = collections.defaultdict(list)
    for s in sessions:
        by_first[s.id[0]].append(s)
    shared = next(group for group in by_first.values() if len(group) > 1)
    with pytest.raises(AmbiguousSession) as ambiguous:
        supervisor.get("a", shared[0].id[0])
    assert {s.id for s in shared} <= set(ambiguous.value.details["candidates"])
    assert supervisor.get("a", shared[0].id[:12]) is shared[0]
    with pytest.raises(SessionNotFound):
        supervisor.get("b", shared[0].id[:12])  # another agent's session is not there at all
    for s in sessions:
        await supervisor.wait("a", s.id, timeout=10)


def test_a_bad_name_is_refused_where_the_spec_is_made() -> None:
    with pytest.raises(InvalidArgument):
        SpawnSpec("true", name="has space")
