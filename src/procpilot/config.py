"""Frozen settings: built-in defaults < environment variables < TOML file < explicit overrides.

Config is preferred over environment variables, as spec 004 says. Values the specs call bounded
are clamped into range; anything else that is wrong is a ConfigError naming the key.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from procpilot.errors import ConfigError

__all__ = [
    "AgentPolicy",
    "ExecSettings",
    "LaneSettings",
    "PolicySettings",
    "ProcessToolSettings",
    "ServerSettings",
    "Settings",
    "load_settings",
]

_MIB = 1024 * 1024


class LaneSettings(BaseModel):
    """Concurrency caps per lane. ``cron`` applies per job (``cron:<job>``); unknown lanes get ``default``."""

    model_config = ConfigDict(frozen=True, extra="allow")

    main: int = Field(1, ge=1)
    subagent: int = Field(8, ge=1)
    cron: int = Field(1, ge=1)
    default: int = Field(1, ge=1)

    def caps(self) -> dict[str, int]:
        return {k: int(v) for k, v in self.model_dump().items() if k != "default"}


class ExecSettings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    background_ms: int = 10_000
    timeout_sec: int = Field(1800, ge=0)
    cleanup_ms: int = 1_800_000
    notify_on_exit: bool = True
    max_output_chars: int = 500
    result_max_chars: int = 200_000
    pending_max_chars: int = 200_000
    max_log_bytes: int = Field(64 * _MIB, ge=64 * 1024)
    kill_grace_sec: float = Field(5.0, ge=0, le=600)
    pty_cols: int = Field(120, ge=1, le=1000)
    pty_rows: int = Field(30, ge=1, le=1000)


class ProcessToolSettings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    enabled: bool = True


class ServerSettings(BaseModel):
    """``procpilot serve``: where it listens and which bearer token speaks for which agent."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    host: str = "127.0.0.1"
    port: int = Field(8765, ge=0, le=65535)
    unix_socket: Path | None = None
    # token -> agent id (the scope). Kept out of repr so a logged settings object leaks no secret.
    tokens: Mapping[str, str] = Field(default_factory=dict, repr=False)

    @property
    def loopback_only(self) -> bool:
        return self.host in ("127.0.0.1", "::1", "localhost") or self.host.startswith("127.")


Tier = Literal["autonomous", "notify", "approval_required", "blocked"]


