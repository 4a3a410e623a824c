"""Attacks on the warmer (sandbox/warmer.py) from the candidate's side: its second process of the candidate, the
files the parent reads from that process's Triton cache and plants in the check's own process, and its end.

Every candidate here is the honest RMSNorm (tests/candidates/rmsnorm_honest.py) with code added to its forward. The
same source runs in both processes, and tells them apart by its process's first call: the warmer's is at the first
robustness shape, the check's own process's at the task's shape. Where the check's own process is to say whether an
attack reached it, it answers wrongly (zeros) at the robustness shapes: the check is then rejected there. The static
stage is off in this module (the additions import os, ctypes, threading), as in tests/test_warmer.py: each attack
goes straight at the layers behind it.

Each test asserts the safe behaviour and says, where it fails, what the attack got.
"""
import os
import textwrap
import time
from pathlib import Path

import pytest

from sandbox import compiled, stage_runners, warmer
from sandbox import harness as harness_mod
from sandbox.gate import GpuGate
from sandbox.harness import CheckOptions, Harness
from sandbox.process import Zygote, _alive, process_tree
from sandbox.records import Stage

HERE = Path(__file__).parent
RMSNORM = HERE.parent / "tasks" / "rmsnorm_fwd.py"
HONEST = HERE / "candidates" / "rmsnorm_honest.py"
DEVICE = "cpu"  # every attack here runs through Triton's interpreter
KEY = "C3QZLKX5UZ6OFMY2VQ7XMLE6JDLGXFQ4XKTVR7LK2ITB4OKYGF4A"  # a Triton cache directory's name


def _options(**kw) -> CheckOptions:
    return CheckOptions(**{"device": DEVICE, "timing": False, "timeout_s": 120, "warm": True, **kw})


@pytest.fixture(scope="module")
def no_static():
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(harness_mod.static, "check_source", lambda source, name="": None)
        yield


@pytest.fixture(scope="module")
def harness(no_static, tmp_path_factory):
    with Harness(DEVICE, workdir=tmp_path_factory.mktemp("warmer-attacks")) as h:
        yield h


def _own_harness(monkeypatch, tmp_path, **env: str) -> Harness:
    """A harness whose zygote (and so every candidate process) reads `env`: set before the zygote starts."""
    monkeypatch.setattr(harness_mod.static, "check_source", lambda source, name="": None)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return Harness(DEVICE, workdir=tmp_path / "work")


def _first_rows(h: Harness) -> int:
    task = h.load(RMSNORM)
    return h._variant_tasks(task)[0][0]["M"]


def _candidate(tmp_path: Path, h: Harness, name: str, block: str, prelude: str = "") -> Path:
    """The honest RMSNorm with `block` run at the start of every forward, where `role` is 'warmer' or 'check' (by
    the process's first call), `cache` its Triton cache, `rows` the call's rows; the block may set `ok = False`, and
    the call then returns zeros."""
    source = HONEST.read_text()
    head = ("import os\nimport ctypes\nimport threading\nimport time\n\nimport torch\n")
    assert source.count("import torch\n") == 1
    source = source.replace("import torch\n", head, 1)
    roles = (f"_ROLE = []\n_FIRST_ROBUSTNESS_ROWS = {_first_rows(h)}\n\n\n"
             "def _role(rows):\n    if not _ROLE:\n"
             "        _ROLE.append('warmer' if rows == _FIRST_ROBUSTNESS_ROWS else 'check')\n"
             "    return _ROLE[0]\n\n\n" + textwrap.dedent(prelude) + "\n\nclass ModelNew")
    assert source.count("class ModelNew") == 1
    source = source.replace("class ModelNew", roles, 1)
    body = ("rows = x.shape[0]\nrole = _role(rows)\ncache = os.environ['TRITON_CACHE_DIR']\nok = True\n"
            + textwrap.dedent(block))
    assert source.count("        x = x.contiguous()\n") == 1
    source = source.replace("        x = x.contiguous()\n", textwrap.indent(body, " " * 8) + "        x = x.contiguous()\n")
    assert source.count("        return y\n") == 1
    source = source.replace("        return y\n", "        return y if ok else torch.zeros_like(y)\n")
    path = tmp_path / f"rmsnorm_{name}.py"
    path.write_text(source)
    return path


