"""The walls the operating system keeps around each candidate (sandbox.namespaces, sandbox.policy, sandbox.seccomp,
sandbox.memory), tried by candidates that skip every Python-level layer: they call libc through ctypes.pythonapi
(no audit event refuses that) and run their attack at import, driven through the zygote and worker directly, without
the static stage. Each test shows the wall held on the host: no file, no segment, no connection, no process left,
a memory kill reported. With CRUCIBLE_TEST_DEVICE=cuda the same attacks run in a zygote serving the GPU, where the
candidate holds a CUDA context and /dev/shm stays the host's (CUDA's interprocess handles need it)."""
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from sandbox import harness as harness_mod
from sandbox import memory, namespaces, policy, seccomp
from sandbox.harness import Harness
from sandbox.records import Reason, Verdict
from tests.conftest import DEVICE

HERE = Path(__file__).parent
ATTACKS = HERE / "candidates" / "attacks"
RMSNORM = HERE.parent / "tasks" / "rmsnorm_fwd.py"
# The memory bound of this module's zygote: the honest candidate needs far less (a CUDA context alone takes over
# 1 GiB of host memory, hence more on the GPU).
BOUND_GIB = 4.0 if DEVICE == "cuda" else 1.0
SCRATCH_GIB = 1 / 16  # its scratch bound (64 MiB): walls_disk.py writes 96 MiB
EPERM, EROFS, ECONNREFUSED = 1, 30, 111
# Namespaces, mounts and control groups need root (CAP_SYS_ADMIN); elsewhere the walls are reported absent instead.
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="the namespace walls need root (CAP_SYS_ADMIN)")


@pytest.fixture(scope="module")
def harness():
    with pytest.MonkeyPatch.context() as mp:  # the zygote inherits the environment
        mp.setenv("CRUCIBLE_MEMORY_GIB", str(BOUND_GIB))
        mp.setenv("CRUCIBLE_SCRATCH_GIB", str(SCRATCH_GIB))
        h = Harness(DEVICE)
    with h:
        yield h


def _pid_namespace_here() -> bool:
    """Whether this module's zygote enters a PID namespace (unless CRUCIBLE_PID_NAMESPACE=0)."""
    return namespaces.pid_namespace_wanted(os.environ)


def _setup_msg(harness, tmp_path, name, env):
    """A setup request for an attack candidate; `env` goes to ../io/walls_env.json, where the candidate also writes
    its report (its scratch directory is a tmpfs of its own: the host never sees what it writes there)."""
    scratch, io = tmp_path / "scratch", tmp_path / "io"
    (scratch / "triton").mkdir(parents=True)
    io.mkdir()
    (io / "walls_env.json").write_text(json.dumps(env))
    return {"op": "setup", "candidate": str(ATTACKS / name), "seeds_dir": str(HERE.parent / "seeds"),
            "device": DEVICE, "gpu": 0, "scratch": str(scratch), "write_roots": [str(scratch), str(io)],
            "triton_cache": str(scratch / "triton"), "triton_shared": str(harness.triton_shared), "cpu_seconds": 60,
            "allow_compute": False, "seed": 1, "init_inputs": [], "state_dict": {}}


def _attack(harness, tmp_path, name, env, keep_open=False):
    """Run an attack candidate's import in a fresh child; its setup reply and report (and the child, if kept)."""
    child = harness.zygote.spawn()
    msg = _setup_msg(harness, tmp_path, name, env)
    try:
        reply = child.request(msg, time.monotonic() + 60, 1 << 20)
    finally:
        if not keep_open:
            child.close(graceful=False)
    report = tmp_path / "io" / "walls_report.json"
    assert report.exists(), (reply, child.output_tail())
    return reply, json.loads(report.read_text()), child


def _walls(reply):
    assert isinstance(reply.get("walls"), dict), reply
    return reply["walls"]


def _comm_pids(marker):
    found = []
    for p in os.listdir("/proc"):
        try:
            if p.isdigit() and Path(f"/proc/{p}/comm").read_text().strip() == marker:
                found.append(int(p))
        except OSError:
            pass
    return found


