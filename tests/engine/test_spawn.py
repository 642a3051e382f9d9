"""engine/spawn.py on its own: the environment a child starts with, the working directory a spec
resolves to, and a real spawn's stdio."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from procpilot.engine import spawn
from procpilot.engine.limits import Limits
from procpilot.engine.spawn import SpawnSpec, build_env, resolve_workdir, spawn_process, within
from procpilot.engine.trees import MARKER_ENV
from procpilot.errors import InvalidArgument, PathOutOfScope, ProtectedVariable

MARKERS = {MARKER_ENV: "s1"}


def test_the_environment_starts_clean_and_ends_with_the_markers() -> None:
    source = {"PATH": "/bin", "HOME": "/h", "SECRET_TOKEN": "x", MARKER_ENV: "forged"}
    env = build_env(
        ("PATH", "HOME"), {"PAGER": "cat"}, {"FOO": "1"}, markers=MARKERS, pty=False, pty_size=(80, 24), source=source
    )
    assert env == {"PATH": "/bin", "HOME": "/h", "PAGER": "cat", "TERM": "dumb", "FOO": "1", MARKER_ENV: "s1"}


def test_passed_through_variables_are_the_servers_own_as_they_are_now(monkeypatch: pytest.MonkeyPatch) -> None:
    # Read from the process's environment on every spawn, never from a copy made earlier; a value
    # that is not UTF-8 comes through as os.environ gives it (surrogate-escaped), a name unset
    # since is not passed at all.
    names = ("PROCPILOT_T_A", "PROCPILOT_T_B", "PROCPILOT_T_C")
    monkeypatch.setenv("PROCPILOT_T_A", "one")
    monkeypatch.delenv("PROCPILOT_T_B", raising=False)
    monkeypatch.setenv("PROCPILOT_T_C", "gone soon")

    def passed() -> dict[str, str]:
        env = build_env(names, {}, {}, markers=MARKERS, pty=False, pty_size=(80, 24))
        return {name: env[name] for name in names if name in env}

    assert passed() == {"PROCPILOT_T_A": "one", "PROCPILOT_T_C": "gone soon"}
    monkeypatch.setenv("PROCPILOT_T_A", "two")
    monkeypatch.setenv("PROCPILOT_T_B", os.fsdecode(b"caf\xe9"))
    monkeypatch.delenv("PROCPILOT_T_C")
    assert passed() == {"PROCPILOT_T_A": "two", "PROCPILOT_T_B": os.environ["PROCPILOT_T_B"]}
    assert os.fsencode(passed()["PROCPILOT_T_B"]) == b"caf\xe9"


def test_a_pty_gets_a_terminal_and_its_size() -> None:
    env = build_env((), {}, {}, markers=MARKERS, pty=True, pty_size=(132, 43), source={})
    assert (env["TERM"], env["COLUMNS"], env["LINES"]) == ("xterm-256color", "132", "43")
    assert env["PATH"] == os.defpath  # none passed through: the default search path, never none


def test_a_marker_cannot_be_overridden() -> None:
    with pytest.raises(ProtectedVariable):
        build_env((), {}, {MARKER_ENV: "other"}, markers=MARKERS, pty=False, pty_size=(80, 24), source={})


@pytest.mark.parametrize(("overrides", "field"), [({"A=B": "1"}, "env"), ({"": "1"}, "env"), ({"X": "a\0b"}, "env")])
def test_names_and_values_the_os_cannot_take_are_invalid(overrides: dict[str, str], field: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        build_env((), {}, overrides, markers=MARKERS, pty=False, pty_size=(80, 24), source={})
    assert info.value.details["field"] == field


def test_the_working_directory_resolves_inside_the_workspace(tmp_path: Path) -> None:
    (tmp_path / "src" / "pkg").mkdir(parents=True)
    root = tmp_path.resolve()
    assert resolve_workdir(tmp_path, None) == root
    assert resolve_workdir(tmp_path, "src/pkg") == root / "src" / "pkg"
    assert resolve_workdir(tmp_path, "src/pkg/..") == root / "src"
    assert resolve_workdir(tmp_path, str(root / "src")) == root / "src"
    assert SpawnSpec("true", cwd=Path("src"), workspace=tmp_path).cwd == root / "src"
    assert SpawnSpec("true", workspace=tmp_path).cwd == root


@pytest.mark.parametrize(
    ("path", "root", "inside"),
    [
        ("/ws", "/ws", True),
        ("/ws/a", "/ws", True),
        ("/ws/a/b", "/ws", True),
        ("/ws-evil", "/ws", False),  # a sibling whose name begins with the root's
        ("/ws-evil/a", "/ws", False),
        ("/wsa", "/ws", False),
        ("/w", "/ws", False),
        ("/", "/ws", False),
        ("/a/ws", "/ws", False),
        ("/", "/", True),  # a workspace of / takes every absolute path
        ("/ws", "/", True),
        ("/ws/a", "/", True),
    ],
)
def test_within_compares_whole_components(path: str, root: str, inside: bool) -> None:
    assert within(path, root) is inside


@pytest.mark.parametrize("value", ["..", "/", "src/../..", "../ws-evil", "../ws-evil/sub"])
def test_a_working_directory_outside_the_workspace_is_out_of_scope(tmp_path: Path, value: str) -> None:
    ws = tmp_path / "ws"
    (ws / "src").mkdir(parents=True)
    (tmp_path / "ws-evil" / "sub").mkdir(parents=True)  # the root's name and more: still outside
    with pytest.raises(PathOutOfScope):
        SpawnSpec("true", cwd=Path(value), workspace=ws)


def test_a_symlink_out_of_the_workspace_is_out_of_scope(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "out").symlink_to(tmp_path)
    with pytest.raises(PathOutOfScope):
        resolve_workdir(ws, "out")


def test_a_workspace_repointed_is_followed_once_its_resolution_is_rechecked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The resolved root is kept (a spawn must not walk the path each time), but not past a
    # repointing: a symlinked workspace swapped to another release is where commands run next.
    first, second = tmp_path / "r1", tmp_path / "r2"
    first.mkdir()
    second.mkdir()
    ws = tmp_path / "current"
    ws.symlink_to(first)
    assert SpawnSpec("true", workspace=ws).cwd == first.resolve()
    os.unlink(ws)
    ws.symlink_to(second)
    assert SpawnSpec("true", workspace=ws).cwd == first.resolve()  # within a second: as it was
    monkeypatch.setattr(spawn, "_ROOT_RECHECK", 0.0)
    assert SpawnSpec("true", workspace=ws).cwd == second.resolve()
    with pytest.raises(PathOutOfScope):  # and what lies in the old one is now outside
        resolve_workdir(ws, str(first))
    # Moved (the same directory under another name) and the link pointed after it: found again.
    moved = tmp_path / "r2-moved"
    second.rename(moved)
    os.unlink(ws)
    ws.symlink_to(moved)
    assert SpawnSpec("true", workspace=ws).cwd == moved.resolve()


def test_a_workspace_of_root_takes_any_directory(tmp_path: Path) -> None:
    assert resolve_workdir(Path("/"), None) == Path("/")
    assert resolve_workdir(Path("/"), str(tmp_path)) == tmp_path.resolve()
    assert SpawnSpec("true", cwd=Path("tmp"), workspace=Path("/")).cwd == Path("/tmp").resolve()


def test_a_missing_working_directory_is_an_invalid_argument(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument) as info:
        resolve_workdir(tmp_path, "nope")
    assert info.value.details["field"] == "working_directory"


async def test_a_spawned_child_writes_to_its_pipes_and_reads_its_stdin(tmp_path: Path) -> None:
    spec = SpawnSpec(("/bin/sh", "-c", "read x; echo out:$x; echo err >&2"), workspace=tmp_path)
    env = build_env(("PATH",), {}, {}, markers=MARKERS, pty=False, pty_size=(80, 24))
    spawned = await spawn_process(spec, env, prelude=[])
    try:
        assert spawned.stdin_fd is not None and spawned.stderr_fd is not None
        os.set_blocking(spawned.stdout_fd, True)
        os.set_blocking(spawned.stderr_fd, True)
        os.write(spawned.stdin_fd, b"hi\n")
        assert os.read(spawned.stdout_fd, 100) == b"out:hi\n"
        assert os.read(spawned.stderr_fd, 100) == b"err\n"
        assert spawned.popen.wait(10) == 0
    finally:
        for fd in (spawned.stdin_fd, spawned.stdout_fd, spawned.stderr_fd, spawned.pidfd):
            if fd is not None and fd >= 0:
                os.close(fd)


def test_the_policys_limits_and_box_do_not_resolve_the_directory_again(tmp_path: Path) -> None:
    # The spawn filter confines every spec: the directory was resolved and checked when the face
    # built it; reading the disk again per call is waste (and a rename in between is caught where
    # the child enters the directory, not here).
    (tmp_path / "sub").mkdir()
    spec = SpawnSpec("true", cwd="sub", workspace=tmp_path)
    (tmp_path / "sub").rmdir()
    limits = Limits(memory_bytes=1 << 30)
    confined = spec.confined(limits, None)
    assert (confined.cwd, confined.limits, spec.limits) == (tmp_path.resolve() / "sub", limits, None)
    with pytest.raises(InvalidArgument):  # what a re-check would have said
        dataclasses.replace(spec, limits=limits)
