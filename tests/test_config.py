"""Settings: defaults, env vars, TOML files and overrides, their precedence, clamping and errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from procpilot.config import ExecSettings, LaneSettings, load_settings
from procpilot.errors import ConfigError


def write(tmp_path: Path, text: str, name: str = "procpilot.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def load_error(*args: object, **kwargs: object) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_settings(*args, **kwargs)  # type: ignore[arg-type]
    return info.value


# -- defaults --------------------------------------------------------------------------------------


def test_defaults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    s = load_settings(env={"XDG_STATE_HOME": "/xdg/state"})
    assert s.state_dir == Path("/xdg/state/procpilot")
    assert s.workspace_root == tmp_path.resolve()
    assert s.exec.model_dump() == {
        "background_ms": 10_000,
        "timeout_sec": 1800,
        "cleanup_ms": 1_800_000,
        "notify_on_exit": True,
        "max_output_chars": 500,
        "result_max_chars": 30_000,
        "pending_max_chars": 200_000,
        "max_log_bytes": 64 * 1024 * 1024,
        "kill_grace_sec": 1.0,
        "pty_cols": 120,
        "pty_rows": 30,
        "profile": "procpilot",
        "script_preflight": None,
        "restart": "no",
        "max_restarts": 10,
        "restart_backoff_ms": 1000,
    }
    assert s.process.enabled is True
    assert s.lanes.model_dump() == {"main": 1, "subagent": 8, "cron": 1, "default": 1}
    passthrough = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR", "SHELL")
    assert s.base_env.passthrough == passthrough
    assert dict(s.base_env.set) == {
        "PAGER": "cat",
        "GIT_PAGER": "cat",
        "GIT_TERMINAL_PROMPT": "0",
        "PYTHONUNBUFFERED": "1",
    }
    assert s.env.protected == ("PATH", "HOME", "LD_PRELOAD", "LD_LIBRARY_PATH", "PYTHONPATH")


def test_default_state_dir_without_xdg_is_under_home() -> None:
    assert load_settings(env={"HOME": "/home/someone"}).state_dir == Path("/home/someone/.local/state/procpilot")
    # A relative XDG_STATE_HOME is invalid per the XDG spec and is ignored.
    s = load_settings(env={"HOME": "/home/someone", "XDG_STATE_HOME": "rel/state"})
    assert s.state_dir == Path("/home/someone/.local/state/procpilot")


def test_env_none_reads_os_environ(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PI_BASH_YIELD_MS", "4321")
    monkeypatch.setenv("PROCPILOT_STATE_DIR", str(tmp_path / "st"))
    s = load_settings()
    assert s.exec.background_ms == 4321
    assert s.state_dir == tmp_path / "st"


def test_settings_are_frozen() -> None:
    s = load_settings(env={})
    with pytest.raises(ValidationError):
        s.state_dir = Path("/elsewhere")  # type: ignore[misc]
    with pytest.raises(ValidationError):
        s.exec.timeout_sec = 1  # type: ignore[misc]


# -- environment -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("var", "field", "raw", "expected"),
    [
        ("PI_BASH_YIELD_MS", "background_ms", "5000", 5000),
        ("PI_BASH_YIELD_MS", "background_ms", "1", 10),
        ("PI_BASH_YIELD_MS", "background_ms", "-50", 10),
        ("PI_BASH_YIELD_MS", "background_ms", "999999", 120_000),
        ("PI_BASH_JOB_TTL_MS", "cleanup_ms", "120000", 120_000),
        ("PI_BASH_JOB_TTL_MS", "cleanup_ms", "1000", 60_000),
        ("PI_BASH_JOB_TTL_MS", "cleanup_ms", "99999999", 10_800_000),
        ("PI_BASH_MAX_OUTPUT_CHARS", "result_max_chars", "5000", 5000),
        ("PI_BASH_MAX_OUTPUT_CHARS", "result_max_chars", "10", 1000),
        ("PI_BASH_MAX_OUTPUT_CHARS", "result_max_chars", "300000", 200_000),
        ("PROCPILOT_RESULT_CHARS", "result_max_chars", "12000", 12_000),
        ("PROCPILOT_RESULT_CHARS", "result_max_chars", "10", 1000),
        ("OPENCLAW_BASH_PENDING_MAX_OUTPUT_CHARS", "pending_max_chars", "7000", 7000),
        ("OPENCLAW_BASH_PENDING_MAX_OUTPUT_CHARS", "pending_max_chars", "5", 1000),
        ("OPENCLAW_BASH_PENDING_MAX_OUTPUT_CHARS", "pending_max_chars", "900000", 200_000),
        ("CLAWDBOT_BASH_PENDING_MAX_OUTPUT_CHARS", "pending_max_chars", "8000", 8000),
        ("CLAWDBOT_BASH_PENDING_MAX_OUTPUT_CHARS", "pending_max_chars", "5", 1000),
        ("CLAWDBOT_BASH_PENDING_MAX_OUTPUT_CHARS", "pending_max_chars", "900000", 200_000),
    ],
)
def test_env_var_sets_and_clamps(var: str, field: str, raw: str, expected: int) -> None:
    s = load_settings(env={var: raw})
    assert getattr(s.exec, field) == expected
    others = {k: v for k, v in s.exec.model_dump().items() if k != field}
    assert others == {k: v for k, v in ExecSettings().model_dump().items() if k != field}


def test_the_result_budget_is_30000_and_the_openclaw_profile_keeps_its_own() -> None:
    assert load_settings(env={}).exec.result_max_chars == 30_000
    assert load_settings(env={}, exec={"profile": "openclaw"}).exec.result_max_chars == 200_000
    chosen = {"profile": "openclaw", "result_max_chars": 5000}
    assert load_settings(env={}, exec=chosen).exec.result_max_chars == 5000
    both = {"PROCPILOT_RESULT_CHARS": "7000", "PI_BASH_MAX_OUTPUT_CHARS": "9000"}
    assert load_settings(env=both).exec.result_max_chars == 7000  # ours first


def test_openclaw_wins_over_clawdbot() -> None:
    env = {"OPENCLAW_BASH_PENDING_MAX_OUTPUT_CHARS": "3000", "CLAWDBOT_BASH_PENDING_MAX_OUTPUT_CHARS": "4000"}
    assert load_settings(env=env).exec.pending_max_chars == 3000


def test_empty_env_var_counts_as_unset() -> None:
    env = {
        "PI_BASH_YIELD_MS": "",
        "OPENCLAW_BASH_PENDING_MAX_OUTPUT_CHARS": " ",
        "CLAWDBOT_BASH_PENDING_MAX_OUTPUT_CHARS": "4000",
    }
    s = load_settings(env=env)
    assert s.exec.background_ms == 10_000
    assert s.exec.pending_max_chars == 4000


def test_env_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ws").mkdir()
    s = load_settings(env={"PROCPILOT_STATE_DIR": str(tmp_path / "state"), "PROCPILOT_WORKSPACE": "ws"})
    assert s.state_dir == tmp_path / "state"
    assert s.workspace_root == (tmp_path / "ws").resolve()
    assert s.workspace_root.is_absolute()


@pytest.mark.parametrize("raw", ["abc", "5000.5", "0x10", "10 ms"])
def test_non_numeric_env_is_a_config_error(raw: str) -> None:
    err = load_error(env={"PI_BASH_JOB_TTL_MS": raw})
    assert err.message.startswith("PI_BASH_JOB_TTL_MS (tools.exec.cleanupMs): expected an integer")
    assert repr(raw) in err.message
    assert err.details["key"] == "PI_BASH_JOB_TTL_MS"


# -- TOML ------------------------------------------------------------------------------------------


def test_toml_sets_every_key(tmp_path: Path) -> None:
    cfg = write(
        tmp_path,
        """
