"""Agents take turns at the daemon: each call holds a place, and is worked on only in its agent's turn.

One event loop serves every agent, and the daemon's work for a call (reading its JSON, checking
and starting its command, waiting for it, rendering and writing the answer) runs there. Without
turns an agent sending calls as fast as it can has all of them worked on at once, and another
agent's call waits behind all of them, and beside all of their commands. So:

- a call holds one of its agent's *places* (``[server] requests_per_agent``) from its arrival to
  its answer; past them it queues behind the agent's own calls, at most
  ``requests_queued_per_agent`` of them, and past that it is refused at once
  (``TooManyRequests``): never dropped, never queued without bound;
- of an agent's calls holding a place, ``requests_working_per_agent`` are *worked on* at once
  (hold a turn). A call waiting for something outside the daemon (its process's output, room in
  its stdin, an approver, its client taking the answer) gives its turn back meanwhile
  (``waiting()``) and, when the wait ends, queues for one again ahead of its agent's calls that
  have not started;
- the first ``short_run`` seconds (``requests_short_run_ms``) of a wait for the call's command
  to end are work: what a flood of short commands costs everyone is mostly their processes
  (their CPU, the kernel's work to start them, move them between cgroups and end them), so an
  agent's short commands run one after another, and a long one makes way;
- nothing is shared between agents: a call only ever waits for calls of its own agent. However
  many one agent sends, another agent's call is worked on at once, beside at most
  ``requests_working_per_agent`` calls of each other agent.

The transports hold the calls (``Turns.admit``: the HTTP middleware for REST and MCP, whose SDK
runs a tool in a context copied from its POST's, so in the same call; the proc/* WebSocket for
each request); the engine and the policy wrap their waits in ``waiting()``, which does nothing
outside a call. It imports nothing of ours but the error tree, so every layer may use it.
"""

from __future__ import annotations

import asyncio
from collections import deque
from contextvars import ContextVar, Token
from types import TracebackType

from procpilot.errors import TooManyRequests

__all__ = ["Call", "Turns", "current", "short_run", "waiting"]

# The call whose work the current task does: set by Call, read by waiting().
_current: ContextVar[Call | None] = ContextVar("procpilot_call", default=None)


class _Agent:
    """One agent's counts and queues; exists while the agent has a call."""

    __slots__ = ("calls", "place_queue", "places", "turn_queue", "working")

    def __init__(self) -> None:
        self.calls = 0  # admitted and not ended, with a place or without
        self.places = 0
        self.place_queue: deque[asyncio.Future[None]] = deque()
        self.working = 0
        self.turn_queue: deque[asyncio.Future[None]] = deque()


class Turns:
    """The places and turns of every agent's calls (one per daemon)."""

    def __init__(
        self,
        *,
        places_per_agent: int = 16,
        working_per_agent: int = 1,
        queued_per_agent: int = 64,
        short_run: float = 0.1,
    ) -> None:
        self.places_per_agent = places_per_agent
        self.working_per_agent = working_per_agent
        self.queued_per_agent = queued_per_agent
        # Seconds of a wait for its process's exit a call spends in its turn: ``exec true`` and
        # its like end within them, a build or a server does not.
        self.short_run = short_run
        self._agents: dict[str, _Agent] = {}

    async def admit(self, agent: str, *, place: bool = True) -> Call:
        """A call of ``agent`` holding a place: at once, after the agent's calls queued before it,
        or ``TooManyRequests`` at once when the queue is full. Then ``async with call:`` makes it
        the task's call and gives all back at the end, ``await call.work()`` waits for a turn,
        and ``waiting()`` inside gives the turn back for a wait.

        ``place=False``: a call bounded elsewhere (a proc/* request: by its connection's slots),
        which takes turns but no place, so it never holds up the agent's REST and MCP calls (a
        ``proc/write`` stuck behind a full pipe must leave a place for the call that kills it)."""
        state = await self._take_place(agent) if place else self._state(agent)
        state.calls += 1
        return Call(self, agent, state, place)

    def admit_now(self, agent: str) -> Call | None:
        """``admit(agent)`` when a place is free at once (no awaiting, nothing to queue behind);
        else None, and ``await admit(agent)`` queues (or refuses) as it does."""
        state = self._state(agent)
        if state.places >= self.places_per_agent or state.place_queue:
            self._forget_if_idle(agent, state)
            return None
        state.places += 1
        state.calls += 1
        return Call(self, agent, state, True)

    def counts(self, agent: str) -> tuple[int, int, int]:
        """(calls holding a place, of them being worked on, calls queued for a place)."""
        state = self._agents.get(agent)
        return (0, 0, 0) if state is None else (state.places, state.working, len(state.place_queue))

    # -- places --

    def _state(self, agent: str) -> _Agent:
        state = self._agents.get(agent)
        if state is None:
            state = self._agents[agent] = _Agent()
        return state

    async def _take_place(self, agent: str) -> _Agent:
        state = self._state(agent)
        if state.places < self.places_per_agent and not state.place_queue:
            state.places += 1
            return state
        if len(state.place_queue) >= self.queued_per_agent:
            self._forget_if_idle(agent, state)
            raise TooManyRequests(
                f"agent {agent!r} has {state.places} calls running and {len(state.place_queue)} queued, its limit",
                running=state.places,
                queued=len(state.place_queue),
            )
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        state.place_queue.append(fut)
        try:
            await fut  # the place is counted for us when fut is given its result
        except BaseException:
            if fut.done() and not fut.cancelled():
                self._give_place(agent, state)  # granted as we were cancelled: pass it on
            else:
                state.place_queue.remove(fut)
                self._forget_if_idle(agent, state)
            raise
        return state

    def _give_place(self, agent: str, state: _Agent) -> None:
        state.places -= 1
        while state.place_queue and state.places < self.places_per_agent:
            fut = state.place_queue.popleft()
            if not fut.done():
                state.places += 1
                fut.set_result(None)
        self._forget_if_idle(agent, state)

    def _end(self, agent: str, state: _Agent, *, place: bool) -> None:
        state.calls -= 1
        if place:
            self._give_place(agent, state)
        else:
            self._forget_if_idle(agent, state)

    def _forget_if_idle(self, agent: str, state: _Agent) -> None:
        idle = state.calls == 0 and state.places == 0 and not state.place_queue
        if idle and self._agents.get(agent) is state:
            del self._agents[agent]

    # -- turns --

    def _turn_now(self, state: _Agent) -> bool:
        """Take a turn if one is free and nobody queues for one."""
        if state.working < self.working_per_agent and not state.turn_queue:
            state.working += 1
            return True
        return False

    async def _take_turn(self, state: _Agent, *, resuming: bool) -> None:
        if self._turn_now(state):
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        # A call back from a wait goes before its agent's calls that have not started: it is
        # nearer its answer, and its place is taken already.
        if resuming:
            state.turn_queue.appendleft(fut)
        else:
            state.turn_queue.append(fut)
        try:
            await fut  # the turn is counted for us when fut is given its result
        except BaseException:
            if fut.done() and not fut.cancelled():
                self._give_turn(state)
            else:
                state.turn_queue.remove(fut)
            raise

    def _give_turn(self, state: _Agent) -> None:
        state.working -= 1
        while state.turn_queue and state.working < self.working_per_agent:
            fut = state.turn_queue.popleft()
            if not fut.done():
                state.working += 1
                fut.set_result(None)