def _robustness(result):
    [stage] = [s for s in result.stages if s.stage is Stage.ROBUSTNESS]
    return stage.details


# ---- what the warmer's cache holds ------------------------------------------------------------------------------

HOSTILE_CACHE = """
if role == 'warmer' and not os.path.exists(os.path.join(cache, 'K')):
    k = os.path.join(cache, 'K')
    os.makedirs(os.path.join(k, 'sub'))
    with open(os.path.join(k, 'ok.bin'), 'wb') as f:
        f.write(b'fine')
    with open(os.path.join(k, '__grp__good.json'), 'w') as f:
        f.write('{"child_paths": {"ok.bin": "/somewhere/else/K/ok.bin"}}')
    with open(os.path.join(k, '__grp__far.json'), 'w') as f:  # a group file pointing at the host's files
        f.write('{"child_paths": {"passwd": "/etc/passwd", "up": "../../../../etc/shadow"}}')
    with open(os.path.join(k, '__grp__bad.json'), 'w') as f:  # a child name outside the layout
        f.write('{"child_paths": {"x": "/etc/a b"}}')
    with open(os.path.join(k, '__grp__deep.json'), 'w') as f:  # not a dict; deep nesting
        f.write('[' * 5000 + ']' * 5000)
    with open(os.path.join(k, '.hidden'), 'wb') as f:
        f.write(b'odd name')
    with open(os.path.join(k, 'sub', 'deep.bin'), 'wb') as f:
        f.write(b'too deep')
    os.mkfifo(os.path.join(k, 'fifo'))  # a FIFO: opening it to read would wait for a writer
    # links made from C (the audit hook refuses a link to outside the scratch directory), to the host's files
    ctypes.pythonapi.symlink(b'/etc/hostname', os.path.join(k, 'hostname').encode())
    ctypes.pythonapi.symlink(b'/etc', os.path.join(cache, 'L').encode())
    ctypes.pythonapi.symlink(b'/proc/self/environ', os.path.join(k, 'environ').encode())
    os.makedirs(os.path.join(cache, 'bad name!'))
    with open(os.path.join(cache, 'bad name!', 'x.bin'), 'wb') as f:
        f.write(b'odd directory')
if role == 'check' and rows != _FIRST_ROWS_SEEN[0]:
    found = []
    for d in os.listdir(cache):
        p = os.path.join(cache, d)
        if os.path.islink(p) or not os.path.isdir(p):
            found.append(d)
            continue
        for f in os.listdir(p):
            q = os.path.join(p, f)
            if os.path.islink(q) or not os.path.isfile(q):
                found.append(d + '/' + f)
                continue
            found.append(d + '/' + f)
            if f.startswith('__grp__'):
                with open(q) as g:
                    text = g.read()
                if (cache + '/K/') not in text or '/etc' in text or '..' in text:
                    ok = False
    if sorted(found) != ['K/__grp__far.json', 'K/__grp__good.json', 'K/ok.bin']:
        ok = False
"""


def test_hostile_entries_in_the_warmer_s_cache_never_reach_the_check_s_process(harness, tmp_path):
    """The warmer leaves links (to a file, to a directory, to /proc), a FIFO, names outside Triton's layout, a
    deeper directory and group files that point at the host's files or are not JSON objects. Had the parent followed
    a link, opened the FIFO, kept an odd name or planted a group file naming a path outside the check's own cache,
    the check's process would find it at the robustness shapes and answer wrongly; had it waited on the FIFO, the
    read would hang the parent."""
    source = _candidate(tmp_path, harness, "hostile_cache", "if not _FIRST_ROWS_SEEN:\n"
                        "    _FIRST_ROWS_SEEN.append(rows)\n" + HOSTILE_CACHE, prelude="_FIRST_ROWS_SEEN = []\n")
    t0 = time.monotonic()
    result = harness.check(RMSNORM, source, _options())
    assert result.accepted, result.message
    details = _robustness(result)
    assert details["planted"] == 3  # ok.bin and the two group files, moved into the check's cache; nothing else
    assert result.costs["warm_finish_s"] < 5.0 and time.monotonic() - t0 < 60


