"""One session: a process tree, its stdio, its output and its lifecycle.

The session is driven by the event loop: pipe fds are registered as readers and the leader's exit
comes through the loop's one SIGCHLD watcher (engine/reaper.py; a pidfd where there is none), so
output is written to disk the moment it arrives and exit is seen without a polling tick. (Past
half the descriptor table, a quiet session's pipes wait out of it, watched by the supervisor's
one epoll, until they speak, the leader exits, or a new holder needs copies: engine/output_parking.py.)
"Finished" means the leader has been reaped **and** every output pipe has reached EOF and been
written out; only then does the session enter its end state and announce its exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import logging
import os
import resource
import signal
import struct
import termios
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from procpilot.engine import children
from procpilot.engine.capture import LineSlice, ReadResult, SessionOutput, Stream
from procpilot.engine.keys import TerminalModes
from procpilot.engine.limits import LimitBackend, LimitReport
from procpilot.engine.procfs import read_small
from procpilot.engine.reaper import ExitWatcher, LeaderPoll
from procpilot.engine.records import SessionRecord
from procpilot.engine.spawn import Spawned, SpawnSpec, open_pidfd
from procpilot.engine.states import SessionState, check_transition
from procpilot.engine.stdin import StdinWriter
from procpilot.engine.trees import MembershipUnknown, TreeBackend, waiting_for_input
from procpilot.engine.usage import Usage
from procpilot.errors import ProcessAlreadyExited
from procpilot.turns import short_run, waiting

if TYPE_CHECKING:  # the supervisor's; a session only calls it
    from procpilot.engine.output_parking import OutputParking

__all__ = ["ExitAccounting", "ExitInfo", "RestartCycle", "Session"]

_log = logging.getLogger(__name__)

_READ_SIZE = 1 << 20
# After the leader exits, descendants it left behind get this long before SIGKILL.
_ORPHAN_GRACE = 1.0
# ... and the pipes this much longer to reach EOF before we stop waiting for them.
_DRAIN_DEADLINE = 3.0
# After a signal other than SIGKILL, when to look for processes that joined the tree since (see
# Session._signal_latecomers), in seconds.
_LATE_SIGNAL_CHECKS = (0.02, 0.1, 0.4)
_LATE_SIGNAL_MAX_TREE = 256  # processes; a bigger tree is signalled once, as it is
_LATE_SIGNAL_YOUNG = 1.0  # seconds into a run: a run signalled later is signalled once
_STORE_RETRY = 0.02  # seconds before a read that waited for a descriptor is tried again
# How long an adopted session's end waits for the holder's record of it: the holder sees the same
# pidfd turn readable and writes within milliseconds; this only bounds a holder that died meanwhile.
_RECORD_WAIT = 2.0
# A tree whose members cannot be read (engine/trees.py MembershipUnknown) is looked at again after
# this long, doubling up to the most: the session waits, it never ends on a failed read.
_UNKNOWN_RETRY = (0.05, 1.0)
_EAGER_READS = 3  # reads of one pipe in Session._read_ends_now, at most
_PARKED = -2  # an output descriptor's number while it is parked (engine/output_parking.py); -1: at EOF


@dataclass(frozen=True, slots=True)
class ExitInfo:
    """What an exit event carries."""

    session_id: str
    scope: str
    state: SessionState
    exit_code: int | None
    exit_signal: str | None
    duration_ms: int
    tail: str
    backgrounded: bool
    command: str
    node: str | None = None  # on a cluster, the node that ran it


@dataclass(slots=True)
class ExitAccounting:
    """What a session's tree leaves to account for its resources once it is over (usage.py reads
    it): the leader's rusage from wait4, its I/O read as a zombie, and the limit backend's report."""

    rusage: Any = None  # resource.struct_rusage of the leader, from wait4
    # Our own peak RSS (KiB) when the child started: a vfork'd child inherits it into its
    # ru_maxrss, so only an ru_maxrss above it is the tree's own peak.
    spawner_maxrss_kb: int = 0
    # (rchar, wchar) of the leader read as a zombie: its I/O plus every descendant it reaped.
    exit_io: tuple[int, int] | None = None
    # The backend holding this session's limits (None: no limit asked for), and what it reported
    # when the session ended (an OOM kill, a peak).
    limit_backend: LimitBackend | None = None
    limit_report: LimitReport | None = None


@dataclass(slots=True)
class Run:
    """One run of a session's command: its process, the descriptors still read, how far its end
    has come. A restart policy's next run is a new one; the session (its id, output, record and
    stdin writer) goes on."""

    spawned: Spawned | None = None
    pid: int | None = None
    open_streams: int = 0  # output descriptors not at EOF yet
    leader_reaped: bool = False
    reaper_armed: bool = False  # a kill of what the leader left behind is due
    left_orphans: bool = False  # True iff processes outlived the leader (they are now ours to reap)
    unknown_looks: int = 0  # looks in a row that could not read the tree (for their backoff)
    unknown_said: bool = False  # True once such a look is logged (once per run)
    accounting: ExitAccounting = field(default_factory=ExitAccounting)
    terminal: TerminalModes = field(default_factory=TerminalModes)  # followed from the output under a pty only
    paused_reads: dict[int, asyncio.TimerHandle] = field(default_factory=dict)  # fd: when its reading resumes


@dataclass(slots=True)
class RestartCycle:
    """Where a session with a restart policy is between its runs: short runs in a row (for the
    backoff), when the current run started, the timer of the next one, whether one is due, and
    who starts it (the supervisor)."""

    quick_failures: int = 0
    run_t0: float = field(default_factory=time.monotonic)
    next_run: asyncio.TimerHandle | None = None
    next_run_at: float | None = None  # wall-clock time of the next run, while one is due (for the record)
    respawning: bool = False
    hook: Callable[[Session], None] | None = None
    # Told when the session starts waiting for its next run (the supervisor keeps the record).
    on_wait: Callable[[Session], None] | None = None


def signal_name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"SIG{sig}"


def _zombie_io(pid: int) -> tuple[int, int] | None:
    """The leader's (rchar, wchar), or None when they cannot be read. The kernel writes them as
    the first two lines (``rchar: N``, ``wchar: N``): read there, on the exit's path, without a
    parse of the five lines after them; anything else is looked for by name."""
    try:
        data = read_small(f"/proc/{pid}/io")
        lines = data.split(b"\n", 2)
        if len(lines) > 1 and lines[0].startswith(b"rchar:") and lines[1].startswith(b"wchar:"):
            return int(lines[0][6:]), int(lines[1][6:])
        fields = dict(line.split(b":", 1) for line in data.splitlines() if b":" in line)
        return int(fields[b"rchar"]), int(fields[b"wchar"])
    except (OSError, KeyError, ValueError):
        return None


@dataclass(slots=True)
class Custody:
    """What ties a session to the servers before and after this one (engine/holder.py)."""

    # Called just before our stdin copy closes: another holder of it (the holder) must let go
    # too, or the child would never see EOF.
    on_stdin_close: Callable[[], None] | None = None
    # A previous server started it (Session.adopt): we are not its leader's parent, so its exit
    # status comes from the kernel's record the holder kept or what its shell wrote, through
    # read_status, or nowhere (LOST, with why).
    adopted: bool = False
    ended_in_outage: bool = False  # adopted already ended: its exit was announced to nobody yet
    read_status: Callable[[], int | str | None] | None = None
    record: dict[str, Any] = field(default_factory=dict)  # what the supervisor keeps for the next server
    # Why the holder keeps no copy of this run's descriptors (it refused them: its table was
    # full), so it would not survive a crash of its server; None: held, or no holder asked.
    not_held: str | None = None


class Session:
    def __init__(
        self,
        session_id: str,
        scope: str,
        spec: SpawnSpec,
        output: SessionOutput,
        trees: TreeBackend,
        on_finish: Callable[[Session], None],
        *,
        kill_grace: float = 5.0,
    ) -> None:
        # What it is (identity, spec, life, exit, counters, face data): the journal writes this.
        self.info = SessionRecord(session_id, scope, spec)
        self.output = output
        self._t0 = time.monotonic()
        self._t_end: float | None = None
        self.last_access = time.monotonic()
        self.recorded_access = self.last_access  # last_access as the latest record says it
        self.run = Run()  # the current run (the last one between two runs, and once ended)
        self.stdin = StdinWriter(session_id, pty=spec.pty, before_close=self._stdin_closing)
        self.parking: OutputParking | None = None  # where quiet output ends wait (the supervisor's)
        self._input_check: tuple[bool, float] | None = None  # the last waiting_for_input, and when
        self._trees = trees
        self._on_finish = on_finish
        self._requested_end: SessionState | None = None
        self.kill_grace = kill_grace
        self._timers: list[asyncio.TimerHandle] = []
        self._finished = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        self.cycle = RestartCycle()
        self.custody = Custody()

    @classmethod
    def from_record(
        cls,
        record: SessionRecord,
        output: SessionOutput,
        trees: TreeBackend,
        on_finish: Callable[[Session], None],
        *,
        kill_grace: float = 5.0,
    ) -> Session:
        """The session a record describes (a previous server wrote it), with its life so far; its
        state is then given by how it is taken up (``restore_ended``, ``resume_between_runs``,
        ``adopt``)."""
        session = cls(record.id, record.scope, record.spec, output, trees, on_finish, kill_grace=kill_grace)
        session.restore(record)
        return session

    # -- the record: what the session is -------------------------------------------------------
    # Read and written through the session (faces read ``session.exit_code``); kept in ``info``.

    @property
    def id(self) -> str:
        return self.info.id

    @property
    def scope(self) -> str:
        return self.info.scope

    @property
    def spec(self) -> SpawnSpec:
        """As admitted: what every run of it starts from."""
        return self.info.spec

    @property
    def state(self) -> SessionState:
        return self.info.state

    @state.setter
    def state(self, value: SessionState) -> None:
        self.info.state = value

    @property
    def created_at(self) -> float:
        return self.info.created_at

    @property
    def started_at(self) -> float | None:
        return self.info.started_at

    @started_at.setter
    def started_at(self, value: float | None) -> None:
        self.info.started_at = value

    @property
    def ended_at(self) -> float | None:
        return self.info.ended_at

    @ended_at.setter
    def ended_at(self, value: float | None) -> None:
        self.info.ended_at = value

    @property
    def exit_code(self) -> int | None:
        return self.info.exit_code

    @exit_code.setter
    def exit_code(self, value: int | None) -> None:
        self.info.exit_code = value

    @property
    def exit_signal(self) -> str | None:
        return self.info.exit_signal

    @exit_signal.setter
    def exit_signal(self, value: str | None) -> None:
        self.info.exit_signal = value

    @property
    def error(self) -> str | None:
        return self.info.error

    @error.setter
    def error(self, value: str | None) -> None:
        self.info.error = value

    @property
    def backgrounded(self) -> bool:
        return self.info.backgrounded

    @backgrounded.setter
    def backgrounded(self, value: bool) -> None:
        self.info.backgrounded = value

    @property
    def node(self) -> str | None:
        """The cluster node that runs it; None: this host."""
        return self.info.node

    @node.setter
    def node(self, value: str | None) -> None:
        self.info.node = value

    @property
    def timed_out_waiting_for_input(self) -> bool:
        return self.info.timed_out_waiting_for_input

    @timed_out_waiting_for_input.setter
    def timed_out_waiting_for_input(self, value: bool) -> None:
        self.info.timed_out_waiting_for_input = value

    @property
    def signals_sent(self) -> list[tuple[str, int]]:
        """Every signal procpilot sent the tree, with when (ms since the run started): a kill's or
        a timeout's result tells the agent what was sent, not only how it ended."""
        return self.info.signals_sent

    @property
    def final_usage(self) -> Usage | None:
        """Its resources over its whole life, once it ended: kept in its record (a server that
        restores it after a restart has no rusage or samples of its own to measure it from)."""
        return self.info.final_usage

    @final_usage.setter
    def final_usage(self, value: Usage | None) -> None:
        self.info.final_usage = value

    @property
    def restarts(self) -> int:
        """Runs after the first (spec.restart)."""
        return self.info.restarts

    @restarts.setter
    def restarts(self, value: int) -> None:
        self.info.restarts = value

    @property
    def face_data(self) -> dict[str, Any]:
        """What faces keep of it under their own names (``SessionRecord.face_data``)."""
        return self.info.face_data

    @face_data.setter
    def face_data(self, value: dict[str, Any]) -> None:
        self.info.face_data = value

    # -- the current run -----------------------------------------------------------------------

    @property
    def pid(self) -> int | None:
        return self.run.pid

    @pid.setter
    def pid(self, value: int | None) -> None:  # a cluster node's record says it (cluster/remote.py)
        self.run.pid = value

    @property
    def accounting(self) -> ExitAccounting:
        return self.run.accounting

    @property
    def terminal(self) -> TerminalModes:
        return self.run.terminal

    @property
    def left_orphans(self) -> bool:
        """True iff processes outlived the current run's leader (they are ours to reap)."""
        return self.run.left_orphans

    # -- views ---------------------------------------------------------------------------------

    @property
    def command(self) -> str:
        return self.spec.display

    @property
    def name(self) -> str | None:
        return self.spec.name

    @property
    def is_running(self) -> bool:
        """Started and not ended: a run is on, or (RESTARTING) the next one is due."""
        return self.state is SessionState.RUNNING or self.state is SessionState.RESTARTING

    @property
    def spawned(self) -> Spawned | None:
        """Its process and the descriptors still open (a closed one is -1 or None)."""
        return self.run.spawned

    @property
    def terminating(self) -> bool:
        """True iff an end was asked for (kill, timeout, a limit) and the tree is not gone yet."""
        return self._requested_end is not None and not self._finished.is_set()

    @property
    def finished(self) -> bool:
        return self._finished.is_set()

    @property
    def idle_since(self) -> float:
        """Monotonic time of the last read or of the end, whichever is later (for the TTL)."""
        return max(self.last_access, self._t_end or 0.0)

    @property
    def duration_ms(self) -> int:
        end = self._t_end if self._t_end is not None else time.monotonic()
        return int((end - self._t0) * 1000)

    @property
    def signal_sent(self) -> str | None:
        """The last signal procpilot sent to this session's tree, if any."""
        return self.info.signal_sent

    @signal_sent.setter
    def signal_sent(self, value: str | None) -> None:  # a cluster node's record says it (cluster/remote.py)
        self.info.signal_sent = value

    @property
    def waiting_for_input(self) -> bool:
        """Best effort: a process of this session is blocked reading the stdin we hold open."""
        probe = self.input_probe()
        if probe is None:
            return False
        found = probe()
        self.note_input_check(found)
        return found

    def input_probe(self) -> Callable[[], bool] | None:
        """What :attr:`waiting_for_input` reads (/proc, for the whole tree: ~0.1 ms), as a function
        safe to run in a worker thread; None when it is False without a look."""
        spawned = self.run.spawned
        if not self.is_running or not self.stdin_open or spawned is None or self.pid is None:
            return None
        trees, session_id, leader, target = self._trees, self.id, self.pid, spawned.stdin_target
        leader_alive = not self.run.leader_reaped

        def probe() -> bool:
            try:
                members = trees.pids(session_id, leader)
            except MembershipUnknown:
                members = set()  # best effort: the leader alone this time
            return waiting_for_input(members | ({leader} if leader_alive else set()), target)

        return probe

    def note_input_check(self, found: bool) -> None:
        """What a probe (``input_probe``) found, now: ``last_waiting_for_input`` answers with it."""
        self._input_check = (found, time.monotonic())

    def last_waiting_for_input(self, max_age: float) -> bool | None:
        """The answer of :attr:`waiting_for_input` found at most ``max_age`` seconds ago, or None.

        Each check reads /proc for every process of the tree (~0.1 ms): a list of a thousand
        sessions reuses recent answers rather than checking every one on every call."""
        if self._input_check is None or not self.is_running:
            return None
        found, when = self._input_check
        return found if time.monotonic() - when <= max_age else None

    def usage_report(self) -> Usage | None:
        """The tree's usage as measured where it runs, when that is not this host (a cluster
        node's last report, or the final figures a record kept); None: this host's usage
        tracker samples the tree itself."""
        return self.final_usage

    async def page(self, stream: Stream, offset: int = 0, limit: int | None = None) -> ReadResult:
        """Bytes of a view as its log holds them: here, this host's files (a session on a cluster
        node pages them from its node). Every face that pages a log reads through this."""
        return self.output[stream].read(offset, limit)

    async def page_lines(
        self, stream: Stream, first: int, count: int | None, max_bytes: int | None = None, *, keep_end: bool = False
    ) -> LineSlice:
        """Lines of a view, as :meth:`SegmentedLog.read_lines` reads them, wherever the log is."""
        return self.output[stream].read_lines(first, count, max_bytes, keep_end=keep_end)

    @property
    def log_files(self) -> list[str]:
        """The files that hold this session's combined output, oldest first: none (and no
        directory) until its first byte."""
        return sorted(str(p) for p in self.output.directory.glob("combined.*"))

    def _set_state(self, new: SessionState) -> None:
        check_transition(self.state, new)
        self.state = new

    # -- start ---------------------------------------------------------------------------------

    def attach(self, spawned: Spawned) -> None:
        """Take over a freshly started child: watch its pipes and its exit (a restart's child too:
        the session, its times and its output go on)."""
        self.run.spawned = spawned
        self.pid = spawned.pid
        self.cycle.run_t0 = time.monotonic()
        if self.state is not SessionState.RESTARTING:
            self._t0 = self.cycle.run_t0
            self.started_at = time.time()
        else:  # a restart: the last run's ending is the log's now
            self.exit_code = self.exit_signal = None
        self._set_state(SessionState.RUNNING)
        # Our own child from now on, whoever started the run before (a restarted adopted session).
        self.custody.adopted = self.custody.ended_in_outage = False
        self.custody.read_status = None
        self.cycle.respawning = False
        self.cycle.next_run_at = None
        self.accounting.spawner_maxrss_kb = _spawner_maxrss_kb()
        self.stdin.use(spawned)
        streams = [(spawned.stdout_fd, Stream.STDOUT)]
        if spawned.stderr_fd is not None:
            streams.append((spawned.stderr_fd, Stream.STDERR))
        for fd, stream in streams:
            self.run.open_streams += 1
            self._loop.add_reader(fd, self._on_readable, fd, stream)
        self._offer_output()
        self._watch_leader(spawned)
        if self.spec.timeout:
            self._timers.append(self._loop.call_later(self.spec.timeout, self._on_timeout))

    def _watch_leader(self, spawned: Spawned) -> None:
        # Our own child: the loop's one SIGCHLD watcher sees its exit (engine/reaper.py), so the
        # run holds no pidfd (a warm shell's is closed); without a watcher, a pidfd, else a poll.
        watcher = ExitWatcher.of(self._loop)
        if watcher is not None:
            if spawned.pidfd is not None:
                os.close(spawned.pidfd)
                spawned.pidfd = None
            watcher.watch(spawned.pid, self._on_leader_exit)
            return
        if spawned.pidfd is None:
            spawned.pidfd = open_pidfd(spawned.pid)
        if spawned.pidfd is not None:
            self._loop.add_reader(spawned.pidfd, self._on_leader_exit)
        else:
            self._poll_leader()

    def adopt(
        self,
        spawned: Spawned,
        *,
        started_at: float,
        leader_exited: bool,
        read_status: Callable[[], int | str | None],
        run_started_at: float | None = None,
    ) -> None:
        """Take over a running session a previous server started (its descriptors came back from
        the holder; a stream already at EOF has fd -1, a pidfd already spent is None).

        ``read_status`` gives the leader's exit status (negative: the signal) as it was recorded
        while we were not its parent, or why it is unknown (a str: the session ends LOST, never
        with an invented exit), or None: not recorded yet, ask again shortly."""
        self.run.spawned = spawned
        self.pid = spawned.pid
        self.custody.adopted = True
        self.custody.read_status = read_status
        self.started_at = started_at
        self._t0 = _monotonic_at(started_at)
        # The backoff goes on from how long this run has lasted, not from the adoption.
        self.cycle.run_t0 = _monotonic_at(run_started_at or started_at)
        self._set_state(SessionState.RUNNING)
        self.stdin.use(spawned)
        for fd, stream in ((spawned.stdout_fd, Stream.STDOUT), (spawned.stderr_fd, Stream.STDERR)):
            if fd is not None and fd >= 0:
                self.run.open_streams += 1
                self._loop.add_reader(fd, self._on_readable, fd, stream)
        self._offer_output()
        if self.spec.timeout:
            left = self.spec.timeout - (time.time() - started_at)
            self._timers.append(self._loop.call_later(max(0.0, left), self._on_timeout))
        if leader_exited:
            self._loop.call_soon(self._adopted_leader_gone)
        elif spawned.pidfd is not None:
            self._loop.add_reader(spawned.pidfd, self._adopted_leader_gone)
        elif _our_child(spawned.pid) and (watcher := ExitWatcher.of(self._loop)) is not None:
            # A detach and an adoption in one process: still our child, a zombie once it ends
            # (there for /proc to see) until read_status reaps it.
            watcher.watch(spawned.pid, self._adopted_leader_gone)
        else:
            LeaderPoll.of(self._loop).watch(spawned.pid, self._adopted_leader_gone)

    def _adopted_leader_gone(self) -> None:
        spawned = self.run.spawned
        if spawned is None or self.run.leader_reaped:
            return
        self.run.leader_reaped = True  # reaped by whoever its parent is now, never by us
        if spawned.pidfd is not None:
            self._loop.remove_reader(spawned.pidfd)
            os.close(spawned.pidfd)
            spawned.pidfd = None
        self._settle_status(time.monotonic() + _RECORD_WAIT)

    def _settle_status(self, deadline: float) -> None:
        read = self.custody.read_status
        status = read() if read is not None else "nothing recorded it"
        if status is None:
            if time.monotonic() < deadline:
                self._timers.append(self._loop.call_later(0.01, self._settle_status, deadline))
                return
            status = f"the holder wrote no exit record within {_RECORD_WAIT:g} s"
        if isinstance(status, str):
            if self._requested_end is None:  # ended by our own signal: that is how it ended
                self.error = self.error or f"its exit status is unknown ({status})"
        elif status < 0:
            self.exit_signal = signal_name(-status)
        else:
            self.exit_code = status
        self._after_leader_exit()

    def fail_to_start(self, message: str, *, end: SessionState = SessionState.FAILED_TO_START) -> None:
        """End a session that never ran: it could not start, or was cancelled while queued (KILLED)."""
        self.error = message
        self._set_state(end)
        self._t_end = time.monotonic()
        self.ended_at = time.time()
        self.output.mark_closed()
        self._finished.set()
        self._on_finish(self)

    # -- output --------------------------------------------------------------------------------

    def _on_readable(self, fd: int, stream: Stream) -> None:
        if self._read_chunk(fd, stream) == 0:
            self._maybe_finish()

    def _read_chunk(self, fd: int, stream: Stream) -> int:
        """One read of ``fd`` into the log: 1 if it gave bytes, 0 at EOF (the stream is closed
        then), -1 if nothing can be read now (none waiting, or no descriptor for the log)."""
        # The files are opened (the first time: made) before the read, not between it and the
        # write: a server killed -9 there loses what it read, so that window is kept to the read
        # and two pwrites. A pty's FIONREAD says 0 while its bytes are still on their way to the
        # master, so under a pty the files are opened whatever it says.
        if not self.output.is_open and (self.spec.pty or _unread(fd)) and not self.output.ready():
            # Out of descriptors for the log's file (EMFILE): bytes read now would be lost. They
            # wait in the pipe (a command that fills it blocks) and reading resumes shortly.
            self._loop.remove_reader(fd)
            self.run.paused_reads[fd] = self._loop.call_later(_STORE_RETRY, self._resume_reading, fd, stream)
            return -1
        try:
            data = os.read(fd, _READ_SIZE)
        except BlockingIOError:
            return -1
        except OSError as exc:
            # A pty master reads EIO once every holder of the slave side has gone: that is EOF.
            if exc.errno != errno.EIO:
                raise
            data = b""
        if data:
            self.output.append(stream, data)
            if self.spec.pty:
                self.terminal.feed(data)
            return 1
        self._close_stream(fd, settle=False)
        return 0

    def _read_ends_now(self) -> None:
        """Read each open pipe to its end now, as far as it has one: called once the leader is
        reaped and its tree seen empty, when no process of the tree is left to write, so what
        the pipes hold is all there is and their EOF is already there (a loop pass later, the
        loop would find the same). A pipe that something outside the tree still holds reads
        nothing more now: it is left to the loop, as before. Not under a pty, whose bytes may
        still be on their way to the master."""
        spawned = self.run.spawned
        if spawned is None or self.spec.pty:
            return
        for fd, stream in ((spawned.stdout_fd, Stream.STDOUT), (spawned.stderr_fd, Stream.STDERR)):
            if fd is None or fd < 0 or fd in self.run.paused_reads:
                continue  # parked (its end comes back through the parking), or waiting for a descriptor
            # A pipe holds at most one read's worth (_READ_SIZE): its bytes, then its end. More
            # means a writer outside the tree: the loop reads on, a chunk per turn, as before.
            for _ in range(_EAGER_READS):
                if self._read_chunk(fd, stream) != 1:
                    break

    def _resume_reading(self, fd: int, stream: Stream) -> None:
        del self.run.paused_reads[fd]
        self._loop.add_reader(fd, self._on_readable, fd, stream)

    def _close_stream(self, fd: int, *, settle: bool = True) -> None:
        """Stop reading ``fd`` (at EOF, or given up on) and close it; ``settle``: end the session
        if that was all it waited for (the caller does otherwise)."""
        paused = self.run.paused_reads.pop(fd, None)
        if paused is not None:
            paused.cancel()
        self._loop.remove_reader(fd)
        os.close(fd)
        self.run.open_streams -= 1
        if self.run.spawned is not None:
            if fd == self.run.spawned.stdout_fd:
                self.run.spawned.stdout_fd = -1
            elif fd == self.run.spawned.stderr_fd:
                self.run.spawned.stderr_fd = -1
        if settle:
            self._maybe_finish()

    def _drain_and_close_streams(self) -> None:
        """Stop waiting for EOF: read what is buffered, then close."""
        self.unpark_output()
        spawned = self.run.spawned
        if spawned is None:
            return
        for fd, stream in ((spawned.stdout_fd, Stream.STDOUT), (spawned.stderr_fd, Stream.STDERR)):
            if fd is None or fd < 0:
                continue
            while True:
                try:
                    data = os.read(fd, _READ_SIZE)
                except OSError:
                    break
                if not data:
                    break
                self.output.append(stream, data)
            self._close_stream(fd)

    # -- parked output (engine/output_parking.py) -----------------------------------------------

    def _offer_output(self) -> None:
        if self.parking is not None and not self.spec.pty:  # a terminal's output drives its mode scan
            self.parking.watch(self)

    def output_size(self) -> int:
        return self.output.combined.size

    def parkable_streams(self) -> list[tuple[Stream, int]]:
        spawned = self.run.spawned
        if spawned is None or self.run.leader_reaped or self.run.paused_reads or self._finished.is_set():
            return []
        ends = ((Stream.STDOUT, spawned.stdout_fd), (Stream.STDERR, spawned.stderr_fd))
        return [(stream, fd) for stream, fd in ends if fd is not None and fd >= 0]

    def streams_parked(self, streams: list[tuple[Stream, int]]) -> None:
        spawned = self.run.spawned
        for stream, fd in streams:
            self._loop.remove_reader(fd)
            if spawned is not None:
                setattr(spawned, _FD_OF[stream], _PARKED)

    def streams_back(self, fds: dict[Stream, int | None]) -> None:
        spawned = self.run.spawned
        if spawned is None:
            return
        for stream, fd in fds.items():
            if fd is None:  # lost while its bucket was open (a table full at that moment)
                setattr(spawned, _FD_OF[stream], -1)
                self.run.open_streams -= 1
                continue
            setattr(spawned, _FD_OF[stream], fd)
            self._loop.add_reader(fd, self._on_readable, fd, stream)
        self._maybe_finish()

    def unpark_output(self) -> None:
        """Parked output ends back in the table now (a new holder is sent copies of them)."""
        if self.parking is not None and self.parking.is_parked(self):
            self.parking.take_back(self)

    # -- exit ----------------------------------------------------------------------------------

    def _poll_leader(self) -> None:
        if not self._reap():
            self._timers.append(self._loop.call_later(0.05, self._poll_leader))

    def _on_leader_exit(self) -> None:
        # The pidfd is readable: the leader is a zombie, whose I/O counters are still there to read.
        if self.run.spawned is not None and not self.run.leader_reaped:
            self.accounting.exit_io = _zombie_io(self.run.spawned.pid)
        self._reap()

    def _reap(self) -> bool:
        spawned = self.run.spawned
        if spawned is None or self.run.leader_reaped:
            return True
        status: int | None
        try:
            pid, status, rusage = os.wait4(spawned.pid, os.WNOHANG)
        except ChildProcessError:
            # Reaped by other code in this process (an os.wait() of a library): its status went
            # with it. Said as unknown (the session ends LOST), never made up as 0.
            pid, status, rusage = spawned.pid, None, None
        if pid == 0:
            return False
        children.release(spawned.pid)
        self.run.leader_reaped = True
        if spawned.pidfd is not None:
            self._loop.remove_reader(spawned.pidfd)
            os.close(spawned.pidfd)
            spawned.pidfd = None
        code = os.waitstatus_to_exitcode(status) if status is not None else None
        if spawned.popen is not None:
            # Keeps Popen.__del__ from waiting on a pid that is no longer its own.
            spawned.popen.returncode = code if code is not None else 0
        if code is None:
            if self._requested_end is None:
                self.error = self.error or "its exit status is unknown (another waiter in this process took it)"
        elif code < 0:
            self.exit_signal = signal_name(-code)
        else:
            self.exit_code = code
        self.accounting.rusage = rusage
        self._after_leader_exit()
        return True

    def _members(self) -> set[int] | None:
        """The tree's live processes, or None when they cannot be read now (no descriptor free:
        a burst of spawns). None is never "empty": the session is not ended on it, and looks
        again on its timers (``_UNKNOWN_RETRY``)."""
        try:
            members = self._trees.pids(self.id, self.pid)
        except MembershipUnknown as exc:
            self.run.unknown_looks += 1
            if not self.run.unknown_said:
                self.run.unknown_said = True
                _log.warning("session %s: %s; it ends once its tree can be read", self.id, exc.strerror)
            return None
        self.run.unknown_looks = 0
        if members:
            # Each ours to reap once it is an orphan of ours, even one that began a session of
            # its own (engine/children.py).
            children.mark_ours(members)
        return members

    def _end_leftovers(self) -> None:
        # The command is over; what it left running belongs to nobody else. End it: SIGTERM,
        # then SIGKILL after the grace (or sooner, once nothing holds our pipes: _maybe_finish).
        self.run.left_orphans = True
        self._trees.signal(self.id, self.pid, signal.SIGTERM, leader_alive=not self.run.leader_reaped)
        self._timers.append(self._loop.call_later(_ORPHAN_GRACE, self._kill_leftovers))

    def _after_leader_exit(self) -> None:
        if self.parking is not None:
            self.parking.wake(self)  # parked ends come back to be read to EOF, as any others
        members = self._members()
        if members:
            self._end_leftovers()
        elif members is not None:
            # The common case: nothing of the tree is left. Its pipes' end is read here, not a
            # loop pass later, and the tree is not read a second time for it (once empty, a tree
            # cannot gain a process: only its members could start one).
            if self.run.open_streams:
                self._read_ends_now()
            if not self.run.open_streams:
                self._finish()
                return
        if self.run.open_streams:
            self._timers.append(self._loop.call_later(_DRAIN_DEADLINE, self._drain_and_close_streams))
        self._maybe_finish()

    def _kill_leftovers(self) -> None:
        self.run.reaper_armed = False
        members = self._members()
        if members and not self.run.left_orphans:
            # Seen only now: the look at the leader's exit could not read the tree.
            self._end_leftovers()
        elif members:
            self._trees.signal(self.id, self.pid, signal.SIGKILL, leader_alive=not self.run.leader_reaped)
        self._maybe_finish()

    def _maybe_finish(self) -> None:
        if self._finished.is_set() or not self.run.leader_reaped or self.run.open_streams:
            return
        members = self._members()
        if members is None or members:
            # Survivors hold no pipe of ours but are alive (or may be: unread): keep looking, and
            # killing, until the tree is seen empty.
            if not self.run.reaper_armed:
                self.run.reaper_armed = True
                low, high = _UNKNOWN_RETRY
                delay = 0.05 if members is not None else min(high, low * 2 ** min(self.run.unknown_looks, 8))
                self._timers.append(self._loop.call_later(delay, self._kill_leftovers))
            return
        self._finish()

    def _finish(self) -> None:
        if self._finished.is_set():
            return
        self.custody.on_stdin_close = None  # ended: the supervisor tells the holder to forget all of it
        if self.parking is not None:
            self.parking.forget(self)
        for timer in self._timers:
            timer.cancel()
        self._timers.clear()
        self._close_stdin()
        account = self.accounting
        if account.limit_backend is not None:
            account.limit_report = account.limit_backend.report(self.id)
        oom = account.limit_report is not None and account.limit_report.oom_killed
        restarting = self._requested_end is None and not oom and self._restart_due()
        if account.limit_backend is not None:
            # A last run's directories go off the loop (engine/cgroup_janitor.py); the next run
            # of a restarting session makes them anew under the same names: those go now.
            account.limit_backend.release(self.id, later=not restarting)
        if restarting:
            self._schedule_restart()
            return
        if self._requested_end is not None:
            end = self._requested_end
        elif oom:
            # Even if the shell outlived its OOM-killed child and exited 0 (`hog; echo done`), and
            # even when an adopted session's shell died with it and recorded nothing (before LOST).
            end = SessionState.LIMIT_EXCEEDED
        elif self.exit_code is None and self.exit_signal is None:
            # An adopted run that recorded nothing, or a leader another waiter reaped: no status.
            end = SessionState.LOST
        elif self.exit_code == 0:
            end = SessionState.EXITED_OK
        else:
            end = SessionState.EXITED_ERROR
        self._t_end = time.monotonic()
        self.ended_at = time.time()
        self._set_state(end)
        self.output.mark_closed()
        self._trees.release(self.id, later=True)
        self._finished.set()
        self._on_finish(self)

    async def wait_finished(self, timeout: float | None = None) -> bool:
        if self._finished.is_set():
            return True
        # The run's first short_run() seconds are the caller's call's work: it keeps its turn
        # (procpilot/turns.py), so an agent's short commands run one after another rather than
        # all at once beside another agent's. Past them its agent's next call works meanwhile.
        # asyncio.timeout, not wait_for: no extra task per wait on the exec hot path.
        held = short_run() if timeout is None else min(short_run(), timeout)
        if held > 0:
            try:
                async with asyncio.timeout(held):
                    await self._finished.wait()
                return True
            except TimeoutError:
                if timeout is not None and timeout <= held:
                    return False
        try:
            async with waiting(), asyncio.timeout(None if timeout is None else timeout - held):
                await self._finished.wait()
        except TimeoutError:
            return False
        return True

    def detach(self) -> int | None:
        """Let go of a running session without ending it: stop reading, close our descriptors
        (the holder keeps its copies, stdin included: the child sees no EOF, no SIGPIPE). The
        leader's pid if it is left unreaped (someone must still wait for it), else None."""
        for timer in (*self._timers, *self.run.paused_reads.values()):
            timer.cancel()
        self._timers.clear()
        self.run.paused_reads.clear()
        if self.cycle.next_run is not None:
            # Between two runs: the next server starts the next one, when its record says.
            self.cycle.next_run.cancel()
            self.cycle.next_run = None
        self.cycle.hook = self.cycle.on_wait = None
        if self.parking is not None:
            self.parking.forget(self)  # parked ends close with the stash: the holder has its copies
        spawned = self.run.spawned
        if spawned is None or self._finished.is_set():
            return None
        if not self.run.leader_reaped:
            LeaderPoll.of(self._loop).unwatch(spawned.pid)
            if (watcher := ExitWatcher.installed(self._loop)) is not None:
                watcher.unwatch(spawned.pid)
        for name in ("stdout_fd", "stderr_fd", "pidfd"):
            fd = getattr(spawned, name)
            if fd is not None and fd >= 0:
                self._loop.remove_reader(fd)
                os.close(fd)
            if fd is not None and name != "pidfd":
                setattr(spawned, name, -1)  # a parked one too: forgotten above, closed with the stash
        spawned.pidfd = None
        self.stdin.let_go()
        self.output.mark_closed()
        return None if self.run.leader_reaped else spawned.pid

    # -- signals -------------------------------------------------------------------------------

    def _on_timeout(self) -> None:
        if self.is_running:
            # Read before the kill: afterwards nothing is blocked anywhere, and "it hung on a
            # prompt" is the likeliest reason a command ran out of time.
            self.timed_out_waiting_for_input = self.waiting_for_input
            # No grace: SIGKILL at once (SIGTERM with grace 0 would never escalate).
            sig = signal.SIGTERM if self.kill_grace else signal.SIGKILL
            self.terminate(SessionState.TIMED_OUT, sig, self.kill_grace)

    def terminate(self, end: SessionState, sig: int, grace: float | None) -> None:
        """Signal the whole tree; escalate to SIGKILL after ``grace`` seconds if it is still alive.

        Between two runs of a restarting session there is nothing to signal: the restart is
        called off and the session ends at once (or, while the next run is being started, as
        soon as it has started: ``restarted``)."""
        if self._finished.is_set() or not self.is_running:
            raise ProcessAlreadyExited(f"session {self.id} has already ended ({self.state.value})")
        if self._requested_end is None:
            self._requested_end = end
        self.info.signal_sent = signal_name(sig)
        self.signals_sent.append((self.info.signal_sent, self.duration_ms))
        if self.cycle.next_run is not None:
            self.cycle.next_run.cancel()
            self.cycle.next_run = None
            self._finish()
            return
        if self.cycle.respawning:
            return
        leader_alive = not self.run.leader_reaped
        # Only a run signalled in its first moments may have a shell still forking its command;
        # later, a process that joined since is the tree's answer to the signal (a trap's cleanup).
        signalled: dict[int, str | None] | None = None
        if sig != signal.SIGKILL and time.monotonic() - self.cycle.run_t0 < _LATE_SIGNAL_YOUNG:
            members = self._members()  # unknown: signalled once, as a big tree is
            if members is not None:
                members |= {self.pid} if leader_alive and self.pid else set()
                if len(members) <= _LATE_SIGNAL_MAX_TREE:
                    signalled = {pid: _image(pid) for pid in members}
        self._trees.signal(self.id, self.pid, sig, leader_alive=leader_alive)
        if sig != signal.SIGKILL:
            if signalled is not None:
                for delay in _LATE_SIGNAL_CHECKS:
                    self._timers.append(self._loop.call_later(delay, self._signal_latecomers, sig, signalled))
            if grace:  # grace 0 or None: no escalation asked for
                self._timers.append(self._loop.call_later(grace, self._escalate))
        self._loop.call_soon(self._maybe_finish)

    def _signal_latecomers(self, sig: int, signalled: dict[int, str | None]) -> None:
        """The same signal for what the first one may have missed: a process that joined the
        tree since, or one that has exec'd since (another program now). A tree signalled as it
        starts has a shell in its first lines: ``sh -c`` catches SIGINT there, and a child it
        has forked but not yet exec'd catches it with the shell's handler and then becomes the
        command, which never heard it (the kill would report the session alive). Each process
        image gets the signal once: ``signalled`` keeps what was signalled as which program."""
        members = None if self._finished.is_set() or self.run.leader_reaped else self._members()
        for pid in members or ():  # unknown now: the next check (if any) signals them
            image = _image(pid)
            if pid in signalled and signalled[pid] == image:
                continue
            signalled[pid] = image
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)

    def _escalate(self) -> None:
        if not self._finished.is_set():
            self.info.signal_sent = "SIGKILL"
            self.signals_sent.append(("SIGKILL", self.duration_ms))
            self._trees.signal(self.id, self.pid, signal.SIGKILL, leader_alive=not self.run.leader_reaped)

    # -- restoring -----------------------------------------------------------------------------

    def restore(self, record: SessionRecord) -> None:
        """Take what a record says of this session's life so far (a previous server wrote it):
        its times, its last exit, its restart counters, when it was last read (the TTL), what
        faces keep of it. Its state is given by how it is taken up (see ``from_record``)."""
        now = time.time()
        info = self.info
        info.created_at = record.created_at
        info.started_at = record.started_at
        info.backgrounded = record.backgrounded
        info.restarts = record.restarts
        self.cycle.quick_failures = record.quick_failures
        info.exit_code, info.exit_signal, info.error = record.exit_code, record.exit_signal, record.error
        info.signal_sent = record.signal_sent
        info.signals_sent = list(record.signals_sent)
        info.timed_out_waiting_for_input = record.timed_out_waiting_for_input
        info.node = record.node
        info.face_data = dict(record.face_data)
        if self.state.is_end or record.state.is_end:
            info.final_usage = record.final_usage
            self.run.pid = record.pid  # the pid it ran as, shown as before (nothing signals an ended one)
        touched = record.touched_at or record.ended_at or now
        self.last_access = _monotonic_at(min(touched, now))

    def restore_ended(self, state: SessionState, ended_at: float | None) -> None:
        """A session that had ended before this server started: listed and readable as it was,
        until its TTL. Not a transition: it entered its end state under the server before."""
        if not state.is_end:
            raise ValueError(f"not an end state: {state.value}")
        self.state = state
        self.ended_at = ended_at or time.time()
        self._t_end = _monotonic_at(self.ended_at)
        if self.started_at is not None:
            self._t0 = _monotonic_at(self.started_at)
        else:
            self._t0 = self._t_end
        self.output.mark_closed()
        self._finished.set()

    def resume_between_runs(self, next_run_at: float) -> None:
        """A session a previous server left between two runs: its next run starts on schedule
        (at once if that time has passed), through the supervisor's restart hook."""
        if self.started_at is not None:
            self._t0 = _monotonic_at(self.started_at)
        self.state = SessionState.RESTARTING  # restored as it was, not a transition
        self._wait_next_run(max(0.0, next_run_at - time.time()))

    def use_trees(self, trees: TreeBackend) -> None:
        """The tree backend of the next run: an adopted run lived in the cgroup directory of the
        server that started it; the next one starts in this server's."""
        self._trees = trees

    # -- restarts ------------------------------------------------------------------------------

    def _restart_due(self) -> bool:
        policy = self.spec.restart
        return (
            policy is not None
            and self.cycle.hook is not None
            and self.restarts < policy.max_restarts
            and policy.wants(self.exit_code, self.exit_signal)
        )

    def _schedule_restart(self) -> None:
        """The run ended on its own and the policy wants another: note it in the log, reset what
        belongs to one run, and start the next after the backoff. The state stays RUNNING."""
        policy = self.spec.restart
        if policy is None:  # _restart_due said there is one
            return
        self._trees.release(self.id)
        ran = time.monotonic() - self.cycle.run_t0
        self.cycle.quick_failures = 0 if ran >= policy.stable_after else self.cycle.quick_failures + 1
        delay = policy.delay(self.cycle.quick_failures)
        self.restarts += 1
        how = f"exit code {self.exit_code}" if self.exit_signal is None else f"signal {self.exit_signal}"
        view = self.output[Stream.COMBINED]
        newline = b"\n" if view.size and view.read(view.size - 1, 1).data != b"\n" else b""
        marker = f"[procpilot] ended with {how}; restart {self.restarts} of {policy.max_restarts} in {delay:g} s\n"
        self.output.append(Stream.STDOUT, newline + marker.encode())
        self.run = Run()  # the next one's, from its start
        self._wait_next_run(delay)

    def _wait_next_run(self, delay: float) -> None:
        if self.state is SessionState.RUNNING:
            self._set_state(SessionState.RESTARTING)
        self.cycle.respawning = True
        self.cycle.next_run_at = time.time() + delay
        self.cycle.next_run = self._loop.call_later(delay, self._start_next_run)
        if self.cycle.on_wait is not None:
            self.cycle.on_wait(self)

    def _start_next_run(self) -> None:
        self.cycle.next_run = None
        self.cycle.next_run_at = None
        if self.cycle.hook is not None:
            self.cycle.hook(self)

    def restarted(self) -> None:
        """The supervisor attached the next run: an end asked for while it was starting applies now."""
        if self._requested_end is not None and self.pid is not None:
            self._trees.signal(self.id, self.pid, signal.SIGKILL, leader_alive=True)
            self._loop.call_soon(self._maybe_finish)

    def restart_handed_over(self) -> None:
        """The server handed the session over while its next run was being started: the next
        server starts it, at once (its record says it is due now)."""
        self.cycle.next_run_at = time.time()

    def restart_failed(self, message: str) -> None:
        """The next run could not be started: the session ends as its last run did, saying why."""
        self.error = message
        self.cycle.respawning = False
        self.run.leader_reaped = True
        self.cycle.hook = None  # no further attempt
        self._finish()

    # -- stdin ---------------------------------------------------------------------------------

    async def write(self, data: bytes, eof: bool = False, *, timeout: float | None = None) -> int:
        """Write ``data`` to the current run's stdin (see :meth:`StdinWriter.write`)."""
        return await self.stdin.write(data, eof, timeout=timeout)

    @property
    def stdin_open(self) -> bool:
        return self.stdin.open

    @stdin_open.setter
    def stdin_open(self, value: bool) -> None:  # a cluster node's record says it (cluster/remote.py)
        self.stdin.open = value

    def _close_stdin(self) -> None:
        self.stdin.close(ended=True)

    def _stdin_closing(self) -> None:
        if self.custody.on_stdin_close is not None:
            self.custody.on_stdin_close()

    # -- records -------------------------------------------------------------------------------

    def exit_info(self, tail: str) -> ExitInfo:
        return ExitInfo(
            session_id=self.id,
            scope=self.scope,
            state=self.state,
            exit_code=self.exit_code,
            exit_signal=self.exit_signal,
            duration_ms=self.duration_ms,
            tail=tail,
            backgrounded=self.backgrounded,
            command=self.command,
            node=self.node,
        )

    def _touched_at(self) -> float:
        self.recorded_access = self.last_access
        return time.time() - (time.monotonic() - self.idle_since)

    def record(self) -> dict[str, Any]:
        """What the store keeps: the session whole, as a server started later rebuilds it (the
        spec as admitted, its restart counters, its TTL clock, how it ended); only the running
        process and its descriptors are not in it (the holder keeps those)."""
        info = self.info
        info.pid = self.pid
        info.touched_at = self._touched_at()
        if self.spec.restart is not None:
            info.quick_failures = self.cycle.quick_failures
            info.run_started_at = time.time() - (time.monotonic() - self.cycle.run_t0)
            info.next_run_at = self.cycle.next_run_at
        return info.to_json(self.custody.record)


