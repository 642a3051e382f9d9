"""The holder: one small process per state directory that keeps sessions' stdio alive between servers.

Why it exists: a session's output arrives through pipes (or a pty master) whose read ends the
server holds. If the server dies, the last read end closes and the next write gets SIGPIPE (a pty
gets SIGHUP): the process dies with it. So every server hands the holder a duplicate of each
session's descriptors (output read ends, the stdin write end, the pidfd) over a Unix socket with
SCM_RIGHTS soon after spawn (batched: one ``sendmsg`` for many sessions), no process per session.
While the server's connection is open the holder only keeps them, reading nothing. When that connection ends without
the server having forgotten a session (a crash, ``kill -9``, a planned hand-over), the holder
drains it: every chunk goes, in arrival order, into the session's spool file (``outage.spool``:
a 9-byte header per chunk, then the bytes), so the combined view's order survives. The next server
of the same owner says hello and gets the descriptors back; it replays the spool into the logs.

A session that ends while no server runs (EOF on its output and its leader gone) keeps no
descriptor: its spool and how it ended are on disk for the next server, which forgets it once
read (its entry, and its cgroup locks, wait for that server up to an hour). How it ended: nobody
can ``wait`` for a leader whose server died (init reaps it), so from then on, adopted or not,
the holder takes the kernel's exit record for it (engine/exit_records.py, root only) and writes
it beside the spool. The holder exits when it holds nothing and no server is connected: at
once when its last server leaves with nothing held; one that no server reached (the server
that started it died first) after ``_IDLE_EXIT``. Never while a server is connected, nor while
it holds a session, running or ended (tests/engine/test_holder_idle.py).

Its descriptors: while a server is connected nothing is read, so every copy waits in flight in
the holder's own stash (engine/stash.py, SCM_RIGHTS messages to itself), not in its descriptor
table: 10,000 sessions' three or four copies each would not fit under a limit of 20,000. They
come back into the table to be handed to a server (a chunk of sessions at a time) and, in an
outage, to be drained: as many sessions as its descriptor limit has room for (the output read
ends and the pidfd), the rest staying in flight, unread, until the next server (their commands
run on, and block once their pipe holds 1 MiB). A copy comes out of the stash only into room for
it (and the rest of its message); a session is handed to a server whole or not at all. One
descriptor is kept spare for a server's connection, so a full table still hears a hello.

Deliberately stdlib only and started by path (``python -I holder.py SOCKET``), not as a module of
the package: it must start in tens of milliseconds and stay small (one per state directory).

Protocol (SOCK_SEQPACKET, one JSON object per message, descriptors attached where said):
  server → holder  {"op": "hello", "owner": O}                 the reply: a "held" per session, then "end"
                   {"op": "add", "owner", "sessions": [{"id", "roles", "spool", "cap", "roots"}...]}
                                                               + one fd per role, in order
                   {"op": "forget", "ids": [...]}              these ended; close their copies
                   {"op": "stdin_closed", "id"}                close our copy of its stdin
                   {"op": "sync"}                              the reply: "synced", once all before it is
                                                               handled (its "refused" sent first)
  holder → server  {"op": "held", "id", "roles", "eof", "exited", "recorded"} + one fd per role still open
                                                               recorded: we record how its leader ends
                   {"op": "end", "protocol": PROTOCOL, "records": R, "sync": true, "unreturned": U}
                                                               R: how it records exits nobody can wait
                                                               for, {"mechanism"} or {"why"}; None: unknown;
                                                               sync: it answers a "sync"; U (only if any):
                                                               {"ids", "why", "limit"}, sessions it holds but
                                                               could not hand back whole (no room in its
                                                               table), kept in flight until forgotten
                   {"op": "synced"}
                   {"op": "refused", "ids": [...], "why", "limit"}
                                                               after an "add" whose descriptors its table
                                                               could not take whole: these it holds
                                                               nothing of (the others of the add it keeps)
A "refused" is the only message the holder sends unasked. Neither it nor "sync" needs a new
PROTOCOL: a server before them read anything after the hello as EOF or nothing (it ignored it)
and never asks for a sync; a holder before them sends no refusal (it dropped such an add
silently), and its "end" has no "sync", so it is not asked: either pairing works as it did.
Likewise "unreturned": a server before it takes those sessions as not held (it ends them, and
forgets them as they end); a holder before it handed such a session back in part.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import importlib.util
import json
import os
import resource
import selectors
import signal
import socket
import struct
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable

    from procpilot.engine.exit_records import ExitWatch
    from procpilot.engine.stash import DescriptorStash

# One spool record: a tag (b"o" stdout, b"e" stderr, b"d" bytes dropped past the cap) and a length.
SPOOL_HEADER = struct.Struct(">cQ")
SPOOL_NAME = "outage.spool"
# The protocol below. A holder outlives upgrades of the servers it serves (it is started once per
# state directory), so each side says its version: a server that cannot speak the holder's runs
# without it (its sessions end with it) rather than guess.
PROTOCOL = 1
OUTPUT_ROLES = ("stdout", "stderr")
_READ = 1 << 20
_MAX_MSG = 64 * 1024
_MAX_FDS = 253  # SCM_MAX_FD: a batch of sessions' descriptors in one message
_SEND_TIMEOUT = 10.0
# Seconds a holder that holds nothing and has no server waits for one: only one that no server
# reached (the one that started it died first) waits at all; the last server leaving with
# nothing held ends it at once.
_IDLE_EXIT = 10.0
# Internal, for tests only: a shorter wait (seconds). A server starts its holder with PATH and
# LANG alone (engine/holder_client.py), so this never reaches one a server started.
IDLE_EXIT_ENV = "PROCPILOT_HOLDER_IDLE_EXIT"
# Sessions that ended while no server ran are kept (their cgroup locks) this long for the next one.
_KEEP_ENDED = 3600.0
_CHUNK = 64  # sessions whose descriptors come out of the stash at once (a hello)
SPARE_FDS = 256  # descriptors an outage's drain leaves free: sockets, spools, a bucket opened (its 200)
_RESPARE = 1.0  # seconds between tries for a spare descriptor while we cannot accept a server


@dataclass
class Held:
    """One session's descriptors, by role: stdout, stderr (absent under a pty), stdin, pidfd."""

    id: str
    owner: str
    fds: dict[str, int]  # in our descriptor table
    spool: str
    cap: int
    parked: dict[str, int] = field(default_factory=dict)  # role: token in the stash (not in the table)
    eof: set[str] = field(default_factory=set)
    lost: set[str] = field(default_factory=set)  # roles whose copy the kernel closed (a table too full to take it)
    exited: bool = False
    draining: bool = False
    spooled: int = 0
    dropped: int = 0
    spool_fd: int | None = None
    roots: list[str] = field(default_factory=list)
    orphan: bool = False  # its server is gone: nobody can wait for its leader, we record its exit
    recorded: bool = False  # True iff its leader's exit is watched for a record (engine/exit_records.py)

    @property
    def done(self) -> bool:
        outputs = [r for r in OUTPUT_ROLES if r in self.fds or r in self.parked or r in self.eof]
        return self.exited and all(r in self.eof for r in outputs)