@pytest.mark.parametrize("how", ["huge_sparse_file", "crowded_directory", "many_kernel_directories"])
def test_a_warmer_s_cache_past_the_caps_is_dropped_quickly(harness, tmp_path, how):
    """A sparse file past MAX_BYTES (no byte of the tmpfs used), hard links past MAX_ENTRIES (no inode, no byte),
    or MAX_FILES + 1 small files: read_cache gives up at the cap, nothing is planted, and reading costs the check
    little. Had the parent read it all, the huge file alone would be 129 MiB in its memory and in the plant request."""
    make = {
        "huge_sparse_file": "with open(os.path.join(k, 'huge.bin'), 'wb') as f:\n"
                            "    f.truncate((128 << 20) + 1)\n",
        "crowded_directory": "for i in range(4 * 4096 + 8):\n"
                             "    os.link(os.path.join(k, 'ok.bin'), os.path.join(k, 'l%06d' % i))\n",
        "many_kernel_directories": "for i in range(4096 + 1):\n"
                                   "    os.mkdir(os.path.join(cache, 'D%05d' % i))\n"
                                   "    with open(os.path.join(cache, 'D%05d' % i, 'k.bin'), 'wb') as f:\n"
                                   "        f.write(b'x')\n",
    }[how]
    block = ("if role == 'warmer' and not os.path.exists(os.path.join(cache, 'K')):\n"
             "    k = os.path.join(cache, 'K')\n    os.makedirs(k)\n"
             "    with open(os.path.join(k, 'ok.bin'), 'wb') as f:\n        f.write(b'fine')\n"
             + textwrap.indent(make, "    "))
    result = harness.check(RMSNORM, _candidate(tmp_path, harness, how, block), _options())
    assert result.accepted, result.message
    assert _robustness(result)["planted"] == 0  # past a cap, nothing of the cache is kept
    assert result.costs["warm_finish_s"] < 5.0


def test_a_warmer_s_files_cannot_fill_the_check_s_scratch(monkeypatch, tmp_path):
    """With a 256 MiB scratch, the warmer's cache holds 96 MiB of valid files (under MAX_BYTES, over a quarter of the
    check's free space); the check's own process then needs 180 MiB of its scratch at the robustness shapes. Had the
    files been planted, its write would find the scratch full and the check would be rejected for the warmer's doing."""
    block = """
    if role == 'warmer' and not os.path.exists(os.path.join(cache, 'K')):
        os.makedirs(os.path.join(cache, 'K'))
        for i in range(4):
            with open(os.path.join(cache, 'K', 'blob%d.bin' % i), 'wb') as f:
                f.write(b'\\1' * (24 << 20))
    if role == 'check' and rows == _FIRST_ROBUSTNESS_ROWS and not os.path.exists('fill.bin'):
        with open('fill.bin', 'wb') as f:  # the process's working directory is its scratch
            for _ in range(180):
                f.write(b'\\2' * (1 << 20))
    """
    with _own_harness(monkeypatch, tmp_path, CRUCIBLE_SCRATCH_GIB="0.25") as h:
        result = h.check(RMSNORM, _candidate(tmp_path, h, "fills_scratch", block), _options())
    assert result.accepted, result.message
    assert _robustness(result)["planted"] == 0


# ---- the warmer's process and its end ---------------------------------------------------------------------------

