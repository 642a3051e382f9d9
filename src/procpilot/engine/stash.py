"""Descriptors kept open outside this process's descriptor table: in flight in sockets of our own.

A descriptor sent with SCM_RIGHTS and not yet received is in no process's table, yet its file
stays open (the message holds a reference), and it does not count against RLIMIT_NOFILE. A
running session's stdin write end is such a descriptor: it must stay open (the child sees EOF
when the last writer closes), but most sessions are never written to. Kept here, it costs the
server no descriptor until it is needed (engine/stdin.py); the server dying still closes it,
as its own copy would (the socket goes with the process).

Each bucket is a ``SOCK_SEQPACKET`` socketpair (2 descriptors) with messages of up to
:data:`BUCKET` descriptors in flight from one end to the other, their tokens as JSON. Taking one
out receives the bucket's messages (at most :data:`BUCKET` descriptors in the table for a moment)
and sends the rest back as one; a discarded one (nobody will need it) is closed when its bucket
is next opened, or emptied, or at once with the bucket's other dead once they outnumber its live
ones (and 16): the dead in flight stay bounded however many come and go. Where the kernel
refuses to keep more in flight (``ETOOMANYREFS``: an unprivileged user's in-flight count is
capped at its RLIMIT_NOFILE), :meth:`put_many` stashes what it can and leaves the rest to the
caller, who keeps them as before; and the live rest of a bucket just opened, which it will not
take back either (the count is checked before each message, so the last one let in, another
stash's or the holder's, can leave it past the limit), waits in the table under its tokens
(:attr:`DescriptorStash.kept`) until taken or discarded: never closed.

A message received into a table too full to take all its descriptors loses the rest (the kernel
closes them: ``MSG_CTRUNC``), wanted or not. A stash made with ``fit`` counts the table's free
descriptors before it takes any out (it takes that many, duplicates closed at once: exact, and
cheaper than listing a big table) and receives a message only if they all fit; the ones it
cannot receive stay in flight, still stashed (:meth:`__contains__`), for a later take.
"""

from __future__ import annotations

import array
import contextlib
import errno
import json
import os
import socket
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = ["BUCKET", "DescriptorStash", "receive_fds"]

BUCKET = 200  # descriptors in flight per bucket; SCM_RIGHTS carries at most 253 per message
_MAX_MSG = 8192  # a full bucket's tokens: 200 numbers of JSON
_FIT_MESSAGE = 16  # descriptors per message sent back by a stash made to fit (a take needs room for one)


@dataclass(slots=True)
class _Bucket:
    sender: socket.socket
    receiver: socket.socket
    live: set[int] = field(default_factory=set)  # tokens in flight that are still wanted
    in_flight: int = 0  # descriptors in flight, live or not
    sizes: deque[int] = field(default_factory=deque)  # descriptors of each message in flight, in queue order
    full: bool = False  # the socket took no more (its send buffer): the next puts go elsewhere

    def close(self) -> None:
        # Closing the receiving end drops every message still queued: the kernel closes their files.
        self.sender.close()
        self.receiver.close()