class AgentPolicy(BaseModel):
    """What one agent may do: its commands, its permission tiers, and its box."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    allow: tuple[str, ...] | None = None  # programs it may run (resolved paths); None = any
    deny: tuple[str, ...] = ()
    check_stdin: bool = False  # check text written to interactive shells like commands
    tiers: Mapping[str, Tier] = Field(default_factory=dict)  # tool name -> tier (overrides the tool's own)
    network: bool = True  # False: sessions get only a private loopback
    readonly_root: bool = False  # True: only the workspace (and `writable`) can be written
    writable: tuple[str, ...] = ()
    elevated_allowed: bool = False  # may ask to run outside the box above
    max_procs: int | None = Field(None, ge=1)  # running sessions at once
    memory_limit: int | None = Field(None, ge=1 << 20)  # bytes; the agent's allocation and default
    cpu_limit: float | None = Field(None, gt=0)  # fraction of one core
    pids_max: int | None = Field(None, ge=1)


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


def _default_state_dir() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "procpilot"


class Settings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    state_dir: Path = Field(default_factory=_default_state_dir)
    workspace_root: Path = Field(default_factory=Path.cwd)
    exec: ExecSettings = ExecSettings()
    process: ProcessToolSettings = ProcessToolSettings()
    lanes: LaneSettings = LaneSettings()
    server: ServerSettings = ServerSettings()
    policy: PolicySettings = PolicySettings()
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
        return name in self.protected_env or name.startswith(("LD_", "DYLD_"))

    def describe(self) -> dict[str, Any]:
        """The effective settings under their TOML names."""
        out: dict[str, Any] = {"state_dir": str(self.state_dir), "workspace_root": str(self.workspace_root)}
        ex = self.exec.model_dump()
        out["tools"] = {
            "exec": {toml: ex[py] for toml, (_sec, py) in _EXEC_KEYS.items()},
            "process": {"enabled": self.process.enabled},
        }
        out["lanes"] = self.lanes.model_dump()
        out["base_env"] = {"passthrough": list(self.base_env_passthrough), "set": dict(self.base_env_set)}
        out["env"] = {"protected": list(self.protected_env)}
        out["server"] = {
            "host": self.server.host,
            "port": self.server.port,
            "unix_socket": str(self.server.unix_socket) if self.server.unix_socket else None,
            "tokens": f"{len(self.server.tokens)} configured",  # never print a secret
        }
        return out


# TOML key under [tools.exec] -> (section, python field)
_EXEC_KEYS: dict[str, tuple[str, str]] = {
    "backgroundMs": ("exec", "background_ms"),
    "timeoutSec": ("exec", "timeout_sec"),
    "cleanupMs": ("exec", "cleanup_ms"),
    "notifyOnExit": ("exec", "notify_on_exit"),
    "maxOutputChars": ("exec", "max_output_chars"),
    "resultMaxChars": ("exec", "result_max_chars"),
    "pendingMaxOutputChars": ("exec", "pending_max_chars"),
    "maxLogBytes": ("exec", "max_log_bytes"),
    "killGraceSec": ("exec", "kill_grace_sec"),
    "ptyCols": ("exec", "pty_cols"),
    "ptyRows": ("exec", "pty_rows"),
}
# Bounded values (the specs' ranges), clamped rather than refused.
_CLAMPS: dict[str, tuple[int, int]] = {
    "background_ms": (10, 120_000),
    "cleanup_ms": (60_000, 10_800_000),
    "max_output_chars": (100, 200_000),
    "result_max_chars": (1_000, 200_000),
    "pending_max_chars": (1_000, 200_000),
}
# Environment variable -> python field in [exec]; the first listed wins when several are set.
_ENV_KEYS: tuple[tuple[str, str], ...] = (
    ("PI_BASH_YIELD_MS", "background_ms"),
    ("PI_BASH_JOB_TTL_MS", "cleanup_ms"),
    ("PI_BASH_MAX_OUTPUT_CHARS", "result_max_chars"),
    ("OPENCLAW_BASH_PENDING_MAX_OUTPUT_CHARS", "pending_max_chars"),
    ("CLAWDBOT_BASH_PENDING_MAX_OUTPUT_CHARS", "pending_max_chars"),
)


def _int_value(key: str, value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ConfigError(f"{key}: expected an integer, got {value!r}{where}", key=key)
    try:
        return int(value)
    except ValueError:
        raise ConfigError(f"{key}: expected an integer, got {value!r}{where}", key=key) from None


def _from_env(env: Mapping[str, str]) -> dict[str, Any]:
    exec_: dict[str, Any] = {}
    for var, field in _ENV_KEYS:
        if var in env and field not in exec_:
            exec_[field] = _int_value(var, env[var].strip(), " (environment)")
    out: dict[str, Any] = {"exec": exec_}
    if env.get("PROCPILOT_STATE_DIR"):
        out["state_dir"] = Path(env["PROCPILOT_STATE_DIR"])
    if env.get("PROCPILOT_WORKSPACE"):
        out["workspace_root"] = Path(env["PROCPILOT_WORKSPACE"])
    return out


def _from_toml(path: Path) -> dict[str, Any]:
    where = f" (in {path})"
    try:
        raw = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}", path=str(path)) from None
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"cannot read config file {path}: {exc}", path=str(path)) from None

    def table(value: Any, key: str) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a table{where}", key=key)
        return value

    def unknown(key: str) -> ConfigError:
        return ConfigError(f"{key}: unknown key{where}", key=key)

    out: dict[str, Any] = {"exec": {}}
    for key, value in raw.items():
        if key in ("state_dir", "workspace_root"):
            if not isinstance(value, str):
                raise ConfigError(f"{key}: expected a path string{where}", key=key)
            p = Path(value).expanduser()
            out[key] = p if p.is_absolute() else (path.parent / p)
        elif key == "tools":
            for section, body in table(value, "tools").items():
                if section == "exec":
                    for name, item in table(body, "tools.exec").items():
                        if name not in _EXEC_KEYS:
                            raise unknown(f"tools.exec.{name}")
                        out["exec"][_EXEC_KEYS[name][1]] = (name, item)
                elif section == "process":
                    for name, item in table(body, "tools.process").items():
                        if name != "enabled":
                            raise unknown(f"tools.process.{name}")
                        if not isinstance(item, bool):
                            raise ConfigError(f"tools.process.enabled: expected true or false{where}")
                        out["process"] = {"enabled": item}
                else:
                    raise unknown(f"tools.{section}")
        elif key == "policy":
            out["policy"] = table(value, "policy")  # shape checked by the models, errors name the key
        elif key == "server":
            server = dict(table(value, "server"))
            for name in server:
                if name not in ("host", "port", "unix_socket", "tokens"):
                    raise unknown(f"server.{name}")
            tokens = server.get("tokens", {})
            if not isinstance(tokens, dict) or not all(
                isinstance(k, str) and isinstance(v, str) and k and v for k, v in tokens.items()
            ):
                raise ConfigError(
                    f'server.tokens: expected a table of "token" = "agent-id"{where}', key="server.tokens"
                )
            if isinstance(server.get("unix_socket"), str):
                sock = Path(server["unix_socket"]).expanduser()
                server["unix_socket"] = sock if sock.is_absolute() else path.parent / sock
            out["server"] = server
        elif key == "lanes":
            lanes = table(value, "lanes")
            for name, cap in lanes.items():
                if isinstance(cap, bool) or not isinstance(cap, int) or cap < 1:
                    raise ConfigError(f"lanes.{name}: expected an integer of at least 1, got {cap!r}{where}")
            out["lanes"] = lanes
        elif key == "base_env":
            for name, item in table(value, "base_env").items():
                if name == "passthrough" and isinstance(item, list) and all(isinstance(i, str) for i in item):
                    out["base_env_passthrough"] = tuple(item)
                elif name == "set" and isinstance(item, dict) and all(isinstance(i, str) for i in item.values()):
                    out["base_env_set"] = dict(item)
                elif name in ("passthrough", "set"):
                    raise ConfigError(f"base_env.{name}: wrong type{where}", key=f"base_env.{name}")
                else:
                    raise unknown(f"base_env.{name}")
        elif key == "env":
            for name, item in table(value, "env").items():
                if name != "protected":
                    raise unknown(f"env.{name}")
                if not isinstance(item, list) or not all(isinstance(i, str) for i in item):
                    raise ConfigError(f"env.protected: expected a list of names{where}", key="env.protected")
                out["protected_env"] = tuple(item)
        else:
            raise unknown(key)
    # Type-check [tools.exec] values now, where the TOML key name is still known.
    checked: dict[str, Any] = {}
    for field, (name, item) in out["exec"].items():
        key = f"tools.exec.{name}"
        if field == "notify_on_exit":
            if not isinstance(item, bool):
                raise ConfigError(f"{key}: expected true or false, got {item!r}{where}", key=key)
            checked[field] = item
        elif field == "kill_grace_sec":
            if isinstance(item, bool) or not isinstance(item, int | float):
                raise ConfigError(f"{key}: expected a number, got {item!r}{where}", key=key)
            checked[field] = float(item)
        else:
            if isinstance(item, bool) or not isinstance(item, int):
                raise ConfigError(f"{key}: expected an integer, got {item!r}{where}", key=key)
            checked[field] = item
    out["exec"] = checked
    return out


def _merge(base: dict[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in top.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping) and key != "base_env_set":
            merged[key] = _merge(dict(merged[key]), value)
        else:
            merged[key] = value
    return merged


def load_settings(config_file: Path | None = None, env: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
    """Build the effective settings; see the module docstring for precedence."""
    env = os.environ if env is None else env
    layers = _from_env(env)
    if config_file is not None:
        layers = _merge(layers, _from_toml(Path(config_file)))
    layers = _merge(layers, overrides)
    exec_ = dict(layers.get("exec", {}))
    for field, (lo, hi) in _CLAMPS.items():
        if field in exec_:
            exec_[field] = min(max(int(exec_[field]), lo), hi)
    layers["exec"] = exec_
    try:
        settings = Settings.model_validate(layers)
    except ValidationError as exc:
        first = exc.errors()[0]
        key = ".".join(str(p) for p in first["loc"])
        raise ConfigError(f"{key}: {first['msg']}", key=key) from None
    return settings.model_copy(
        update={
            "state_dir": settings.state_dir.expanduser().absolute(),
            "workspace_root": settings.workspace_root.expanduser().resolve(),
        }
    )