def test_a_process_the_warmer_starts_dies_with_it(harness, tmp_path, monkeypatch):
    """The warmer forks from C (past the audit hook's refusal of os.fork) a process that sleeps forever. Every
    process of the warmer's tree, that one included, is dead once the robustness stage has ended the warmer."""
    block = """
    if role == 'warmer' and not _FORKED:
        _FORKED.append(True)
        if ctypes.pythonapi.fork() == 0:
            while True:
                time.sleep(0.05)
    """
    trees = []
    end_ = warmer.Warmer._end

    def ending(self, read):
        if not self._killed:  # the tree as it stood just before the kill
            trees.append(process_tree(self.run.child.pid))
        return end_(self, read)
    monkeypatch.setattr(warmer.Warmer, "_end", ending)
    result = harness.check(RMSNORM, _candidate(tmp_path, harness, "forks_in_warmer", block, "_FORKED = []\n"),
                           _options())
    assert result.accepted, result.message
    [tree] = trees
    assert len(tree) >= 4  # C1, the namespace's init, the worker and the process it forked
    end = time.monotonic() + 3.0
    while any(_alive(p) for p in tree) and time.monotonic() < end:
        time.sleep(0.05)
    assert not [p for p in tree if _alive(p)], "a process the warmer started outlived it"


MISBEHAVIOURS = {
    "exits": "os._exit(3)\n",
    "stops_itself": "import signal\nsignal.raise_signal(signal.SIGSTOP)\n",
    "writes_garbage_to_its_channel": (
        "for fd in os.listdir('/proc/self/fd'):\n"
        "    try:\n        what = os.readlink('/proc/self/fd/' + fd)\n    except OSError:\n        continue\n"
        "    if what.startswith('socket:'):\n        os.write(int(fd), b'\\xff' * 64)\n"
        "time.sleep(30)\n"),
    "floods_its_output": "for _ in range(64):\n    print('x' * (1 << 20), flush=True)\n",
    "spins_holding_the_gil": "end = time.monotonic() + 20\nwhile time.monotonic() < end:\n    pass\n",
}


@pytest.mark.parametrize("how", sorted(MISBEHAVIOURS))
def test_a_misbehaving_warmer_changes_nothing_in_the_verdict(harness, tmp_path, how):
    """Whatever the warmer does at its first call (dies, stops itself, forges its reply, floods its output, spins),
    the check's own process is honest and the check is accepted, in about the time it takes without a warmer."""
    block = "if role == 'warmer':\n" + textwrap.indent(MISBEHAVIOURS[how], "    ")
    source = _candidate(tmp_path, harness, f"warmer_{how}", block)
    t0 = time.monotonic()
    result = harness.check(RMSNORM, source, _options())
    took = time.monotonic() - t0
    assert result.accepted, result.message
    assert _robustness(result)["warmed"] == 0
    assert took < 30, f"the check took {took:.1f} s"


def test_the_warmer_s_pid_is_not_signalled_after_its_process_was_reaped(harness, tmp_path, monkeypatch):
    """The warmer exits at its first call. Its request ends as closed, and the warmer's thread closes its child: the
    zygote reaps the pid, which the kernel may now give to any new process (a concurrent check's C1 is the leader of
    a process group of that number; pid_max is 32768 on many hosts, and a candidate's forks use up pids fast). At the
    robustness stage Warmer.finish reads the cache at /proc/PID/root/... and Warmer.close sends SIGKILL to the process
    group PID: to another check's candidate, were the pid reused by then. Nothing may be signalled or read through a
    pid once its process was reaped."""
    block = "if role == 'warmer':\n    os._exit(3)\n"
    source = _candidate(tmp_path, harness, "warmer_exits_early", block)
    events = []
    killpg, wait_exit, read_cache = os.killpg, Zygote.wait_exit, compiled.read_cache

    def recording_killpg(pid, sig):
        events.append(("killpg", pid))
        return killpg(pid, sig)

    def recording_wait_exit(self, pid, deadline=None):
        ended = wait_exit(self, pid, deadline)
        events.append(("reaped", pid))
        return ended

    def recording_read_cache(root):
        events.append(("read", int(str(root).split("/")[2])))
        return read_cache(root)
    monkeypatch.setattr(os, "killpg", recording_killpg)
    monkeypatch.setattr(Zygote, "wait_exit", recording_wait_exit)
    monkeypatch.setattr(compiled, "read_cache", recording_read_cache)
    pids = []
    finish = warmer.Warmer.finish

    def finishing(self):
        pids.append(self.run.child.pid)
        return finish(self)
    monkeypatch.setattr(warmer.Warmer, "finish", finishing)
    result = harness.check(RMSNORM, source, _options())
    assert result.accepted, result.message
    [pid] = pids
    mine = [what for what, p in events if p == pid]
    assert "reaped" in mine
    after = mine[mine.index("reaped") + 1:]
    assert not after, f"after the zygote reaped the warmer's pid {pid}, the parent still did {after} on that pid"