class DescriptorStash:
    """Descriptors by token, in flight in a few sockets rather than in the descriptor table."""

    def __init__(self, bucket: int = BUCKET, *, fit: bool = False) -> None:
        # Descriptors in flight per bucket: as many come into the table for a moment when one is
        # taken out, so a process with a small limit wants smaller buckets.
        self.bucket = max(1, min(bucket, BUCKET))
        # True iff a take counts the table's room first (one thread only: the count is of a moment).
        self.fit = fit
        self._buckets: list[_Bucket] = []
        self._where: dict[int, _Bucket] = {}
        self._table: dict[int, int] = {}  # token -> descriptor: live ones the kernel would not take back
        self._next = 0

    def __len__(self) -> int:
        return len(self._where) + len(self._table)

    def __contains__(self, token: object) -> bool:
        """True iff ``token``'s descriptor is still stashed (not taken, discarded or lost)."""
        return token in self._where or token in self._table

    @property
    def kept(self) -> int:
        """Stashed descriptors in the table, not in flight: the kernel would not take them back."""
        return len(self._table)

    @property
    def sockets(self) -> int:
        """Descriptors the stash itself holds in the table (two per bucket)."""
        return 2 * len(self._buckets)

    def put_many(self, fds: Sequence[int], *, together: bool = False) -> list[int | None]:
        """Stash ``fds``: a token for each one stashed (closed here: it lives on in flight), None
        for one the kernel would not take (still the caller's, open). ``together``: in one
        bucket (a session's descriptors, taken back at once)."""
        tokens: list[int | None] = [None] * len(fds)
        start = 0
        while start < len(fds):
            try:
                bucket = self._bucket_for(len(fds) if together else 1)
            except OSError:
                return tokens  # no descriptor for another bucket's sockets (EMFILE): the rest stay the caller's
            count = min(self.bucket - bucket.in_flight, len(fds) - start)
            chunk = list(fds[start : start + count])
            ids = list(range(self._next, self._next + count))
            try:
                sent = self._send(bucket, ids, chunk)
            except OSError:
                if not bucket.sizes:
                    self._drop(bucket)
                return tokens  # ETOOMANYREFS and kin: the rest stay the caller's
            if not sent:
                bucket.full = True
                if not bucket.sizes:
                    self._drop(bucket)
                    return tokens  # not even an empty socket took it
                continue
            self._next += count
            for offset, (token, fd) in enumerate(zip(ids, chunk, strict=True)):
                os.close(fd)
                bucket.live.add(token)
                self._where[token] = bucket
                tokens[start + offset] = token
            start += count
        return tokens

    def take(self, token: int) -> int | None:
        """The stashed descriptor, back in the table (the caller's now); None if it is gone (lost
        to a full table while its bucket was open) or, with ``fit``, has no room yet (then
        still stashed)."""
        return self.take_many([token]).get(token)

    def take_many(self, tokens: Sequence[int]) -> dict[int, int]:
        """Those of ``tokens`` still stashed, back in the table: each bucket opened once. With
        ``fit``, only as many as fit: the rest stay stashed."""
        by_bucket: dict[int, tuple[_Bucket, set[int]]] = {}
        found: dict[int, int] = {}
        for token in tokens:
            fd = self._table.pop(token, None)
            if fd is not None:
                found[token] = fd
                continue
            bucket = self._where.get(token)
            if bucket is not None:
                by_bucket.setdefault(id(bucket), (bucket, set()))[1].add(token)
        # Counted once, as far as these buckets could need: between their openings only we change it.
        room = self._room_for([bucket for bucket, _ in by_bucket.values()])
        for bucket, wanted in by_bucket.values():
            taken, room = self._reopen(bucket, wanted, room)
            found.update(taken)
        return found

    def discard(self, token: int) -> None:
        """Nobody will need it: closed when its bucket is next opened, or emptied."""
        fd = self._table.pop(token, None)
        if fd is not None:
            os.close(fd)
            return
        bucket = self._where.pop(token, None)
        if bucket is None:
            return
        bucket.live.discard(token)
        if not bucket.live:
            self._drop(bucket)
        elif bucket.in_flight - len(bucket.live) > max(len(bucket.live), 16):
            self._reopen(bucket, set(), self._room_for([bucket]))  # mostly dead: close those now

    def close(self) -> None:
        for bucket in self._buckets:
            bucket.close()
        self._buckets.clear()
        self._where.clear()
        for fd in self._table.values():
            os.close(fd)
        self._table.clear()

    # -- buckets -------------------------------------------------------------------------------

    def _room_for(self, buckets: list[_Bucket]) -> int | None:
        """With ``fit``: the table's free descriptors, counted up to all ``buckets`` hold (no take
        of theirs needs more); else None (not counted)."""
        if not self.fit or not buckets:
            return None
        up_to = sum(bucket.in_flight for bucket in buckets)
        probes: list[int] = []
        try:
            while len(probes) < up_to:
                probes.append(os.dup(buckets[0].receiver.fileno()))
        except OSError as exc:
            if exc.errno not in (errno.EMFILE, errno.ENFILE):
                raise
        finally:
            for fd in probes:
                os.close(fd)
        return len(probes)

    def _bucket_for(self, need: int) -> _Bucket:
        for bucket in reversed(self._buckets):
            if not bucket.full and bucket.in_flight + min(need, self.bucket) <= self.bucket:
                return bucket
        sender, receiver = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        sender.setblocking(False)
        receiver.setblocking(False)
        bucket = _Bucket(sender, receiver)
        self._buckets.append(bucket)
        return bucket

    def _send(self, bucket: _Bucket, ids: list[int], fds: list[int]) -> bool:
        try:
            socket.send_fds(bucket.sender, [json.dumps(ids).encode()], fds)
        except BlockingIOError:
            return False
        bucket.in_flight += len(fds)
        bucket.sizes.append(len(fds))
        return True

    def _reopen(self, bucket: _Bucket, wanted: set[int], room: int | None) -> tuple[dict[int, int], int | None]:
        """Receive the messages of ``bucket`` (with ``room``, the table's free descriptors: while
        the next one fits whole); return the ``wanted`` descriptors and the room left, close the
        dead ones, and send the live rest back (or drop the bucket if none is left)."""
        found: dict[int, int] = {}
        keep: list[tuple[int, int]] = []
        unread = len(bucket.sizes)  # the messages there now: not the live rest we send back meanwhile
        try:
            while unread:
                if room is not None and bucket.sizes[0] > room:
                    if not keep:
                        break  # the rest stay in flight, still stashed: no room for them now
                    room += self._send_back(bucket, keep)  # the room they took for nothing
                    continue
                try:
                    data, fds = receive_fds(bucket.receiver, _MAX_MSG, self.bucket)
                except BlockingIOError:  # fewer than counted: nothing more to find, the rest are gone
                    bucket.sizes.clear()
                    kept = {token for token, _ in keep}
                    for token in bucket.live - kept:
                        self._where.pop(token, None)
                    bucket.live &= kept
                    break
                unread -= 1
                bucket.in_flight -= bucket.sizes.popleft()
                ids = json.loads(data)
                # A table too full to take them all (MSG_CTRUNC): the kernel closed the rest.
                for token, fd in zip(ids, fds, strict=False):
                    if token in wanted:
                        found[token] = fd
                        bucket.live.discard(token)
                        self._where.pop(token, None)
                    elif token in bucket.live:
                        keep.append((token, fd))
                    else:
                        os.close(fd)
                for token in ids[len(fds) :]:
                    bucket.live.discard(token)
                    self._where.pop(token, None)
                if room is not None:
                    room -= sum(1 for token in ids[: len(fds)] if token in found or token in bucket.live)
        finally:
            if not bucket.sizes:
                bucket.in_flight = 0
            bucket.full = False
            if keep:
                sent_back = self._send_back(bucket, keep)
                room = None if room is None else room + sent_back
            if not bucket.live:
                self._drop(bucket)
        return found, room

    def _send_back(self, bucket: _Bucket, keep: list[tuple[int, int]]) -> int:
        """Put taken-out live ones back in flight (emptying ``keep``); how many left the table. As
        one message, or with ``fit`` as small ones: a take receives a message whole or not at all,
        so a big one would need that much room for any of its descriptors."""
        size = _FIT_MESSAGE if self.fit else len(keep)
        count = 0
        for first in range(0, len(keep), size):
            part = keep[first : first + size]
            ids, fds = [t for t, _ in part], [fd for _, fd in part]
            sent = False
            with contextlib.suppress(OSError):
                sent = self._send(bucket, ids, fds)
            if sent:
                for fd in fds:
                    os.close(fd)
                count += len(fds)
                continue
            # Not the socket (just read from): the user's in-flight count, past its limit
            # (ETOOMANYREFS). Still wanted: they wait in the table, never closed.
            for token, fd in part:
                bucket.live.discard(token)
                self._where.pop(token, None)
                self._table[token] = fd
        keep.clear()
        return count

    def _drop(self, bucket: _Bucket) -> None:
        with contextlib.suppress(ValueError):
            self._buckets.remove(bucket)
        for token in bucket.live:
            self._where.pop(token, None)
        bucket.live.clear()
        bucket.close()


def receive_fds(sock: socket.socket, bufsize: int, maxfds: int) -> tuple[bytes, list[int]]:
    """:func:`socket.recv_fds`, its descriptors close-on-exec (``MSG_CMSG_CLOEXEC``), as every
    one Python opens is. Received plain, they are inherited by what the process starts with
    ``posix_spawn`` (a new holder, engine/holder_client.py), which would then hold a session's
    stdin open, unknown to anyone, after the session closed it: its command never saw EOF."""
    fds = array.array("i")
    data, ancillary, _flags, _ = sock.recvmsg(bufsize, socket.CMSG_LEN(maxfds * fds.itemsize), socket.MSG_CMSG_CLOEXEC)
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
    return data, list(fds)
