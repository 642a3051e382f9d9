"""Boxes fail closed and stay what they were, against a real daemon (issue 20, finding 6).

A slow bubblewrap probe is not "not installed"; a read-only root never becomes Landlock unless the
operator allowed it, and then the results and the capabilities say so; a hidden path that does
not exist when a command starts, or is made again while it runs, stays out of its sight."""

from __future__ import annotations

import os
import shutil
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from procpilot.engine.isolation import PROBE_TIMEOUT_ENV
from tests.daemon import TOKEN_A, TOKEN_B, Served, cleanup, post, start_daemon

BWRAP = shutil.which("bwrap")
needs_bwrap = pytest.mark.skipif(BWRAP is None, reason="bubblewrap is not installed on this host")


@pytest.fixture
def root() -> Iterator[Path]:
    # Not under /tmp: a read-only box has a private /tmp, where the daemon's files would be out
    # of sight whatever the masks do.
    path = Path("/var/tmp") / f"procpilot-boxes-{uuid.uuid4().hex[:12]}"
    path.mkdir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _fake_bwrap(root: Path, body: str) -> tuple[str, ...]:
    """A `bwrap` first on the daemon's PATH (``body``: its shell script), as ``wrap`` for start_daemon."""
    bin_dir = root / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "bwrap"
    fake.write_text(f"#!/bin/sh\n{body}\n")
    fake.chmod(0o755)
    return ("env", f"PATH={bin_dir}:{os.environ['PATH']}", f"{PROBE_TIMEOUT_ENV}=1")


def _stop(served: Served, *tokens: str) -> None:
    for token in tokens:
        with served.http(token) as c:
            cleanup(c)
    served.stop()


@needs_bwrap
def test_a_slow_bwrap_probe_is_no_answer_and_is_probed_again(root: Path) -> None:
    marks = root / "marks"
    marks.mkdir()
    # Its first two runs hang (a host under load), every later one is the real bubblewrap.
    body = f'for n in 1 2; do mkdir "{marks}/$n" 2>/dev/null && exec sleep 30; done\nexec {BWRAP} "$@"'
    served = start_daemon(root, extra="[policy.agents.agent-a]\nisolate = true\n", wrap=_fake_bwrap(root, body))
    try:
        with served.http(TOKEN_A) as c:
            first = post(c, "exec", command="cat /proc/1/comm")
            assert first.status_code == 501, first.text
            error = first.json()
            # The truth: no answer yet, to be asked again; not "not installed".
            assert error["error"] == "IsolationUnavailable" and error["probe"] == "no_answer", error
            assert "did not finish within 1 s" in error["message"] and "not installed" not in error["message"]
            assert set(error["hints"]) == {"retry"}, error
            caps = c.get("/v1/capabilities").json()["isolation"]
            assert caps["private_box"] == "bwrap", caps  # asked again, answered: no longer pending
            assert caps["pending"] == [], caps
            second = post(c, "exec", command="cat /proc/1/comm")
            assert second.status_code == 200, second.text
            # Its own pid namespace, whose init is bubblewrap: the box, not a weaker one.
            assert second.json()["data"]["output"].strip() == "bwrap", second.json()
            assert "weakerBox" not in second.json()["data"]
    finally:
        _stop(served, TOKEN_A)


def _outside(root: Path) -> Path:
    return Path("/var/tmp") / f"{root.name}-outside"  # beside the root: read-only in any box


