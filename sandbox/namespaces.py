"""The candidate's process tree, built by the zygote's fork before any candidate code exists.

    zygote ── C1 (the pid the parent knows; its own session and process group)
               └─ C2: PID 1 of a fresh PID namespace (a trusted init that only reaps)
                    └─ C3: the worker, which imports and runs the candidate

C1 joins the candidate's control group (sandbox.memory), then enters new mount, IPC, network and PID namespaces
(a PID namespace takes effect for children, hence the forks). C2 mounts a fresh /proc that shows only the namespace
(writable until sandbox.policy remounts every mount read-only: the CUDA driver fails to start on a proc mounted
read-only as a whole, and works on a read-only mount of it), then starts C3 and reaps. When C3 ends, C2 hands C1 C3's wait status through a pipe and exits; an init's exit kills
every process left in its namespace (setsid, double fork and daemons included), and C1 then ends with C3's status
(the same exit code, or the same signal), so the parent's view of the candidate's end is unchanged. The parent's
SIGKILL to C1's process group reaches C2 as well (C2 also dies with C1: PR_SET_PDEATHSIG), so killing the pid the
zygote reported still ends everything the candidate started. C3 is not PID 1 on purpose: an init ignores signals it
has no handler for (SIGXCPU at the CPU-time limit among them).

From inside, the candidate sees PIDs 1 (C2) and 2 (itself) and its own descendants: not the zygote, not the parent,
nothing else on the host to signal or trace. Where the kernel refuses a namespace (an unprivileged user), or where
the PID namespace is not wanted (`pid_namespace_wanted`: CRUCIBLE_PID_NAMESPACE=0), C1 runs the worker itself and the
walls it could not raise are reported absent (sandbox.policy).
"""
from __future__ import annotations

import ctypes
import os
import resource
import select
import signal
import struct
from collections.abc import Mapping
from typing import Any

CLONE_NEWNS, CLONE_NEWIPC, CLONE_NEWNET, CLONE_NEWPID = 0x00020000, 0x08000000, 0x40000000, 0x20000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REC, MS_PRIVATE = 1, 2, 4, 8, 16384, 1 << 18
MNT_DETACH = 2
PR_SET_PDEATHSIG = 1


def pid_namespace_wanted(env: Mapping[str, str]) -> bool:
    """A PID namespace unless CRUCIBLE_PID_NAMESPACE=0, on the CPU and the GPU alike (the parent's raw CUDA IPC
    handles, sandbox.cudaipc, open across PID namespaces). Without one the wall is reported absent, and what the
    candidate starts still dies with it: no new session (seccomp), so the parent's kill of the process group reaches
    it, and the zygote kills whatever is left in the control group."""
    return env.get("CRUCIBLE_PID_NAMESPACE", "").strip() != "0"


def enter(group: Any, inherited_fds: list[int], pid_namespace: bool = True) -> dict[str, Any]:
    """Run in C1 right after the zygote's fork. Returns only in the process that is to run the worker, with the walls
    that stand; C1 and C2 never return (they wait, then exit). `inherited_fds` (the worker's socket, output pipe and
    shared buffer) are closed in C1 and C2, so the parent sees the channel close as soon as the worker dies."""
    walls: dict[str, Any] = {"memory_bound_bytes": 0}
    if group is not None:
        try:
            group.join()
            walls["memory_bound_bytes"] = group.bound_bytes
        except OSError:
            pass
    libc = ctypes.CDLL(None, use_errno=True)
    walls["mount_namespace"] = libc.unshare(CLONE_NEWNS) == 0 and \
        libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None) == 0  # nothing mounted here reaches the host
    walls["ipc_namespace"] = libc.unshare(CLONE_NEWIPC) == 0
    walls["network_namespace"] = libc.unshare(CLONE_NEWNET) == 0
    walls["pid_namespace"] = pid_namespace and libc.unshare(CLONE_NEWPID) == 0
    walls["proc_private"] = False
    if not walls["pid_namespace"]:
        return walls
    status_r, status_w = os.pipe()
    init = os.fork()
    if init:
        _close(inherited_fds + [status_w])
        _mirror(init, status_r)
    # C2: PID 1 of the new namespace.
    os.close(status_r)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    walls["proc_private"] = walls["mount_namespace"] and _fresh_proc(libc)
    worker = os.fork()
    if worker:
        _close(inherited_fds)
        _init(worker, status_w)
    os.close(status_w)
    return walls


def _fresh_proc(libc: ctypes.CDLL) -> bool:
    """A /proc of this PID namespace in place of the host's (the host's is detached first, so no process in here
    can reach it under the new one). Mounted writable: sandbox.policy makes it read-only with every other mount
    before any candidate code runs (a proc mounted read-only from the start stops the CUDA driver's initialisation:
    cudaGetDeviceCount fails with error 304)."""
    libc.umount2(b"/proc", MNT_DETACH)
    return libc.mount(b"proc", b"/proc", b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None) == 0


def _init(worker: int, status_w: int) -> None:
    """PID 1: reap every orphan until the worker ends, pass its status on, exit (which kills the namespace)."""
    status = None
    try:
        while status is None:
            try:
                pid, st = os.waitpid(-1, 0)
            except ChildProcessError:
                break
            if pid == worker:
                status = st
        if status is not None:
            os.write(status_w, struct.pack("<i", status))
    finally:
        os._exit(0)


def _mirror(init: int, status_r: int) -> None:
    """C1: wait for the namespace's init, then end as the worker ended (or as the init did, if it was killed)."""
    try:
        while True:
            try:
                _, status = os.waitpid(init, 0)
                break
            except InterruptedError:
                continue
        ready, _, _ = select.select([status_r], [], [], 0)
        data = os.read(status_r, 4) if ready else b""
        if len(data) == 4:
            status = struct.unpack("<i", data)[0]
        if os.WIFSIGNALED(status):
            sig = os.WTERMSIG(status)
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
            if sig not in (signal.SIGKILL, signal.SIGSTOP):
                signal.signal(sig, signal.SIG_DFL)
                signal.pthread_sigmask(signal.SIG_UNBLOCK, [sig])
            os.kill(os.getpid(), sig)
            os._exit(128 + sig)
        os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 70)
    finally:
        os._exit(70)


def _close(fds: list[int]) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass
