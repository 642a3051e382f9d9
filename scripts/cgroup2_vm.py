#!/usr/bin/env python3
"""Run a command on a real cgroup v2 hierarchy, inside a throwaway qemu guest.

Why: this host binds the memory, cpu and pids controllers to cgroup v1; its cgroup2 mount
(/sys/fs/cgroup/unified) has hugetlb only, and a controller cannot be moved to v2 while a v1
hierarchy holds it. Booting a kernel of our own whose only cgroup mount is cgroup2 is the one way
to test procpilot's cgroup v2 code against real memory/cpu/pids controllers here.

The guest: Debian's current kernel (fetched with apt-get download into a cache, never installed)
boots an initramfs of busybox plus the 9p/virtio/overlay modules. Its /init mounts the host's
root read-only over 9p as the lower layer of an overlay with a tmpfs on top (the guest may write
anywhere; the host never changes), plus a 9p share of a host temp dir at /vmin that hands it
the guest script, and switches root. The guest script then mounts proc/sys/dev, tmpfs on /run and
/dev/shm (the host's /tmp stays visible, writable through the overlay: a checkout may live there),
and cgroup2 alone on /sys/fs/cgroup (v1 is disabled on the kernel command line), enables
+memory +cpu +pids in the root's subtree_control, and runs the command as root in the host's
current directory, once for each place --runs names, one after the other in the same boot:
"root" (the root cgroup) and "delegated" (alone in /sys/fs/cgroup/procpilot.service, as systemd
runs a Delegate=yes service). A boot costs ~10-15 s under emulation and the first run warms the
guest's caches for the next (bytecode, pages read over 9p), so one boot with two runs is much
cheaper than two boots. The command's stdout and stderr go through a pipe to the serial console,
which this script copies to its stdout between two lines of its own per run:

    cgroup2-vm run NAME: started WHERE
    ...the command's output...
    cgroup2-vm run NAME: exit status STATUS after SECONDSs

Usage:
    python scripts/cgroup2_vm.py [--timeout SECONDS] [--runs root,delegated | --delegated] -- COMMAND...

Exit status: 0 if every run's command exited 0, else the first other status: a command's own, or
123 (the guest stopped before that run reported one), 124 (timed out), 125 (the VM could not be
prepared: qemu missing, download failed, ...), 130 (interrupted).

Environment: PROCPILOT_VM_CACHE (cache dir, default .venv/cgroup2-vm in the repo),
PROCPILOT_VM_ACCEL=kvm (opt in to KVM: TCG is the default because /dev/kvm on the Firecracker
hosts we run on is broken), PROCPILOT_VM_DEBUG=1 (show the kernel's boot messages).
"""

from __future__ import annotations

import argparse
import ctypes
import fcntl
import gzip
import hashlib
import io
import lzma
import os
import secrets
import select
import shlex
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

EXIT_NO_STATUS = 123
EXIT_TIMEOUT = 124
EXIT_PREPARE = 125
EXIT_INTERRUPTED = 130

QEMU = "qemu-system-x86_64"
SERVICE_CGROUP = "/sys/fs/cgroup/procpilot.service"
# Where each run's command is started, by the name --runs gives it.
PLACES = {"root": "in the root cgroup", "delegated": f"alone in {SERVICE_CGROUP}"}
# Once a run's command has exited its output only has to be flushed; a background process it left
# holding the pipe must not keep the next run, or the end, waiting until the timeout.
FLUSH_GRACE = 5
# What the initramfs needs to reach the host's files; dependencies are added from the modules.
WANTED_MODULES = ("virtio_pci", "9pnet_virtio", "9p", "overlay", "virtio_rng")
BUSYBOX_APPLETS = ("sh", "mount", "umount", "mkdir", "insmod", "cat", "ip", "sleep", "switch_root")
KERNEL_CMDLINE = (
    "console=ttyS0 panic=-1 rdinit=/init"
    # Controllers can then only ever be on v2, whoever mounts what.
    " cgroup_no_v1=all"
    # Under TCG every mitigation (page-table isolation above all) costs a lot and protects nothing.
    " mitigations=off"
    " i8042.noaux=1 i8042.nokbd=1 i8042.nopnp=1"
)

