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
import threading
import time
import weakref
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

import regex

from procpilot.config import EngineSettings, Settings, load_settings
from procpilot.engine import cgroup_janitor, descriptors
from procpilot.engine.adoption import Restarts, leader_status, outage_exits, replay_spool
from procpilot.engine.capture import SessionOutput, Stream
from procpilot.engine.children import (
    hold_subreaper,
    leave_to_next_server,
    reap_orphans,
    release_subreaper,
    take_back,
)
from procpilot.engine.environment import check_overrides
from procpilot.engine.events import EventBus, Subscription
from procpilot.engine.fairness import AgentGroups, probe_fairness
from procpilot.engine.holder import SPOOL_NAME
from procpilot.engine.holder_client import HeldSession
from procpilot.engine.isolation import FALLBACKS, isolation_capabilities
from procpilot.engine.lanes import LaneScheduler
from procpilot.engine.launcher import Launcher, LaunchHost
from procpilot.engine.lifecycle import Lifecycle, SupervisorState
from procpilot.engine.limits import (
    CgroupV1Limits,
    CgroupV2Limits,
    LimitBackend,
    TreeSample,
    WatchdogLimits,
    probe_limits,
)
from procpilot.engine.output_parking import OutputParking
from procpilot.engine.reaper import ExitWatcher
from procpilot.engine.records import SessionRecord
from procpilot.engine.scopes import agent_of
from procpilot.engine.session import ExitInfo, Session
from procpilot.engine.spawn import Spawned, SpawnSpec, build_env, spawn_process
from procpilot.engine.state_files import StateDirIdentity, make_state_dir
from procpilot.engine.state_format import check_state_format
from procpilot.engine.states import END_STATES, SessionState
from procpilot.engine.stdin import StdinParking
from procpilot.engine.store import FileStore, OrderedLater, SessionStore
from procpilot.engine.trees import (
    MARKER_ENV,
    SUPERVISOR_ENV,
    CgroupTrees,
    MembershipUnknown,
    TreeBackend,
    instance_name,
    probe_trees,
)
from procpilot.engine.usage import UsageTracker
from procpilot.engine.warm import WarmPool, WarmShell, WarmShellGone, favordynmods
from procpilot.errors import (
    AmbiguousSession,
    InvalidPattern,
    NotSupported,
    ProcessAlreadyExited,
    ProcpilotError,
    SessionNameInUse,
    SessionNotFound,
    SessionStillRunning,
    SpawnFailed,
    SupervisorClosed,
)
from procpilot.render import complete_utf8_prefix, for_model, tail_chars
from procpilot.turns import waiting

__all__ = ["LocalLauncher", "Supervisor", "WaitOutcome", "disk_space"]

_log = logging.getLogger(__name__)
_TAIL_CHARS = 400
_SCAN_CHUNK = 1 << 20
# Pattern scans run here, off the event loop: one may take up to _PATTERN_TIMEOUT on one chunk,
# and a hostile pattern would otherwise hold every other agent's calls that long, call after
# call. Two threads: such scans queue behind each other, never behind the loop (the regex module
# lets go of the GIL while it matches).
_PATTERN_SCANS = ThreadPoolExecutor(max_workers=2, thread_name_prefix="procpilot-pattern")
_REAP_INTERVAL = 2.0
_WATCHDOG_INTERVAL = 0.1
_PATTERN_TIMEOUT = 0.5  # seconds one wait pattern may spend on one scan of output
_LOW_SPACE_BYTES = 100 << 20  # under this (or 1% of the disk) doctor and capabilities warn
_INLINE_CHECK_BYTES = 4096  # a filter reads a command this size in well under a millisecond
_T = TypeVar("_T")
_MAX_OUTAGE_EXITS = 1000  # per scope, each kept as long as its session is
# A holder that died while its server lives: tries at starting another, the first after this delay,
# each next one twice as late (a holder that cannot start at all is reported, not spun on).
_REHOLD_TRIES = 5
_REHOLD_DELAY = 0.2
# Refused sessions offered to the holder again: at most this many, this often, and half as often
# each time they are refused again, down to once every _REOFFER_MAX seconds (_reoffer_soon).
_REOFFER_EVERY = 1.0
_REOFFER_MAX = 60.0
_REOFFER_BATCH = 64
_NOT_HELD_SHOWN = 20  # ids of sessions the holder refused, named in capabilities and the log
# What a session's record carries for the next server (see _hand_to_holder), kept across adoptions.
# What this version writes for the next server and can read back; a newer one is left alone.
# 2: the output is stored once (the combined log and its ordering index); 1: a copy per stream
# as well, which this version still reads and goes on writing for a session adopted in it.
# 3: the record is the whole session (the spec as admitted, its restart counters, its TTL clock),
# and ended sessions are read back too; a record of 1 or 2 has only what adoption needed then.
_RECORD_FORMAT = 3
_PER_STREAM_FORMAT = 1
_ADOPTION_KEYS = (
    "format",
    "owner",
    "server_pid",
    "max_log_bytes",
    "tree_root",
    "limit_mechanism",
    "limit_roots",
    "group_roots",
    "timeout",
    "notify_on_exit",
)


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


