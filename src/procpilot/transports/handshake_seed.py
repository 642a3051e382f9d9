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
those (no import beyond the standard library's basics); anything else (``--config``, ``--tools``,
``--tool-names``, a setting in the environment, an option it does not know) is not, and such a
first start is answered by the loaded server, as before. A seeded answer is checked as
a cached one is: the loaded server's own reply is compared with it (and the client told to list
again if the tools differ), so a seed that does not fit this machine costs one more listing.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = [
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
# are, where they run, and whether they outlive the server. --profile picks the seed's entry.
_VALUED = frozenset({"--agent", "--workspace", "--profile"})
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


def covered_profile(argv: Sequence[str], env: Mapping[str, str]) -> str | None:
    """The profile ``procpilot mcp`` with the options ``argv`` serves in ``env``, when the seed
    covers that start (else None)."""
    if not _SHAPING.isdisjoint(env):
        return None
    profile = "procpilot"
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
            profile = value
    return profile if profile in PROFILES else None


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
