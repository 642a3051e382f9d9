"""Frozen settings: built-in defaults < environment variables < TOML file < explicit overrides.

The file outranks the environment because spec 004 prefers config over env vars. Values the specs
call bounded are clamped into range; anything else that is wrong is a ConfigError whose message
names the key as the user wrote it (TOML key, env var or keyword) and the bad value, because agents
and people fix what the message names and never see a pydantic traceback.
"""

from __future__ import annotations

import difflib
import os
import tomllib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, NamedTuple, get_args, get_origin

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic.fields import FieldInfo
from pydantic_core import ErrorDetails

from procpilot.errors import ConfigError

__all__ = [
    "ENVIRONMENT_VARIABLES",
    "AgentPolicy",
    "BaseEnvSettings",
    "ClusterSettings",
    "EngineSettings",
    "EnvSettings",
    "ExecSettings",
    "LaneSettings",
    "PolicySettings",
    "ProcSettings",
    "ProcessToolSettings",
    "ServerSettings",
    "Settings",
    "ToolsSettings",
    "load_settings",
]

_KIB = 1024
_MIB = 1024 * _KIB


def _clamp(lo: int, hi: int) -> AfterValidator:
    # The specs bound these values rather than reject them, so out-of-range input is pulled in silently.
    return AfterValidator(lambda v: min(max(v, lo), hi))


# Strict: TOML has real types, so "5000" or 5000.0 or true where an integer belongs is a mistake to report,
# not something to coerce.
_Int = Annotated[int, Field(strict=True)]
_Bool = Annotated[bool, Field(strict=True)]
_Cap = Annotated[int, Field(strict=True, ge=1)]


# Paths a config file names are relative to that file, not to the cwd, so a config means the same
# wherever it is loaded from (an environment variable's relative path is the cwd's, as usual).
_RELATIVE_TO_FILE = object()
_FilePath = Annotated[Path, _RELATIVE_TO_FILE]


class LaneSettings(BaseModel):
    """Concurrency caps per lane. ``cron`` applies per job (``cron:<job>``); unknown lanes get ``default``."""

    model_config = ConfigDict(frozen=True, extra="allow")

    # Extra lane names are validated like the named ones instead of being stored as whatever came in.
    __pydantic_extra__: dict[str, _Cap] = Field(init=False)

    main: _Cap = 1
    subagent: _Cap = 8
    cron: _Cap = 1
    default: _Cap = 1

    def caps(self) -> dict[str, int]:
        return {k: int(v) for k, v in self.model_dump().items() if k != "default"}


def _camel(name: str) -> str:
    first, *rest = name.split("_")
    return first + "".join(part.title() for part in rest)


# Characters of output one result shows at most: Claude Code's Bash tool keeps 30,000, and
# Claude Code refuses a whole MCP result past 25,000 tokens (the text and the structured form
# each carry the output, so each stays near this many characters).
RESULT_CHARS = 30_000
OPENCLAW_RESULT_CHARS = 200_000