def test_honest_candidate_is_accepted_with_every_wall_up(harness):
    result = harness.check(RMSNORM, HERE / "candidates" / "rmsnorm_honest.py")
    assert result.verdict is Verdict.ACCEPTED, result.message
    walls = result.stages[1].details["walls"]
    if os.geteuid() != 0:
        assert sorted(walls) == sorted(policy.WALLS)  # reported, standing or not
        return
    pid_ns = _pid_namespace_here()
    assert walls == {"network_isolated": True, "filesystem_read_only": True, "capabilities_dropped": True,
                     "ipc_namespace": True, "pid_namespace": pid_ns, "proc_private": pid_ns, "shm_private": True,
                     "proc_sys_read_only": True, "seccomp": True,
                     "memory_bound_bytes": int(BOUND_GIB * (1 << 30)) if memory.Groups(1).available else 0,
                     "scratch_bound_bytes": int(SCRATCH_GIB * (1 << 30))}


@needs_root
def test_filling_the_scratch_directory_stops_at_its_bound(harness, monkeypatch):
    """Through the whole pipeline, static stage bypassed: 96 MiB written from C into a 64 MiB scratch tmpfs fail with
    ENOSPC, and the verdict names the bound (on the host's disk the write would succeed and the candidate pass)."""
    monkeypatch.setattr(harness_mod.static, "check_source", lambda source, name="": None)
    result = harness.check(RMSNORM, ATTACKS / "walls_disk.py")
    assert result.verdict is Verdict.REJECTED and result.reason is Reason.SANDBOX_VIOLATION, result.message
    assert "scratch directory past its bound of 64 MiB" in result.message, result.message


def _assert_signals_confined(report):
    """The seccomp filter's signal rule: nothing outside its own process and group, by any call; itself, yes."""
    assert report["own"] == [[0, 0]] * 3, report["own"]
    for probe in ("kill_zygote", "kill_parent", "kill_everyone", "tgkill_zygote", "pidfd_zygote", "pidfd_signal"):
        assert report[probe] == [-1, EPERM], (probe, report[probe])
    assert report["setsid"] == [-1, EPERM]


@needs_root
def test_nothing_the_candidate_starts_outlives_it_and_it_sees_no_one(harness, tmp_path):
    if not _pid_namespace_here():
        pytest.skip("CRUCIBLE_PID_NAMESPACE=0: the next test covers that case")
    marker = "cw" + secrets.token_hex(6)
    env = {"zygote_pid": harness.zygote.proc.pid, "parent_pid": os.getpid(), "marker": marker}
    reply, report, child = _attack(harness, tmp_path, "walls_pid.py", env, keep_open=True)
    try:
        assert _walls(reply)["pid_namespace"]
        daemons = _comm_pids(marker)
        assert daemons, "the daemon never started: the test would prove nothing"
        assert report["pid"] == 2 and report["ppid"] == 1  # under the namespace's trusted init
        assert report["proc_pids"] == sorted(set(report["proc_pids"]) & {1, 2, 3, 4, 5})  # only its own tree
        _assert_signals_confined(report)
    finally:
        child.close(graceful=False)
    end = time.monotonic() + 5
    while _comm_pids(marker) and time.monotonic() < end:
        time.sleep(0.05)
    assert not _comm_pids(marker), "a process the candidate started outlived its check"
    assert harness.zygote.proc.poll() is None


@needs_root
def test_without_a_pid_namespace_what_the_candidate_starts_still_dies(tmp_path, monkeypatch):
    """With CRUCIBLE_PID_NAMESPACE=0 (sandbox.namespaces.pid_namespace_wanted): no new session for the daemon (seccomp), so the
    parent's kill of the process group reaches it, and the zygote empties the control group on wait."""
    monkeypatch.setenv("CRUCIBLE_PID_NAMESPACE", "0")
    marker = "cw" + secrets.token_hex(6)
    with Harness(DEVICE) as harness:
        env = {"zygote_pid": harness.zygote.proc.pid, "parent_pid": os.getpid(), "marker": marker}
        reply, report, child = _attack(harness, tmp_path, "walls_pid.py", env, keep_open=True)
        try:
            assert not _walls(reply)["pid_namespace"] and _walls(reply)["seccomp"]
            assert report["setsid"] == [-1, EPERM] and _comm_pids(marker)
            _assert_signals_confined(report)  # the zygote and the parent are in its PID namespace here
        finally:
            child.close(graceful=False)
        end = time.monotonic() + 5
        while _comm_pids(marker) and time.monotonic() < end:
            time.sleep(0.05)
        assert not _comm_pids(marker), "a process the candidate started outlived its check"


