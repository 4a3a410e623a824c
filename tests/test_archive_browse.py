"""Browsing the archive: filters and sorting, show/diff/lineage/tasks, standalone export (run without crucible),
JSONL import/export with dedupe by uid, and reverify through the real harness on the CPU.

tests/data/h200_archive.db is a real archive written on the H200 (rmsnorm_fwd: the seed and a tuner child, both
timed; a tuner proposal and a swiglu seed interrupted when the run was stopped). It is copied before use: opening
an archive applies migrations.
"""
import ast
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from agent.archive import schema
from agent.archive.records import Candidate, Reverification, Timings
from agent.archive.store import Archive
from agent.archive.browse import BrowseError, Query, diff, lineage, resolve, select, task_summaries
from agent.cli import main
from agent.archive.export import ExportError, standalone
from agent.archive.reverify import reverify
from agent.archive.transfer import TransferError, dump_file, load_file
from sandbox.task import load_task
from sandbox.tolerance import compare

ROOT = Path(__file__).resolve().parents[1]
H200_DB = Path(__file__).parent / "data" / "h200_archive.db"
CPU_ENV = {"device": "cpu", "torch": torch.__version__, "triton": __import__("triton").__version__,
           "network_isolated": True, "constants": {"M": 256, "N": 512}}


@pytest.fixture
def h200(tmp_path) -> Path:
    path = tmp_path / "h200.db"
    shutil.copy(H200_DB, path)
    return path


def timed(speed, low, high, roof=80.0, **kw):
    return dict(timed=True, timings=Timings(candidate_ms=0.1 / speed, speedup_eager=speed, eager_ci_low=low,
                                            eager_ci_high=high, pct_roofline=roof), **kw)


def make(a: Archive, **kw) -> Candidate:
    base = dict(task_path="/elsewhere/tasks/softmax_fwd.py", task_hash="s1", origin="llm", proposer="openai:gpt-x",
                verdict="rejected", reason="output_mismatch", stage="correctness", env=CPU_ENV)
    base.update(kw)
    if base["verdict"] == "accepted":
        base.update(reason="ok", stage=kw.get("stage", "robustness"))
        base.setdefault("source", f"# kernel {len(a.candidates())}\nimport triton\n")
    return a.add(Candidate(**base))


@pytest.fixture
def family(tmp_path):
    """A softmax family: seed -> two LLM children -> a crossover of both -> a rejected fix; plus a tuner child."""
    path = tmp_path / "family.db"
    with Archive(path) as a:
        seed = make(a, origin="seed", proposer="seed", verdict="accepted", created="2026-11-01T09:00:00+00:00",
                    source="import triton\nBLOCK = 128\nWARPS = 4\n", **timed(1.00, 0.98, 1.02))
        fast = make(a, parent_id=seed.id, verdict="accepted", created="2026-11-02T09:00:00+00:00",
                    source="import triton\nBLOCK = 256\nWARPS = 4\n", **timed(1.40, 1.20, 1.60, roof=70.0))
        steady = make(a, parent_id=seed.id, verdict="accepted", proposer="anthropic:claude-y",
                      created="2026-11-03T09:00:00+00:00", source="import triton\nBLOCK = 128\nWARPS = 8\n",
                      **timed(1.35, 1.30, 1.40, roof=88.0))
        cross = make(a, parent_id=fast.id, parent2_id=steady.id, verdict="accepted", origin="tuner", proposer="tuner",
                     created="2026-11-04T09:00:00+00:00", source="import triton\nBLOCK = 256\nWARPS = 8\n",
                     **timed(1.20, 1.10, 1.30))
        broken = make(a, parent_id=cross.id, created="2026-11-05T09:00:00+00:00",
                      source="import triton\nBLOCK = 512\nWARPS = 8\n")
        other = make(a, task_path="/elsewhere/tasks/rope_fwd.py", task_hash="r1", verdict="accepted",
                     origin="seed", proposer="seed", created="2026-11-05T10:00:00+00:00")
    return path, dict(seed=seed, fast=fast, steady=steady, cross=cross, broken=broken, other=other)


