"""Joining a Ray cluster (cluster/ray_backend.py): an address where no cluster answers is refused
at once with a typed error and a hint, not after Ray's minute of retries."""

from __future__ import annotations

import socket
import time

import pytest

pytest.importorskip("ray")

import ray  # after the skip: only with Ray installed

from procpilot.cluster.ray_backend import join, leave
from procpilot.errors import ServeRefused


def test_no_cluster_at_the_address_is_refused_at_once() -> None:
    if ray.is_initialized():
        pytest.skip("this process already joined a cluster: join() returns at once then")
    with socket.socket() as closed:  # a port bound by us and not listening: nothing answers there
        closed.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{closed.getsockname()[1]}"
        started = time.monotonic()
        with pytest.raises(ServeRefused, match="no Ray cluster answers at") as info:
            join(address)
    assert time.monotonic() - started < 5  # refused before ray.init's retries, not after them
    assert "start_cluster" in info.value.hints
    assert not ray.is_initialized()
    leave()  # not joined: nothing to leave, and no error


def test_a_malformed_address_is_refused_too() -> None:
    if ray.is_initialized():
        pytest.skip("this process already joined a cluster")
    with pytest.raises(ServeRefused, match="no Ray cluster answers at 'nohost:notaport'"):
        join("nohost:notaport")
