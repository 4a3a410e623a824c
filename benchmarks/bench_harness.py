"""What `crucible check` costs per candidate: median wall time, and the harness's own share of it.

    python3 benchmarks/bench_harness.py --device cuda --n 5          # on the H200
    python3 benchmarks/bench_harness.py --device cpu --n 5           # here (interpreter)

The parent-side phases (spawn, inputs, reference, request = a call's round trip, compare, rebuild, close) are
printed too.
"harness" = wall time minus the candidate's own calls (its kernels, first-launch compilation included) minus the
timing stage: forking the process, confinement, importing the candidate, references, transfers and comparisons.
A fresh Python process per candidate would cost ~5.7 s before doing any work (ANCHORS.md).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--n", type=int, default=5)
    ap.add_argument("--task", default=str(ROOT / "tasks" / "rmsnorm_fwd.py"))
    ap.add_argument("--candidate", default=str(ROOT / "tests" / "candidates" / "rmsnorm_honest.py"))
    ap.add_argument("--timing", action="store_true", help="include the timing stage")
    args = ap.parse_args()
    if args.device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"
    from sandbox.harness import CheckOptions, Harness

    t0 = time.monotonic()
    harness = Harness(args.device)
    start_s = time.monotonic() - t0
    rows = []
    for i in range(args.n):
        r = harness.check(args.task, args.candidate, CheckOptions(timing=args.timing))
        assert r.accepted, r.message
        stages = {s.stage.value: s.seconds for s in r.stages}
        laps = {k: v for k, v in r.stages[1].details.items() if k.endswith("_s")}
        tlaps = {f"timing.{k}": v for k, v in ((r.timing or {}).get("laps") or {}).items()}
        rows.append({**r.costs, **{f"stage_{k}": v for k, v in stages.items()},
                     **{f"compile.{k}": v for k, v in laps.items()}, **tlaps})
        print(f"run {i}: total {r.costs['total_s']:.2f} s, candidate calls {r.costs['candidate_calls_s']:.2f} s "
              f"({int(r.costs['calls'])} calls), timing stage {r.costs['timing_stage_s']:.2f} s, harness "
              f"{r.costs['harness_s']:.2f} s | " + ", ".join(f"{k} {v:.2f}" for k, v in stages.items())
              + " | compile: " + ", ".join(f"{k} {v:.2f}" for k, v in laps.items()), flush=True)
    harness.close()
    keys = sorted({k for row in rows for k in row}, key=lambda k: (not k.endswith("_s") or "." in k, k))
    med = {k: statistics.median(row.get(k, 0.0) for row in rows) for k in keys}
    print(f"\nharness start (zygote: imports torch+triton once): {start_s:.2f} s")
    print(f"{'metric':28s} median over {args.n} checks ({args.device}, {Path(args.task).name})")
    for k, v in med.items():
        print(f"{k:28s} {v:8.3f}")


if __name__ == "__main__":
    main()
