"""The daemon's own files (state directory, config file, Unix socket) and an agent's box.

A box (``isolate``, ``readonly_root``) hides these files (engine/isolation.py), but it may write
its workspace and its ``writable`` paths: a daemon file inside one of those must also stay where
it is. Under bubblewrap every directory between the writable path and the daemon's file is made
a mount point in the box, so it cannot be renamed (``isolation.unrenamable``). What cannot be
protected is refused when the policy is built, with a :class:`ConfigError` that names both paths:
a writable path that is a daemon file or lies inside one (the box would write the state
directory itself), and a daemon file inside a writable path of a box that Landlock makes (no
mount namespace: nothing hidden, nothing pinned; the host's ``/tmp`` writable too).
"""

from __future__ import annotations

import os
from pathlib import Path

from procpilot.config import AgentPolicy, Settings
from procpilot.engine.isolation import isolation_capabilities
from procpilot.errors import ConfigError

__all__ = ["check_daemon_files", "daemon_paths"]

_TMP = Path("/tmp")  # noqa: S108 - the host's: what a Landlock box may write besides its own paths


def daemon_paths(settings: Settings) -> tuple[Path, ...]:
    """What a boxed session must not see of the daemon: its state (session logs, the journal, the
    audit log, daemon.json), its config file (every agent's token) and its Unix socket."""
    paths = [settings.state_dir, settings.config_file, settings.server.unix_socket]
    return tuple(Path(p) for p in paths if p is not None)


def _named(settings: Settings) -> list[tuple[str, Path]]:
    named = [("the state directory", settings.state_dir), ("the config file", settings.config_file)]
    named.append(("the Unix socket", settings.server.unix_socket))
    return [(what, Path(os.path.realpath(path))) for what, path in named if path is not None]


def _policies(settings: Settings) -> list[tuple[str, AgentPolicy]]:
    found = [("[policy.default]", settings.policy.default)]
    found += [(f"[policy.agents.{agent}]", settings.policy.for_agent(agent)) for agent in settings.policy.agents]
    return found


def check_daemon_files(settings: Settings) -> None:
    """Refuse (ConfigError) a layout in which some agent's box could write or move a daemon file."""
    files = _named(settings)
    landlock: bool | None = None  # probed only if a daemon file lies inside a writable path
    for label, policy in _policies(settings):
        if not (policy.readonly_root or policy.isolate):
            continue  # no box for files: such an agent is trusted with every file of the server's user
        writable = [settings.workspace_root, *(Path(p) for p in policy.writable)]
        roots = [Path(os.path.realpath(path)) for path in writable]
        for what, path in files:
            for root in roots:
                if root == path or root.is_relative_to(path):
                    where = "is" if root == path else "lies inside"
                    raise ConfigError(
                        f"{label}: the writable path {root} {where} {what} {path}: its sessions would write the"
                        " daemon's own files",
                        hints={"separate": f"Keep {what} out of every writable path (and the workspace)."},
                        path=str(path),
                        writable=str(root),
                    )
        if policy.isolate:
            continue  # bubblewrap or no session at all (IsolationUnavailable): pinned either way
        for what, path in files:
            for root in (*roots, _TMP):
                if not path.is_relative_to(root):
                    continue
                if landlock is None:
                    landlock = isolation_capabilities()["readonly_root"] == "landlock"
                if landlock:
                    raise _unprotectable(label, what, path, root)


def _unprotectable(label: str, what: str, path: Path, root: Path) -> ConfigError:
    return ConfigError(
        f"{label}: {what} {path} lies inside {root}, which its read-only-root sessions may write, and"
        " without bubblewrap (Landlock) nothing keeps them from moving or rewriting it",
        hints={
            "separate": f"Move {what} out of {root} (state_dir, the config file, [server] unix_socket).",
            "install_bubblewrap": "Or install bubblewrap: its boxes hide the daemon's files and pin them in place.",
        },
        path=str(path),
        writable=str(root),
    )
