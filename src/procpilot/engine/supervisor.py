"""The owner of every session: one per server, an async context manager.

Every call takes the caller's ``scope``; a session of another scope is indistinguishable from
one that does not exist. Leaving the context (or ``aclose``) ends every tree it started: the
requested signal first, SIGKILL after the grace period, and nothing is left behind.
"""

from __future__ import annotations

import asyncio
import base64
import builtins
import contextlib
import logging
import os
import re
import secrets
import signal
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

import regex

from procpilot.config import EngineSettings, Settings, load_settings
from procpilot.engine.capture import SessionOutput, Stream
from procpilot.engine.environment import check_overrides
from procpilot.engine.events import EventBus, Subscription
from procpilot.engine.isolation import isolation_capabilities
from procpilot.engine.lanes import LaneScheduler
from procpilot.engine.limits import LimitBackend, TreeSample, WatchdogLimits, probe_limits
from procpilot.engine.session import ExitInfo, Session
from procpilot.engine.spawn import SpawnSpec, build_env, spawn_process
from procpilot.engine.states import SessionState
from procpilot.engine.store import FileStore, SessionStore
from procpilot.engine.trees import (
    MARKER_ENV,
    SUPERVISOR_ENV,
    CgroupTrees,
    TreeBackend,
    instance_name,
    probe_trees,
    reap_orphans,
)
from procpilot.engine.usage import UsageTracker
from procpilot.errors import (
    InvalidPattern,
    NotSupported,
    ProcessAlreadyExited,
    ProcpilotError,
    SessionNotFound,
    SessionStillRunning,
    SpawnFailed,
)
from procpilot.render import complete_utf8_prefix, for_model, tail_chars

__all__ = ["Supervisor", "WaitOutcome", "disk_space"]

_log = logging.getLogger(__name__)
_TAIL_CHARS = 400
_SCAN_CHUNK = 1 << 20
_REAP_INTERVAL = 2.0
_WATCHDOG_INTERVAL = 0.1
_PATTERN_TIMEOUT = 0.5  # seconds one wait pattern may spend on one scan of output
_LOW_SPACE_BYTES = 100 << 20  # under this (or 1% of the disk) doctor and capabilities warn
_INLINE_CHECK_BYTES = 4096  # a filter reads a command this size in well under a millisecond
_T = TypeVar("_T")


def _cpu_ticks(pid: int) -> int:
    """utime + stime + cutime + cstime: a process's CPU with that of the children it reaped."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return sum(int(v) for v in fields[11:15])
    except (OSError, ValueError, IndexError):
        return 0


def _rss_pages(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            return int(f.read().split()[1])
    except (OSError, ValueError, IndexError):
        return 0


def new_session_id() -> str:
    """16 lowercase base32 characters: 80 bits from the OS's CSPRNG."""
    return base64.b32encode(secrets.token_bytes(10)).decode().lower()


@dataclass(frozen=True, slots=True)
class WaitOutcome:
    """Why a wait returned: the session ``exited``, the output matched ``pattern``, or ``timeout``.

    ``match_offset`` is the end of the output scanned when the match was found: a wait from there
    (``since``) matches only what came after.
    """

    reason: Literal["exited", "pattern", "timeout"]
    match: str | None = None
    match_offset: int | None = None


def disk_space(path: Path) -> dict[str, Any]:
    """Free and total bytes of the filesystem holding ``path``, and a warning when it runs low."""
    try:
        fs = os.statvfs(path)
    except OSError as exc:
        return {"path": str(path), "free_bytes": None, "total_bytes": None, "warning": f"cannot stat: {exc}"}
    free, total = fs.f_bavail * fs.f_frsize, fs.f_blocks * fs.f_frsize
    warning = None
    if free < _LOW_SPACE_BYTES or free < total // 100:
        warning = f"only {free / (1 << 20):.1f} MiB free: sessions' output will be lost when it runs out"
    return {"path": str(path), "free_bytes": free, "total_bytes": total, "warning": warning}


