"""An exec wrapper that restricts itself, then becomes the command: the fallbacks behind bubblewrap.

    python -I sandbox_exec.py [--landlock] [--writable PATH]... [--no-network] -- command...

* ``--landlock``: a read-only root by Landlock. Only the write-type rights are handled (write and
  truncate a file; create, remove, rename and link beneath a directory), granted beneath each
  ``--writable`` path and a few device files (``/dev/null``, ttys, ``/dev/pts``, ``/dev/shm``).
  Reads and execution are left alone. Not all of ``/dev``: a root child could write a raw disk.
  Device nodes can be made nowhere (``mknod`` in the workspace would be the same hole). Landlock
  cannot mount a private tmpfs, so a writable ``/tmp`` is the host's, shared. With ABI 1 (no
  ``REFER``) a rename or link across directories is refused even inside the workspace.
* ``--no-network``: a seccomp filter, allowing everything but ``socket()`` outside ``AF_UNIX`` and
  ``AF_NETLINK`` (and io_uring, which opens sockets behind the filter's back). The filter sees
  families, not addresses: no IP at all, *not even loopback*, unlike a network namespace. Netlink
  stays because getaddrinfo(AI_ADDRCONFIG), getifaddrs (Node's os.networkInterfaces, ``ip``) use it
  and it only talks to the local kernel; with capabilities gone it can read, not change. Pathname
  unix sockets of host daemons stay reachable (as from a network namespace). Syscalls of another
  ABI (i386 ``int 0x80``, x32) kill the process rather than slip past the filter.

Either way, capabilities are dropped (bounding, inheritable and ambient sets, so a root child execs
with none) and no_new_privs is set: a root child could otherwise load a kernel module from the
workspace, and a setuid binary cannot lift any of it. Run with ``-I`` and by path, not ``-m``:
``-I`` keeps the child's environment (PYTHONPATH...) and working directory out of our imports, and
by path skips importing the procpilot package (~200 ms). Only the stdlib and the two libraries here.
"""

from __future__ import annotations

import ctypes
import errno
import os
import sys

# Exit codes of the wrapper itself, before the command runs (126/127: as a shell's exec failures).
USAGE = 120
LANDLOCK_UNAVAILABLE = 121
SECCOMP_UNAVAILABLE = 122
CAPABILITIES_FAILED = 123
PREFIX = "procpilot-sandbox: "

# Files, not directories: only write and truncate can be granted on them.
_DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/tty", "/dev/ptmx")
_DEVICE_DIRS = ("/dev/pts", "/dev/shm")  # noqa: S108 - shared memory, writable as without us
# AF_UNIX, AF_NETLINK: fixed by the Linux ABI, and importing socket would cost every spawn ~10 ms.
_ALLOWED_FAMILIES = (1, 16)

_PR_CAPBSET_DROP = 24
_PR_CAP_AMBIENT = 47
_PR_CAP_AMBIENT_CLEAR_ALL = 4
_LINUX_CAPABILITY_VERSION_3 = 0x20080522


def _fail(code: int, message: str) -> None:
    sys.stderr.write(f"{PREFIX}{message}\n")
    sys.stderr.flush()
    os._exit(code)


def apply_landlock(writable: list[str]) -> None:
    """Make everything but ``writable`` (and the usual devices) read-only for this process and its children."""
    try:
        import landlock
        from landlock import FSAccess

        abi = landlock.landlock_abi_version()
    except (ImportError, OSError) as exc:
        _fail(LANDLOCK_UNAVAILABLE, f"Landlock is not available: {exc}")
        return
    if abi < 1:
        _fail(LANDLOCK_UNAVAILABLE, f"Landlock is not available (ABI {abi})")
    file_rights = FSAccess.WRITE_FILE
    if abi >= 3:
        file_rights |= FSAccess.TRUNCATE
    dir_rights = (
        file_rights
        | FSAccess.REMOVE_DIR
        | FSAccess.REMOVE_FILE
        | FSAccess.MAKE_DIR
        | FSAccess.MAKE_REG
        | FSAccess.MAKE_SOCK
        | FSAccess.MAKE_FIFO
        | FSAccess.MAKE_SYM
    )
    if abi >= 2:
        # Implicitly handled by every ruleset from ABI 2: without a grant, no rename across directories.
        dir_rights |= FSAccess.REFER
    # Handled and granted nowhere: device nodes made in the workspace would open the raw disk.
    handled = dir_rights | FSAccess.MAKE_CHAR | FSAccess.MAKE_BLOCK
    ruleset = landlock.Ruleset(restrict_rules=handled)
    for path in [*writable, *_DEVICES, *_DEVICE_DIRS]:
        try:
            is_dir = os.path.isdir(path)
            if not is_dir and not os.path.exists(path):
                continue  # nothing there to write to, and its parent is not writable
            ruleset.allow(path, rules=dir_rights if is_dir else file_rights)
        except OSError as exc:
            _fail(LANDLOCK_UNAVAILABLE, f"Landlock refused a rule for {path}: {exc}")
    try:
        ruleset.apply()  # sets no_new_privs first
    except OSError as exc:
        _fail(LANDLOCK_UNAVAILABLE, f"Landlock could not be applied: {exc}")