class Holder:
    def __init__(self, listener: socket.socket, idle_exit: float = _IDLE_EXIT) -> None:
        self.idle_exit = idle_exit
        self.sel = selectors.DefaultSelector()
        self.listener = listener
        self.sel.register(listener, selectors.EVENT_READ, ("accept", None))
        self.conns: dict[socket.socket, str | None] = {}
        self.sessions: dict[str, Held] = {}
        # Cgroup directories of the servers whose sessions we hold, each with a shared flock and a
        # count of sessions in it: a starting supervisor ends the trees of a dead one's directory
        # unless somebody holds that lock, and these trees are waiting for their next server.
        self.roots: dict[str, tuple[int, int]] = {}
        self.exits: ExitWatch | None = None  # loaded with the first sessions we are given
        self.stash: DescriptorStash | None = None  # likewise: where held copies wait, out of the table
        # A descriptor kept for a server's connection when the table has no other (see _accept).
        self.spare: int | None = _open_spare()
        self.listening = True  # False while a full table, the spare spent, cannot accept one

    # -- the loop -----------------------------------------------------------------------------

    def run(self) -> None:
        while True:
            # Idle (nothing held, nobody connected) only before the first server connects, or if
            # the one that started us died first: then wait a while for one, and go.
            timeout = None if self.conns else _KEEP_ENDED if self.sessions else self.idle_exit
            events = self.sel.select(timeout=timeout if self.listening else _RESPARE)
            waited = not events and self.listening  # the whole timeout, not a try for a spare
            if waited and not self.conns and not self.sessions:
                return
            if waited and not self.conns and all(h.done for h in self.sessions.values()):
                for sid in list(self.sessions):  # no server came for a long while: let the records go
                    self._drop(sid)
            for key, _ in events:
                kind, obj = key.data
                if kind == "accept":
                    self._accept()
                elif kind == "conn":
                    self._on_message(obj)
                elif kind == "out":
                    self._on_output(*obj)
                elif kind == "pidfd":
                    self._on_exit(obj)
                elif kind == "exits":
                    self._exits_change(lambda watch: watch.read())
            if self.spare is None:
                self._respare()
            if not self.conns and not self.sessions:
                return

    def _accept(self) -> None:
        """A server connecting. Into a table with no room for its connection it comes on our
        spare: its hello then hears what we cannot hand back, and why, rather than finding no
        holder (and ending as unheld what we hold). With no spare either, we stop listening
        until one is free again: a readable listener we cannot accept from would spin."""
        try:
            conn, _ = self.listener.accept()
        except OSError as exc:
            if exc.errno not in (errno.EMFILE, errno.ENFILE):
                return
            if self.spare is None:
                self._listen(on=False)
                return
            os.close(self.spare)
            self.spare = None
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
        conn.settimeout(_SEND_TIMEOUT)
        self.conns[conn] = None
        self.sel.register(conn, selectors.EVENT_READ, ("conn", conn))

    def _respare(self) -> None:
        self.spare = _open_spare()
        if self.spare is not None:
            self._listen(on=True)

    def _listen(self, *, on: bool) -> None:
        if on != self.listening:
            self.listening = on
            if on:
                self.sel.register(self.listener, selectors.EVENT_READ, ("accept", None))
            else:
                self.sel.unregister(self.listener)

    def _on_message(self, conn: socket.socket) -> None:
        try:
            data, fds, _, _ = socket.recv_fds(conn, _MAX_MSG, _MAX_FDS)
        except OSError:
            data, fds = b"", []
        if not data:
            for fd in fds:
                os.close(fd)
            self._disconnect(conn)
            return
        try:
            msg = json.loads(data)
            op = msg["op"]
        except (ValueError, KeyError, TypeError):
            for fd in fds:
                os.close(fd)
            return
        if op == "add":
            self._add_all(conn, msg, fds)
            return
        for fd in fds:  # no other message carries descriptors
            os.close(fd)
        if op == "hello":
            self._hello(conn, str(msg.get("owner")))
        elif op == "forget":
            ids = msg.get("ids")
            gone = [h for sid in (ids if isinstance(ids, list) else []) if (h := self.sessions.get(str(sid)))]
            self._unpark_all(gone, ("stdin",))  # closed below, with one look into each bucket
            for ended in gone:
                self._drop(ended.id)
        elif op == "sync":  # a server about to go: what we refused is said already, in order
            try:
                conn.sendall(json.dumps({"op": "synced"}).encode())
            except OSError:
                self._disconnect(conn)
        elif op == "stdin_closed":
            closing = self.sessions.get(str(msg.get("id")))
            if closing is not None:
                self._unpark(closing, ("stdin",))  # closed now, not with its bucket: the child waits for EOF
                if "stdin" in closing.fds:
                    os.close(closing.fds.pop("stdin"))
                elif "stdin" in closing.parked and self.stash is not None:  # no room now: with its bucket
                    self.stash.discard(closing.parked.pop("stdin"))

    def _disconnect(self, conn: socket.socket) -> None:
        owner = self.conns.pop(conn, None)
        with contextlib.suppress(KeyError, ValueError):
            self.sel.unregister(conn)
        conn.close()
        if owner is None or owner in self.conns.values():
            return
        # The server is gone without forgetting these: from now on their output is ours to keep.
        gone = [h for h in self.sessions.values() if h.owner == owner]
        for held in gone:
            held.orphan = True
        gone = self._unpark_within_limit(gone)
        for held in gone:
            held.recorded = self.exits is not None and "pidfd" in held.fds
        self._exits_change(lambda watch: watch.add({h.id: h.fds["pidfd"] for h in gone if "pidfd" in h.fds}))
        for held in gone:
            self._drain(held)

    # -- sessions -----------------------------------------------------------------------------

    def _add_all(self, conn: socket.socket, msg: dict[str, object], fds: list[int]) -> None:
        """Several sessions in one message: their descriptors in order, each one's roles saying how many.

        A table too full to take them all (the kernel's MSG_CTRUNC: it closed the ones past what
        fit) keeps the sessions that came whole; the others are refused, and their server told,
        so that it never believes a session survives a crash that would not."""
        sessions = msg.get("sessions")
        owner = str(msg.get("owner"))
        if not isinstance(sessions, list) or not all(
            isinstance(one, dict) and isinstance(one.get("roles"), list) for one in sessions
        ):
            sessions = []
        if not sessions or sum(len(one["roles"]) for one in sessions) < len(fds):
            for fd in fds:
                os.close(fd)
            return
        whole: list[tuple[dict[str, object], list[int]]] = []
        refused: list[str] = []
        pos = 0
        for one in sessions:
            count = len(one["roles"])
            if pos + count <= len(fds):
                whole.append((one, fds[pos : pos + count]))
            else:
                refused.append(str(one.get("id")))
            pos += count
        for fd in fds[sum(len(taken) for _, taken in whole) :]:
            os.close(fd)  # a session that came in part: no use without the rest
        if whole and self.exits is None:  # loaded now, not as an outage begins: its first milliseconds count
            with contextlib.suppress(ImportError, OSError, SyntaxError):  # then no exit records, nothing worse
                self.exits = _load_exit_records().ExitWatch()
        if whole and self.stash is None:
            with contextlib.suppress(ImportError, OSError, SyntaxError):  # then the copies stay in the table
                # Fit: a message taken out into a table with no room for it whole would lose the rest.
                self.stash = _load_beside("procpilot_stash", "stash.py").DescriptorStash(fit=True)
        for one, taken in whole:
            self._add(one, owner, taken)
        if refused:
            self._refuse(conn, refused)

    def _refuse(self, conn: socket.socket, ids: list[str]) -> None:
        """Tell the server which sessions we hold no copy of: it keeps them running, and says
        they would not survive its crash."""
        for sid in ids:
            self._drop(sid)  # an earlier run's copies, if any: not this run's
        said = self._no_room("for its copies, so it ends with its server")
        try:
            conn.sendall(json.dumps({"op": "refused", "ids": ids, **said}).encode())
        except OSError:
            self._disconnect(conn)

    def _no_room(self, what: str) -> dict[str, object]:
        """Why a full descriptor table cost sessions ``what`` says, and our limit: {"why", "limit"}."""
        try:
            soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        except (OSError, ValueError):
            soft = -1
        why = (
            f"the holder (pid {os.getpid()}) had no room in its descriptor table (RLIMIT_NOFILE {soft})"
            f" {what}; a higher hard limit for the server (systemd LimitNOFILE=) makes room from the"
            " next holder on"
        )
        return {"why": why, "limit": soft}

    def _add(self, msg: dict[str, object], owner: str, fds: list[int]) -> None:
        roles = msg.get("roles")
        if not isinstance(roles, list) or len(roles) != len(fds):
            for fd in fds:
                os.close(fd)
            return
        sid = str(msg.get("id"))
        self._drop(sid)  # never two sets of copies of one session
        cap = msg.get("cap")
        roots = msg.get("roots")
        held = Held(
            sid,
            owner,
            dict(zip((str(r) for r in roles), fds, strict=True)),
            str(msg.get("spool")),
            cap if isinstance(cap, int) else 64 << 20,
        )
        for root in roots if isinstance(roots, list) else []:
            if self._hold_root(str(root)):
                held.roots.append(str(root))
        self.sessions[sid] = held
        self._park(held)

    def _hold_root(self, path: str) -> bool:
        if path in self.roots:
            fd, count = self.roots[path]
            self.roots[path] = (fd, count + 1)
            return True
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
        except OSError:
            os.close(fd)
            return False
        self.roots[path] = (fd, 1)
        return True

    def _release_roots(self, held: Held) -> None:
        for path in held.roots:
            fd, count = self.roots.pop(path)
            if count > 1:
                self.roots[path] = (fd, count - 1)
            else:
                os.close(fd)
        held.roots.clear()

    def _drop(self, sid: str) -> None:
        held = self.sessions.pop(sid, None)
        if held is None:
            return
        for fd in held.fds.values():
            with contextlib.suppress(KeyError, ValueError):
                self.sel.unregister(fd)
            os.close(fd)
        held.fds.clear()
        self._discard_parked(held)
        self._close_spool(held)
        self._release_roots(held)
        if held.orphan:
            self._exits_change(lambda watch: watch.discard(held.id))

    def _hello(self, conn: socket.socket, owner: str) -> None:
        """Hand ``owner``'s sessions to its new server, each whole (every copy we hold of it), a
        chunk at a time: each chunk's copies come into the table, go, and are parked again.

        A session whose copies do not all fit in the table now waits for the chunks after it to
        make room, and is tried again until a round sends none. Never handed over in part (a
        server given no output end takes the output as ended while the command prints): the
        rest are named in the "end" with why, their copies kept in flight until it forgets them."""
        self.conns[conn] = owner
        pending = [h for h in self.sessions.values() if h.owner == owner]
        unreturned: list[str] = []
        try:
            while pending:
                left: list[Held] = []
                for first in range(0, len(pending), _CHUNK):
                    chunk = pending[first : first + _CHUNK]
                    self._unpark_all(chunk)
                    for held in chunk:
                        self._stop_draining(held)
                        if held.lost:
                            unreturned.append(held.id)
                        elif held.parked:
                            left.append(held)
                        else:
                            self._send_held(conn, held)
                    for held in chunk:
                        self._park(held)  # the new server has its copies: ours wait out of the table again
                if len(left) == len(pending):
                    unreturned += [h.id for h in left]  # no room made since the last round: none will be
                    break
                pending = left
            end: dict[str, object] = {"op": "end", "protocol": PROTOCOL, "records": None, "sync": True}
            end["records"] = None if self.exits is None else self.exits.said
            if unreturned:
                end["unreturned"] = {"ids": unreturned, **self._no_room("to hand their copies back")}
            conn.sendall(json.dumps(end).encode())
        except OSError:
            self._disconnect(conn)

    def _send_held(self, conn: socket.socket, held: Held) -> None:
        roles = [r for r in held.fds if r != "pidfd" or not held.exited]
        body = {
            "op": "held",
            "id": held.id,
            "roles": roles,
            "eof": sorted(held.eof),
            "exited": held.exited,
            "recorded": held.recorded,
        }
        socket.send_fds(conn, [json.dumps(body).encode()], [held.fds[r] for r in roles])

    def _drain(self, held: Held) -> None:
        held.draining = True
        for role in OUTPUT_ROLES:
            if role in held.fds:
                self.sel.register(held.fds[role], selectors.EVENT_READ, ("out", (held, role)))
        if "pidfd" in held.fds:
            with contextlib.suppress(KeyError):  # an orphan's is watched already, since its first outage
                self.sel.register(held.fds["pidfd"], selectors.EVENT_READ, ("pidfd", held))
        elif not any(r in held.fds for r in OUTPUT_ROLES):
            held.exited = True
        self._maybe_done(held)

    def _stop_draining(self, held: Held) -> None:
        """A server takes the session back: whatever we read so far is on disk before it replays.
        An orphan's pidfd stays watched: its new server is not its parent either."""
        if held.draining:
            for role in (*OUTPUT_ROLES, "pidfd") if not held.orphan else OUTPUT_ROLES:
                if role in held.fds:
                    with contextlib.suppress(KeyError, ValueError):
                        self.sel.unregister(held.fds[role])
            held.draining = False
        self._close_spool(held)

    def _on_output(self, held: Held, role: str) -> None:
        fd = held.fds[role]
        try:
            data = os.read(fd, _READ)
        except BlockingIOError:
            return
        except OSError as exc:
            if exc.errno != errno.EIO:  # a pty master reads EIO once the terminal has no holder: EOF
                raise
            data = b""
        if data:
            self._spool(held, b"o" if role == "stdout" else b"e", data)
            return
        self.sel.unregister(fd)
        os.close(held.fds.pop(role))
        held.eof.add(role)
        self._maybe_done(held)

    def _on_exit(self, held: Held) -> None:
        if held.orphan:
            self._record_exit(held)
        fd = held.fds.pop("pidfd")
        self.sel.unregister(fd)
        os.close(fd)
        held.exited = True
        if held.orphan:
            self._exits_change(lambda watch: watch.discard(held.id))
        self._maybe_done(held)

    def _maybe_done(self, held: Held) -> None:
        if held.done:
            # Its spool and how it ended are on disk: the next server reads them from there. Its
            # entry (no descriptor left) and its cgroup locks stay until that server forgets it:
            # a starting server's sweep would remove the dead one's cgroups, and with them the
            # trace of an OOM kill that makes it limit_exceeded.
            for role in list(held.fds):
                os.close(held.fds.pop(role))  # its stdin: nobody reads it any more
            self._discard_parked(held)
            self._close_spool(held)

    # -- the stash: copies out of the descriptor table (engine/stash.py) --------------------------

    def _park(self, held: Held) -> None:
        """Its copies that nothing reads or watches now, into the stash."""
        if self.stash is None or held.draining:
            return
        # An orphan's pidfd stays if we watch it (its exit recorded): one drained in an outage. One
        # that waited in flight then is watched by nobody: it parks with the rest, for the next.
        roles = [r for r in held.fds if r != "pidfd" or not self._watching_exit(held)]
        tokens = self.stash.put_many([held.fds[r] for r in roles], together=True)
        for role, token in zip(roles, tokens, strict=True):
            if token is not None:
                del held.fds[role]
                held.parked[role] = token

    def _watching_exit(self, held: Held) -> bool:
        """Whether its pidfd is in our selector: its leader's exit is ours to see (and record)."""
        fd = held.fds.get("pidfd")
        if fd is None:
            return False
        try:
            self.sel.get_key(fd)
        except (KeyError, ValueError):
            return False
        return True

    def _unpark(self, held: Held, roles: tuple[str, ...] | None = None) -> None:
        self._unpark_all([held], roles)

    def _unpark_all(self, sessions: list[Held], roles: tuple[str, ...] | None = None) -> None:
        """Their copies (of ``roles``; None: all) back in the table, each bucket opened once."""
        if self.stash is None:
            return
        wanted = [(h, r, t) for h in sessions for r, t in h.parked.items() if roles is None or r in roles]
        found = self.stash.take_many([t for _, _, t in wanted])
        for held, role, token in wanted:
            fd = found.get(token)
            if fd is None and token in self.stash:
                continue  # no room for it now: still in flight, still parked
            del held.parked[role]
            if fd is not None:
                held.fds[role] = fd
                continue
            held.lost.add(role)  # closed by the kernel (a table full while its bucket was open)
            if role in OUTPUT_ROLES:
                held.eof.add(role)  # nothing more to read from it here

    def _unpark_within_limit(self, sessions: list[Held]) -> list[Held]:
        """An outage: the sessions whose output and exit we can watch now (their copies back in
        the table, as far as our descriptor limit goes); the rest stay in flight, unread."""
        try:
            room = resource.getrlimit(resource.RLIMIT_NOFILE)[0] - len(os.listdir("/proc/self/fd")) - SPARE_FDS
        except (OSError, ValueError):
            room = 0
        kept: list[Held] = []
        for held in sessions:
            need = sum(1 for r in held.parked if r != "stdin")
            if need > room:
                break
            room -= need
            kept.append(held)
        watched = (*OUTPUT_ROLES, "pidfd")
        for first in range(0, len(kept), _CHUNK):
            self._unpark_all(kept[first : first + _CHUNK], watched)
        # One whose copies did not all come (no room as its bucket was opened) waits with the rest.
        back = [h for h in kept if not any(r in h.parked for r in watched)]
        for held in kept:
            if any(r in held.parked for r in watched):
                self._park(held)
        return back

    def _discard_parked(self, held: Held) -> None:
        """Its copies in the stash, let go: a stdin is closed now (another copy of it may be in
        use, and its child sees EOF only once every one is closed); the rest with their bucket."""
        self._unpark(held, ("stdin",))
        if "stdin" in held.fds:
            os.close(held.fds.pop("stdin"))
        if self.stash is not None:
            for token in held.parked.values():
                self.stash.discard(token)
        held.parked.clear()

    # -- exits nobody can wait for (engine/exit_records.py) -------------------------------------

    def _exits_change(self, change: Callable[[ExitWatch], None]) -> None:
        """Listen to the kernel's exit records while an orphan's leader lives, and only then."""
        if self.exits is None:
            return
        before = self.exits.fileno()
        change(self.exits)
        after = self.exits.fileno()
        if before != after:  # opened or closed, never both at once
            if before is not None:
                self.sel.unregister(before)
            if after is not None:
                self.sel.register(after, selectors.EVENT_READ, ("exits", None))

    def _record_exit(self, held: Held) -> None:
        """Its leader is gone (its pidfd readable): how it ended, beside its spool, before anyone is told."""
        found: list[dict[str, object]] = []
        self._exits_change(lambda watch: found.append(watch.outcome(held.id)))
        if found:
            module = _load_exit_records()
            module.write_outcome(module.record_path(held.spool), found[0])

    # -- the spool ----------------------------------------------------------------------------

    def _spool(self, held: Held, tag: bytes, data: bytes) -> None:
        room = max(0, held.cap - held.spooled)
        keep, lose = data[:room], len(data) - min(room, len(data))
        held.dropped += lose  # bounded: past the cap we count what we cannot keep, never block the writer
        if not keep:
            return
        try:
            if held.spool_fd is None:
                os.makedirs(os.path.dirname(held.spool), exist_ok=True)
                held.spool_fd = os.open(held.spool, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
            os.write(held.spool_fd, SPOOL_HEADER.pack(tag, len(keep)) + keep)
            held.spooled += len(keep)
        except OSError:
            held.dropped += len(keep)

    def _close_spool(self, held: Held) -> None:
        if held.dropped:
            with contextlib.suppress(OSError):
                if held.spool_fd is None:
                    os.makedirs(os.path.dirname(held.spool), exist_ok=True)
                    held.spool_fd = os.open(held.spool, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
                os.write(held.spool_fd, SPOOL_HEADER.pack(b"d", held.dropped))
            held.dropped = 0
        if held.spool_fd is not None:
            os.close(held.spool_fd)
            held.spool_fd = None


def _open_spare() -> int | None:
    try:
        return os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None


def _load_exit_records() -> Any:
    return _load_beside("procpilot_exit_records", "exit_records.py")


def _load_beside(name: str, file: str) -> Any:
    """A module of the engine, by its path beside ours: we run as a script, not in the package."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, os.path.join(os.path.dirname(__file__), file))
        if spec is None or spec.loader is None:
            raise ImportError(f"{file} is not beside holder.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def _idle_exit() -> float:
    try:
        return max(0.0, float(os.environ[IDLE_EXIT_ENV]))
    except (KeyError, ValueError):
        return _IDLE_EXIT


def main(path: str) -> int:
    # One holder per state directory: the lock decides, the socket is (re)bound only by its owner.
    lock = os.open(path + ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return 0  # another holder serves this directory already
    for sig in (signal.SIGHUP, signal.SIGINT, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_IGN)
    with contextlib.suppress(OSError, ValueError):  # room to drain as many sessions as allowed
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    old = os.umask(0o177)
    try:
        listener.bind(path)
    finally:
        os.umask(old)
    listener.listen(64)
    # Ready: the server that started us waits for this byte before it connects.
    with contextlib.suppress(OSError):
        os.write(1, b"R")
        os.close(1)
        os.open(os.devnull, os.O_WRONLY)
    try:
        Holder(listener, _idle_exit()).run()
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)
        listener.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
