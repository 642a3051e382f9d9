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
from pathlib import Path
from typing import Annotated, Any, Literal, NamedTuple

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError
from pydantic_core import ErrorDetails

from procpilot.errors import ConfigError

__all__ = [
    "AgentPolicy",
    "ExecSettings",
    "LaneSettings",
    "PolicySettings",
    "ProcSettings",
    "ProcessToolSettings",
    "ServerSettings",
    "Settings",
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


class ExecSettings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    background_ms: Annotated[_Int, _clamp(10, 120_000)] = 10_000
    timeout_sec: Annotated[int, Field(strict=True, ge=0)] = 1800  # 0 = no limit
    cleanup_ms: Annotated[_Int, _clamp(60_000, 10_800_000)] = 1_800_000
    notify_on_exit: _Bool = True
    max_output_chars: Annotated[_Int, _clamp(100, 200_000)] = 500
    result_max_chars: Annotated[_Int, _clamp(1_000, 200_000)] = 200_000
    pending_max_chars: Annotated[_Int, _clamp(1_000, 200_000)] = 200_000
    max_log_bytes: Annotated[int, Field(strict=True, ge=64 * _KIB)] = 64 * _MIB
    kill_grace_sec: Annotated[float, Field(strict=True, ge=0, le=600)] = 5.0
    pty_cols: Annotated[int, Field(strict=True, ge=1, le=1000)] = 120
    pty_rows: Annotated[int, Field(strict=True, ge=1, le=1000)] = 30
    # "openclaw": the exec/process tools behave as OpenClaw's do where ours differ
    # (faces/openclaw_profile.py holds every difference).
    profile: Literal["procpilot", "openclaw"] = "procpilot"
    # Refuse python/node scripts holding shell syntax ($VAR) before they run; None: the profile's choice.
    script_preflight: _Bool | None = None
    # The restart policy of background runs that do not give one; a restart waits restart_backoff_ms,
    # doubled after each quick failure (up to a minute), and stops after max_restarts.
    restart: Literal["no", "on-failure", "always"] = "no"
    max_restarts: Annotated[_Int, _clamp(0, 10_000)] = 10
    restart_backoff_ms: Annotated[_Int, _clamp(10, 600_000)] = 1000


class ProcessToolSettings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    enabled: _Bool = True


class ServerSettings(BaseModel):
    """``procpilot serve``: where it listens and which bearer token speaks for which agent."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    host: str = "127.0.0.1"
    port: int = Field(8765, ge=0, le=65535)
    unix_socket: Path | None = None
    # token -> agent id (the scope). Kept out of repr so a logged settings object leaks no secret.
    tokens: Mapping[str, str] = Field(default_factory=dict, repr=False)
    # Agent ids that may decide approval requests (never their own); empty: nobody over the daemon.
    approvers: tuple[str, ...] = ()
    # What one agent may hold open: MCP sessions (each costs ~40 KiB) and proc/* WebSockets; an
    # MCP session with no request for this long is closed (the client opens a new one).
    mcp_sessions_per_agent: Annotated[_Int, _clamp(1, 10_000)] = 64
    mcp_session_idle_sec: Annotated[float, Field(strict=True, gt=0, le=86_400)] = 1800.0
    websockets_per_agent: Annotated[_Int, _clamp(1, 10_000)] = 32
    # Calls (REST, MCP) one agent may have running at once; more wait for one of them to end.
    requests_per_agent: Annotated[_Int, _clamp(1, 10_000)] = 16

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
    max_procs: Annotated[_Int, _clamp(1, 10_000)] = 10  # running processes per connection


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
    elevated_allowed: bool = False  # may ask to run outside the box above
    max_procs: int | None = Field(None, ge=1)  # running sessions at once
    memory_limit: int | None = Field(None, ge=1 << 20)  # bytes; the agent's allocation and default
    cpu_limit: float | None = Field(None, gt=0)  # fraction of one core
    pids_max: int | None = Field(None, ge=1)
    # RLIMIT_AS per process, only when asked for: it breaks runtimes that reserve address space.
    address_space_limit: int | None = Field(None, ge=1 << 20)

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


class Settings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    # absolute() rather than resolve() for state: a symlinked state dir is the user's choice to keep.
    state_dir: Annotated[Path, AfterValidator(lambda p: p.expanduser().absolute())] = Field(
        default_factory=_default_state_dir, validate_default=True
    )
    # Resolved, because workdir scope checks compare real paths and a symlink must not widen them.
    workspace_root: Annotated[Path, AfterValidator(lambda p: p.expanduser().resolve())] = Field(
        default_factory=Path.cwd, validate_default=True
    )
    # The file these settings were read from (None: defaults and environment only); an isolated
    # box must not see it, since it holds every agent's token.
    config_file: Path | None = None
    # [tools] names: "underscore" serves process.run as process_run (OpenAI's function names allow
    # no dots); serve: which tools (names, or a face: "exec", "process", "process.*"); None: all.
    tool_names: Literal["dotted", "underscore"] = "dotted"
    served_tools: tuple[str, ...] | None = None
    exec: ExecSettings = ExecSettings()
    process: ProcessToolSettings = ProcessToolSettings()
    lanes: LaneSettings = LaneSettings()
    server: ServerSettings = ServerSettings()
    policy: PolicySettings = PolicySettings()
    proc: ProcSettings = ProcSettings()
    base_env_passthrough: tuple[str, ...] = (
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
    base_env_set: Mapping[str, str] = Field(
        default_factory=lambda: {"PAGER": "cat", "GIT_PAGER": "cat", "GIT_TERMINAL_PROMPT": "0"}
    )
    protected_env: tuple[str, ...] = ("PATH", "HOME", "LD_PRELOAD", "LD_LIBRARY_PATH", "PYTHONPATH")

    def is_protected(self, name: str) -> bool:
        # Every LD_*/DYLD_* variable steers the dynamic loader, so no list of names can be complete.
        # The shell's code hooks (BASH_ENV, ENV, BASH_FUNC_*, PS4 + SHELLOPTS...) run code before any
        # command is checked, so they are never overridable either. PATH alone stays configurable:
        # the command policy resolves programs on the session's own PATH.
        from procpilot.policy.shell import sensitive_variable

        return (
            name in self.protected_env
            or name.startswith(("LD_", "DYLD_"))
            or (name != "PATH" and sensitive_variable(name))
        )

    def describe(self) -> dict[str, Any]:
        """The effective settings under their TOML names (what ``procpilot config`` shows)."""
        exec_ = self.exec.model_dump()
        return {
            "state_dir": str(self.state_dir),
            "workspace_root": str(self.workspace_root),
            "tools": {
                # An unset key (None: "the profile decides") is left out, as TOML has no null.
                "exec": {toml: exec_[field] for toml, field in _EXEC_FIELDS.items() if exec_[field] is not None},
                "process": {"enabled": self.process.enabled},
                "names": self.tool_names,
                "serve": list(self.served_tools) if self.served_tools is not None else None,
            },
            "lanes": self.lanes.model_dump(),
            "base_env": {"passthrough": list(self.base_env_passthrough), "set": dict(self.base_env_set)},
            "env": {"protected": list(self.protected_env)},
            "server": {
                "host": self.server.host,
                "port": self.server.port,
                "unix_socket": str(self.server.unix_socket) if self.server.unix_socket else None,
                "tokens": f"{len(self.server.tokens)} configured",  # never print a secret
                "approvers": list(self.server.approvers),
            },
            "policy": self.policy.model_dump(mode="json"),
            "proc": self.proc.model_dump(mode="json"),
        }


# [tools.exec] key in TOML (the specs' camelCase) -> ExecSettings field.
_EXEC_FIELDS: dict[str, str] = {
    "backgroundMs": "background_ms",
    "timeoutSec": "timeout_sec",
    "cleanupMs": "cleanup_ms",
    "notifyOnExit": "notify_on_exit",
    "maxOutputChars": "max_output_chars",
    "resultMaxChars": "result_max_chars",
    "pendingMaxOutputChars": "pending_max_chars",
    "maxLogBytes": "max_log_bytes",
    "killGraceSec": "kill_grace_sec",
    "ptyCols": "pty_cols",
    "ptyRows": "pty_rows",
    "profile": "profile",
    "scriptPreflight": "script_preflight",
    "restart": "restart",
    "maxRestarts": "max_restarts",
    "restartBackoffMs": "restart_backoff_ms",
}
_EXEC_TOML: dict[str, str] = {field: toml for toml, field in _EXEC_FIELDS.items()}
# Environment variable -> ExecSettings field. Order matters: for one field the first set variable wins
# (OPENCLAW_* is the current name, CLAWDBOT_* the old one).
_ENV_EXEC: tuple[tuple[str, str], ...] = (
    ("PI_BASH_YIELD_MS", "background_ms"),
    ("PI_BASH_JOB_TTL_MS", "cleanup_ms"),
    ("PI_BASH_MAX_OUTPUT_CHARS", "result_max_chars"),
    ("OPENCLAW_BASH_PENDING_MAX_OUTPUT_CHARS", "pending_max_chars"),
    ("CLAWDBOT_BASH_PENDING_MAX_OUTPUT_CHARS", "pending_max_chars"),
)
_ENV_PATHS: tuple[tuple[str, str], ...] = (
    ("PROCPILOT_STATE_DIR", "state_dir"),
    ("PROCPILOT_WORKSPACE", "workspace_root"),
)
_TOP_KEYS = ("state_dir", "workspace_root", "tools", "lanes", "base_env", "env", "server", "policy", "proc")

Loc = tuple[int | str, ...]


def _dotted(parts: Iterable[int | str]) -> str:
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out


def _toml_key(loc: Loc) -> str:
    """A model location as the TOML key: ('exec', 'background_ms') -> tools.exec.backgroundMs."""
    head, rest = loc[0], loc[1:]
    if head == "exec" and rest and rest[0] in _EXEC_TOML:
        return _dotted(("tools", "exec", _EXEC_TOML[str(rest[0])], *rest[1:]))
    renamed: dict[int | str, tuple[str, ...]] = {
        "process": ("tools", "process"),
        "tool_names": ("tools", "names"),
        "served_tools": ("tools", "serve"),
        "base_env_passthrough": ("base_env", "passthrough"),
        "base_env_set": ("base_env", "set"),
        "protected_env": ("env", "protected"),
    }
    return _dotted((*renamed.get(head, (str(head),)), *rest))


def _unknown(key: str, name: str, known: Iterable[str], where: str, **details: Any) -> ConfigError:
    known = sorted(known)
    # Typos such as backgroundMS are the common case, so offer the nearest real key.
    close = [k for k in known if k.lower() == name.lower()] or difflib.get_close_matches(name, known, n=1)
    guess = f" (did you mean {close[0]!r}?)" if close else ""
    return ConfigError(
        f"{key}: unknown key{guess}{where}",
        hints={"known_keys": f"Valid keys here: {', '.join(known)}." if known else "This table takes no keys."},
        key=key,
        **details,
    )


def _parse_env_int(var: str, field: str, raw: str) -> int:
    try:
        return int(raw.strip())
    except ValueError:
        key = f"{var} (tools.exec.{_EXEC_TOML[field]})"
        raise ConfigError(
            f"{key}: expected an integer, got {raw!r} (environment variable)", key=var, value=raw, source="env"
        ) from None


def _from_env(env: Mapping[str, str]) -> tuple[dict[str, Any], dict[Loc, str]]:
    """The environment's layer, and which variable supplied each value (for error messages)."""
    layer: dict[str, Any] = {}
    exec_: dict[str, Any] = {}
    names: dict[Loc, str] = {}
    for var, field in _ENV_EXEC:
        # An empty variable (`FOO= cmd`) is how shells unset for one command, so it counts as unset.
        raw = env.get(var, "")
        if raw.strip() and field not in exec_:
            exec_[field] = _parse_env_int(var, field, raw)
            names[("exec", field)] = var
    if exec_:
        layer["exec"] = exec_
    for var, field in _ENV_PATHS:
        if env.get(var):
            layer[field] = Path(env[var])
            names[(field,)] = var
    return layer, names


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as f:
            return tomllib.load(f)
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


def _from_toml(path: Path) -> dict[str, Any]:
    """The file's layer under the models' field names; structure and unknown keys are checked here,
    where the TOML spelling is still at hand, values by the models afterwards."""
    raw = _read_toml(path)
    where = f" (in {path})"
    base = path.absolute().parent

    def fail(key: str, reason: str, value: Any) -> ConfigError:
        return ConfigError(f"{key}: {reason}, got {value!r}{where}", key=key, value=value, path=str(path))

    def table(value: Any, key: str) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise fail(key, "expected a table", value)
        return value

    def unknown(key: str, name: str, known: Iterable[str]) -> ConfigError:
        return _unknown(key, name, known, where, path=str(path))

    def local_path(value: Any, key: str) -> Path:
        if not isinstance(value, str) or not value:
            raise fail(key, "expected a path string", value)
        # Relative to the file, not the cwd, so a config means the same wherever it is loaded from.
        p = Path(value).expanduser()
        return p if p.is_absolute() else base / p

    out: dict[str, Any] = {}
    for key, value in raw.items():
        if key in ("state_dir", "workspace_root"):
            out[key] = local_path(value, key)
        elif key == "tools":
            for section, body in table(value, "tools").items():
                if section == "exec":
                    exec_: dict[str, Any] = {}
                    for name, item in table(body, "tools.exec").items():
                        if name not in _EXEC_FIELDS:
                            raise unknown(f"tools.exec.{name}", name, _EXEC_FIELDS)
                        exec_[_EXEC_FIELDS[name]] = item
                    out["exec"] = exec_
                elif section == "process":
                    process = table(body, "tools.process")
                    for name in process:
                        if name not in ProcessToolSettings.model_fields:
                            raise unknown(f"tools.process.{name}", name, ProcessToolSettings.model_fields)
                    out["process"] = process
                elif section == "names":
                    out["tool_names"] = body
                elif section == "serve":
                    out["served_tools"] = body
                else:
                    raise unknown(f"tools.{section}", section, ("exec", "process", "names", "serve"))
        elif key == "lanes":
            out["lanes"] = table(value, "lanes")  # any lane name is allowed; the model checks the caps
        elif key == "base_env":
            for name, item in table(value, "base_env").items():
                if name == "passthrough":
                    out["base_env_passthrough"] = item
                elif name == "set":
                    out["base_env_set"] = table(item, "base_env.set")
                else:
                    raise unknown(f"base_env.{name}", name, ("passthrough", "set"))
        elif key == "env":
            for name, item in table(value, "env").items():
                if name != "protected":
                    raise unknown(f"env.{name}", name, ("protected",))
                out["protected_env"] = item
        elif key == "server":
            server = dict(table(value, "server"))
            tokens = server.get("tokens", {})
            # Checked here because the generic message would quote the value, and these values are secrets.
            if not isinstance(tokens, dict) or not all(
                isinstance(k, str) and isinstance(v, str) and k and v for k, v in tokens.items()
            ):
                raise ConfigError(
                    f'server.tokens: expected a table of "token" = "agent-id"{where}',
                    key="server.tokens",
                    path=str(path),
                )
            if isinstance(server.get("unix_socket"), str):
                server["unix_socket"] = local_path(server["unix_socket"], "server.unix_socket")
            out["server"] = server  # other keys and values: the model, with errors named by key
        elif key == "policy":
            out["policy"] = table(value, "policy")
        elif key == "proc":
            proc = table(value, "proc")
            for name in proc:
                if name not in ProcSettings.model_fields:
                    raise unknown(f"proc.{name}", name, ProcSettings.model_fields)
            out["proc"] = proc
        else:
            raise unknown(key, key, _TOP_KEYS)
    return out


def _merge(base: Mapping[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in top.items():
        # base_env.set is one value (the variables to set), not a section: a new one replaces the old.
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping) and key != "base_env_set":
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
    "path_type": "expected a path",
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


class _Source(NamedTuple):
    kind: str  # "override", "file" or "env": where a bad value came from
    layer: Mapping[str, Any]
    name: Callable[[Loc], str]  # a model location as this source spells the key
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
    if loc[:2] == ("server", "tokens"):
        key, value = "server.tokens", "<redacted>"  # a token is a secret, and a bad entry's key is the token
    more = len(exc.errors()) - 1
    also = f" (and {more} more problem{'s' if more > 1 else ''})" if more else ""
    if error["type"] == "extra_forbidden":
        message = f"{key}: unknown key{where}{also}"
    else:
        message = f"{key}: {_reason(error)}, got {value!r}{where}{also}"
    return ConfigError(message, key=key, value=repr(value), source=kind, **details)


def _plain(overrides: Mapping[str, Any]) -> dict[str, Any]:
    # A section passed as a model replaces that section and is validated again (so it is clamped too).
    return {k: v.model_dump() if isinstance(v, BaseModel) else v for k, v in overrides.items()}


def load_settings(config_file: Path | None = None, env: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
    """Build the effective settings: defaults < ``env`` (None: os.environ) < ``config_file`` < ``overrides``.

    ``overrides`` use the Python field names; a dict for a section (``exec={"timeout_sec": 5}``) merges
    into that section. Raises ConfigError, naming the key and value, for anything invalid.
    """
    env = os.environ if env is None else env
    defaults: dict[str, Any] = {"state_dir": _default_state_dir(env)}
    env_layer, env_names = _from_env(env)
    file_layer: dict[str, Any] = {}
    override_layer = _plain(overrides)
    sources = [_Source("override", override_layer, _dotted, " (keyword argument)", {})]
    if config_file is not None:
        path = Path(config_file)
        file_layer = _from_toml(path)
        sources.append(_Source("file", file_layer, _toml_key, f" (in {path})", {"path": str(path)}))

    def env_key(loc: Loc) -> str:
        var = env_names.get(loc[:2]) or env_names.get(loc[:1])
        return f"{var} ({_toml_key(loc)})" if var else _toml_key(loc)

    sources.append(_Source("env", env_layer, env_key, " (environment variable)", {}))
    merged = _merge(_merge(_merge(defaults, env_layer), file_layer), override_layer)
    if config_file is not None:
        merged["config_file"] = Path(config_file).absolute()
    try:
        return Settings.model_validate(merged)
    except ValidationError as exc:
        raise _config_error(exc, sources) from None
