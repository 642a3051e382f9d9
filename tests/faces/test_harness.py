"""What the harness profiles share (faces/harness.py), over real sessions: the shell they run,
the exit code a shell would report, and reading output raw, in bounded memory."""

from __future__ import annotations

import os
import pwd

from procpilot.engine.capture import Stream
from procpilot.engine.spawn import SpawnSpec
from procpilot.engine.supervisor import Supervisor
from procpilot.faces.harness import default_shell, exit_code, first_log_file, read_bytes, scan


def test_default_shell_is_a_runnable_login_shell() -> None:
    shell = default_shell()
    assert os.access(shell, os.X_OK)
    assert os.path.basename(shell) not in ("nologin", "false")
    account = pwd.getpwuid(os.getuid()).pw_shell
    if account and os.path.basename(account) not in ("nologin", "false") and os.access(account, os.X_OK):
        assert shell == account  # the user's own, as both harnesses use


async def test_exit_code_is_the_status_or_128_plus_the_signal(supervisor: Supervisor) -> None:
    ok = await supervisor.run(SpawnSpec("exit 3"), scope="a", yield_ms=None)
    assert exit_code(ok) == 3
    killed = await supervisor.run(SpawnSpec("kill -TERM $$"), scope="a", yield_ms=None)
    assert killed.exit_signal == "SIGTERM" and exit_code(killed) == 128 + 15
    running = await supervisor.run(SpawnSpec("sleep 30"), scope="a", yield_ms=0)
    try:
        assert exit_code(running) is None  # not ended: no code to report
    finally:
        await supervisor.kill("a", running.id)


async def test_read_bytes_gives_the_output_raw(supervisor: Supervisor) -> None:
    s = await supervisor.run(
        SpawnSpec(r"printf '\033[31mred\033[0m\r\nx\n'; printf 'err\n' >&2"), scope="a", yield_ms=None
    )
    combined = await read_bytes(s, 0, s.output[Stream.COMBINED].size)
    assert b"\x1b[31mred\x1b[0m\r\n" in combined  # no escape stripping, no CR collapsing
    assert await read_bytes(s, 0, s.output[Stream.STDERR].size, Stream.STDERR) == b"err\n"
    assert await read_bytes(s, 2, 5, Stream.STDOUT) == b"31m"  # any range of a view
    assert first_log_file(s) == s.log_files[0]


async def test_scan_counts_every_byte_but_keeps_only_head_and_tail(supervisor: Supervisor) -> None:
    s = await supervisor.run(SpawnSpec('for i in $(seq 1 1000); do echo "é$i"; done'), scope="a", yield_ms=None)
    size = s.output[Stream.COMBINED].size
    whole = await read_bytes(s, 0, size)
    chunk = await scan(s, 0, size, head=10, tail=20)
    assert (chunk.size, chunk.newlines) == (size, 1000)
    assert chunk.chars == len(whole.decode())  # characters, not bytes: é is two bytes, one character
    assert chunk.head == whole[:10] and chunk.tail == whole[-20:]
    assert not chunk.whole
    small = await scan(s, 0, 12, head=10, tail=20)
    assert small.whole and small.head + small.tail == whole[:12]
