"""A server's descriptor limit: it holds more running sessions than the soft limit it started with
allows, and its sessions get that soft limit back (engine/descriptors.py)."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from procpilot.engine import descriptors

# Run in a child: the limit is the whole process's, and this one must start low.
_SERVER = """
import asyncio, json, resource, signal, sys
from procpilot.config import load_settings
from procpilot.engine.capture import Stream
from procpilot.engine.spawn import SpawnSpec
from procpilot.engine.supervisor import Supervisor

START_SOFT, SESSIONS, ROOT = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
resource.setrlimit(resource.RLIMIT_NOFILE, (START_SOFT, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))

async def main():
    settings = load_settings(env={}, state_dir=ROOT + "/state", workspace_root=ROOT)
    found = {}
    async with Supervisor(settings, descriptors_for=(SESSIONS, 0)) as sup:
        warm = await sup.run(SpawnSpec("ulimit -n"), scope="t", yield_ms=5000)
        sessions = [await sup.spawn(SpawnSpec("echo up; sleep 60"), scope="t") for _ in range(SESSIONS)]
        await asyncio.sleep(0.5)
        found["running"] = sum(1 for s in sessions if s.is_running)
        found["descriptors"] = sup.capabilities()["descriptors"]
        found["warm_ulimit"] = warm.output[Stream.STDOUT].read().data.decode()
    async with Supervisor(settings, warm_shells=0) as cold:
        run = await cold.run(SpawnSpec("ulimit -n"), scope="t", yield_ms=5000)
        found["cold_ulimit"] = run.output[Stream.STDOUT].read().data.decode()
    found["left"] = sum(1 for s in sessions if not s.finished)
    print(json.dumps(found))

asyncio.run(main())
"""


def _hard() -> int:
    return resource.getrlimit(resource.RLIMIT_NOFILE)[1]


@pytest.mark.skipif(_hard() < descriptors.needed_for(300), reason="the hard descriptor limit here is too low")
def test_a_server_holds_more_sessions_than_its_starting_soft_limit(tmp_path: Path) -> None:
    start_soft, sessions = 256, 300  # 256 descriptors hold about 60 sessions
    env = {**os.environ, "PYTHONPATH": str(Path(descriptors.__file__).parents[2])}
    done = subprocess.run(
        [sys.executable, "-c", _SERVER, str(start_soft), str(sessions), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    found = json.loads(done.stdout)
    assert found["running"] == sessions
    assert found["left"] == 0
    report = found["descriptors"]
    assert report["soft"] >= descriptors.needed_for(sessions)
    assert report["raised_from"] == [start_soft, _hard()]
    assert report["running_sessions_it_holds"] >= sessions
    # Sessions get the soft limit the server started with, warm or cold.
    assert found["warm_ulimit"].strip() == str(start_soft)
    assert found["cold_ulimit"].strip() == str(start_soft)
