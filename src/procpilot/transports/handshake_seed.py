"""The handshake of a first start, shipped with procpilot: ``procpilot mcp`` answers at once
even before its handshake cache (transports/mcp_handshake.py) has an entry.

What ``initialize`` and ``tools/list`` answer depends on the settings, and loading the settings
(pydantic, the faces' models) already takes longer than a client waits. But most servers run
with no configuration file and no settings in their environment, one of the four profiles, an
agent name and a workspace, and for those the answers are known when procpilot is built:
``handshake_seed.json`` holds them, one entry per profile, written by
``python -m procpilot.transports.handshake_seed_build`` from the loaded server's own replies
(tests/transports/test_handshake_seed.py fails when the file no longer equals them, for every
profile and every handshake-era version).

:func:`covered_profile` says whether a command line and an environment are covered, reading only
those and the ``--config`` file (no import beyond the standard library's basics). A file is
covered when every key it holds is on :data:`ANSWER_NEUTRAL` (an allow-list: keys that change
neither answer, tests/transports/test_handshake_seed.py builds a server with each one set and
compares); anything else (a key off the list, a file that cannot be read or is not TOML,
``--tools``, ``--tool-names``, a setting in the environment, an option it does not know) is
not, and such a first start is answered by the loaded server, as before. A file's values are
not checked here: one the settings refuse ends the server after the front answered
(transports/mcp_handshake.py, :func:`refuse`). A seeded answer is checked as a cached one is:
the loaded server's own reply is compared with it (and the client told to list again if the
tools differ), so a seed that does not fit this machine costs one more listing.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "ANSWER_NEUTRAL",
    "ANY_NAME",
    "PROFILES",
    "SEED_FILE",
    "SETTINGS_VARIABLES",
    "VERSION_PLACEHOLDER",
    "covered_profile",
    "expand",
    "seed_answers",
]

SEED_FILE = Path(__file__).with_name("handshake_seed.json")
PROFILES = ("procpilot", "openclaw", "codex", "claude")  # config.py's ExecSettings.profile
# The options of `procpilot mcp` that change nothing either answer holds: whose sessions they
# are, where they run, and whether they outlive the server. --profile picks the seed's entry;
# --config is covered when its file is (below).
_VALUED = frozenset({"--agent", "--workspace", "--profile", "--config"})
_FLAGS = frozenset({"--keep-sessions", "--no-keep-sessions"})
# Every variable the settings read (config.py's ENVIRONMENT_VARIABLES: a test holds them equal,
# as this module may not import the settings); set, they keep the seed out, all but the two paths
# (where state is kept, where commands run), which change no answer.
SETTINGS_VARIABLES = frozenset(
    {
        "PI_BASH_YIELD_MS",
        "PI_BASH_JOB_TTL_MS",
        "PROCPILOT_RESULT_CHARS",
        "PI_BASH_MAX_OUTPUT_CHARS",
        "OPENCLAW_BASH_PENDING_MAX_OUTPUT_CHARS",
        "CLAWDBOT_BASH_PENDING_MAX_OUTPUT_CHARS",
        "PROCPILOT_STATE_DIR",
        "PROCPILOT_WORKSPACE",
    }
)
_SHAPING = SETTINGS_VARIABLES - {"PROCPILOT_STATE_DIR", "PROCPILOT_WORKSPACE"}
VERSION_PLACEHOLDER = "(the version asked)"  # the seed's initialize result holds this for protocolVersion

ANY_NAME = "*"  # in ANSWER_NEUTRAL: any key of a table whose keys are names the user picks
_AGENT_POLICY: dict[str, Any] = dict.fromkeys(
    (
        "allow",
        "deny",
        "check_stdin",
        "network",
        "readonly_root",
        "isolate",
        "writable",
        "isolation_fallback",
        "elevated_allowed",
        "max_procs",
        "memory_limit",
        "cpu_limit",
        "pids_max",
        "address_space_limit",
        "placement",
    )
) | {"tiers": {ANY_NAME: None}}
# The keys of a --config file that change neither answer, spelt as the file spells them
# (config.py): a table is a dict of its keys, None a value of any kind (the settings check it).
# What a call does (limits, budgets, defaults, policy, environment, paths) is read when a call
# comes; the answers hold only the tools' names, descriptions and schemas and the instructions,
# which come from the profile (tools.exec.profile, which picks the seed's entry), the tools served
# and their spelling ([tools] serve and names, [tools.process] enabled: exec alone has another
# description) and the build. Those, [cluster] (another launcher) and any key not named here
# keep the seed out: a new setting is left to the loaded server until it is added here, and
# tests/transports/test_handshake_seed.py builds a server with each of these set and compares.
ANSWER_NEUTRAL: dict[str, Any] = {
    "state_dir": None,
    "workspace_root": None,
    "tools": {
        "exec": dict.fromkeys(
            (
                "backgroundMs",
                "timeoutSec",
                "cleanupMs",
                "notifyOnExit",
                "maxOutputChars",
                "resultMaxChars",
                "pendingMaxOutputChars",
                "maxLogBytes",
                "killGraceSec",
                "ptyCols",
                "ptyRows",
                "profile",
                "scriptPreflight",
                "restart",
                "maxRestarts",
                "restartBackoffMs",
            )
        ),
        "isolate_conversations": None,  # over HTTP only: a stdio server is one conversation
    },
    "lanes": {ANY_NAME: None},
    "base_env": {"passthrough": None, "set": {ANY_NAME: None}},
    "env": {"protected": None},
    "server": dict.fromkeys(
        (
            "host",
            "port",
            "unix_socket",
            "approvers",
            "operators",
            "mcp_sessions_per_agent",
            "mcp_session_idle_sec",
            "websockets_per_agent",
            "requests_per_agent",
            "requests_queued_per_agent",
            "requests_working_per_agent",
            "requests_short_run_ms",
            "header_timeout_sec",
            "body_timeout_sec",
            "max_connections",
            "max_running_sessions",
        )
    )
    | {"tokens": {ANY_NAME: None}},
    # Tiers are applied to each call (policy/gate.py); a tool lists the tier its face gives it.
    "policy": {"default": _AGENT_POLICY, "agents": {ANY_NAME: _AGENT_POLICY}, "approval_timeout_sec": None},
    "proc": dict.fromkeys(("allowed_commands", "timeout", "max_output_bytes", "max_procs", "network_disabled")),
}


def covered_profile(argv: Sequence[str], env: Mapping[str, str]) -> str | None:
    """The profile ``procpilot mcp`` with the options ``argv`` serves in ``env``, when the seed
    covers that start (else None)."""
    if not _SHAPING.isdisjoint(env):
        return None
    profile: str | None = None
    config: str | None = None
    args = iter(argv)
    for arg in args:
        name, equals, value = arg.partition("=")
        if name in _FLAGS and not equals:
            continue
        if name not in _VALUED:
            return None
        if not equals:
            following = next(args, None)
            if following is None:
                return None
            value = following
        if name == "--profile":
            profile = value  # the last one counts, as in click
        elif name == "--config":
            config = value
    chosen: object = profile
    if config is not None:
        neutral, in_file = _neutral_file(Path(config))
        if not neutral:
            return None
        if profile is None:  # --profile is a keyword override in config.py: above the file
            chosen = in_file
    chosen = "procpilot" if chosen is None else chosen
    return chosen if isinstance(chosen, str) and chosen in PROFILES else None


def _neutral_file(path: Path) -> tuple[bool, object]:
    """Whether the TOML file at ``path`` holds only :data:`ANSWER_NEUTRAL` keys, and the profile
    it names (None when it names none)."""
    import tomllib  # here: only a start with --config pays for it (4 ms)

    try:
        # A pipe (--config <(...)) can be read once, and that read is the settings' own.
        if not path.is_file():
            return False, None
        with path.open("rb") as f:
            data = tomllib.load(f)
    except (OSError, ValueError):  # missing, not TOML, not UTF-8: the settings say so
        return False, None
    if not _within(data, ANSWER_NEUTRAL):
        return False, None
    return True, data.get("tools", {}).get("exec", {}).get("profile")


def _within(table: Mapping[str, Any], allowed: Mapping[str, Any]) -> bool:
    for key, value in table.items():
        if key in allowed:
            rule = allowed[key]
        elif ANY_NAME in allowed:
            rule = allowed[ANY_NAME]
        else:
            return False
        if rule is not None and not (isinstance(value, dict) and _within(value, rule)):
            return False  # a table is expected here
    return True


def expand(entry: Mapping[str, Any], versions: Sequence[str]) -> dict[str, dict[str, Any]]:
    """A profile's entry as the handshake cache holds answers: per protocol version asked, the
    ``initialize`` result (that version in it, where the loaded server puts it) and the
    ``tools/list`` result (the same for every version)."""
    initialize: dict[str, Any] = {}
    for version in versions:
        result = dict(entry["initialize"])
        result["protocolVersion"] = version  # in place: the key keeps its position, so its bytes do
        initialize[version] = result
    return {"initialize": initialize, "tools": dict.fromkeys(versions, entry["tools"])}


def seed_answers(argv: Sequence[str], env: Mapping[str, str], versions: Sequence[str]) -> dict[str, dict[str, Any]]:
    """The shipped answers for ``procpilot mcp`` with the options ``argv`` in ``env``, shaped as
    the handshake cache holds them; empty (``{"initialize": {}, "tools": {}}``) when the seed
    does not cover that start or cannot be read."""
    profile = covered_profile(argv, env)
    try:
        entry = json.loads(SEED_FILE.read_bytes())["profiles"][profile] if profile else None
        if isinstance(entry, dict) and entry["initialize"].get("protocolVersion") == VERSION_PLACEHOLDER:
            return expand(entry, versions)
    except (OSError, ValueError, LookupError, TypeError, AttributeError):
        pass  # a damaged or missing file: the loaded server answers, as on any uncovered start
    return {"initialize": {}, "tools": {}}