class Supervisor:
    def __init__(
        self,
        settings: Settings | None = None,
        *,
        store: SessionStore | None = None,
        trees: TreeBackend | None = None,
        limits: LimitBackend | None = None,
        spawn_filter: Callable[[str, SpawnSpec, int], SpawnSpec] | None = None,
        write_filter: Callable[[str, Session, bytes], None] | None = None,
    ) -> None:
        # The faces over this supervisor read the whole settings; the engine reads only its part.
        self.settings = settings or load_settings()
        self.config: EngineSettings = self.settings.engine
        self._store: SessionStore | None = store
        self._trees: TreeBackend | None = trees
        self._limits: LimitBackend | None = limits
        # Called as filter(scope, spec, running sessions in that scope) before every spawn: it may
        # refuse (raise a ProcpilotError) or return the spec to run. Policy lives outside the engine.
        self._spawn_filter = spawn_filter
        # Called as filter(scope, session, data) before any byte reaches a session's stdin, whatever
        # face it came from: it may refuse (raise). Input to a shell is commands too.
        self._write_filter = write_filter
        self._big_checks = asyncio.Semaphore(1)
        self._sessions: dict[str, Session] = {}
        self._lanes = LaneScheduler(dict(self.config.lane_caps), self.config.default_lane_cap)
        self.exits: EventBus[ExitInfo] = EventBus()
        # What faces report about calls (notify-tier tools): one stream per supervisor, owned here
        # rather than in a registry keyed by supervisor.
        self.audit: EventBus[Any] = EventBus()
        self._usage: UsageTracker | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._started = False
        self._closed = False
        self._close_task: asyncio.Task[None] | None = None
        # Named at construction, so every process this supervisor starts carries the same name
        # (SUPERVISOR_ENV) as its cgroup directories.
        self.instance = instance_name()

    # -- lifecycle -----------------------------------------------------------------------------

    async def start(self) -> Supervisor:
        if self._started:
            return self
        self.config.state_dir.mkdir(parents=True, exist_ok=True)
        if self._store is None:
            self._store = FileStore(self.config.state_dir)
        name = self.instance
        if self._trees is None:
            self._trees = probe_trees(name=name)
        if self._limits is None:
            # Where sessions are grouped by cgroup v2, limits go in the same directories.
            v2_root = self._trees.root if isinstance(self._trees, CgroupTrees) else None
            self._limits = probe_limits(v2_root=v2_root, name=name)
        self._started = True
        self._spawn_task(self._housekeeping())
        return self

    async def __aenter__(self) -> Supervisor:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    @property
    def tree_mechanism(self) -> str:
        return self._tree_backend.name

    def capabilities(self) -> dict[str, Any]:
        """What this host lets the supervisor do, and by which mechanism (for `doctor` and agents)."""
        limits = self._limit_backend
        trees = self._tree_backend
        return {
            "tree_kill": trees.name,
            "subreaper": bool(getattr(trees, "subreaper", False)),
            "limits": {
                "mechanism": limits.name,
                "enforced": sorted(limits.enforces),
                "not_enforced": sorted({"memory", "cpu", "pids"} - limits.enforces),
                "passed_over": [f"{name}: {why}" for name, why in limits.passed_over.items()],
            },
            "isolation": isolation_capabilities(),
            "pidfd": hasattr(os, "pidfd_open"),
            "state_dir": self.state_dir_space(),
        }

    @property
    def usage(self) -> UsageTracker:
        """Resource usage of the sessions' trees (made on first use: sampling costs nothing before)."""
        if self._usage is None:
            self._usage = UsageTracker(self)
        return self._usage

    def state_dir_space(self) -> dict[str, Any]:
        """Room left where output is stored: a full disk loses output (counted, never silently)."""
        space = disk_space(self.config.state_dir)
        journal = self._store.write_error if isinstance(self._store, FileStore) else None
        if journal:
            written = f"the session journal could not be written ({journal})"
            space["warning"] = written + (f"; {space['warning']}" if space["warning"] else "")
        return space

    @property
    def limit_mechanism(self) -> str:
        return self._limit_backend.name

    @property
    def _limit_backend(self) -> LimitBackend:
        if self._limits is None:
            raise RuntimeError("Supervisor.start() has not been awaited")
        return self._limits

    @property
    def _tree_backend(self) -> TreeBackend:
        if self._trees is None:
            raise RuntimeError("Supervisor.start() has not been awaited")
        return self._trees

    async def aclose(self, sig: int = signal.SIGTERM, grace: float | None = None) -> None:
        """End every running tree (``sig``, then SIGKILL after ``grace``) and stop housekeeping.

        Safe to cancel and to call again: the shutdown runs in a task of its own that a cancelled
        caller leaves running and a second call waits for; if that task itself is cancelled (the
        event loop is going away) every tree is SIGKILLed on the spot.
        """
        if not self._started:
            self._closed = True
            return
        if self._close_task is None:
            self._closed = True
            self._close_task = asyncio.ensure_future(self._close(sig, grace))
        await asyncio.shield(self._close_task)

    async def _close(self, sig: int, grace: float | None) -> None:
        try:
            await self._end_all(sig, grace)
        except asyncio.CancelledError:
            self._kill_all_now()
            raise
        finally:
            reap_orphans(set())
            self._tree_backend.close()
            self._limit_backend.close()
            if self._store is not None:
                self._store.close()
            self.exits.close()

    def _kill_all_now(self) -> None:
        for session in self._sessions.values():
            if session.is_running:
                with contextlib.suppress(ProcpilotError):
                    session.terminate(SessionState.KILLED, signal.SIGKILL, None)

    async def _end_all(self, sig: int, grace: float | None) -> None:
        grace = self.config.kill_grace_sec if grace is None else grace
        running = [s for s in self._sessions.values() if not s.finished]
        for session in running:
            if session.state is SessionState.QUEUED:
                continue
            self._resume_if_stopped(session)
            with contextlib.suppress(ProcpilotError):
                session.terminate(SessionState.KILLED, sig, grace)
        for task in list(self._tasks):
            task.cancel()
        if running:
            waits = [asyncio.ensure_future(s.wait_finished()) for s in running]
            try:
                await asyncio.wait(waits, timeout=grace + 5.0)
            finally:
                for waiter in waits:
                    waiter.cancel()
        # Housekeeping tasks were cancelled above; their own errors are of no interest now.
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def _spawn_task(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _housekeeping(self) -> None:
        if isinstance(self._limits, WatchdogLimits):
            self._spawn_task(self._watchdog(self._limits))
        ttl_check = 0.0
        while True:
            await asyncio.sleep(_REAP_INTERVAL)
            reap_orphans({s.pid for s in self._sessions.values() if s.pid and not s.finished})
            now = time.monotonic()
            if now - ttl_check > 30:
                ttl_check = now
                self.sweep(now)

    async def _watchdog(self, limits: WatchdogLimits) -> None:
        """Without a controller: sample each limited tree and do what the watchdog decides."""
        page = os.sysconf("SC_PAGE_SIZE")
        tick = os.sysconf("SC_CLK_TCK")
        while True:
            await asyncio.sleep(_WATCHDOG_INTERVAL)
            now = time.monotonic()
            for session in list(self._sessions.values()):
                spec_limits = session.spec.limits
                if session.accounting.limit_backend is not limits or not session.is_running or spec_limits is None:
                    continue
                if session.terminating:
                    self._resume_if_stopped(session)  # a stopped tree could not act on its signal
                    continue
                pids = self._tree_backend.pids(session.id, session.pid)
                sample = TreeSample(
                    rss_bytes=sum(_rss_pages(pid) for pid in pids) * page,
                    cpu_seconds=sum(_cpu_ticks(pid) for pid in pids) / tick,
                    processes=len(pids),
                )
                verdict = limits.observe(session.id, sample, spec_limits, now)
                if verdict == "kill":
                    self._resume_if_stopped(session)
                    with contextlib.suppress(ProcpilotError):
                        session.terminate(SessionState.LIMIT_EXCEEDED, signal.SIGKILL, None)
                elif verdict is not None:
                    sig = signal.SIGSTOP if verdict == "stop" else signal.SIGCONT
                    self._tree_backend.signal(session.id, session.pid, sig, leader_alive=True)

    def _resume_if_stopped(self, session: Session) -> None:
        if isinstance(self._limits, WatchdogLimits) and self._limits.resume(session.id):
            self._tree_backend.signal(session.id, session.pid, signal.SIGCONT, leader_alive=session.is_running)

    # -- spawning ------------------------------------------------------------------------------

    async def _off_loop_if_big(self, size: int, check: Callable[..., _T], *args: Any) -> _T:
        """Run a filter (the policy's shell analysis, linear but pure Python) on the loop for the
        usual small command, and in a worker thread, one at a time, for a big one: tens of ms of
        parsing must not hold every other agent's call behind it."""
        if size <= _INLINE_CHECK_BYTES:
            return check(*args)
        async with self._big_checks:
            return await asyncio.to_thread(check, *args)

    async def _admit(self, spec: SpawnSpec, scope: str) -> SpawnSpec:
        """The checks every spawn passes before anything starts, and the spec the policy returns:
        the same for a session started here and one a cluster starts on another node."""
        if not self._started:
            await self.start()
        if self._closed or self._store is None:
            raise ProcpilotError("the supervisor is shutting down", hints={"retry": "Start a new server."})
        # The engine's own fence, before any policy reads the spec: no face can skip it.
        check_overrides(spec.env, self.config.protected_env)
        if self._spawn_filter is not None:
            running = sum(1 for s in self._sessions.values() if s.scope == scope and not s.finished)
            spec = await self._off_loop_if_big(len(spec.display), self._spawn_filter, scope, spec, running)
        elif spec.elevated:
            # Leaving a box is the policy's to allow; with no policy nothing could have allowed it.
            raise NotSupported(
                "elevated runs need an agent policy that allows them, and this supervisor has none",
                hints={"drop_option": "Call again without elevated."},
            )
        return spec

    async def spawn(self, spec: SpawnSpec, *, scope: str) -> Session:
        """Start ``spec`` (or queue it behind its lane) and return its session at once."""
        spec = await self._admit(spec, scope)
        if self._store is None:  # _admit refused this already; said again for the type checker
            raise ProcpilotError("the supervisor is shutting down", hints={"retry": "Start a new server."})
        session_id = new_session_id()
        directory = self._store.session_dir(session_id)
        output = SessionOutput(directory, self.config.max_log_bytes)
        grace = self.config.kill_grace_sec
        session = Session(session_id, scope, spec, output, self._tree_backend, self._on_finish, kill_grace=grace)
        if spec.lane is None or self._lanes.try_acquire(spec.lane, scope):
            try:
                await self._start(session)
            except BaseException:
                # Whatever went wrong (a typed refusal, a bug, a cancelled caller), the session
                # never started: nothing may be left on disk under its id.
                output.remove_files()
                self._store.delete(session_id)
                raise
        else:
            self._sessions[session_id] = session
            self._store.save(session_id, session.record())
            self._spawn_task(self._start_when_free(session, spec.lane))
        return session

    async def _start(self, session: Session) -> None:
        """Start a session whose lane slot (if any) is held; on any failure release all it held."""
        spec = session.spec
        tree_prepared = False
        try:
            env = build_env(
                self.config.env_passthrough,
                self.config.env_set,
                spec.env,
                markers={MARKER_ENV: session.id, SUPERVISOR_ENV: self.instance},
                pty=spec.pty,
                pty_size=spec.pty_size,
            )
            prelude: list[str] = []
            tree_line = self._tree_backend.prepare(session.id)
            tree_prepared = True
            if tree_line:
                prelude.append(tree_line)
            if spec.limits is not None and not spec.limits.empty:
                limits = self._limit_backend
                session.accounting.limit_backend = limits
                try:
                    prelude += limits.prepare(session.id, spec.limits)
                except OSError as exc:
                    raise SpawnFailed(f"could not set up limits with {limits.name}: {exc}") from exc
            if spec.limits is not None:
                prelude += spec.limits.rlimit_lines()
            spawned = await spawn_process(spec, env, prelude=prelude)
        except BaseException:
            if tree_prepared:
                self._tree_backend.release(session.id)
            if session.accounting.limit_backend is not None:
                session.accounting.limit_backend.release(session.id)
            if spec.lane is not None:
                self._lanes.release(spec.lane, session.scope)
            raise
        self._sessions[session.id] = session
        session.attach(spawned)
        if spec.stdin_data is not None:
            self._spawn_task(self._feed_stdin(session, spec.stdin_data))
        if self._store is not None:
            self._store.save(session.id, session.record())

    async def _start_when_free(self, session: Session, lane: str) -> None:
        try:
            await self._lanes.acquire(lane, session.scope)
        except asyncio.CancelledError:
            if session.state is SessionState.QUEUED:
                session.fail_to_start("the supervisor shut down before a lane slot was free")
            raise
        if session.state is not SessionState.QUEUED:
            self._lanes.release(lane, session.scope)  # killed while waiting
            return
        try:
            await self._start(session)
        except ProcpilotError as exc:
            session.fail_to_start(f"{exc.code}: {exc.message}")
        except Exception as exc:
            # A bug must still end the session: left QUEUED, it would never be reported.
            _log.exception("session %s failed to start", session.id)
            session.fail_to_start(f"InternalError: {type(exc).__name__}")

    async def _feed_stdin(self, session: Session, data: bytes) -> None:
        with contextlib.suppress(ProcpilotError, OSError):
            await session.write(data, eof=True)

    def _on_finish(self, session: Session) -> None:
        if session.left_orphans:
            # Orphans the tree left with us (we are their subreaper) are zombies now: reap them.
            reap_orphans({s.pid for s in self._sessions.values() if s.pid and not s.finished})
        if session.spec.lane is not None and session.started_at is not None:
            self._lanes.release(session.spec.lane, session.scope)
        if self._store is not None and session.id in self._sessions:
            self._store.save(session.id, session.record())
        if session.spec.notify_on_exit and self.exits.has_listeners:
            self.exits.publish(session.exit_info(self.tail_text(session)))

    # -- queries -------------------------------------------------------------------------------

    def get(self, scope: str, session_id: str) -> Session:
        session = self._sessions.get(session_id)
        if session is None or session.scope != scope:
            raise SessionNotFound(f"no session {session_id!r}", session_id=session_id)
        session.last_access = time.monotonic()
        return session

    def list(self, scope: str) -> builtins.list[Session]:
        """This scope's sessions, newest first."""
        mine = [s for s in self._sessions.values() if s.scope == scope]
        mine.sort(key=lambda s: s.created_at, reverse=True)
        return mine

    def all_sessions(self) -> builtins.list[Session]:
        return list(self._sessions.values())

    def lane_usage(self, scope: str | None = None) -> dict[str, tuple[int, int, int]]:
        """(active, waiting, cap) per lane in use: ``scope``'s, or every scope's keyed ``scope/lane``."""
        return self._lanes.usage(scope)

    def tail_text(self, session: Session, chars: int = _TAIL_CHARS) -> str:
        view = session.output[Stream.COMBINED]
        raw = view.read(max(0, view.size - chars * 4)).data
        return tail_chars(for_model(raw), chars)[0]

    # -- actions -------------------------------------------------------------------------------

    async def run(self, spec: SpawnSpec, *, scope: str, yield_ms: int | None) -> Session:
        """Start ``spec`` and wait up to ``yield_ms`` for it; still running then, it is backgrounded.

        ``yield_ms=None`` waits for the end; ``0`` returns at once. The process is never
        restarted or interrupted by the hand-over: it is the same session either way.
        """
        session = await self.spawn(spec, scope=scope)
        timeout = None if yield_ms is None else yield_ms / 1000
        if timeout != 0:
            await session.wait_finished(timeout)
        if not session.finished:
            session.backgrounded = True
        return session

    async def write(
        self, scope: str, session_id: str, data: bytes, *, eof: bool = False, timeout: float | None = None
    ) -> int:
        """Write to the session's stdin; returns the bytes written, fewer than ``len(data)`` if the
        child did not read them within ``timeout`` seconds (None: wait as long as it takes)."""
        session = self.get(scope, session_id)
        if session.finished:
            raise ProcessAlreadyExited(f"session {session_id} has already ended ({session.state.value})")
        if self._write_filter is not None and data:
            await self._off_loop_if_big(len(data), self._write_filter, scope, session, data)
        return await session.write(data, eof=eof, timeout=timeout)

    async def kill(
        self,
        scope: str,
        session_id: str,
        sig: int = signal.SIGTERM,
        *,
        grace: float | None = None,
        wait: float | None = 0.0,
    ) -> Session:
        """Signal the session's whole tree; SIGKILL follows after ``grace`` (default from config).

        ``wait`` seconds (None = until it ends) are spent waiting for the tree to be gone.
        """
        session = self.get(scope, session_id)
        if session.state is SessionState.QUEUED:
            session.fail_to_start("killed while waiting for a lane slot", end=SessionState.KILLED)
            return session
        grace = self.config.kill_grace_sec if grace is None else grace
        self._resume_if_stopped(session)
        session.terminate(SessionState.KILLED, sig, grace)
        if wait is None or wait > 0:
            await session.wait_finished(wait)
        return session

    async def wait(
        self,
        scope: str,
        session_id: str,
        *,
        timeout: float | None,
        pattern: re.Pattern[str] | regex.Pattern[str] | None = None,
        stream: Stream = Stream.COMBINED,
        since: int = 0,
    ) -> WaitOutcome:
        """Block until exit, until ``pattern`` matches output (from byte ``since`` on), or ``timeout``.

        A pattern gets at most half a second per scan: past that it is an ``InvalidPattern``
        (catastrophic backtracking), not a server whose event loop stalls for every session.
        """
        session = self.get(scope, session_id)
        # The regex module can give up on a match; re cannot. Same syntax and flag values.
        matcher = regex.compile(pattern.pattern, pattern.flags) if isinstance(pattern, re.Pattern) else pattern
        deadline = None if timeout is None else time.monotonic() + timeout
        view = session.output[stream]
        scanned = since
        carry = ""
        while True:
            # Scanned a chunk at a time: memory stays bounded however much output is new.
            while matcher is not None and view.size > scanned:
                chunk = view.read(scanned, _SCAN_CHUNK)
                data = chunk.data
                keep = len(data)
                if chunk.end < view.size or not session.finished:
                    keep = complete_utf8_prefix(data)  # a character split at the edge waits, whole
                    if keep == 0:
                        if chunk.end >= view.size:
                            break  # only part of a character so far
                        keep = len(data)  # stray bytes before the cap's gap: never completed
                text = carry + data[:keep].decode("utf-8", errors="replace")
                try:
                    found = matcher.search(for_model(text), timeout=_PATTERN_TIMEOUT)
                except TimeoutError:
                    raise InvalidPattern(
                        f"the pattern {matcher.pattern!r} takes too long to match (catastrophic backtracking)",
                        hints={"simplify": "Use a pattern without nested repetition, e.g. a fixed word like 'READY'."},
                        field="pattern",
                    ) from None
                if found:
                    return WaitOutcome("pattern", found.group(0), chunk.end - (len(data) - keep))
                scanned = chunk.end - (len(data) - keep)
                # Keep the last line so a match spanning two reads is still found.
                carry = text[text.rfind("\n") + 1 :][-4096:]
                if chunk.end < view.size:
                    await asyncio.sleep(0)  # a long backlog must not starve the other sessions
            if session.finished:
                return WaitOutcome("exited")
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return WaitOutcome("timeout")
            if matcher is None:
                await session.wait_finished(remaining)
            else:
                await session.output.wait_for_change(remaining)

    def clear(self, scope: str, session_id: str) -> None:
        """Forget a finished session and delete its files."""
        session = self.get(scope, session_id)
        if not session.finished:
            raise SessionStillRunning(f"session {session_id} is still {session.state.value}")
        self._forget(session)

    async def remove(self, scope: str, session_id: str) -> Session:
        """Kill if running (SIGTERM, SIGKILL after the grace period, waiting for the tree to end),
        then clear. A program gets its chance to clean up, as with kill."""
        session = self.get(scope, session_id)
        if not session.finished:
            await self.kill(scope, session_id, signal.SIGTERM, wait=None)
        self._forget(session)
        return session

    def _forget(self, session: Session) -> None:
        self._sessions.pop(session.id, None)
        session.output.remove_files()
        if self._store is not None:
            self._store.delete(session.id)

    def sweep(self, now: float | None = None) -> builtins.list[str]:
        """Remove finished sessions idle for longer than the TTL; returns their ids."""
        now = time.monotonic() if now is None else now
        ttl = self.config.session_ttl_sec
        expired = [s for s in self._sessions.values() if s.finished and now - s.idle_since > ttl]
        for session in expired:
            self._forget(session)
        return [s.id for s in expired]

    # -- events --------------------------------------------------------------------------------

    def on_exit(self, callback: Callable[[ExitInfo], None]) -> Callable[[], None]:
        """Call ``callback`` once per session when it ends; returns the remover."""
        return self.exits.add_callback(callback)

    def exit_events(self, maxsize: int = 1000) -> Subscription[ExitInfo]:
        """An async iterator of exit events from now on (bounded; see ``Subscription.dropped``)."""
        return self.exits.subscribe(maxsize)

    async def iter_exits(self) -> AsyncIterator[ExitInfo]:
        sub = self.exit_events()
        try:
            async for event in sub:
                yield event
        finally:
            sub.close()