async def _in_passing_thread(fn: Callable[..., _T], *args: Any) -> _T:
    """``fn(*args)`` in a thread that ends with it, not in a pool that stays: while any other
    thread lives, every spawn (vfork + exec) of this process costs ~3x (0.3 vs 0.09 ms here)."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[_T] = loop.create_future()

    def settle(result: _T | None, error: BaseException | None) -> None:
        if done.cancelled():
            return
        if error is not None:
            done.set_exception(error)
        else:
            done.set_result(result)  # type: ignore[arg-type]

    def run() -> None:
        try:
            result = fn(*args)
        except BaseException as exc:  # handed to the awaiting task, which raises it
            loop.call_soon_threadsafe(settle, None, exc)
        else:
            loop.call_soon_threadsafe(settle, result, None)

    thread = threading.Thread(target=run, name="procpilot-check", daemon=True)
    thread.start()
    try:
        return await asyncio.shield(done)
    finally:
        if not done.done():  # the caller was cancelled: the check still runs to its end, unread
            done.cancel()


def _search(matcher: regex.Pattern[str], carry: str, data: bytes) -> tuple[str, regex.Match[str] | None]:
    """One scan of a wait pattern (in _PATTERN_SCANS): the text scanned, and the match if any."""
    text = carry + data.decode("utf-8", errors="replace")
    return text, matcher.search(for_model(text), timeout=_PATTERN_TIMEOUT, concurrent=True)


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
        warm_shells: int | None = None,
        owner: str | None = None,
        descriptors_for: tuple[int, int] | None = None,
        launcher: Launcher | None = None,
    ) -> None:
        """``launcher``: where sessions run (engine/launcher.py); None: on this host."""
        # The faces over this supervisor read the whole settings; the engine reads only its part.
        self.settings = settings or load_settings()
        self.config: EngineSettings = self.settings.engine
        # With an owner ("serve", "mcp:<agent>") the sessions outlive this server: a crash or a
        # restart hands them to the next server of the same owner (engine/adoption.py).
        self.owner = owner
        self._restarts: Restarts | None = None
        # The state directory as it was at start: a spawn refuses to make files in another one.
        self._state_dir: StateDirIdentity | None = None
        self._rehold: asyncio.Task[None] | None = None  # starting a holder after the last one died
        self._not_held: set[str] = set()  # sessions whose copies the holder refused (custody.not_held)
        self._reoffer: asyncio.TimerHandle | None = None  # those offered to the holder again
        self._last_reoffer = 0.0
        self._reoffer_every = _REOFFER_EVERY  # doubled while they are refused again
        self._reoffered: set[str] = set()  # the last batch offered again
        self._slowed_at = -1.0  # the offer whose refusal last slowed the offers
        # Sessions ended at start, the holder having no room to hand them back: their ids, and why.
        self._unreturned: builtins.list[str] = []
        self._unreturned_why = ""
        # Running sessions' unwritten stdin, out of our descriptor table (engine/stdin.py).
        self._stdin_parking = StdinParking(before=self._hold_now)
        # Quiet sessions' output ends too, once the table fills (engine/output_parking.py).
        self.output_parking = OutputParking(before=self._hold_now)
        self.adopted: builtins.list[str] = []  # ids of the sessions taken over at start
        # Exits of sessions that ended while no server ran, per scope and session id, kept as long
        # as the session is: nobody was there to be told when they happened, so every listener
        # of the scope that connects is told (outage_exits).
        self._outage_exits: dict[str, dict[str, ExitInfo]] = {}
        self._handed_over = asyncio.Event()  # set once detach() has left every session to the next server
        self._store: SessionStore | None = store
        self._trees: TreeBackend | None = trees
        self._limits: LimitBackend | None = limits
        self._groups = AgentGroups(None, None, "not started")  # each agent's CPU share (engine/fairness.py)
        # Called as filter(scope, spec, running sessions in that scope) before every spawn: it may
        # refuse (raise a ProcpilotError) or return the spec to run. Policy lives outside the engine.
        self._spawn_filter = spawn_filter
        # Called as filter(scope, session, data) before any byte reaches a session's stdin, whatever
        # face it came from: it may refuse (raise). Input to a shell is commands too.
        self._write_filter = write_filter
        self._big_checks = asyncio.Semaphore(1)
        self._sessions: dict[str, Session] = {}
        # (scope, name) of sessions being started: a name is taken from the check on, so two
        # concurrent spawns cannot both get it.
        self._starting_names: set[tuple[str, str]] = set()
        # Each agent's sessions not finished yet (queued or running; all its conversations' scopes
        # together, engine/scopes.py), kept as they start and end:
        # the spawn filter's count must not cost a walk over every session kept.
        self._unfinished: dict[str, set[str]] = {}
        self._lanes = LaneScheduler(dict(self.config.lane_caps), self.config.default_lane_cap)
        self.exits: EventBus[ExitInfo] = EventBus()
        self._usage: UsageTracker | None = None
        # Shells started ahead of time, each in its session's cgroup already (engine/warm.py);
        # 0 starts every session cold.
        self._warm_size = self.config.warm_shells if warm_shells is None else warm_shells
        self._warm: WarmPool | None = None
        self._warm_base: dict[str, str] | None = None  # the warm shells' environment but the markers
        # A server raises this process's descriptor limit at start for (running sessions, other
        # descriptors: its connections) (engine/descriptors.py); a library caller's keeps its own.
        self._descriptors_for = descriptors_for
        self._tasks: set[asyncio.Task[None]] = set()
        # new -> running -> closing -> closed (engine/lifecycle.py): what it may still start.
        self._lifecycle = Lifecycle()
        self._close_task: asyncio.Task[None] | None = None  # the one aclose()/detach() run, once begun
        # True from the move to running until closed: while any supervisor holds it, the process is
        # a child subreaper (engine/children.py says why only then).
        self._holds_subreaper = False
        # The loop's SIGCHLD watcher, held from the move to running until closed: its handler is
        # removed after the last holder on the loop (engine/reaper.py says why). None before, after,
        # and where the loop cannot handle SIGCHLD (off the main thread: the sync wrapper's).
        self._exit_watcher: ExitWatcher | None = None
        # Named at construction, so every process this supervisor starts carries the same name
        # (SUPERVISOR_ENV) as its cgroup directories.
        self.instance = instance_name()
        self._launcher: Launcher = LocalLauncher(self) if launcher is None else launcher
        self._launcher.bind(
            LaunchHost(
                settings=self.settings,
                lanes=self._lanes,
                trees=lambda: self._tree_backend,
                session_dir=self._session_dir,
                register=self._keep,
                save=self._save,
                on_finish=self._on_finish,
                start_when_free=self._queue_for_lane,
                sessions=self.all_sessions,
            )
        )

    # -- lifecycle -----------------------------------------------------------------------------

    @property
    def state(self) -> SupervisorState:
        """Where this supervisor is in its life: new, running, closing or closed."""
        return self._lifecycle.state

    async def start(self) -> Supervisor:
        """Open the state directory, probe the host, adopt what a previous server left, start the
        warm pool and housekeeping. Again while running: nothing. Once closing or closed:
        ``SupervisorClosed`` (a closed supervisor never starts again). A start that fails leaves
        it new."""
        if self._lifecycle.state is SupervisorState.RUNNING:
            return self
        self._lifecycle.refuse_if_ending("start")
        make_state_dir(self.config.state_dir, "the state directory")
        self._state_dir = StateDirIdentity(self.config.state_dir)
        check_state_format(self.config.state_dir)
        if self._descriptors_for is not None:
            descriptors.raise_for(*self._descriptors_for)
        held: builtins.list[HeldSession] = []
        if self.owner is not None:
            # First of all: the lock (a second live server of this owner stops here), then what the
            # holder kept. Its locks on dead servers' cgroups spare those trees from the sweep below.
            self._restarts = Restarts(self.config.state_dir, self.owner)
            self._restarts.link.parking = self._stdin_parking  # what comes back is parked at once
            held = self._restarts.begin()
        try:
            self._probe()
        except BaseException:
            for copy in held:  # nothing taken over: the holder keeps them for the next server
                copy.close()
            if self._restarts is not None:
                self._restarts.close(detach=True)
            raise
        hold_subreaper()
        self._holds_subreaper = True
        self._exit_watcher = ExitWatcher.of(asyncio.get_running_loop())
        if self._exit_watcher is not None:
            self._exit_watcher.hold()
        self._lifecycle.move(SupervisorState.RUNNING)
        if self._restarts is not None:
            self._restarts.link.on_lost = self._holder_lost
            self._restarts.link.on_refused = self._holder_refused
            self._adopt(held)
        if self._warm_size > 0:
            self._warm = WarmPool(
                self._tree_backend,
                self._warm_size,
                make_env=self._warm_env,
                new_id=new_session_id,
                groups=self._groups,
                exit_trap=self._warm_exit_trap,
            )
            self._warm.fill()
        self._spawn_task(self._housekeeping())
        try:
            await self._launcher.open()
        except BaseException:
            await self.aclose()
            raise
        return self

    def _probe(self) -> None:
        if self._store is None:
            self._store = FileStore(self.config.state_dir)
        if self.owner is None and not isinstance(self._store, OrderedLater):
            # Its journal is read by no server after it (only an owner's sessions are adopted):
            # a session's end record is written just after its waiting caller resumed (_on_finish).
            self._store = OrderedLater(self._store)
        name = self.instance
        if self._trees is None:
            self._trees = probe_trees(name=name)
        if self._limits is None:
            # Where sessions are grouped by cgroup v2, limits go in the same directories.
            v2_root = self._trees.root if isinstance(self._trees, CgroupTrees) else None
            self._limits = probe_limits(v2_root=v2_root, name=name)
        self._groups = probe_fairness(self._trees, self._limits)

    def _warm_exit_trap(self, session_id: str) -> str | None:
        """The exit trap _start gives a warm start of ``session_id`` while the holder is there: a
        warm shell made now runs it itself, so a call sends none (engine/warm.py)."""
        restarts = self._restarts
        if restarts is None or not restarts.link.connected:
            return None
        return restarts.status_line(session_id)

    def _warm_env(self, session_id: str) -> dict[str, str]:
        """A warm shell's environment: the base a session without overrides gets, read once
        (the server's variables through ``env_passthrough``, then ``env_set``), and the markers.
        A base read earlier than a call is no promise about what that call's command sees: the
        launch exports every variable where the call's own environment differs (engine/warm.py)."""
        base = self._warm_base
        if base is None:
            base = self._warm_base = build_env(
                self.config.env_passthrough, self.config.env_set, {}, markers={}, pty=False, pty_size=(0, 0)
            )
        return {**base, MARKER_ENV: session_id, SUPERVISOR_ENV: self.instance}

    def _env(self, session_id: str, spec: SpawnSpec) -> dict[str, str]:
        return build_env(
            self.config.env_passthrough,
            self.config.env_set,
            spec.env,
            markers={MARKER_ENV: session_id, SUPERVISOR_ENV: self.instance},
            pty=spec.pty,
            pty_size=spec.pty_size,
        )

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
            "cpu_fairness": self._groups.describe(),
            "isolation": self._isolation_report(),
            "pidfd": hasattr(os, "pidfd_open"),
            "warm_shells": self.warm_shells(),
            "descriptors": descriptors.report(),
            "state_dir": self.state_dir_space(),
            "restarts": self._restart_capability(),
            "outage_exits": self._restarts.outage_exits() if self._restarts else outage_exits(),
        } | self._launcher.capabilities()

    def _isolation_report(self) -> dict[str, Any]:
        """The host's mechanisms, which weaker boxes the policy allows (``isolation_fallback``), and
        a warning when, on this host, a box does run weaker because of that."""
        found = isolation_capabilities()
        policy = self.settings.policy
        allowed = {"default": policy.default.isolation_fallback}
        allowed |= {f"agent {name}": policy.for_agent(name).isolation_fallback for name in policy.agents}
        found["fallback_allowed"] = [f"{who}: {', '.join(kinds)}" for who, kinds in allowed.items() if kinds]
        weaker = []
        served = {"landlock": found["readonly_root"] == "landlock", "seccomp": found["network_off"] == "seccomp"}
        for kind, serves in served.items():
            users = [who for who, kinds in allowed.items() if kind in kinds]
            if serves and users:
                weaker.append(f"{', '.join(users)} get {FALLBACKS[kind]}")
        found["warning"] = "; ".join(weaker) or None
        return found

    def warm_shells(self) -> dict[str, Any]:
        """The pool of shells started ahead of time, and whether the host's cgroup v2 mount favours
        fast migrations (``favordynmods``), which is what a cold start waits on after idle."""
        root = self._trees.root if isinstance(self._trees, CgroupTrees) else None
        pool = self._warm
        fast = None if root is None else favordynmods(root)
        found: dict[str, Any] = {
            "size": 0 if pool is None else pool.size,
            "ready": 0 if pool is None else pool.ready,
            "sessions_started_warm": 0 if pool is None else pool.taken,
            "cgroup_favordynmods": fast,
        }
        if fast is False:
            # Never set by procpilot: a mount option of the whole host, the operator's to choose.
            found["note"] = (
                "cold starts after idle wait for an RCU grace period (8-20 ms here); an operator may "
                "remount the cgroup2 hierarchy with favordynmods (Linux 6.0+, host-wide): "
                "see docs/performance.md"
            )
        return found

    def _restart_capability(self) -> dict[str, Any]:
        """Whether running sessions would outlive this server, and if not, why not."""
        restarts = self._restarts
        if restarts is None:
            return {"survive": False, "why": "no owner: sessions end with this supervisor (procpilot serve has one)"}
        if not restarts.link.connected:
            return {"survive": False, "owner": restarts.owner, "why": restarts.link.problem}
        found: dict[str, Any] = {
            "survive": True,
            "owner": restarts.owner,
            "holder": restarts.link.path,
            "holder_pid": restarts.link.pid,
        }
        if self._unreturned:
            # Ended as this server started: held, but the holder had no room to hand them back.
            found["unreturned"] = {
                "sessions": len(self._unreturned),
                "ids": self._unreturned[:_NOT_HELD_SHOWN],
                "why": self._unreturned_why,
            }
        refused = [s for sid in list(self._not_held) if (s := self._still_not_held(sid)) is not None]
        if refused:
            # The holder runs, but these it could not take: they run on here and end with us.
            found["not_held"] = {
                "sessions": len(refused),
                "ids": sorted(s.id for s in refused)[:_NOT_HELD_SHOWN],
                "why": refused[-1].custody.not_held,
            }
        return found

    def _still_not_held(self, session_id: str) -> Session | None:
        session = self._sessions.get(session_id)
        if session is None or session.finished or session.custody.not_held is None:
            self._not_held.discard(session_id)
            return None
        return session

    @property
    def usage(self) -> UsageTracker:
        """Resource usage of the sessions' trees (made on first use: sampling costs nothing before)."""
        if self._usage is None:
            me = weakref.ref(self)  # the tracker's sampling task must not keep this supervisor alive

            def trees() -> TreeBackend | None:
                sup = me()
                return None if sup is None else sup._tree_backend

            def start(run: Callable[[], Coroutine[Any, Any, None]]) -> asyncio.Task[None] | None:
                sup = me()
                if sup is None or sup._lifecycle.state.is_ending:
                    return None
                return sup._spawn_task(run())

            self._usage = UsageTracker(trees, start)
        return self._usage

    def state_dir_space(self) -> dict[str, Any]:
        """Room left where output is stored: a full disk loses output (counted, never silently)."""
        space = disk_space(self.config.state_dir)
        store = self._store.inner if isinstance(self._store, OrderedLater) else self._store
        journal = store.write_error if isinstance(store, FileStore) else None
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
        if self._close_task is None and self._lifecycle.state is not SupervisorState.RUNNING:
            if self._lifecycle.state is SupervisorState.NEW:  # nothing started: nothing to end
                self._lifecycle.move(SupervisorState.CLOSED)
            return
        if self._close_task is None:
            self._begin_closing(self._close(sig, grace))
        if self._close_task is not None:
            await asyncio.shield(self._close_task)

    def _begin_closing(self, work: Coroutine[Any, Any, None]) -> None:
        """RUNNING -> CLOSING now, CLOSED once ``work`` (the shutdown or the hand-over) is over."""
        self._lifecycle.move(SupervisorState.CLOSING)
        self._close_task = asyncio.ensure_future(self._until_closed(work))

    async def _until_closed(self, work: Coroutine[Any, Any, None]) -> None:
        try:
            await work
        finally:
            self._lifecycle.move(SupervisorState.CLOSED)
            if self._exit_watcher is not None:
                watcher, self._exit_watcher = self._exit_watcher, None
                watcher.release()  # first: the leaders its last sweep finds ended are reaped by their sessions
            if self._holds_subreaper:
                self._holds_subreaper = False
                release_subreaper()

    @property
    def can_detach(self) -> bool:
        """True iff running sessions would survive :meth:`detach` (a holder has their stdio)."""
        return self._restarts is not None and self._restarts.link.connected

    async def detach(self) -> None:
        """Stop without ending anything: every running session is left, running, to the holder
        and to the next server of this owner (a planned restart, an upgrade, a stdio server
        whose client went away). Without a holder this is :meth:`aclose`: nothing would keep
        the sessions' output, so they are ended as before."""
        if not self.can_detach:
            await self.aclose()
            return
        if self._close_task is None:
            self._begin_closing(self._detach())
        if self._close_task is not None:
            await asyncio.shield(self._close_task)

    async def _detach(self) -> None:
        self._handed_over.set()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        # Sessions still queued for the holder go now, while their descriptors are open; then our
        # readers stop before the holder starts: the logs and the spool never interleave.
        if self._restarts is not None:
            self._restarts.link.flush()
            # And the holder's answer: a session it refused has that said in its record below.
            self._restarts.link.sync()
        if self._warm is not None:
            self._warm.close()  # shells with no command yet: nothing for the next server
        restarts = self._restarts
        for session in self._sessions.values():
            left = session.detach()
            if left is not None and restarts is not None:
                # Still our child: reaped when it ends, its status kept for the next server.
                leave_to_next_server(left, str(restarts.record_file(session.id)))
            # Its latest record, its last read included (the TTL clock goes on in the next server).
            if self._store is not None:
                self._store.save(session.id, session.record())
        if restarts is not None:
            restarts.close(detach=True)
        for backend in (self._trees, self._limits):
            release = getattr(backend, "detach", None)
            if release is not None:
                release()
        if self._store is not None:
            self._store.close()
        self._stdin_parking.close()  # the holder has its own copies
        self.output_parking.close()
        self.exits.close()

    async def _close(self, sig: int, grace: float | None) -> None:
        try:
            await self._end_local(sig, grace)
        finally:
            # Then whatever the launcher runs elsewhere (a cluster's nodes), its own grace given.
            await self._launcher.close(self.config.kill_grace_sec if grace is None else grace)

    async def _end_local(self, sig: int, grace: float | None) -> None:
        try:
            await self._end_all(sig, grace)
        except asyncio.CancelledError:
            self._kill_all_now()
            raise
        finally:
            if self._warm is not None:
                self._warm.close()
            reap_orphans()
            # Its sessions' directories still queued for removal go first (it is closing: the
            # loop may wait), then what holds them.
            cgroup_janitor.wait_idle(5.0)
            self._tree_backend.close()
            self._limit_backend.close()
            self._groups.close()
            if self._restarts is not None:
                self._restarts.close()
            if self._store is not None:
                self._store.close()
            self._stdin_parking.close()
            self.output_parking.close()
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
            reap_orphans()
            if self._exit_watcher is not None:
                self._exit_watcher.sweep()
            now = time.monotonic()
            if now - ttl_check > 30:
                ttl_check = now
                self.sweep(now)
                if self._not_held:
                    self._reoffer_soon()  # room may have come otherwise (the holder's limit raised)

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
                try:
                    pids = self._tree_backend.pids(session.id, session.pid)
                except MembershipUnknown:
                    continue  # unreadable this tick (no descriptor free): not an empty tree; the next
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
            return await _in_passing_thread(check, *args)

    async def _admit(self, spec: SpawnSpec, scope: str) -> SpawnSpec:
        """The checks every spawn passes before anything starts, and the spec the policy returns:
        the same for a session started here and one a cluster starts on another node."""
        # Refused before anything starts: a spawn on a supervisor closed before it ever ran
        # must not start its warm pool and housekeeping only to find it closed.
        self._lifecycle.refuse_if_ending("start a session")
        if self._lifecycle.state is SupervisorState.NEW:
            await self.start()
        self._lifecycle.refuse_if_ending("start a session")  # closed while it started
        # The engine's own fence, before any policy reads the spec: no face can skip it.
        check_overrides(spec.env, self.config.protected_env)
        if self._spawn_filter is not None:
            running = len(self._unfinished.get(agent_of(scope), ()))
            if len(spec.display) <= _INLINE_CHECK_BYTES:  # the usual call: no coroutine around it
                spec = self._spawn_filter(scope, spec, running)
            else:
                spec = await self._off_loop_if_big(len(spec.display), self._spawn_filter, scope, spec, running)
        elif spec.elevated:
            # Leaving a box is the policy's to allow; with no policy nothing could have allowed it.
            raise NotSupported(
                "elevated runs need an agent policy that allows them, and this supervisor has none",
                hints={"drop_option": "Call again without elevated."},
            )
        return spec

    async def spawn(self, spec: SpawnSpec, *, scope: str, session_id: str | None = None) -> Session:
        """Start ``spec`` (or queue it behind its lane) and return its session at once.

        ``session_id``: the id to use (a cluster's daemon names a session it queued itself);
        None: a new one."""
        session = await self._spawn(spec, scope, session_id)
        self._hold_now()  # its id leaves the engine now (run() holds later, only if it must)
        return session

    def _hold_now(self) -> None:
        """Whatever is queued for the holder goes now. Called before a running session's id leaves
        the engine: a client that has the id may see the server killed -9 the next moment, and a
        session whose descriptors were still in the batch would die of SIGPIPE with it. A command
        that ends within its yield never gets here, so exec's usual call still sends nothing."""
        if self._restarts is not None:
            self._restarts.link.flush()

    async def _spawn(self, spec: SpawnSpec, scope: str, session_id: str | None = None) -> Session:
        spec = await self._admit(spec, scope)
        self._open_store()
        # A name is unique among the scope's live sessions wherever they run: checked here, where
        # all of them are known (a cluster's node sees only its own).
        if spec.name is not None:
            self._take_name(scope, spec.name)
        try:
            return await self._launcher.launch(spec, scope, session_id)
        finally:
            if spec.name is not None:
                self._starting_names.discard((scope, spec.name))

    def _open_store(self) -> SessionStore:
        """The journal, from start until the supervisor closes."""
        state = self._lifecycle.state
        if self._store is None or state is not SupervisorState.RUNNING:
            raise SupervisorClosed(f"the supervisor is {state.value}", state=state.value)
        return self._store

    def _take_name(self, scope: str, name: str) -> None:
        live = (s for s in self._sessions.values() if s.scope == scope and s.name == name and not s.finished)
        holder = next(live, None)
        if holder is not None or (scope, name) in self._starting_names:
            raise SessionNameInUse(
                f"a live session is already named {name!r}" + (f" ({holder.id})" if holder else ""),
                name=name,
                session_id=holder.id if holder else None,
            )
        self._starting_names.add((scope, name))

    async def _spawn_checked(
        self, spec: SpawnSpec, scope: str, store: SessionStore, given_id: str | None = None
    ) -> Session:
        if self._state_dir is not None:
            self._state_dir.check()  # one stat, before anything is taken: its files go there
        starts_now = spec.lane is None or self._lanes.try_acquire(spec.lane, agent_of(scope))
        # A warm shell waits in a cgroup made for its own id: a session whose id is given starts cold.
        warm_ok = starts_now and self._warm is not None and given_id is None
        # The pool's refill is timed once the command has started (refill_after_take below).
        warm = self._warm.take(spec, agent_of(scope), refill=False) if warm_ok and self._warm is not None else None
        session_id = given_id or (new_session_id() if warm is None else warm.session_id)
        try:
            if warm is not None:
                # The command first, the session's objects after: their making (~0.1 ms after an
                # agent's idle gap) runs while the command does, not before it starts.
                spawned = await self._launch_warm(spec, scope, warm)
                if spawned is not None:
                    return self._attach_launched(spec, scope, store, warm, spawned)
                # The shell was gone: a cold start under the same id, in the cgroup it left.
            session = self._new_session(session_id, scope, spec, store)
            if starts_now:
                try:
                    await self._start(session)
                except BaseException:
                    # Whatever went wrong (a typed refusal, a bug, a cancelled caller), the session
                    # never started: nothing may be left on disk under its id.
                    session.output.remove_files()
                    store.delete(session_id)
                    raise
            elif spec.lane is not None:
                self._register(session)
                store.save(session_id, session.record())
                self._spawn_task(self._start_when_free(session, spec.lane))
            return session
        finally:
            if warm_ok and self._warm is not None:
                self._warm.refill_after_take()

    def _new_session(self, session_id: str, scope: str, spec: SpawnSpec, store: SessionStore) -> Session:
        """A session's objects, before (cold) or after (warm) its command starts: nothing on disk
        yet (its output's directory is made by its first byte), no process, no timer."""
        output = SessionOutput(store.session_dir(session_id), self.config.max_log_bytes)
        grace = self.config.kill_grace_sec
        session = Session(session_id, scope, spec, output, self._tree_backend, self._on_finish, kill_grace=grace)
        self._supervise(session)
        if self.owner is not None:
            # Whose it is, from its first record on: the next server of this owner restores it
            # even if it never ran (queued) or ended before any holder had it.
            session.custody.record = {"owner": self.owner, "format": _RECORD_FORMAT}
        return session

    async def _launch_warm(self, spec: SpawnSpec, scope: str, warm: WarmShell) -> Spawned | None:
        """Hand ``spec`` to a warm shell (engine/warm.py), its session id the shell's; None: the
        shell had died (discarded, its cgroup kept for the cold start that follows). Refused
        before the shell had its command (a typed refusal, a bug, a cancelled caller), it
        waits on and everything taken for it is given back: nothing started, nothing on disk."""
        session_id = warm.session_id
        try:
            env = self._env(session_id, spec)
            status = None
            restarts = self._restarts
            if restarts and restarts.link.connected and isinstance(spec.command, str) and not spec.isolation:
                # The exit trap for an outage (engine/adoption.py): a warm shell's own is this line
                # already, made by this supervisor, whose lock and pid stay as they were, for this
                # session id (_warm_exit_trap).
                status = warm.exit_trap or restarts.status_line(session_id)
            return await spawn_process(spec, env, prelude=[status] if status else [], launch=warm.launch)
        except WarmShellGone:
            if self._warm is not None:
                self._warm.discard(warm, keep_cgroup=True)
            return None
        except BaseException:
            # Refused before it had a command: it waits on, still in its agent's group (its join
            # pending if it was made for nobody), so it does not leave it; one the pool has no
            # room for is discarded, which leaves it.
            if self._warm is not None:
                self._warm.give_back(warm)
            if spec.lane is not None:
                self._lanes.release(spec.lane, agent_of(scope))
            raise

    def _attach_launched(
        self, spec: SpawnSpec, scope: str, store: SessionStore, warm: WarmShell, spawned: Spawned
    ) -> Session:
        """The session of a command a warm shell runs already. Its objects cannot fail to be made
        but for a bug or no memory left: then its tree is ended and reaped at once and everything
        it held is given back, as if it had been refused (no process, nothing on disk)."""
        try:
            session = self._new_session(warm.session_id, scope, spec, store)
        except BaseException:
            self._tree_backend.signal(warm.session_id, warm.pid, signal.SIGKILL, leader_alive=True)
            if self._warm is not None:
                self._warm.discard(warm)  # reaps the leader, closes our ends, its cgroup goes
            self._groups.leave(warm.session_id)
            if spec.lane is not None:
                self._lanes.release(spec.lane, agent_of(scope))
            reap_orphans()  # what the tree had started, ours once its shell is gone
            raise
        try:
            self._attach(session, spawned)
        except BaseException:
            # As a cold start's failure to attach: what it held is given back, nothing kept on disk.
            self._groups.leave(session.id)
            if spec.lane is not None:
                self._lanes.release(spec.lane, agent_of(scope))
            session.output.remove_files()
            store.delete(session.id)
            raise
        return session

    def _supervise(self, session: Session) -> None:
        """Hook a session with a restart policy to this supervisor: it starts its next runs and
        keeps its record while it waits for one."""
        session.stdin.parking = self._stdin_parking
        session.parking = self.output_parking
        if session.spec.restart is not None:
            session.cycle.hook = self._restart_soon
            session.cycle.on_wait = self._save

    def _session_dir(self, session_id: str) -> Path:
        if self._store is None:  # not started yet
            state = self._lifecycle.state.value
            raise SupervisorClosed(f"the supervisor is {state}", state=state)
        return self._store.session_dir(session_id)

    def _keep(self, session: Session) -> None:
        """A session a launcher other than the local one runs: answered for from now on."""
        self._sessions[session.id] = session

    def _queue_for_lane(self, session: Session, lane: str) -> None:
        self._spawn_task(self._start_when_free(session, lane))

    def _save(self, session: Session) -> None:
        if self._store is not None and session.id in self._sessions:
            self._store.save(session.id, session.record())

    def _restart_soon(self, session: Session) -> None:
        self._spawn_task(self._run_again(session))

    async def _run_again(self, session: Session) -> None:
        """The next run of a restarting session: same id, same output, same lane slot."""
        session.use_trees(self._tree_backend)  # an adopted run's cgroup was its old server's
        if self._restarts is not None:
            # How an adopted run ended, as recorded for us: read already, and not this run's.
            for record in (self._restarts.exit_file(session.id), self._restarts.record_file(session.id)):
                with contextlib.suppress(OSError):
                    record.unlink()
        try:
            await self._start(session, again=True)
        except asyncio.CancelledError:
            if self._handed_over.is_set():
                session.restart_handed_over()  # detach() saves its record after this
            else:
                session.restart_failed("the supervisor shut down before the restart")
            raise
        except Exception as exc:
            if isinstance(exc, ProcpilotError):
                why = f"{exc.code}: {exc.message}"
            else:  # a bug must still end the session: left between two runs, it would never end
                _log.exception("session %s could not restart", session.id)
                why = f"InternalError: {type(exc).__name__}"
            session.restart_failed(f"restart {session.restarts} could not start: {why}")
            return
        self._hold_now()  # its clients have its id already
        session.restarted()

    async def _start(self, session: Session, *, again: bool = False) -> None:
        """Start a session whose lane slot (if any) is held, cold (a warm start is _launch_warm's);
        on any failure release all it held (but the slot of a session starting ``again``: it
        holds it until it ends)."""
        spec = session.spec
        tree_prepared = False
        try:
            env = self._env(session.id, spec)
            prelude: list[str] = []
            # The exit trap for an outage (engine/adoption.py), run by the shell that is the leader.
            restarts = self._restarts
            status = None
            if restarts and restarts.link.connected and isinstance(spec.command, str) and not spec.isolation:
                status = restarts.status_line(session.id)
            try:
                place = self._groups.enter(agent_of(session.scope), session.id)
            except OSError as exc:
                raise SpawnFailed(f"could not make the agent's CPU group: {exc}") from exc
            tree_line = self._tree_backend.prepare(session.id, place.tree_group)
            tree_prepared = True
            if tree_line:
                prelude.append(tree_line)
            prelude += place.lines
            prelude += descriptors.child_lines()
            if spec.limits is not None and not spec.limits.empty:
                limits = self._limit_backend
                session.accounting.limit_backend = limits
                try:
                    prelude += limits.prepare(session.id, spec.limits, place.group)
                except OSError as exc:
                    raise SpawnFailed(f"could not set up limits with {limits.name}: {exc}") from exc
            if spec.limits is not None:
                prelude += spec.limits.rlimit_lines()
            if status is not None:
                prelude.append(status)
            spawned = await spawn_process(spec, env, prelude=prelude)
        except BaseException:
            if tree_prepared:
                self._tree_backend.release(session.id)
            if session.accounting.limit_backend is not None:
                session.accounting.limit_backend.release(session.id)
            if not again:
                self._groups.leave(session.id)
            if spec.lane is not None and not again:
                self._lanes.release(spec.lane, agent_of(session.scope))
            raise
        self._attach(session, spawned)

    def _attach(self, session: Session, spawned: Spawned) -> None:
        spec = session.spec
        self._register(session)
        session.attach(spawned)
        if self._restarts is not None:
            self._hand_to_holder(session, spawned)
        if spec.stdin_data is not None:
            self._spawn_task(self._feed_stdin(session, spec.stdin_data))
        if self._store is not None:
            self._store.save(session.id, session.record())

    async def _start_when_free(self, session: Session, lane: str) -> None:
        try:
            await self._lanes.acquire(lane, agent_of(session.scope))
        except asyncio.CancelledError:
            # Handed over, it stays queued: the next server queues it again from its record.
            if session.state is SessionState.QUEUED and not self._handed_over.is_set():
                session.fail_to_start("the supervisor shut down before a lane slot was free")
            raise
        if session.state is not SessionState.QUEUED:
            self._lanes.release(lane, agent_of(session.scope))  # killed while waiting
            return
        try:
            await self._launcher.launch_queued(session)
        except ProcpilotError as exc:
            session.fail_to_start(f"{exc.code}: {exc.message}")
        except Exception as exc:
            # A bug must still end the session: left QUEUED, it would never be reported.
            _log.exception("session %s failed to start", session.id)
            session.fail_to_start(f"InternalError: {type(exc).__name__}")

    async def _feed_stdin(self, session: Session, data: bytes) -> None:
        with contextlib.suppress(ProcpilotError, OSError):
            await session.write(data, eof=True)

    def _register(self, session: Session) -> None:
        self._sessions[session.id] = session
        self._unfinished.setdefault(agent_of(session.scope), set()).add(session.id)

    def _hand_to_holder(self, session: Session, spawned: Spawned) -> None:
        """Copies of the new session's descriptors to the holder, and what the next server needs
        in its record to adopt it: one sendmsg, nothing on disk."""
        restarts = self._restarts
        if restarts is None:
            return
        trees, limits = self._tree_backend, session.accounting.limit_backend
        roots: builtins.list[str] = []  # what the holder locks: the tree's, the group's, the limits' directories
        extra: dict[str, Any] = {
            "format": _RECORD_FORMAT,
            "owner": restarts.owner,
            "max_log_bytes": self.config.max_log_bytes,
            "server_pid": os.getpid(),  # its parent: the one that may still wait for it
        }
        if isinstance(trees, CgroupTrees):
            # Its agent's directory, if it is in one: the next server finds it there.
            extra["tree_root"] = os.path.dirname(trees.directory(session.id))
            roots.append(extra["tree_root"])
        if self._groups.base is not None and self._groups.has(session.id):
            # Our directory above the agent's is locked too: a sweep of dead servers' directories
            # (the next server's, or another procpilot's on this host) then leaves them running.
            extra["group_roots"] = [str(self._groups.base)]
            roots.append(extra["group_roots"][0])
        if isinstance(limits, CgroupV1Limits | CgroupV2Limits):
            paths = limits.roots_of(session.id)
            extra["limit_mechanism"] = limits.name
            extra["limit_roots"] = {c: str(p) for c, p in paths.items()}
            roots += [str(p) for p in paths.values()]
        if session.spec.timeout:
            extra["timeout"] = session.spec.timeout
        if not session.spec.notify_on_exit:
            extra["notify_on_exit"] = False
        session.custody.record = extra
        link = restarts.link
        session.custody.on_stdin_close = lambda: link.stdin_closed(session.id)
        self._hold(session, spawned, roots)

    def _hold(self, session: Session, spawned: Spawned, roots: builtins.list[str] | None = None) -> None:
        """Queue copies of the session's open descriptors for the holder (see _hold_now);
        ``roots``: the directories its record names (None: read from the record)."""
        restarts = self._restarts
        if restarts is None:
            return
        # Handed over otherwise than as an offer again (a new holder, a next run): a refusal of
        # it is news again, said and recorded (_reoffer_now marks its own after this).
        self._reoffered.discard(session.id)
        extra = session.custody.record
        if roots is None:
            roots = [str(extra["tree_root"])] if extra.get("tree_root") else []
            roots += [str(p) for p in extra.get("group_roots", [])]
            limit_roots = extra.get("limit_roots")
            roots += [str(p) for p in limit_roots.values()] if isinstance(limit_roots, dict) else []
        cap = int(extra.get("max_log_bytes") or self.config.max_log_bytes)
        session.custody.not_held = None  # until the holder refuses this hand-over
        session.custody.record.pop("not_held", None)
        self._not_held.discard(session.id)
        session.stdin.unpark(again=True)  # the holder's copy is sent from our table
        session.unpark_output()  # and so are its output ends
        restarts.link.add(session.id, spawned, session.output.directory / SPOOL_NAME, cap, roots)

    def _holder_refused(self, ids: builtins.list[str], why: str) -> None:
        """The holder took no copies of these (its table was full): they run on under us, our own
        descriptors untouched, but would not outlive us. Their views and records say so, and why."""
        refused = [s for sid in ids if (s := self._sessions.get(sid)) is not None and not s.finished]
        again = [s for s in refused if s.id in self._reoffered]
        if again and self._slowed_at != self._last_reoffer:
            # Offered again and refused again: no room yet. Offered half as often from now on
            # (once per offer, whatever number of messages its refusals come in), and neither
            # logged nor saved again (its record says so already).
            self._slowed_at = self._last_reoffer
            self._reoffer_every = min(_REOFFER_MAX, self._reoffer_every * 2)
        for session in refused:
            session.custody.not_held = why
            session.custody.record["not_held"] = why  # the next server's reason, if it finds it gone
            self._not_held.add(session.id)
        fresh = [s for s in refused if s.id not in self._reoffered]
        for session in fresh:
            self._save(session)
        if fresh:
            _log.warning(
                "%d session(s) would not survive a crash of this server (%s): %s",
                len(fresh),
                ", ".join(s.id for s in fresh[:_NOT_HELD_SHOWN]),
                why,
            )

    def _reoffer_soon(self) -> None:
        """Offer the sessions the holder refused to it again, at most once a second, less often
        while it refuses them again: room in its table comes back as held sessions end (or as its
        limit is raised), and a session it takes then survives this server after all."""
        if self._reoffer is not None or self._restarts is None or self._lifecycle.state.is_ending:
            return
        delay = max(0.0, self._last_reoffer + self._reoffer_every - time.monotonic())
        self._reoffer = asyncio.get_running_loop().call_later(delay, self._reoffer_now)

    def _reoffer_now(self) -> None:
        self._reoffer = None
        self._last_reoffer = time.monotonic()
        restarts = self._restarts
        if restarts is None or not restarts.link.connected or self._lifecycle.state.is_ending:
            return
        if not self._reoffered & self._not_held:
            self._reoffer_every = _REOFFER_EVERY  # the last ones were taken: room comes back
        # A batch at a time: one the holder refuses again costs a sendmsg of its descriptors.
        self._reoffered = set()
        for session_id in sorted(self._not_held)[:_REOFFER_BATCH]:
            session = self._still_not_held(session_id)
            spawned = session.spawned if session is not None else None
            if session is not None and spawned is not None:
                self._hold(session, spawned)  # not held until the holder refuses it again
                self._reoffered.add(session_id)
        restarts.link.flush()

    def _holder_lost(self) -> None:
        if not self._lifecycle.state.is_ending and (self._rehold is None or self._rehold.done()):
            self._rehold = self._spawn_task(self._hold_again())

    async def _hold_again(self) -> None:
        """The holder died while we live. Its copies died with it, ours did not: start another and
        hand it every running session again, so a crash of ours later still loses nothing."""
        restarts = self._restarts
        if restarts is None:
            return
        link = restarts.link
        for attempt in range(_REHOLD_TRIES):
            found = await asyncio.to_thread(link.open)  # starting a holder waits on its start-up
            if self._lifecycle.state.is_ending or link.mismatch:
                if found is not None:
                    found[0].close()
                    for copy in found[1]:
                        copy.close()
                return
            if found is not None:
                sock, held = found
                link.install(sock)
                for copy in held:
                    # Only if our connection broke while the holder lived: it drained our sessions
                    # meanwhile, so what it read is in their spools (ours are the live copies).
                    session = self._sessions.get(copy.id)
                    if session is not None and not session.finished:
                        replay_spool(session.output, session.output.directory)
                    copy.close()
                for session_id in link.unreturned:  # likewise, those it had no room to hand back
                    session = self._sessions.get(session_id)
                    if session is not None and not session.finished:
                        replay_spool(session.output, session.output.directory)
                for session in self._sessions.values():
                    spawned = session.spawned
                    if spawned is not None and not session.finished:
                        self._hold(session, spawned)
                link.flush()
                _log.warning("a new holder (pid %s) has every running session again", link.pid)
                return
            await asyncio.sleep(_REHOLD_DELAY * 2**attempt)

    def _adopt(self, held: builtins.list[HeldSession]) -> None:
        """Rebuild every session of our owner from its journal record: ended ones as they ended
        (readable until their TTL), ones between two runs with their next run on schedule, queued
        ones queued again, and running ones taken over.

        A running one held by the holder is adopted with its descriptors (output printed meanwhile
        replayed from the spool first, so the logs keep arrival order). Not held and its tree gone:
        it ended while no server ran; its status is what its shell recorded, else it is LOST. Not
        held and its tree alive: nothing kept its output, so it cannot be served: ended, LOST.
        Held but not handed back (the holder's table had no room: ``link.unreturned``) is not held
        here either: its tree is ended the same way and its error says why, but the holder
        recorded how its leader ended (SIGKILL), so it ends ``exited_error``, not LOST."""
        restarts, store = self._restarts, self._store
        if restarts is None or store is None:
            return
        if restarts.link.mismatch:
            # Another procpilot's holder keeps them: neither adopted nor ended here.
            _log.warning("running sessions left as they are: %s", restarts.link.problem)
            return
        by_id = {h.id: h for h in held}
        for session_id, record in store.load().items():
            if record.get("owner") != restarts.owner:
                continue
            if not isinstance(record.get("format"), int) or record["format"] > _RECORD_FORMAT:
                # Written by a newer procpilot: neither adopted nor touched, and said so.
                _log.warning(
                    "session %s was started by a newer procpilot (record format %r, this one reads %d):"
                    " left alone; stop this server and start the newer one",
                    session_id,
                    record.get("format"),
                    _RECORD_FORMAT,
                )
                newer = by_id.pop(session_id, None)
                if newer is not None:
                    newer.close()  # our copies only: the holder keeps its own for the newer server
                continue
            mine = by_id.pop(session_id, None)
            try:
                session = self._restore_one(record, mine)
            except (KeyError, TypeError, ValueError, OSError, ProcpilotError) as exc:
                _log.warning("session %s could not be restored: %s", session_id, exc)
                session = None
            unreturned = session_id in restarts.link.unreturned  # held, not handed back: ended above
            if (session is None or session.finished) and (mine is not None or unreturned):
                if mine is not None:
                    mine.close()
                restarts.link.forget(session_id)  # else its end makes the holder forget it
            if unreturned and record.get("state") in ("running", "restarting"):
                self._unreturned.append(session_id)
                self._unreturned_why = restarts.link.unreturned[session_id]
            if session is not None and record.get("state") in ("running", "restarting", "queued"):
                self.adopted.append(session_id)
        for stray in by_id.values():  # held, but no journal record says whose: let it go
            stray.close()
            restarts.link.forget(stray.id)
        if self._unreturned:
            _log.warning(
                "%d running session(s) were ended at start, the holder could not hand them back (%s): %s",
                len(self._unreturned),
                ", ".join(self._unreturned[:_NOT_HELD_SHOWN]),
                self._unreturned_why,
            )

    def _restore_one(self, record: dict[str, Any], held: HeldSession | None) -> Session | None:
        """One session from its record (see _adopt); None: nothing to restore."""
        restarts, store = self._restarts, self._store
        if restarts is None or store is None:
            return None
        recorded = SessionRecord.from_json(record)
        state, session_id = recorded.state, recorded.id
        directory = store.session_dir(session_id)
        output = SessionOutput.recover(directory, int(record.get("max_log_bytes") or self.config.max_log_bytes))
        if state in END_STATES:
            # Ended before this server: as it was, with nothing running and nothing held.
            session = self._rebuilt(record, recorded, output, self._tree_backend)
            session.restore_ended(state, recorded.ended_at)
            self._sessions[session_id] = session
            return session
        if state is SessionState.QUEUED or (state is SessionState.RESTARTING and recorded.next_run_at is not None):
            return self._resume(record, recorded, output, state, recorded.next_run_at or 0.0)
        return self._adopt_one(record, recorded, output, held)

    def _rebuilt(
        self, record: dict[str, Any], recorded: SessionRecord, output: SessionOutput, trees: TreeBackend
    ) -> Session:
        """The session a record describes, with its life so far and what the next server needs
        (``record``'s custody keys: its owner, its format, where its tree is)."""
        session = Session.from_record(recorded, output, trees, self._on_finish, kill_grace=self.config.kill_grace_sec)
        session.custody.record = {k: record[k] for k in _ADOPTION_KEYS if k in record}
        return session

    def _resume(
        self,
        record: dict[str, Any],
        recorded: SessionRecord,
        output: SessionOutput,
        state: SessionState,
        next_run_at: float,
    ) -> Session:
        """A session that was queued behind its lane (queued again) or between two runs (its next
        run on schedule) when its server went: no process of it runs, none is held."""
        spec = recorded.spec
        session = self._rebuilt(record, recorded, output, self._tree_backend)
        session.custody.record["format"] = _RECORD_FORMAT
        self._supervise(session)
        self._register(session)
        if self._restarts is not None:
            for leftover in (self._restarts.exit_file(session.id), self._restarts.record_file(session.id)):
                with contextlib.suppress(OSError):
                    leftover.unlink()  # the last run's: how it ended is in the record already
        if state is SessionState.QUEUED:
            if spec.lane is None:
                session.fail_to_start("the server stopped before this session could start")
            else:
                self._spawn_task(self._start_when_free(session, spec.lane))
            return session
        if spec.lane is not None:
            self._lanes.take(spec.lane, agent_of(session.scope))  # it held its slot between runs: it still does
        session.resume_between_runs(next_run_at)
        return session

    def _adopt_one(
        self, record: dict[str, Any], recorded: SessionRecord, output: SessionOutput, held: HeldSession | None
    ) -> Session | None:
        restarts, store = self._restarts, self._store
        if restarts is None or store is None:
            return None
        session_id, spec = recorded.id, recorded.spec
        directory = store.session_dir(session_id)
        replay_spool(output, directory)
        trees = restarts.trees_for(record.get("tree_root"), self._tree_backend)
        session = self._rebuilt(record, recorded, output, trees)
        session.backgrounded = True
        # What its files are in now: a session with no output yet begins in this version's layout.
        session.custody.record["format"] = _RECORD_FORMAT if output.layout == "once" else _PER_STREAM_FORMAT
        session.accounting.limit_backend = restarts.limits_for(record)
        self._supervise(session)
        self._register(session)
        if spec.lane is not None:
            self._lanes.take(spec.lane, agent_of(session.scope))  # released when it ends, as every run's slot
        pid = recorded.pid
        if pid is None:
            session.fail_to_start("the server stopped before this session could start")
            return session
        fds = held.fds if held is not None else {}
        try:
            alive = bool(trees.pids(session_id, pid))
        except MembershipUnknown:
            alive = True  # unknown is not gone: its leader is watched (and its tree ended) as a live one's
        if held is None and alive:
            # Its tree runs on, but its stdio died with the server: no output could be served.
            trees.signal(session_id, pid, signal.SIGKILL, leader_alive=False)
            fds = {}
        stdin = fds.get("stdin")
        inode = os.fstat(stdin).st_ino if stdin is not None else held.stdin_inode if held is not None else None
        spawned = Spawned(
            None,
            pid,
            None,  # not our child: its exit is polled for (engine/reaper.py)
            stdin,
            fds.get("stdout", -1),
            None if spec.pty else fds.get("stderr", -1),
            f"pipe:[{inode}]" if inode is not None and not spec.pty else None,
            stdin_token=held.stdin_token if held is not None else None,
        )
        if held is not None:
            held.stdin_token = None  # the session's from now on
        for fd in fds.values():
            os.set_blocking(fd, False)
        exited = held.exited if held is not None else True
        if exited and spec.notify_on_exit:
            session.custody.ended_in_outage = True
        exit_file, kept = restarts.exit_file(session_id), restarts.record_file(session_id)
        # A live leader the holder watches: a holder that records exits writes how it ends.
        watched = held is not None and held.watched
        exit_recorded = restarts.link.records is not None and watched and not exited
        if held is None and alive:
            session.error = "its output had nobody to hold it while no server ran, so it was ended"
        if held is None and record.get("not_held"):
            # Its server knew, and said so while it ran: this is why.
            session.error = f"it did not survive its server: {record['not_held']}"
        unreturned = restarts.link.unreturned.get(session_id) if held is None else None
        if unreturned is not None:
            # Held, but not handed back whole (its tree ended above): never adopted in part (an
            # output end missing would read as its end while the command prints on), and this is why.
            session.error = f"this server could not take it over, so it was ended: {unreturned}"
        # Ours to wait for again (not the reaper's that ran while no supervisor was open), unless
        # that one reaped it already: then its status is in its record, and its pid anyone's.
        own_child = record.get("server_pid") == os.getpid() and take_back(pid)
        session.adopt(
            spawned,
            started_at=recorded.started_at or session.created_at,
            run_started_at=recorded.run_started_at,
            leader_exited=exited or (not alive and not watched),
            read_status=lambda: leader_status(pid, exit_file, kept, own_child=own_child, recorded=exit_recorded),
        )
        link = restarts.link
        session.custody.on_stdin_close = lambda: link.stdin_closed(session_id)
        return session

    def _on_finish(self, session: Session) -> None:
        self._launcher.finished(session)
        self._not_held.discard(session.id)
        if self._not_held:
            # A held session's end frees room in the holder's table: the refused may fit now.
            self._reoffer_soon()
        unfinished = self._unfinished.get(agent_of(session.scope))
        if unfinished is not None:
            unfinished.discard(session.id)
            if not unfinished:
                del self._unfinished[agent_of(session.scope)]
        if session.spec.lane is not None and session.started_at is not None:
            self._lanes.release(session.spec.lane, agent_of(session.scope))
        if self._store is not None and session.id in self._sessions:
            if self._restarts is not None and session.final_usage is None:
                # Measured now, while its rusage and samples are here: a later server has neither.
                session.final_usage = self.usage.usage(session)
            if isinstance(self._store, OrderedLater):
                # As it is now, written once the caller waiting for it has run (store.py).
                self._store.save_soon(session.id, session.record())
            else:
                self._store.save(session.id, session.record())  # a crash a moment later must find it
        if session.custody.ended_in_outage:
            pending = self._outage_exits.setdefault(session.scope, {})
            if len(pending) < _MAX_OUTAGE_EXITS:
                pending[session.id] = session.exit_info(self.tail_text(session))
        if session.spec.notify_on_exit and self.exits.has_listeners:
            self.exits.publish(session.exit_info(self.tail_text(session)))

    # -- queries -------------------------------------------------------------------------------

    def get(self, scope: str, session_id: str) -> Session:
        """``scope``'s session by id, by name, or by a prefix of its id that fits no other.

        A name means the live session of that name (names are unique among live sessions), or
        else the newest ended one; an exact id always wins over a name or prefix. A prefix that
        fits several sessions is an ``AmbiguousSession`` naming them.
        """
        session = self._sessions.get(session_id)
        if session is None or session.scope != scope:
            session = self._resolve(scope, session_id)
        session.last_access = time.monotonic()
        return session

    def _resolve(self, scope: str, ref: str) -> Session:
        mine = [s for s in self._sessions.values() if s.scope == scope]
        named = sorted((s for s in mine if s.name == ref), key=lambda s: (not s.finished, s.created_at))
        if named:
            return named[-1]
        fits = [s for s in mine if ref and s.id.startswith(ref)]
        if len(fits) == 1:
            return fits[0]
        if fits:
            shown = ", ".join(f"{s.id}" + (f" ({s.name})" if s.name else "") for s in fits[:10])
            more = f" and {len(fits) - 10} more" if len(fits) > 10 else ""
            raise AmbiguousSession(
                f"{ref!r} fits {len(fits)} sessions: {shown}{more}",
                session_id=ref,
                candidates=[s.id for s in fits[:10]],
            )
        raise SessionNotFound(f"no session {ref!r}", session_id=ref)

    def list(self, scope: str) -> builtins.list[Session]:
        """This scope's sessions, newest first."""
        mine = [s for s in self._sessions.values() if s.scope == scope]
        mine.sort(key=lambda s: s.created_at, reverse=True)
        return mine

    def all_sessions(self) -> builtins.list[Session]:
        return list(self._sessions.values())

    def lane_usage(self, scope: str | None = None) -> dict[str, tuple[int, int, int]]:
        """(active, waiting, cap) per lane in use: ``scope``'s, or every scope's keyed ``scope/lane``."""
        return self._lanes.usage(None if scope is None else agent_of(scope))

    async def observe(self, sessions: Sequence[Session]) -> None:
        """Bring what ``sessions`` say of their trees (usage, waiting for input) up to date before
        a result shows it: a cluster asks the nodes that run them; on one host each session reads
        its own tree when asked, so there is nothing to do."""
        await self._launcher.observe(sessions)

    def tail_text(self, session: Session, chars: int = _TAIL_CHARS) -> str:
        view = session.output[Stream.COMBINED]
        size = view.size
        if not size:
            return ""  # a silent command (most exit events the daemon hears): nothing to read or render
        raw = view.read(max(0, size - chars * 4)).data
        return tail_chars(for_model(raw), chars)[0]

    # -- actions -------------------------------------------------------------------------------

    async def run(self, spec: SpawnSpec, *, scope: str, yield_ms: int | None) -> Session:
        """Start ``spec`` and wait up to ``yield_ms`` for it; still running then, it is backgrounded.

        ``yield_ms=None`` waits for the end; ``0`` returns at once. The process is never
        restarted or interrupted by the hand-over: it is the same session either way.
        """
        # Not spawn(): the hand-over to the holder waits until the session outlives its yield.
        session = await self._spawn(spec, scope)
        timeout = None if yield_ms is None else yield_ms / 1000
        if timeout != 0:
            await session.wait_finished(timeout)
        if not session.finished:
            session.backgrounded = True
            self._hold_now()
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

        A pattern is matched in a worker thread and gets at most half a second per scan: past that
        it is an ``InvalidPattern`` (catastrophic backtracking), and the event loop, which every
        other session and agent needs, never waits for it.
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
                try:
                    text, found = await asyncio.get_running_loop().run_in_executor(
                        _PATTERN_SCANS, _search, matcher, carry, data[:keep]
                    )
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
            if self._handed_over.is_set():
                raise ProcpilotError(
                    f"this server handed session {session_id} over to the next one while waiting",
                    hints={"retry": "Call again: the next server has the session (same id)."},
                )
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return WaitOutcome("timeout")
            if matcher is None and self._restarts is None:
                await session.wait_finished(remaining)
            elif matcher is None:
                await self._finished_or_handed_over(session, remaining)
            else:
                await session.output.wait_for_change(remaining)  # a detach closes the output: it wakes

    async def _finished_or_handed_over(self, session: Session, timeout: float | None) -> None:
        """``session.wait_finished``, cut short when this server hands its sessions over (a wait
        must not hold the old server's exit up: its caller retries on the next one)."""
        finished = asyncio.ensure_future(session.wait_finished(timeout))
        handed = asyncio.ensure_future(self._handed_over.wait())
        try:
            async with waiting():  # given back here, not in the task: that one is cancelled
                await asyncio.wait({finished, handed}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            finished.cancel()
            handed.cancel()

    def clear(self, scope: str, session_id: str) -> None:
        """Forget a finished session and delete its files."""
        session = self.get(scope, session_id)
        if not session.finished:
            raise SessionStillRunning(f"session {session_id} is still {session.state.value}")
        self._forget(session)

    def keep_face_data(self, session: Session, face: str, value: Any) -> None:
        """Set what ``face`` keeps of ``session`` (``Session.face_data``; None drops it) and write
        the session's record at once: a server killed outright a moment later leaves it to the
        next one, which restores it with the session."""
        if value is None:
            session.face_data.pop(face, None)
        else:
            session.face_data[face] = value
        self._save(session)

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
        missed = self._outage_exits.get(session.scope)
        if missed is not None and missed.pop(session.id, None) is not None and not missed:
            del self._outage_exits[session.scope]
        session.output.remove_files()
        if self._store is not None:
            self._store.delete(session.id)
        self._launcher.forgotten(session)

    def sweep(self, now: float | None = None) -> builtins.list[str]:
        """Remove finished sessions idle for longer than the TTL; returns their ids. The others
        read since their last record get a new one: their TTL clock goes on after a crash too."""
        now = time.monotonic() if now is None else now
        ttl = self.config.session_ttl_sec
        expired = [s for s in self._sessions.values() if s.finished and now - s.idle_since > ttl]
        for session in expired:
            self._forget(session)
        if self._restarts is not None and self._store is not None:
            for session in self._sessions.values():
                if session.finished and session.last_access > session.recorded_access:
                    self._store.save(session.id, session.record())
        return [s.id for s in expired]

    # -- events --------------------------------------------------------------------------------

    def outage_exits(self, scope: str) -> builtins.list[ExitInfo]:
        """The exits of ``scope``'s sessions that ended while no server ran, oldest first, for each
        listener of that scope to hear as it connects (an SSE stream, an MCP listen stream, a
        WebSocket), as long as the session is kept: which client was told cannot be known, only
        which connection."""
        return builtins.list(self._outage_exits.get(scope, {}).values())

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


class LocalLauncher:
    """Sessions on this host: process groups or cgroups, limits, the warm pool, the holder. The
    supervisor's own machinery, reached through the Launcher seam (engine/launcher.py)."""

    def __init__(self, supervisor: Supervisor) -> None:
        self._sup = supervisor

    def bind(self, host: LaunchHost) -> None:
        """Nothing to take: the local launcher is the supervisor's own machinery."""

    async def open(self) -> None:
        """Nothing beyond the supervisor's own start."""

    async def launch(self, spec: SpawnSpec, scope: str, session_id: str | None) -> Session:
        sup = self._sup
        return await sup._spawn_checked(spec, scope, sup._open_store(), session_id)

    async def launch_queued(self, session: Session) -> None:
        await self._sup._start(session)

    def finished(self, session: Session) -> None:
        sup = self._sup
        sup._groups.leave(session.id)  # its trees are gone: its agent's group, if its last
        if sup._warm is not None:
            sup._warm.refill_soon()
        if sup._restarts is not None:
            sup._restarts.link.forget(session.id)
            if session.custody.adopted:  # what recorded its end, whichever was not needed
                for record in (sup._restarts.exit_file(session.id), sup._restarts.record_file(session.id)):
                    with contextlib.suppress(OSError):
                        record.unlink()
        if session.left_orphans:
            # Orphans the tree left with us (we are their subreaper) are zombies now: reap them.
            reap_orphans()

    def forgotten(self, session: Session) -> None:
        """Its files went with the supervisor's record of it: nothing else keeps it here."""

    async def close(self, grace: float) -> None:
        """The supervisor's shutdown ended every local tree already."""

    async def observe(self, sessions: Sequence[Session]) -> None:
        """Each local session reads its own tree when asked: nothing to bring up to date."""

    def capabilities(self) -> dict[str, Any]:
        return {}
