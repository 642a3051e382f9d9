"""A supervisor that is not the test run's: it detaches (double fork, new session) so that it is no
descendant of pytest, starts `sleep 60`, writes the sleeper's pid to argv[1] and serves until SIGTERM."""

import asyncio
import os
import signal
import sys
from pathlib import Path

from procpilot.config import load_settings
from procpilot.engine.spawn import SpawnSpec
from procpilot.engine.supervisor import Supervisor


async def serve(report: Path, state: Path) -> None:
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    async with Supervisor(load_settings(env={}, state_dir=state, workspace_root=state)) as sup:
        session = await sup.run(SpawnSpec("sleep 60"), scope="foreign", yield_ms=0)
        while session.pid is None:
            await asyncio.sleep(0.01)
        report.write_text(f"{os.getpid()} {session.pid}")
        await stop.wait()


if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        asyncio.run(serve(Path(sys.argv[1]), Path(sys.argv[2])))
    os._exit(0)
os.wait()
