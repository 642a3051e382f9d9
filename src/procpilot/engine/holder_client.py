"""The server's side of the holder (engine/holder.py): start it if none runs, say hello, hand it
each session's descriptors at spawn, and take back the ones a previous server left with it.

Everything here is best effort by design: a holder that cannot be started or reached costs a
session its survival of a server crash, never its start. The link says why once, and the
supervisor reports it (``capabilities()["restarts"]``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import select
import socket
import struct
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from procpilot.engine import children
from procpilot.engine import holder as holder_module
from procpilot.engine.spawn import Spawned, open_pidfd
from procpilot.engine.stash import receive_fds
from procpilot.engine.stdin import StdinParking

__all__ = ["HeldSession", "HolderLink", "read_spool"]

_log = logging.getLogger(__name__)
_SOCKET = "holder.sock"
_MAX_SOCKET_PATH = 107  # sun_path, with its NUL
_START_TIMEOUT = 5.0
_SEND_TIMEOUT = 2.0
_MAX_MSG = 64 * 1024
_REPLAY_CHUNK = 1 << 20
_BATCH_DELAY = 0.05  # seconds a new session may wait to be handed to the holder
_MAX_FDS_PER_MSG = 200  # SCM_RIGHTS takes at most 253 per message
_MAX_IDS_PER_MSG = 1000  # 16-character ids: ~20 KB of JSON, within _MAX_MSG


class HolderMismatch(Exception):
    """The running holder speaks another protocol version (it was started by another procpilot)."""


@dataclass(slots=True)
class HeldSession:
    """Descriptors of a session the holder kept for us, by role (stdout, stderr, stdin, pidfd)."""

    id: str
    fds: dict[str, int]
    eof: set[str]
    exited: bool
    # Its stdin parked as it arrived (HolderLink.parking): the token, and the pipe's inode (what
    # its child's /proc/PID/fd/0 shows). Its pidfd was closed on arrival; ``watched``: the holder
    # records how its leader ends.
    stdin_token: int | None = None
    stdin_inode: int | None = None
    watched: bool = False
    parking: StdinParking | None = None  # where its stdin is parked

    def close(self) -> None:
        """Let go of every copy (not adopted): a parked stdin is closed now, not left in flight,
        or its child would never see EOF once the adopted copies close."""
        for fd in self.fds.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self.fds.clear()
        if self.stdin_token is not None and self.parking is not None:
            ours = self.parking.take(self.stdin_token)
            if ours is not None:
                os.close(ours)
        self.stdin_token = None


class HolderLink:
    """One server's connection to its state directory's holder."""

    def __init__(self, state_dir: Path, owner: str) -> None:
        self.path = str(state_dir / _SOCKET)
        self.owner = owner
        self._sock: socket.socket | None = None
        self.problem: str | None = None  # why sessions would not survive a crash, if they would not
        self.mismatch = False  # True iff a holder runs but speaks another protocol: it keeps its sessions
        # How the holder records the exits of sessions whose server died ({"mechanism"} or {"why"},
        # engine/exit_records.py); None: a holder that does not say, and writes no such records.
        self.records: dict[str, str] | None = None
        self.syncs = False  # True iff the holder answers a "sync" (see :meth:`sync`)
        # Sessions the holder keeps but could not hand back in the hello (its table had no room
        # for their copies), by id: why. Not ours to serve; it lets them go once we forget them.
        self.unreturned: dict[str, str] = {}
        self._pending_adds: dict[str, tuple[Spawned, dict[str, object]]] = {}
        self._pending_forgets: list[str] = []
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        # Called (on the loop) when the holder goes away while we are connected: its copies died
        # with it, ours did not, so the supervisor starts another and hands everything over again.
        self.on_lost: Callable[[], None] | None = None
        # Called (on the loop) with the ids of sessions the holder took no copies of (its table
        # was full when they came) and why: they run on here, but would not survive our crash.
        self.on_refused: Callable[[list[str], str], None] | None = None
        # Where a stdin handed back in the hello is parked, out of our table (engine/stdin.py): a
        # restart of a server with 10,000 sessions must take them all back under the same limit.
        self.parking: StdinParking | None = None

    @property
    def connected(self) -> bool:
        return self._sock is not None

    @property
    def pid(self) -> int | None:
        """The holder's pid, as the kernel tells it (SO_PEERCRED), while connected."""
        sock = self._sock
        if sock is None:
            return None
        with contextlib.suppress(OSError):
            creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
            return int(struct.unpack("3i", creds)[0])
        return None

    def connect(self) -> list[HeldSession]:
        """Reach the holder (starting one if none runs) and take back what it holds for our owner."""
        found = self.open()
        if found is None:
            return []
        sock, held = found
        self.install(sock)
        return held

    def open(self) -> tuple[socket.socket, list[HeldSession]] | None:
        """Reach the holder (starting one if none runs) and say hello: a connection not yet in use
        and what it holds for our owner, or None (``problem`` says why). Changes nothing else of
        the link, so it may run in a worker thread while the loop serves."""
        if len(self.path) >= _MAX_SOCKET_PATH:
            self.problem = f"the state directory's path is too long for a Unix socket ({self.path})"
            return None
        for _ in range(3):
            sock = self._try_connect() or (self._start() and self._try_connect())
            if not sock:
                continue
            try:
                held = self._hello(sock)
            except HolderMismatch as exc:
                sock.close()
                self.problem = str(exc)
                self.mismatch = True
                break
            except OSError:
                sock.close()
                continue  # a holder that was exiting as we came: start another
            return sock, held
        self.problem = self.problem or f"could not start or reach the holder at {self.path}"
        _log.warning("sessions will not survive a crash of this server: %s", self.problem)
        return None

    def install(self, sock: socket.socket) -> None:
        """Use ``sock`` (from :meth:`open`) from now on, and hear at once if the holder goes away."""
        self._sock = sock
        self.problem = None
        try:
            self._loop = asyncio.get_running_loop()
        except RuntimeError:
            self._loop = None  # no loop to watch from: a lost holder is noticed at the next send
        if self._loop is not None:
            # After the hello the holder speaks only to refuse sessions; else readable means gone
            # (EOF) or broken.
            self._loop.add_reader(sock.fileno(), self._on_readable)

    def _on_readable(self) -> None:
        sock = self._sock
        if sock is None:
            return
        try:
            data = sock.recv(_MAX_MSG)
        except BlockingIOError:
            return
        except OSError as exc:
            self._lost(f"lost the holder: {exc.strerror or exc}")
            return
        if not data:
            self._lost("the holder exited")
            return
        self._heard(data)

    def _heard(self, data: bytes) -> str | None:
        """A message of the holder's after the hello: a refusal is passed on. Its op, if any."""
        try:
            msg = json.loads(data)
        except ValueError:
            return None
        if not isinstance(msg, dict):
            return None
        ids = msg.get("ids") if msg.get("op") == "refused" else None
        if isinstance(ids, list) and self.on_refused is not None:
            self.on_refused([str(sid) for sid in ids], str(msg.get("why") or "the holder refused it"))
        return str(msg.get("op"))

    def sync(self) -> None:
        """Wait (at most _SEND_TIMEOUT) until the holder has handled all we sent, hearing each
        refusal on the way: a hand-over wants them said in the records it leaves for the next
        server. Nothing with a holder that does not answer a sync (an older one)."""
        sock = self._sock
        if sock is None or not self.syncs or not self._send({"op": "sync"}):
            return
        deadline = time.monotonic() + _SEND_TIMEOUT
        try:
            while time.monotonic() < deadline:
                sock.settimeout(max(0.001, deadline - time.monotonic()))
                data = sock.recv(_MAX_MSG)
                if not data or self._heard(data) == "synced":
                    return  # gone (the hand-over goes on) or all said
        except OSError as exc:
            _log.warning("the holder did not confirm what it holds before this server went: %s", exc)
        finally:
            sock.settimeout(_SEND_TIMEOUT)

    def _lost(self, why: str) -> None:
        self.problem = why
        _log.warning("sessions would not survive a crash of this server until another holder has them: %s", why)
        self.close()
        if self.on_lost is not None:
            self.on_lost()

    def _try_connect(self) -> socket.socket | None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        try:
            sock.connect(self.path)
        except OSError:
            sock.close()
            return None
        sock.settimeout(_SEND_TIMEOUT)
        return sock

    def _start(self) -> bool:
        """Start a holder, detached in a session of its own, and wait until it listens."""
        r, w = os.pipe2(os.O_CLOEXEC)
        try:
            script = holder_module.__file__
            env = {"PATH": os.environ.get("PATH", os.defpath), "LANG": "C.UTF-8"}
            pid = os.posix_spawn(
                sys.executable,
                [sys.executable, "-I", "-S", script, self.path],
                env,
                file_actions=[
                    (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                    (os.POSIX_SPAWN_DUP2, w, 1),
                    (os.POSIX_SPAWN_OPEN, 2, os.devnull, os.O_WRONLY, 0),
                ],
                setsid=True,
            )
            children.own_session(pid)  # whoever of us is open when it ends reaps it
        except OSError as exc:
            self.problem = f"could not start the holder: {exc.strerror}"
            os.close(r)
            os.close(w)
            return False
        os.close(w)
        try:
            ready, _, _ = select.select([r], [], [], _START_TIMEOUT)
            started = bool(ready) and os.read(r, 1) == b"R"
        finally:
            os.close(r)
        if not started:
            # Either another holder won the race (it exits 0 at once) or it failed; reap it if gone.
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
        return True

    def _hello(self, sock: socket.socket) -> list[HeldSession]:
        sock.sendall(json.dumps({"op": "hello", "owner": self.owner}).encode())
        held: list[HeldSession] = []
        deadline = time.monotonic() + 30
        try:
            while time.monotonic() < deadline:
                data, fds = receive_fds(sock, _MAX_MSG, 8)  # close-on-exec: never in the next holder
                if not data:
                    raise ConnectionResetError("the holder closed the connection")
                msg = json.loads(data)
                if msg.get("op") == "end":
                    if msg.get("protocol") != holder_module.PROTOCOL:
                        raise HolderMismatch(
                            f"the holder at {self.path} speaks protocol {msg.get('protocol')!r}, this procpilot"
                            f" {holder_module.PROTOCOL}: restart it when no session runs"
                        )
                    records = msg.get("records")
                    self.records = {str(k): str(v) for k, v in records.items()} if isinstance(records, dict) else None
                    self.syncs = msg.get("sync") is True
                    self.unreturned = _unreturned(msg.get("unreturned"))
                    return held
                roles = [str(r) for r in msg.get("roles", [])]
                if len(roles) != len(fds):
                    for fd in fds:
                        os.close(fd)
                    continue
                fd_of = dict(zip(roles, fds, strict=True))
                one = HeldSession(str(msg["id"]), fd_of, set(msg["eof"]), bool(msg["exited"]))
                # An adopted leader is not our child: its exit is polled for (engine/reaper.py),
                # not watched through a pidfd each, which would not fit beside 10,000 sessions.
                pidfd = fd_of.pop("pidfd", None)
                if pidfd is not None:
                    os.close(pidfd)
                # Whether the holder records how its leader ends (past its limit in an outage it
                # could not watch every one; an older holder says nothing: it watched each).
                one.watched = bool(msg.get("recorded", pidfd is not None))
                stdin = fd_of.get("stdin")
                if stdin is not None and self.parking is not None:
                    inode = os.fstat(stdin).st_ino
                    token = self.parking.put(stdin)
                    if token is not None:
                        del fd_of["stdin"]
                        one.stdin_token, one.stdin_inode, one.parking = token, inode, self.parking
                held.append(one)
        except BaseException:
            for h in held:
                h.close()
            raise
        raise TimeoutError("the holder did not finish its hello")

    # -- per session --------------------------------------------------------------------------
    #
    # Handing a session over and forgetting it are batched: each sendmsg wakes the holder, and on
    # a busy 2-core machine that wake costs the sender ~100 µs. A command that ends within the
    # batch window (most exec calls) never reaches the holder at all; a longer one is handed over
    # at most _BATCH_DELAY after its start, with whatever descriptors it still has then.

    def add(self, session_id: str, spawned: Spawned, spool: Path, cap: int, roots: list[str]) -> bool:
        """Queue copies of a new session's descriptors for the holder; False without a holder."""
        if self._sock is None:
            return False
        body: dict[str, object] = {"id": session_id, "spool": str(spool), "cap": cap, "roots": roots}
        self._pending_adds[session_id] = (spawned, body)
        self._schedule()
        return True

    def forget(self, session_id: str) -> None:
        if self._pending_adds.pop(session_id, None) is None and self._sock is not None:
            self._pending_forgets.append(session_id)
            self._schedule()
        elif not self._pending_adds and not self._pending_forgets and self._timer is not None:
            # It never reached the holder and nothing else waits: no flush is due (it would
            # fire, later, in the middle of some other call, to send nothing).
            self._timer.cancel()
            self._timer = None

    def stdin_closed(self, session_id: str) -> None:
        """Must reach the holder now: the child sees EOF only once every copy is closed."""
        if session_id in self._pending_adds:
            return  # its copy was never sent; the flush takes what is open then
        self.flush()
        self._send({"op": "stdin_closed", "id": session_id})

    def _schedule(self) -> None:
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(_BATCH_DELAY, self.flush)

    def flush(self) -> None:
        """Send what is queued: every pending session's descriptors as they are now, then the forgets."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        adds, self._pending_adds = self._pending_adds, {}
        forgets, self._pending_forgets = self._pending_forgets, []
        batch: list[dict[str, object]] = []
        fds: list[int] = []
        # The server watches its own children's exits without a pidfd each (engine/reaper.py); the
        # holder, which is not their parent, gets one opened for the send and closed after it.
        lent: list[int] = []
        try:
            for spawned, body in adds.values():
                roles: list[str] = []
                pidfd = spawned.pidfd
                if pidfd is None and spawned.popen is not None and spawned.popen.returncode is None:
                    pidfd = open_pidfd(spawned.pid)  # not reaped yet: still this pid's process
                    if pidfd is not None:
                        lent.append(pidfd)
                for role, fd in (
                    ("stdout", spawned.stdout_fd),
                    ("stderr", spawned.stderr_fd),
                    ("stdin", spawned.stdin_fd),
                    ("pidfd", pidfd),
                ):
                    if fd is not None and fd >= 0:
                        roles.append(role)
                        fds.append(fd)
                batch.append({**body, "roles": roles})
                if len(fds) > _MAX_FDS_PER_MSG - 4:
                    self._send({"op": "add", "owner": self.owner, "sessions": batch}, fds)
                    batch, fds = [], []
                    _close_all(lent)
            if batch:
                self._send({"op": "add", "owner": self.owner, "sessions": batch}, fds)
        finally:
            _close_all(lent)
        for first in range(0, len(forgets), _MAX_IDS_PER_MSG):
            self._send({"op": "forget", "ids": forgets[first : first + _MAX_IDS_PER_MSG]})

    def _send(self, body: dict[str, object], fds: list[int] | None = None) -> bool:
        sock = self._sock
        if sock is None:
            return False
        try:
            socket.send_fds(sock, [json.dumps(body).encode()], fds or [])
        except OSError as exc:
            self._lost(f"lost the holder: {exc.strerror or exc}")
            return False
        return True

    def close(self) -> None:
        """Disconnect. Whatever we did not forget, the holder now drains and keeps for the next server
        (call :meth:`flush` first, while the sessions' descriptors are still open)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._pending_adds.clear()
        self._pending_forgets.clear()
        if self._sock is not None:
            sock, self._sock = self._sock, None
            if self._loop is not None:
                self._loop.remove_reader(sock.fileno())
            sock.close()


def _unreturned(said: object) -> dict[str, str]:
    """The "end"'s {"ids", "why"} of sessions not handed back, by id (a holder before it says none)."""
    if not isinstance(said, dict) or not isinstance(said.get("ids"), list):
        return {}
    why = str(said.get("why") or "the holder could not hand its copies back")
    return {str(sid): why for sid in said["ids"]}


def _close_all(fds: list[int]) -> None:
    for fd in fds:
        os.close(fd)
    fds.clear()


def read_spool(path: Path) -> Iterator[tuple[bytes, bytes | int]]:
    """The records of a spool file, in arrival order: (b"o"|b"e", data) or (b"d", bytes dropped).
    Read a bounded piece at a time (a record's data in chunks of at most _REPLAY_CHUNK); a record
    cut short by a crash of the holder ends it."""
    header = holder_module.SPOOL_HEADER
    try:
        f = open(path, "rb")  # noqa: SIM115 - a generator holds it until exhausted or closed
    except FileNotFoundError:
        return
    with f:
        while len(head := f.read(header.size)) == header.size:
            tag, size = header.unpack(head)
            if tag == b"d":
                yield tag, size
                continue
            while size > 0:
                chunk = f.read(min(size, _REPLAY_CHUNK))
                if not chunk:
                    return
                yield tag, chunk
                size -= len(chunk)