INIT_SCRIPT = """#!/bin/sh
# PID 1 of the initramfs: reach the host's root and hand over to the guest script in /vmin.
fail() {
    echo "cgroup2-vm: init: $*"
    echo o > /proc/sysrq-trigger
    sleep 60
}
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
for m in $(cat /modules/load-order); do
    insmod "/modules/$m" || fail "insmod $m failed"
done
mkdir -p /lower /rw /newroot
# Read-only and never changed by the guest, so the page cache may keep what it read (cache=loose).
mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=512000,cache=loose hostroot /lower \\
    || fail "cannot mount the host's root (9p tag hostroot)"
mount -t tmpfs -o mode=0755 tmpfs /rw
mkdir -p /rw/upper /rw/work
mount -t overlay -o lowerdir=/lower,upperdir=/rw/upper,workdir=/rw/work overlay /newroot \\
    || fail "cannot mount the overlay root"
mkdir -p /newroot/vmin
mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=512000 vmin /newroot/vmin \\
    || fail "cannot mount the guest script's share (9p tag vmin)"
ip link set lo up
umount /proc /sys /dev
exec switch_root /newroot /bin/sh /vmin/guest.sh
"""

GUEST_SCRIPT = """#!/bin/sh
# PID 1 of the guest, run by the host's /bin/sh on the overlay root.
mount -t proc -o nosuid,nodev,noexec proc /proc
mount -t sysfs -o nosuid,nodev,noexec sysfs /sys
mount -t devtmpfs -o nosuid devtmpfs /dev
mkdir -p /dev/pts /dev/shm
# devtmpfs lacks the links udev makes; `> /dev/stdout` would create a file instead.
ln -s /proc/self/fd /dev/fd
ln -s /proc/self/fd/0 /dev/stdin
ln -s /proc/self/fd/1 /dev/stdout
ln -s /proc/self/fd/2 /dev/stderr
mount -t devpts -o nosuid,noexec,gid=5,mode=620,ptmxmode=666 devpts /dev/pts
mount -t tmpfs -o nosuid,nodev,mode=1777 tmpfs /dev/shm
mount -t tmpfs -o nosuid,nodev,mode=755 tmpfs /run
# The options systemd mounts cgroup2 with, so the guest looks like a systemd host.
mount -t cgroup2 -o nosuid,nodev,noexec,nsdelegate,memory_recursiveprot cgroup2 /sys/fs/cgroup
echo '+memory +cpu +pids' > /sys/fs/cgroup/cgroup.subtree_control
# Keep kernel messages (an OOM kill, say) from interleaving with the command's output.
echo {printk} > /proc/sys/kernel/printk
echo "{marker} ready $(cut -d' ' -f1 /proc/uptime)"
{runs}
# The host stops reading here and kills qemu: quicker than a poweroff, and the kernel's
# "Power down" line (emergency level, so no loglevel hides it) never reaches the output.
echo "{marker} done"
sync
echo o > /proc/sysrq-trigger
sleep 60
"""

# One run of the command. Its output reaches the console through a fifo and a copier (the
# command sees a pipe, not a tty); the status goes in the marker line, which no output can fake.
RUN_SCRIPT = """
{setup}
echo "{marker} run {name}"
mkfifo /run/cgroup2-vm-output
cat /run/cgroup2-vm-output &
copier=$!
if cd {cwd}; then
    env -i {env} /bin/sh -c {launch} cgroup2-vm {argv} </dev/null >/run/cgroup2-vm-output 2>&1
    status=$?
else
    echo "cgroup2-vm: no such directory in the guest (its /run and /dev/shm are its own)" \\
        >/run/cgroup2-vm-output
    status={no_status}
fi
{{ sleep {grace}; kill $copier 2>/dev/null; }} &
timer=$!
# Quiet: the shell would announce the copier's death itself. cat exits 0 unless the timer killed it.
wait $copier 2>/dev/null || echo "{marker} held {name}"
kill $timer 2>/dev/null
rm /run/cgroup2-vm-output
echo "{marker} end {name} $status"
"""

GUEST_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# The command alone in the service cgroup: the shell moves itself in and then becomes the command.
LAUNCH_DELEGATED = f'echo $$ > {SERVICE_CGROUP}/cgroup.procs && exec "$@"'
LAUNCH_ROOT = 'exec "$@"'


class VmError(Exception):
    """A one-line reason the run cannot go on, and the exit status that says which kind."""

    def __init__(self, message: str, code: int = EXIT_PREPARE) -> None:
        super().__init__(message)
        self.code = code


class Terminated(Exception):
    """SIGTERM or SIGHUP: unwind like Ctrl-C so that qemu is killed on the way out."""


