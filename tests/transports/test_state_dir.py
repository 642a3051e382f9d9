"""The daemon's own files against a box and against damage, on a real `procpilot serve`.

Issue 20, finding 4: a box whose workspace holds the daemon's config and state (``make run``'s
layout: ``.venv/procpilot-run/`` in the checkout) renamed a directory above them and the real one
moved on the host. Finding 8: a state directory file replaced by a directory crashed start-up
with a traceback (a crash loop under ``Restart=always``).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.daemon import PROCPILOT, TOKEN_A, Served, cleanup, cli_env, post, start_daemon, write_config

BOXED = "[policy.agents.agent-b]\nisolate = true\n"
# Without tokens every caller is agent "default": boxed here.
ALL_BOXED = "[policy.default]\nisolate = true\n"
_START_TIMEOUT = 60


def _bubblewrap() -> None:
    from procpilot.engine.isolation import isolation_capabilities

    if isolation_capabilities()["private_box"] is None:
        pytest.skip("a private box needs bubblewrap")


@pytest.fixture
def root() -> Iterator[Path]:
    """Outside /tmp: the box's /tmp is private, so what keeps the files put must be the box's doing."""
    path = Path(tempfile.mkdtemp(prefix="procpilot-statedir-", dir="/var/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _env(home: Path) -> dict[str, str]:
    return cli_env(HOME=str(home), LANG="C.UTF-8", COLUMNS="1000")  # no path folded across lines


def refused_start(config: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``procpilot serve`` that must refuse to start; one that serves instead fails the test."""
    proc = subprocess.Popen(
        [PROCPILOT, "serve", "--config", str(config), "--port", "0", *args],
        env=env or _env(config.parent),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        out, err = proc.communicate(timeout=_START_TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
        pytest.fail(f"the daemon started instead of refusing:\n{err}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


# -- finding 4: a box cannot move the daemon's files ------------------------------------------


def test_a_box_cannot_move_the_daemons_config_state_and_socket(root: Path) -> None:
    """`make run`'s layout: the workspace is the checkout, the config, socket and (here) the
    state directory in its .venv/procpilot-run/. The box renames every directory above them in
    vain, and the daemon goes on with the same files."""
    _bubblewrap()
    workspace = root / "checkout"
    run_dir = workspace / ".venv" / "procpilot-run"
    daemon = start_daemon(run_dir, None, "--workspace", str(workspace), extra=ALL_BOXED)
    try:
        state = run_dir / "state"
        before = os.stat(state).st_ino
        with daemon.http(None) as c:
            moved = post(
                c,
                "exec",
                command=(
                    "mv .venv .venv-moved; echo venv=$?; mv .venv/procpilot-run .venv/elsewhere; echo run=$?;"
                    " rm -rf .venv; echo rm=$?; ls -A .venv/procpilot-run"
                ),
            ).json()["data"]
            assert "venv=0" not in moved["output"] and "run=0" not in moved["output"], moved["output"]
            assert "rm=0" not in moved["output"], moved["output"]
            for path in (run_dir / "procpilot.toml", run_dir / "daemon.sock", state / "sessions.jsonl"):
                assert path.exists(), path
            assert not (workspace / ".venv-moved").exists() and not (workspace / ".venv" / "elsewhere").exists()
            assert os.stat(state).st_ino == before
            after = post(c, "exec", command="echo still-here").json()["data"]
            assert after["output"] == "still-here\n"
            assert (state / "sessions" / after["sessionId"]).is_dir()  # the same state directory
            # Pinned, not frozen: the box still writes in the directories above the daemon's files
            # (the one that holds them is masked by a read-only tmpfs: security.md, "Hidden paths").
            wrote = post(c, "exec", command="echo x > .venv/mine && mkdir .venv/d && echo ok")
            assert wrote.json()["data"]["output"] == "ok\n", wrote.text
            assert (workspace / ".venv" / "mine").read_text() == "x\n" and (workspace / ".venv" / "d").is_dir()
            cleanup(c)
    finally:
        assert daemon.stop() == 0, daemon.log_text()


@pytest.mark.parametrize("layout", ["writable_is_the_state_dir", "workspace_inside_the_state_dir"])
def test_a_layout_a_box_would_write_is_refused_at_start(root: Path, layout: str) -> None:
    state = root / "state"
    if layout == "writable_is_the_state_dir":
        extra, writable, workspace = f'{BOXED}writable = ["{state}"]\n', state, root / "ws"
    else:
        extra, writable = BOXED, state / "ws"
        workspace = writable
    config = write_config(root, None, extra=extra)
    workspace.mkdir(parents=True, exist_ok=True)
    done = refused_start(config, "--workspace", str(workspace))
    assert done.returncode == 2, done.stderr
    assert "ConfigError" in done.stderr and "Traceback" not in done.stderr
    flat = " ".join(done.stderr.split())
    assert str(state) in flat and f"the writable path {writable}" in flat, flat


def _path_without_bubblewrap(into: Path) -> str:
    """A PATH with every program of ours but bubblewrap: this host as one without it."""
    into.mkdir()
    for directory in os.environ["PATH"].split(os.pathsep):
        if not os.path.isdir(directory):
            continue
        for name in os.listdir(directory):
            if name != "bwrap" and not (into / name).exists():
                (into / name).symlink_to(Path(directory, name))
    return str(into)


def test_a_landlock_box_with_the_state_dir_in_its_workspace_is_refused_at_start(root: Path) -> None:
    """Landlock has no mount namespace: nothing hidden, nothing pinned. A read-only-root box
    there could rewrite the state directory in its workspace: refused, naming both paths."""
    from procpilot.engine.isolation import isolation_capabilities

    if isolation_capabilities()["readonly_root"] is None:
        pytest.skip("neither bubblewrap nor Landlock here: read-only roots are refused at spawn")
    workspace = root / "ws"
    config = write_config(root, None, extra="[policy.default]\nreadonly_root = true\n")
    env = {**_env(root), "PATH": _path_without_bubblewrap(root / "bin")}
    state = workspace / "state"
    done = refused_start(config, "--state-dir", str(state), env=env)
    assert done.returncode == 2, done.stderr
    flat = " ".join(done.stderr.split())
    assert "ConfigError" in flat and "Traceback" not in flat
    assert f"the state directory {state} lies inside {workspace}" in flat, flat


# -- the state directory is the one the daemon started on --------------------------------------


@pytest.fixture
def served(root: Path) -> Iterator[Served]:
    daemon = start_daemon(root)
    yield daemon
    daemon.stop()


def test_a_spawn_refuses_a_state_dir_that_was_moved_and_does_not_recreate_it(served: Served) -> None:
    state = served.root / "state"
    with served.http(TOKEN_A) as c:
        assert post(c, "exec", command="echo before").json()["data"]["output"] == "before\n"
        state.rename(served.root / "state-moved")
        try:
            refused = post(c, "exec", command="echo after")
            assert refused.status_code == 500, refused.text
            body = refused.json()
            assert body["error"] == "StateDirDamaged" and str(state) in body["message"], body
            assert "moved or replaced" in body["message"]
            assert not state.exists()  # nothing made at the old path: no fresh directory for anyone
        finally:
            (served.root / "state-moved").rename(state)
        assert post(c, "exec", command="echo back").json()["data"]["output"] == "back\n"
        cleanup(c)


# -- finding 8: damage at start is a typed error with its own exit code ------------------------

# What start-up reads or makes in the state directory, each replaced by what it must not be.
DAMAGE = [
    "sessions.jsonl",
    "owners/serve.lock",
    "format.json",
    "daemon.json",
    "daemon.tmp",
    "audit.jsonl",
    "sessions",  # a file where the directory goes
    "owners",
    ".",  # the state directory itself a file
    "sessions.jsonl:fifo",
    "format.json:garbage",
]


def _damage(state: Path, what: str) -> Path:
    name, _, kind = what.partition(":")
    path = state / name if name != "." else state
    if path == state:
        path.write_text("not a directory")
    elif kind == "fifo":
        state.mkdir()
        os.mkfifo(path)
    elif kind == "garbage":
        state.mkdir()
        path.write_bytes(b"\x00\xffnot json")
    elif name in ("sessions", "owners"):
        state.mkdir()
        path.write_text("not a directory")
    else:
        path.mkdir(parents=True)
    return path


@pytest.mark.parametrize("what", DAMAGE)
@pytest.mark.parametrize("server", ["serve", "mcp"])
def test_damage_in_the_state_dir_is_a_typed_refusal_with_its_own_exit_code(
    tmp_path: Path, what: str, server: str
) -> None:
    state = tmp_path / "state"
    if server == "mcp" and what.startswith(("owners/", "daemon.")):
        what = what.replace("serve.lock", "mcp%3adefault.lock")
        if what.startswith("daemon."):
            pytest.skip("a stdio server writes no daemon.json")
    damaged = _damage(state, what)
    config = write_config(tmp_path, None)
    env = _env(tmp_path)
    if server == "serve":
        done = refused_start(config, env=env)
    else:
        done = subprocess.run(
            [PROCPILOT, "mcp", "--keep-sessions", "--config", str(config)],
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=_START_TIMEOUT,
            check=False,
        )
    flat = " ".join(done.stderr.split())
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == 3, done.stderr
    assert flat.startswith(f"StateDirDamaged: {damaged} ("), flat
    assert f"mv {damaged} {damaged}.damaged" in flat


def test_a_sighup_into_such_a_layout_changes_nothing(served: Served) -> None:
    """The new image would refuse to start: the running one serves on and says why."""
    state = served.root / "state"
    write_config(served.root, served.tokens, extra=f'{BOXED}writable = ["{state}"]\n')
    served.proc.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 30
    while "SIGHUP ignored" not in served.log_text():
        assert time.monotonic() < deadline and served.proc.poll() is None, served.log_text()
        time.sleep(0.05)
    said = " ".join(served.log_text().split())  # the log folds long paths: the words around them
    assert "[policy.agents.agent-b]: the writable path" in said and "its sessions would write the daemon's" in said
    with served.http(TOKEN_A) as c:
        assert post(c, "exec", command="echo serving").json()["data"]["output"] == "serving\n"
        cleanup(c)
