"""Network isolation on this host's real mechanism: a listener on the host's loopback is unreachable."""

from __future__ import annotations

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