@dataclass(frozen=True)
class Kernel:
    vmlinuz: Path
    modules: list[Path]  # in load order


# ---------------------------------------------------------------- fetching the kernel and busybox


def repo_root() -> Path:
    return Path(__file__).resolve().parent.parent


def cache_dir() -> Path:
    configured = os.environ.get("PROCPILOT_VM_CACHE")
    path = Path(configured) if configured else repo_root() / ".venv" / "cgroup2-vm"
    path.mkdir(parents=True, exist_ok=True)
    return path.resolve()


@contextmanager
def locked(directory: Path) -> Iterator[None]:
    # Two runs started at once on a cold cache would otherwise extract over each other.
    with (directory / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def run_captured(argv: list[str], cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, check=False)


def last_line(result: subprocess.CompletedProcess[str]) -> str:
    lines = (result.stderr or result.stdout).strip().splitlines()
    return lines[-1] if lines else f"exit status {result.returncode}"


def current_kernel_package() -> str | None:
    # linux-image-amd64 is the metapackage; what it depends on is the versioned image to fetch.
    result = run_captured(["apt-cache", "depends", "linux-image-amd64"])
    for line in result.stdout.splitlines():
        kind, _, name = line.strip().partition(": ")
        if kind == "Depends" and name.startswith("linux-image-"):
            return name
    return None


def apt_update() -> None:
    progress("apt-get download failed; running apt-get update once")
    result = run_captured(["apt-get", "update"])
    if result.returncode != 0:
        progress(f"apt-get update failed: {last_line(result)}")


def download_package(resolve: Callable[[], str | None], where: Path) -> Path:
    """apt-get download a package into where, with one apt-get update in between if it fails."""
    failure = "apt-cache found no package"
    for attempt in range(2):
        if attempt:
            apt_update()
        name = resolve()
        if name is None:
            continue
        result = run_captured(["apt-get", "download", name], cwd=where)
        debs = sorted(where.glob(f"{name}_*.deb"))
        if result.returncode == 0 and debs:
            return debs[-1]
        failure = f"apt-get download {name}: {last_line(result)}"
    raise VmError(f"cgroup2-vm: cannot fetch a package ({failure})")


@contextmanager
def extracted(deb: Path) -> Iterator[Path]:
    """The deb's files in a temporary dir next to it; the deb and the dir are gone afterwards."""
    with tempfile.TemporaryDirectory(dir=deb.parent, prefix="extract-") as tmp:
        result = run_captured(["dpkg-deb", "-x", str(deb), tmp])
        deb.unlink()
        if result.returncode != 0:
            raise VmError(f"cgroup2-vm: dpkg-deb -x {deb.name}: {last_line(result)}")
        yield Path(tmp)


def module_name(path: Path) -> str:
    # Kernel names use underscores whatever the file says (virtio-rng.ko is virtio_rng).
    return path.name.split(".ko", 1)[0].replace("-", "_")


def read_module(path: Path) -> bytes:
    # busybox insmod loads plain ELF only, so compressed modules are unpacked before they are stored.
    data = path.read_bytes()
    if path.name.endswith(".ko.xz"):
        return lzma.decompress(data)
    if path.name.endswith(".ko.gz"):
        return gzip.decompress(data)
    if path.name.endswith(".ko"):
        return data
    raise VmError(f"cgroup2-vm: cannot unpack kernel module {path.name} (only .ko, .ko.xz, .ko.gz)")


def modinfo_depends(image: bytes) -> list[str]:
    """The depends= field of a module's .modinfo ELF section.

    Debian's image package has no modules.dep (its postinst runs depmod), so the dependencies are
    read from each module, which is all depmod does with them anyway.
    """
    (shoff,) = struct.unpack_from("<Q", image, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", image, 0x3A)

    def section(index: int) -> tuple[int, int, int]:
        name, _type, _flags, _addr, offset, size = struct.unpack_from("<IIQQQQ", image, shoff + index * shentsize)
        return name, offset, size

    _, names_at, _ = section(shstrndx)
    for index in range(shnum):
        name, offset, size = section(index)
        if image[names_at + name : image.index(b"\0", names_at + name)] != b".modinfo":
            continue
        for field in image[offset : offset + size].split(b"\0"):
            if field.startswith(b"depends="):
                return [dep.replace("-", "_") for dep in field[8:].decode().split(",") if dep]
    return []


def load_order(available: dict[str, Path], wanted: tuple[str, ...]) -> list[str]:
    """wanted and everything they need, each after its dependencies."""
    order: list[str] = []

    def visit(name: str, chain: tuple[str, ...]) -> None:
        if name in order:
            return
        if name not in available:
            raise VmError(f"cgroup2-vm: the guest kernel has no module {name} (needed by {' < '.join(chain)})")
        for dep in modinfo_depends(read_module(available[name])):
            visit(dep, (*chain, name))
        order.append(name)

    for name in wanted:
        visit(name, ())
    return order


def store_kernel(root: Path, target: Path) -> None:
    """Keep only vmlinuz and the modules the initramfs needs: the whole tree is 400 MB."""
    vmlinuz = next(root.glob("boot/vmlinuz-*"), None)
    if vmlinuz is None:
        raise VmError("cgroup2-vm: the kernel package has no boot/vmlinuz-*")
    available = {module_name(path): path for path in root.glob("lib/modules/*/kernel/**/*.ko*")}
    names = load_order(available, WANTED_MODULES)
    (target / "modules").mkdir(parents=True)
    shutil.copyfile(vmlinuz, target / "vmlinuz")
    for name in names:
        (target / "modules" / f"{name}.ko").write_bytes(read_module(available[name]))
    (target / "load-order").write_text("".join(f"{name}.ko\n" for name in names))


def cached_kernel(cache: Path) -> Kernel | None:
    marker = " ".join(WANTED_MODULES)
    for directory in sorted(cache.glob("kernel-*"), reverse=True):
        complete = directory / "complete"
        if complete.is_file() and complete.read_text() == marker:
            names = (directory / "load-order").read_text().split()
            return Kernel(directory / "vmlinuz", [directory / "modules" / name for name in names])
    return None


def fetch_kernel(cache: Path) -> Kernel:
    kernel = cached_kernel(cache)
    if kernel is not None:
        return kernel
    started = time.monotonic()
    deb = download_package(current_kernel_package, cache)
    target = cache / ("kernel-" + deb.name.split("_", 1)[0].removeprefix("linux-image-"))
    shutil.rmtree(target, ignore_errors=True)
    with extracted(deb) as root:
        store_kernel(root, target)
    (target / "complete").write_text(" ".join(WANTED_MODULES))
    progress(f"fetched and unpacked {target.name} in {time.monotonic() - started:.1f}s")
    kernel = cached_kernel(cache)
    assert kernel is not None  # noqa: S101  # just written
    return kernel


def fetch_busybox(cache: Path) -> Path:
    target = cache / "busybox"
    if target.is_file():
        return target
    started = time.monotonic()
    deb = download_package(lambda: "busybox-static", cache)
    with extracted(deb) as root:
        shutil.copyfile(root / "bin" / "busybox", cache / "busybox.tmp")
    (cache / "busybox.tmp").replace(target)
    progress(f"fetched busybox-static in {time.monotonic() - started:.1f}s")
    return target


# ---------------------------------------------------------------- the initramfs


class Newc:
    """A cpio archive in the kernel's newc format, written in memory: no cpio tool is needed."""

    def __init__(self) -> None:
        self.out = io.BytesIO()
        self.inode = 0

    def add(self, name: str, mode: int, data: bytes = b"", rdev: tuple[int, int] = (0, 0)) -> None:
        self.inode += 1
        fields = (self.inode, mode, 0, 0, 1, 0, len(data), 0, 0, rdev[0], rdev[1], len(name) + 1, 0)
        self.out.write(b"070701" + b"".join(b"%08X" % field for field in fields))
        self.out.write(name.encode() + b"\0")
        self.pad()
        self.out.write(data)
        self.pad()

    def pad(self) -> None:
        self.out.write(b"\0" * (-self.out.tell() % 4))

    def finish(self) -> bytes:
        self.add("TRAILER!!!", 0)
        return self.out.getvalue()


def initramfs_image(kernel: Kernel, busybox: Path) -> bytes:
    archive = Newc()
    for directory in ("bin", "dev", "proc", "sys", "modules"):
        archive.add(directory, 0o40755)
    # The kernel opens /dev/console for /init before anything is mounted: without it no output.
    archive.add("dev/console", 0o20600, rdev=(5, 1))
    archive.add("bin/busybox", 0o100755, busybox.read_bytes())
    for applet in BUSYBOX_APPLETS:
        archive.add(f"bin/{applet}", 0o120777, b"busybox")
    for module in kernel.modules:
        archive.add(f"modules/{module.name}", 0o100644, module.read_bytes())
    archive.add("modules/load-order", 0o100644, "".join(f"{m.name}\n" for m in kernel.modules).encode())
    archive.add("init", 0o100755, INIT_SCRIPT.replace("#!/bin/sh", "#!/bin/busybox sh", 1).encode())
    return gzip.compress(archive.finish(), compresslevel=6, mtime=0)


def build_initramfs(cache: Path, kernel: Kernel, busybox: Path) -> Path:
    digest = hashlib.sha256(INIT_SCRIPT.encode() + busybox.read_bytes())
    for module in kernel.modules:
        digest.update(module.read_bytes())
    target = cache / f"initramfs-{digest.hexdigest()[:16]}.cpio.gz"
    if target.is_file():
        return target
    started = time.monotonic()
    for stale in cache.glob("initramfs-*.cpio.gz"):
        stale.unlink()
    partial = target.with_suffix(".tmp")
    partial.write_bytes(initramfs_image(kernel, busybox))
    partial.replace(target)
    progress(f"built {target.name} ({target.stat().st_size // 1024} KiB) in {time.monotonic() - started:.2f}s")
    return target


# ---------------------------------------------------------------- the guest script and qemu


def run_script(name: str, argv: list[str], cwd: str, marker: str) -> str:
    env = {"PATH": GUEST_PATH, "HOME": "/root", "LANG": "C.UTF-8", "USER": "root", "PROCPILOT_VM": "cgroup2"}
    if os.environ.get("PYTHONPATH"):  # a worktree's code, with the shared virtualenv
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    delegated = name == "delegated"
    if delegated:
        env["PROCPILOT_VM_DELEGATED"] = "1"
    return RUN_SCRIPT.format(
        setup=f"mkdir {SERVICE_CGROUP}" if delegated else "",
        name=name,
        marker=marker,
        cwd=shlex.quote(cwd),
        env=" ".join(shlex.quote(f"{key}={value}") for key, value in env.items()),
        launch=shlex.quote(LAUNCH_DELEGATED if delegated else LAUNCH_ROOT),
        argv=shlex.join(argv),
        no_status=EXIT_NO_STATUS,
        grace=FLUSH_GRACE,
    )


def guest_script(argv: list[str], cwd: str, runs: list[str], debug: bool, marker: str) -> str:
    return GUEST_SCRIPT.format(
        marker=marker,
        printk="7" if debug else "1",
        runs="".join(run_script(name, argv, cwd, marker) for name in runs),
    )


def accel_args() -> list[str]:
    # /dev/kvm on our Firecracker hosts is broken (qemu aborts on an MSR, or spins): opt-in only.
    if os.environ.get("PROCPILOT_VM_ACCEL", "tcg") == "kvm":
        return ["-accel", "kvm", "-cpu", "host"]
    return ["-accel", "tcg,thread=multi", "-cpu", "max"]


def qemu_argv(kernel: Kernel, initramfs: Path, shared: Path, cpus: int, memory: int, debug: bool) -> list[str]:
    share = "security_model=none,multidevs=remap"  # remap: / spans several host filesystems (inodes collide)
    return [
        QEMU,
        *("-nodefaults", "-no-user-config", "-no-reboot", "-display", "none", "-serial", "stdio"),
        *("-machine", "q35", *accel_args(), "-smp", str(cpus), "-m", str(memory)),
        *("-kernel", str(kernel.vmlinuz), "-initrd", str(initramfs)),
        *("-append", KERNEL_CMDLINE + ("" if debug else " quiet loglevel=1")),
        *("-virtfs", f"local,path=/,mount_tag=hostroot,readonly=on,{share}"),
        *("-virtfs", f"local,path={shared},mount_tag=vmin,readonly=on,{share}"),
        # Entropy from the host, so nothing in the guest waits for the pool to fill.
        *("-device", "virtio-rng-pci"),
    ]


def die_with_parent() -> None:
    # Runs in the child before exec: qemu gets SIGKILL if this script dies, even by SIGKILL.
    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)


def start_qemu(argv: list[str]) -> subprocess.Popen[bytes]:
    # Its own session: Ctrl-C reaches this script, which then kills qemu, rather than racing it.
    return subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        start_new_session=True,
        preexec_fn=die_with_parent,  # noqa: PLW1509  # this script starts no threads
    )


