"""Starting, talking to and ending candidate processes (the parent's side of sandbox.zygote)."""
from __future__ import annotations

import json
import logging
import mmap
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from . import channel

log = logging.getLogger(__name__)
REPO_ROOT = Path(__file__).resolve().parent.parent
OUTPUT_TAIL_BYTES = 64 * 1024
SHARED_BYTES = 1 << 36  # the shared output buffer's size: sparse, so only what the child writes takes memory


class ZygoteError(RuntimeError):
    pass


class Zygote:
    """One warm, pre-imported process that forks a child per candidate."""

    def __init__(self, env: dict[str, str] | None = None, start_timeout_s: float = 180.0):
        self.ctrl, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        full_env = os.environ.copy()
        full_env.update(env or {})
        full_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), full_env.get("PYTHONPATH", "")]))
        self._stderr = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "sandbox.zygote", str(theirs.fileno())], pass_fds=[theirs.fileno()],
            env=full_env, stdin=subprocess.DEVNULL, stdout=self._stderr, stderr=self._stderr, cwd=str(REPO_ROOT))
        theirs.close()
        self._lock = threading.Lock()
        self.ctrl.settimeout(start_timeout_s)
        try:
            ready = self.ctrl.recv(1 << 16)
        except (socket.timeout, OSError):
            ready = b""
        if not ready:
            self._stderr.seek(0)
            tail = self._stderr.read()[-2000:].decode(errors="replace")
            self.close()
            raise ZygoteError(f"the sandbox's worker process did not start: {tail.strip() or 'no output'}")
        self.ctrl.settimeout(None)

    def spawn(self) -> "Child":
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        out_r, out_w = os.pipe()
        shared_fd = os.memfd_create("crucible-outputs")
        os.ftruncate(shared_fd, SHARED_BYTES)
        with self._lock:
            socket.send_fds(self.ctrl, [json.dumps({"op": "spawn"}).encode()], [theirs.fileno(), out_w, shared_fd])
            pid = json.loads(self.ctrl.recv(1 << 16))["pid"]
        theirs.close()
        os.close(out_w)
        shared = mmap.mmap(shared_fd, 0, prot=mmap.PROT_READ)
        os.close(shared_fd)
        return Child(pid, mine, out_r, self, shared)

    def wait_status(self, pid: int) -> int:
        with self._lock:
            self.ctrl.send(json.dumps({"op": "wait", "pid": pid}).encode())
            return int(json.loads(self.ctrl.recv(1 << 16))["status"])

    def close(self) -> None:
        try:
            self.ctrl.close()
        finally:
            if self.proc.poll() is None:
                try:
                    self.proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
            self._stderr.close()


class Child:
    """One candidate's process. Requests carry a deadline; output is drained into a capped tail."""

    def __init__(self, pid: int, sock: socket.socket, out_fd: int, zygote: Zygote, shared: mmap.mmap):
        self.pid, self.sock, self.zygote, self.shared = pid, sock, zygote, shared
        self.status: int | None = None
        self.output_bytes = 0
        self._tail = bytearray()
        self._drain = threading.Thread(target=self._drain_output, args=(out_fd,), daemon=True)
        self._drain.start()

    def _drain_output(self, fd: int) -> None:
        with os.fdopen(fd, "rb", buffering=0) as f:
            while chunk := f.read(1 << 16):
                self.output_bytes += len(chunk)
                self._tail += chunk
                if len(self._tail) > OUTPUT_TAIL_BYTES:
                    del self._tail[: len(self._tail) - OUTPUT_TAIL_BYTES]

    def request(self, msg: dict[str, Any], deadline: float, max_bytes: int) -> dict[str, Any]:
        try:
            channel.send_to_child(self.sock.fileno(), msg)
        except (BrokenPipeError, ConnectionResetError):
            raise channel.ChannelClosed() from None
        reply = channel.recv_from_child(self.sock.fileno(), deadline, max_bytes, self.shared)
        if not isinstance(reply, dict):
            raise channel.ChannelClosed()
        return reply

    def output_tail(self, limit: int = 4000) -> str:
        return bytes(self._tail[-limit:]).decode(errors="replace")

    def close(self, graceful: bool = True) -> None:
        """End the process and everything it started (its whole process group)."""
        if graceful:
            try:
                channel.send_to_child(self.sock.fileno(), {"op": "exit"})
            except OSError:
                pass
            end = time.monotonic() + 2.0
            while time.monotonic() < end and _alive(self.pid):
                time.sleep(0.01)
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.status = self.zygote.wait_status(self.pid)
        self.sock.close()
        self.shared.close()
        self._drain.join(timeout=2.0)

    def describe_exit(self) -> str:
        if self.status is None or self.status < 0:
            return "ended"
        if os.WIFSIGNALED(self.status):
            sig = os.WTERMSIG(self.status)
            name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else str(sig)
            return f"killed by {name}"
        return f"exited with code {os.WEXITSTATUS(self.status)}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie still answers kill(0): look at its state.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False
