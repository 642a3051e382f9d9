"""Network isolation on this host's real mechanism: a listener on the host's loopback is unreachable."""

from __future__ import annotations

import os
import shutil
import socket
from pathlib import Path

import pytest

from procpilot.engine.capture import Stream
from procpilot.engine.isolation import Isolation, isolation_capabilities
from procpilot.engine.spawn import SpawnSpec
from procpilot.engine.states import SessionState
from procpilot.engine.supervisor import Supervisor

A = "agent-a"
CAPS = isolation_capabilities()

CONNECT = (
    "import socket,sys\n"
    "s=socket.socket()\ns.settimeout(2)\n"
    "try:\n    s.connect(('127.0.0.1', int(sys.argv[1])))\n    print('connected')\n"
    "except OSError as e:\n    print('refused', e)\n"
)


@pytest.fixture
def listener() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    yield sock
    sock.close()


async def test_without_isolation_the_listener_is_reachable(supervisor: Supervisor, listener: socket.socket) -> None:
    port = listener.getsockname()[1]
    s = await supervisor.run(SpawnSpec(("python3", "-c", CONNECT, str(port))), scope=A, yield_ms=None)
    assert s.output[Stream.STDOUT].read().data.startswith(b"connected")


@pytest.mark.skipif(CAPS["network_off"] is None, reason="no network namespace mechanism on this host")
async def test_network_off_cannot_reach_a_host_loopback_listener(
    supervisor: Supervisor, listener: socket.socket, tmp_path: Path
) -> None:
    port = listener.getsockname()[1]
    spec = SpawnSpec(("python3", "-c", CONNECT, str(port)), isolation=Isolation(network=False))
    s = await supervisor.run(spec, scope=A, yield_ms=None)
    out = s.output[Stream.STDOUT].read().data
    assert s.state is SessionState.EXITED_OK
    assert out.startswith(b"refused"), out
    # Its own loopback works: a namespace with only `lo`, not a broken process.
    spec = SpawnSpec("cat /proc/net/dev | tail -n +3 | cut -d: -f1 | tr -d ' '", isolation=Isolation(network=False))
    s = await supervisor.run(spec, scope=A, yield_ms=None)
    assert s.output[Stream.STDOUT].read().data.split() == [b"lo"]
    await _cannot_rejoin_the_host_network(supervisor, Isolation(network=False), port)


async def _cannot_rejoin_the_host_network(supervisor: Supervisor, isolation: Isolation, port: int) -> None:
    """A child with capabilities in the host's user namespace could setns back into its network."""
    if shutil.which("nsenter") is None:
        pytest.skip("nsenter is not installed")
    for target in ("1", str(os.getpid())):  # init's, and ours (in a pid namespace, 1 may be ours too)
        argv = ("nsenter", f"--net=/proc/{target}/ns/net", "python3", "-c", CONNECT, str(port))
        s = await supervisor.run(SpawnSpec(argv, isolation=isolation), scope=A, yield_ms=None)
        out = s.output[Stream.STDOUT].read().data
        assert not out.startswith(b"connected"), (target, out)
        assert s.exit_code != 0, (target, out, s.output[Stream.STDERR].read().data)


@pytest.mark.skipif(CAPS["readonly_root"] is None, reason="bubblewrap is not installed on this host")
async def test_readonly_root_without_network_cannot_rejoin_the_host_network(
    supervisor: Supervisor, listener: socket.socket, workspace: Path
) -> None:
    isolation = Isolation(network=False, readonly_root=True, writable=(workspace,))
    port = listener.getsockname()[1]
    s = await supervisor.run(
        SpawnSpec(("python3", "-c", CONNECT, str(port)), isolation=isolation), scope=A, yield_ms=None
    )
    assert s.output[Stream.STDOUT].read().data.startswith(b"refused")
    await _cannot_rejoin_the_host_network(supervisor, isolation, port)


@pytest.mark.skipif(CAPS["readonly_root"] is None, reason="bubblewrap is not installed on this host")
async def test_readonly_root_leaves_only_the_workspace_writable(supervisor: Supervisor, workspace: Path) -> None:
    # Not under /tmp: the sandbox gives /tmp a private tmpfs, where writes succeed but vanish.
    outside = Path("/var/tmp") / f"procpilot-ro-{workspace.parent.name}.txt"
    script = f"echo in > {workspace}/inside.txt; echo out > {outside}; echo done"
    spec = SpawnSpec(script, cwd=workspace, isolation=Isolation(readonly_root=True, writable=(workspace,)))
    s = await supervisor.run(spec, scope=A, yield_ms=None)
    assert (workspace / "inside.txt").read_text() == "in\n"
    try:
        assert not outside.exists()
        assert b"Read-only file system" in s.output[Stream.STDERR].read().data
    finally:
        outside.unlink(missing_ok=True)


@pytest.mark.skipif(CAPS["readonly_root"] is None, reason="bubblewrap is not installed on this host")
async def test_readonly_root_cannot_be_remounted_or_escaped(supervisor: Supervisor, workspace: Path) -> None:
    # Root in the sandbox, with its capabilities, could simply remount / read-write.
    outside = Path("/var/tmp") / f"procpilot-remount-{workspace.parent.name}.txt"
    script = (
        "mount -o remount,rw / && echo REMOUNTED; "
        "mount -t tmpfs none /var/tmp && echo MOUNTED; "
        f"echo out > {outside} && echo WROTE; "
        "grep CapEff /proc/self/status; "
        "cat /proc/1/comm"  # its own pid namespace, whose init is bwrap: no handle on the host's processes
    )
    spec = SpawnSpec(script, cwd=workspace, isolation=Isolation(readonly_root=True, writable=(workspace,)))
    s = await supervisor.run(spec, scope=A, yield_ms=None)
    out = s.output[Stream.STDOUT].read().data.decode()
    try:
        assert "REMOUNTED" not in out and "MOUNTED" not in out and "WROTE" not in out, out
        assert not outside.exists()
        assert "CapEff:\t0000000000000000" in out, out
        assert out.split()[-1] == "bwrap", out
    finally:
        outside.unlink(missing_ok=True)


@pytest.mark.skipif(CAPS["readonly_root"] is None, reason="bubblewrap is not installed on this host")
async def test_readonly_root_runs_in_a_session_of_its_own_unless_on_a_pty(
    supervisor: Supervisor, workspace: Path
) -> None:
    # The session's leader is inside the sandbox's pid namespace (bwrap's init) or, without a
    # session of its own, outside it, where its pid reads as 0.
    probe = ("python3", "-c", "import os; print(os.getsid(0) > 0)")
    for new_session, expected in ((True, b"True"), (False, b"False")):
        isolation = Isolation(readonly_root=True, writable=(workspace,), new_session=new_session)
        s = await supervisor.run(SpawnSpec(probe, isolation=isolation), scope=A, yield_ms=None)
        assert s.output[Stream.STDOUT].read().data.strip() == expected, new_session
