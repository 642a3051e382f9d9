"""Descriptors kept open in flight, out of the table (engine/stash.py)."""

from __future__ import annotations

import os

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