state_dir = "/var/lib/procpilot"
workspace_root = "/srv/work"
[tools.exec]
backgroundMs = 5000
timeoutSec = 600
cleanupMs = 120000
notifyOnExit = false
maxOutputChars = 2000
resultMaxChars = 50000
pendingMaxOutputChars = 60000
maxLogBytes = 1048576
killGraceSec = 2.5
ptyCols = 80
ptyRows = 24
[tools.process]
enabled = false
[lanes]
main = 2
subagent = 4
cron = 3
default = 5
[base_env]
passthrough = ["PATH"]
set = { FOO = "bar" }
[env]
protected = ["PATH", "SECRET"]
""",
    )
    s = load_settings(cfg, env={})
    assert s.state_dir == Path("/var/lib/procpilot")
    assert s.workspace_root == Path("/srv/work").resolve()
    assert s.exec == ExecSettings(
        background_ms=5000,
        timeout_sec=600,
        cleanup_ms=120_000,
        notify_on_exit=False,
        max_output_chars=2000,
        result_max_chars=50_000,
        pending_max_chars=60_000,
        max_log_bytes=1 << 20,
        kill_grace_sec=2.5,
        pty_cols=80,
        pty_rows=24,
    )
    assert s.process.enabled is False
    assert s.lanes == LaneSettings(main=2, subagent=4, cron=3, default=5)
    assert s.base_env.passthrough == ("PATH",)
    assert dict(s.base_env.set) == {"FOO": "bar"}  # a table given replaces the default one
    assert s.env.protected == ("PATH", "SECRET")


def test_toml_overrides_env(tmp_path: Path) -> None:
    cfg = write(
        tmp_path,
        'state_dir = "/from/file"\n[tools.exec]\nbackgroundMs = 7000\npendingMaxOutputChars = 9000\n',
    )
    env = {
        "PI_BASH_YIELD_MS": "3000",
        "PI_BASH_JOB_TTL_MS": "90000",  # not in the file: the env value stays
        "OPENCLAW_BASH_PENDING_MAX_OUTPUT_CHARS": "4000",
        "PROCPILOT_STATE_DIR": "/from/env",
    }
    s = load_settings(cfg, env=env)
    assert s.exec.background_ms == 7000
    assert s.exec.pending_max_chars == 9000
    assert s.exec.cleanup_ms == 90_000
    assert s.state_dir == Path("/from/file")


def test_toml_values_are_clamped(tmp_path: Path) -> None:
    cfg = write(
        tmp_path,
        "[tools.exec]\nbackgroundMs = 1\ncleanupMs = 999999999\nmaxOutputChars = 5\n"
        "resultMaxChars = 10000000\npendingMaxOutputChars = -3\n",
    )
    e = load_settings(cfg, env={}).exec
    assert (e.background_ms, e.cleanup_ms, e.max_output_chars, e.result_max_chars, e.pending_max_chars) == (
        10,
        10_800_000,
        100,
        200_000,
        1000,
    )


def test_relative_paths_resolve_against_the_config_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    conf_dir = tmp_path / "etc"
    (conf_dir / "ws").mkdir(parents=True)
    cfg = write(conf_dir, 'state_dir = "state"\nworkspace_root = "."\n[server]\nunix_socket = "d.sock"\n')
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    s = load_settings(cfg, env={})
    assert s.workspace_root == conf_dir.resolve()
    assert s.state_dir == conf_dir / "state"
    assert s.server.unix_socket == conf_dir / "d.sock"
    # The same when the config file itself is named relative to the cwd.
    monkeypatch.chdir(tmp_path)
    s = load_settings(Path("etc/procpilot.toml"), env={})
    assert s.workspace_root == conf_dir.resolve()
    assert s.state_dir == conf_dir / "state"


@pytest.mark.parametrize(
    ("text", "key", "suggestion"),
    [
        ("[tools.exec]\nbackgroundMS = 5\n", "tools.exec.backgroundMS", "backgroundMs"),
        ("[tools.exec]\ntimeout_sec = 5\n", "tools.exec.timeout_sec", "timeoutSec"),
        ("[tools.process]\nenable = true\n", "tools.process.enable", "enabled"),
        ("[tools.proces]\nenabled = true\n", "tools.proces", "process"),
        ("statedir = '/x'\n", "statedir", "state_dir"),
        ("[base_env]\npasthrough = []\n", "base_env.pasthrough", "passthrough"),
        ("[env]\nprotect = []\n", "env.protect", "protected"),
    ],
)
def test_unknown_key_is_a_config_error(tmp_path: Path, text: str, key: str, suggestion: str) -> None:
    cfg = write(tmp_path, text)
    err = load_error(cfg, env={})
    assert err.message.startswith(f"{key}: unknown key")
    assert f"did you mean {suggestion!r}" in err.message
    assert str(cfg) in err.message
    assert err.details["key"] == key


def test_unknown_key_inside_a_model_table(tmp_path: Path) -> None:
    cfg = write(tmp_path, "[policy.agents.bot]\nalow = ['ls']\n")
    err = load_error(cfg, env={})
    assert err.message == f"policy.agents.bot.alow: unknown key (did you mean 'allow'?) (in {cfg})"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[tools.exec]\nbackgroundMs = "abc"\n', "tools.exec.backgroundMs: expected an integer, got 'abc'"),
        ("[tools.exec]\ntimeoutSec = 1.5\n", "tools.exec.timeoutSec: expected an integer, got 1.5"),
        ('[tools.exec]\nbackgroundMs = "5000"\n', "tools.exec.backgroundMs: expected an integer, got '5000'"),
        ("[tools.exec]\ncleanupMs = 90000.0\n", "tools.exec.cleanupMs: expected an integer, got 90000.0"),
        ("[tools.exec]\nresultMaxChars = true\n", "tools.exec.resultMaxChars: expected an integer, got True"),
        ("[tools.exec]\ntimeoutSec = -1\n", "tools.exec.timeoutSec: must be at least 0, got -1"),
        ('[tools.exec]\nnotifyOnExit = "yes"\n', "tools.exec.notifyOnExit: expected true or false, got 'yes'"),
        ("[tools.exec]\nmaxLogBytes = 1024\n", "tools.exec.maxLogBytes: must be at least 65536, got 1024"),
        ("[tools.exec]\nkillGraceSec = 601\n", "tools.exec.killGraceSec: must be at most 600"),
        ("[tools.exec]\nkillGraceSec = -1\n", "tools.exec.killGraceSec: must be at least 0"),
        ("[tools.exec]\nptyCols = 0\n", "tools.exec.ptyCols: must be at least 1, got 0"),
        ("[tools.exec]\nptyRows = 1001\n", "tools.exec.ptyRows: must be at most 1000, got 1001"),
        ("[tools.process]\nenabled = 1\n", "tools.process.enabled: expected true or false, got 1"),
        ("[lanes]\nmain = 0\n", "lanes.main: must be at least 1, got 0"),
        ("[lanes]\nmain = true\n", "lanes.main: expected an integer, got True"),
        ('[base_env]\npassthrough = "PATH"\n', "base_env.passthrough: expected a list, got 'PATH'"),
        ("[base_env]\nset = { FOO = 1 }\n", "base_env.set.FOO: expected a string, got 1"),
        ("[env]\nprotected = [1]\n", "env.protected[0]: expected a string, got 1"),
        ("state_dir = 5\n", "state_dir: expected a path string, got 5"),
        ("tools = 5\n", "tools: expected a table, got 5"),
    ],
)
def test_bad_value_is_a_config_error(tmp_path: Path, text: str, message: str) -> None:
    cfg = write(tmp_path, text)
    err = load_error(cfg, env={})
    assert err.message.startswith(message)
    assert err.message.endswith(f"(in {cfg})")
    assert err.details["path"] == str(cfg)


def test_bad_token_table_does_not_leak_the_token(tmp_path: Path) -> None:
    cfg = write(tmp_path, '[server.tokens]\n"s3cret-token" = 5\n')
    err = load_error(cfg, env={})
    assert err.message.startswith("server.tokens:")
    assert "s3cret-token" not in str(err.to_dict())


def test_bad_token_override_does_not_leak_the_token() -> None:
    err = load_error(env={}, server={"tokens": {"s3cret-token": 5}})
    assert err.message.startswith("server.tokens:")
    assert "s3cret-token" not in str(err.to_dict())


def test_missing_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.toml"
    err = load_error(missing, env={})
    assert err.message == f"config file not found: {missing}"
    assert err.details["path"] == str(missing)


@pytest.mark.parametrize("content", [b"[tools.exec\nbackgroundMs = 5\n", b"x = \n", b'state_dir = "\xff\xfe"\n'])
def test_invalid_toml(tmp_path: Path, content: bytes) -> None:
    cfg = tmp_path / "bad.toml"
    cfg.write_bytes(content)
    err = load_error(cfg, env={})
    assert err.message.startswith(f"invalid TOML in config file {cfg}: ")


def test_config_file_that_is_a_directory(tmp_path: Path) -> None:
    err = load_error(tmp_path, env={})
    assert err.message.startswith(f"cannot read config file {tmp_path}")


# -- overrides -------------------------------------------------------------------------------------


def test_overrides_beat_file_and_env_and_merge_into_sections(tmp_path: Path) -> None:
    cfg = write(tmp_path, 'state_dir = "/from/file"\n[tools.exec]\nbackgroundMs = 7000\ntimeoutSec = 60\n')
    s = load_settings(
        cfg,
        env={"PI_BASH_JOB_TTL_MS": "90000"},
        state_dir=tmp_path / "st",
        exec={"timeout_sec": 5},
        lanes={"main": 3},
    )
    assert s.state_dir == tmp_path / "st"
    assert s.exec.timeout_sec == 5
    assert s.exec.background_ms == 7000  # the file's value survives the section merge
    assert s.exec.cleanup_ms == 90_000  # and so does the env's
    assert (s.lanes.main, s.lanes.subagent) == (3, 8)


def test_overrides_are_clamped_and_accept_models(tmp_path: Path) -> None:
    assert load_settings(env={}, exec={"background_ms": 1}).exec.background_ms == 10
    s = load_settings(env={}, exec=ExecSettings(timeout_sec=3))
    assert s.exec.timeout_sec == 3
    # model_copy(update=...) skips validation; a model passed in is validated again, so clamped too.
    unchecked = ExecSettings().model_copy(update={"background_ms": 1, "cleanup_ms": 5})
    s = load_settings(env={}, exec=unchecked)
    assert (s.exec.background_ms, s.exec.cleanup_ms) == (10, 60_000)


def test_override_paths_are_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    s = load_settings(env={}, state_dir="st", workspace_root=".")
    assert s.state_dir == tmp_path / "st"
    assert s.workspace_root == tmp_path.resolve()


def test_bad_override_is_a_config_error() -> None:
    err = load_error(env={}, exec={"timeout_sec": "abc"})
    assert err.message == "exec.timeout_sec: expected an integer, got 'abc' (keyword argument)"
    err = load_error(env={}, exec={"timeout_sec": -5})
    assert err.message == "exec.timeout_sec: must be at least 0, got -5 (keyword argument)"
    err = load_error(env={}, stat_dir="/x")
    assert err.message == "stat_dir: unknown key (did you mean 'state_dir'?) (keyword argument)"
    err = load_error(env={}, exec={"backgroundMs": 5})
    assert err.message == "exec.backgroundMs: unknown key (did you mean 'background_ms'?) (keyword argument)"


# -- protected variables and lanes ---------------------------------------------------------------


def test_lanes_allow_extra_names(tmp_path: Path) -> None:
    cfg = write(tmp_path, '[lanes]\nbuild = 3\n"cron:nightly" = 2\n')
    s = load_settings(cfg, env={}, lanes={"gpu": 1})
    assert s.lanes.model_dump() == {
        "main": 1,
        "subagent": 8,
        "cron": 1,
        "default": 1,
        "build": 3,
        "cron:nightly": 2,
        "gpu": 1,
    }
    assert s.lanes.caps()["build"] == 3
    assert "default" not in s.lanes.caps()


@pytest.mark.parametrize(("value", "reason"), [("0", "must be at least 1, got 0"), ('"x"', "expected an integer")])
def test_bad_extra_lane(tmp_path: Path, value: str, reason: str) -> None:
    cfg = write(tmp_path, f"[lanes]\nbuild = {value}\n")
    err = load_error(cfg, env={})
    assert err.message.startswith(f"lanes.build: {reason}")
    assert str(cfg) in err.message


# -- describe --------------------------------------------------------------------------------------


def test_describe_uses_toml_names(tmp_path: Path) -> None:
    cfg = write(
        tmp_path,
        '[tools.exec]\nbackgroundMs = 5000\n[lanes]\nbuild = 2\n[server.tokens]\n"tok-123" = "agent"\n',
    )
    d = load_settings(cfg, env={}, state_dir=tmp_path / "st", workspace_root=tmp_path).describe()
    assert d["state_dir"] == str(tmp_path / "st")
    assert d["workspace_root"] == str(tmp_path.resolve())
    assert d["tools"]["exec"] == {
        "backgroundMs": 5000,
        "timeoutSec": 1800,
        "cleanupMs": 1_800_000,
        "notifyOnExit": True,
        "maxOutputChars": 500,
        "resultMaxChars": 30_000,
        "pendingMaxOutputChars": 200_000,
        "maxLogBytes": 64 * 1024 * 1024,
        "killGraceSec": 1.0,
        "ptyCols": 120,
        "ptyRows": 30,
        "profile": "procpilot",
        "restart": "no",
        "maxRestarts": 10,
        "restartBackoffMs": 1000,
    }
    assert d["tools"]["process"] == {"enabled": True}
    assert d["lanes"]["build"] == 2
    assert d["base_env"]["set"]["PAGER"] == "cat"
    assert d["env"]["protected"][0] == "PATH"
    assert d["server"]["tokens"] == "1 configured"
    assert "tok-123" not in repr(d)


def test_describe_feeds_back_as_toml_keys(tmp_path: Path) -> None:
    """Every key describe() shows under tools.exec is one the loader accepts, with the same value."""
    d = load_settings(env={}, exec={"timeout_sec": 42, "pty_rows": 50}).describe()
    lines = ["[tools.exec]"]
    for key, value in d["tools"]["exec"].items():
        lines.append(f"{key} = {str(value).lower() if isinstance(value, bool) else json.dumps(value)}")
    s = load_settings(write(tmp_path, "\n".join(lines) + "\n"), env={})
    assert s.exec.timeout_sec == 42
    assert s.exec.pty_rows == 50


# -- [proc] ----------------------------------------------------------------------------------------


def test_proc_defaults_are_spec_003s() -> None:
    from procpilot.faces.proc_protocol import ProcConfig

    proc = load_settings(env={}).proc
    spec = ProcConfig()
    assert proc.allowed_commands is None and spec.allowed_commands is None
    assert proc.timeout == spec.timeout
    assert (proc.max_output_bytes, proc.max_procs) == (spec.max_output_bytes, spec.max_procs)


def test_spec003_example_config_network_disabled(tmp_path: Path) -> None:
    """Spec 003's own example config, ``network_disabled: true`` included, is a valid ``[proc]``
    (it was an unknown key), and reaches the handler's config."""
    from procpilot.engine.supervisor import Supervisor
    from procpilot.transports.serve import proc_handler_factory

    example = (
        '[proc]\nallowed_commands = ["python3", "bash", "ls", "echo"]\ntimeout = 30\n'
        "max_output_bytes = 1048576\nmax_procs = 10\nnetwork_disabled = true\n"
    )
    settings = load_settings(write(tmp_path, example), env={})
    assert settings.proc.network_disabled is True
    assert load_settings(env={}).proc.network_disabled is False
    handler = proc_handler_factory(settings)(Supervisor(settings), "a")
    try:
        assert handler.config.network_disabled is True
    finally:
        handler.close()


