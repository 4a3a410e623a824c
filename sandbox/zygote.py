"""The warm parent of candidate processes: imports torch and Triton once, never touches CUDA, and forks one
child per candidate on request. A fresh interpreter costs ~4 s of imports (ANCHORS.md); a fork costs milliseconds,
and every candidate still gets a process (and, on the GPU, a CUDA context) of its own.

Protocol on a SOCK_SEQPACKET control socket (JSON messages; descriptors passed with SCM_RIGHTS):
  {"op": "spawn"} + [child's socket, child's stdout/stderr pipe, shared output buffer]  ->  {"pid": N}
  {"op": "spawn", "beside": M} + the same: the child joins the control group of child M (a check's warmer, the
      same candidate: sandbox.warmer), whose memory bound and process count the two then share
  {"op": "wait", "pid": N}             ->  {"pid": N, "status": raw wait status, "oom": bool, "memory_bound_bytes": B}
Each child starts a new session (its own process group) so the parent can kill everything it starts at once, and
gets its own PID namespace, control group and namespaces (sandbox.namespaces): killing the pid reported here ends
everything the candidate started. `oom` is true when the kernel killed a process of the candidate for exceeding its
memory bound of B bytes (sandbox.memory; B is 0 where the machine gives no bound). The group is removed on `wait`
for the last of its children.
"""
from __future__ import annotations

import gc
import json
import os
import socket
import sys


def serve(ctrl_fd: int) -> None:
    import torch  # noqa: F401  - the point of the zygote: imported once, inherited by every fork
    import triton  # noqa: F401
    import triton.language  # noqa: F401

    import profiler.timing  # noqa: F401 - captures the timer functions before any candidate can replace them
    from profiler import env
    from sandbox import carry, memory, namespaces, policy, trace, worker

    # Versions and the driver (an nvidia-smi call) are asked once here; every candidate's timing report reuses them.
    for dist in ("triton", "liger-kernel"):
        env._version(dist)
    env.driver_version()

    # The first TorchDispatchMode pulls in ~800 modules (sympy among them): pay that here, once, not per candidate.
    with trace.tracing():
        torch.nn.Linear(4, 4)(torch.empty(2, 4).fill_(1.0))
    carry.warm()  # the names Triton's launchers set on themselves, read from its source once

    groups = memory.Groups()
    pid_namespace = namespaces.pid_namespace_wanted(os.environ)
    # Everything imported so far lives as long as the zygote: out of the collector's reach, a collection in a child
    # no longer touches (and so copies) every page of torch's heap; measured: confinement 60 -> 10 ms on the CPU.
    gc.freeze()
    ctrl = socket.socket(fileno=ctrl_fd)
    statuses: dict[int, int] = {}
    cgroups: dict[int, memory.Group | None] = {}
    ctrl.send(json.dumps({"ready": True}).encode())
    try:
        while True:
            try:
                msg, fds, _, _ = socket.recv_fds(ctrl, 1 << 16, 4)
            except OSError:
                return
            if not msg:
                return
            req = json.loads(msg)
            if req["op"] == "spawn":
                beside = req.get("beside")
                group = cgroups[beside] if beside in cgroups else groups.create()
                pid = os.fork()
                if pid == 0:
                    code = 0
                    try:
                        ctrl.close()
                        os.setsid()
                        policy.ZYGOTE_WALLS.update(namespaces.enter(group, fds[:3], pid_namespace))
                        worker.main(fds[0], fds[1], fds[2])
                    except BaseException:  # noqa: BLE001 - the child must never return into the zygote's loop
                        import traceback
                        traceback.print_exc()  # into the captured output tail the verdict carries
                        code = 70
                    finally:
                        os._exit(code)
                for fd in fds:
                    os.close(fd)
                cgroups[pid] = group
                ctrl.send(json.dumps({"pid": pid}).encode())
            elif req["op"] == "wait":
                pid = int(req["pid"])
                if pid not in statuses:
                    try:
                        _, status = os.waitpid(pid, 0)
                    except ChildProcessError:
                        status = -1
                    statuses[pid] = status
                group = cgroups.pop(pid, None)
                oom = group is not None and group.oom_killed()
                if group is not None and not any(g is group for g in cgroups.values()):  # its last child
                    group.remove()
                ctrl.send(json.dumps({"pid": pid, "status": statuses.pop(pid), "oom": oom,
                                      "memory_bound_bytes": group.bound_bytes if group is not None else 0}).encode())
    finally:
        for group in {id(g): g for g in cgroups.values() if g is not None}.values():  # children never waited for
            group.remove()


if __name__ == "__main__":
    serve(int(sys.argv[1]))