class Console:
    """Copies the serial console to stdout, the guest script's marker lines turned into a line of
    this script's own at the start and the end of each run; keeps each run's exit status.

    The serial tty turns LF into CRLF; that is undone so the output reads like a local run's.
    """

    def __init__(self, marker: bytes) -> None:
        self.marker = marker
        self.held_cr = False
        self.pending = b""  # output that may be the start of a marker line
        self.at_line_start = True
        self.started = time.monotonic()
        self.ready_at: float | None = None
        self.run_started = self.started
        self.statuses: dict[str, int] = {}
        self.done = False

    def feed(self, chunk: bytes) -> None:
        if self.held_cr:
            chunk = b"\r" + chunk
        self.held_cr = chunk.endswith(b"\r")
        data = self.pending + chunk.removesuffix(b"\r").replace(b"\r\n", b"\n")
        self.pending = b""
        while data and not self.done:
            at = data.find(self.marker)
            if at < 0:
                # The marker may be cut between two reads, so a tail that could begin it waits.
                cut = len(data) - self.partial_marker(data)
                self.write(data[:cut])
                self.pending = data[cut:]
                return
            self.write(data[:at])
            line, newline, data = data[at:].partition(b"\n")
            if not newline:
                self.pending = line
                return
            self.on_marker(line.removeprefix(self.marker).split())

    def partial_marker(self, data: bytes) -> int:
        for length in range(min(len(self.marker) - 1, len(data)), 0, -1):
            if data.endswith(self.marker[:length]):
                return length
        return 0

    def write(self, data: bytes) -> None:
        if data:
            self.at_line_start = data.endswith(b"\n")
        sys.stdout.buffer.write(data)
        sys.stdout.flush()

    def write_line(self, line: str) -> None:
        # On a line of its own even after output that did not end its last line.
        self.write(("" if self.at_line_start else "\n").encode() + f"{line}\n".encode())

    def close(self) -> None:
        self.write(self.pending)
        self.pending = b""

    def on_marker(self, words: list[bytes]) -> None:
        if words[:1] == [b"ready"]:
            self.ready_at = time.monotonic()
            uptime = words[1].decode() if len(words) > 1 else "?"
            progress(f"guest ready {self.ready_at - self.started:.1f}s after qemu started ({uptime}s guest uptime)")
        elif words[:1] == [b"run"] and len(words) == 2:  # run NAME
            name = words[1].decode()
            self.run_started = time.monotonic()
            self.write_line(f"cgroup2-vm run {name}: started {PLACES.get(name, '?')}")
        elif words[:1] == [b"end"] and len(words) == 3 and words[2].isdigit():  # end NAME STATUS
            name, status = words[1].decode(), int(words[2])
            self.statuses[name] = status
            took = time.monotonic() - self.run_started
            self.write_line(f"cgroup2-vm run {name}: exit status {status} after {took:.1f}s")
        elif words[:1] == [b"held"] and len(words) == 2:  # held NAME
            self.write_line(
                f"cgroup2-vm run {words[1].decode()}: something the command left behind held its output open "
                f"{FLUSH_GRACE}s after it exited: stopped copying it"
            )
        elif words[:1] == [b"done"]:
            self.done = True


