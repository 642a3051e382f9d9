"""The per-agent spawn filter applied by the supervisor: every face gets the same box."""

from __future__ import annotations

import asyncio
import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from procpilot.config import load_settings
from procpilot.engine.capture import Stream
from procpilot.engine.limits import Limits
from procpilot.engine.spawn import SpawnSpec
from procpilot.engine.states import SessionState
from procpilot.engine.supervisor import Supervisor
from procpilot.errors import ProtectedVariable
from procpilot.faces.proc_protocol import ProcHandler
from procpilot.policy.commands import CommandDenied
from procpilot.policy.spawn_filter import ElevationDenied, LimitAboveAllocation, ProcLimit, make_spawn_filter
from procpilot.transports.serve import build_tools, make_supervisor


def settings_with(tmp_path: Path, workspace: Path, toml: str) -> Any:
    cfg = tmp_path / "policy.toml"
    cfg.write_text(toml)
    return load_settings(cfg, env={}, state_dir=tmp_path / "state", workspace_root=workspace)


async def test_allowlist_max_procs_and_elevation(tmp_path: Path, workspace: Path) -> None:
    settings = settings_with(tmp_path, workspace, '[policy.agents.a1]\nallow = ["sleep", "echo"]\nmax_procs = 1\n')
    async with Supervisor(settings, spawn_filter=make_spawn_filter(settings)) as sup:
        with pytest.raises(CommandDenied):
            await sup.spawn(SpawnSpec("echo hi; rm -rf /tmp/nothing"), scope="a1")
        first = await sup.spawn(SpawnSpec("sleep 5"), scope="a1")
        with pytest.raises(ProcLimit):
            await sup.spawn(SpawnSpec("echo two"), scope="a1")
        other = await sup.run(SpawnSpec("rm --version"), scope="unrestricted", yield_ms=None)
        assert other.state is SessionState.EXITED_OK
        with pytest.raises(ElevationDenied):
            await sup.spawn(SpawnSpec("echo hi", elevated=True), scope="unrestricted")
        await sup.remove("a1", first.id)


async def test_the_agents_allocation_caps_and_defaults_limits(tmp_path: Path, workspace: Path) -> None:
    settings = settings_with(tmp_path, workspace, "[policy.default]\nmemory_limit = 268435456\npids_max = 64\n")
    async with Supervisor(settings, spawn_filter=make_spawn_filter(settings)) as sup:
        with pytest.raises(LimitAboveAllocation):
            await sup.spawn(SpawnSpec("true", limits=Limits(memory_bytes=1 << 30)), scope="a")
        s = await sup.run(SpawnSpec("true"), scope="a", yield_ms=None)
        assert s.spec.limits == Limits(memory_bytes=268435456, pids_max=64)


async def test_an_address_space_limit_from_the_policy_reaches_the_process(tmp_path: Path, workspace: Path) -> None:
    settings = settings_with(tmp_path, workspace, "[policy.agents.small]\naddress_space_limit = 104857600\n")
    async with make_supervisor(settings) as sup:
        s = await sup.run(SpawnSpec("ulimit -v"), scope="small", yield_ms=None)
        assert s.output[Stream.STDOUT].read().data == b"102400\n"
        s = await sup.run(SpawnSpec("ulimit -v"), scope="other", yield_ms=None)
        assert s.output[Stream.STDOUT].read().data == b"unlimited\n"


async def test_network_off_policy_applies_to_every_spawn(tmp_path: Path, workspace: Path) -> None:
    from procpilot.engine.isolation import isolation_capabilities

    if isolation_capabilities()["network_off"] is None:
        pytest.skip("no network namespace mechanism on this host")
    settings = settings_with(tmp_path, workspace, "[policy.agents.offline]\nnetwork = false\n")
    async with Supervisor(settings, spawn_filter=make_spawn_filter(settings)) as sup:
        s = await sup.run(SpawnSpec("cat /proc/net/dev | tail -n +3 | cut -d: -f1"), scope="offline", yield_ms=None)
        assert s.output[Stream.STDOUT].read().data.split() == [b"lo"]
        s = await sup.run(SpawnSpec("cat /proc/net/dev | tail -n +3 | wc -l"), scope="online", yield_ms=None)
        assert int(s.output[Stream.STDOUT].read().data) >= 1


