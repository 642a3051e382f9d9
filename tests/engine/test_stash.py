"""Descriptors kept open in flight, out of the table (engine/stash.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from procpilot.engine.stash import BUCKET, DescriptorStash
from tests.conftest import open_fds


def _blocked(read_end: int) -> bool:
    """True iff a read would wait (a writer is still open somewhere); False at EOF."""
    os.set_blocking(read_end, False)
    try:
        os.read(read_end, 1)
    except BlockingIOError:
        return True
    return False


def test_a_stashed_write_end_keeps_its_pipe_open_without_a_descriptor() -> None:
    stash = DescriptorStash()
    pipes = [os.pipe() for _ in range(50)]
    before = len(open_fds())
    tokens = stash.put_many([w for _, w in pipes])
    try:
        assert None not in tokens
        # Fifty write ends gone from the table, one socket pair in their place; no reader sees EOF.
        assert stash.sockets == 2
        assert len(open_fds()) == before - 50 + 2
        assert all(_blocked(r) for r, _ in pipes)
        token = tokens[7]
        assert token is not None
        fd = stash.take(token)
        assert fd is not None
        os.write(fd, b"hi")
        assert os.read(pipes[7][0], 2) == b"hi"
        os.close(fd)
        assert not _blocked(pipes[7][0])  # its last writer closed: EOF
        assert all(_blocked(r) for i, (r, _) in enumerate(pipes) if i != 7)
        assert stash.take(token) is None  # taken once
    finally:
        stash.close()
        for r, _ in pipes:
            os.close(r)


def test_a_discarded_one_closes_when_its_bucket_is_next_opened_or_emptied() -> None:
    stash = DescriptorStash()
    (r1, w1), (r2, w2), (r3, w3) = os.pipe(), os.pipe(), os.pipe()
    t1, t2, t3 = stash.put_many([w1, w2, w3])
    assert t1 is not None and t2 is not None and t3 is not None
    try:
        stash.discard(t1)
        assert _blocked(r1)  # not yet: nobody looked into its bucket
        fd = stash.take(t2)
        assert fd is not None
        os.close(fd)
        assert not _blocked(r1)  # the bucket was opened: the discarded one was closed then
        stash.discard(t3)
        assert not _blocked(r3)  # the bucket's last one: the bucket went, and what it held
        assert stash.sockets == 0
    finally:
        stash.close()
        for fd in (r1, r2, r3):
            os.close(fd)


@pytest.mark.parametrize("together", [True, False])
def test_a_group_put_together_is_never_split_over_two_buckets(together: bool) -> None:
    stash = DescriptorStash()
    pipes = [os.pipe() for _ in range(BUCKET + 1)]
    try:
        first = stash.put_many([w for _, w in pipes[: BUCKET - 1]])
        assert None not in first and first[0] is not None
        stash.discard(first[0])  # closed when its bucket is next opened: a witness of that
        group = stash.put_many([w for _, w in pipes[BUCKET - 1 :]], together=together)
        assert None not in group
        assert stash.sockets == 4  # the first bucket had room for one of the two
        found = stash.take_many([t for t in group if t is not None])
        assert len(found) == 2
        for fd in found.values():
            os.close(fd)
        # Together, both went to the new bucket: taking them back left the first one unopened.
        assert _blocked(pipes[0][0]) is together
    finally:
        stash.close()
        for r, _ in pipes:
            os.close(r)


# In a child of its own: its descriptor limit is lowered under it, and every process the test
# suite shares keeps its own. Three groups of four write ends, stashed; then room for five.
_FULL_TABLE = """
import json, os, resource, sys
from procpilot.engine.stash import DescriptorStash

guarded = sys.argv[1] == "guarded"
stash = DescriptorStash(fit=guarded)
pipes = [os.pipe() for _ in range(12)]
groups = [stash.put_many([w for _, w in pipes[i : i + 4]], together=True) for i in (0, 4, 8)]
used = sorted(int(fd) for fd in os.listdir("/proc/self/fd"))
free = [fd for fd in range(used[-1] + 8) if fd not in used]
resource.setrlimit(resource.RLIMIT_NOFILE, (free[5], resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
tokens = [t for group in groups for t in group]
rounds = []
while len(rounds) < 4:
    found = stash.take_many([t for t in tokens if t in stash])
    rounds.append(len(found))
    for fd in found.values():
        os.close(fd)  # room for the next group
print(json.dumps({"rounds": rounds, "stashed": sum(t in stash for t in tokens)}))
"""


@pytest.mark.parametrize("guarded", [True, False])
def test_a_stash_made_to_fit_takes_out_only_what_the_table_has_room_for_and_loses_nothing(guarded: bool) -> None:
    run = subprocess.run(
        [sys.executable, "-c", _FULL_TABLE, "guarded" if guarded else "unguarded"], capture_output=True, check=True
    )
    said = json.loads(run.stdout)
    if guarded:
        # A group at a time, each whole; the rest stay stashed until room is made.
        assert said == {"rounds": [4, 4, 4, 0], "stashed": 0}, said
    else:
        # Unguarded (as before): one take receives what fits, the kernel closes the rest.
        assert said["rounds"][0] < 12 and sum(said["rounds"]) < 12 and said["stashed"] == 0, said
