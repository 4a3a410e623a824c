"""Tries to write the host's kernel settings and files, and to undo its walls, from C: opens /proc/sys, /sys and
/proc/sysrq-trigger for writing (opening only: nothing is written), creates a file outside its scratch directory,
remounts / read-write, enters a new user namespace (unshare, and clone with CLONE_NEWUSER), and traces PID 1.
Every call goes through libc by ctypes.pythonapi, which no audit event refuses, so only the operating system's
walls stand in the way.

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


def open_for_writing(path, flags=os.O_WRONLY):
    fd, err = call("open", path.encode(), flags, 0o644)
    if fd >= 0:
        api.close(fd)
    return [fd, err]


env = json.load(open("../io/walls_env.json"))
report = {path: open_for_writing(path) for path in env["write_targets"]}
report["outside"] = open_for_writing(env["outside"], os.O_CREAT | os.O_WRONLY)
report["remount_rw"] = call("mount", None, b"/", None, 32 | 4096, None)  # MS_REMOUNT | MS_BIND
report["unshare_user"] = call("unshare", 0x10000000)
child = api.syscall(56, 0x10000000 | 17, 0, 0, 0, 0)  # clone(CLONE_NEWUSER | SIGCHLD)
if child == 0:
    api._exit(0)
report["clone_user"] = [child, _errno()[0] if child == -1 else 0]
if child > 0:
    api.waitpid(child, None, 0)
report["ptrace_init"] = call("ptrace", 16, 1, None, None)  # PTRACE_ATTACH
with open("../io/walls_report.json", "w") as f:
    json.dump(report, f)
