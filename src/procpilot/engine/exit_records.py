"""How a process ended, for a process we are not the parent of: the kernel's taskstats records.

Only a parent can ``wait`` for a child. After a server crash its sessions' leaders belong to init
(or a subreaper); the next server adopts them but is not their parent either, so ``wait`` cannot
tell it how they ended. The kernel can: with a listener registered (generic netlink family
``TASKSTATS``, ``TASKSTATS_CMD_ATTR_REGISTER_CPUMASK``), every task that exits sends one record
with its wait status (``ac_exitcode``: ``exit 7`` is 0x700, SIGKILL is 9), sent from ``do_exit``
*before* the task becomes a zombie, so before its pidfd turns readable: whoever sees the pidfd
readable and then reads this socket finds the record there, no timeout, no guess.

The records of every other process on the host are dropped in the kernel by a socket filter
(classic BPF on the record's pid and thread group id), so a busy host costs the listener nothing
but the records it asked for, and they cannot crowd ours out of the socket's buffer.

Needs CAP_NET_ADMIN in the host's user namespace and the host's pid namespace (root on the host);
elsewhere :class:`Unavailable` says why. Stdlib only: the holder (engine/holder.py, started by
path) loads this file by its path too.
"""

from __future__ import annotations

import array
import contextlib
import errno
import json
import os
import socket
import struct

__all__ = [
    "MECHANISM",
    "ExitRecorder",
    "ExitWatch",
    "Unavailable",
    "probe",
    "read_outcome",
    "record_path",
    "write_outcome",
]

MECHANISM = "taskstats"
_NETLINK_GENERIC = 16
_GENL_ID_CTRL = 0x10
_CTRL_CMD_GETFAMILY = 3
_CTRL_ATTR_FAMILY_ID = 1
_CTRL_ATTR_FAMILY_NAME = 2
_NLM_F_REQUEST, _NLM_F_ACK = 1, 4
_NLMSG_ERROR = 2
_TASKSTATS_CMD_GET = 1
_ATTR_REGISTER_CPUMASK = 3
_TYPE_PID, _TYPE_TGID, _TYPE_STATS, _TYPE_AGGR_PID, _TYPE_AGGR_TGID = 1, 2, 3, 4, 5
_AGROUP = 0x20  # ac_flag: the last thread of its thread group, i.e. the process is gone
_NLMSG = struct.Struct("=IHHII")
_GENL = struct.Struct("=BBH")
_NLA = struct.Struct("=HH")
# Offsets in struct taskstats (append-only ABI): ac_exitcode, ac_flag, ac_tgid (v12+); the
# version from which ac_flag has AGROUP, and ac_tgid exists.
_EXITCODE, _FLAG, _TGID = 4, 8, 368
_AGROUP_SINCE = 12
# Where the first record's pid and its stats' ac_tgid sit in a message: nlmsghdr, genlmsghdr,
# the AGGR_PID nest, the PID attribute (its value), then the STATS attribute's header.
_PID_AT = _NLMSG.size + _GENL.size + 2 * _NLA.size
_STATS_AT = _PID_AT + 4 + _NLA.size
_SO_ATTACH_FILTER = 26
_SO_RCVBUFFORCE = 33
_RCVBUF = 4 << 20
_BPF_MAX_PIDS = 1000  # two instructions each for two fields, within BPF_MAXINSNS (4096)
# Classic BPF: BPF_LD|BPF_H|BPF_ABS, BPF_LD|BPF_W|BPF_ABS, BPF_JMP|BPF_JEQ|BPF_K, BPF_RET|BPF_K.
_LD_H, _LD_W, _JEQ, _RET = 0x28, 0x20, 0x15, 0x06
_SETUP_TIMEOUT = 5.0  # the kernel answers a request at once; this bounds one that would not
_RECV = 64 * 1024


class Unavailable(Exception):
    """This process cannot get exit records here; the message says why, for people."""


def probe() -> tuple[str | None, str | None]:
    """(MECHANISM, None) where a listener can register here, else (None, why not)."""
    try:
        ExitRecorder(filtered=False).close()  # registered and gone at once: no filter needed
    except Unavailable as exc:
        return None, str(exc)
    return MECHANISM, None


