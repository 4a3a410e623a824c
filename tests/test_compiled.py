"""A verified candidate's compiled kernels kept for its own later checks (sandbox/compiled.py): copied by source hash
into a fresh check's Triton cache, never to another source, and copied as untrusted data (regular files only, no
link followed, within caps)."""
import os
from pathlib import Path

from sandbox import compiled
from sandbox.compiled import CompiledStore, source_key

ROOT = Path(__file__).resolve().parent.parent


def _cache(root: Path, files: dict[str, bytes]) -> Path:
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return root


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_kept_kernels_reach_only_a_later_check_of_the_same_source(tmp_path):
    store = CompiledStore(tmp_path / "store")
    files = {"ab12/_k.cubin": b"\x7fELF...", "ab12/_k.json": b"{}", "__grp__ab12/g.json": b"[]"}
    cache = _cache(tmp_path / "first", files)
    key = source_key(b"class ModelNew: ...")
    assert store.keep(key, cache)
    assert not store.keep(key, cache)  # kept once
    fresh = tmp_path / "second"
    fresh.mkdir()
    assert store.seed(key, fresh) == 3 and _tree(fresh) == files
    other = tmp_path / "other"
    other.mkdir()
    assert store.seed(source_key(b"class ModelNew: ... # changed"), other) == 0 and _tree(other) == {}
    (fresh / "ab12/_k.cubin").write_bytes(b"planted")  # the later check's process writes to its own copy only
    again = tmp_path / "third"
    again.mkdir()
    assert store.seed(key, again) == 3 and _tree(again) == files


def test_an_empty_cache_is_not_kept(tmp_path):
    store = CompiledStore(tmp_path / "store")
    (tmp_path / "empty" / "sub").mkdir(parents=True)
    assert not store.keep("k", tmp_path / "empty")
    assert store.seed("k", tmp_path) == 0


def test_links_and_special_files_in_the_cache_are_neither_followed_nor_copied(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_bytes(b"the parent's secret")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "x").write_bytes(b"outside")
    cache = _cache(tmp_path / "cache", {"k/_k.cubin": b"kernel"})
    os.symlink(secret, cache / "k" / "leak.cubin")
    os.symlink(outside, cache / "linked_dir")
    os.mkfifo(cache / "k" / "pipe")  # opening it for reading would block the parent: never opened
    store = CompiledStore(tmp_path / "store")
    assert store.keep("key", cache)
    dest = tmp_path / "dest"
    dest.mkdir()
    assert store.seed("key", dest) == 1
    assert _tree(dest) == {"k/_k.cubin": b"kernel"}
    assert not any(p.is_symlink() for p in dest.rglob("*"))
    # the cache directory itself replaced by a link: nothing is kept
    os.symlink(outside, tmp_path / "cache_link")
    assert not store.keep("other", tmp_path / "cache_link")


def test_caches_past_the_caps_are_not_kept_and_the_oldest_go_first(tmp_path, monkeypatch):
    store = CompiledStore(tmp_path / "store")
    monkeypatch.setattr(compiled, "MAX_BYTES", 100)
    assert not store.keep("big", _cache(tmp_path / "big", {"a": b"x" * 60, "b": b"y" * 60}))
    deep = tmp_path / "deep" / "/".join("d" * (compiled.MAX_DEPTH + 1))
    deep.mkdir(parents=True)
    (deep / "f").write_bytes(b"1")
    assert not store.keep("deep", tmp_path / "deep")  # past MAX_DEPTH levels
    assert store.keep("shallow", _cache(tmp_path / "shallow", {"/".join("d" * compiled.MAX_DEPTH) + "/f": b"1"}))
    monkeypatch.setattr(compiled, "MAX_FILES", 2)
    assert not store.keep("many", _cache(tmp_path / "many", {"a": b"1", "b": b"2", "c": b"3"}))
    empty_dirs = tmp_path / "dirs"
    for i in range(3):
        (empty_dirs / f"e{i}").mkdir(parents=True)
    (empty_dirs / "e0" / "f").write_bytes(b"1")
    assert not store.keep("dirs", empty_dirs)  # directories count as entries too
    monkeypatch.setattr(compiled, "TOTAL_BYTES", 100)
    for i in range(3):
        assert store.keep(f"k{i}", _cache(tmp_path / f"c{i}", {"f": b"z" * 40}))
    dest = [tmp_path / f"d{i}" for i in range(3)]
    for d in dest:
        d.mkdir()
    assert [store.seed(f"k{i}", d) for i, d in enumerate(dest)] == [0, 1, 1]  # 120 bytes > 100: k0 went
    assert store.seed("shallow", tmp_path) == 0  # went before them


def test_a_check_starts_with_its_own_sources_kept_kernels(tmp_path, monkeypatch):
    """Through the harness: the compile stage says how many kept files the candidate's cache started with; the
    verdict is the same as without them."""
    from sandbox.harness import CheckOptions, Harness
    from sandbox.task import load_task

    store = CompiledStore(tmp_path / "store")
    monkeypatch.setattr(compiled, "STORE", store)
    candidate = ROOT / "tests" / "candidates" / "rmsnorm_honest.py"
    store.keep(source_key(candidate.read_bytes()), _cache(tmp_path / "earlier", {"h/_k.json": b"{}",
                                                                                "h/_k.cubin": b"k"}))
    task = load_task(ROOT / "tasks" / "rmsnorm_fwd.py").scaled_for_cpu()
    with Harness("cpu") as harness:
        result = harness.check(task, candidate, CheckOptions(device="cpu", timeout_s=120))
    assert result.accepted, result.message
    compile_stage = next(s for s in result.stages if s.stage.value == "compile")
    assert compile_stage.details["cache_seeded_files"] == 2

