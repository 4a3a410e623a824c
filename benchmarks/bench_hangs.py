"""How fast a hanging candidate is rejected: the hanging candidates of tests/candidates/hangs against a task, each
checked by one warm harness (after an honest kernel, as in a search), with the stage, the deadline and the message.

    python3 benchmarks/bench_hangs.py                                 # on the GPU, tasks/rmsnorm_fwd.py at full size
    python3 benchmarks/bench_hangs.py --device cpu --no-csv           # through Triton's interpreter, shapes rescaled

Every row is printed and appended to benchmarks/data/hangs.csv with the GPU, driver, versions and commit.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from benchmarks._bench import append_csv  # noqa: E402
from benchmarks._bench import commit as repo_commit  # noqa: E402
from benchmarks.bench_throughput import environment  # noqa: E402

CSV = ROOT / "benchmarks" / "data" / "hangs.csv"
HANGS = ROOT / "tests" / "candidates" / "hangs"
HONEST = ROOT / "tests" / "candidates" / "rmsnorm_honest.py"
FIELDS = ["date", "commit", "device", "gpu", "driver", "torch", "triton", "task", "candidate", "seconds", "stage",
          "reason", "deadline_s", "message"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--task", type=Path, default=ROOT / "tasks" / "rmsnorm_fwd.py")
    ap.add_argument("--timeout", type=float, default=300.0, help="the check's ceiling, as crucible's --timeout")
    ap.add_argument("--csv", type=Path, default=CSV)
    ap.add_argument("--no-csv", action="store_true", help="print only")
    args = ap.parse_args(argv)
    if not args.task.exists():
        print(f"no such task file: {args.task}; give a task in tasks/", file=sys.stderr)
        return 2
    if args.device == "cuda":
        import torch
        if not torch.cuda.is_available():
            print("no CUDA GPU is visible; pass --device cpu to measure through Triton's interpreter", file=sys.stderr)
            return 2
    from sandbox.harness import CheckOptions, Harness

    common = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "commit": repo_commit(ROOT),
              "device": args.device, **environment(args.device), "task": args.task.name}
    rows = []
    with tempfile.TemporaryDirectory(prefix="crucible-hangs-") as tmp, Harness(args.device, workdir=tmp) as harness:
        warm = harness.check(args.task, HONEST, CheckOptions(device=args.device, timing=False, timeout_s=args.timeout))
        print(f"honest kernel first: {warm.verdict.value} ({warm.message[:80]})", flush=True)
        for cand in sorted(HANGS.glob("*.py")):
            t0 = time.monotonic()
            res = harness.check(args.task, cand, CheckOptions(device=args.device, timing=False, seed=0,
                                                              timeout_s=args.timeout))
            took = time.monotonic() - t0
            failed = res.stages[-1] if res.stages else None
            row = {**common, "candidate": cand.name, "seconds": round(took, 2), "stage": res.stage.value,
                   "reason": res.reason.value,
                   "deadline_s": round(failed.details.get("deadline_s", float("nan")), 2) if failed else "",
                   "message": res.message[:300]}
            rows.append(row)
            print(f"{cand.name:24s} {took:6.1f} s  {res.stage.value:12s} {res.reason.value:10s} {res.message[:160]}",
                  flush=True)
    if not args.no_csv:
        append_csv(args.csv, FIELDS, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