class ExitRecorder:
    """A taskstats listener on every possible CPU, keeping the wait status of watched processes."""

    def __init__(self, *, filtered: bool = True) -> None:
        self.overrun = False  # the kernel dropped records (our buffer was full): some may be missing
        self._statuses: dict[int, int] = {}
        self._watched: frozenset[int] = frozenset()
        try:
            self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, _NETLINK_GENERIC)
        except (OSError, AttributeError) as exc:
            raise Unavailable(f"no generic netlink socket here ({exc})") from None
        try:
            self.sock.settimeout(_SETUP_TIMEOUT)
            self.sock.bind((0, 0))
            self.family = self._resolve_family()
            if filtered:
                with contextlib.suppress(OSError):  # root only; the default buffer holds ~200 records
                    self.sock.setsockopt(socket.SOL_SOCKET, _SO_RCVBUFFORCE, _RCVBUF)
                self._filter(frozenset())  # nothing passes until we say whose records we want
            self._register()
            self.sock.setblocking(False)
        except BaseException:
            self.sock.close()
            raise

    def fileno(self) -> int:
        return self.sock.fileno()

    def close(self) -> None:
        # Closing deregisters: the kernel drops a listener whose socket is gone at its next send.
        self.sock.close()

    def watch(self, pids: set[int] | frozenset[int]) -> None:
        """Keep the records of these processes (thread group ids) from now on, and only theirs."""
        pids = frozenset(pids)
        if pids != self._watched:
            self._filter(pids)
            for fresh in pids - self._watched:
                self._statuses.pop(fresh, None)  # a pid used again: what its last owner left is not its
            self._watched = pids
            for gone in set(self._statuses) - pids:
                del self._statuses[gone]

    def read(self) -> None:
        """Take every record queued on the socket (never blocks)."""
        while True:
            try:
                data = self.sock.recv(_RECV)
            except BlockingIOError:
                return
            except OSError as exc:
                if exc.errno == errno.ENOBUFS:
                    self.overrun = True
                    continue
                raise
            self._parse(data)

    def status(self, pid: int) -> int | None:
        """The raw wait status of process ``pid`` once its last thread ended, else None."""
        return self._statuses.get(pid)

    # -- netlink ------------------------------------------------------------------------------

    def _request(self, family: int, cmd: int, attrs: bytes) -> bytes:
        body = _GENL.pack(cmd, 1, 0) + attrs
        self.sock.send(_NLMSG.pack(_NLMSG.size + len(body), family, _NLM_F_REQUEST | _NLM_F_ACK, 1, 0) + body)
        reply = b""
        while True:  # the answer (if any) and then the ack, each its own message
            data = self.sock.recv(_RECV)
            for kind, payload in _messages(data):
                if kind == _NLMSG_ERROR:
                    code = -struct.unpack_from("=i", payload)[0]
                    if code:
                        raise OSError(code, os.strerror(code))
                    return reply
                reply = payload

    def _resolve_family(self) -> int:
        try:
            reply = self._request(_GENL_ID_CTRL, _CTRL_CMD_GETFAMILY, _attr(_CTRL_ATTR_FAMILY_NAME, b"TASKSTATS\0"))
        except OSError as exc:
            if exc.errno == errno.ENOENT:
                raise Unavailable("this kernel has no taskstats (CONFIG_TASKSTATS)") from None
            raise Unavailable(f"could not reach the kernel's taskstats family: {exc.strerror}") from None
        for kind, value in _attrs(reply[_GENL.size :]):
            if kind == _CTRL_ATTR_FAMILY_ID:
                return int(struct.unpack_from("=H", value)[0])
        raise Unavailable("the kernel named no taskstats family id")

    def _register(self) -> None:
        try:
            with open("/sys/devices/system/cpu/possible") as f:
                cpus = f.read().strip()
        except OSError:
            cpus = f"0-{(os.cpu_count() or 1) - 1}"
        try:
            self._request(self.family, _TASKSTATS_CMD_GET, _attr(_ATTR_REGISTER_CPUMASK, cpus.encode() + b"\0"))
        except OSError as exc:
            if exc.errno == errno.EPERM:
                raise Unavailable("taskstats exit records need CAP_NET_ADMIN on the host (root)") from None
            if exc.errno == errno.EINVAL:
                raise Unavailable(
                    "taskstats exit records need the host's pid and user namespaces (not inside a container)"
                ) from None
            raise Unavailable(f"taskstats refused a listener: {exc.strerror}") from None

    def _filter(self, pids: frozenset[int]) -> None:
        """A socket filter that passes the records whose pid or thread group id is watched."""
        accept, drop = _bpf(_RET, 0, 0, 0xFFFFFFFF), _bpf(_RET, 0, 0, 0)
        if len(pids) > _BPF_MAX_PIDS:
            program = [accept]  # too many to list: take all, sort them here
        else:
            # Anything not a taskstats record (the acks of our requests) passes.
            kind = struct.unpack(">H", struct.pack("=H", self.family))[0]
            program = [_bpf(_LD_H, 0, 0, 4), _bpf(_JEQ, 1, 0, kind), accept]
            # A load is big-endian; the kernel wrote these fields in host order.
            keys = [struct.unpack(">I", struct.pack("=I", pid))[0] for pid in sorted(pids)]
            for offset in (_PID_AT, _STATS_AT + _TGID):
                program.append(_bpf(_LD_W, 0, 0, offset))  # past the message's end: dropped
                for key in keys:
                    program += [_bpf(_JEQ, 0, 1, key), accept]
            program.append(drop)
        # struct sock_fprog points at the instructions: an array's buffer has an address (no ctypes).
        code = array.array("B", b"".join(program))
        address = code.buffer_info()[0]
        fprog = struct.pack("=HxxxxxxQ" if struct.calcsize("P") == 8 else "=HxxI", len(program), address)
        self.sock.setsockopt(socket.SOL_SOCKET, _SO_ATTACH_FILTER, fprog)
        del code  # alive until here: the kernel copied the program in setsockopt

    def _parse(self, data: bytes) -> None:
        for kind, payload in _messages(data):
            if kind != self.family:
                continue
            records = dict(_attrs(payload[_GENL.size :]))
            pid_part = records.get(_TYPE_AGGR_PID)
            if pid_part is None:
                continue
            inner = dict(_attrs(pid_part))
            stats = inner.get(_TYPE_STATS)
            if stats is None or _TYPE_PID not in inner or len(stats) < _FLAG + 1:
                continue
            pid = struct.unpack_from("=I", inner[_TYPE_PID])[0]
            if struct.unpack_from("=H", stats)[0] < _AGROUP_SINCE:
                # No AGROUP yet: the leader thread's own record, exact unless the leader left
                # before its last thread (pthread_exit in main), which such a kernel cannot say.
                if pid in self._watched:
                    self._statuses.setdefault(pid, struct.unpack_from("=I", stats, _EXITCODE)[0])
                continue
            if not stats[_FLAG] & _AGROUP:
                continue  # a thread of it ended, not the process
            tgid = pid
            tgid_part = records.get(_TYPE_AGGR_TGID)
            if tgid_part is not None:
                tgid = struct.unpack_from("=I", dict(_attrs(tgid_part)).get(_TYPE_TGID, b"\0\0\0\0"))[0] or pid
            elif len(stats) >= _TGID + 4:
                tgid = struct.unpack_from("=I", stats, _TGID)[0] or pid
            if tgid in self._watched:
                # The first: a later one is of a process that got the pid again, never our leader.
                self._statuses.setdefault(tgid, struct.unpack_from("=I", stats, _EXITCODE)[0])


