"""A parked session's next output: from a write to its stdin to the echoed line in its log.

Run: ``.venv/bin/python bench/parking.py [--sessions 100]``. The same sessions twice: read by the
loop (a threshold no server reaches) and parked (every quiet session, one sweep after it went
quiet; engine/output_parking.py). Their stdin is written once first, so it stays in the table
and only the output ends park. Prints the median and 90th percentile of each.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import statistics
import tempfile
import time
from pathlib import Path

from procpilot.config import load_settings
from procpilot.engine.capture import Stream
from procpilot.engine.session import Session
from procpilot.engine.spawn import SpawnSpec
from procpilot.engine.supervisor import Supervisor


async def until_parked(sup: Supervisor, sessions: list[Session]) -> None:
    deadline = time.monotonic() + 30
    while not all(sup.output_parking.is_parked(s) for s in sessions):
        if time.monotonic() > deadline:
            raise TimeoutError("not every session was parked")
        await asyncio.sleep(0.01)


async def echo_walls(sessions: int, *, parked: bool) -> list[float]:
    with tempfile.TemporaryDirectory() as root:
        settings = load_settings(env={}, state_dir=Path(root) / "state", workspace_root=Path(root))
        async with Supervisor(settings) as sup:
            parking = sup.output_parking
            parking.park_above = 0 if parked else 1 << 30
            parking.sweep_every = 0.05
            started = [await sup.spawn(SpawnSpec("while read l; do echo $l; done"), scope="b") for _ in range(sessions)]
            for session in started:
                await session.write(b"warm\n")  # its stdin back in the table for good
            if parked:
                await until_parked(sup, started)
            walls = []
            for session in started:
                log = session.output[Stream.COMBINED]
                size = log.size
                t = time.perf_counter()
                await session.write(b"x\n")
                while log.size == size:
                    await session.output.wait_for_change(1)
                walls.append(time.perf_counter() - t)
            if parked and parking.left_behind:
                print(f"  registrations left behind: {parking.left_behind}")
            return walls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=100)
    args = parser.parse_args()
    for parked in (False, True):
        walls = asyncio.run(echo_walls(args.sessions, parked=parked))
        p90 = statistics.quantiles(walls, n=10)[-1]
        label = "parked         " if parked else "read by the loop"
        print(f"{label}: median {statistics.median(walls) * 1e3:.3f} ms, p90 {p90 * 1e3:.3f} ms")


if __name__ == "__main__":
    # SIGTERM ends a run as Ctrl-C does: its finally blocks end the daemons and sessions it started.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    main()
