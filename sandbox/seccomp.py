"""A seccomp filter for the candidate's process: system calls that no kernel under test needs, refused by the kernel
whatever the candidate does to the Python-level layers (it can call libc through ctypes; it cannot remove a filter).

Refused with EPERM: creating sockets of any family (the channel to the parent is a descriptor opened before the
candidate existed, and stays usable), tracing or reading other processes (ptrace, process_vm_*, pidfd_getfd),
mounting and leaving or entering namespaces (mount, the new mount API, unshare, setns, pivot_root, chroot, clone
with a namespace flag), starting a new session or process group (setsid, setpgid: the parent ends the candidate by
its process group), the kernel's larger attack surfaces (bpf, perf_event_open, keyrings, io_uring, userfaultfd,
open_by_handle_at) and machine-wide operations (modules, kexec, reboot, swap). clone3 answers ENOSYS, because a
filter cannot read its flags (they sit behind a pointer): glibc then falls back to clone, whose flags it can read.
Threads (clone with CLONE_THREAD), fork and execve stay allowed (Triton on a GPU starts ptxas); every child inherits
the filter.

Signals, where the process's own pid is given (`install(pid, pgid)`, made in the candidate's process after the
zygote's fork): kill only towards that process (pid), its own process group (0, or -pgid), tgkill, tkill,
rt_sigqueueinfo and rt_tgsigqueueinfo only towards that process (its tgid); pidfd_open and pidfd_send_signal are
refused. This is the wall that matters where the candidate shares a PID namespace with the zygote and the parent
(on a GPU, sandbox.namespaces): raise(), abort() and pthread_kill() among its own threads still work (glibc sends
them with tgkill to its own tgid), and waiting on a compiler it started needs no signal. Signals sent from outside
(the parent's SIGKILL of the process group, the CPU-time limit's SIGXCPU) are not system calls of the candidate's.
The pid is compared in its low 32 bits, as the kernel reads a pid_t.

The filter checks the architecture first: a system call made under another ABI (i386's int 0x80 on x86_64) kills
the process, and so does an x32 call (numbers with bit 30 set). Only x86_64 and aarch64 are known; elsewhere
`install` refuses and the wall is reported absent.
"""
from __future__ import annotations

import ctypes
import errno
import platform

# name: (x86_64, aarch64); None where the architecture has no such call. Numbers from the kernel's
# arch/x86/entry/syscalls/syscall_64.tbl and include/uapi/asm-generic/unistd.h (aarch64's table).
SYSCALLS: dict[str, tuple[int | None, int | None]] = {
    "socket": (41, 198),
    "socketpair": (53, 199),
    "ptrace": (101, 117),
    "process_vm_readv": (310, 270),
    "process_vm_writev": (311, 271),
    "pidfd_getfd": (438, 438),
    "mount": (165, 40),
    "umount2": (166, 39),
    "open_tree": (428, 428),
    "move_mount": (429, 429),
    "fsopen": (430, 430),
    "fsconfig": (431, 431),
    "fsmount": (432, 432),
    "fspick": (433, 433),
    "mount_setattr": (442, 442),
    "unshare": (272, 97),
    "setns": (308, 268),
    "pivot_root": (155, 41),
    "chroot": (161, 51),
    "setsid": (112, 157),
    "setpgid": (109, 154),
    "bpf": (321, 280),
    "perf_event_open": (298, 241),
    "keyctl": (250, 219),
    "add_key": (248, 217),
    "request_key": (249, 218),
    "init_module": (175, 105),
    "finit_module": (313, 273),
    "delete_module": (176, 106),
    "kexec_load": (246, 104),
    "kexec_file_load": (320, 294),
    "reboot": (169, 142),
    "swapon": (167, 224),
    "swapoff": (168, 225),
    "open_by_handle_at": (304, 265),
    "name_to_handle_at": (303, 264),
    "userfaultfd": (323, 282),
    "io_uring_setup": (425, 425),
    "io_uring_enter": (426, 426),
    "io_uring_register": (427, 427),
    "acct": (163, 89),
    "pidfd_open": (434, 434),
    "pidfd_send_signal": (424, 424),
    # Allowed only towards the process's own pid (kill: also its own process group), when `install` is given it.
    "kill": (62, 129),
    "tkill": (200, 130),
    "tgkill": (234, 131),
    "rt_sigqueueinfo": (129, 138),
    "rt_tgsigqueueinfo": (297, 240),
    # Not refused outright: clone is checked for namespace flags, clone3 answers ENOSYS.
    "clone": (56, 220),
    "clone3": (435, 435),
}
SIGNALLING = ("kill", "tkill", "tgkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo")
DENIED = tuple(name for name in SYSCALLS if name not in ("clone", "clone3") + SIGNALLING)

