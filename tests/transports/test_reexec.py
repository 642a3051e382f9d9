"""The pieces of a SIGHUP re-exec that need no daemon: which inherited listening sockets the new
image keeps, and when a SIGHUP is not a reload. (The re-exec itself: test_restarts.py.)"""

from __future__ import annotations

import os
import signal
import socket
from pathlib import Path

import pytest

from procpilot.config import ServerSettings
from procpilot.errors import ConfigError
from procpilot.transports.reexec import LISTEN_FDS_ENV, Reload, inherited_listeners, terminal_gone


def _listening(tmp_path: Path) -> tuple[socket.socket, socket.socket]:
    inet = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    inet.bind(("127.0.0.1", 0))
    inet.listen()
    unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    unix.bind(str(tmp_path / "d.sock"))
    unix.listen()
    return inet, unix


def _pass_on(monkeypatch: pytest.MonkeyPatch, *socks: socket.socket) -> list[int]:
    fds = [os.dup(s.fileno()) for s in socks]
    monkeypatch.setenv(LISTEN_FDS_ENV, ",".join(map(str, fds)))
    return fds


def test_the_sockets_the_config_still_names_are_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    inet, unix = _listening(tmp_path)
    with inet, unix:
        port = inet.getsockname()[1]
        # A port of 0 in the config takes whatever port was passed on: a random port stays.
        for wanted_port in (port, 0):
            _pass_on(monkeypatch, inet, unix)
            server = ServerSettings(host="localhost", port=wanted_port, unix_socket=tmp_path / "d.sock")
            kept_inet, kept_unix = inherited_listeners(server, tcp=True)
            assert kept_inet is not None and kept_inet.getsockname()[1] == port
            assert kept_unix is not None and kept_unix.getsockname() == str(tmp_path / "d.sock")
            assert not kept_inet.get_inheritable()  # not on to the sessions
            kept_inet.close()
            kept_unix.close()
            assert LISTEN_FDS_ENV not in os.environ  # read once


def test_sockets_of_an_address_the_config_dropped_are_closed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    inet, unix = _listening(tmp_path)
    with inet, unix:
        fds = _pass_on(monkeypatch, inet, unix)
        server = ServerSettings(host="127.0.0.1", port=inet.getsockname()[1] + 1, unix_socket=None)
        assert inherited_listeners(server, tcp=True) == (None, None)
        for fd in fds:
            with pytest.raises(OSError, match="Bad file descriptor"):
                os.fstat(fd)  # closed: the new address can be bound afresh
        monkeypatch.setenv(LISTEN_FDS_ENV, "not,a,number")
        assert inherited_listeners(server, tcp=True) == (None, None)


def test_a_sighup_is_a_reload_only_with_a_config_that_loads_and_no_terminal_gone(tmp_path: Path) -> None:
    def broken() -> None:
        raise ConfigError("invalid TOML in config file")

    assert Reload(broken).answer(signal.SIGHUP) == "ignore"  # the daemon serves on as it is
    assert Reload().answer(signal.SIGTERM) == "stop"
    inet, unix = _listening(tmp_path)
    with inet, unix:
        reload = Reload(lambda: None)
        reload.sockets = [inet, unix]
        assert not terminal_gone()  # pytest's stdio: files and pipes, or a live terminal
        assert reload.answer(signal.SIGHUP) == "reexec" and reload.asked
        assert reload.answer(signal.SIGHUP) == "stop"  # once
        for fd in reload.listeners:
            os.close(fd)