@needs_root
def test_shared_memory_is_private_and_left_behind_nowhere(harness, tmp_path):
    nonce = secrets.token_hex(6)
    host_file = Path(f"/dev/shm/crucible-walls-host-{nonce}")
    host_file.write_text("the host's")
    env = {"shm_name": f"crucible-walls-{nonce}", "sysv_key": int(nonce[:7], 16)}
    try:
        reply, report, _ = _attack(harness, tmp_path, "walls_shm.py", env)
    finally:
        host_file.unlink()
    assert _walls(reply)["shm_private"] and _walls(reply)["ipc_namespace"]
    assert report["shm_listing"] == []  # an empty tmpfs of its own: not even the host's file
    assert report["shm_open"][0] >= 0 and report["shm_write"][0] == 11  # the write worked, in its private tmpfs
    assert not Path(f"/dev/shm/{env['shm_name']}").exists()
    assert report["shmget"][0] >= 0  # a segment in its own IPC namespace...
    keys = [int(line.split()[0]) for line in Path("/proc/sysvipc/shm").read_text().splitlines()[1:]]
    assert env["sysv_key"] not in keys  # ...that the host never sees


@needs_root
def test_kernel_settings_and_mounts_cannot_be_written_or_undone(harness, tmp_path):
    targets = [p for p in ("/proc/sys/kernel/printk_ratelimit", "/proc/sysrq-trigger", "/sys/kernel/profiling",
                           "/sys/kernel/mm/transparent_hugepage/enabled") if os.path.exists(p)]
    outside = tmp_path / "outside.txt"
    reply, report, _ = _attack(harness, tmp_path, "walls_mounts.py",
                               {"write_targets": targets, "outside": str(outside)})
    walls = _walls(reply)
    assert walls["proc_sys_read_only"] and walls["filesystem_read_only"] and walls["seccomp"]
    assert targets and all(report[p] == [-1, EROFS] for p in targets), report
    assert report["outside"] == [-1, EROFS] and not outside.exists()
    for call in ("remount_rw", "unshare_user", "clone_user", "ptrace_init"):
        assert report[call] == [-1, EPERM], (call, report[call])


def test_no_socket_reaches_outside(harness, tmp_path):
    path_listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    unix_path = str(tmp_path / "host.sock")
    path_listener.bind(unix_path)
    abstract_listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    abstract_name = "crucible-walls-" + secrets.token_hex(6)
    abstract_listener.bind("\0" + abstract_name)
    for s in (path_listener, abstract_listener):
        s.listen(1)
        s.setblocking(False)
    try:
        reply, report, _ = _attack(harness, tmp_path, "walls_socket.py",
                                   {"unix_path": unix_path, "abstract_name": abstract_name})
        assert _walls(reply)["seccomp"] and reply["ok"] is False  # the channel still answered (no ModelNew)
        for kind in ("unix_path", "unix_abstract"):
            assert report[kind] == {"socket": [-1, EPERM]}, report[kind]
        for kind in ("inet", "netlink", "socketpair"):
            assert report[kind] == [-1, EPERM], (kind, report[kind])
        for s in (path_listener, abstract_listener):
            with pytest.raises(BlockingIOError):
                s.accept()
    finally:
        path_listener.close()
        abstract_listener.close()


CONNECT_ABSTRACT = textwrap.dedent("""
    import ctypes, socket, sys
    if sys.argv[2] == "netns" and ctypes.CDLL(None, use_errno=True).unshare(0x40000000) != 0:
        print("unavailable"); sys.exit()
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect("\\0" + sys.argv[1]); print("connected")
    except OSError as exc:
        print(exc.errno)
""")


