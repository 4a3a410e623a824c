"""Attacks on the kept compiled kernels (sandbox/compiled.py): what a hostile candidate can make the parent spend
reading its cache, and whether the key the parent hashes is the code the child runs. Each test failed before its
defence was built (the attack worked) and passes with it."""
import os
import shutil
import tempfile
import time
import tracemalloc
from pathlib import Path

import pytest

from sandbox import compiled
from sandbox.harness import CheckOptions, Harness

HERE = Path(__file__).parent
RMSNORM = HERE.parent / "tasks" / "rmsnorm_fwd.py"
HONEST = HERE / "candidates" / "rmsnorm_honest.py"
KEY = "C3QZLKX5UZ6OFMY2VQ7XMLE6JDLGXFQ4XKTVR7LK2ITB4OKYGF4A"  # a Triton cache directory's name


class _CountingOs:
    """compiled's `os`, counting the directory entries it is handed (listdir's names, scandir's entries)."""

    def __init__(self) -> None:
        self.entries = 0

    def __getattr__(self, name):
        return getattr(os, name)

    def listdir(self, *a, **k):
        names = os.listdir(*a, **k)
        self.entries += len(names)
        return names

    def scandir(self, *a, **k):
        it = os.scandir(*a, **k)
        counter = self

        class _It:
            def __enter__(self):
                return self

            def __exit__(self, *exc):
                it.close()

            def __iter__(self):
                for e in it:
                    counter.entries += 1
                    yield e

            def close(self):
                it.close()
        return _It()


@pytest.fixture
def tmpfs_dir():
    """A directory on a tmpfs where there is one (the candidate's scratch is a tmpfs), else on the test's disk."""
    base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    d = tempfile.mkdtemp(prefix="crucible-compiled-attack-", dir=base)
    try:
        yield Path(d)
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _hostile_cache(root: Path, links: int, empty_dirs: int) -> Path:
    """What a candidate can leave in its cache at ~4 us an entry: one kernel directory holding `links` hard links
    (no new inode, no byte of the tmpfs's size bound) under names outside the layout (a leading dot, 255 bytes),
    and `empty_dirs` kernel directories with valid names and no file. None of them is a file read_cache keeps, so
    neither MAX_FILES nor MAX_BYTES ever counts them."""
    cache = root / "triton"
    kernel = cache / KEY
    kernel.mkdir(parents=True)
    (kernel / ".x").write_bytes(b"")
    pad = "x" * 240
    for i in range(links):
        os.link(kernel / ".x", kernel / f".{pad}{i:010d}")
    for i in range(empty_dirs):
        os.mkdir(cache / f"{'K' * 100}{i}")
    return cache


def test_reading_a_cache_does_not_enumerate_unbounded_entries(tmpfs_dir, monkeypatch):
    """Rule: the parent never spends unbounded memory or CPU reading what the candidate left. A candidate can fill
    its cache with entries the parent skips (hard links under odd names, empty kernel directories), which caps on
    the files kept never count; listing them all happens outside any deadline, in the check's `finally`. Measured
    on the CPU: 1M such links cost the candidate 3.9 s and ~740 MB of kernel memory (charged to its own group), and
    a parent that lists them all 1.6 s and ~310 MB of Python heap, which is in no group, on every check slot at
    once. The defence: entries are counted as scandir yields them (kept or not, files and directories), and past
    compiled.MAX_ENTRIES nothing is kept."""
    cache = _hostile_cache(tmpfs_dir, links=60_000, empty_dirs=40_000)
    counting = _CountingOs()
    monkeypatch.setattr(compiled, "os", counting)
    result = compiled.read_cache(str(cache))
    bound = compiled.MAX_ENTRIES + 1  # the entry past the cap is the one read_cache stops at
    assert counting.entries <= bound, (
        f"read_cache enumerated {counting.entries:,} directory entries of a cache holding no file it keeps "
        f"(returned {result!r}); a bound of {bound:,} was expected")


def test_reading_a_cache_of_long_names_keeps_the_parent_s_memory_bounded(tmpfs_dir):
    """The same attack measured as memory: 100k names of 255 bytes in one kernel directory (~0.4 s for the
    candidate to make) would take ~30 MB of the parent's heap were they all held at once; the candidate's memory
    bound (16 GiB by default) is the only limit on how many there are."""
    cache = _hostile_cache(tmpfs_dir, links=100_000, empty_dirs=0)
    tracemalloc.start()
    try:
        t0 = time.monotonic()
        compiled.read_cache(str(cache))
        seconds = time.monotonic() - t0
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20, f"reading a cache with no file to keep took {peak / 2**20:.0f} MiB ({seconds:.2f} s)"


@pytest.fixture(scope="module")
def harness():
    with Harness("cpu") as h:
        yield h


def test_the_child_runs_the_bytes_the_parent_hashed_and_checked(harness, tmp_path, monkeypatch):
    """The parent hashes the candidate's bytes when the check starts (the key of its kept kernels, and the static
    stage's source). Were the child to import the file again by its path, bytes changed in between (by a host-side
    writer: the sandboxed candidates cannot write the file) would run under the hashed source's key, be given its
    kept kernels, and skip the static stage. The child runs the bytes the parent sent: here the file is replaced by
    code that would fail at import after the parent read it, and the check still runs the hashed source."""
    store = compiled.Store()
    monkeypatch.setattr(compiled, "STORE", store)
    hashed = HONEST.read_bytes()
    cand = tmp_path / "cand.py"
    cand.write_bytes(hashed)
    task = harness.load(RMSNORM)
    key = compiled.check_key(hashed, str(task.path), dict(task.overrides), "cpu")
    files = ((f"{KEY}/_rmsnorm_kernel.cubin", os.urandom(3000)), (f"{KEY}/_rmsnorm_kernel.json", b'{"n": 1}'))
    assert store.keep(key, files) == 2
    spawn = harness._spawn

    def swap_then_spawn(deadline):  # after the parent read and hashed the file, before the child imports it
        cand.write_bytes(b"raise SystemExit('the file was read again after the parent had checked it')\n")
        return spawn(deadline)
    monkeypatch.setattr(harness, "_spawn", swap_then_spawn)
    result = harness.check(RMSNORM, cand, CheckOptions(device="cpu", timeout_s=120))
    assert result.accepted, result.message
    assert result.stages[1].details["planted_files"] == 2  # the hashed source's own kernels, to the hashed source
