"""Isolation on this host's real mechanisms: a listener on the host's loopback is unreachable, a
read-only root is read-only. The fallbacks (Landlock, seccomp) are forced by making the probes for
bubblewrap and namespaces answer "unavailable", then exercised on the real kernel."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from procpilot.engine import isolation as iso
from procpilot.engine import sandbox_exec
from procpilot.engine.capture import Stream
from procpilot.engine.isolation import Isolation, IsolationUnavailable, isolation_capabilities, isolation_prefix
from procpilot.engine.spawn import SpawnSpec
from procpilot.engine.states import SessionState
from procpilot.engine.supervisor import Supervisor

A = "agent-a"
CAPS = isolation_capabilities()

CONNECT = (
    "import socket,sys\n"
    "try:\n    s=socket.socket()\n    s.settimeout(2)\n"  # under seccomp, socket() itself is refused
    "    s.connect(('127.0.0.1', int(sys.argv[1])))\n    print('connected')\n"
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


# --- The fallbacks, forced: no bubblewrap, no network namespace ------------------------------------


def _kernel_has_landlock() -> bool:
    # Asked of the kernel, not of our probe: a wrapper that restricts nothing must fail, not skip.
    try:
        import landlock

        return bool(landlock.landlock_abi_version() >= 1)
    except (ImportError, OSError):
        return False


def _libseccomp_loads() -> bool:
    try:
        import pyseccomp  # noqa: F401
    except (ImportError, OSError, RuntimeError):
        return False
    return "Seccomp:" in Path("/proc/self/status").read_text()


LANDLOCK = _kernel_has_landlock()
SECCOMP = _libseccomp_loads()
needs_landlock = pytest.mark.skipif(not LANDLOCK, reason="the kernel has no (enabled) Landlock")
needs_seccomp = pytest.mark.skipif(not SECCOMP, reason="libseccomp or seccomp filters are not available")
WRAPPER = str(Path(sandbox_exec.__file__))
# What the operator allows below: the weaker mechanisms these tests exercise when bubblewrap or
# namespaces are made to look missing.
FALLBACK = frozenset({"landlock", "seccomp"})


@pytest.fixture
def no_bwrap(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(iso, "_bwrap", lambda: None)


@pytest.fixture
def no_namespaces(monkeypatch: pytest.MonkeyPatch, no_bwrap: None) -> None:
    monkeypatch.setattr(iso, "_network_prefix", lambda: None)


def _outside(workspace: Path, name: str) -> Path:
    # Not under /tmp: Landlock leaves the host's /tmp writable. Unique per test run.
    return Path("/var/tmp") / f"procpilot-{name}-{workspace.parent.name}.txt"


@needs_landlock
async def test_landlock_readonly_root_leaves_only_the_workspace_writable(
    supervisor: Supervisor, workspace: Path, no_bwrap: None
) -> None:
    assert isolation_capabilities()["readonly_root"] == "landlock"
    isolation = Isolation(fallback=FALLBACK, readonly_root=True, writable=(workspace,))
    assert WRAPPER in isolation_prefix(isolation)
    outside = _outside(workspace, "landlock")
    script = (
        f"echo in > {workspace}/inside.txt && echo IN; "
        f"echo out > {outside} && echo OUT; "
        f"mkdir {workspace}/d && mv {workspace}/inside.txt {workspace}/d/ && echo MOVED; "
        "echo x > /dev/null && echo DEVNULL; "
        "echo y > /dev/stdout; "
        "head -c 4 /etc/passwd && echo; "  # reads anywhere
        f"mknod {workspace}/disk b 8 0 && echo MKNOD; "
        "grep CapEff /proc/self/status"
    )
    try:
        s = await supervisor.run(SpawnSpec(script, cwd=workspace, isolation=isolation), scope=A, yield_ms=None)
        out = s.output[Stream.STDOUT].read().data.decode()
        err = s.output[Stream.STDERR].read().data.decode()
        assert not outside.exists(), out
        assert "OUT" not in out and "Permission denied" in err, (out, err)
        assert "IN\nMOVED\nDEVNULL\ny\nroot\n" in out, (out, err)
        assert (workspace / "d" / "inside.txt").read_text() == "in\n"
        # No device nodes (a raw disk in the workspace), no capabilities for a root child.
        assert "MKNOD" not in out and not (workspace / "disk").exists(), out
        assert "CapEff:\t0000000000000000" in out, out
    finally:
        outside.unlink(missing_ok=True)


@needs_landlock
async def test_a_pty_shell_under_landlock_keeps_its_terminal(
    supervisor: Supervisor, workspace: Path, no_bwrap: None
) -> None:
    isolation = Isolation(fallback=FALLBACK, readonly_root=True, writable=(workspace,), new_session=False)
    shell = await supervisor.spawn(
        SpawnSpec(("bash", "--norc", "-i"), pty=True, cwd=workspace, isolation=isolation), scope=A
    )
    try:
        line = b"echo alive-$((6*7)) > /dev/tty; touch /var/tmp/x-$$ || echo read-only-$((1+1))\n"
        await supervisor.write(A, shell.id, line)
        for _ in range(200):
            if b"read-only-2" in shell.output[Stream.COMBINED].read().data:
                break
            await asyncio.sleep(0.025)
        out = shell.output[Stream.COMBINED].read().data
        assert b"alive-42" in out and b"read-only-2" in out, out
    finally:
        await supervisor.kill(A, shell.id, 9, wait=None)


@needs_landlock
async def test_landlock_cannot_be_remounted_or_undone(supervisor: Supervisor, workspace: Path, no_bwrap: None) -> None:
    outside = _outside(workspace, "ll-remount")
    script = (
        "mount -t tmpfs none /var/tmp && echo MOUNTED; "
        "mount -o remount,rw / && echo REMOUNTED; "
        f"unshare --map-root-user sh -c 'echo out > {outside}' && echo UNSHARED; "
        f"echo out > {outside} && echo WROTE"
    )
    isolation = Isolation(fallback=FALLBACK, readonly_root=True, writable=(workspace,))
    try:
        s = await supervisor.run(SpawnSpec(script, cwd=workspace, isolation=isolation), scope=A, yield_ms=None)
        out = s.output[Stream.STDOUT].read().data.decode()
        assert out == "", out
        assert not outside.exists()
    finally:
        outside.unlink(missing_ok=True)


async def _seccomp_refuses_ip(supervisor: Supervisor, isolation: Isolation, port: int) -> None:
    s = await supervisor.run(
        SpawnSpec(("python3", "-c", CONNECT, str(port)), isolation=isolation), scope=A, yield_ms=None
    )
    out = s.output[Stream.STDOUT].read().data
    assert s.state is SessionState.EXITED_OK, s.output[Stream.STDERR].read().data
    assert out.startswith(b"refused"), out
    assert b"Address family not supported" in out, out


UNIX_AND_URING = (
    "import ctypes, os, socket\n"
    "a, b = socket.socketpair()\na.send(b'x')\nprint('pair', b.recv(1).decode())\n"
    "libc = ctypes.CDLL(None, use_errno=True)\n"
    "fd = libc.syscall(425, 8, ctypes.create_string_buffer(120))\n"  # io_uring_setup(8, &params)
    "print('uring', 'refused' if fd < 0 else 'open', os.strerror(ctypes.get_errno()) if fd < 0 else '')\n"
)


def _io_uring_works_here() -> bool:
    done = subprocess.run([sys.executable, "-c", UNIX_AND_URING], capture_output=True, check=True)
    return b"uring open" in done.stdout


@needs_seccomp
async def test_seccomp_network_off_cannot_reach_a_host_loopback_listener(
    supervisor: Supervisor, listener: socket.socket, no_namespaces: None
) -> None:
    caps = isolation_capabilities()
    assert caps["network_off"] == "seccomp" and caps["network_off_loopback"] == "none"
    isolation = Isolation(fallback=FALLBACK, network=False)
    assert isolation_prefix(isolation)[-2:] == ["--no-network", "--"]
    port = listener.getsockname()[1]
    await _seccomp_refuses_ip(supervisor, isolation, port)
    # Unix sockets still work; io_uring (which opens sockets past the filter) does not.
    s = await supervisor.run(SpawnSpec(("python3", "-c", UNIX_AND_URING), isolation=isolation), scope=A, yield_ms=None)
    out = s.output[Stream.STDOUT].read().data.decode()
    assert "pair x" in out, (out, s.output[Stream.STDERR].read().data)
    assert "uring refused Function not implemented" in out, out
    # nsenter back into the host's namespace is no way round it (and needs capabilities it lacks).
    await _cannot_rejoin_the_host_network(supervisor, isolation, port)


@needs_seccomp
def test_io_uring_is_refused_by_the_filter_not_by_the_host() -> None:
    if not _io_uring_works_here():
        pytest.skip("io_uring is disabled on this host already: the filter's refusal cannot be told apart")
    done = subprocess.run(
        [*iso._sandbox("--no-network"), sys.executable, "-c", UNIX_AND_URING], capture_output=True, check=True
    )
    assert b"uring refused" in done.stdout, done.stdout


@needs_seccomp
def test_another_syscall_abi_cannot_slip_past_the_filter() -> None:
    # socket() by its x32 number: the filter is for the native ABI, so the process dies instead.
    probe = "import ctypes; print(ctypes.CDLL(None).syscall(0x40000000 | 41, 2, 1, 0), flush=True)"
    done = subprocess.run(
        [*iso._sandbox("--no-network"), sys.executable, "-c", probe], capture_output=True, check=False
    )
    assert done.returncode == -31 and done.stdout == b"", done  # SIGSYS


@needs_landlock
@needs_seccomp
async def test_without_bwrap_or_namespaces_one_wrapper_does_both(
    supervisor: Supervisor, listener: socket.socket, workspace: Path, no_namespaces: None
) -> None:
    isolation = Isolation(fallback=FALLBACK, network=False, readonly_root=True, writable=(workspace,))
    prefix = isolation_prefix(isolation)
    assert prefix.count(WRAPPER) == 1 and "--landlock" in prefix and "--no-network" in prefix, prefix
    await _seccomp_refuses_ip(supervisor, isolation, listener.getsockname()[1])
    outside = _outside(workspace, "both")
    try:
        s = await supervisor.run(
            SpawnSpec(f"echo out > {outside}; echo in > inside.txt", cwd=workspace, isolation=isolation),
            scope=A,
            yield_ms=None,
        )
        assert s.state is SessionState.EXITED_OK
        assert not outside.exists() and (workspace / "inside.txt").exists()
    finally:
        outside.unlink(missing_ok=True)


@needs_landlock
@pytest.mark.skipif(CAPS["network_off"] in (None, "bwrap", "seccomp"), reason="no namespace mechanism here")
async def test_landlock_goes_inside_a_network_namespace(
    supervisor: Supervisor, listener: socket.socket, workspace: Path, no_bwrap: None
) -> None:
    # unshare writes /proc/self/uid_map: it must run before Landlock makes that read-only.
    isolation = Isolation(fallback=FALLBACK, network=False, readonly_root=True, writable=(workspace,))
    prefix = isolation_prefix(isolation)
    assert prefix.index(WRAPPER) > 0 and "--no-network" not in prefix, prefix
    port = listener.getsockname()[1]
    s = await supervisor.run(
        SpawnSpec(("python3", "-c", CONNECT, str(port)), isolation=isolation), scope=A, yield_ms=None
    )
    out = s.output[Stream.STDOUT].read().data
    assert out.startswith(b"refused") and b"Address family" not in out, out  # its own loopback, not seccomp
    outside = _outside(workspace, "ns-ll")
    try:
        s = await supervisor.run(
            SpawnSpec(f"echo out > {outside}; echo in > inside.txt", cwd=workspace, isolation=isolation),
            scope=A,
            yield_ms=None,
        )
        assert not outside.exists() and (workspace / "inside.txt").exists()
    finally:
        outside.unlink(missing_ok=True)


@needs_landlock
@needs_seccomp
async def test_the_wrapper_execs_the_command_in_place(
    supervisor: Supervisor, workspace: Path, no_namespaces: None
) -> None:
    isolation = Isolation(fallback=FALLBACK, network=False, readonly_root=True, writable=(workspace,))
    probe = ("python3", "-c", "import os, sys, time; print(os.getpid(), flush=True); time.sleep(30)")
    s = await supervisor.spawn(SpawnSpec(probe, isolation=isolation), scope=A)
    try:
        for _ in range(200):
            if s.output[Stream.STDOUT].read().data:
                break
            await asyncio.sleep(0.025)
        assert int(s.output[Stream.STDOUT].read().data) == s.pid
        leader = psutil.Process(s.pid)
        assert leader.cmdline()[1:] == list(probe[1:]), leader.cmdline()
        assert leader.children(recursive=True) == []
        status = Path(f"/proc/{s.pid}/status").read_text()
        assert "NoNewPrivs:\t1" in status and "Seccomp:\t2" in status
    finally:
        await supervisor.kill(A, s.id, 9, wait=None)


def test_when_no_mechanism_works_isolation_fails_closed(
    monkeypatch: pytest.MonkeyPatch, no_namespaces: None, workspace: Path
) -> None:
    monkeypatch.setattr(iso, "_landlock", lambda: False)
    monkeypatch.setattr(iso, "_seccomp", lambda: False)
    assert isolation_capabilities() == {
        "network_off": None,
        "network_off_loopback": None,
        "readonly_root": None,
        "private_box": None,
        "pending": [],
    }
    for isolation in (
        Isolation(fallback=FALLBACK, network=False),
        Isolation(fallback=FALLBACK, readonly_root=True, writable=(workspace,)),
        Isolation(fallback=FALLBACK, network=False, readonly_root=True, writable=(workspace,)),
    ):
        with pytest.raises(IsolationUnavailable):
            isolation_prefix(isolation)


@needs_landlock
@needs_seccomp
def test_a_private_box_still_needs_bwrap(no_namespaces: None) -> None:
    with pytest.raises(IsolationUnavailable, match="bubblewrap"):
        isolation_prefix(Isolation(fallback=FALLBACK, private=True))


async def test_a_refused_isolation_never_starts_the_command(
    supervisor: Supervisor, monkeypatch: pytest.MonkeyPatch, no_namespaces: None, workspace: Path
) -> None:
    monkeypatch.setattr(iso, "_landlock", lambda: False)
    monkeypatch.setattr(iso, "_seccomp", lambda: False)
    marker = workspace / "ran.txt"
    for isolation in (
        Isolation(fallback=FALLBACK, network=False),
        Isolation(fallback=FALLBACK, readonly_root=True, writable=(workspace,)),
    ):
        with pytest.raises(IsolationUnavailable):
            await supervisor.run(
                SpawnSpec(f"touch {marker}", cwd=workspace, isolation=isolation), scope=A, yield_ms=None
            )
    assert not marker.exists()


def test_without_landlock_the_wrapper_exits_with_its_own_code(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    # A kernel without Landlock, as the library reports it: the wrapper must not run the command.
    marker = tmp_path / "ran"
    script = (
        "import errno, runpy, sys, landlock\n"
        "def none():\n    raise landlock.SyscallError(errno.EOPNOTSUPP, 'Landlock is disabled')\n"
        "landlock.landlock_abi_version = none\n"
        f"sys.argv = ['sandbox_exec', '--landlock', '--', 'touch', {str(marker)!r}]\n"
        f"runpy.run_path({WRAPPER!r}, run_name='__main__')\n"
    )
    done = subprocess.run([sys.executable, "-I", "-c", script], capture_output=True, check=False)
    assert done.returncode == sandbox_exec.LANDLOCK_UNAVAILABLE, done
    assert done.stderr.startswith(b"procpilot-sandbox: Landlock is not available"), done.stderr
    assert not marker.exists()


@pytest.mark.skipif(CAPS["private_box"] is None, reason="bubblewrap is not installed on this host")
async def test_paths_hidden_alone_still_get_a_box(supervisor: Supervisor, workspace: Path) -> None:
    # A non-empty isolation is a prefix at the exec point, never nothing: here, only a hidden file.
    secret = Path("/var/tmp") / f"procpilot-secret-{workspace.parent.name}"
    secret.mkdir()
    try:
        (secret / "token").write_text("s3cret")
        (secret / "beside").write_text("visible")
        isolation = Isolation(hidden=(secret / "token", secret / "later"))
        assert not isolation.empty and isolation_prefix(isolation)
        script = (
            f"cat {secret}/token; cat {secret}/beside; echo; "
            f"while [ ! -e {workspace}/go ]; do sleep 0.02; done; ls {secret}"
        )
        s = await supervisor.spawn(SpawnSpec(script, isolation=isolation), scope=A)
        (secret / "later").write_text("made after the start")
        (workspace / "go").touch()
        await s.wait_finished()
        out = s.output[Stream.STDOUT].read().data
        assert out == b"visible\nbeside\n", (out, s.output[Stream.STDERR].read().data)
    finally:
        shutil.rmtree(secret)


@needs_seccomp
def test_no_network_becomes_seccomp_only_where_allowed(no_namespaces: None) -> None:
    # Without a namespace, the filter is another box (no loopback, the host's abstract sockets
    # reachable): refused unless the operator allowed it, and then said.
    with pytest.raises(IsolationUnavailable, match="does not allow the seccomp filter"):
        isolation_prefix(Isolation(network=False))
    allowed = Isolation(network=False, fallback=frozenset({"seccomp"}))
    assert isolation_prefix(allowed)[-2:] == ["--no-network", "--"]
    note = iso.weaker_box(allowed)
    assert note is not None and "seccomp" in note and "not even loopback" in note
    assert iso.weaker_box(Isolation(network=False)) is None  # nothing allowed, nothing ran weaker