def stream(qemu: subprocess.Popen[bytes], console: Console, deadline: float) -> None:
    """Copy qemu's output until the guest is done or qemu exits; VmError when time runs out."""
    assert qemu.stdout is not None  # noqa: S101  # stdout=PIPE
    fd = qemu.stdout.fileno()
    while not console.done:
        if time.monotonic() >= deadline:
            raise VmError("timed out", EXIT_TIMEOUT)
        readable, _, _ = select.select([fd], [], [], 1.0)
        if readable:
            chunk = os.read(fd, 65536)
            if not chunk:
                console.close()
                return
            console.feed(chunk)


def stop(qemu: subprocess.Popen[bytes]) -> None:
    if qemu.poll() is None:
        qemu.kill()
    qemu.wait()


def exit_status(console: Console, runs: list[str], qemu: subprocess.Popen[bytes]) -> int:
    """0 if every run's command exited 0, else the first other status."""
    missing = [name for name in runs if name not in console.statuses]
    if missing:
        raise VmError(
            f"cgroup2-vm: the guest stopped before run {missing[0]} reported an exit status (qemu exit "
            f"{qemu.returncode}; console output above; PROCPILOT_VM_DEBUG=1 shows the kernel's messages)",
            EXIT_NO_STATUS,
        )
    return next((console.statuses[name] for name in runs if console.statuses[name] != 0), 0)