# Each runs code through the environment before any command check: (variables, how the mark is made).
ENV_TRICKS: list[tuple[str, dict[str, str]]] = [
    ("BASH_ENV", {"BASH_ENV": "{script}"}),
    ("ENV", {"ENV": "{script}"}),  # sh reads $ENV when interactive; bash in posix mode too
    ("BASH_FUNC", {"BASH_FUNC_ls%%": "() {{ touch {mark}; }}"}),
    ("PS4", {"SHELLOPTS": "xtrace", "PS4": "$(touch {mark})"}),
    ("LD_PRELOAD", {"LD_PRELOAD": "{lib}"}),
]


def _evil_library(tmp_path: Path, mark: Path) -> Path | None:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return None
    source = tmp_path / "evil.c"
    source.write_text(
        "#include <stdlib.h>\n"
        "__attribute__((constructor)) static void evil(void) {\n"
        '    unsetenv("LD_PRELOAD");\n'  # or the touch it runs would load it again, forever
        f'    system("touch {mark}");\n'
        "}\n"
    )
    lib = tmp_path / "evil.so"
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(lib), str(source)], check=True)
    return lib


@pytest.mark.parametrize(("name", "variables"), ENV_TRICKS, ids=[n for n, _ in ENV_TRICKS])
async def test_environment_tricks_are_refused_on_every_face(
    tmp_path: Path, workspace: Path, name: str, variables: dict[str, str]
) -> None:
    mark = tmp_path / "ran"
    script = tmp_path / "evil.sh"
    script.write_text(f"touch {mark}\n")
    lib = _evil_library(tmp_path, mark)
    if name == "LD_PRELOAD" and lib is None:
        pytest.skip("no C compiler to build the preload library")
    env = {k: v.format(script=script, mark=mark, lib=lib) for k, v in variables.items()}
    # sh reads $ENV only when interactive.
    argv = ("sh", "-ic", "ls") if name == "ENV" else ("bash", "-c", "ls")
    settings = settings_with(tmp_path, workspace, '[policy.agents.lim]\nallow = ["bash", "sh", "ls"]\n')

    # A live trick: run plainly, its code runs. (bash ignores PS4 from the environment as root.)
    plain = {**os.environ, **env}
    subprocess.run(argv, env=plain, stdin=subprocess.DEVNULL, capture_output=True, timeout=30, check=False)
    if not (name == "PS4" and os.geteuid() == 0):
        assert mark.exists(), f"{name}: the trick no longer runs code here"
    mark.unlink(missing_ok=True)

    async with make_supervisor(settings) as sup:
        tools = {t.name: t for t in build_tools(sup, settings)[0]}
        for scope in ("lim", "anyone"):
            result = await tools["exec"].call({"command": shlex.join(argv), "env": env}, scope)
            assert result.is_error and result.data["error"] == "ProtectedVariable", (scope, result.text)
            result = await tools["process.run"].call({"command": shlex.join(argv), "environment": env}, scope)
            assert result.is_error and result.data["error"] == "ProtectedVariable", (scope, result.text)
            handler = ProcHandler(sup, scope)
            try:
                response = await handler.handle({"type": "proc/spawn/req", "id": "1", "cmd": list(argv), "env": env})
            finally:
                handler.close()
            assert response["error"]["code"] == "protected_variable", (scope, response)
            with pytest.raises(ProtectedVariable):  # and the engine's own API, behind the filter
                await sup.spawn(SpawnSpec(argv, env=env), scope=scope)
    assert not mark.exists()


async def test_a_pty_shell_in_a_readonly_root_keeps_its_terminal(tmp_path: Path, workspace: Path) -> None:
    from procpilot.engine.isolation import isolation_capabilities

    if isolation_capabilities()["readonly_root"] is None:
        pytest.skip("bubblewrap is not installed on this host")
    settings = settings_with(tmp_path, workspace, "[policy.agents.ro]\nreadonly_root = true\n")
    async with Supervisor(settings, spawn_filter=make_spawn_filter(settings)) as sup:
        shell = await sup.spawn(SpawnSpec(("bash", "--norc", "-i"), pty=True, cwd=workspace), scope="ro")
        assert shell.spec.isolation is not None and not shell.spec.isolation.new_session
        await sup.write("ro", shell.id, b"sleep 30\n")
        await asyncio.sleep(0.5)
        await sup.write("ro", shell.id, b"\x03")  # ^C ends sleep, not the shell
        await sup.write("ro", shell.id, b"echo alive-$((6*7))\n")
        for _ in range(100):
            if b"alive-42" in shell.output[Stream.COMBINED].read().data:
                break
            await asyncio.sleep(0.05)
        assert not shell.finished and b"alive-42" in shell.output[Stream.COMBINED].read().data
        await sup.kill("ro", shell.id, 9, wait=None)
        s = await sup.run(SpawnSpec("true"), scope="ro", yield_ms=None)
        assert s.spec.isolation is not None and s.spec.isolation.new_session