def test_the_warmer_is_dead_at_the_robustness_stage_s_first_call(harness, tmp_path, monkeypatch):
    """The warmer is ended, dead, before the robustness stage's first call (the repeat of the first inputs)."""
    seen = []
    call = stage_runners.call

    def calling(h, run, stage, *a, **k):
        if stage is Stage.ROBUSTNESS and not seen and run.warmer is not None:
            seen.append(_alive(run.warmer.run.child.pid) and not run.warmer.closed)
        return call(h, run, stage, *a, **k)
    monkeypatch.setattr(stage_runners, "call", calling)
    result = harness.check(RMSNORM, HONEST, _options())
    assert result.accepted, result.message
    assert seen == [False], "the warmer's process was alive at the robustness stage's first call"


# ---- what the warmer's process may do beside the check ------------------------------------------------------------

def test_the_warmer_cannot_see_what_the_check_s_process_writes(harness, tmp_path, monkeypatch):
    """The check's process writes a marker in every place it can write (its scratch, its Triton cache, /dev/shm);
    the warmer looks for it, for three seconds, in the same places and in every scratch directory it can see, and
    reports what it found through a file in its cache, planted in the check's process. Had the two processes shared a
    writable place, the check's process would find 'seen/yes' and answer wrongly."""
    block = """
    marker = 'crucible-marker-from-the-check'
    if role == 'check' and not _WROTE:
        _WROTE.append(True)
        for where in (os.getcwd(), cache):
            with open(os.path.join(where, marker), 'w') as f:
                f.write('inputs')
        fd = ctypes.pythonapi.open(('/dev/shm/' + marker).encode(), os.O_WRONLY | os.O_CREAT, 0o644)  # from C: the
        ctypes.pythonapi.close(fd)  # audit hook allows writes under the scratch directory only
    if role == 'warmer' and not os.path.exists(os.path.join(cache, 'seen')):
        found = False
        end = time.monotonic() + 3.0
        while not found and time.monotonic() < end:
            places = [os.getcwd(), cache, '/dev/shm', os.path.dirname(os.getcwd())]
            work = os.path.dirname(os.getcwd())
            places += [os.path.join(work, d) for d in os.listdir(work)]
            places += [os.path.join(p, 'triton') for p in places]
            found = any(os.path.exists(os.path.join(p, marker)) for p in places)
            time.sleep(0.1)
        os.makedirs(os.path.join(cache, 'seen'))
        with open(os.path.join(cache, 'seen', 'yes' if found else 'no'), 'w') as f:
            f.write('.')
    if role == 'check' and os.path.exists(os.path.join(cache, 'seen', 'yes')):
        ok = False
    """
    finish = warmer.Warmer.finish

    def finishing(self):  # the warmer's look (three seconds) is over before its cache is read
        end = time.monotonic() + 20
        while self.thread.is_alive() and self.warmed == 0 and time.monotonic() < end:
            time.sleep(0.02)
        return finish(self)
    monkeypatch.setattr(warmer.Warmer, "finish", finishing)
    result = harness.check(RMSNORM, _candidate(tmp_path, harness, "warmer_spies", block, "_WROTE = []\n"),
                           _options())
    assert result.accepted, result.message
    assert _robustness(result)["planted"] == 1  # 'seen/no': the channel through the plant worked, and found nothing


