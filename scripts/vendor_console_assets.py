"""Refresh the console's vendored browser libraries from npm: ``python scripts/vendor_console_assets.py``.

The console ships built files in the wheel (no CDN, no build step on a user's machine). This fetches
the pinned versions with ``npm pack`` (the registry's own tarballs, nothing installed), copies the
few built files the page loads plus each package's LICENSE, and writes VERSIONS.txt beside them.
Bump a pin here, run it, and commit what changed under src/procpilot/transports/http/console_static/vendor/.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

VENDOR = Path(__file__).resolve().parent.parent / "src/procpilot/transports/http/console_static/vendor"

# package@version -> (directory under vendor/, {file in the tarball: name under vendor/dir})
PACKAGES = {
    "@xterm/xterm@6.0.0": ("xterm", {"lib/xterm.mjs": "xterm.mjs", "css/xterm.css": "xterm.css", "LICENSE": "LICENSE"}),
    "uplot@1.6.32": (
        "uplot",
        {"dist/uPlot.iife.min.js": "uPlot.iife.min.js", "dist/uPlot.min.css": "uPlot.min.css", "LICENSE": "LICENSE"},
    ),
}


def main() -> int:
    npm = shutil.which("npm")
    if npm is None:
        print("need npm on PATH", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        for spec, (dirname, files) in PACKAGES.items():
            out = subprocess.run([npm, "pack", "--silent", spec], cwd=tmp, check=True, capture_output=True, text=True)
            tarball = Path(tmp) / out.stdout.strip().splitlines()[-1]
            target = VENDOR / dirname
            if target.exists():
                shutil.rmtree(target)
            target.mkdir(parents=True)
            with tarfile.open(tarball) as tar:
                for inner, name in files.items():
                    member = tar.extractfile(f"package/{inner}")
                    if member is None:
                        raise SystemExit(f"{spec}: no {inner} in the tarball")
                    (target / name).write_bytes(member.read())
            (target / "VERSION").write_text(spec + "\n")
            print(f"{spec} -> {target}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
