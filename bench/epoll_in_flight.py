"""The kernel facts engine/output_parking.py stands on, checked on this host (not a timing).

Run: ``.venv/bin/python bench/epoll_in_flight.py``; prints each fact and ``ok``, or stops at the
first that does not hold (exit status 1). Each one is what the parking needs of Linux:

1. an epoll registration outlives the descriptor it was made with while the file is in flight
   (an SCM_RIGHTS message not yet received), and reports data with the token we gave it;
2. with EPOLLONESHOT it reports once, then nothing until re-armed;
3. taken back at another number, the old registration cannot be removed through the new one
   (ENOENT) and stays until the file closes; at the same number it can (``F_DUPFD`` gets it back);
4. the last writer's close is reported (EPOLLHUP) while the end is in flight;
5. the bytes wait in the pipe meanwhile, all of them, in order; its writer blocks when it is full;
6. once every reference is closed, no registration is left.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import select
import socket
import sys
from pathlib import Path


class _Event(ctypes.Structure):
    _pack_ = 1
    _fields_ = (("events", ctypes.c_uint32), ("data", ctypes.c_uint64))


_libc = ctypes.CDLL(None, use_errno=True)
_ADD, _DEL = 1, 2
_ONCE = select.EPOLLIN | select.EPOLLONESHOT


def _ctl(ep: select.epoll, op: int, fd: int, token: int = 0) -> int:
    event = _Event(_ONCE, token)
    return 0 if _libc.epoll_ctl(ep.fileno(), op, fd, ctypes.byref(event)) == 0 else ctypes.get_errno()


def _check(what: str, holds: bool) -> None:
    print(f"{'ok  ' if holds else 'FAIL'} {what}")
    if not holds:
        sys.exit(1)


def _send(sock: socket.socket, fd: int) -> None:
    socket.send_fds(sock, [b"x"], [fd])
    os.close(fd)


def _receive(sock: socket.socket) -> int:
    return socket.recv_fds(sock, 16, 1)[1][0]


def main() -> None:
    ep = select.epoll()
    sender, receiver = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    r, w = os.pipe()
    number = r
    _ctl(ep, _ADD, r, 1001)
    _send(sender, r)
    _check("1. in flight and quiet: no report", ep.poll(0) == [])
    os.write(w, b"hello ")
    _check("1. in flight: data reported with our token", ep.poll(1) == [(1001, select.EPOLLIN)])
    os.write(w, b"world")
    _check("2. EPOLLONESHOT: the next write is not reported", ep.poll(0.1) == [])
    blocker = os.open("/dev/null", os.O_RDONLY)  # takes the number: it comes back at another
    back = _receive(receiver)
    _check("3. back at another number", back != number)
    _check("3. the old registration cannot be removed through it (ENOENT)", _ctl(ep, _DEL, back) == errno.ENOENT)
    os.close(blocker)
    again = fcntl.fcntl(back, fcntl.F_DUPFD_CLOEXEC, number)
    _check("3. F_DUPFD gets the old number back once it is free", again == number)
    os.close(back)
    _check("3. and through it the registration is removed", _ctl(ep, _DEL, again) == 0)
    _ctl(ep, _ADD, again, 1002)
    _send(sender, again)
    os.set_blocking(w, False)
    written = 0
    try:
        while True:
            written += os.write(w, b"z" * 4096)
    except BlockingIOError:
        pass
    _check(f"5. the pipe took {written} bytes, then its writer would block", written > 0)
    os.close(w)
    events = ep.poll(1)
    _check("4. reported while in flight (data, and the writer's close)", [t for t, _ in events] == [1002])
    back = _receive(receiver)
    data = b""
    while chunk := os.read(back, 1 << 20):
        data += chunk
    _check("5. every byte waited in the pipe, in order", data == b"hello world" + b"z" * written)
    os.close(back)
    fdinfo = Path(f"/proc/self/fdinfo/{ep.fileno()}").read_text()
    _check("6. no registration left once the file is closed", "tfd:" not in fdinfo)
    ep.close()
    sender.close()
    receiver.close()


if __name__ == "__main__":
    main()
