"""The handshake shipped with procpilot (transports/handshake_seed.py): what a first start of
``procpilot mcp`` answers before it has loaded must be what the loaded server answers, byte for
byte, and only for the starts it covers."""

from __future__ import annotations

import json
import os
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from procpilot.config import ENVIRONMENT_VARIABLES, ExecSettings, load_settings
from procpilot.transports.handshake_seed import (
    ANSWER_NEUTRAL,
    ANY_NAME,
    PROFILES,
    SEED_FILE,
    SETTINGS_VARIABLES,
    covered_profile,
    seed_answers,
)
from procpilot.transports.handshake_seed_build import build_seed, server_replies
from procpilot.transports.mcp_handshake import SHAPED_ALIKE, reply_bytes

VERSIONS = sorted(SHAPED_ALIKE)

_POLICY_EXAMPLES = {
    "allow": '["/usr/bin/git", "/bin/sh"]',
    "deny": '["shutdown"]',
    "check_stdin": "true",
    "network": "false",
    "readonly_root": "true",
    "isolate": "true",
    "writable": '["/tmp"]',
    "isolation_fallback": '["landlock"]',
    "elevated_allowed": "true",
    "max_procs": "4",
    "memory_limit": "1073741824",
    "cpu_limit": "1.5",
    "pids_max": "256",
    "address_space_limit": "4294967296",
    "placement": '"gpu"',
    "tiers.exec": '"approval_required"',
}
# Every key ANSWER_NEUTRAL allows, set to a valid value no default has, as a file spells it;
# where a table's keys are names (ANY_NAME), a name.
NEUTRAL_EXAMPLES: dict[tuple[str, ...], str] = {
    ("state_dir",): '"state"',
    ("workspace_root",): '"work"',
    ("tools", "exec", "backgroundMs"): "2500",
    ("tools", "exec", "timeoutSec"): "600",
    ("tools", "exec", "cleanupMs"): "600000",
    ("tools", "exec", "notifyOnExit"): "false",
    ("tools", "exec", "maxOutputChars"): "2000",
    ("tools", "exec", "resultMaxChars"): "12000",
    ("tools", "exec", "pendingMaxOutputChars"): "50000",
    ("tools", "exec", "maxLogBytes"): "1048576",
    ("tools", "exec", "killGraceSec"): "3.5",
    ("tools", "exec", "ptyCols"): "200",
    ("tools", "exec", "ptyRows"): "50",
    ("tools", "exec", "profile"): '"openclaw"',  # picks the seed's entry: compared with that one
    ("tools", "exec", "scriptPreflight"): "false",
    ("tools", "exec", "restart"): '"on-failure"',
    ("tools", "exec", "maxRestarts"): "3",
    ("tools", "exec", "restartBackoffMs"): "250",
    ("tools", "isolate_conversations"): "true",
    ("lanes", "main"): "2",
    ("lanes", "build"): "4",
    ("base_env", "passthrough"): '["PATH", "HOME"]',
    ("base_env", "set", "CI"): '"1"',
    ("env", "protected"): '["PATH", "HOME"]',
    ("server", "host"): '"127.0.0.2"',
    ("server", "port"): "9000",
    ("server", "unix_socket"): '"procpilot.sock"',
    ("server", "tokens", "a-secret-token"): '"ci"',
    ("server", "approvers"): '["lead"]',
    ("server", "operators"): '["console"]',
    ("server", "mcp_sessions_per_agent"): "8",
    ("server", "mcp_session_idle_sec"): "60.0",
    ("server", "websockets_per_agent"): "4",
    ("server", "requests_per_agent"): "4",
    ("server", "requests_queued_per_agent"): "8",
    ("server", "requests_working_per_agent"): "2",
    ("server", "requests_short_run_ms"): "50",
    ("server", "header_timeout_sec"): "5.0",
    ("server", "body_timeout_sec"): "5.0",
    ("server", "max_connections"): "256",
    ("server", "max_running_sessions"): "100",
    **{("policy", "default", *key.split(".")): value for key, value in _POLICY_EXAMPLES.items()},
    **{("policy", "agents", "ci", *key.split(".")): value for key, value in _POLICY_EXAMPLES.items()},
    ("policy", "approval_timeout_sec"): "30.0",
    ("proc", "allowed_commands"): '["python3"]',
    ("proc", "timeout"): "5.0",
    ("proc", "max_output_bytes"): "4096",
    ("proc", "max_procs"): "2",
    ("proc", "network_disabled"): "true",
}
_PROFILE_KEY = ("tools", "exec", "profile")


def _toml(entries: Mapping[tuple[str, ...], str]) -> str:
    """A TOML file of ``entries`` (path -> value as TOML writes it): the top-level keys, then
    each table's under its one header."""
    tables: dict[tuple[str, ...], list[str]] = {(): []}
    for path, value in entries.items():
        tables.setdefault(path[:-1], []).append(f"{json.dumps(path[-1])} = {value}\n")
    text = "".join(tables.pop(()))
    for table, lines in tables.items():
        text += f"[{'.'.join(json.dumps(part) for part in table)}]\n" + "".join(lines)
    return text


def _allowed_leaves(allowed: Mapping[str, Any], path: tuple[str, ...] = ()) -> set[tuple[str, ...]]:
    leaves: set[tuple[str, ...]] = set()
    for key, rule in allowed.items():
        leaves |= {(*path, key)} if rule is None else _allowed_leaves(rule, (*path, key))
    return leaves


def _as_allowed(path: tuple[str, ...]) -> tuple[str, ...]:
    """``path`` as ANSWER_NEUTRAL names it (a chosen name as ANY_NAME)."""
    rule: Any = ANSWER_NEUTRAL
    named: list[str] = []
    for part in path:
        name = part if part in rule else ANY_NAME
        named.append(name)
        rule = rule[name]
    return tuple(named)


