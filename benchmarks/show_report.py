"""Print a `crucible bench --json` report (or a `crucible run --json` summary) as a few lines: what the GPU scripts
show of each step.

    python3 benchmarks/show_report.py REPORT.json
"""
from __future__ import annotations

import json
import sys


def show_bench(t: dict) -> None:
    c = t.get("check") or {}
    if c:
        costs = {k: round(v, 2) for k, v in (c.get("costs") or {}).items()}
        print("check:", c.get("verdict"), c.get("stage"), c.get("reason"), (c.get("message") or "")[:200], costs)
    m = t.get("measurement") or {}
    if m:
        print(f"timed {m.get('reps')} calls each, burst {m.get('burst', 1)}, bound {(t.get('roofline') or {}).get('bound')}")
    for r in t.get("rows", []):
        vs = " ".join(f"vs {b}: {x['speedup']:.3f} [{x['ci_low']:.3f},{x['ci_high']:.3f}]"
                      for b, x in r.get("vs", {}).items())
        ms = r["ms"] if r["ms"] is None else round(r["ms"], 4)
        print(f"{r['impl']:10s} {ms} ms {r.get('gbps') or 0:6.0f} GB/s {r.get('tflops') or 0:6.1f} TFLOP/s "
              f"{r.get('pct_of_roofline') or 0:5.1f}%  {vs}")
    for p in t.get("problems", []):
        print("PROBLEM", str(p)[:300])
    for w in t.get("warnings", []):
        print("warning", str(w)[:200])


def show_run(d: dict) -> None:
    keys = ("proposals", "accepted", "rejected", "elapsed_s", "proposals_per_minute", "mean_check_s", "stop_reason")
    print({k: d.get(k) for k in keys})
    b = d.get("best") or {}
    print("best", {k: b.get(k) for k in b if k != "source"})
    f = d.get("final_check") or {}
    if f:
        print("final", f.get("status"), f.get("note"), "ms", f.get("candidate_ms"), "roofline", f.get("pct_roofline"))
        for name, v in (f.get("vs") or {}).items():
            print("   vs", name, v)
    for n in d.get("notes", []):
        print("note", n)


def main() -> int:
    try:
        data = json.load(open(sys.argv[1]))
    except (OSError, ValueError, IndexError) as exc:
        print("no report:", exc)
        return 1
    (show_run if "run_id" in data else show_bench)(data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