def test_abstract_unix_sockets_are_per_network_namespace(tmp_path):
    """Without the seccomp filter: a new network namespace alone keeps the host's abstract sockets out of reach
    (and the control, from the host's namespace, connects)."""
    name = "crucible-walls-" + secrets.token_hex(6)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind("\0" + name)
    listener.listen(2)
    try:
        runs = {how: subprocess.run([sys.executable, "-c", CONNECT_ABSTRACT, name, how], capture_output=True,
                                    text=True, timeout=30).stdout.strip() for how in ("host", "netns")}
    finally:
        listener.close()
    assert runs["host"] == "connected"
    if runs["netns"] == "unavailable":
        pytest.skip("this kernel refused a network namespace (needs root)")
    assert runs["netns"] == str(ECONNREFUSED)


@needs_root
def test_exceeding_the_memory_bound_ends_in_a_reported_oom_kill(harness, tmp_path, monkeypatch):
    if not memory.Groups(1).available:
        pytest.skip("no memory control group on this machine (cgroup v2 with memory delegated, or v1)")
    replies = []
    control = harness.zygote._control

    def recording(msg, fds, deadline):
        reply = control(msg, fds, deadline)
        if msg.get("op") == "wait":
            replies.append(reply)
        return reply

    monkeypatch.setattr(harness.zygote, "_control", recording)
    child = harness.zygote.spawn()
    msg = _setup_msg(harness, tmp_path, "walls_memory.py", {"gib": 2 * BOUND_GIB})
    from sandbox import channel
    with pytest.raises(channel.ChannelClosed):
        child.request(msg, time.monotonic() + 60, 1 << 20)
    child.close(graceful=False)
    assert replies and replies[-1]["oom"] is True, replies
    assert replies[-1]["memory_bound_bytes"] == int(BOUND_GIB * (1 << 30))
    assert f"memory bound of {BOUND_GIB:.1f} GiB" in child.describe_exit()


HOG = """
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _copy(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)


class ModelNew(nn.Module):
    def __init__(self, hidden, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden, dtype=torch.bfloat16))

    def forward(self, x):
        hog = torch.ones(GIB << 28, dtype=torch.float32)  # every page written
        y = torch.empty_like(x)
        _copy[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
        return y + hog[0].to(y.dtype) * 0
"""


@needs_root
def test_a_candidate_over_its_memory_bound_is_rejected_saying_so(harness, tmp_path):
    """Through the whole pipeline: the forward takes twice its bound; the verdict names the bound, not a crash."""
    if not memory.Groups(1).available:
        pytest.skip("no memory control group on this machine (cgroup v2 with memory delegated, or v1)")
    candidate = tmp_path / "hog.py"
    candidate.write_text(HOG.replace("GIB", str(int(2 * BOUND_GIB))))
    result = harness.check(RMSNORM, candidate)
    assert result.verdict is Verdict.REJECTED
    assert f"exceeding its memory bound of {BOUND_GIB:.1f} GiB" in result.message, result.message


def test_the_filter_table_matches_the_kernel_headers():
    """The syscall numbers of both architectures, against the headers where this machine has them."""
    import re
    headers = {0: "/usr/include/x86_64-linux-gnu/asm/unistd_64.h", 1: "/usr/include/asm-generic/unistd.h"}
    checked = 0
    for column, header in headers.items():
        if not os.path.exists(header):
            continue
        numbers = dict(re.findall(r"#define __NR(?:3264)?_(\w+)\s+(\d+)\b", Path(header).read_text()))
        for name, nrs in seccomp.SYSCALLS.items():
            assert nrs[column] == int(numbers[name]), (header, name)
            checked += 1
    if not checked:
        pytest.skip("no kernel headers on this machine")


X32_SOCKET = textwrap.dedent("""
    import ctypes, sys
    sys.path.insert(0, sys.argv[1])
    from sandbox import seccomp
    assert seccomp.install()
    ctypes.CDLL(None).syscall(41 | 0x40000000, 1, 1, 0)  # socket through the x32 ABI: another table
    print("survived")
""")