def test_the_warmer_does_no_work_while_another_check_holds_the_gpu_alone(harness, tmp_path, monkeypatch):
    """The warmer's first call starts a thread that works on (here it writes a heartbeat into its cache every 20 ms;
    on a GPU it would launch kernels) and returns: the call fails (a thread left running), and the warmer's process
    is killed at that failure, so none of its processes is alive when, next, another check holds the GPU's gate alone
    for its timing. (Left alive until the robustness stage, the thread would work on outside every gate, unreported:
    in the check's own process the same thread gets the candidate rejected.)"""
    block = """
    if role == 'warmer' and not _STARTED:
        def beat():
            os.makedirs(os.path.join(cache, 'HB'), exist_ok=True)
            for _ in range(400):
                with open(os.path.join(cache, 'HB', 't%d' % time.time_ns()), 'w') as f:
                    f.write('.')
                time.sleep(0.02)
        _STARTED.append(threading.Thread(target=beat, daemon=True))
        _STARTED[0].start()
    """
    gate = GpuGate()
    alive_in_window, trees, kills = [], [], []
    correctness = stage_runners.correctness
    end_ = warmer.Warmer._end

    def ending(self, read):
        if not self._killed:
            trees.append(process_tree(self.run.child.pid))
            kills.append("at its work's end" if read else "at a failure" if not self.closed else "by the check")
        return end_(self, read)
    monkeypatch.setattr(warmer.Warmer, "_end", ending)

    def other_check_times_first(h, run, reference, first):
        end = time.monotonic() + 20
        while run.warmer.thread.is_alive() and time.monotonic() < end:  # its first call returned (and failed)
            time.sleep(0.02)
        with gate.exclusive("another candidate", "time"):
            alive_in_window.extend(p for tree in trees for p in tree if _alive(p))
        return correctness(h, run, reference, first)
    monkeypatch.setattr(stage_runners, "correctness", other_check_times_first)
    source = _candidate(tmp_path, harness, "warmer_background_thread", block, "_STARTED = []\n")
    result = harness.check(RMSNORM, source, _options(gate=gate))
    assert result.accepted, result.message
    assert kills == ["at a failure"], kills
    assert not alive_in_window, f"the warmer's processes {alive_in_window} were alive while another check timed"
    assert _robustness(result)["warmed"] == 0


def test_the_warmer_s_memory_counts_against_the_candidate_s_bound(monkeypatch, tmp_path):
    """CRUCIBLE_MEMORY_GIB=1 bounds "a candidate" (sandbox/memory.py: a memory bound per candidate). The candidate
    writes 600 MiB into its scratch tmpfs at import (pages its group is charged for; a tensor of that size in its
    module would be copied by the state checks), in both of its processes: 1.2 GiB together. The warmer's process is
    in the check's process's control group, so the one bound covers the two (given a group of its own, each would
    fit its bound and the candidate would hold twice it); the check is accepted or rejected for its memory bound."""
    block = "pass\n"
    prelude = ("with open('ballast.bin', 'wb') as _f:  # 600 MiB of the scratch tmpfs: charged to the process's group\n"
               "    for _ in range(600):\n        _f.write(b'\\1' * (1 << 20))\n")
    groups = []
    start = warmer.Warmer.start

    def starting(self):
        started = start(self)
        if started:  # both processes alive: where each is charged, once the new one has left the zygote's group
            end = time.monotonic() + 5
            while _group_of(self.run.child.pid) == _group_of(os.getpid()) and time.monotonic() < end:
                time.sleep(0.01)
            groups.append((_group_of(self.main.child.pid), _group_of(self.run.child.pid)))
        return started
    monkeypatch.setattr(warmer.Warmer, "start", starting)
    with _own_harness(monkeypatch, tmp_path, CRUCIBLE_MEMORY_GIB="1") as h:
        result = h.check(RMSNORM, _candidate(tmp_path, h, "ballast", block, prelude), _options())
    walls = result.stages[1].details.get("walls") or {}
    if not walls.get("memory_bound_bytes"):
        pytest.skip("no memory control group on this machine")
    [(mine, its)] = groups
    assert mine and mine == its, f"the check's process is charged to {mine}, its warmer to {its}"
    assert result.accepted or "memory bound" in result.message, result.message