_FD_OF = {Stream.STDOUT: "stdout_fd", Stream.STDERR: "stderr_fd"}


def _monotonic_at(wall: float) -> float:
    """The monotonic clock's reading at wall-clock time ``wall`` (of a record a previous server wrote)."""
    return time.monotonic() - (time.time() - wall)


_maxrss_read: list[float] = [-1.0, 0]  # when the server's peak RSS was last read, and its value


def _spawner_maxrss_kb() -> int:
    """This process's peak RSS, read at most once a second: it only grows, slowly, and a system
    call on the spawn path costs 20-50 µs after an agent's idle gap."""
    now = time.monotonic()
    if now - _maxrss_read[0] > 1.0:
        _maxrss_read[:] = [now, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss]
    return int(_maxrss_read[1])


def _image(pid: int) -> str | None:
    """The program ``pid`` runs now (its executable's path), or None if it cannot be read."""
    try:
        return os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return None


def _our_child(pid: int) -> bool:
    try:
        os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return False
    return True


def _unread(fd: int) -> int:
    """Bytes waiting in pipe or pty ``fd`` (0 at EOF: nothing to store, so no file to open)."""
    try:
        return int(struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"))[0])
    except OSError:
        return 1  # cannot tell: assume bytes, as a read would


async def check_inputs(sessions: Sequence[Session]) -> None:
    """``waiting_for_input`` of each session, read in one worker thread: a listing checks many,
    and each reads /proc for a whole tree."""
    probes = [(session, probe) for session in sessions if (probe := session.input_probe()) is not None]
    if not probes:
        return
    found = await asyncio.to_thread(lambda: [probe() for _, probe in probes])
    for (session, _), answer in zip(probes, found, strict=True):
        session.note_input_check(answer)
