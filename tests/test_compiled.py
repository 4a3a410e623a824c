"""A verified candidate's compiled kernels kept for its own later checks (sandbox/compiled.py): what the parent reads
of a cache the candidate wrote, what it keeps and for whom, and the round trip through a real child's private
scratch tmpfs."""
import ctypes
import os
import shutil
import signal
import time
from pathlib import Path

import pytest

from sandbox import compiled
from sandbox.deadlines import CompileSigns
from sandbox.harness import CheckOptions, Harness
from sandbox.process import child_view

HERE = Path(__file__).parent
RMSNORM = HERE.parent / "tasks" / "rmsnorm_fwd.py"
HONEST = HERE / "candidates" / "rmsnorm_honest.py"
KEY = "C3QZLKX5UZ6OFMY2VQ7XMLE6JDLGXFQ4XKTVR7LK2ITB4OKYGF4A"  # a Triton cache directory's name


def test_only_triton_s_layout_is_a_valid_name():
    assert compiled.valid_name(f"{KEY}/_rmsnorm_kernel.cubin")
    assert compiled.valid_name(f"{KEY}/__grp___rmsnorm_kernel.json")
    for bad in ("x.cubin", f"{KEY}/sub/x.cubin", f"/{KEY}/x", f"{KEY}/..", f"{KEY}/.hidden", f"../{KEY}/x",
                f"{KEY}/a..b", f"{KEY}/x y", f"{KEY}/", f"/x", 7, None):
        assert not compiled.valid_name(bad), bad


def test_reading_a_cache_takes_its_regular_files_and_nothing_else(tmp_path):
    """What a hostile candidate may leave in its cache: links to host files and directories, a FIFO (opening it
    for reading would wait for a writer), deeper directories, odd names. Only Triton's own layout is read."""
    cache = tmp_path / "triton"
    kernel = cache / KEY
    kernel.mkdir(parents=True)
    (kernel / "k.cubin").write_bytes(b"\x7fELF kernel")
    (kernel / "k.json").write_text('{"name": "k"}')
    secret = tmp_path / "host_secret.txt"
    secret.write_text("not the candidate's")
    os.symlink(secret, kernel / "linked.json")
    os.symlink(tmp_path, cache / "LINKEDDIR")
    os.mkfifo(kernel / "pipe.json")
    (kernel / "deeper").mkdir()
    (kernel / "deeper" / "x.cubin").write_bytes(b"deep")
    (kernel / "odd name.json").write_text("{}")
    (cache / "top.cubin").write_bytes(b"not in a kernel directory")
    t0 = time.monotonic()
    files = compiled.read_cache(str(cache))
    assert time.monotonic() - t0 < 5  # the FIFO was not waited on
    assert files == ((f"{KEY}/k.cubin", b"\x7fELF kernel"), (f"{KEY}/k.json", b'{"name": "k"}'))
    os.rename(cache, tmp_path / "real")
    os.symlink(tmp_path / "real", cache)
    assert compiled.read_cache(str(cache)) is None  # the cache itself replaced by a link: nothing read
    assert compiled.read_cache(str(tmp_path / "missing")) is None


def test_a_cache_past_its_caps_is_not_kept(tmp_path, monkeypatch):
    kernel = tmp_path / KEY
    kernel.mkdir()
    for i in range(5):
        (kernel / f"k{i}.cubin").write_bytes(b"x" * 100)
    assert len(compiled.read_cache(str(tmp_path))) == 5
    monkeypatch.setattr(compiled, "MAX_FILES", 4)
    assert compiled.read_cache(str(tmp_path)) is None
    monkeypatch.setattr(compiled, "MAX_FILES", 4096)
    monkeypatch.setattr(compiled, "MAX_BYTES", 450)
    assert compiled.read_cache(str(tmp_path)) is None


def test_planting_writes_the_layout_and_nothing_outside_it(tmp_path):
    cache = tmp_path / "triton"
    cache.mkdir()
    (cache / KEY).mkdir()
    (cache / KEY / "there.json").write_bytes(b"already")
    files = ((f"{KEY}/k.cubin", b"bin"), (f"{KEY}/there.json", b"other"), ("../escape.txt", b"no"),
             (f"{KEY}/../../escape.txt", b"no"), (f"{KEY}/s", "not bytes"))
    assert compiled.plant(str(cache), files) == 1
    assert (cache / KEY / "k.cubin").read_bytes() == b"bin"
    assert (cache / KEY / "there.json").read_bytes() == b"already"
    assert not (tmp_path / "escape.txt").exists() and not (cache / "escape.txt").exists()