def _bpf(code: int, jt: int, jf: int, k: int) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def _attr(kind: int, value: bytes) -> bytes:
    size = _NLA.size + len(value)
    return _NLA.pack(size, kind) + value + b"\0" * (-size % 4)


def _messages(data: bytes) -> list[tuple[int, bytes]]:
    found, at = [], 0
    while at + _NLMSG.size <= len(data):
        size, kind = _NLMSG.unpack_from(data, at)[:2]
        if size < _NLMSG.size or at + size > len(data):
            break
        found.append((kind, data[at + _NLMSG.size : at + size]))
        at += (size + 3) & ~3
    return found


def _attrs(data: bytes) -> list[tuple[int, bytes]]:
    found, at = [], 0
    while at + _NLA.size <= len(data):
        size, kind = _NLA.unpack_from(data, at)
        if size < _NLA.size or at + size > len(data):
            break
        found.append((kind & 0x3FFF, data[at + _NLA.size : at + size]))  # without NLA_F_NESTED
        at += (size + 3) & ~3
    return found


# -- the holder's side ------------------------------------------------------------------------


def record_path(spool: str) -> str:
    """Where the record of the session whose outage spool is ``spool`` (``sessions/<id>/outage.spool``)
    goes: ``sessions/<id>.exit.json``, beside the shell's ``<id>.exit``, not inside the session's
    directory (made only at its first output: a mkdir per record cost 0.5 ms here)."""
    directory = os.path.dirname(spool)
    return os.path.join(os.path.dirname(directory), os.path.basename(directory) + ".exit.json")