def test_proc_section(tmp_path: Path) -> None:
    cfg = write(tmp_path, '[proc]\nallowed_commands = ["make", "pytest"]\ntimeout = 3600\nmax_procs = 4\n')
    proc = load_settings(cfg, env={}).proc
    assert proc.allowed_commands == ("make", "pytest")
    assert (proc.timeout, proc.max_procs, proc.max_output_bytes) == (3600.0, 4, 1024 * 1024)
    assert load_settings(cfg, env={}).describe()["proc"]["max_procs"] == 4
    assert load_settings(write(tmp_path, "[proc]\ntimeout = 0\n", "a.toml"), env={}).proc.timeout == 0  # no limit
    clamped = load_settings(write(tmp_path, "[proc]\nmax_procs = 0\nmax_output_bytes = -5\n", "b.toml"), env={}).proc
    assert (clamped.max_procs, clamped.max_output_bytes) == (1, 0)
    assert load_settings(write(tmp_path, "[proc]\nmax_procs = 99999999\n", "c.toml"), env={}).proc.max_procs == 10_000
    assert load_settings(env={}, proc={"timeout": 5}).proc.timeout == 5.0


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[proc]\ntimeout = -1\n", "proc.timeout: must be at least 0"),
        ('[proc]\ntimeout = "30"\n', "proc.timeout: expected a number, got '30'"),
        ("[proc]\nmax_procs = 1.5\n", "proc.max_procs: expected an integer, got 1.5"),
        ('[proc]\nallowed_commands = "make"\n', "proc.allowed_commands: expected a list, got 'make'"),
        ("proc = 5\n", "proc: expected a table, got 5"),
    ],
)
def test_bad_proc_value_is_a_config_error(tmp_path: Path, text: str, message: str) -> None:
    cfg = write(tmp_path, text)
    err = load_error(cfg, env={})
    assert err.message.startswith(message), err.message
    assert err.message.endswith(f"(in {cfg})")


def test_unknown_proc_key_is_a_config_error(tmp_path: Path) -> None:
    cfg = write(tmp_path, "[proc]\nmax_proc = 3\n")
    err = load_error(cfg, env={})
    assert err.message.startswith("proc.max_proc: unknown key (did you mean 'max_procs'?)")
    assert err.details["key"] == "proc.max_proc"
    err = load_error(env={}, proc={"network_off": True})
    assert "proc.network_off: unknown key" in err.message


def test_server_approvers(tmp_path: Path) -> None:
    assert load_settings(env={}).server.approvers == ()
    cfg = write(tmp_path, '[server]\napprovers = ["lead", "ops"]\n')
    assert load_settings(cfg, env={}).server.approvers == ("lead", "ops")
    assert load_settings(cfg, env={}).describe()["server"]["approvers"] == ["lead", "ops"]
    err = load_error(write(tmp_path, '[server]\napprovers = "lead"\n', "bad.toml"), env={})
    assert err.message.startswith("server.approvers: expected a list, got 'lead'")
    err = load_error(write(tmp_path, '[server]\napprover = ["lead"]\n', "typo.toml"), env={})
    assert err.message.startswith("server.approver: unknown key")