def _group_of(pid: int) -> str:
    """The memory control group `pid` is charged to ('' where there is none)."""
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return ""
    v1 = [line.split(":", 2)[2] for line in lines if "memory" in line.split(":", 2)[1].split(",")]
    v2 = [line[3:] for line in lines if line.startswith("0::")]
    return (v1 or v2 or [""])[0]


# ---- the plant in the check's own process ----------------------------------------------------------------------

def _linked_cache_block(target_expr: str) -> str:
    """The check's process links a kernel directory of its cache, 'esc', to `target_expr` (made from C past the
    audit hook); the warmer's cache holds a real 'esc/evil.pth'. After the plant the check's process answers wrongly
    where the file landed at the link's target."""
    return f"""
    target = {target_expr}
    if role == 'check' and not _LINKED:
        _LINKED.append(True)
        if target.startswith(os.getcwd()):
            os.makedirs(target, exist_ok=True)
        ctypes.pythonapi.symlink(target.encode(), os.path.join(cache, 'esc').encode())
    if role == 'warmer' and not os.path.exists(os.path.join(cache, 'esc')):
        os.makedirs(os.path.join(cache, 'esc'))
        with open(os.path.join(cache, 'esc', 'evil.pth'), 'w') as f:
            f.write('import os; os.environ["CRUCIBLE_OWNED"] = "1"\\n')
    if role == 'check' and os.path.exists(os.path.join(target, 'evil.pth')):
        ok = False
    """


def test_the_plant_cannot_write_to_the_host_through_a_link_in_the_check_s_cache(harness, tmp_path):
    """The check's process links 'esc' in its cache to a directory of the host (a site-packages, say: a .pth file
    there runs in every later Python process, the parent's included). The plant runs as trusted code (the audit hook
    stands aside) and follows the link, but the read-only mounts stop the write: nothing reaches the host."""
    outside = tmp_path / "host-site-packages"
    outside.mkdir()
    block = _linked_cache_block(repr(str(outside)))
    result = harness.check(RMSNORM, _candidate(tmp_path, harness, "links_cache_to_host", block, "_LINKED = []\n"),
                           _options())
    walls = result.stages[1].details.get("walls") or {}
    assert not (outside / "evil.pth").exists(), f"the warmer's file was written on the host (walls: {walls})"
    assert result.accepted, result.message
    assert _robustness(result)["planted"] == 0  # the write through the link failed (EROFS), and the plant with it


def test_the_plant_writes_nothing_outside_the_check_s_cache(harness, tmp_path):
    """As above with the link's target inside the check's own scratch (which the mounts leave writable): the plant
    puts the warmer's file there, outside the Triton cache it was meant for, with the audit hook off."""
    block = _linked_cache_block("os.path.join(os.getcwd(), 'outside')")
    result = harness.check(RMSNORM, _candidate(tmp_path, harness, "links_cache_to_scratch", block, "_LINKED = []\n"),
                           _options())
    assert result.accepted, f"the plant followed the link out of the cache: {result.message[:300]}"


def test_plant_does_not_follow_a_linked_kernel_directory(tmp_path):
    """compiled.plant as the worker's _plant calls it, on a cache whose kernel directory 'esc' the candidate linked
    to a directory outside it."""
    cache, outside = tmp_path / "triton", tmp_path / "site-packages"
    cache.mkdir()
    outside.mkdir()
    (cache / "esc").symlink_to(outside)
    compiled.plant(str(cache), (("esc/evil.pth", b"import os\n"), (f"{KEY}/ok.bin", b"fine")))
    assert (cache / KEY / "ok.bin").read_bytes() == b"fine"
    assert not (outside / "evil.pth").exists(), "plant wrote through the link, outside the cache"
