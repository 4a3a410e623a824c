"""Is the Gluon attention forward (seeds/attention_gluon.py) deterministic? On the H200 `crucible bench` rejected its
ping-pong 3-stage variant on the "outliers" draw (1 of 67M elements of o outside the bound) while the
two-consumer variant without the token passed. Every 128 x 128 variant computes each row with the same operations
in the same order (the consumers, the stages, the token and persistence only change who runs what when), so their
outputs must agree bitwise with each other and from run to run; a difference is a race (a stage read before it
landed or after it was refilled). For each mode (full, causal) and each draw of the harness's distributions at the
task's shape, every variant runs REPEATS times on the same inputs, NaN-poisoned outputs first; the table counts the
elements that differ from the first variant's first run, and the runs that differ from their own first.

    PYTHONPATH=$PWD python3 benchmarks/diag_gluon_race.py [--repeats 6] [--budget 150]
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from benchmarks._bench import parser  # noqa: E402
from sandbox.task import load_task  # noqa: E402
from seeds import attention_gluon as G  # noqa: E402


def main() -> int:
    ap = parser(__doc__.splitlines()[0], 150.0)
    ap.add_argument("--repeats", type=int, default=6)
    args = ap.parse_args()
    t0 = time.time()
    variants = {n: kw for n, kw in G.VARIANTS.items() if kw.get("block_n", 128) == 128}
    variants["2 consumers no token 128x128 s2 persistent"] = dict(consumers=2, pingpong=False, persistent=True)
    variants["2 consumers no token 128x128 s3"] = dict(consumers=2, pingpong=False, stages=3)
    bad = 0
    print(f"{'mode':6s} {'draw':13s} {'variant':42s} {'elements != ref':>16s} {'runs != own first':>18s} "
          f"{'ms (normal)':>11s}")
    for causal in (False, True):
        task = load_task(ROOT / ("tasks/attention_fwd_causal.py" if causal else "tasks/attention_fwd.py"))
        for dist in ("outliers", "normal", "large", "constant_rows"):
            q, k, v = task.make_inputs(11, dist, "cuda")
            ref = None
            for name, kw in variants.items():
                if time.time() - t0 > args.budget:
                    print(f"skipped {name}: past the budget")
                    continue
                if causal and kw.get("persistent") and (q.shape[2] // 128) % 2:
                    continue
                first, differ = None, 0
                for _ in range(args.repeats):
                    o = torch.full_like(q, float("nan"))
                    lse = torch.full(q.shape[:3], float("nan"), dtype=torch.float32, device=q.device)
                    G.attention_fwd_gluon(q, k, v, causal, out=(o, lse), **kw)
                    torch.cuda.synchronize()
                    if first is None:
                        first = o.clone()
                    elif not torch.equal(o.view(torch.int16), first.view(torch.int16)):
                        differ += 1
                if ref is None:
                    ref = first
                n_diff = int((first.view(torch.int16) != ref.view(torch.int16)).sum())
                bad += (n_diff > 0) + (differ > 0)
                ms = float("nan")
                if dist == "normal":
                    import triton.testing
                    ms = triton.testing.do_bench(lambda kw=kw: G.attention_fwd_gluon(q, k, v, causal, **kw),
                                                 warmup=25, rep=100, return_mode="median")
                print(f"{'causal' if causal else 'full':6s} {dist:13s} {name:42s} {n_diff:16d} {differ:18d} "
                      f"{ms:11.4f}", flush=True)
    print(f"{bad} variant x draw cells differ ({time.time() - t0:.0f} s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