def cli(capsys, *args) -> tuple[int, str, str]:
    code = main(["archive", *map(str, args)])
    out = capsys.readouterr()
    return code, out.out, " ".join(out.err.split())  # errors are one sentence; rich wraps them at 80 columns


# ---- list, show, diff, lineage, tasks -------------------------------------------------------------------------
def test_list_filters_and_sorts(family, capsys):
    path, f = family
    with Archive(path) as a:
        assert [c.id for c in select(a, Query(task="softmax_fwd", verdict="accepted", sort="speedup"))] == \
            [f["steady"].id, f["fast"].id, f["cross"].id, f["seed"].id]  # by the CI's lower end: 1.30 > 1.20 > 1.10
        assert [c.id for c in select(a, Query(proposer="claude"))] == [f["steady"].id]
        assert [c.id for c in select(a, Query(proposer="tuner"))] == [f["cross"].id]
        assert [c.id for c in select(a, Query(since="2026-11-03", until="2026-11-04"))] == \
            [f["steady"].id, f["cross"].id]
        assert [c.id for c in select(a, Query(since="2026-11-05T09:30"))] == [f["other"].id]
        assert len(select(a, Query(sort="speedup", limit=2))) == 2
        for bad in (dict(sort="fastest"), dict(since="yesterday"), dict(limit=0)):
            with pytest.raises(BrowseError):
                Query(**bad)
    code, out, _ = cli(capsys, "list", "--verdict", "rejected", "--json", "--archive", path)
    rows = json.loads(out)
    assert code == 0 and [r["id"] for r in rows] == [f["broken"].id] and rows[0]["reason"] == "output_mismatch"
    code, out, _ = cli(capsys, "list", "--sort", "speedup", "--limit", "1", "--json", "--archive", path)
    assert [r["id"] for r in json.loads(out)] == [f["steady"].id] and json.loads(out)[0]["speedup"] == 1.35
    code, _, err = cli(capsys, "list", "--since", "2026-02-30", "--archive", path)
    assert code == 2 and "is not a date" in err


def test_show_has_verdict_timings_environment_lineage_and_source(h200, capsys):
    code, out, _ = cli(capsys, "show", "38a449fa", "--archive", h200)  # a uid prefix
    text = " ".join(out.split())
    assert code == 0
    assert "#2 (38a449fa" in text and "accepted at timing (ok)" in text
    assert "1.16x (95% CI 1.15-1.16) vs eager PyTorch" in text and "90% of roofline" in text
    assert "NVIDIA H200, driver 580.159.04, CUDA 13.0, torch 2.11.0+cu130, triton 3.6.0" in text
    assert "#1 -> #2" in text and "children #3" in text
    assert "robustness" in text and "0.0839" in text  # the stage table and the eager baseline's time
    assert "_rmsnorm_fwd_kernel" in text and "registers" in text
    assert "def _rmsnorm_fwd_kernel" in out  # the highlighted source
    code, out, _ = cli(capsys, "show", "2", "--json", "--archive", h200)
    record = json.loads(out)
    assert record["timings"]["eager_ci_low"] == pytest.approx(1.1477, abs=1e-3) and record["reverifications"] == []
    for ref, sentence in (("#999", "no candidate #999"), ("abc", "not a candidate"),
                          ("ffffff", "no candidate with uid")):
        code, _, err = cli(capsys, "show", ref, "--archive", h200)
        assert code == 2 and sentence in " ".join(err.split()) and "Traceback" not in err