def _assert_served_as_seeded(argv: Sequence[str], profile: str | None, config: Path, versions: Sequence[str]) -> None:
    """``procpilot mcp`` with ``argv`` (``--profile profile --config config``) is covered, and its
    server's replies are the seed's, byte for byte."""
    seeded = seed_answers(argv, {}, versions)
    assert seeded["initialize"], f"not covered: {config.read_text()}"
    for version in versions:
        initialized, listed = server_replies(profile, version, config)
        assert reply_bytes(1, seeded["initialize"][version]) == initialized, config.read_text()
        assert reply_bytes(2, seeded["tools"][version]) == listed, config.read_text()


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


def test_every_answer_neutral_key_has_an_example() -> None:
    assert {_as_allowed(path) for path in NEUTRAL_EXAMPLES} == _allowed_leaves(ANSWER_NEUTRAL)


@pytest.mark.parametrize("key", sorted(NEUTRAL_EXAMPLES), ids=".".join)
def test_an_answer_neutral_key_changes_neither_answer(tmp_path: Path, key: tuple[str, ...]) -> None:
    """Each key the seed allows in a --config file, set alone: the server built from that file
    answers byte for byte as the seed (a key that shaped an answer would put the wrong tools
    before the model until the list is corrected)."""
    config = tmp_path / "procpilot.toml"
    config.write_text(_toml({key: NEUTRAL_EXAMPLES[key]}))
    _assert_served_as_seeded(["--config", str(config)], None, config, VERSIONS[-1:])


@pytest.mark.parametrize("profile", PROFILES)
def test_every_answer_neutral_key_at_once_in_every_profile(tmp_path: Path, profile: str) -> None:
    config = tmp_path / "procpilot.toml"
    config.write_text(_toml({k: v for k, v in NEUTRAL_EXAMPLES.items() if k != _PROFILE_KEY}))
    _assert_served_as_seeded(["--profile", profile, "--config", str(config)], profile, config, VERSIONS)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        (("tools", "names"), '"underscore"'),
        (("tools", "serve"), '["exec"]'),
        (("tools", "serve"), '["process.*"]'),
    ],
    ids=lambda v: ".".join(v) if isinstance(v, tuple) else v,
)
def test_a_key_that_shapes_the_answers_is_not_covered(tmp_path: Path, key: tuple[str, ...], value: str) -> None:
    config = tmp_path / "procpilot.toml"
    config.write_text(_toml({key: value}))
    assert covered_profile(["--config", str(config)], {}) is None
    # and it does shape them: the seed's (default) answers are not that server's
    seeded = seed_answers([], {}, VERSIONS)
    initialized, listed = server_replies(None, VERSIONS[-1], config)
    assert reply_bytes(1, seeded["initialize"][VERSIONS[-1]]) + reply_bytes(2, seeded["tools"][VERSIONS[-1]]) != (
        initialized + listed
    )


@pytest.mark.parametrize(
    "text",
    [
        b"tools = 5\n",  # a value where a table belongs
        b"[tools.exec]\nexec = { timeoutSec = 5 }\n",  # a key off the list inside an allowed table
        b"[tools.exec]\ntimeoutSecs = 600\n",  # a misspelt key (the settings refuse it)
        b"[tools.exec]\ntimeout_sec = 600\n",  # the Python name: the file takes the TOML one
        b'[cluster]\nbackend = "local"\n',
        b'[policy.default]\ntiers = "blocked"\n',
        b'[tools.exec]\nprofile = "Codex"\n',  # the settings refuse it
        b"[tools.exec]\nprofile = 5\n",
        b"[tools.exec\n",  # not TOML
        b'state_dir = "\xff"\n',  # not UTF-8
    ],
)
def test_config_files_the_seed_does_not_cover(tmp_path: Path, text: bytes) -> None:
    config = tmp_path / "procpilot.toml"
    config.write_bytes(text)
    assert covered_profile(["--config", str(config)], {}) is None
    assert covered_profile([f"--config={config}"], {}) is None
    assert seed_answers(["--config", str(config)], {}, VERSIONS) == {"initialize": {}, "tools": {}}


def test_a_config_that_cannot_be_read_is_not_covered(tmp_path: Path) -> None:
    assert covered_profile(["--config", str(tmp_path / "missing.toml")], {}) is None
    assert covered_profile(["--config", str(tmp_path)], {}) is None  # a directory
    os.mkfifo(tmp_path / "fifo")  # --config <(...): opened here, it would wait for a writer
    assert covered_profile(["--config", str(tmp_path / "fifo")], {}) is None


@pytest.mark.parametrize(
    ("argv", "in_file"),
    [
        ([], None),
        ([], "codex"),
        (["--profile", "claude"], "codex"),
        (["--profile", "openclaw"], "Codex"),  # the option replaces the file's value unread
        (["--profile", "codex"], None),
    ],
)
def test_the_profile_of_a_config_file_as_the_settings_take_it(
    tmp_path: Path, argv: list[str], in_file: str | None
) -> None:
    """--profile over the file's [tools.exec] profile over the default: what covered_profile
    picks is what the settings hold."""
    config = tmp_path / "procpilot.toml"
    config.write_text("[policy.default]\ndeny = []\n" + (f'[tools.exec]\nprofile = "{in_file}"\n' if in_file else ""))
    option = argv[1] if argv else None
    settings = load_settings(config, env={}, **({"exec": {"profile": option}} if option else {}))
    assert covered_profile([*argv, "--config", str(config)], {}) == settings.exec.profile