def boot_and_run(argv: list[str], runs: list[str], marker: bytes, timeout: float) -> int:
    console = Console(marker)
    qemu = start_qemu(argv)
    try:
        stream(qemu, console, console.started + timeout)
    except VmError:
        raise VmError(f"cgroup2-vm: timed out after {timeout:.0f}s; killed the VM", EXIT_TIMEOUT) from None
    finally:
        stop(qemu)
    status = exit_status(console, runs, qemu)
    if console.ready_at is not None:
        progress(f"{len(runs)} run(s) took {time.monotonic() - console.ready_at:.1f}s; exit status {status}")
    return status


# ---------------------------------------------------------------- entry point


def progress(message: str) -> None:
    print(f"cgroup2-vm: {message}", file=sys.stderr, flush=True)


def run_places(text: str) -> list[str]:
    names = text.split(",")
    unknown = [name for name in names if name not in PLACES]
    if unknown:
        raise argparse.ArgumentTypeError(f"no place {unknown[0]!r} (there are: {', '.join(PLACES)})")
    if len(set(names)) != len(names):
        raise argparse.ArgumentTypeError("each place at most once")
    return names


def parse_args(args: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="cgroup2_vm.py",
        description="Run COMMAND as root in a qemu guest whose only cgroup hierarchy is cgroup2.",
        epilog="Exit status: the command's, or 123 no status reported, 124 timed out, 125 VM not prepared.",
    )
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds from boot to the end (default 900)")
    places = parser.add_mutually_exclusive_group()
    places.add_argument(
        "--runs",
        type=run_places,
        metavar="PLACES",
        help="where to run the command, once each, in this order, in one boot (comma-separated): "
        f"root ({PLACES['root']}), delegated ({PLACES['delegated']}); default root",
    )
    places.add_argument(
        "--delegated", dest="runs", action="store_const", const=["delegated"], help="the same as --runs delegated"
    )
    parser.set_defaults(runs=["root"])
    parser.add_argument("--cpus", type=int, default=2, help="guest CPUs (default 2)")
    parser.add_argument("--memory", type=int, default=3072, help="guest memory in MiB (default 3072)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")
    options = parser.parse_args(args)
    if options.command[:1] == ["--"]:
        options.command = options.command[1:]
    if not options.command:
        parser.error("no command given (put it after --)")
    return options


