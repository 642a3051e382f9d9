"""The cgroup v2 code paths on a real controller hierarchy.

Hosts like the development machine bind memory/cpu/pids to cgroup v1, so the limit, tree and
delegation tests run a second time inside a qemu guest whose only cgroup mount is cgroup2 with
every controller (scripts/cgroup2_vm.py): once from the root cgroup, once alone in a delegated
child cgroup as a systemd service with ``Delegate=yes`` would be. There the limit backend must be
cgroup2 (a test in test_limits.py asserts it, and is skipped anywhere else).

Both runs share one boot, one after the other (a boot costs ~10-15 s under emulation, and the
first run warms the guest's caches for the second); each parametrization checks its own run.
"""

from __future__ import annotations

import os
import platform
import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import PY

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "cgroup2_vm.py"
RUNS = ("root", "delegated")
IN_GUEST = [
    "tests/engine/test_limits.py",
    "tests/engine/test_trees.py",
    "tests/engine/test_fairness.py",
]
# These make delegated cgroups of their own below the v2 root, so where the suite itself sits
# changes nothing for them: the root run has them, the delegated run would only repeat them.
ROOT_RUN_ONLY = ["tests/engine/test_cgroup2_delegation.py"]
# An rlimit, no cgroup: the host's run says all there is to say (and it costs ~4 s a run in the guest).
NOT_IN_GUEST = ["tests/engine/test_limits.py::test_address_space_limit_only_on_request"]
PYTEST = [
    *(PY, "-m", "pytest", "-q", "-rs"),
    # Nothing the guest runs uses a cache, xdist or anyio's plugin, and every plugin imported costs
    # seconds under emulation (these three: ~0.5 s on the host, ~20x that in the guest, a run).
    *("-p", "no:cacheprovider", "-p", "no:xdist", "-p", "no:xdist.looponfail", "-p", "no:anyio"),
    *(arg for test in NOT_IN_GUEST for arg in ("--deselect", test)),
]
# The same command for both runs; the script tells the delegated one so in PROCPILOT_VM_DELEGATED.
GUEST_COMMAND = [
    "/bin/sh",
    "-c",
    f'[ "$PROCPILOT_VM_DELEGATED" = 1 ] || set -- "$@" {shlex.join(ROOT_RUN_ONLY)}; exec "$@"',
    "in-guest",
    *PYTEST,
    *IN_GUEST,
]

pytestmark = [
    pytest.mark.skipif(os.environ.get("PROCPILOT_VM") is not None, reason="already inside the guest"),
    pytest.mark.skipif(platform.machine() != "x86_64", reason="the guest kernel is Debian's amd64 one"),
    pytest.mark.skipif(
        shutil.which("qemu-system-x86_64") is None,
        reason="qemu-system-x86_64 is not installed (make test installs it where it may: root and apt)",
    ),
]


@dataclass(frozen=True)
class Boot:
    """One boot of the guest: the script's exit status and output, cut into its runs."""

    returncode: int
    stdout: str
    stderr: str

    def run(self, where: str) -> tuple[int | None, str]:
        """The run's exit status (None if it never reported one) and its output."""
        start = re.search(rf"^cgroup2-vm run {where}: started .*$", self.stdout, re.MULTILINE)
        if start is None:
            return None, ""
        end = re.compile(rf"^cgroup2-vm run {where}: exit status (\d+) after .*$", re.MULTILINE)
        found = end.search(self.stdout, start.end())
        if found is None:
            return None, self.stdout[start.start() :]
        return int(found.group(1)), self.stdout[start.start() : found.end()]


@pytest.fixture(scope="module")
def guest(request: pytest.FixtureRequest) -> Boot:
    # Only the runs whose test is selected (`-k root` boots for the root run alone).
    selected = {
        getattr(item, "callspec").params["where"]  # noqa: B009  # only parametrized items have one
        for item in request.session.items
        if isinstance(item, pytest.Function) and item.module is request.module and hasattr(item, "callspec")
    }
    runs = [where for where in RUNS if where in selected] or list(RUNS)
    result = subprocess.run(
        [PY, str(SCRIPT), "--timeout", "870", "--runs", ",".join(runs), "--", *GUEST_COMMAND],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=880,
        check=False,
    )
    return Boot(result.returncode, result.stdout, result.stderr)


@pytest.mark.timeout(900)  # both runs, in the first test's share (the boot is its fixture's)
@pytest.mark.parametrize("where", RUNS)
def test_limits_trees_and_delegation_pass_on_a_real_cgroup2_hierarchy(where: str, guest: Boot) -> None:
    status, output = guest.run(where)
    shown = f"the guest's {where} run:\n{output[-6000:]}\nthe script's stderr:\n{guest.stderr[-2000:]}"
    assert status is not None, f"the {where} run never reported an exit status\n{guest.stdout[-3000:]}\n{shown}"
    assert status == 0, f"the {where} run failed (exit status {status})\n{shown}"
    # Every test ran, none skipped: the guest had what each one needs, the cgroup2 check included.
    summary = re.search(r"^(\d+) passed(, \d+ deselected)? in [0-9.]+s", output, re.MULTILINE)
    assert summary is not None, f"the {where} run did not pass every test it ran\n{shown}"
    assert int(summary.group(1)) >= 20, f"the {where} run ran too few tests\n{shown}"
