"""Alternates lines on stdout and stderr, flushing each, so arrival order is known.

Two pipes carry no order between them: a reader held up (a loaded machine) finds both readable
at once and cannot tell which line came first. So each line waits until the reader has taken the
one before it from its pipe (FIONREAD of the pipe, from our end, says 0), for up to 5 s; a pause
as before where that cannot be asked (not a pipe)."""

import fcntl
import struct
import sys
import termios
import time
from typing import TextIO


def taken(stream: TextIO) -> None:
    fd = stream.fileno()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            left = struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"))[0]
        except OSError:
            time.sleep(0.02)
            return
        if not left:
            return
        time.sleep(0.001)


n = int(sys.argv[1]) if len(sys.argv) > 1 else 10
for i in range(n):
    stream = sys.stdout if i % 2 == 0 else sys.stderr
    stream.write(f"line {i} {'out' if i % 2 == 0 else 'err'}\n")
    stream.flush()
    taken(stream)