def test_a_readonly_root_never_becomes_landlock_unasked(root: Path) -> None:
    outside = _outside(root)
    # A host without a working bubblewrap: the probe runs it, and it fails.
    policy = "[policy.agents.agent-a]\nreadonly_root = true\n"
    served = start_daemon(root, extra=policy, wrap=_fake_bwrap(root, "exit 1"))
    try:
        with served.http(TOKEN_A) as a:
            refused = post(a, "exec", command=f"touch {outside}")
            assert refused.status_code == 501, refused.text
            assert refused.json()["error"] == "IsolationUnavailable"
            assert "does not allow the weaker Landlock box" in refused.json()["message"]
            assert "allow_fallback" in refused.json()["hints"]
            assert not outside.exists()  # never run with the root writable, nor silently under Landlock
            caps = a.get("/v1/capabilities").json()["isolation"]
            assert caps["readonly_root"] == "landlock" and caps["fallback_allowed"] == [], caps
            assert caps["warning"] is None, caps
    finally:
        outside.unlink(missing_ok=True)
        _stop(served, TOKEN_A)


def test_a_landlock_box_the_operator_allowed_says_so(root: Path) -> None:
    outside = _outside(root)
    policy = '[policy.agents.agent-b]\nreadonly_root = true\nisolation_fallback = ["landlock"]\n'
    served = start_daemon(root, extra=policy, wrap=_fake_bwrap(root, "exit 1"))
    try:
        with served.http(TOKEN_B) as b:
            ran = post(b, "exec", command=f"touch {outside} || echo read-only")
            assert ran.status_code == 200, ran.text
            data = ran.json()["data"]
            assert data["output"].strip().endswith("read-only") and not outside.exists(), data
            assert "Landlock" in data["weakerBox"] and "/tmp is shared" in data["weakerBox"], data
            assert "[weaker box: read-only root by Landlock" in ran.json()["text"]
            run = post(b, "process.run", command="true")
            assert run.status_code == 200, run.text
            assert "Landlock" in run.json()["data"]["weaker_box"], run.json()
            caps = b.get("/v1/capabilities").json()["isolation"]
            assert caps["readonly_root"] == "landlock" and caps["fallback_allowed"] == ["agent agent-b: landlock"]
            assert caps["warning"].startswith("agent agent-b get read-only root by Landlock"), caps
        with served.http(TOKEN_A) as a:  # an agent without a box: nothing weaker to say
            plain = post(a, "exec", command="true").json()["data"]
            assert "weakerBox" not in plain, plain
    finally:
        outside.unlink(missing_ok=True)
        _stop(served, TOKEN_A, TOKEN_B)


@needs_bwrap
def test_a_hidden_socket_made_again_or_missing_at_the_start_stays_hidden(root: Path) -> None:
    served = start_daemon(root, extra="[policy.agents.agent-a]\nisolate = true\n")
    sock = root / "daemon.sock"
    go = root / "ws" / "go"
    script = f"while [ ! -e {go} ]; do sleep 0.02; done; test -e {sock} && echo VISIBLE || echo HIDDEN"
    try:
        with served.http(TOKEN_A) as c:
            assert sock.exists()
            started = post(c, "exec", command=script, background=True).json()["data"]["sessionId"]
            # What a re-exec does to its socket: gone for a moment (a command starts then), then
            # bound again at the same path.
            sock.unlink()
            missing = post(c, "exec", command=script, background=True).json()["data"]["sessionId"]
            again = socket.socket(socket.AF_UNIX)
            again.bind(str(sock))
            try:
                go.touch()
                for session_id in (started, missing):
                    done = post(c, "process", action="wait", sessionId=session_id, timeout=20_000).json()["data"]
                    assert done["status"] == "done", done
                    log = post(c, "process", action="log", sessionId=session_id).json()["data"]["output"]
                    assert log.strip() == "HIDDEN", (session_id, log)
            finally:
                again.close()
            # The daemon's other files next to it stay hidden, and the workspace beside them works.
            command = f"ls {root} {root}/state; echo x > {root}/ws/w && cat {root}/ws/w"
            seen = post(c, "exec", command=command).json()["data"]
            assert seen["output"].split() == [f"{root}:", "daemon.log", "state", "ws", f"{root}/state:", "x"], seen
            assert (root / "ws" / "w").read_text() == "x\n"
    finally:
        _stop(served, TOKEN_A)