def test_a_uid_prefix_of_digits_names_its_candidate_and_an_id_stays_an_id(tmp_path, capsys):
    """One uid in forty begins with eight decimal digits: such a prefix must find its candidate, not "no candidate
    #12345678"; a number that is both an id and a uid prefix is refused as ambiguous, and `#N` is always the id."""
    with Archive(tmp_path / "a.db") as a:
        first = make(a, uid="0123456789abcdef0123456789abcdef")
        second = make(a, uid="000002" + "1" * 26)
        assert second.id == 2 and resolve(a, "01234567").uid == first.uid
        assert resolve(a, "1").id == resolve(a, "#1").id == 1
        with pytest.raises(BrowseError, match="both candidate #000002 and a uid prefix"):
            resolve(a, "000002")
        assert resolve(a, "#000002").uid == second.uid  # the id, said so
        assert resolve(a, "0000021").uid == second.uid  # no #21, so the uid
        with pytest.raises(BrowseError, match="no candidate #111111"):
            resolve(a, "#111111")
        with pytest.raises(BrowseError, match="no candidate with uid"):
            resolve(a, "99999999")
    code, out, _ = cli(capsys, "show", "01234567", "--archive", tmp_path / "a.db")
    assert code == 0 and f"#{first.id} (01234567" in " ".join(out.split())


def test_diff_and_lineage_follow_both_parents(family, capsys):
    path, f = family
    with Archive(path) as a:
        a_, b_ = resolve(a, str(f["fast"].id)), resolve(a, f"#{f['cross'].id}")
        text = diff(a_, b_)
        assert "-WARPS = 4\n+WARPS = 8\n" in text and "BLOCK" not in text.replace(" BLOCK = 256", "")
        assert diff(a_, a_) == ""
        chain, tree = lineage(a, resolve(a, str(f["cross"].id)))
        assert [c.id for c in chain] == [f["seed"].id, f["fast"].id]
        assert [n.candidate.id for n in tree.children] == [f["broken"].id]
        _, below_seed = lineage(a, resolve(a, str(f["seed"].id)))
        fast_node, steady_node = below_seed.children
        # The crossover hangs under both parents; under the second it is marked as such.
        assert [(n.candidate.id, n.second_parent) for n in fast_node.children] == [(f["cross"].id, False)]
        assert [(n.candidate.id, n.second_parent) for n in steady_node.children] == [(f["cross"].id, True)]
    code, out, _ = cli(capsys, "lineage", f["cross"].id, "--archive", path)
    lines = out.splitlines()
    assert code == 0 and lines[0].startswith(f"#{f['seed'].id} seed")
    assert f"#{f['cross'].id} tuner accepted 1.20x (crossover with #{f['steady'].id})" in out
    assert lines.index(next(l for l in lines if f"#{f['broken'].id} " in l)) > \
        lines.index(next(l for l in lines if f"#{f['cross'].id} " in l))
    code, out, _ = cli(capsys, "diff", f["seed"].id, f["steady"].id, "--archive", path)
    assert code == 0 and "-WARPS = 4" in out and "+WARPS = 8" in out and "1.35x" in out


def test_tasks_one_row_per_task(family, h200, capsys):
    path, f = family
    with Archive(path) as a:
        rows = {s.task: s for s in task_summaries(a)}
    soft = rows["softmax_fwd"]
    assert (soft.tried, soft.verified, soft.timed, soft.proposals) == (5, 4, 4, 4)
    assert soft.best.id == f["steady"].id and soft.best_speedup == 1.35 and soft.best_roofline == 88.0
    assert rows["rope_fwd"].best_speedup is None and rows["rope_fwd"].verified == 1
    code, out, _ = cli(capsys, "tasks", "--json", "--archive", h200)
    real = {r["task"]: r for r in json.loads(out)}
    assert real["rmsnorm_fwd"]["best_id"] == 2 and real["rmsnorm_fwd"]["best_pct_roofline"] == pytest.approx(90.2, 0.01)
    assert (real["rmsnorm_fwd"]["tried"], real["rmsnorm_fwd"]["verified"]) == (2, 2)  # the interrupted one not tried
    assert real["swiglu_fwd"]["best_id"] is None and real["swiglu_fwd"]["tried"] == 0


