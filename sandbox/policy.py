"""Confinement of the candidate's process, applied by trusted code after fork and before the candidate is imported.

Walls the operating system enforces (they hold after the candidate has switched off every Python-level layer and
calls libc through ctypes), in the order they are raised:
  - resource limits: CPU seconds, open files, file size, no core dumps. Not address space: CUDA reserves virtual
    memory of about twice device memory and fails to start under RLIMIT_AS; memory is bounded by a control group
    instead (sandbox.memory, joined by the zygote's fork before this process existed).
  - namespaces: network (no route anywhere; abstract Unix sockets are per network namespace), mount, IPC (System V
    and POSIX message queues of its own), PID (sandbox.namespaces: the candidate sees only its own processes, and
    everything it starts dies with it). The zygote's fork enters them; `apply` enters those still missing.
  - mounts: every mount read-only except the scratch directory, /proc, /sys and /dev included (device nodes stay
    usable on a read-only mount: /dev/null, and /dev/nvidia* for CUDA); a fresh /proc of the PID namespace; a
    private, size-limited tmpfs on /dev/shm, gone with the namespace (on a GPU too: the parent lends the child its
    tensors by raw CUDA IPC handles, sandbox.cudaipc, which need nothing in /dev/shm). The scratch directory itself
    becomes a size-limited tmpfs of the candidate's own (`scratch_bound_bytes`, CRUCIBLE_SCRATCH_GIB, default 2 GiB): the
    host's disk never fills, the pages count against the memory bound too, and a write past the bound fails with
    ENOSPC, which the verdict names. Nothing the candidate writes there reaches the host; the parent reads only the
    Triton cache, through the child's own view of it and as untrusted data (sandbox.compiled, sandbox.deadlines).
  - seccomp (sandbox.seccomp): no socket of any family, no ptrace, no mount or namespace calls, no new session, no
    signal to any process but itself and its own process group.
  - capabilities: an empty bounding set and no effective/permitted capabilities, so even a root child cannot undo
    the above (remount, setns, raise limits); then no_new_privs.
Python-level layer (a speed bump, not a wall: candidate code in this process can reach it): an audit hook (PEP 578)
allowing writes only under the scratch directory, and refusing sockets, new processes, signals, native libraries, gc
walks, frames (sys._getframe, tracebacks' and generators' frames) and further audit hooks. While trusted code runs (Triton compiling a kernel, the baselines) only the network
stays closed: they start compilers and load libraries.
`Policy.walls()` reports which walls stood; the setup reply carries it to the verdict.
"""
from __future__ import annotations

import ctypes
import math
import os
import resource
import sys
import sysconfig
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from . import seccomp

CLONE_NEWNET, CLONE_NEWNS, CLONE_NEWIPC = 0x40000000, 0x00020000, 0x08000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
SHM_BYTES = 64 << 20  # the private /dev/shm: nothing under test needs more, and it counts against the memory bound
SCRATCH_GIB = 2.0  # the scratch tmpfs by default: Triton's and Inductor's caches for one candidate take megabytes
# What the zygote's fork raised before this process ran the worker (sandbox.namespaces.enter).
ZYGOTE_WALLS: dict[str, object] = {}
PR_SET_NO_NEW_PRIVS, PR_CAPBSET_DROP, _LINUX_CAPABILITY_VERSION_3 = 38, 24, 0x20080522
# The CUDA stack's own libraries, which torch and the profiler load lazily (NVML for device queries, the driver for
# the persisting-L2 reset): loading them gives a candidate nothing torch does not already have.
CUDA_LIBRARY_PREFIXES = ("libcuda.", "libnvidia-ml.", "libcudart.", "libnvrtc", "libcublas", "libcudnn",
                         "libnvJitLink", "libcusparse", "libcufft", "libcurand", "libcusolver", "libnvToolsExt")