class Call:
    """One call of one agent: holds a place while inside ``async with``; ``working`` while it has a turn."""

    __slots__ = ("_place", "_state", "_token", "agent", "ended", "turns", "working")

    def __init__(self, turns: Turns, agent: str, state: _Agent, place: bool) -> None:
        self.turns = turns
        self.agent = agent
        self._place = place
        self.working = False
        self.ended = False
        self._state = state
        self._token: Token[Call | None] | None = None

    async def __aenter__(self) -> Call:
        return self.enter()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.end()

    def enter(self) -> Call:
        """``async with call:`` without the awaits: the call becomes the task's; ``end()`` after,
        in a ``finally``."""
        self._token = _current.set(self)
        return self

    def end(self) -> None:
        """Give back the turn and the place (once; later calls do nothing)."""
        if self.ended:
            return
        self.ended = True
        if self._token is not None:
            _current.reset(self._token)
        if self.working:
            self.working = False
            self.turns._give_turn(self._state)
        self.turns._end(self.agent, self._state, place=self._place)

    async def work(self) -> None:
        """Wait for a turn (at once when the agent has one free); a no-op once the call has ended."""
        await self._resume(resuming=False)

    def work_now(self) -> bool:
        """Take a turn if one is free at once: True when the call has one (or has ended), False
        when it must ``await work()`` (or ``await resume()`` after a wait) for it."""
        if self.working or self.ended:
            return True
        if self.turns._turn_now(self._state):
            self.working = True
            return True
        return False

    async def resume(self) -> None:
        """After a wait its turn was given back for (``pause()``): queue for a turn again, ahead
        of the agent's calls that have not started."""
        await self._resume(resuming=True)

    async def _resume(self, *, resuming: bool) -> None:
        state = self._state
        if self.working or self.ended:
            return
        await self.turns._take_turn(state, resuming=resuming)
        if self.ended:  # ended while we queued (another task of the call): no turn to keep
            self.turns._give_turn(state)
            return
        self.working = True

    def pause(self) -> bool:
        """Give the turn back (True if the call had one)."""
        if not self.working:
            return False
        self.working = False
        self.turns._give_turn(self._state)
        return True


class waiting:  # noqa: N801 - used as a function: ``async with waiting():``
    """Around a wait for something outside the daemon: the current call, if any, gives its turn
    to its agent's next call for the wait, and queues for one again after it (not when the wait
    was cancelled: the call is going). Outside a call, or in one with no turn, it does nothing."""

    __slots__ = ("_call",)

    async def __aenter__(self) -> None:
        call = _current.get()
        self._call = call if call is not None and call.pause() else None

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        call = self._call
        cancelled = exc_type is not None and issubclass(exc_type, asyncio.CancelledError)
        if call is not None and not cancelled and not call.work_now():
            await call.resume()


def current() -> Call | None:
    """The call whose work the current task does (None outside a call)."""
    return _current.get()


def short_run() -> float:
    """Seconds the current call keeps its turn while its process runs (0 outside a call or turn)."""
    call = _current.get()
    return call.turns.short_run if call is not None and call.working else 0.0
