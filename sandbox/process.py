"""Starting, talking to and ending candidate processes (the parent's side of sandbox.zygote).

Nothing here waits without a deadline, and nothing the child or the zygote sends is used unchecked: the child's
replies through sandbox.wire and sandbox.replies, the zygote's control replies here. The candidate may stop or kill
its own process or the zygote: a stopped child is noticed while a request waits (ChildStopped), a zygote that died
or was stopped is killed and reported (ZygoteLost), and the harness starts a fresh one."""
from __future__ import annotations

import json
import logging
import math
import mmap
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import channel, replies

log = logging.getLogger(__name__)
REPO_ROOT = Path(__file__).resolve().parent.parent
OUTPUT_TAIL_BYTES = 64 * 1024
SHARED_BYTES = 1 << 36  # the shared output buffer's size: sparse, so only what the child writes takes memory
CONTROL_TIMEOUT_S = 10.0  # the zygote answers spawn and wait in milliseconds; past this it is wedged
CLOSE_GRACE_S = 2.0  # a child's own exit after {"op": "exit"}, before its process group is killed
WATCH_SLICE_S = channel.WATCH_SLICE_S
FLOOD_BYTES = 16 << 20  # output past this is read at a paced rate
FLOOD_PACE_S = 0.01


class ZygoteError(RuntimeError):
    """The zygote did not start."""


class ZygoteLost(RuntimeError):
    """The zygote died, was stopped, stopped answering or broke its protocol; it has been killed. `how` says which,
    as the end of a sentence about "the sandbox's worker process"."""

    def __init__(self, how: str):
        super().__init__(f"the sandbox's worker process {how}")
        self.how = how


class ChildStopped(RuntimeError):
    """The candidate's process is stopped (SIGSTOP or SIGTSTP): it would never answer."""