class ExecSettings(BaseModel):
    """``[tools.exec]``: the exec tool's keys, in the specs' camelCase (the aliases) in TOML."""

    # validate_by_name: Python keeps the snake_case names (``exec={"timeout_sec": 5}``).
    model_config = ConfigDict(frozen=True, extra="forbid", alias_generator=_camel, validate_by_name=True)

    background_ms: Annotated[_Int, _clamp(10, 120_000)] = 10_000
    timeout_sec: Annotated[int, Field(strict=True, ge=0)] = 1800  # 0 = no limit
    cleanup_ms: Annotated[_Int, _clamp(60_000, 10_800_000)] = 1_800_000
    notify_on_exit: _Bool = True
    max_output_chars: Annotated[_Int, _clamp(100, 200_000)] = 500
    # The result budget: characters of output one result shows at most, head and tail (default
    # RESULT_CHARS; the openclaw profile keeps OpenClaw's own 200,000).
    result_max_chars: Annotated[_Int, _clamp(1_000, 200_000)] = RESULT_CHARS
    pending_max_chars: Annotated[_Int, _clamp(1_000, 200_000)] = Field(200_000, alias="pendingMaxOutputChars")
    max_log_bytes: Annotated[int, Field(strict=True, ge=64 * _KIB)] = 64 * _MIB
    # SIGTERM, then SIGKILL this long after (0: SIGKILL at once). Spec 001 ends a timed-out tree
    # with SIGKILL and finalizes it a second later; a second of SIGTERM first keeps that bound
    # and still lets a program that handles TERM shut down cleanly (docs/tools.md, "Ending").
    kill_grace_sec: Annotated[float, Field(strict=True, ge=0, le=600)] = 1.0
    pty_cols: Annotated[int, Field(strict=True, ge=1, le=1000)] = 120
    pty_rows: Annotated[int, Field(strict=True, ge=1, le=1000)] = 30
    # "openclaw": the exec/process tools behave as OpenClaw's do where ours differ
    # (faces/openclaw_profile.py holds every difference). "codex" and "claude": Codex CLI's
    # exec_command/write_stdin or Claude Code's Bash/TaskOutput/TaskStop take their place
    # (faces/codex_profile.py, faces/claude_profile.py).
    profile: Literal["procpilot", "openclaw", "codex", "claude"] = "procpilot"
    # Refuse python/node scripts holding shell syntax ($VAR) before they run; None: the profile's choice.
    script_preflight: _Bool | None = None
    # The restart policy of background runs that do not give one; a restart waits restart_backoff_ms,
    # doubled after each quick failure (up to a minute), and stops after max_restarts.
    restart: Literal["no", "on-failure", "always"] = "no"
    max_restarts: Annotated[_Int, _clamp(0, 10_000)] = 10
    restart_backoff_ms: Annotated[_Int, _clamp(10, 600_000)] = 1000

    @model_validator(mode="before")
    @classmethod
    def _profile_budget(cls, data: Any) -> Any:
        """The openclaw profile's default result budget is OpenClaw's own (its agents expect it)."""
        unset = isinstance(data, Mapping) and not {"resultMaxChars", "result_max_chars"} & data.keys()
        if unset and data.get("profile") == "openclaw":
            return {**data, "resultMaxChars": OPENCLAW_RESULT_CHARS}
        return data


class ProcessToolSettings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    enabled: _Bool = True


