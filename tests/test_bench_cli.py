"""`crucible bench` and the report it renders: the no-GPU sentence, the report's schema, the table, JSON and CSV."""
import csv
import json
import random
import sys
import types

import pytest
import torch

from agent.cli import main
from agent.commands import bench
from profiler.report import PROBLEM_REASONS, build_timing
from profiler.roofline import roofline
from sandbox.records import Reason

CEIL = {"copy_gbps": 4000.0, "matmul_tflops": {"bf16": 800.0}}
TASK = "tasks/rmsnorm_fwd.py"


def synthetic_measure(ms: dict[str, float], reps: int = 30, noise: float = 0.01, seed: int = 0,
                      **extra) -> dict:
    """A dict with profiler.timing.measure's layout, for report building without a GPU."""
    rng = random.Random(seed)
    drift = [1 + 0.05 * rng.random() for _ in range(reps)]  # shared by all functions in a round
    fns = {}
    for name, base in ms.items():
        times = [base * d * (1 + rng.gauss(0, noise)) for d in drift]
        fns[name] = {"ms": times, "stream_ms": times, "tail_ms": [0.01] * reps, "wall_ms": [t + 0.1 for t in times],
                     "input_set": [i % 40 for i in range(reps)], "flagged": [], "error": None, "inconsistent": False}
    out = {
        "schema": 1, "device": {"index": 0, "name": "fake", "l2_bytes": 50 << 20, "sm_count": 132},
        "config": {"reps": reps, "warmup": 5, "flush_bytes": 256 << 20, "n_input_sets": 40, "sample_every": 10,
                   "watch": next(iter(ms)), "graph": False},
        "l2": {"flush_bytes": 256 << 20, "persisting_reset": "cuCtxResetPersistingL2Cache", "persisting_error": None},
        "calibration": {"null_tail_ms": 0.01, "null_wall_ms": 0.1, "null_stream_ms": 0.002},
        "order": [list(ms) for _ in range(reps)], "fns": fns, "samples": [], "fingerprints": [],
        "fingerprint_mismatches": [], "tampered": [], "fatal": None, "warnings": [],
    }
    out.update(extra)
    return out


ROOF = roofline(4e8, 0, CEIL, "bf16")  # floor 0.1 ms


def test_no_gpu_is_one_sentence_and_exit_2(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["bench", TASK]) == 2
    err = capsys.readouterr().err.strip()
    assert err == bench.NO_GPU
    assert "Traceback" not in err
    assert main(["bench", "--ceilings"]) == 2


def test_report_schema_and_a_real_speedup():
    m = synthetic_measure({"candidate": 0.12, "eager": 0.36, "compile": 0.125})
    t = build_timing(m, candidate="candidate", roof=ROOF, environment={"torch": "x"},
                     baselines={"eager": {"available": True, "versions": {"torch": "x"}},
                                "compile": {"available": True}, "liger": {"available": False,
                                                                          "reason": "liger-kernel is not installed"}})
    assert set(t) >= {"candidate_ms", "baselines", "roofline", "kernels", "environment", "warnings", "problems",
                      "quarantined", "rows", "measurement"}
    assert t["candidate_ms"] == pytest.approx(0.12 * 1.025, rel=0.05)
    eager = t["baselines"]["eager"]
    assert set(eager) >= {"ms", "speedup", "ci_low", "ci_high", "significant", "verdict"}
    assert eager["verdict"] == "faster" and eager["significant"] and eager["ci_low"] > 2.5
    assert t["baselines"]["compile"]["verdict"] in ("no significant difference", "faster")
    assert t["baselines"]["liger"] == {**t["baselines"]["liger"], "available": False, "ms": None, "speedup": None}
    assert t["roofline"]["bound"] == "memory" and 70 < t["roofline"]["pct_of_roofline"] < 90
    assert t["problems"] == [] and not t["quarantined"]
    assert [r["impl"] for r in t["rows"]] == ["candidate", "eager", "compile", "liger"]
    assert t["rows"][1]["vs"]["compile"]["verdict"] == "slower"  # eager vs compile, a baseline row
    json.dumps(t)  # plain data all the way down


def test_no_candidate_reports_baselines_and_the_fastest_ones_roofline():
    t = build_timing(synthetic_measure({"eager": 0.4, "compile": 0.2}), candidate=None, roof=ROOF)
    assert t["candidate_ms"] is None and t["baselines"]["eager"]["speedup"] is None
    assert t["roofline"]["gbps"] == pytest.approx(4e8 / (t["baselines"]["compile"]["ms"] * 1e-3) / 1e9)
    assert t["rows"][0]["vs"]["compile"]["verdict"] == "slower"


