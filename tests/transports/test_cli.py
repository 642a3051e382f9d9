"""The ``procpilot`` command's light entry point (transports/cli.py): it runs the commands of
cli_app.py, ``mcp`` included (through the early handshake front), and still serves the names
its importers took from it before the commands moved."""

from __future__ import annotations

import sys

import pytest

from procpilot.transports import cli, cli_app


def test_main_runs_the_commands_with_their_exit_codes(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "argv", ["procpilot", "--version"])
    with pytest.raises(SystemExit) as info:
        cli.main()
    assert info.value.code in (0, None)
    assert capsys.readouterr().out.startswith("procpilot ")
    monkeypatch.setattr(sys, "argv", ["procpilot", "no-such-command"])
    with pytest.raises(SystemExit) as info:
        cli.main()
    assert info.value.code == 2  # a usage error, as every command line tool says it
    assert "No such command" in capsys.readouterr().err


def test_mcp_goes_through_the_front_to_its_command(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # With --help the handshake front stands aside (it never reads stdin), and the mcp command answers.
    monkeypatch.setattr(sys, "argv", ["procpilot", "mcp", "--help"])
    with pytest.raises(SystemExit) as info:
        cli.main()
    assert info.value.code in (0, None)
    out = capsys.readouterr().out
    assert "mcp [OPTIONS]" in out and "--http" in out


def test_old_names_are_forwarded_to_cli_app() -> None:
    assert cli.app is cli_app.app  # ``from procpilot.transports.cli import app`` still works
    with pytest.raises(AttributeError):
        cli.no_such_name  # noqa: B018 - the lookup is the test
    with pytest.raises(AttributeError):
        cli.__path__  # noqa: B018 - dunders are never forwarded: the import system asks for them
