"""The cgroup v2 code paths on a real controller hierarchy.

Hosts like the development machine bind memory/cpu/pids to cgroup v1, so the limit, tree and
delegation tests run a second time inside a qemu guest whose only cgroup mount is cgroup2 with
every controller (scripts/cgroup2_vm.py): once from the root cgroup, once alone in a delegated
child cgroup as a systemd service with ``Delegate=yes`` would be. There the limit backend must be
cgroup2 (a test in test_limits.py asserts it, and is skipped anywhere else).
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import PY

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "cgroup2_vm.py"
IN_GUEST = [
    "tests/engine/test_limits.py",
    "tests/engine/test_trees.py",
    "tests/engine/test_cgroup2_delegation.py",
    "tests/engine/test_fairness.py",
]

pytestmark = [
    pytest.mark.skipif(os.environ.get("PROCPILOT_VM") is not None, reason="already inside the guest"),
    pytest.mark.skipif(platform.machine() != "x86_64", reason="the guest kernel is Debian's amd64 one"),
    pytest.mark.skipif(
        shutil.which("qemu-system-x86_64") is None,
        reason="qemu-system-x86_64 is not installed (make test installs it where it may: root and apt)",
    ),
]


@pytest.mark.timeout(900)
@pytest.mark.parametrize("where", ["root", "delegated"])
def test_limits_trees_and_delegation_pass_on_a_real_cgroup2_hierarchy(where: str) -> None:
    flags = ["--delegated"] if where == "delegated" else []
    command = [PY, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", *IN_GUEST]
    result = subprocess.run(
        [PY, str(SCRIPT), *flags, "--", *command],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=880,
        check=False,
    )
    shown = f"{result.stdout[-6000:]}\n{result.stderr[-2000:]}"
    assert result.returncode == 0, shown
    # Every test ran, none skipped: the guest had what each one needs, the cgroup2 check included.
    summary = re.search(r"^(\d+) passed in [0-9.]+s", result.stdout, re.MULTILINE)
    assert summary is not None, shown
    assert int(summary.group(1)) >= 20, shown