WALLS = ("network_isolated", "filesystem_read_only", "capabilities_dropped", "ipc_namespace", "pid_namespace",
         "proc_private", "shm_private", "proc_sys_read_only", "seccomp", "memory_bound_bytes", "scratch_bound_bytes")


class SandboxViolation(PermissionError):
    """Raised inside the candidate's process when it does something the sandbox refuses."""


def scratch_setting() -> int:
    """CRUCIBLE_SCRATCH_GIB in bytes (0 turns the bound off), else the default; the zygote inherits the setting
    from the process that starts the harness."""
    setting = os.environ.get("CRUCIBLE_SCRATCH_GIB", "").strip()
    try:
        gib = float(setting) if setting else SCRATCH_GIB
    except ValueError:
        gib = SCRATCH_GIB  # a bad setting must not leave the disk unbounded
    return max(0, int(gib * (1 << 30))) if math.isfinite(gib) else int(SCRATCH_GIB * (1 << 30))


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
    ipc_namespace: bool = False
    pid_namespace: bool = False
    proc_private: bool = False  # /proc shows only the PID namespace
    shm_private: bool = False  # /dev/shm is a private tmpfs
    proc_sys_read_only: bool = False  # /proc (with /proc/sys) and /sys read-only
    seccomp: bool = False
    memory_bound_bytes: int = 0  # 0: no bound on this machine
    scratch_bytes: int = field(default_factory=scratch_setting)  # the bound asked for (0: none)
    scratch_bound_bytes: int = 0  # the bound that stands (0: the scratch directory is the host's, unbounded)
    # True while trusted code (Triton compiling, the harness itself) is running, so tools may be invoked.
    trusted_depth: int = 0
    library_dirs: tuple[str, ...] = ()  # where code that may read frames lives (set by `apply`)

    def walls(self) -> dict[str, object]:
        """Which OS-enforced walls stood when confinement finished (the memory bound in bytes, 0 where none)."""
        return {name: getattr(self, name) for name in WALLS}


_POLICY: Policy | None = None


def apply(policy: Policy) -> Policy:
    global _POLICY
    _set_limits(policy)
    libc = ctypes.CDLL(None, use_errno=True)
    entered = ZYGOTE_WALLS
    policy.network_isolated = bool(entered.get("network_namespace")) or libc.unshare(CLONE_NEWNET) == 0
    policy.ipc_namespace = bool(entered.get("ipc_namespace")) or libc.unshare(CLONE_NEWIPC) == 0
    policy.pid_namespace = bool(entered.get("pid_namespace"))
    policy.proc_private = bool(entered.get("proc_private"))
    policy.memory_bound_bytes = int(entered.get("memory_bound_bytes") or 0)
    private_ns = bool(entered.get("mount_namespace")) or (
        libc.unshare(CLONE_NEWNS) == 0 and libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None) == 0)
    if private_ns:
        policy.shm_private = _private_shm(libc)
        if _bounded_scratch(libc, str(policy.scratch), policy.scratch_bytes):
            policy.scratch_bound_bytes = policy.scratch_bytes
        policy.filesystem_read_only = _read_only_mounts(libc, policy.write_roots, policy.shm_private)
        policy.proc_sys_read_only = all(_read_only(p) for p in ("/proc/sys", "/sys") if os.path.exists(p))
    # After the mounts (the filter refuses mount) and before the capabilities go (installing it needs CAP_SYS_ADMIN,
    # or no_new_privs where the process never had it).
    policy.seccomp = seccomp.install(os.getpid(), os.getpgid(0))  # signals only to itself and its own group
    # Last: without capabilities even a root process cannot undo the namespaces (remount, setns) or raise limits,
    # whatever the candidate later does to the Python-level checks below.
    policy.capabilities_dropped = _drop_capabilities()
    policy.library_dirs = library_dirs(policy.write_roots)
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