def _needs_bwrap() -> None:
    from procpilot.engine.isolation import isolation_capabilities

    if isolation_capabilities().get("private_box") is None:
        pytest.skip("bubblewrap is not installed here")


async def test_an_isolated_agent_cannot_see_signal_or_read_another_agents_sessions(
    tmp_path: Path, workspace: Path
) -> None:
    _needs_bwrap()
    settings = settings_with(tmp_path, workspace, "[policy.agents.boxed]\nisolate = true\n")
    async with make_supervisor(settings) as sup:
        secret = await sup.spawn(SpawnSpec("echo SECRET-OF-A; sleep 30"), scope="a")
        await sup.wait("a", secret.id, timeout=10, pattern=re.compile("SECRET"))
        state = settings.state_dir
        cgroups = "/sys/fs/cgroup"
        probe = (
            f"kill -9 {secret.pid} 2>&1 || echo KILL-REFUSED; "
            f"cat {state}/sessions/*/* 2>&1 | grep -c SECRET-OF-A; "
            f"ls {state}/sessions | wc -l; ls {cgroups} | wc -l; "
            "ps -e -o pid= | wc -l; echo written > mine.txt"
        )
        boxed = await sup.run(SpawnSpec(probe, cwd=workspace), scope="boxed", yield_ms=None)
        out = boxed.output[Stream.STDOUT].read().data.decode().split()
        assert "KILL-REFUSED" in out, out
        assert out[-4:] == ["0", "0", "0", out[-1]], out  # no secret, no sessions, no cgroups
        assert int(out[-1]) <= 4, out  # its own box's processes only (sh, ps, wc...)
        assert secret.is_running  # the other agent's session is untouched
        assert (workspace / "mine.txt").read_text() == "written\n"  # a writable root: work goes on
        assert boxed.state is SessionState.EXITED_OK
        await sup.kill("a", secret.id, wait=None)


async def test_elevated_is_the_policys_to_allow(tmp_path: Path, workspace: Path) -> None:
    from procpilot.faces.exec_process import exec_process_tools

    settings = settings_with(
        tmp_path, workspace, "[policy.default]\nnetwork = false\n[policy.agents.trusted]\nelevated_allowed = true\n"
    )
    async with make_supervisor(settings) as sup:
        exec_tool = exec_process_tools(sup)[0]
        denied = await exec_tool.call({"command": "true", "elevated": True}, "plain")
        assert denied.is_error and denied.data["error"] == "ElevationDenied"
        allowed = await exec_tool.call({"command": "cat /proc/net/dev | wc -l", "elevated": True}, "trusted")
        assert not allowed.is_error and allowed.data["status"] == "done"
        boxed = await exec_tool.call({"command": "cat /proc/net/dev | wc -l"}, "trusted")
        assert int(allowed.data["output"]) > int(boxed.data["output"])  # outside the box: more than lo
    async with Supervisor(settings) as bare:  # no policy at all: nothing could allow leaving a box
        refused = await exec_process_tools(bare)[0].call({"command": "true", "elevated": True}, "trusted")
        assert refused.is_error and refused.data["error"] == "NotSupported"


@pytest.mark.parametrize(
    ("toml", "network"),
    [("isolate = true", False), ("isolate = true\nnetwork = true", True), ("readonly_root = true", True)],
)
def test_a_box_is_read_only_and_hides_the_daemon(tmp_path: Path, workspace: Path, toml: str, network: bool) -> None:
    config = tmp_path / "procpilot.toml"
    config.write_text(f'[server]\nunix_socket = "d.sock"\n[policy.agents.b]\n{toml}\n')
    settings = load_settings(config, env={}, state_dir=tmp_path / "state", workspace_root=workspace)
    box = make_spawn_filter(settings)("b", SpawnSpec("true"), 0).isolation
    assert box is not None and box.readonly_root and box.network is network
    assert {settings.state_dir, config.absolute(), tmp_path / "d.sock"} <= set(box.hidden)