# AUDIT_ARCH_* from include/uapi/linux/audit.h; the column of SYSCALLS each one reads.
ARCHES = {"x86_64": (0xC000003E, 0), "aarch64": (0xC00000B7, 1), "arm64": (0xC00000B7, 1)}
X32_SYSCALL_BIT = 0x40000000
CLONE_NAMESPACE_FLAGS = (0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000
                         | 0x40000000)  # NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET

# Classic BPF (include/uapi/linux/filter.h, bpf_common.h) and seccomp's return values (linux/seccomp.h).
_LD_W_ABS, _JEQ_K, _JGE_K, _JSET_K, _RET_K = 0x20, 0x15, 0x35, 0x45, 0x06
RET_ALLOW, RET_KILL_PROCESS, RET_ERRNO = 0x7FFF0000, 0x80000000, 0x00050000
_OFF_NR, _OFF_ARCH, _OFF_ARG0 = 0, 4, 16  # struct seccomp_data: nr, arch, instruction_pointer, args[6]
SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC = 1, 1
PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 38, 22, 2
_SYS_SECCOMP = {"x86_64": 317, "aarch64": 277, "arm64": 277}


def machine() -> str:
    return platform.machine()


def program(arch: str, pid: int | None = None, pgid: int | None = None) -> list[tuple[int, int, int, int]]:
    """The filter for one architecture as (code, jt, jf, k) instructions. Every test is followed by its own
    return, so no jump is longer than a few instructions whatever the table's size. With `pid`, the signalling
    calls are allowed only towards it (and kill towards the process group: 0 and -`pgid`)."""
    audit_arch, column = ARCHES[arch]
    eperm, enosys = RET_ERRNO | errno.EPERM, RET_ERRNO | errno.ENOSYS
    nr = {name: numbers[column] for name, numbers in SYSCALLS.items()}
    prog = [(_LD_W_ABS, 0, 0, _OFF_ARCH),
            (_JEQ_K, 1, 0, audit_arch),
            (_RET_K, 0, 0, RET_KILL_PROCESS),
            (_LD_W_ABS, 0, 0, _OFF_NR)]
    if column == 0:
        prog += [(_JGE_K, 0, 1, X32_SYSCALL_BIT), (_RET_K, 0, 0, RET_KILL_PROCESS)]
    for name in DENIED:
        if nr[name] is not None:
            prog += [(_JEQ_K, 0, 1, nr[name]), (_RET_K, 0, 0, eperm)]
    if pid is not None:
        for name in SIGNALLING:
            targets = [pid & 0xFFFFFFFF]
            if name == "kill":
                targets += [0] + ([-pgid & 0xFFFFFFFF] if pgid else [])
            # nr matches: load the target (args[0]'s low half), allow a match, else EPERM.
            prog.append((_JEQ_K, 0, len(targets) + 3, nr[name]))
            prog.append((_LD_W_ABS, 0, 0, _OFF_ARG0))
            prog += [(_JEQ_K, len(targets) - j, 0, k) for j, k in enumerate(targets)]
            prog += [(_RET_K, 0, 0, eperm), (_RET_K, 0, 0, RET_ALLOW)]
    prog += [(_JEQ_K, 0, 1, nr["clone3"]), (_RET_K, 0, 0, enosys),
             (_JEQ_K, 0, 3, nr["clone"]),
             (_LD_W_ABS, 0, 0, _OFF_ARG0),  # clone's flags (the low half of args[0]) on both architectures
             (_JSET_K, 0, 1, CLONE_NAMESPACE_FLAGS),
             (_RET_K, 0, 0, eperm),
             (_RET_K, 0, 0, RET_ALLOW)]
    return prog


class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_uint16), ("filter", ctypes.POINTER(_SockFilter))]


def install(pid: int | None = None, pgid: int | None = None) -> bool:
    """Install the filter on every thread of this process (signals confined to `pid` and its group `pgid` where
    given). False (and nothing installed) where the architecture is unknown or the kernel refuses. Without
    CAP_SYS_ADMIN the kernel requires no_new_privs first, so it is set then."""
    arch = machine()
    if arch not in ARCHES:
        return False
    insns = program(arch, pid, pgid)
    assert all(jt < 256 and jf < 256 for _, jt, jf, _ in insns) and len(insns) < 4096
    filters = (_SockFilter * len(insns))(*[_SockFilter(*i) for i in insns])
    prog = _SockFprog(len(insns), filters)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return False
    for attempt in range(2):
        # seccomp(2) with TSYNC: threads the CUDA driver or torch started before confinement get the filter too.
        if libc.syscall(_SYS_SECCOMP[arch], SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC,
                        ctypes.byref(prog)) == 0:
            return True
        err = ctypes.get_errno()
        if err == errno.EACCES and attempt == 0:
            libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
            continue
        if err == errno.ENOSYS and libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0) == 0:
            return True  # a kernel before seccomp(2): this thread only
        return False
    return False
