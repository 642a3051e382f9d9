"""The daemon's own files and an agent's box (policy/daemon_files.py): a writable path that is
or holds the state directory, the config file or the Unix socket is refused with both paths
named; a trusted agent (no box) or a layout that keeps them apart passes."""

from __future__ import annotations

from pathlib import Path

import pytest

from procpilot.config import Settings, load_settings
from procpilot.engine.isolation import isolation_capabilities
from procpilot.errors import ConfigError
from procpilot.policy.daemon_files import check_daemon_files, daemon_paths


def _settings(tmp_path: Path, workspace: Path, policy: str) -> Settings:
    config = tmp_path / "procpilot.toml"
    config.write_text(policy)
    return load_settings(env={}, state_dir=tmp_path / "state", workspace_root=workspace, config_file=config)


def test_daemon_paths_are_the_state_the_config_and_the_socket(tmp_path: Path) -> None:
    (tmp_path / "w").mkdir()
    settings = _settings(tmp_path, tmp_path / "w", "")
    paths = daemon_paths(settings)
    assert paths[0] == settings.state_dir and paths[1] == tmp_path / "procpilot.toml"
    assert all(isinstance(p, Path) for p in paths)
    assert (settings.server.unix_socket is None) == (len(paths) == 2)


def test_a_box_whose_workspace_is_the_state_directory_is_refused(tmp_path: Path) -> None:
    (tmp_path / "state").mkdir()
    settings = _settings(tmp_path, tmp_path / "state", "[policy.default]\nisolate = true\n")
    with pytest.raises(ConfigError) as info:
        check_daemon_files(settings)
    assert "[policy.default]" in info.value.message and "is the state directory" in info.value.message
    assert info.value.details["writable"] == str((tmp_path / "state").resolve())
    assert info.value.hints["separate"].startswith("Keep the state directory")


def test_a_writable_path_inside_the_state_directory_is_refused_for_one_agent(tmp_path: Path) -> None:
    (tmp_path / "w").mkdir()
    (tmp_path / "state" / "logs").mkdir(parents=True)
    policy = f'[policy.agents.a]\nisolate = true\nwritable = ["{tmp_path / "state" / "logs"}"]\n'
    with pytest.raises(ConfigError, match=r"\[policy.agents.a\].*lies inside the state directory"):
        check_daemon_files(_settings(tmp_path, tmp_path / "w", policy))


def test_apart_unboxed_or_pinned_by_bubblewrap_passes(tmp_path: Path) -> None:
    (tmp_path / "w").mkdir()
    check_daemon_files(_settings(tmp_path, tmp_path / "w", "[policy.default]\nisolate = true\n"))
    # The state directory inside an isolated box's workspace: bubblewrap hides it and pins it in place.
    check_daemon_files(_settings(tmp_path, tmp_path, "[policy.default]\nisolate = true\n"))
    # No box: such an agent is trusted with every file of the server's user, so nothing to refuse.
    check_daemon_files(_settings(tmp_path, tmp_path, "[policy.default]\nisolate = false\n"))


def test_a_daemon_file_a_landlock_box_could_move_is_refused_only_under_landlock(tmp_path: Path) -> None:
    settings = _settings(tmp_path, tmp_path, "[policy.default]\nreadonly_root = true\n")
    if isolation_capabilities()["readonly_root"] == "landlock":
        with pytest.raises(ConfigError, match="without bubblewrap") as info:
            check_daemon_files(settings)
        assert "install_bubblewrap" in info.value.hints
    else:
        check_daemon_files(settings)  # bubblewrap (or no box at all): nothing left to move it
