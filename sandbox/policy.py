"""Confinement of the candidate's process, applied by trusted code after fork and before the candidate is imported.

Layers (each stands on its own; none relies on the candidate behaving):
  - resource limits: CPU seconds, open files, file size, no core dumps. Not address space: CUDA reserves virtual
    memory of about twice device memory and fails to start under RLIMIT_AS.
  - no network: a fresh network namespace where the kernel allows it (root), and in any case the audit hook below
    refuses every socket.
  - a read-only view of the file system except the scratch directory (a private mount namespace, where allowed).
  - an audit hook (PEP 578; Python code cannot remove one): writes only under the scratch directory; no sockets, no
    new processes, no signals, no loading of native libraries, no gc walks (reading other objects' memory), no
    further audit hooks. While trusted code runs (Triton compiling a kernel, the baselines) only the network stays
    closed: they start compilers and load libraries.
The process group is killed by the parent on timeout, so nothing the candidate starts outlives the check.
"""
from __future__ import annotations

import ctypes
import os
import resource
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

CLONE_NEWNET = 0x40000000
CLONE_NEWNS = 0x00020000
MS_RDONLY, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 32, 4096, 16384, 1 << 18
PR_SET_NO_NEW_PRIVS, PR_CAPBSET_DROP, _LINUX_CAPABILITY_VERSION_3 = 38, 24, 0x20080522
# The CUDA stack's own libraries, which torch and the profiler load lazily (NVML for device queries, the driver for
# the persisting-L2 reset): loading them gives a candidate nothing torch does not already have.
CUDA_LIBRARY_PREFIXES = ("libcuda.", "libnvidia-ml.", "libcudart.", "libnvrtc", "libcublas", "libcudnn",
                         "libnvJitLink", "libcusparse", "libcufft", "libcurand", "libcusolver", "libnvToolsExt")


class SandboxViolation(PermissionError):
    """Raised inside the candidate's process when it does something the sandbox refuses."""


@dataclass
class Policy:
    scratch: Path
    write_roots: list[Path] = field(default_factory=list)
    cpu_seconds: int = 600
    max_open_files: int = 4096
    max_file_bytes: int = 1 << 30
    violations: list[str] = field(default_factory=list)
    network_isolated: bool = False
    filesystem_read_only: bool = False
    capabilities_dropped: bool = False
    # True while trusted code (Triton compiling, the harness itself) is running, so tools may be invoked.
    trusted_depth: int = 0


_POLICY: Policy | None = None


def apply(policy: Policy) -> Policy:
    global _POLICY
    _set_limits(policy)
    policy.network_isolated = _isolate_network()
    policy.filesystem_read_only = _read_only_filesystem(policy.write_roots)
    # Last: without capabilities even a root process cannot undo the namespaces (remount, setns) or raise limits,
    # whatever the candidate later does to the Python-level checks below.
    policy.capabilities_dropped = _drop_capabilities()
    os.chdir(policy.scratch)
    os.environ["TMPDIR"] = str(policy.scratch)
    tempfile.tempdir = str(policy.scratch)  # the zygote may already have cached /tmp
    os.environ["HOME"] = str(policy.scratch)
    _POLICY = policy
    sys.addaudithook(_audit)
    return policy


class trusted:
    """Context manager marking trusted code on the stack (Triton's launcher, the worker's own I/O)."""

    def __enter__(self) -> None:
        if _POLICY is not None:
            _POLICY.trusted_depth += 1

    def __exit__(self, *exc: object) -> None:
        if _POLICY is not None:
            _POLICY.trusted_depth -= 1


def _set_limits(p: Policy) -> None:
    resource.setrlimit(resource.RLIMIT_CPU, (p.cpu_seconds, p.cpu_seconds + 5))
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(p.max_open_files, hard), min(p.max_open_files, hard)))
    resource.setrlimit(resource.RLIMIT_FSIZE, (p.max_file_bytes, p.max_file_bytes))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _isolate_network() -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.unshare(CLONE_NEWNET) == 0
    except (OSError, AttributeError):
        return False