class ServerSettings(BaseModel):
    """``procpilot serve``: where it listens and which bearer token speaks for which agent."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    host: str = "127.0.0.1"
    port: int = Field(8765, ge=0, le=65535)
    unix_socket: Annotated[Path | None, _RELATIVE_TO_FILE] = None
    # token -> agent id (the scope). Kept out of repr so a logged settings object leaks no secret.
    tokens: Mapping[str, str] = Field(default_factory=dict, repr=False)
    # Agent ids that may decide approval requests (never their own); empty: nobody over the daemon.
    approvers: tuple[str, ...] = ()
    # Agent ids whose token sees and acts on every agent's sessions (the console; REST with ?agent=).
    operators: tuple[str, ...] = ()
    # What one agent may hold open: MCP sessions (each costs ~40 KiB) and proc/* WebSockets; an
    # MCP session with no request for this long is closed (the client opens a new one).
    mcp_sessions_per_agent: Annotated[_Int, _clamp(1, 10_000)] = 64
    mcp_session_idle_sec: Annotated[float, Field(strict=True, gt=0, le=86_400)] = 1800.0
    websockets_per_agent: Annotated[_Int, _clamp(1, 10_000)] = 32
    # Calls (REST, MCP, proc/* requests) one agent may have open at once; more wait for one of them
    # to end, at most requests_queued_per_agent of them (past it 429 TooManyRequests). Of the open
    # ones, requests_working_per_agent are worked on at once; a call waiting for its process, an
    # approver or its client gives its turn to the next (procpilot/turns.py).
    requests_per_agent: Annotated[_Int, _clamp(1, 10_000)] = 16
    requests_queued_per_agent: Annotated[_Int, _clamp(0, 100_000)] = 64
    requests_working_per_agent: Annotated[_Int, _clamp(1, 10_000)] = 1
    # How long a call's wait for its command to end still counts as its work (keeps its turn).
    requests_short_run_ms: Annotated[_Int, _clamp(0, 600_000)] = 100
    # Every connection must finish each request's head within this, and its body within
    # body_timeout_sec after the head (else 408, and closed); past max_connections open at once, a
    # new one is answered 503 and closed (transports/connections.py, transports/http/bodies.py).
    header_timeout_sec: Annotated[float, Field(strict=True, gt=0, le=3600)] = 10.0
    body_timeout_sec: Annotated[float, Field(strict=True, gt=0, le=3600)] = 10.0
    max_connections: Annotated[_Int, _clamp(16, 1_000_000)] = 4096
    # Running sessions the server makes room for in its descriptor limit at start (2 descriptors
    # each, and one per connection): its soft limit up to the hard one, as root the hard one too
    # (engine/descriptors.py).
    max_running_sessions: Annotated[_Int, _clamp(1, 200_000)] = 10_000

    @property
    def loopback_only(self) -> bool:
        return self.host in ("127.0.0.1", "::1", "localhost") or self.host.startswith("127.")


class ProcSettings(BaseModel):
    """``[proc]``: the proc/* protocol (spec 003) over the daemon's WebSocket, one handler per connection."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    allowed_commands: tuple[str, ...] | None = None  # None: any (the agent's policy still applies)
    # Seconds a process may run unless its spawn request says otherwise; 0 = no limit (TOML has no null).
    timeout: Annotated[float, Field(strict=True, ge=0)] = 30.0
    max_output_bytes: Annotated[_Int, _clamp(0, 1 << 30)] = _MIB  # pushed per process; the rest stays on disk
    max_procs: Annotated[_Int, _clamp(1, 10_000)] = 10  # running processes per agent (all its connections)
    # Spec 003's example config: each process gets only a private loopback (refused where no
    # mechanism can give it, never run with the network on: docs/security.md).
    network_disabled: _Bool = False


Tier = Literal["autonomous", "notify", "approval_required", "blocked"]


class AgentPolicy(BaseModel):
    """What one agent may do: its commands, its permission tiers, and its box."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    allow: tuple[str, ...] | None = None  # programs it may run (resolved paths); None = any
    deny: tuple[str, ...] = ()
    check_stdin: bool = False  # check text written to interactive shells like commands
    tiers: Mapping[str, Tier] = Field(default_factory=dict)  # tool name -> tier (overrides the tool's own)
    # False: sessions get only a private loopback. Unset: on, except in an isolated box, whose
    # network is its own unless this says true (the host's network holds the daemon's port).
    network: bool | None = None
    readonly_root: bool = False  # True: only the workspace (and `writable`) can be written
    # True: a box of its own (needs bubblewrap): read-only root but the workspace, `writable` and
    # a private /tmp; a private pid namespace, no capabilities; the daemon's state directory,
    # config file and Unix socket and the cgroup tree hidden; no network unless `network = true`.
    # Its sessions cannot see, signal or read the logs of any other agent's, nor reach the daemon.
    isolate: bool = False
    writable: tuple[str, ...] = ()
    # Weaker mechanisms a box may fall back to where bubblewrap or network namespaces are missing:
    # "landlock" (a read-only root without a pid namespace, a private /tmp or hidden paths),
    # "seccomp" (no network by socket family: no loopback either). Empty: refuse instead.
    isolation_fallback: tuple[Literal["landlock", "seccomp"], ...] = ()
    elevated_allowed: bool = False  # may ask to run outside the box above
    max_procs: int | None = Field(None, ge=1)  # running sessions at once
    memory_limit: int | None = Field(None, ge=1 << 20)  # bytes; the agent's allocation and default
    cpu_limit: float | None = Field(None, gt=0)  # fraction of one core
    pids_max: int | None = Field(None, ge=1)
    # RLIMIT_AS per process, only when asked for: it breaks runtimes that reserve address space.
    address_space_limit: int | None = Field(None, ge=1 << 20)
    # On a cluster ([cluster] backend = "ray"): the Ray custom resource a node must offer to run
    # this agent's sessions (the node that holds its workspace). None: the least busy node.
    placement: str | None = Field(None, min_length=1, max_length=128)

    @property
    def network_allowed(self) -> bool:
        return self.network if self.network is not None else not self.isolate


class PolicySettings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    default: AgentPolicy = AgentPolicy()
    agents: Mapping[str, AgentPolicy] = Field(default_factory=dict)
    approval_timeout_sec: float = Field(300.0, gt=0)

    def for_agent(self, agent: str) -> AgentPolicy:
        """The agent's own entries over the defaults (only the keys its table sets)."""
        own = self.agents.get(agent)
        if own is None:
            return self.default
        return self.default.model_copy(update={k: getattr(own, k) for k in own.model_fields_set})


def _default_state_dir(env: Mapping[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    xdg = env.get("XDG_STATE_HOME", "")
    # The XDG spec says a relative XDG_STATE_HOME is invalid and must be ignored.
    if xdg and Path(xdg).is_absolute():
        return Path(xdg) / "procpilot"
    home = Path(env["HOME"]) if env.get("HOME") else Path.home()
    return home / ".local" / "state" / "procpilot"


class ToolsSettings(BaseModel):
    """``[tools]``: the tools' own sections, how their names are spelled, and which are served."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    exec: ExecSettings = ExecSettings()
    process: ProcessToolSettings = ProcessToolSettings()
    # "underscore" serves process.run as process_run (OpenAI's function names allow no dots).
    names: Literal["dotted", "underscore"] = "dotted"
    # Which tools: names, or a face ("exec", "process", "process.*"); None: all.
    serve: tuple[str, ...] | None = None
    # True: each MCP session (conversation) of a token sees only the sessions it started (spec 002's
    # "isolated by conversationId"); policy, limits, lanes and audit stay the agent's.
    isolate_conversations: _Bool = False


class BaseEnvSettings(BaseModel):
    """``[base_env]``: what every session's environment starts from."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    passthrough: tuple[str, ...] = (
        "PATH",
        "HOME",
        "USER",
        "LOGNAME",
        "LANG",
        "LC_ALL",
        "LC_CTYPE",
        "TZ",
        "TMPDIR",
        "SHELL",
    )
    # PYTHONUNBUFFERED: python writing to a pipe buffers 8 KB, so a background server's banner
    # (http.server's "Serving HTTP") reached no wait or poll for minutes. A call's env overrides it.
    set: Mapping[str, str] = Field(
        default_factory=lambda: {
            "PAGER": "cat",
            "GIT_PAGER": "cat",
            "GIT_TERMINAL_PROMPT": "0",
            "PYTHONUNBUFFERED": "1",
        }
    )


class EnvSettings(BaseModel):
    """``[env]``: variables no call may override."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    protected: tuple[str, ...] = ("PATH", "HOME", "LD_PRELOAD", "LD_LIBRARY_PATH", "PYTHONPATH")


class ClusterSettings(BaseModel):
    """``[cluster]``: where sessions run. ``local`` (the default) is this host, and Ray is never
    imported; ``ray`` joins the Ray cluster at ``address`` and runs one supervisor per node."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    backend: Literal["local", "ray"] = "local"
    address: str = Field("auto", min_length=1, max_length=256)  # "HOST:PORT" of the head, or "auto"


@dataclass(frozen=True, slots=True)
class EngineSettings:
    """What the engine reads, and nothing else: no tokens, no face's section."""

    state_dir: Path
    max_log_bytes: int = 64 * _MIB
    kill_grace_sec: float = 5.0
    session_ttl_sec: float = 1800.0  # a finished session unread for this long is removed
    lane_caps: Mapping[str, int] = field(default_factory=lambda: LaneSettings().caps())
    default_lane_cap: int = 1
    env_passthrough: tuple[str, ...] = BaseEnvSettings().passthrough
    env_set: Mapping[str, str] = field(default_factory=lambda: dict(BaseEnvSettings().set))
    protected_env: tuple[str, ...] = EnvSettings().protected  # never overridable by a call
    warm_shells: int = 2  # shells started ahead of time, in their sessions' cgroups (engine/warm.py)


class Settings(BaseModel):
    """Everything, shaped as the TOML file is: each section a model, each key a field (or its alias)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    # absolute() rather than resolve() for state: a symlinked state dir is the user's choice to keep.
    state_dir: Annotated[_FilePath, AfterValidator(lambda p: p.expanduser().absolute())] = Field(
        default_factory=_default_state_dir, validate_default=True
    )
    # Resolved, because workdir scope checks compare real paths and a symlink must not widen them.
    workspace_root: Annotated[_FilePath, AfterValidator(lambda p: p.expanduser().resolve())] = Field(
        default_factory=Path.cwd, validate_default=True
    )
    # The file these settings were read from (None: defaults and environment only); an isolated
    # box must not see it, since it holds every agent's token. Not a key of the file itself.
    config_file: Path | None = Field(None, exclude=True)
    tools: ToolsSettings = ToolsSettings()
    lanes: LaneSettings = LaneSettings()
    base_env: BaseEnvSettings = BaseEnvSettings()
    env: EnvSettings = EnvSettings()
    server: ServerSettings = ServerSettings()
    policy: PolicySettings = PolicySettings()
    proc: ProcSettings = ProcSettings()
    cluster: ClusterSettings = ClusterSettings()

    # Shortcuts under the names Python callers knew before the models mirrored the file.
    @property
    def exec(self) -> ExecSettings:
        return self.tools.exec

    @property
    def process(self) -> ProcessToolSettings:
        return self.tools.process

    @property
    def tool_names(self) -> Literal["dotted", "underscore"]:
        return self.tools.names

    @property
    def served_tools(self) -> tuple[str, ...] | None:
        return self.tools.serve

    @property
    def engine(self) -> EngineSettings:
        """The engine's part: the Supervisor reads this, never the rest."""
        lanes = self.lanes.caps()
        return EngineSettings(
            state_dir=self.state_dir,
            max_log_bytes=self.exec.max_log_bytes,
            kill_grace_sec=self.exec.kill_grace_sec,
            session_ttl_sec=self.exec.cleanup_ms / 1000,
            lane_caps=lanes,
            default_lane_cap=int(self.lanes.default),
            env_passthrough=self.base_env.passthrough,
            env_set=dict(self.base_env.set),
            protected_env=self.env.protected,
        )

    def describe(self) -> dict[str, Any]:
        """The effective settings under their TOML names (what ``procpilot config`` shows)."""
        shown = self.model_dump(mode="json", by_alias=True)
        exec_ = shown["tools"]["exec"]
        if exec_["scriptPreflight"] is None:
            del exec_["scriptPreflight"]  # unset (the profile decides), and TOML has no null
        server = shown["server"]
        server["tokens"] = f"{len(self.server.tokens)} configured"  # never print a secret
        return shown


# Environment variable -> [tools.exec] key. Order matters: for one key the first set variable wins
# (OPENCLAW_* is the current name, CLAWDBOT_* the old one).
_ENV_EXEC: tuple[tuple[str, str], ...] = (
    ("PI_BASH_YIELD_MS", "backgroundMs"),
    ("PI_BASH_JOB_TTL_MS", "cleanupMs"),
    ("PROCPILOT_RESULT_CHARS", "resultMaxChars"),
    ("PI_BASH_MAX_OUTPUT_CHARS", "resultMaxChars"),
    ("OPENCLAW_BASH_PENDING_MAX_OUTPUT_CHARS", "pendingMaxOutputChars"),
    ("CLAWDBOT_BASH_PENDING_MAX_OUTPUT_CHARS", "pendingMaxOutputChars"),
)
_ENV_PATHS: tuple[tuple[str, str], ...] = (
    ("PROCPILOT_STATE_DIR", "state_dir"),
    ("PROCPILOT_WORKSPACE", "workspace_root"),
)
# Every variable load_settings() reads (transports/handshake_seed.py must know them all).
ENVIRONMENT_VARIABLES = tuple(var for var, _ in (*_ENV_EXEC, *_ENV_PATHS))
# The Python shortcuts load_settings() takes as keywords -> where they live in the file.
_SHORTCUTS: dict[str, tuple[str, ...]] = {
    "exec": ("tools", "exec"),
    "process": ("tools", "process"),
    "tool_names": ("tools", "names"),
    "served_tools": ("tools", "serve"),
}

Loc = tuple[int | str, ...]


def _dotted(parts: Iterable[int | str]) -> str:
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out


def _keys(model: type[BaseModel]) -> dict[str, FieldInfo]:
    """A model's fields under their TOML keys (the alias where there is one)."""
    return {info.alias or name: info for name, info in model.model_fields.items() if not info.exclude}


def _nested(annotation: Any) -> tuple[type[BaseModel] | None, bool]:
    """The model a field holds, and whether it is a table of them keyed by name (policy.agents)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation, False
    args = get_args(annotation)
    if get_origin(annotation) in (Mapping, dict) and len(args) == 2:
        inner, _ = _nested(args[1])
        return inner, inner is not None
    return None, False


def _model_at(loc: Loc) -> type[BaseModel] | None:
    """The model that holds the keys at ``loc`` (a TOML path), if a model does."""
    model: type[BaseModel] | None = Settings
    parts = list(loc)
    while parts and model is not None:
        info = _keys(model).get(str(parts.pop(0)))
        if info is None:
            return None
        model, keyed = _nested(info.annotation)
        if keyed and parts:
            parts.pop(0)  # the entry's own name (an agent id)
        elif keyed:
            return None
    return model


def _python_key(loc: Loc) -> str:
    """A TOML path as the keyword arguments spell it: tools.exec.timeoutSec -> exec.timeout_sec."""
    names: list[int | str] = []
    model: type[BaseModel] | None = Settings
    parts = list(loc)
    while parts:
        part = parts.pop(0)
        if model is None or isinstance(part, int):
            names.append(part)
            continue
        info = _keys(model).get(part)
        name = next((n for n, f in model.model_fields.items() if f is info), part)
        names.append(name)
        model, keyed = _nested(info.annotation) if info is not None else (None, False)
        if keyed and parts:
            names.append(parts.pop(0))
    for short, path in _SHORTCUTS.items():
        if tuple(names[: len(path)]) == path:
            return _dotted((short, *names[len(path) :]))
    return _dotted(names)


def _python_names(model: type[BaseModel], data: Mapping[str, Any], loc: Loc = ()) -> dict[str, Any]:
    """Keyword overrides (Python field names, or a section as a model) as TOML keys; a key that is
    not a field's Python name is refused here, since as an alias it would pass validation."""
    out: dict[str, Any] = {}
    fields = model.model_fields
    for key, given in data.items():
        value = given.model_dump() if isinstance(given, BaseModel) else given  # validated again
        info = fields.get(key)
        if info is None:
            if model.model_config.get("extra") == "allow":
                out[key] = value
                continue
            name = f"{_python_key(loc)}.{key}" if loc else key
            message, hints = _unknown(name, key, fields, " (keyword argument)")
            raise ConfigError(message, hints=hints, key=name, source="override")
        alias = info.alias or key
        inner, keyed = _nested(info.annotation)
        if inner is not None and isinstance(value, Mapping):
            if keyed:
                value = {
                    k: _python_names(inner, v, (*loc, alias, k)) if isinstance(v, Mapping) else v
                    for k, v in value.items()
                }
            else:
                value = _python_names(inner, value, (*loc, alias))
        out[alias] = value
    return out


def _rebase_paths(model: type[BaseModel], data: dict[str, Any], base: Path) -> None:
    """Make the file's relative paths relative to the file (see _FilePath), in place."""
    for key, info in _keys(model).items():
        value = data.get(key)
        if _RELATIVE_TO_FILE in info.metadata and isinstance(value, str) and value:
            path = Path(value).expanduser()
            data[key] = path if path.is_absolute() else base / path
        inner, keyed = _nested(info.annotation)
        if inner is not None and not keyed and isinstance(value, dict):
            _rebase_paths(inner, value, base)


def _parse_env_int(var: str, key: str, raw: str) -> int:
    try:
        return int(raw.strip())
    except ValueError:
        raise ConfigError(
            f"{var} (tools.exec.{key}): expected an integer, got {raw!r} (environment variable)",
            key=var,
            value=raw,
            source="env",
        ) from None


def _from_env(env: Mapping[str, str]) -> tuple[dict[str, Any], dict[Loc, str]]:
    """The environment's layer, and which variable supplied each value (for error messages)."""
    layer: dict[str, Any] = {}
    exec_: dict[str, Any] = {}
    names: dict[Loc, str] = {}
    for var, key in _ENV_EXEC:
        # An empty variable (`FOO= cmd`) is how shells unset for one command, so it counts as unset.
        raw = env.get(var, "")
        if raw.strip() and key not in exec_:
            exec_[key] = _parse_env_int(var, key, raw)
            names[("tools", "exec", key)] = var
    if exec_:
        layer["tools"] = {"exec": exec_}
    for var, key in _ENV_PATHS:
        if env.get(var):
            layer[key] = Path(env[var])
            names[(key,)] = var
    return layer, names


def _from_toml(path: Path) -> dict[str, Any]:
    """The file's layer: its tables as they are (the models know every key), paths made
    relative to the file."""
    try:
        with path.open("rb") as f:
            raw = tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(
            f"config file not found: {path}",
            hints={"check_path": "Pass the path of an existing TOML file, or no --config to use defaults."},
            path=str(path),
        ) from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"invalid TOML in config file {path}: {exc}", path=str(path)) from None
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror or exc}", path=str(path)) from None
    _rebase_paths(Settings, raw, path.absolute().parent)
    return raw


def _merge(base: Mapping[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in top.items():
        # base_env.set is one value (the variables to set), not a section: a new one replaces the old.
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping) and key != "set":
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _holds(layer: Mapping[str, Any], loc: Loc) -> bool:
    """Whether ``layer`` supplied the value at ``loc`` (a list or scalar on the way supplied all of it)."""
    node: Any = layer
    for part in loc:
        if not isinstance(node, Mapping):
            return True
        if part not in node:
            return False
        node = node[part]
    return True


_REASONS: dict[str, str] = {
    "int_type": "expected an integer",
    "int_parsing": "expected an integer",
    "int_from_float": "expected an integer",
    "bool_type": "expected true or false",
    "bool_parsing": "expected true or false",
    "float_type": "expected a number",
    "float_parsing": "expected a number",
    "string_type": "expected a string",
    "tuple_type": "expected a list",
    "list_type": "expected a list",
    "dict_type": "expected a table",
    "mapping_type": "expected a table",
    "model_type": "expected a table",
    "model_attributes_type": "expected a table",
    "path_type": "expected a path string",
}


def _reason(error: ErrorDetails) -> str:
    ctx = error.get("ctx") or {}
    kind = error["type"]
    if kind in _REASONS:
        return _REASONS[kind]
    bounds = {
        "greater_than_equal": ("must be at least", "ge"),
        "greater_than": ("must be greater than", "gt"),
        "less_than_equal": ("must be at most", "le"),
        "less_than": ("must be less than", "lt"),
    }
    if kind in bounds:
        words, name = bounds[kind]
        return f"{words} {ctx.get(name)}"
    if kind == "literal_error":
        return f"expected {ctx.get('expected')}"
    return str(error["msg"]).lower()


def _unknown(key: str, name: str, known: Iterable[str], where: str) -> tuple[str, dict[str, str]]:
    """The message for a key that is not there, with the nearest real key (typos such as
    backgroundMS are the common case) and the valid ones as a hint."""
    known = sorted(known)
    close = [k for k in known if k.lower() == name.lower()] or difflib.get_close_matches(name, known, n=1)
    guess = f" (did you mean {close[0]!r}?)" if close else ""
    hint = f"Valid keys here: {', '.join(known)}." if known else "This table takes no keys."
    return f"{key}: unknown key{guess}{where}", {"known_keys": hint}


class _Source(NamedTuple):
    kind: str  # "override", "file" or "env": where a bad value came from
    layer: Mapping[str, Any]
    name: Callable[[Loc], str]  # a location as this source spells the key
    where: str
    details: dict[str, Any]


def _config_error(exc: ValidationError, sources: list[_Source]) -> ConfigError:
    error = exc.errors()[0]
    loc: Loc = tuple(error["loc"])
    kind, key, where, details = "default", _dotted(loc), "", {}
    # The highest layer holding the key is the one whose value won the merge, so it is the one to blame.
    for source in sources:
        if _holds(source.layer, loc):
            kind, key, where, details = source.kind, source.name(loc), source.where, source.details
            break
    value: Any = error.get("input")
    secret = loc[:2] == ("server", "tokens")
    if secret:
        key, value = "server.tokens", "<redacted>"  # a token is a secret, and a bad entry's key is the token
    more = len(exc.errors()) - 1
    also = f" (and {more} more problem{'s' if more > 1 else ''})" if more else ""
    hints: dict[str, str] = {}
    if error["type"] == "extra_forbidden" and not secret:
        model = _model_at(loc[:-1])
        message, hints = _unknown(key, str(loc[-1]), _keys(model) if model else (), also + where)
    elif secret:
        message = f'server.tokens: expected a table of "token" = "agent-id"{also}{where}'
    else:
        message = f"{key}: {_reason(error)}, got {value!r}{also}{where}"
    return ConfigError(message, hints=hints or None, key=key, value=repr(value), source=kind, **details)


def load_settings(config_file: Path | None = None, env: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
    """Build the effective settings: defaults < ``env`` (None: os.environ) < ``config_file`` < ``overrides``.

    ``overrides`` use the Python field names (and the shortcuts ``exec``, ``process``,
    ``tool_names``, ``served_tools``); a dict for a section (``exec={"timeout_sec": 5}``) merges
    into that section. Raises ConfigError, naming the key and value, for anything invalid.
    """
    env = os.environ if env is None else env
    defaults: dict[str, Any] = {"state_dir": _default_state_dir(env)}
    env_layer, env_names = _from_env(env)
    shortcuts: dict[str, Any] = {}
    for name, (section, key) in _SHORTCUTS.items():
        if name in overrides:
            shortcuts.setdefault(section, {})[key] = overrides.pop(name)
    override_layer = _merge(_python_names(Settings, overrides), _python_names(Settings, shortcuts))
    sources = [_Source("override", override_layer, _python_key, " (keyword argument)", {})]
    file_layer: dict[str, Any] = {}
    if config_file is not None:
        path = Path(config_file)
        file_layer = _from_toml(path)
        sources.append(_Source("file", file_layer, _dotted, f" (in {path})", {"path": str(path)}))

    def env_key(loc: Loc) -> str:
        var = env_names.get(loc[:3]) or env_names.get(loc[:1])
        return f"{var} ({_dotted(loc)})" if var else _dotted(loc)

    sources.append(_Source("env", env_layer, env_key, " (environment variable)", {}))
    merged = _merge(_merge(_merge(defaults, env_layer), file_layer), override_layer)
    if config_file is not None:
        merged["config_file"] = Path(config_file).absolute()
    try:
        # By alias only: the file spells keys as the TOML does (timeoutSec, not timeout_sec), and
        # the keyword arguments were put in those terms above.
        settings = Settings.model_validate(merged, by_alias=True, by_name=False)
    except ValidationError as exc:
        raise _config_error(exc, sources) from None
    _check_cluster(settings.cluster)
    return settings


def _check_cluster(cluster: ClusterSettings) -> None:
    """The ray backend needs the optional extra; find_spec looks for it without importing it."""
    import importlib.util

    if cluster.backend == "ray" and importlib.util.find_spec("ray") is None:
        raise ConfigError(
            'cluster.backend = "ray" needs Ray, which is not installed',
            hints={"install": "pip install 'procpilot[ray]'", "fix_config": 'Or set cluster.backend = "local".'},
            key="cluster.backend",
            value="'ray'",
        )
