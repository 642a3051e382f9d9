"""SIGHUP to ``procpilot serve``: the daemon runs itself again, same pid and command line, new code
and config, and every session goes on.

What survives the ``execve``: the sessions (the holder keeps their stdio meanwhile; the supervisor
has handed them over with ``Supervisor.detach`` and the new image adopts them; their leaders are
still this pid's children, so their exits are waited for as before), and the listening sockets,
passed by number in ``PROCPILOT_LISTEN_FDS``: connections that arrive during the restart wait in
their backlog instead of being refused, and a port chosen at random stays the one clients know.
The new image uses an inherited socket only where its config still asks for that address.

A SIGHUP that comes because the daemon's terminal went away (its stdio tty reads EIO) keeps the
old meaning, the end of every session: the new image would have nowhere to write.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import signal
import socket
import sys
import termios
import threading
from collections.abc import Callable
from typing import Literal, NoReturn

from procpilot.config import ServerSettings
from procpilot.errors import ProcpilotError

__all__ = ["RELOAD_SIGNAL", "Reload", "inherited_listeners", "terminal_gone"]

RELOAD_SIGNAL = signal.SIGHUP
LISTEN_FDS_ENV = "PROCPILOT_LISTEN_FDS"
_MAX_FDS = 8  # a daemon listens on two sockets; a bigger list did not come from us
_log = logging.getLogger(__name__)


def terminal_gone() -> bool:
    """True iff one of our stdio descriptors is a terminal that has hung up: a SIGHUP now is
    the kernel's news that the terminal closed, not an operator's ``kill -HUP``."""
    for fd in (0, 1, 2):
        try:
            termios.tcgetattr(fd)
        except termios.error as exc:
            if exc.args and exc.args[0] == errno.EIO:
                return True
        except OSError:
            continue
    return False


class Reload:
    """One daemon's SIGHUP re-exec: asked for at the signal, carried out after the hand-over.

    Signals around it are never lost and never fatal. Until it serves, a re-exec'd image catches
    its stop signals with plain handlers (:meth:`catch_early`): one sent while it starts is kept
    in ``early`` and acted on once it serves. One that comes while the old image hands over is kept
    in ``later`` and sent again to ourselves, blocked, just before the ``execve`` (a blocked signal
    stays pending across it), where :meth:`catch_early` of the new image finds it. A caught (not
    ignored, not blocked) signal is reset to its default in every child, so sessions started from
    then on see their signals as usual."""

    def __init__(self, check: Callable[[], object] | None = None) -> None:
        # Loads the configuration as the new image will, raising ProcpilotError where it would fail.
        self.check = check
        self.sockets: list[socket.socket] = []  # the listening sockets, once bound
        self.listeners: list[int] = []  # their duplicates, once a re-exec is asked for
        self.early: list[int] = []
        self.later: list[int] = []
        self._signals: tuple[int, ...] = ()

    @property
    def asked(self) -> bool:
        return bool(self.listeners)

    def catch_early(self, signals: tuple[int, ...]) -> None:
        """In a re-exec'd image only: a first start keeps every signal's default until it serves
        (a Ctrl-C must still interrupt a ``--takeover`` that waits for the old daemon)."""
        self._signals = signals
        if LISTEN_FDS_ENV not in os.environ:
            return
        for sig in signals:
            signal.signal(sig, self._record)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, signals)

    def _record(self, sig: int, _frame: object) -> None:
        if sig not in self.early:
            self.early.append(sig)

    def answer(self, sig: int) -> Literal["reexec", "ignore", "stop"]:
        """What ``sig`` asks for: a re-exec (then the listening sockets are kept for it: uvicorn
        closes its own on the way out), nothing (a SIGHUP while ``check`` fails: the new image
        could not start, so this one serves on and says why), or a stop."""
        if sig != RELOAD_SIGNAL or self.asked or terminal_gone():
            return "stop"
        if self.check is not None:
            try:
                self.check()
            except ProcpilotError as exc:
                _log.error("SIGHUP ignored: a new image could not start with this configuration: %s", exc)
                return "ignore"
        self.listeners = [os.dup(sock.fileno()) for sock in self.sockets]
        return "reexec"

    def run(self) -> NoReturn:
        """Replace this process with the same command line, with the listening sockets."""
        for fd in self.listeners:
            os.set_inheritable(fd, True)
        os.environ[LISTEN_FDS_ENV] = ",".join(str(fd) for fd in self.listeners)
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        signal.pthread_sigmask(signal.SIG_BLOCK, {RELOAD_SIGNAL, *self._signals})
        for sig in self.later:
            signal.pthread_kill(threading.main_thread().ident or 0, sig)  # ours: pending across the exec
        os.execv(sys.executable, sys.orig_argv)  # noqa: S606 - this very command line, as it was started


def inherited_listeners(server: ServerSettings, *, tcp: bool) -> tuple[socket.socket | None, socket.socket | None]:
    """The TCP and Unix listening sockets a previous image of this daemon left us, where the config
    still names their addresses (the others are closed, so their addresses can be bound afresh)."""
    text = os.environ.pop(LISTEN_FDS_ENV, "")
    inet: socket.socket | None = None
    unix: socket.socket | None = None
    for part in text.split(",")[:_MAX_FDS] if text else []:
        try:
            sock = socket.socket(fileno=int(part))
        except (ValueError, OSError):
            continue
        sock.set_inheritable(False)
        if sock.family == socket.AF_UNIX and unix is None and _same_unix(sock, server):
            unix = sock
        elif sock.family in (socket.AF_INET, socket.AF_INET6) and inet is None and tcp and _same_inet(sock, server):
            inet = sock
        else:
            sock.close()
    return inet, unix


def _same_unix(sock: socket.socket, server: ServerSettings) -> bool:
    return server.unix_socket is not None and sock.getsockname() == str(server.unix_socket)


def _same_inet(sock: socket.socket, server: ServerSettings) -> bool:
    host, port = sock.getsockname()[:2]
    if server.port not in (0, port):
        return False
    try:
        wanted = {info[4][0] for info in socket.getaddrinfo(server.host, None, sock.family, socket.SOCK_STREAM)}
    except OSError:
        return False
    return host in wanted