def _read_only_filesystem(write_roots: list[Path]) -> bool:
    """A private mount namespace where every mount is read-only except the write roots (bind-mounted on
    themselves first). This also stops writes made from C (torch.save, numpy.tofile) that no audit event sees."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.unshare(CLONE_NEWNS) != 0:
            return False
        if libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None) != 0:
            return False
        roots = [os.path.realpath(r) for r in write_roots]
        for root in roots:
            if libc.mount(root.encode(), root.encode(), None, MS_BIND | MS_REC, None) != 0:
                return False
        with open("/proc/self/mountinfo") as f:
            targets = [line.split()[4] for line in f]
        ok = True
        for target in targets:
            if target in roots or target.startswith(("/proc", "/sys", "/dev")):
                continue
            target_b = target.encode().decode("unicode_escape").encode()
            if libc.mount(None, target_b, None, MS_REMOUNT | MS_BIND | MS_RDONLY, None) != 0:
                ok = ok and target != "/"
        return ok
    except (OSError, AttributeError):
        return False


def _drop_capabilities() -> bool:
    """No new privileges, an empty bounding set, and empty effective/permitted/inheritable capability sets."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
        for cap in range(64):
            libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)  # past the last capability this fails harmlessly

        class Header(ctypes.Structure):
            _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

        class Data(ctypes.Structure):
            _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                        ("inheritable", ctypes.c_uint32)]

        return libc.capset(ctypes.byref(Header(_LINUX_CAPABILITY_VERSION_3, 0)), (Data * 2)()) == 0
    except (OSError, AttributeError):
        return False


def _deny(what: str) -> None:
    assert _POLICY is not None
    _POLICY.violations.append(what)
    raise SandboxViolation(f"sandbox: {what} is not allowed")


def _writable(path: object) -> bool:
    assert _POLICY is not None
    if isinstance(path, int):
        return True  # an already-open descriptor: opening it was checked
    if isinstance(path, bytes):
        path = os.fsdecode(path)
    if not isinstance(path, str):
        return False
    if path in ("/dev/null",):
        return True
    real = os.path.realpath(os.path.join(os.getcwd(), path))
    return any(real == str(root) or real.startswith(str(root) + os.sep) for root in _POLICY.write_roots)


_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_PATH_EVENTS = {"os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.chmod", "os.chown", "os.truncate",
                "os.link", "os.symlink", "os.utime", "shutil.rmtree", "shutil.move", "os.replace"}


def _audit(event: str, args: tuple) -> None:
    p = _POLICY
    if p is None:
        return
    if event.startswith("socket."):
        _deny(f"network access ({event})")
    if p.trusted_depth > 0:
        return  # Triton compiling, the baselines (torch.compile), the harness's own I/O: only the network is closed
    if event == "open":
        path, mode, flags = (tuple(args) + (None, None, None))[:3]
        writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or \
                  (isinstance(flags, int) and flags & _WRITE_FLAGS)
        if writing and not _writable(path):
            _deny(f"writing {path!r} outside the scratch directory")
    elif event in _PATH_EVENTS:
        for a in args[:2]:
            if isinstance(a, (str, bytes)) and not _writable(a):
                _deny(f"{event} on {a!r} outside the scratch directory")
    elif event in ("subprocess.Popen", "os.posix_spawn", "os.exec", "os.spawn", "os.system", "os.fork",
                   "os.forkpty", "pty.spawn"):
        _deny(f"starting a process ({event})")
    elif event in ("os.kill", "os.killpg", "signal.pthread_kill", "os.setuid", "os.setgid"):
        _deny(event)
    elif event == "ctypes.dlopen" and not (args and os.path.basename(str(args[0])).startswith(CUDA_LIBRARY_PREFIXES)):
        _deny(f"loading a native library ({args[0] if args else ''})")
    elif event in ("gc.get_objects", "gc.get_referrers", "gc.get_referents", "sys.addaudithook",
                   "sys._current_frames", "sys.settrace", "sys.setprofile"):
        _deny(event)