def test_planted_kernels_are_found_by_triton_s_own_cache_in_the_new_process_s_directory(tmp_path, monkeypatch):
    """Triton's group file names a kernel's files by absolute path, in the cache of the process that compiled it; a
    later process's cache is another directory, and a group whose files are not found there means compiling again.
    Planting moves the group to the new cache, and Triton's own cache manager then finds every file."""
    from triton.runtime import cache as triton_cache

    key = "ab" * 32
    old, new = tmp_path / "old" / "triton", tmp_path / "new" / "triton"
    monkeypatch.setenv("TRITON_CACHE_DIR", str(old))
    manager = triton_cache.get_cache_manager(key)
    group = {name: manager.put(data, name) for name, data in (("k.cubin", b"\x7fELF"), ("k.json", '{"name": "k"}'))}
    manager.put_group("k.json", group)
    files = compiled.read_cache(str(old))
    assert files is not None and len(files) >= 3
    shutil.rmtree(old)  # that process's tmpfs is gone with it
    new.mkdir(parents=True)
    monkeypatch.setenv("TRITON_CACHE_DIR", str(new))
    assert triton_cache.get_cache_manager(key).get_group("k.json") is None  # nothing planted: compile
    assert compiled.plant(str(new), files) == len(files)
    found = triton_cache.get_cache_manager(key).get_group("k.json")
    assert found is not None and set(found) == {"k.cubin", "k.json"}
    assert all(p.startswith(str(new)) and os.path.exists(p) for p in found.values())
    dir_name = next(iter(found.values())).split("/")[-2]
    for bad in (b"not json", b"[1, 2]", b'{"child_paths": {"k.cubin": "/etc/../x y"}}', b'{"child_paths": 3}'):
        assert compiled.plant(str(new), ((f"{dir_name}/__grp__bad.json", bad),)) == 0


def test_the_store_keeps_by_source_and_forgets_the_least_recently_used():
    store = compiled.Store(total_bytes=1000)
    a, b, c = (compiled.check_key(s, "task.py", {}, "cuda") for s in (b"a", b"b", b"c"))
    assert store.files(a) == ()
    assert store.keep(a, ((f"{KEY}/a.cubin", b"x" * 400),)) == 1
    assert store.keep(b, ((f"{KEY}/b.cubin", b"x" * 400),)) == 1
    assert store.files(a)  # a is now the most recently used
    assert store.keep(c, ((f"{KEY}/c.cubin", b"x" * 400),)) == 1
    assert store.files(b) == () and store.files(a) and store.files(c) and len(store) == 2
    assert store.keep(a, ((f"{KEY}/a2.cubin", b"x" * 100),)) == 1  # replaced, its bytes counted once
    assert store.files(a) == ((f"{KEY}/a2.cubin", b"x" * 100),)
    assert store.keep(b, (("../x", b"y"),)) == 0 and store.files(b) == ()  # a name outside the layout: nothing
    assert store.keep(b, None) == 0 and store.keep(b, ()) == 0
    assert store.keep(b, ((f"{KEY}/big.cubin", b"x" * 1001),)) == 0  # larger than the whole store


def _private_tmpfs_child(path: Path):
    """A child in a mount namespace of its own with a tmpfs over `path` (as the worker mounts over its scratch);
    it makes one more directory there each time it reads a byte from its pipe. (pid, pipe to it), or a skip."""
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(go_w)  # else its own copy keeps the pipe open: no end of file when the test closes it
        os.close(ready_r)
        libc = ctypes.CDLL(None, use_errno=True)
        ok = libc.unshare(0x00020000) == 0 and libc.mount(b"none", b"/", None, 16384 | (1 << 18), None) == 0 and \
            libc.mount(b"tmpfs", str(path).encode(), b"tmpfs", 2 | 4, b"size=1048576") == 0
        os.write(ready_w, b"1" if ok else b"0")
        n = 0
        while ok and os.read(go_r, 1):
            n += 1
            os.mkdir(path / f"KERNEL{n}")
            os.write(ready_w, b"1")
        os._exit(0)
    os.close(go_r)
    os.close(ready_w)
    if os.read(ready_r, 1) != b"1":
        os.waitpid(pid, 0)
        pytest.skip("no mount namespace here (needs CAP_SYS_ADMIN)")
    return pid, go_w, ready_r


