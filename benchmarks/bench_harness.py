"""What `crucible check` costs per candidate: median wall time, and the harness's own share of it.

    python3 benchmarks/bench_harness.py --device cuda --n 5          # on the H200
    python3 benchmarks/bench_harness.py --device cpu --n 5           # here (interpreter)
    python3 benchmarks/bench_harness.py --root OLD_TREE --label before --csv benchmarks/data/check_cost.csv

`--root` measures the harness of another checkout of crucible (e.g. `git archive REV | tar -x -C OLD_TREE`) with
this same script, so a change's cost is measured before and after on one machine in one run; `--csv` appends one
row per (tree, task, candidate) with the device, versions and the measured tree's commit. An editable install
(`pip install -e .`) maps `sandbox` to its own checkout whatever `--root` says: run it with a Python that has none,
e.g. `PYTHONPATH=.venv/lib/python3.11/site-packages python3 benchmarks/bench_harness.py --root ...` (a path on
PYTHONPATH is not searched for .pth files).

The parent-side phases (spawn, inputs, reference, request = a call's round trip, compare, rebuild, close) are
printed too.
"harness" = wall time minus the candidate's own calls (its kernels, first-launch compilation included) minus the
timing stage: forking the process, confinement, importing the candidate, references, transfers and comparisons.
A fresh Python process per candidate would cost ~5.7 s before doing any work (ANCHORS.md).
"""
from __future__ import annotations

import argparse
import csv
import datetime
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
from _bench import commit as repo_commit  # noqa: E402  (this script's folder is on sys.path)
CSV_FIELDS = ["date", "label", "commit", "device", "torch", "triton", "task", "candidate", "n", "accepted",
              "total_s", "harness_s", "candidate_calls_s", "calls", "timing_stage_s", "total_s_min", "total_s_max"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--n", type=int, default=5)
    ap.add_argument("--root", default=str(HERE), help="the crucible checkout whose harness is measured")
    ap.add_argument("--task", default="tasks/rmsnorm_fwd.py", help="relative to --root, or absolute")
    ap.add_argument("--candidate", default="tests/candidates/rmsnorm_honest.py")
    ap.add_argument("--timing", action="store_true", help="include the timing stage")
    ap.add_argument("--label", default="", help="a word for the CSV row (e.g. before / after)")
    ap.add_argument("--csv", default="", help="append the medians as one row to this CSV file")
    args = ap.parse_args()
    root = Path(args.root).resolve()
    sys.path.insert(0, str(root))
    os.chdir(root)
    if args.device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"
    import torch
    import triton
    from sandbox.harness import CheckOptions, Harness

    t0 = time.monotonic()
    harness = Harness(args.device)
    start_s = time.monotonic() - t0
    rows, accepted = [], 0
    for i in range(args.n):
        r = harness.check(args.task, args.candidate, CheckOptions(timing=args.timing))
        if not r.accepted:
            print(f"run {i}: rejected: {r.message}", flush=True)
            continue
        accepted += 1
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
    if not rows:
        sys.exit("every check was rejected: nothing to measure")
    keys = sorted({k for row in rows for k in row}, key=lambda k: (not k.endswith("_s") or "." in k, k))
    med = {k: statistics.median(row.get(k, 0.0) for row in rows) for k in keys}
    print(f"\nharness start (zygote: imports torch+triton once): {start_s:.2f} s")
    print(f"{'metric':28s} median over {len(rows)} checks ({args.device}, {Path(args.task).name}, {repo_commit(root)})")
    for k, v in med.items():
        print(f"{k:28s} {v:8.3f}")
    if args.csv:
        device = torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu (Triton interpreter)"
        totals = [row["total_s"] for row in rows]
        row = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               "label": args.label, "commit": repo_commit(root), "device": device, "torch": torch.__version__,
               "triton": triton.__version__, "task": args.task, "candidate": args.candidate, "n": args.n,
               "accepted": accepted, "total_s_min": f"{min(totals):.3f}", "total_s_max": f"{max(totals):.3f}",
               **{k: f"{med.get(k, 0.0):.3f}" for k in ("total_s", "harness_s", "candidate_calls_s", "calls",
                                                         "timing_stage_s")}}
        path = Path(args.csv) if os.path.isabs(args.csv) else HERE / args.csv
        path.parent.mkdir(parents=True, exist_ok=True)
        new = not path.exists()
        with path.open("a", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=CSV_FIELDS)
            if new:
                writer.writeheader()
            writer.writerow(row)


if __name__ == "__main__":
    main()
