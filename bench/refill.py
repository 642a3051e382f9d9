"""What the warm pool's refill costs a back-to-back call, and whether a spawner process could take
it off the loop (issue 24: back to back no worse than after idle). Not procpilot's code: a model
of its pool.

Run: ``.venv/bin/python bench/refill.py [calls]`` (default 300; a few seconds).

A warm shell waits on its stdin (``read``), as the pool's do; a call writes ``true`` to one and
waits for its exit. Back to back the pool refills at once, while the taken shell runs
(engine/warm.py): the refill lies on the call's path. Two ways to refill, taken in turns:

- ``in the loop``: ``subprocess.Popen`` of the next shell in this process, as the pool does now
  (its Python setup, then ``vfork`` + ``exec`` with this thread waiting for the ``exec``);
- ``spawner``: a small helper process (started once) gets the new shell's stdin pipe end over a
  unix socket and starts the shell by a double fork (``fork``, then ``posix_spawn`` with a new
  session); the shell's parent exits at once, so the shell becomes this process's child (this
  process is a child subreaper, as a supervisor is), and the helper answers with its pid. This
  process's part is a ``pipe2`` and a ``sendmsg``.

Printed, as medians: the write of ``true`` to the shell's exit status, this process's thread's
time on the refill, and the whole call, which includes waiting for a shell when the pool is
empty; and how many calls found it empty. Nothing is asserted.

Measured here: the spawner takes the refill off this thread (about 30 µs left of 560-640), but
it needs about 2 ms to answer with a shell (its middle process is a fork of a Python process,
whose copy-on-write faults cost more than the whole ``vfork`` + ``exec`` of the shell), so back to
back nearly every call finds the pool empty and waits: the whole call is slower, not faster.
"""

from __future__ import annotations

import ctypes
import os
import select
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field

_SUBREAPER = 36  # PR_SET_CHILD_SUBREAPER
_SCRIPT = 'IFS= read -r l || exit 125; eval "$l"'
_ENV = dict(os.environ)


def _helper(sock: socket.socket) -> None:
    """The spawner: per request (a pipe's read end), a shell whose parent exits at once."""
    while True:
        msg, fds, _, _ = socket.recv_fds(sock, 16, 1)
        if not msg:
            os._exit(0)
        r, w = os.pipe()
        middle = os.fork()
        if middle == 0:
            pid = os.posix_spawn(
                "/bin/sh",
                ["/bin/sh", "-c", _SCRIPT],
                _ENV,
                file_actions=[(os.POSIX_SPAWN_DUP2, fds[0], 0), (os.POSIX_SPAWN_CLOSE, fds[0])],
                setsid=True,
            )
            os.write(w, str(pid).encode())
            os._exit(0)
        os.close(w)
        pid = int(os.read(r, 32))
        os.close(r)
        os.waitpid(middle, 0)  # gone before the answer: the shell is ours by then
        os.close(fds[0])
        sock.send(str(pid).encode())


@dataclass
class Pool:
    spawner: bool
    ready: list[tuple[int, int]] = field(default_factory=list)  # (pid, stdin's write end)
    waiting: list[int] = field(default_factory=list)  # write ends of shells asked for
    sock: socket.socket | None = None
    helper: int = 0

    def start(self) -> None:
        if self.spawner:
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            self.helper = os.fork()
            if self.helper == 0:
                ours.close()
                try:
                    _helper(theirs)
                finally:
                    os._exit(1)  # never back into the parent's code
            theirs.close()
            self.sock = ours

    def refill(self) -> None:
        if self.sock is None:
            r, w = os.pipe()
            child = subprocess.Popen(["/bin/sh", "-c", _SCRIPT], stdin=r, env=_ENV, start_new_session=True)
            os.close(r)
            child.returncode = 0  # reaped below, by pid
            self.ready.append((child.pid, w))
            return
        r, w = os.pipe()
        socket.send_fds(self.sock, [b"s"], [r])
        os.close(r)
        self.waiting.append(w)

    def collect(self, block: bool) -> None:
        while self.sock is not None and self.waiting and (block or select.select([self.sock], [], [], 0)[0]):
            self.ready.append((int(self.sock.recv(32)), self.waiting.pop(0)))
            block = False

    def close(self) -> None:
        while self.waiting:
            self.collect(block=True)
        for pid, w in self.ready:
            os.close(w)  # the shell reads EOF and exits
            os.waitpid(pid, 0)
        if self.sock is not None:
            self.sock.close()
            os.waitpid(self.helper, 0)


def measure(spawner: bool, calls: int) -> tuple[float, float, float, int]:
    """Medians: write to exit status, the refill on this thread, the whole call (a wait for the
    pool included); and how many calls found the pool empty and waited for a shell."""
    pool = Pool(spawner)
    pool.start()
    pool.refill()
    pool.refill()
    while pool.waiting:
        pool.collect(block=True)
    floor: list[float] = []
    cost: list[float] = []
    whole: list[float] = []
    empty = 0
    for _ in range(calls):
        t_call = time.perf_counter()
        pool.collect(block=False)
        if not pool.ready:
            empty += 1
            pool.collect(block=True)
        t0 = time.perf_counter()
        pid, w = pool.ready.pop(0)
        os.write(w, b"true\n")
        t1 = time.perf_counter()
        pool.refill()  # at once, back to back, as the pool does
        cost.append(time.perf_counter() - t1)
        os.waitpid(pid, 0)
        floor.append(time.perf_counter() - t0)
        whole.append(time.perf_counter() - t_call)
        os.close(w)
    pool.close()
    return statistics.median(floor), statistics.median(cost), statistics.median(whole), empty


def main() -> int:
    calls = int(sys.argv[1]) if len(sys.argv) > 1 else 300
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_SUBREAPER, 1, 0, 0, 0) != 0:
        print("cannot become a child subreaper here: the spawner's shells would not be ours")
        return 0
    rows: dict[str, list[tuple[float, float, float, int]]] = {"in the loop": [], "spawner": []}
    for _ in range(3):  # in turns, so drift hits both alike
        for name, got in rows.items():
            got.append(measure(name == "spawner", calls // 3))
    print(f"load average {os.getloadavg()[0]:.2f}; {calls} calls each, back to back; medians, µs")
    head = f"{'refill':<14}{'write -> exit status':>22}{'refill on this thread':>24}"
    print(f"{head}{'whole call':>12}{'pool empty':>12}")
    for name, got in rows.items():
        floor = statistics.median(g[0] for g in got) * 1e6
        cost = statistics.median(g[1] for g in got) * 1e6
        whole = statistics.median(g[2] for g in got) * 1e6
        empty = sum(g[3] for g in got)
        print(f"{name:<14}{floor:>22.0f}{cost:>24.0f}{whole:>12.0f}{empty:>12}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
