"""A supervisor in a delegated, non-root cgroup v2 (a systemd service with ``Delegate=yes``) can only
hand controllers to its sessions' cgroups after moving itself into a leaf of its own.

Run against the real "no internal processes" rule of this kernel, with whichever controller the
v2 hierarchy offers (on the development machine only ``hugetlb``; in scripts/cgroup2_vm.py's guest,
all of them). Each supervisor is a child process, since the move changes the mover's cgroup.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from procpilot.engine.trees import kill_cgroup_v2, reap_stale_instances
from tests.conftest import PY

_CHILD = """
import json, sys
from procpilot.engine.trees import enable_controllers, own_unified_cgroup
sys.stdin.readline()  # the test has moved us into the delegated cgroup
base = own_unified_cgroup()
why = enable_controllers(base, [sys.argv[1]])
now = open("/proc/self/cgroup").read().split("0::", 1)[1].strip()
print(json.dumps({"why": why, "base": str(base), "after": str(own_unified_cgroup()), "cgroup": now}))
sys.stdout.flush()
sys.stdin.readline()  # hold on until the test has looked
"""


def _unified_mount() -> Path | None:
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            if right.startswith("cgroup2 ") and left.split()[3] == "/":
                return Path(left.split()[4])
    return None


def _delegable() -> tuple[Path, str] | None:
    mount = _unified_mount()
    if mount is None or os.geteuid() != 0:
        return None
    controllers = (mount / "cgroup.controllers").read_text().split()
    # A domain controller: the rule does not cover threaded ones (cpu, pids alone may be enabled
    # beside processes), and memory, which procpilot always asks for with them, is one.
    domain = [c for c in ("memory", "io", "hugetlb", "rdma", "misc") if c in controllers]
    return (mount, domain[0]) if domain else None


_FOUND = _delegable()
pytestmark = pytest.mark.skipif(
    _FOUND is None, reason="needs root and a cgroup v2 hierarchy (mounted at its root) with a domain controller"
)


@pytest.fixture
def delegated() -> Iterator[tuple[Path, str]]:
    """A fresh cgroup below the v2 root with one controller available in it, as systemd would
    give a service; removed afterwards with whatever is left in it."""
    assert _FOUND is not None
    mount, controller = _FOUND
    # Left enabled in the root afterwards: unused it costs nothing, and switching it off again
    # would break a suite running beside this one.
    (mount / "cgroup.subtree_control").write_text(f"+{controller}")
    service = mount / f"procpilot-test-{secrets.token_hex(4)}.service"
    service.mkdir()
    try:
        yield service, controller
    finally:
        kill_cgroup_v2(service)
        for leaf in sorted(service.iterdir(), reverse=True):
            if leaf.is_dir():
                leaf.rmdir()
        service.rmdir()


def _start_in(service: Path, controller: str) -> subprocess.Popen[str]:
    child = subprocess.Popen([PY, "-c", _CHILD, controller], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    (service / "cgroup.procs").write_text(str(child.pid))
    assert child.stdin is not None
    child.stdin.write("go\n")
    child.stdin.flush()
    return child


def _report(child: subprocess.Popen[str]) -> dict[str, str | None]:
    assert child.stdout is not None
    line = child.stdout.readline()
    assert line, "the child died before reporting"
    report: dict[str, str | None] = json.loads(line)
    return report


def _finish(child: subprocess.Popen[str]) -> None:
    assert child.stdin is not None and child.stdout is not None
    child.stdin.close()
    child.wait(10)
    child.stdout.close()


def test_a_supervisor_alone_in_its_cgroup_moves_into_a_leaf_and_passes_the_controllers_on(
    delegated: tuple[Path, str],
) -> None:
    service, controller = delegated
    # What the old code did, and the kernel refuses: enable controllers with ourselves inside.
    child = _start_in(service, controller)
    report = _report(child)
    try:
        assert report["why"] is None
        assert report["base"] == str(service)
        leaf = Path(str(report["cgroup"])).name
        assert leaf.startswith(f"procpilot-{child.pid}-") and leaf.endswith("-supervisor")
        assert (service / leaf / "cgroup.procs").read_text().split() == [str(child.pid)]
        assert (service / "cgroup.procs").read_text() == ""
        assert controller in (service / "cgroup.subtree_control").read_text().split()
        # Its later supervisors still make their directories beside the leaf, not in it.
        assert report["after"] == str(service)
    finally:
        _finish(child)
    # Once it is gone, the next supervisor's start-up sweep removes the empty leaf.
    time.sleep(1.1)  # the sweep spares directories younger than a second (see trees.py)
    assert reap_stale_instances(service, kill_cgroup_v2) == [service / leaf]


def test_other_processes_in_the_cgroup_are_not_moved_and_the_reason_is_given(
    delegated: tuple[Path, str],
) -> None:
    service, controller = delegated
    bystander = subprocess.Popen(["sleep", "60"])
    try:
        (service / "cgroup.procs").write_text(str(bystander.pid))
        child = _start_in(service, controller)
        report = _report(child)
        try:
            assert report["why"] is not None and "other process" in report["why"]
            assert "Delegate=yes" in report["why"]
            members = set((service / "cgroup.procs").read_text().split())
            assert members == {str(bystander.pid), str(child.pid)}
            assert controller not in (service / "cgroup.subtree_control").read_text().split()
        finally:
            _finish(child)
    finally:
        bystander.kill()
        bystander.wait()


def test_a_controller_the_cgroup_was_not_given_is_named(delegated: tuple[Path, str]) -> None:
    service, _ = delegated
    child = _start_in(service, "no-such-controller")
    report = _report(child)
    _finish(child)
    assert report["why"] == f"no-such-controller not delegated to {service}"
    assert [p for p in service.iterdir() if p.is_dir()] == []  # no leaf made: nothing moved