class ExitWatch:
    """What the holder does with this: watch the leaders of the sessions nobody can ``wait`` for
    (their server is gone), only while there are any, and say how each ended, or why not."""

    def __init__(self) -> None:
        self.recorder: ExitRecorder | None = None
        self.why: str | None = None  # why no recorder could be had (said once per outage)
        # What this process can do, probed once (a listener registered and closed, ~1 ms): the
        # holder tells its servers, whose own privileges may differ from those it was started with.
        mechanism, why = probe()
        self.said: dict[str, str] = {"mechanism": mechanism} if mechanism else {"why": why or "unknown"}
        self._pids: dict[str, int | None] = {}  # session id -> its leader's pid (None: gone before we looked)
        self._live: set[int] = set()  # the pids above
        self._filtered: frozenset[int] = frozenset()

    def fileno(self) -> int | None:
        return None if self.recorder is None else self.recorder.fileno()

    def add(self, pidfds: dict[str, int]) -> None:
        """Watch these sessions' leaders too (by session id, their pidfds)."""
        fresh = False
        for sid, pidfd in pidfds.items():
            if sid not in self._pids:
                pid = self._pids[sid] = pid_of(pidfd)
                if pid is not None:
                    self._live.add(pid)
                    fresh = fresh or pid not in self._filtered
        if self._pids and self.recorder is None and self.why is None:
            try:
                self.recorder = ExitRecorder()
            except Unavailable as exc:
                self.why = str(exc)
            except OSError as exc:
                self.why = f"could not listen for exit records: {exc.strerror or exc}"
            fresh = True
        if fresh:
            self._refilter()

    def discard(self, sid: str) -> None:
        """That session's leader is no concern of ours any more: ended and recorded, or forgotten."""
        if sid not in self._pids:
            return
        pid = self._pids.pop(sid)
        self._live.discard(pid or 0)
        if not self._pids:
            if self.recorder is not None:
                self.recorder.close()  # nothing to watch: the kernel stops building records for us
                self.recorder = None
            self.why = None
            self._filtered = frozenset()
        elif len(self._filtered) > 2 * len(self._live) + 16:
            # A filter that still lists ended leaders costs little: rebuilt only once it is mostly those.
            self._refilter()

    def _refilter(self) -> None:
        if self.recorder is not None:
            self._filtered = frozenset(self._live)
            try:
                self.recorder.watch(self._filtered)
            except OSError as exc:
                self._failed(exc)

    def read(self) -> None:
        if self.recorder is not None:
            try:
                self.recorder.read()
            except OSError as exc:
                self._failed(exc)

    def _failed(self, exc: OSError) -> None:
        """The listener broke (it should not): no records until nothing is watched, and why."""
        if self.recorder is not None:
            self.recorder.close()
            self.recorder = None
        self.why = f"the holder's exit records failed: {exc.strerror or exc}"

    def outcome(self, sid: str) -> dict[str, object]:
        """How the session's leader ended, once its pidfd is readable: its record is queued by then."""
        pid = self._pids.get(sid)
        self.read()
        if self.recorder is None:
            return {"why": self.why or "the holder kept no exit records"}
        if pid is None:
            return {"why": "it ended as its server went down, before the holder began to listen"}
        status = self.recorder.status(pid)
        if status is not None:
            return {"status": status, "by": MECHANISM}
        if self.recorder.overrun:
            return {"why": "the kernel dropped exit records (the holder's socket buffer was full)"}
        return {"why": "it ended as its server went down, before the holder began to listen"}


def pid_of(pidfd: int) -> int | None:
    """The pid a pidfd refers to, None once that process is reaped."""
    try:
        with open(f"/proc/self/fdinfo/{pidfd}") as f:
            for line in f:
                if line.startswith("Pid:"):
                    pid = int(line.split()[1])
                    return pid if pid > 0 else None
    except (OSError, ValueError, IndexError):
        pass
    return None


def write_outcome(path: str, outcome: dict[str, object]) -> None:
    """One small write: a server that reads it half-written finds no valid JSON and reads again."""
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, json.dumps(outcome).encode())
        finally:
            os.close(fd)


def read_outcome(path: str) -> int | str | None:
    """What the holder recorded (and remove it): the exit code (negative: the signal, as
    ``os.waitstatus_to_exitcode`` says), or why it is unknown; None if it wrote nothing."""
    try:
        with open(path, "rb") as f:
            found = json.loads(f.read(4096))
    except (OSError, ValueError):
        return None
    with contextlib.suppress(OSError):
        os.unlink(path)
    if not isinstance(found, dict):
        return None
    status = found.get("status")
    if isinstance(status, int) and not isinstance(status, bool):
        try:
            return os.waitstatus_to_exitcode(status)
        except ValueError:
            return f"the holder recorded a wait status this procpilot cannot read ({status})"
    why = found.get("why")
    return str(why)[:500] if why is not None else None
