"""Tries to leave something behind in shared memory, from C: lists /dev/shm, writes a file there, and creates a
System V shared-memory segment under a known key. Every call goes through libc by ctypes.pythonapi, which no audit
event refuses, so only the operating system's walls stand in the way.

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


env = json.load(open("../io/walls_env.json"))
report = {"shm_listing": sorted(os.listdir("/dev/shm"))}
fd, err = call("open", ("/dev/shm/" + env["shm_name"]).encode(), os.O_CREAT | os.O_WRONLY, 0o644)
report["shm_open"] = [fd, err]
if fd >= 0:
    report["shm_write"] = call("write", fd, b"left behind", 11)
    api.close(fd)
report["shmget"] = call("shmget", env["sysv_key"], 4096, 0o1000 | 0o666)  # IPC_CREAT
with open("../io/walls_report.json", "w") as f:
    json.dump(report, f)
