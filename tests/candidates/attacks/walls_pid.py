"""Tries to outlive its check and reach processes outside its own, from C: it looks for the zygote and the parent in
/proc and signals them (kill(pid, 0), kill(-1, 0), tgkill, a pidfd), signals itself and its own group (which
must still work), starts a new session, and leaves a daemon behind (fork, setsid, fork again,
then sleeps forever under a name the test looks for). Every call goes through libc by ctypes.pythonapi, which no
audit event refuses, so only the operating system's walls stand in the way.

Reads walls_env.json from ../io, beside its scratch directory (a tmpfs of its own the host does not see), and
writes walls_report.json there."""
import ctypes
import json
import os

api = ctypes.pythonapi
_errno = api.__errno_location
_errno.restype = ctypes.POINTER(ctypes.c_int)


def call(name, *args):
    result = getattr(api, name)(*args)
    return [result, _errno()[0] if result == -1 else 0]


# tgkill, pidfd_open, pidfd_send_signal on x86_64 and aarch64
NR = {"x86_64": (234, 434, 424), "aarch64": (131, 434, 424)}[os.uname().machine]


def syscall(nr, *args):
    return call("syscall", nr, *args)


env = json.load(open("../io/walls_env.json"))
zygote = env["zygote_pid"]
pidfd = syscall(NR[1], zygote, 0)
report = {"own": [call("kill", api.getpid(), 0), call("kill", 0, 0), syscall(NR[0], api.getpid(), api.getpid(), 0)],
          "kill_everyone": call("kill", -1, 0),
          "tgkill_zygote": syscall(NR[0], zygote, zygote, 0),
          "pidfd_zygote": pidfd,
          "pidfd_signal": syscall(NR[2], pidfd[0], 0, None, 0) if pidfd[0] >= 0 else pidfd,
"pid": api.getpid(), "ppid": api.getppid(),
          "proc_pids": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
          "kill_zygote": call("kill", zygote, 0),
          "kill_parent": call("kill", env["parent_pid"], 0),
          "setsid": call("setsid")}
first = api.fork()
if first == 0:
    api.setsid()
    if api.fork() != 0:
        api._exit(0)
    api.prctl(15, env["marker"].encode(), 0, 0, 0)  # PR_SET_NAME: /proc/<pid>/comm on the host shows it
    while True:
        api.pause()
report["fork"] = first
api.waitpid(first, None, 0)
with open("../io/walls_report.json", "w") as f:
    json.dump(report, f)