def test_a_child_s_private_cache_is_read_through_its_own_view(tmp_path, monkeypatch):
    """The scratch directory is a tmpfs in the candidate's mount namespace: the host's directory stays empty. The
    signs of compilation (a deadline extends while kernels compile) look through the child's own view."""
    monkeypatch.setattr("sandbox.deadlines.POLL_S", 0.0)
    cache = tmp_path / "triton"
    cache.mkdir()
    pid, go, ready = _private_tmpfs_child(cache)
    try:
        signs = CompileSigns(cache, pid)
        assert signs() is None
        os.write(go, b"1")
        os.read(ready, 1)
        assert os.listdir(cache) == []  # the host sees nothing
        assert os.listdir(child_view(pid, cache)) == ["KERNEL1"]
        assert signs() is not None
    finally:
        os.close(go)
        os.close(ready)
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


@pytest.fixture(scope="module")
def harness():
    with Harness("cpu") as h:
        yield h


def test_a_verified_source_s_kernels_reach_its_later_checks_only(harness, tmp_path, monkeypatch):
    """Round trip through real children: what is kept for a source is written into its next check's own cache
    before the candidate is imported, and read back from that child's private scratch after it is verified; another
    source gets nothing."""
    store = compiled.Store()
    monkeypatch.setattr(compiled, "STORE", store)
    task = harness.load(RMSNORM)

    def key(source: bytes) -> str:
        return compiled.check_key(source, str(task.path), dict(task.overrides), "cpu")
    mine = key(HONEST.read_bytes())
    files = ((f"{KEY}/_rmsnorm_kernel.cubin", os.urandom(3000)), (f"{KEY}/_rmsnorm_kernel.json", b'{"n": 1}'))
    assert store.keep(mine, files) == 2
    opts = CheckOptions(device="cpu", timeout_s=120)
    result = harness.check(RMSNORM, HONEST, opts)
    assert result.accepted, result.message
    assert result.stages[1].details["planted_files"] == 2
    assert result.costs["kept_files"] == 2  # read back from the child's own tmpfs: the files it was given
    assert store.files(mine) == files
    fixed = harness.check(RMSNORM, HONEST, CheckOptions(device="cpu", timeout_s=120, seed=3))
    assert fixed.accepted and fixed.stages[1].details["planted_files"] == 0  # a fixed seed: the same inputs again
    other = tmp_path / "rmsnorm_other.py"
    other.write_bytes(HONEST.read_bytes() + b"\n# another source\n")
    result = harness.check(RMSNORM, other, opts)
    assert result.accepted, result.message
    assert result.stages[1].details["planted_files"] == 0
    assert result.costs["kept_files"] == 0  # the interpreter compiles nothing: an empty cache is not kept
    assert store.files(key(other.read_bytes())) == () and store.files(mine) == files
    assert key(HONEST.read_bytes()) != compiled.check_key(HONEST.read_bytes(), str(task.path), {"N": 64}, "cpu")


def test_a_retime_compares_the_first_call_and_skips_the_stages_its_earlier_check_passed(harness):
    """A duel's leg re-times a source the run verified in full: its first call is still compared (a source that is
    wrong there is rejected as ever), the other distributions, the shapes and the soak are not run again."""
    from sandbox.records import Reason, Stage

    opts = CheckOptions(device="cpu", timeout_s=120, retime=True)
    result = harness.check(RMSNORM, HONEST, opts)
    assert result.accepted, result.message
    assert [s.stage for s in result.stages] == [Stage.STATIC, Stage.COMPILE, Stage.SMOKE, Stage.CORRECTNESS]
    assert result.stages[-1].details == {"distributions": ["normal"], "retime": True}
    assert result.message.startswith("accepted: re-timed") and result.costs["calls"] == 1
    wrong = harness.check(HERE / "tasks" / "row_mean.py", HERE / "candidates" / "row_mean_zeros.py", opts)
    assert not wrong.accepted and wrong.stage is Stage.CORRECTNESS and wrong.reason is Reason.OUTPUT_MISMATCH