def prepare() -> tuple[Kernel, Path]:
    if shutil.which(QEMU) is None:
        raise VmError(f"cgroup2-vm: {QEMU} not found; install qemu-system-x86")
    for tool in ("apt-get", "apt-cache", "dpkg-deb"):
        if shutil.which(tool) is None:
            raise VmError(f"cgroup2-vm: {tool} not found; the guest kernel comes from Debian's packages")
    cache = cache_dir()
    with locked(cache):
        kernel = fetch_kernel(cache)
        busybox = fetch_busybox(cache)
        return kernel, build_initramfs(cache, kernel, busybox)


def run(options: argparse.Namespace) -> int:
    kernel, initramfs = prepare()
    debug = os.environ.get("PROCPILOT_VM_DEBUG") == "1"
    with tempfile.TemporaryDirectory(prefix="cgroup2-vm-") as tmp:
        shared = Path(tmp)
        marker = f"cgroup2-vm-{secrets.token_hex(8)}"  # unguessable, so no output of the command can fake it
        script = guest_script(options.command, os.getcwd(), options.runs, debug, marker)
        (shared / "guest.sh").write_text(script)
        argv = qemu_argv(kernel, initramfs, shared, options.cpus, options.memory, debug)
        progress(f"booting {kernel.vmlinuz.parent.name} under qemu ({argv[argv.index('-accel') + 1]})")
        return boot_and_run(argv, options.runs, marker.encode(), options.timeout)


def on_signal(signum: int, _frame: object) -> None:
    raise Terminated(signal.Signals(signum).name)


def main(args: list[str]) -> int:
    options = parse_args(args)
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)
    try:
        return run(options)
    except VmError as error:
        print(error, file=sys.stderr)
        return error.code
    except (KeyboardInterrupt, Terminated):
        print("cgroup2-vm: interrupted; killed the VM", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
