"""The handshake shipped with procpilot (transports/handshake_seed.py): what a first start of
``procpilot mcp`` answers before it has loaded must be what the loaded server answers, byte for
byte, and only for the starts it covers."""

from __future__ import annotations

import json
import typing

import pytest

from procpilot.config import ENVIRONMENT_VARIABLES, ExecSettings
from procpilot.transports.handshake_seed import PROFILES, SEED_FILE, SETTINGS_VARIABLES, covered_profile, seed_answers
from procpilot.transports.handshake_seed_build import build_seed, server_replies
from procpilot.transports.mcp_handshake import SHAPED_ALIKE, reply_bytes

VERSIONS = sorted(SHAPED_ALIKE)


@pytest.mark.parametrize("profile", PROFILES)
def test_the_seed_is_the_loaded_servers_answers_byte_for_byte(profile: str) -> None:
    """For every handshake-era version: the lines the front writes from the seed are the lines
    the server writes (when this fails, run ``python -m procpilot.transports.handshake_seed_build``)."""
    argv = [] if profile == "procpilot" else ["--profile", profile]
    seeded = seed_answers(argv, {}, VERSIONS)
    for version in VERSIONS:
        initialized, listed = server_replies(profile, version)
        rebuild = f"{version}: python -m procpilot.transports.handshake_seed_build"
        assert reply_bytes(1, seeded["initialize"][version]) == initialized, rebuild
        assert reply_bytes(2, seeded["tools"][version]) == listed, rebuild


def test_the_seed_has_every_profile() -> None:
    assert set(PROFILES) == set(typing.get_args(ExecSettings.model_fields["profile"].annotation))


def test_the_shipped_file_is_what_the_builder_writes() -> None:
    rebuild = (
        "a definition, the instructions or the version changed: python -m procpilot.transports.handshake_seed_build"
    )
    assert json.loads(SEED_FILE.read_text(encoding="utf-8")) == build_seed(), rebuild


@pytest.mark.parametrize(
    ("argv", "profile"),
    [
        ([], "procpilot"),
        (["--agent", "a", "--workspace", "/nowhere/at/all", "--keep-sessions"], "procpilot"),
        (["--agent=a", "--no-keep-sessions", "--profile=codex"], "codex"),
        (["--profile", "claude", "--profile", "openclaw"], "openclaw"),  # the last one counts, as in click
    ],
)
def test_starts_the_seed_covers(argv: list[str], profile: str) -> None:
    env = {"HOME": "/h", "PATH": "/bin", "PROCPILOT_STATE_DIR": "/s", "PROCPILOT_WORKSPACE": "/w"}
    assert covered_profile(argv, env) == profile
    served = seed_answers(argv, env, VERSIONS)
    assert served["tools"][VERSIONS[0]] == json.loads(SEED_FILE.read_bytes())["profiles"][profile]["tools"]


@pytest.mark.parametrize(
    "argv",
    [
        ["--config", "procpilot.toml"],
        ["--config=procpilot.toml"],
        ["--tools", "exec"],
        ["--tool-names", "underscore"],
        ["--profile", "Codex"],  # the server refuses it: not answered for it
        ["--agent"],  # a value missing
        ["--http"],
        ["--port", "0"],
        ["--keep-sessions=true"],
        ["--help"],
        ["extra"],
    ],
)
def test_starts_the_seed_does_not_cover(argv: list[str]) -> None:
    assert covered_profile(argv, {}) is None
    assert seed_answers(argv, {}, VERSIONS) == {"initialize": {}, "tools": {}}


def test_every_setting_in_the_environment_is_seen() -> None:
    """A variable the settings read either changes nothing the handshake says (the state and
    workspace paths) or keeps the seed out; one they do not read (the CLI's daemon URL) does not."""
    assert set(ENVIRONMENT_VARIABLES) == SETTINGS_VARIABLES
    seen = {name for name in ENVIRONMENT_VARIABLES if covered_profile([], {name: "1000"}) is None}
    assert set(ENVIRONMENT_VARIABLES) - seen == {"PROCPILOT_STATE_DIR", "PROCPILOT_WORKSPACE"}
    assert covered_profile([], {"PROCPILOT_URL": "http://127.0.0.1:8765", "BASH_MAX_OUTPUT_LENGTH": "9"})