def test_problems_carry_the_harness_reason_codes():
    assert set(PROBLEM_REASONS) <= {r.value for r in Reason}
    m = synthetic_measure({"candidate": 0.03, "eager": 0.3}, tampered=["torch.cuda.Event.elapsed_time"],
                          fingerprint_mismatches=[{"fn": "candidate", "call": 3, "input_set": 8}])
    m["fns"]["candidate"]["inconsistent"] = True
    m["fns"]["candidate"]["flagged"] = [{"call": i, "why": "tail", "excess_ms": 1.0} for i in range(20)]
    t = build_timing(m, candidate="candidate", roof=ROOF, output_problems=["call 10: out[0] mismatched"])
    reasons = [p["reason"] for p in t["problems"]]
    assert reasons.count("timing_output_mismatch") == 2
    assert {"timer_tampered", "timing_inconsistent", "faster_than_roofline"} <= set(reasons)
    assert t["quarantined"]  # 0.03 ms for 0.4 GB is 13 TB/s


def test_baseline_failures_are_warnings_not_candidate_problems():
    m = synthetic_measure({"candidate": 0.2, "eager": 0.3, "compile": 0.3})
    m["fns"]["compile"].update(ms=[], error={"type": "BackendCompilerFailed", "message": "boom", "traceback": ""})
    t = build_timing(m, candidate="candidate", roof=ROOF)
    assert t["problems"] == []
    assert any("compile raised" in w for w in t["warnings"])
    assert not t["baselines"]["compile"]["available"] and t["baselines"]["compile"]["ms"] is None


def test_unknown_candidate_name_is_refused():
    with pytest.raises(ValueError):
        build_timing(synthetic_measure({"eager": 1.0}), candidate="candidate")


# ---- the command's GPU path, with the harness replaced by one returning a synthetic report ----------------------------
SIZES: list[dict] = []  # the constants of each task the fake harness was handed


@pytest.fixture
def fake_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    calls = []

    class Harness:
        def __init__(self, device="auto"):
            assert device == "cuda"

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def bench(self, task, candidate, baselines=("eager",), gpu=0, timing_mode="auto"):
            calls.append((task.name, candidate, baselines, gpu, timing_mode))
            SIZES.append(task.current_constants())
            m = synthetic_measure({"candidate": 0.1, **{b: 0.2 for b in baselines}})
            if timing_mode == "sustained":
                m["config"].update(burst=10, settle_ms=100.0)
            return build_timing(m, candidate="candidate", roof=ROOF)

    monkeypatch.setitem(sys.modules, "sandbox.harness", types.SimpleNamespace(Harness=Harness))
    return calls


def test_bench_renders_table_and_writes_csv(fake_gpu, tmp_path, capsys):
    cand = tmp_path / "cand.py"
    cand.write_text("class ModelNew: pass\n")
    out_csv = tmp_path / "t.csv"
    assert main(["bench", TASK, str(cand), "--baselines", "eager,compile", "--csv", str(out_csv), "--gpu", "0",
                 "--timing-mode", "sustained"]) == 0
    assert fake_gpu == [("rmsnorm_fwd", cand, ("eager", "compile"), 0, "sustained")]
    text = capsys.readouterr().out
    assert "vs eager" in text and "GB/s" in text and "2.0" in text
    assert ("30 timed calls each, sustained: bursts of 10 back to back after 100 ms of untimed calls"
            in " ".join(text.split()))  # (rich wraps at the terminal's width)
    rows = list(csv.DictReader(out_csv.open()))
    cand_rows = [r for r in rows if r["impl"] == "candidate"]
    assert {r["vs"] for r in cand_rows} == {"eager", "compile"}
    assert all(float(r["speedup"]) > 1.5 and r["verdict"] == "faster" for r in cand_rows)


def test_bench_json(fake_gpu, capsys):
    assert main(["bench", TASK, "--json", "--baselines", "eager"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["baselines"]["eager"]["verdict"] == "faster"


def test_bench_set_times_the_task_at_another_size(fake_gpu):
    SIZES.clear()
    assert main(["bench", TASK, "--set", "N=512", "--set", "M=1_024"]) == 0
    assert SIZES[-1]["N"] == 512 and SIZES[-1]["M"] == 1024
    assert main(["bench", TASK]) == 0
    assert SIZES[-1]["N"] == 4096


@pytest.mark.parametrize("argv,needle", [
    (["bench", TASK, "--set", "N"], "write NAME=INTEGER"),
    (["bench", TASK, "--set", "N=big"], "write NAME=INTEGER"),
    (["bench", TASK, "--set", "HIDDEN=8"], "no integer constant named HIDDEN"),
    (["bench", TASK, "--baselines", "eager,triton"], "unknown baseline triton"),
    (["bench", "tasks/does_not_exist.py"], "does not exist"),
    (["bench", TASK, "no_such_candidate.py"], "does not exist"),
    (["bench", TASK, "--gpu", "3"], "--gpu 3 does not exist"),
    (["bench"], "give a TASK file"),
])
def test_bad_invocations_are_one_sentence_and_exit_2(fake_gpu, capsys, argv, needle):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err
    assert fake_gpu == []