def apply_seccomp() -> None:
    """No socket outside AF_UNIX and AF_NETLINK, no io_uring, for this process and its children."""
    try:
        import pyseccomp as seccomp
    except (ImportError, OSError, RuntimeError) as exc:  # RuntimeError: no libseccomp.so
        _fail(SECCOMP_UNAVAILABLE, f"seccomp (libseccomp) is not available: {exc}")
        return
    try:
        flt = seccomp.SyscallFilter(seccomp.ALLOW)
        refuse = seccomp.ERRNO(errno.EAFNOSUPPORT)
        # Everything but the allowed families, on all 64 bits: a value with junk in the upper half
        # is refused even where the kernel would read its lower half as an allowed family.
        low, high = min(_ALLOWED_FAMILIES), max(_ALLOWED_FAMILIES)
        flt.add_rule(refuse, "socket", seccomp.Arg(0, seccomp.LT, low))
        flt.add_rule(refuse, "socket", seccomp.Arg(0, seccomp.GT, high))
        for family in range(low + 1, high):
            if family not in _ALLOWED_FAMILIES:
                flt.add_rule(refuse, "socket", seccomp.Arg(0, seccomp.EQ, family))
        # ENOSYS: what a kernel without io_uring says, so runtimes fall back to plain syscalls.
        for name in ("io_uring_setup", "io_uring_enter", "io_uring_register"):
            flt.add_rule(seccomp.ERRNO(errno.ENOSYS), name)
        flt.load()  # sets no_new_privs (the filter's default)
    except (OSError, ValueError) as exc:
        _fail(SECCOMP_UNAVAILABLE, f"the seccomp filter could not be loaded: {exc}")


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    ]


def drop_capabilities() -> None:
    """After exec, a root process gets bounding | inheritable | ambient: empty all three."""
    libc = ctypes.CDLL(None, use_errno=True)
    # Declared: the kernel reads whole unsigned longs, and an int passed bare may leave junk above.
    libc.prctl.argtypes = (ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong)
    header = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    if libc.capget(ctypes.byref(header), data) != 0:
        _fail(CAPABILITIES_FAILED, f"capget: {os.strerror(ctypes.get_errno())}")
    if not any(d.effective or d.permitted or d.inheritable for d in data):
        return  # an ordinary user: nothing to drop, and no_new_privs keeps file capabilities out
    with open("/proc/sys/kernel/cap_last_cap") as f:
        last = int(f.read())
    for cap in range(last + 1):
        if libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            _fail(CAPABILITIES_FAILED, f"cannot drop capability {cap}: {os.strerror(ctypes.get_errno())}")
    libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)  # EINVAL before 4.3: none to clear
    for d in data:
        d.inheritable = 0
    if libc.capset(ctypes.byref(header), data) != 0:
        _fail(CAPABILITIES_FAILED, f"capset: {os.strerror(ctypes.get_errno())}")
    # landlock's error checks read ctypes' saved errno, not the return value: leave none behind.
    ctypes.set_errno(0)


def main(argv: list[str]) -> None:
    """Parse ``argv`` (without the program name), restrict this process, exec the command."""
    landlock_on = network_off = False
    writable: list[str] = []
    args = iter(argv)
    for arg in args:
        if arg == "--":
            break
        if arg == "--landlock":
            landlock_on = True
        elif arg == "--no-network":
            network_off = True
        elif arg == "--writable":
            path = next(args, None)
            if path is None:
                _fail(USAGE, "--writable needs a path")
                return
            writable.append(path)
        else:
            _fail(USAGE, f"unknown option {arg!r}")
    command = list(args)
    if not command:
        _fail(USAGE, "no command after --")
    # Capabilities first: the restrictions below need none, and a later drop would need some.
    drop_capabilities()
    if landlock_on:
        apply_landlock(writable)
    if network_off:
        apply_seccomp()
    try:
        os.execvp(command[0], command)  # noqa: S606 - becoming the command is the point
    except OSError as exc:
        sys.stderr.write(f"{PREFIX}{command[0]}: {exc.strerror}\n")
        sys.stderr.flush()
        os._exit(127 if isinstance(exc, FileNotFoundError) else 126)


if __name__ == "__main__":
    main(sys.argv[1:])
