"""The benchmark suite (benchmarks/suite.py) and the results page (benchmarks/results_page.py), on the CPU: the row
list and dry run, the CSV lines a `Harness.bench` report becomes, the page written from a small CSV, and the
integrity of the CSV kept in the repository. Timing itself needs a GPU and is not tested here."""
from __future__ import annotations

import csv
import xml.dom.minidom
from pathlib import Path

import pytest

from benchmarks import results_page, suite
from seeds.registry import all_seeds

ROOT = Path(__file__).resolve().parent.parent


def test_list_names_every_row_with_its_registered_seed(capsys):
    assert suite.main(["--list"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == len(suite.SUITE)
    registered = {task: seed.path for seed in all_seeds() for task in seed.tasks}
    for line, bench in zip(out, suite.SUITE):
        name, task, candidate = line.split()[:3]
        assert (name, task) == (bench.name, bench.task)
        assert candidate == str(registered[Path(bench.task).name].relative_to(ROOT))


def test_suite_rows_are_unique_and_their_tasks_exist():
    names = [b.name for b in suite.SUITE]
    assert len(names) == len(set(names))
    for b in suite.SUITE:
        assert b.task_path().is_file(), b.task
        assert set(b.baselines) <= set(suite.ALL), b.name


def test_dry_run_prints_the_bench_command_and_writes_nothing(capsys, tmp_path):
    out_csv = tmp_path / "results.csv"
    assert suite.main(["--only", "rmsnorm_fwd", "--dry-run", "--out", str(out_csv)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == ("rmsnorm_fwd: crucible bench tasks/rmsnorm_fwd.py seeds/rmsnorm.py "
                      "--baselines eager,compile,liger")
    assert len(out) == 2 and not out_csv.exists()


def test_only_selects_by_exact_name_then_substring_then_pattern():
    assert [b.name for b in suite.select(suite.SUITE, "attention_fwd")] == ["attention_fwd"]
    assert [b.name for b in suite.select(suite.SUITE, "moe")] == [
        "moe_grouped_gemm", "moe_grouped_gemm_bwd", "moe_layer_deepseek", "moe_layer_mixtral"]
    assert [b.name for b in suite.select(suite.SUITE, "adamw*,rope_bwd")] == ["rope_bwd", "adamw", "adamw_224m"]


def test_dry_run_of_constants_row_passes_them_to_bench(capsys):
    assert suite.main(["--only", "adamw_224m", "--dry-run"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.endswith("--set N0=56000000 --set N1=56000000 --set N2=56000000 --set N3=56000000")


def test_unknown_row_is_one_sentence(capsys):
    assert suite.main(["--only", "no_such_row"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "no row matches" in err


def _report(problems=()):
    """A report shaped as profiler.report.build_timing returns it: the candidate and two baselines."""
    vs = lambda s, lo, hi, v: {"speedup": s, "ci_low": lo, "ci_high": hi, "verdict": v}  # noqa: E731
    return {
        "environment": {"gpu": {"name": "NVIDIA H200"}, "driver": "580.1", "cuda": "13.0", "torch": "2.11.0",
                        "triton": "3.6.0", "liger_kernel": None},
        "measurement": {"burst": 1, "reps": 30},
        "problems": list(problems),
        "rows": [
            {"impl": "candidate", "ms": 0.0700123456, "iqr_ms": 0.0004, "gbps": 3834.2, "tflops": 0.1,
             "pct_of_roofline": 92.5, "note": "",
             "vs": {"eager": vs(1.2, 1.19, 1.21, "faster"), "liger": vs(0.99, 0.98, 1.01, "no significant difference")}},
            {"impl": "eager", "ms": 0.084, "iqr_ms": 0.001, "gbps": 3195.0, "tflops": 0.1, "pct_of_roofline": 77.0,
             "note": "", "vs": {"liger": vs(0.83, 0.82, 0.84, "slower")}},
            {"impl": "liger", "ms": None, "iqr_ms": None, "gbps": None, "tflops": None, "pct_of_roofline": None,
             "note": "liger-kernel is not installed", "vs": {}},
        ],
    }


def test_csv_lines_one_per_comparison_with_the_environment():
    bench = suite.SUITE[0]
    lines = suite.csv_lines(bench, _report(), date="2026-12-03T10:00:00+00:00", commit="abc123", impl_name="seed")
    assert [(ln["impl"], ln["vs"]) for ln in lines] == [("seed", "eager"), ("seed", "liger"), ("eager", "liger"),
                                                         ("liger", "")]
    seed = lines[0]
    assert (seed["gpu"], seed["driver"], seed["liger"], seed["timing_mode"]) == ("NVIDIA H200", "580.1", "", "isolated")
    assert (seed["ms"], seed["speedup"], seed["status"], seed["source"]) == ("0.0700123", "1.2", "accepted", "suite")
    assert lines[3]["status"] == "unavailable" and "not installed" in lines[3]["note"]


def test_rejected_candidate_is_one_line_with_the_reason():
    report = {"rows": [], "problems": [{"reason": "output_mismatch", "message": "3 elements outside the bound"}]}
    lines = suite.csv_lines(suite.SUITE[0], report, date="d", commit="c", impl_name="seed")
    assert len(lines) == 1
    assert lines[0]["status"] == "rejected" and lines[0]["note"] == "output_mismatch: 3 elements outside the bound"


def test_append_writes_the_header_once_and_refuses_other_columns(tmp_path):
    path = tmp_path / "r.csv"
    lines = suite.csv_lines(suite.SUITE[0], _report(), date="d", commit="c", impl_name="seed")
    suite.append(path, lines)
    suite.append(path, lines)
    rows = list(csv.reader(path.open()))
    assert rows[0] == suite.FIELDS and len(rows) == 1 + 2 * len(lines)
    other = tmp_path / "other.csv"
    other.write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="not the suite's"):
        suite.append(other, lines)


def test_page_shows_the_latest_measurement_history_and_rows_not_measured(tmp_path):
    path = tmp_path / "r.csv"
    old = suite.csv_lines(suite.SUITE[0], _report(), date="2026-12-01", commit="old111", impl_name="seed")
    new = [dict(ln, date="2026-12-02", commit="new222", ms="0.0650", speedup="1.31" if ln["vs"] == "eager" else
                ln["speedup"]) for ln in old]
    rejected = suite.csv_lines(suite.SUITE[1], {"rows": [], "problems": [{"reason": "timeout", "message": "slow"}]},
                               date="2026-12-02", commit="new222", impl_name="seed")
    suite.append(path, old + new + rejected)
    out = tmp_path / "results.md"
    assert results_page.main(["--csv", str(path), "--out", str(out)]) == 0
    text = out.read_text()
    summary = text.split("## Rows")[0]
    assert f"| [{suite.SUITE[0].name}](#{suite.SUITE[0].name}) | seed | 0.0650 |" in summary
    assert "0.99× [0.98, 1.01] n.s. vs Liger" in summary  # the strongest baseline: the lowest speedup
    assert f"[{suite.SUITE[1].name}](#{suite.SUITE[1].name}) | seed |" in summary and "rejected: timeout: slow" in summary
    assert "earlier measurements" in text and "old111" in text.split("## Rows")[1]
    assert "## Not measured yet" in text and f"- {suite.SUITE[2].name}:" in text
    for svg in ("results-speedup.svg", "results-roofline.svg"):
        doc = xml.dom.minidom.parse(str(tmp_path / svg))
        assert doc.documentElement.tagName == "svg"
        assert f"![{svg}]({svg})" in text


def test_page_refuses_a_csv_without_the_suite_columns(tmp_path, capsys):
    bad = tmp_path / "bad.csv"
    bad.write_text("x,y\n1,2\n")
    assert results_page.main(["--csv", str(bad), "--out", str(tmp_path / "p.md")]) == 2
    assert "does not have the suite's columns" in capsys.readouterr().err


def test_the_repository_csv_names_suite_rows_and_parses():
    """Every line of benchmarks/data/results.csv belongs to a suite row, names the row's task and constants, has a
    commit, GPU and source, and its numbers parse."""
    rows = {b.name: b for b in suite.SUITE}
    with suite.RESULTS.open(newline="") as fh:
        reader = csv.DictReader(fh)
        assert reader.fieldnames == suite.FIELDS
        lines = list(reader)
    assert lines
    for ln in lines:
        bench = rows[ln["row"]]
        assert (ln["task"], ln["constants"]) == (bench.task, bench.constants_text()), ln
        assert ln["commit"] and ln["gpu"] and ln["source"] and ln["impl"]
        assert ln["vs"] in ("",) + suite.ALL
        for key in ("ms", "iqr_ms", "gbps", "tflops", "pct_of_roofline", "speedup", "ci_low", "ci_high"):
            if ln[key]:
                float(ln[key])
        if ln["ci_low"]:
            assert float(ln["ci_low"]) <= float(ln["speedup"]) <= float(ln["ci_high"]), ln


def test_merge_appends_a_csv_written_elsewhere(tmp_path, capsys):
    elsewhere, here = tmp_path / "gpu.csv", tmp_path / "results.csv"
    lines = suite.csv_lines(suite.SUITE[0], _report(), date="d", commit="c", impl_name="seed")
    suite.append(elsewhere, lines)
    suite.append(here, lines[:1])
    assert suite.main(["--merge", str(elsewhere), "--out", str(here)]) == 0
    rows = list(csv.DictReader(here.open(newline="")))
    assert len(rows) == 1 + len(lines) and rows[1:] == lines
    bad = tmp_path / "bad.csv"
    bad.write_text("x\n1\n")
    assert suite.main(["--merge", str(bad), "--out", str(here)]) == 2
    assert "cannot merge" in capsys.readouterr().err


def test_run_hands_each_row_to_harness_bench_and_appends_its_lines(tmp_path, monkeypatch):
    """The GPU path's plumbing with the harness replaced: the task loaded with the row's constants, the seed's file
    and the row's baselines passed to Harness.bench, one row's failure recorded without stopping the next."""
    import torch

    import sandbox.harness

    calls = []

    class FakeHarness:
        def __init__(self, device):
            assert device == "cuda"

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def bench(self, task, candidate, *, baselines, gpu, timing_mode):
            calls.append((dict(task.overrides), Path(candidate).name, baselines, gpu, timing_mode))
            if len(calls) == 1:
                raise RuntimeError("CUDA out of memory")
            return _report()

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(sandbox.harness, "Harness", FakeHarness)
    out = tmp_path / "r.csv"
    assert suite.main(["--only", "adamw,adamw_224m", "--out", str(out), "--commit", "abc"]) == 1
    (c1, f1, b1, g1, m1), (c2, *_rest) = calls
    assert (f1, b1, g1, m1) == ("adamw.py", ("eager", "compile"), 0, "auto")
    assert c2 == dict.fromkeys(("N0", "N1", "N2", "N3"), 56_000_000) and c1 == {}
    rows = list(csv.DictReader(out.open(newline="")))
    assert rows[0]["row"] == "adamw" and rows[0]["status"] == "rejected" and "out of memory" in rows[0]["note"]
    assert {r["row"] for r in rows[1:]} == {"adamw_224m"} and rows[1]["commit"] == "abc"