def test_real_archive_migrates_to_the_reverification_schema(h200):
    with Archive(h200) as a:
        assert a.schema_version() == len(schema.MIGRATIONS) >= 2
        assert len(a.candidates()) == 4 and a.reverifications() == []
        rev = a.add_reverification(Reverification(candidate_id=2, status="stale", note="slower now", verdict="accepted",
                                                  reason="ok", timed=True, timings=Timings(speedup_eager=1.0)))
        assert a.latest_status()[2].uid == rev.uid and a.get(2).verdict == "accepted"  # the record is unchanged
    with pytest.raises(ValueError):
        Reverification(candidate_id=1, status="confirmed", note="", verdict="rejected", reason="output_mismatch")


# ---- JSONL --------------------------------------------------------------------------------------------------
def test_jsonl_merge_of_two_machines_dedupes_by_uid(family, h200, tmp_path, capsys):
    path, f = family
    with Archive(path) as a:
        a.add_reverification(Reverification(candidate_id=f["cross"].id, status="confirmed", note="ok",
                                            verdict="accepted", reason="ok"))
    assert cli(capsys, "export", "-o", tmp_path / "a.jsonl", "--archive", path)[0] == 0
    assert cli(capsys, "export", "-o", tmp_path / "b.jsonl", "--archive", h200)[0] == 0
    merged = tmp_path / "merged.db"
    code, out, _ = cli(capsys, "import", tmp_path / "b.jsonl", tmp_path / "a.jsonl", "--archive", merged)
    out = " ".join(out.split())
    assert code == 0 and "added 6 candidates, 0 runs, 1 re-checks" in out and "added 4 candidates, 2 runs" in out
    code, out, _ = cli(capsys, "import", tmp_path / "a.jsonl", "--archive", merged)
    assert "added 0 candidates, 0 runs, 0 re-checks, 0 duels, 0 batches; skipped 7 already here" in " ".join(out.split())
    with Archive(merged) as m, Archive(path) as src:
        assert len(m.candidates()) == 10
        cross = m.by_uid(f["cross"].uid)[0]
        parents = [m.get(cross.parent_id), m.get(cross.parent2_id)]
        assert [p.uid for p in parents] == [f["fast"].uid, f["steady"].uid]  # relinked by uid, new local ids
        assert m.with_source(cross).source == src.get(f["cross"].id).source
        assert [r.status for r in m.reverifications(cross.id)] == ["confirmed"]
        child = m.by_uid("38a449fa")[0]
        assert m.get(child.parent_id).uid.startswith("dc62aece") and child.timings.eager_ci_high == \
            pytest.approx(1.1643, abs=1e-3) and child.env["gpu"]["name"] == "NVIDIA H200"
        assert {r.id for r in m.runs()} >= {"20261129-101436-rmsnorm_fwd-6400"}
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"kind": "header", "format": "crucible-archive/1"}\nnot json\n')
    with Archive(tmp_path / "x.db") as x, pytest.raises(TransferError, match="line 2 is not JSON"):
        load_file(x, bad)
    code, _, err = cli(capsys, "import", tmp_path / "missing.jsonl", "--archive", merged)
    assert code == 2 and "no such file" in err


def test_filtered_jsonl_keeps_only_that_task(family, tmp_path):
    path, f = family
    with Archive(path) as a:
        counts = dump_file(a, tmp_path / "rope.jsonl", task="rope_fwd.py")
    assert counts["candidate"] == 1
    with Archive(tmp_path / "r.db") as r:
        load_file(r, tmp_path / "rope.jsonl")
        assert [c.uid for c in r.candidates()] == [f["other"].uid]


