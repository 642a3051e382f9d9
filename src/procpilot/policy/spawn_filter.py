"""Per-agent policy applied to every spawn, whichever face asked for it.

The supervisor calls :func:`make_spawn_filter`'s filter with the caller's scope and the spec the
face built; the filter refuses what the agent may not run (command allow/deny lists, too many
running sessions, elevated without permission) and fills in the agent's box: its memory, CPU and
pids limits and its network and filesystem isolation. The engine knows nothing of agents: it only
calls the filter. (The working directory and the protected environment variables are the engine's
own checks, made before any filter runs.)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path

from procpilot.config import AgentPolicy, Settings
from procpilot.engine.isolation import Isolation
from procpilot.engine.limits import Limits
from procpilot.engine.scopes import agent_of
from procpilot.engine.session import Session
from procpilot.engine.spawn import SpawnSpec
from procpilot.errors import ElevationDenied, LimitAboveAllocation, ProcLimit
from procpilot.policy.commands import CommandPolicy, UnanalyzableCommand
from procpilot.policy.daemon_files import check_daemon_files, daemon_paths

__all__ = ["ElevationDenied", "LimitAboveAllocation", "ProcLimit", "make_spawn_filter", "make_write_filter"]

SpawnFilter = Callable[[str, SpawnSpec, int], SpawnSpec]
WriteFilter = Callable[[str, Session, bytes], None]

# Interrupt, quit, suspend, end of input: alone, they make no command a shell would run.
_SIGNAL_KEYS = frozenset("\x03\x1c\x1a\x04")
# What a bracketed paste wraps its text in; the text inside is what the shell gets.
_PASTE_MARKERS = (b"\x1b[200~", b"\x1b[201~")


def _limits(policy: AgentPolicy, asked: Limits | None) -> Limits | None:
    caps = (policy.memory_limit, policy.cpu_limit, policy.pids_max, policy.address_space_limit)
    if asked is None and caps == (None, None, None, None):
        return None  # nothing asked, nothing allotted: what the rest would build, without building it
    asked = asked or Limits()
    for field, cap in (
        ("memory_bytes", policy.memory_limit),
        ("cpu_fraction", policy.cpu_limit),
        ("pids_max", policy.pids_max),
        ("address_space_bytes", policy.address_space_limit),
    ):
        value = getattr(asked, field)
        if value is not None and cap is not None and value > cap:
            raise LimitAboveAllocation(f"{field} {value} exceeds this agent's allocation of {cap}", limit=field)
    limits = Limits(
        memory_bytes=asked.memory_bytes if asked.memory_bytes is not None else policy.memory_limit,
        cpu_fraction=asked.cpu_fraction if asked.cpu_fraction is not None else policy.cpu_limit,
        pids_max=asked.pids_max if asked.pids_max is not None else policy.pids_max,
        address_space_bytes=(
            asked.address_space_bytes if asked.address_space_bytes is not None else policy.address_space_limit
        ),
    )
    return None if limits.empty and limits.address_space_bytes is None else limits


def make_spawn_filter(settings: Settings) -> SpawnFilter:
    """The filter for ``Supervisor(spawn_filter=...)``, built from ``settings.policy``; a layout in
    which a box could write or move the daemon's own files is refused here (ConfigError)."""
    check_daemon_files(settings)
    hidden = daemon_paths(settings)
    command_policies: dict[str, CommandPolicy] = {}

    def policy_for(scope: str) -> AgentPolicy:
        return settings.policy.for_agent(scope)

    def commands_for(scope: str, path: str) -> CommandPolicy:
        key = f"{scope}\0{path}"
        if key not in command_policies:
            p = policy_for(scope)
            command_policies[key] = CommandPolicy(allow=p.allow, deny=p.deny, path=path)
        return command_policies[key]

    def spawn_filter(scope: str, spec: SpawnSpec, running: int) -> SpawnSpec:
        # A conversation's scope answers to its agent's policy (engine/scopes.py); ``running``
        # already counts the agent's sessions in all its conversations.
        scope = agent_of(scope)
        policy = policy_for(scope)
        if policy.max_procs is not None and running >= policy.max_procs:
            raise ProcLimit(
                f"this agent already runs {running} sessions, its limit is {policy.max_procs}",
                max_procs=policy.max_procs,
            )
        network = policy.network_allowed
        boxed = not network or policy.readonly_root or policy.isolate  # its sessions run in a box
        if spec.elevated and not policy.elevated_allowed:
            raise ElevationDenied("elevated runs are not allowed for this agent", boxed=boxed)
        if policy.allow is not None or policy.deny:
            path = dict(spec.env).get("PATH") or _base_path(settings)
            commands_for(scope, path).check(spec.shell or spec.command, spec.cwd)
        isolation = spec.isolation
        if not spec.elevated and boxed:
            writable = (settings.workspace_root, *(Path(p) for p in policy.writable))
            isolation = Isolation(
                network=network and (isolation is None or isolation.network),
                # A box is only a box with the host's files out of its reach: the root read-only.
                readonly_root=policy.readonly_root or policy.isolate,
                writable=writable,
                new_session=not spec.pty,
                private=policy.isolate,
                hidden=hidden,
            )
        if isolation is not None:
            # Only the operator's word weakens a box, whoever built it (the policy, or a face's
            # network_disabled): what the spec brought is replaced, never kept.
            isolation = replace(isolation, fallback=frozenset(policy.isolation_fallback))
        return spec.confined(_limits(policy, spec.limits), isolation)

    return spawn_filter


def make_write_filter(settings: Settings) -> WriteFilter:
    """The filter for ``Supervisor(write_filter=...)``: under an agent policy with ``check_stdin``,
    what is written to a session's stdin is checked as command lines, by every face alike
    (process write/submit/paste/send-keys, proc/write, REST): typing into a shell must not skip the
    command checks."""
    checkers: dict[str, CommandPolicy] = {}

    def write_filter(scope: str, session: Session, data: bytes) -> None:
        scope = agent_of(scope)  # a conversation's input is checked by its agent's policy
        policy = settings.policy.for_agent(scope)
        if not policy.check_stdin:
            return
        for marker in _PASTE_MARKERS:
            data = data.replace(marker, b"")
        try:
            text = data.decode()
        except UnicodeDecodeError:
            raise UnanalyzableCommand(
                "input to a checked session must be UTF-8 text: what a shell would make of these bytes is unknown",
            ) from None
        if not text or set(text) <= _SIGNAL_KEYS:
            return
        if scope not in checkers:
            checkers[scope] = CommandPolicy(allow=policy.allow, deny=policy.deny)
        checkers[scope].check_input(text, session.spec.cwd)

    return write_filter


def _base_path(settings: Settings) -> str:
    import os

    env: Mapping[str, str] = os.environ
    return str(settings.base_env.set.get("PATH") or env.get("PATH", os.defpath))