@pytest.mark.skipif(seccomp.machine() != "x86_64", reason="the x32 ABI exists on x86_64 only")
def test_a_call_through_another_abi_kills_the_process():
    proc = subprocess.run([sys.executable, "-c", X32_SOCKET, str(HERE.parent)], capture_output=True, text=True,
                          timeout=30)
    assert proc.returncode == -signal.SIGSYS and "survived" not in proc.stdout, (proc.returncode, proc.stderr[-500:])


MIRROR = textwrap.dedent("""
    import os, signal, sys
    sys.path.insert(0, sys.argv[1])
    from sandbox import namespaces
    pid = os.fork()
    if pid == 0:
        walls = namespaces.enter(None, [])  # returns only in the worker, below the namespace's init
        if not walls["pid_namespace"]:
            os._exit(99)
        if sys.argv[2] == "exit":
            os._exit(7)
        os.kill(os.getpid(), signal.SIGXCPU)  # what RLIMIT_CPU sends: the worker is not an init, so it dies
        os._exit(98)
    _, status = os.waitpid(pid, 0)
    print(os.WEXITSTATUS(status) if os.WIFEXITED(status) else -os.WTERMSIG(status))
""")


@pytest.mark.parametrize("how, expected", [("exit", "7"), ("signal", str(-int(signal.SIGXCPU)))])
def test_the_pid_the_zygote_reports_ends_as_the_worker_did(how, expected):
    """C1 mirrors the worker's end through the namespace's init: the same exit code, or the same signal (SIGXCPU,
    which the parent reads as the CPU-time limit)."""
    out = subprocess.run([sys.executable, "-c", MIRROR, str(HERE.parent), how], capture_output=True, text=True,
                         timeout=60).stdout.strip()
    if out == "99":
        pytest.skip("this kernel refused a PID namespace (needs root)")
    assert out == expected


UNDER_FILTER = textwrap.dedent("""
    import os, shutil, signal, subprocess, sys, tempfile, threading
    sys.path.insert(0, sys.argv[1])
    from sandbox import seccomp
    assert seccomp.install(os.getpid(), os.getpgid(0))
    ran, caught = [], []
    signal.signal(signal.SIGUSR1, lambda *_: caught.append(1))
    t = threading.Thread(target=lambda: ran.append(1))  # clone with CLONE_THREAD (clone3 answers ENOSYS first)
    t.start(); t.join()
    signal.raise_signal(signal.SIGUSR1)  # tgkill to its own tgid
    os.kill(os.getpid(), signal.SIGUSR1)
    os.killpg(os.getpgid(0), 0)
    t = threading.Thread(target=lambda: signal.pthread_kill(threading.main_thread().ident, signal.SIGUSR1))
    t.start(); t.join()
    out = subprocess.run([sys.executable, "-c", "print(6 * 7)"], capture_output=True, text=True).stdout.strip()
    cc = shutil.which("cc") or shutil.which("gcc")  # a compiler driver and its own children, waited on
    compiled = "no compiler"
    if cc:
        with tempfile.TemporaryDirectory() as d:
            open(os.path.join(d, "a.c"), "w").write("int f(int x) { return x + 1; }")
            compiled = subprocess.run([cc, "-shared", "-fPIC", "-o", os.path.join(d, "a.so"), os.path.join(d, "a.c")],
                                      capture_output=True).returncode
    try:
        os.kill(os.getppid(), 0)
        parent = "signalled"
    except PermissionError:
        parent = "refused"
    print(len(ran), out, len(caught), compiled, parent)  # fork/vfork and execve: how Triton starts ptxas on a GPU
""")


def test_threads_fork_exec_and_own_signals_still_work_under_the_filter():
    """The filter as the candidate gets it (signals confined to its own pid and group): Python's own signal use,
    threads, a subprocess and a compiler driver work; its parent cannot be signalled."""
    proc = subprocess.run([sys.executable, "-c", UNDER_FILTER, str(HERE.parent)], capture_output=True, text=True,
                          timeout=60)
    words = proc.stdout.split()
    assert words[:3] == ["1", "42", "3"] and words[-1] == "refused", (proc.stdout, proc.stderr[-500:])
    assert words[3] in ("0", "no"), proc.stdout
