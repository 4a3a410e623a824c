"""Tries to reach a process outside through a socket, from C: a Unix socket on a path of the host's file system, an
abstract Unix socket, TCP to localhost, a netlink socket and a socket pair. Every call goes through libc by
ctypes.pythonapi, which no audit event refuses, so only the operating system's walls stand in the way.

Reads walls_env.json from ../io, beside its scratch directory (a tmpfs of its own the host does not see), and
writes walls_report.json there."""
import ctypes
import json
import socket
import struct

api = ctypes.pythonapi
_errno = api.__errno_location
_errno.restype = ctypes.POINTER(ctypes.c_int)


def call(name, *args):
    result = getattr(api, name)(*args)
    return [result, _errno()[0] if result == -1 else 0]


def connect_unix(name: bytes):
    fd, err = call("socket", socket.AF_UNIX, socket.SOCK_STREAM, 0)
    if fd < 0:
        return {"socket": [fd, err]}
    addr = struct.pack("H", socket.AF_UNIX) + name
    return {"socket": [fd, err], "connect": call("connect", fd, addr, len(addr))}


env = json.load(open("../io/walls_env.json"))
pair = (ctypes.c_int * 2)()
report = {"unix_path": connect_unix(env["unix_path"].encode() + b"\0"),
          "unix_abstract": connect_unix(b"\0" + env["abstract_name"].encode()),
          "inet": call("socket", socket.AF_INET, socket.SOCK_STREAM, 0),
          "netlink": call("socket", 16, socket.SOCK_RAW, 0),
          "socketpair": call("socketpair", socket.AF_UNIX, socket.SOCK_STREAM, 0, pair)}
with open("../io/walls_report.json", "w") as f:
    json.dump(report, f)