class Zygote:
    """One warm, pre-imported process that forks a child per candidate.

    Its control replies are checked like the child's (a dict of the expected integers, within CONTROL_TIMEOUT_S);
    a zygote that died, is stopped, or answers late or wrongly is killed and marked `lost`, and every later call
    raises ZygoteLost: the harness then starts a fresh one."""

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
        self.lost: str | None = None  # how it was lost, once it was
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
        self.ctrl.settimeout(CONTROL_TIMEOUT_S)  # bounds a send; replies are awaited in _control

    @property
    def pid(self) -> int:
        return self.proc.pid

    def health(self) -> str | None:
        """None while the zygote runs; else how it was lost ("died (killed by SIGKILL)", "was stopped")."""
        if self.lost is not None:
            return self.lost
        code = self.proc.poll()
        if code is not None:
            return "died (" + (f"killed by {_signal_name(-code)}" if code < 0 else f"exit code {code}") + ")"
        if process_state(self.proc.pid) == "T":
            return "was stopped (SIGSTOP)"
        return None

    def spawn(self, deadline: float | None = None, beside: int | None = None) -> "Child":
        """A fresh child; `beside`: in the control group of that child (its memory bound and process count shared)."""
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        out_r, out_w = os.pipe()
        shared_fd = os.memfd_create("crucible-outputs")
        try:
            os.ftruncate(shared_fd, SHARED_BYTES)
            reply = self._control({"op": "spawn", **({"beside": beside} if beside is not None else {})},
                                  [theirs.fileno(), out_w, shared_fd], deadline)
            shared = mmap.mmap(shared_fd, 0, prot=mmap.PROT_READ)
        except BaseException:
            mine.close()
            os.close(out_r)
            raise
        finally:
            theirs.close()
            os.close(out_w)
            os.close(shared_fd)
        pid = reply.get("pid")
        if type(pid) is not int or pid <= 1:
            shared.close()
            mine.close()
            os.close(out_r)
            raise self._lose(f"sent a malformed control reply ({str(reply)[:200]})")
        mine.setblocking(False)  # every wait on it has a deadline (sandbox.channel)
        return Child(pid, mine, out_r, self, shared)

    def wait_status(self, pid: int, deadline: float | None = None) -> int:
        return self.wait_exit(pid, deadline).status

    def wait_exit(self, pid: int, deadline: float | None = None) -> "Exit":
        """How the candidate's process ended, with whether its memory bound killed it."""
        reply = self._control({"op": "wait", "pid": pid}, None, deadline)
        status, oom, bound = reply.get("status"), reply.get("oom", False), reply.get("memory_bound_bytes", 0)
        if reply.get("pid") != pid or type(status) is not int or type(oom) is not bool or type(bound) is not int:
            raise self._lose(f"sent a malformed control reply ({str(reply)[:200]})")
        return Exit(status, oom, bound)

    def _control(self, msg: dict[str, Any], fds: list[int] | None, deadline: float | None) -> dict[str, Any]:
        """One request and its reply, within `deadline` (default: CONTROL_TIMEOUT_S from now)."""
        end = min(deadline or math.inf, time.monotonic() + CONTROL_TIMEOUT_S)
        if not self._lock.acquire(timeout=max(0.0, end - time.monotonic())):
            raise self._lose("stayed busy past its deadline")
        try:
            if self.health() is not None:
                raise self._lose(self.health() or "")
            try:
                payload = json.dumps(msg).encode()
                if fds:
                    socket.send_fds(self.ctrl, [payload], fds)
                else:
                    self.ctrl.send(payload)
            except OSError:
                raise self._lose(self.health() or "stopped accepting requests") from None
            while True:
                ready, _, _ = select.select([self.ctrl], [], [], min(WATCH_SLICE_S, max(0.0, end - time.monotonic())))
                if ready:
                    break
                how = self.health()
                if how is not None:
                    raise self._lose(how)
                if time.monotonic() >= end:
                    raise self._lose(f"did not answer a {msg['op']} request within {CONTROL_TIMEOUT_S:.0f} s")
            try:
                data = self.ctrl.recv(1 << 16)
            except OSError:
                data = b""
            if not data:
                time.sleep(0.05)  # let its exit status arrive, to name it
                raise self._lose(self.health() or "closed its control socket")
            try:
                reply = json.loads(data)
            except (ValueError, RecursionError):
                reply = None
            if not isinstance(reply, dict):
                raise self._lose(f"sent a malformed control reply ({data[:200]!r})")
            return reply
        finally:
            self._lock.release()

    def _lose(self, how: str) -> ZygoteLost:
        """Mark the zygote lost and kill it (a stopped process dies of SIGKILL too)."""
        if self.lost is None:
            self.lost = how
            log.warning("the sandbox's worker process (pid %d) %s; killing it", self.proc.pid, how)
            self.proc.kill()
            try:
                self.proc.wait(timeout=CONTROL_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                log.error("the sandbox's worker process (pid %d) did not die of SIGKILL", self.proc.pid)
        return ZygoteLost(self.lost)

    def close(self) -> None:
        try:
            self.ctrl.close()
        finally:
            if self.proc.poll() is None:
                if process_state(self.proc.pid) == "T":
                    self.proc.kill()
                try:
                    self.proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
            self._stderr.close()


@dataclass(frozen=True)
class Exit:
    status: int  # the raw wait status of the pid the zygote reported
    oom: bool  # the kernel's OOM killer ended a process of the candidate's memory group
    memory_bound_bytes: int  # that group's bound (0: no bound on this machine)


class Child:
    """One candidate's process. Requests carry a deadline, and while one waits the child and the zygote are watched:
    a stopped child raises ChildStopped, a lost zygote ZygoteLost. Output is drained into a capped tail."""

    def __init__(self, pid: int, sock: socket.socket, out_fd: int, zygote: Zygote, shared: mmap.mmap):
        self.pid, self.sock, self.zygote, self.shared = pid, sock, zygote, shared
        self.status: int | None = None
        self.oom = False  # its memory bound killed it (set when closed)
        self.memory_bound_bytes = 0
        self.zygote_lost: ZygoteLost | None = None  # set when closing found the zygote lost
        self.scratch: Path | None = None  # its scratch directory, once the harness made one (Harness._scratch)
        self.output_bytes = 0
        self.closed = False
        self._tail = bytearray()
        self._stop_drain = threading.Event()
        self._drain = threading.Thread(target=self._drain_output, args=(out_fd,), daemon=True)
        self._drain.start()

    def _drain_output(self, fd: int) -> None:
        """Keep the last OUTPUT_TAIL_BYTES. Past FLOOD_BYTES the reads are paced (FLOOD_PACE_S each): a child that
        floods its output then writes at most ~6 MB/s and costs the parent almost no CPU."""
        last = 0  # once stopped (the child is dead), what is already in the pipe, up to a bound, then no more
        try:
            while True:
                stopping = self._stop_drain.is_set()
                if stopping and last == 0:
                    last = self.output_bytes + 2 * OUTPUT_TAIL_BYTES
                if stopping and self.output_bytes >= last:
                    return
                ready, _, _ = select.select([fd], [], [], 0.0 if stopping else WATCH_SLICE_S)
                if not ready:
                    if stopping:
                        return
                    continue
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    return
                self.output_bytes += len(chunk)
                self._tail += chunk
                if len(self._tail) > OUTPUT_TAIL_BYTES:
                    del self._tail[: len(self._tail) - OUTPUT_TAIL_BYTES]
                if self.output_bytes > FLOOD_BYTES and not stopping:
                    time.sleep(FLOOD_PACE_S)
        finally:
            os.close(fd)

    def _watch(self) -> None:
        how = self.zygote.health()
        if how is not None:
            raise ZygoteLost(how)
        if self.stopped():
            raise ChildStopped()

    def stopped(self) -> bool:
        """Whether a process of the candidate's tree is stopped (the worker runs below the pid the zygote reported,
        in a PID namespace of its own where the kernel allows one: sandbox.namespaces)."""
        return any(process_state(p) == "T" for p in process_tree(self.pid))

    def request(self, msg: dict[str, Any], deadline: channel.When, max_bytes: int) -> dict[str, Any]:
        """The child's reply to `msg`, decoded (sandbox.wire) and checked against its schema (sandbox.replies).
        `deadline`: a time.monotonic() value, or a callable giving one each time it is asked (it may move).
        Raises channel.ChannelTimeout / ChannelClosed, wire.WireError (replies.MalformedReply), ChildStopped or
        ZygoteLost."""
        fd = self.sock.fileno()
        try:
            channel.send_to_child(fd, msg, deadline, self._watch)
        except (BrokenPipeError, ConnectionResetError):
            raise channel.ChannelClosed() from None
        reply = channel.recv_from_child(fd, deadline, max_bytes, self.shared, self._watch)
        return replies.validate(str(msg.get("op")), reply)

    def output_tail(self, limit: int = 4000) -> str:
        return bytes(self._tail[-limit:]).decode(errors="replace")

    def close(self, graceful: bool = True) -> None:
        """End the process and everything in its process group, and collect its exit status. Bounded: about
        CLOSE_GRACE_S for a graceful exit plus CONTROL_TIMEOUT_S for the zygote's answer; a lost zygote is recorded
        in `zygote_lost`, not raised. A second call does nothing."""
        if self.closed:
            return
        self.closed = True
        if graceful and _alive(self.pid) and not self.stopped():
            try:
                channel.send_to_child(self.sock.fileno(), {"op": "exit"}, time.monotonic() + 0.5)
            except (OSError, channel.ChannelTimeout):
                pass
            end = time.monotonic() + CLOSE_GRACE_S
            while time.monotonic() < end and _alive(self.pid):
                time.sleep(0.01)
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            ended = self.zygote.wait_exit(self.pid)
            self.status, self.oom, self.memory_bound_bytes = ended.status, ended.oom, ended.memory_bound_bytes
        except ZygoteLost as exc:
            self.zygote_lost = exc
        self.sock.close()
        self.shared.close()
        self._stop_drain.set()
        self._drain.join(timeout=2.0)

    def describe_exit(self) -> str:
        if self.oom:
            return (f"was killed for exceeding its memory bound of {self.memory_bound_bytes / (1 << 30):.1f} GiB "
                    "(CRUCIBLE_MEMORY_GIB sets it)")
        if self.status is None or self.status < 0:
            return "ended"
        if os.WIFSIGNALED(self.status):
            return f"killed by {_signal_name(os.WTERMSIG(self.status))}"
        return f"exited with code {os.WEXITSTATUS(self.status)}"


def process_state(pid: int) -> str | None:
    """The state letter of /proc/<pid>/stat ("R", "S", "T" stopped, "Z" zombie, ...); None when there is none."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[-1].split()[0].decode()
    except (OSError, IndexError):
        return None


def child_view(pid: int, path: str | os.PathLike) -> str:
    """`path` as the process `pid` sees it: through its root, in its own mount namespace (the candidate's scratch
    tmpfs, sandbox/policy.py, is not at that path on the host: the host's directory stays empty)."""
    return f"/proc/{pid}/root{os.path.abspath(os.fspath(path))}"


def process_tree(pid: int, limit: int = 256) -> list[int]:
    """`pid` and its descendants (at most `limit`), from /proc/<pid>/task/<tid>/children."""
    found, queue = [], [pid]
    while queue and len(found) < limit:
        p = queue.pop()
        found.append(p)
        try:
            tids = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{p}/task/{tid}/children", "rb") as f:
                    queue.extend(int(c) for c in f.read().split())
            except (OSError, ValueError):
                pass
    return found


def _signal_name(sig: int) -> str:
    return signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else f"signal {sig}"


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