def _private_shm(libc: ctypes.CDLL) -> bool:
    """An empty tmpfs of its own on /dev/shm: what the candidate writes there is seen by nobody and gone with it."""
    if not os.path.isdir("/dev/shm"):
        return False
    options = f"size={SHM_BYTES},mode=1777".encode()
    return libc.mount(b"tmpfs", b"/dev/shm", b"tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, options) == 0


def scratch_full(p: Policy) -> str:
    """The verdict's words for a write that found the scratch directory full."""
    n = p.scratch_bound_bytes
    size = f"{n / (1 << 30):.1f} GiB" if n >= 1 << 30 else f"{n / (1 << 20):.0f} MiB"
    return (f"filling the scratch directory past its bound of {size} (CRUCIBLE_SCRATCH_GIB sets it)" if n else
            "filling the disk under the scratch directory")


def _bounded_scratch(libc: ctypes.CDLL, scratch: str, size: int) -> bool:
    """A tmpfs of `size` bytes over the scratch directory, in this process's mount namespace only; the directories
    the parent made there (Triton's cache) are made again inside it. Not noexec: Triton loads the launchers it
    compiles from its cache there."""
    if size <= 0 or not os.path.isdir(scratch):
        return False
    made = sorted(e.name for e in os.scandir(scratch) if e.is_dir(follow_symlinks=False))
    options = f"size={size},mode=0700".encode()
    if libc.mount(b"tmpfs", scratch.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, options) != 0:
        return False
    for name in made:
        os.mkdir(os.path.join(scratch, name))
    return True


def _read_only_mounts(libc: ctypes.CDLL, write_roots: list[Path], shm_writable: bool) -> bool:
    """Every mount read-only except the write roots (bind-mounted on themselves first) and /dev/shm where it is
    private.
    This also stops writes made from C (torch.save, numpy.tofile) that no audit event sees. /proc, /sys and /dev
    too: the NVIDIA driver only reads /proc/driver/nvidia and /sys, and a device node opens for writing on a
    read-only mount (/dev/null, /dev/nvidia*), so CUDA works."""
    try:
        roots = [os.path.realpath(r) for r in write_roots]
        for root in roots:
            if libc.mount(root.encode(), root.encode(), None, MS_BIND | MS_REC, None) != 0:
                return False
        with open("/proc/self/mountinfo") as f:
            targets = [line.split()[4] for line in f]
    except OSError:
        return False
    keep = set(roots) | ({"/dev/shm"} if shm_writable else set())
    ok = True
    for target in dict.fromkeys(targets):
        if target in keep or any(target.startswith(root + os.sep) for root in roots):
            continue
        target_b = target.encode().decode("unicode_escape").encode()
        if libc.mount(None, target_b, None, MS_REMOUNT | MS_BIND | MS_RDONLY, None) != 0:
            ok = ok and target != "/"  # e.g. a mount hidden under another one, which nothing can reach
    return ok and _read_only("/")


def _read_only(path: str) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def _drop_capabilities() -> bool:
    """An empty bounding set and empty effective/permitted/inheritable capability sets, then no_new_privs."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        for cap in range(64):
            libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)  # past the last capability this fails harmlessly

        class Header(ctypes.Structure):
            _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

        class Data(ctypes.Structure):
            _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                        ("inheritable", ctypes.c_uint32)]

        dropped = libc.capset(ctypes.byref(Header(_LINUX_CAPABILITY_VERSION_3, 0)), (Data * 2)()) == 0
        return libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0 and dropped
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


# Frames give the candidate the harness's own locals (the worker's state, the trace's closures) and the stack that
# called it: every audited way to one (PEP 578's table, CPython 3.10-3.12), refused while candidate code runs unless
# library code asks (below). Trusted code that formats a traceback runs inside `trusted`.
_FRAME_EVENTS = {"sys._getframe", "sys._getframemodulename", "sys._current_frames", "sys._current_exceptions"}
_FRAME_ATTRS = {"tb_frame", "f_code", "gi_frame", "gi_code", "cr_frame", "cr_code", "ag_frame", "ag_code"}
# Libraries ask for frames as they define things (typing.TypeVar and enum read the caller's module name), so a lazy
# import inside the candidate's call must go on: code from the interpreter's own library directories, and from the
# import path's other directories (PYTHONPATH, `pip install --target`), may; the candidate's file, or code it
# compiled, may not: nothing under a directory the candidate can write counts (`library_dirs`).
_LIBRARY_DIRS = tuple(dict.fromkeys(os.path.realpath(sysconfig.get_paths()[k]) + os.sep
                                    for k in ("stdlib", "platstdlib", "purelib", "platlib")))


def library_dirs(write_roots: list[Path] | list[str], path: list[str] | None = None) -> tuple[str, ...]:
    """The interpreter's library directories and the import path's existing absolute directories (`path`, default
    sys.path), less any inside or above a writable root or /dev/shm: where code that may read frames lives."""
    roots = [os.path.realpath(r) for r in (*write_roots, "/dev/shm")]  # /dev/shm: the child's own, writable tmpfs

    def overlaps(d: str) -> bool:
        return any(d == r or d.startswith(r + os.sep) or r.startswith(d + os.sep) for r in roots)
    found = [os.path.realpath(e) for e in (sys.path if path is None else path)
             if e and os.path.isabs(e) and os.path.isdir(e)]
    dirs = [d.rstrip(os.sep) for d in _LIBRARY_DIRS] + found
    return tuple(dict.fromkeys(d + os.sep for d in dirs if d != os.sep and not overlaps(d)))


def _asked_by_library(p: Policy) -> bool:
    """Whether the code that raised this audit event (two frames up: past this function and the hook) lives in the
    interpreter's library directories. Runs as trusted, so its own frame reads raise no event."""
    p.trusted_depth += 1
    try:
        name = sys._getframe(2).f_code.co_filename
    finally:
        p.trusted_depth -= 1
    return name.startswith(p.library_dirs or _LIBRARY_DIRS)


_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_PATH_EVENTS = {"os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.chmod", "os.chown", "os.truncate",
                "os.link", "os.symlink", "os.utime", "shutil.rmtree", "shutil.move", "os.replace"}


def _event_paths(event: str, args: tuple) -> tuple:
    """The paths a path event touches: a symbolic link's relative target counts from the link's own directory, not
    the working directory (a link made deep in scratch with a target of enough `..` points outside it)."""
    paths = tuple(args[:2])
    if event == "os.symlink" and len(paths) == 2 and all(isinstance(a, (str, bytes)) for a in paths):
        src, dst = (os.fsdecode(a) for a in paths)
        paths = (os.path.join(os.path.dirname(os.path.join(os.getcwd(), dst)), src), dst)
    return paths


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
        for a in _event_paths(event, args):
            if isinstance(a, (str, bytes)) and not _writable(a):
                _deny(f"{event} on {a!r} outside the scratch directory")
    elif event in ("subprocess.Popen", "os.posix_spawn", "os.exec", "os.spawn", "os.system", "os.fork",
                   "os.forkpty", "pty.spawn"):
        _deny(f"starting a process ({event})")
    elif event in ("os.kill", "os.killpg", "signal.pthread_kill", "os.setuid", "os.setgid"):
        _deny(event)
    elif event == "ctypes.dlopen" and not (args and os.path.basename(str(args[0])).startswith(CUDA_LIBRARY_PREFIXES)):
        _deny(f"loading a native library ({args[0] if args else ''})")
    elif event in ("gc.get_objects", "gc.get_referrers", "gc.get_referents", "sys.addaudithook", "sys.settrace",
                   "sys.setprofile"):
        _deny(event)
    elif event in _FRAME_EVENTS and not _asked_by_library(p):
        _deny(event)
    elif event == "object.__getattr__" and len(args) > 1 and args[1] in _FRAME_ATTRS and not _asked_by_library(p):
        _deny(f"reading a frame or code object (.{args[1]})")