# ---- standalone export ----------------------------------------------------------------------------------------
RUNNER = r"""
import importlib.util, sys
for pkg in ("seeds", "agent", "sandbox", "profiler"):
    sys.modules[pkg] = None  # any import of crucible's packages fails from here on
import torch
spec = importlib.util.spec_from_file_location("exported", sys.argv[1])
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
data = torch.load(sys.argv[2])
model = mod.ModelNew(*data["init"])
model.load_state_dict(data["state"])
out = model(*data["inputs"])
torch.save(list(out) if isinstance(out, tuple) else [out], sys.argv[3])
print(sys.path)
"""


@pytest.mark.parametrize("seed_file, task_file, consts", [
    ("rmsnorm.py", "rmsnorm_fwd.py", {"M": 7, "N": 96}),                   # imports seeds._common
    ("rmsnorm_residual.py", "rmsnorm_residual_fwd.py", {"M": 5, "N": 67}),  # seeds.rmsnorm -> seeds._common
])
def test_export_runs_without_crucible(tmp_path, capsys, seed_file, task_file, consts):
    source = (ROOT / "seeds" / seed_file).read_text()
    assert "from seeds." in source
    with Archive(tmp_path / "a.db") as a:
        cand = a.add(Candidate(task_path=str(ROOT / "tasks" / task_file), task_hash="t", origin="seed",
                               proposer="seed", verdict="accepted", reason="ok", stage="robustness", source=source,
                               env=CPU_ENV))
    out_py = tmp_path / "away" / "kernel.py"
    code, out, _ = cli(capsys, "export", cand.uid[:8], "-o", out_py, "--archive", tmp_path / "a.db")
    assert code == 0 and "vendored seeds." in " ".join(out.split())
    text = out_py.read_text()
    assert "from seeds" not in text and "import seeds" not in text
    flat = " ".join(text.split())
    assert "not timed" in flat and "CPU (Triton interpreter)" in flat and f"uid {cand.uid}" in flat
    assert "class ModelNew" in text and "@triton.jit" in text and "def as_rows" in text

    task = load_task(ROOT / "tasks" / task_file).with_constants(consts)
    ref = task.make_reference(3, "cpu")
    inputs = task.make_inputs(3, "normal")
    torch.save({"init": task.init_inputs(), "state": ref.state_dict(), "inputs": inputs}, tmp_path / "in.pt")
    (tmp_path / "away" / "run.py").write_text(RUNNER)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["TRITON_INTERPRET"] = "1"
    proc = subprocess.run([sys.executable, "run.py", "kernel.py", str(tmp_path / "in.pt"), str(tmp_path / "out.pt")],
                          cwd=out_py.parent, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    child_path = ast.literal_eval(proc.stdout.strip().splitlines()[-1])
    assert str(ROOT) not in child_path and "" not in child_path[1:]  # the repo was not on the child's path
    got = torch.load(tmp_path / "out.pt")
    with torch.no_grad():
        want = ref(*inputs)
    want = list(want) if isinstance(want, tuple) else [want]
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        mismatch = compare(f"out[{i}]", g, w)
        assert mismatch is None, mismatch.describe()


def test_export_refuses_what_cannot_stand_alone(tmp_path, capsys):
    with Archive(tmp_path / "a.db") as a:
        rejected = make(a, source="import triton\n")
        # row_block reads the module's MAX_ROW_BLOCK: vendored next to the candidate's own, it would read that one.
        clash = make(a, verdict="accepted", source="from seeds._common import row_block\n\nMAX_ROW_BLOCK = 8\n")
        missing = make(a, verdict="accepted", source="from seeds._common import no_such_helper\n")
        fine = make(a, verdict="accepted", source="from seeds._common import as_rows\n")
    with Archive(tmp_path / "a.db") as a:
        with pytest.raises(ExportError, match="only kernels the harness verified"):
            standalone(a.get(rejected.id))
        with pytest.raises(ExportError, match="defines MAX_ROW_BLOCK"):
            standalone(a.get(clash.id))
        with pytest.raises(ExportError, match="defines no 'no_such_helper'"):
            standalone(a.get(missing.id))
        assert "def as_rows" in standalone(a.get(fine.id)).text
    code, _, err = cli(capsys, "export", rejected.id, "-o", tmp_path / "k.py", "--archive", tmp_path / "a.db")
    assert code == 2 and "only kernels the harness verified" in " ".join(err.split())
    code, _, err = cli(capsys, "export", fine.id, "-o", tmp_path / "k.txt", "--archive", tmp_path / "a.db")
    assert code == 2 and "does not end in .py" in err


# ---- reverify -------------------------------------------------------------------------------------------------
def test_reverify_marks_stale_or_confirmed_through_the_harness(tmp_path, capsys):
    good = (ROOT / "seeds" / "rmsnorm.py").read_text()
    wrong = good.replace("y = x * rstd[:, None] * w[None, :]", "y = x * rstd[:, None] * w[None, :] * 1.05")
    assert wrong != good
    old_env = {**CPU_ENV, "triton": "2.0.0"}
    task = str(ROOT / "tasks" / "rmsnorm_fwd.py")
    with Archive(tmp_path / "a.db") as a:
        common = dict(task_path=task, task_hash="t", origin="tuner", proposer="tuner", verdict="accepted", reason="ok",
                      stage="robustness")
        still_good = a.add(Candidate(source=good, env=old_env, **common))
        gone_bad = a.add(Candidate(source=wrong, env=old_env, **common))  # verified under "triton 2.0"
        current = a.add(Candidate(source=good + "# same env\n", env=CPU_ENV, **common))
        on_gpu = a.add(Candidate(source=good + "# gpu\n", env={**CPU_ENV, "device": "cuda", "gpu": {"name": "H200"}},
                                 **{**common, "stage": "timing"}, **timed(1.2, 1.1, 1.3)))
        outcomes = {o.candidate.id: o for o in reverify(a, every=True)}
        assert outcomes[still_good.id].record.status == "confirmed"
        assert "triton 2.0.0 -> " in outcomes[still_good.id].note
        assert "task file has changed" in outcomes[still_good.id].note  # archived with task_hash "t"
        bad = outcomes[gone_bad.id].record
        assert bad.status == "stale" and bad.verdict == "rejected" and bad.reason == "output_mismatch"
        assert outcomes[current.id].action == "current" and outcomes[current.id].record is None
        if not torch.cuda.is_available():
            assert outcomes[on_gpu.id].action == "skipped" and "GPU" in outcomes[on_gpu.id].note
        assert a.get(gone_bad.id).verdict == "accepted"  # the original record is never rewritten
        assert [r.status for r in a.reverifications(gone_bad.id)] == ["stale"]
    # From the CLI: only the best per task by default; --force re-checks one measured here already; stale -> exit 1.
    code, out, _ = cli(capsys, "reverify", "--task", "rmsnorm_fwd.py", "--force", "--archive", tmp_path / "a.db")
    text = " ".join(out.split())
    assert code == 0 and "1 re-checked, 0 stale" in text  # the best untimed one; the GPU one is skipped here
    # the best untimed one is the earliest verified (the run's own order of best): re-checked a second time
    with Archive(tmp_path / "a.db") as a:
        assert [r.status for r in a.reverifications(still_good.id)] == ["confirmed", "confirmed"]
    shown = json.loads(cli(capsys, "show", gone_bad.id, "--json", "--archive", tmp_path / "a.db")[1])
    assert [r["status"] for r in shown["reverifications"]] == ["stale"] and shown["verdict"] == "accepted"
    code, out, _ = cli(capsys, "show", still_good.id, "--archive", tmp_path / "a.db")
    assert "re-check" in out and "confirmed" in out
    code, _, err = cli(capsys, "reverify", "--task", "nothing.py", "--archive", tmp_path / "a.db")
    assert code == 2 and "no verified candidates" in err
