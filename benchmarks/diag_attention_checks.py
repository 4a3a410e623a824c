"""Why does the attention fwd+bwd seed fail the harness inside a search yet pass alone? In searches on an H100 and an
H200 the seed's kernels were rejected for dq wrong at about a third of its 67M elements on constant-row inputs, while
alone on the same GPUs they passed every such draw (docs/BENCHMARKS.md, "Search throughput"). This runs the flattened
seed (as the search checks it) and variants of it through the harness, one check after another, under the conditions
a search adds one at a time: the timing stage (--timing), other GPU work beside it (--stress: a process keeping the
GPU busy with matmuls) and the search's own shared gate (--gate). Each check's verdict, stage and message are
printed, and a count a variant.

    python3 benchmarks/diag_attention_checks.py --repeats 3                    # alone, timing off
    python3 benchmarks/diag_attention_checks.py --repeats 3 --timing --stress  # as a busy search sees it
    python3 benchmarks/diag_attention_checks.py --only seed,nopdl --repeats 6 --stress
Variants: seed (fp16 working copies, delta from o, the dQ kernel by programmatic dependent launch), bf16 (the
precise bf16 numerics), nopdl (the dQ kernel launched plainly), triton (the Triton kernels, no Gluon).
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

TASK = ROOT / "tasks" / "attention_fwd_bwd.py"
STRESS = ("import sys, time, torch\n"
          "a = torch.randn(8192, 8192, device='cuda', dtype=torch.bfloat16)\n"
          "end = time.time() + float(sys.argv[1])\n"
          "while time.time() < end:\n"
          "    for _ in range(20):\n"
          "        a @ a\n"
          "    torch.cuda.synchronize()\n")


def variants() -> dict[str, str]:
    """The flattened seed's source and its edits, by name."""
    from agent.search.flatten import flatten
    seed = flatten((ROOT / "seeds" / "attention_bwd.py").read_text(encoding="utf-8")).source

    def edit(old: str, new: str) -> str:
        if old not in seed:
            raise SystemExit(f"the seed no longer holds {old!r}: update this script's variants")
        return seed.replace(old, new, 1)
    return {"seed": seed,
            "bf16": edit('NUMERICS = "auto"', 'NUMERICS = "bf16"'),
            "nopdl": edit("BWD: dict | None = None", "BWD = {False: dict(dq_block_n=128, pdl=False), "
                          "True: dict(dq_block_n=128, group_heads=4, pdl=False)}"),
            "triton": edit("if self.precise and train_ok(", "if False and train_ok(")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3, help="checks of each variant (default 3)")
    ap.add_argument("--only", default="", help="variants, comma-separated (default all)")
    ap.add_argument("--timing", action="store_true", help="run the timing stage too (baseline: eager)")
    ap.add_argument("--stress", action="store_true", help="another process keeps the GPU busy meanwhile")
    ap.add_argument("--gate", action="store_true", help="the checks take a search's shared GPU gate")
    ap.add_argument("--workdir", default="/tmp/crucible-diag-attention", help="where the candidate files go")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("this diagnosis needs a CUDA GPU of sm_90 (the seed's Gluon kernels): run it on the H200", file=sys.stderr)
        return 2
    from sandbox.gate import GpuGate
    from sandbox.harness import CheckOptions, Harness
    sources = variants()
    names = [n for n in args.only.split(",") if n] or list(sources)
    unknown = [n for n in names if n not in sources]
    if unknown:
        print(f"unknown variant(s) {unknown}: choose among {sorted(sources)}", file=sys.stderr)
        return 2
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    stress = subprocess.Popen([sys.executable, "-c", STRESS, "3600"]) if args.stress else None
    options = CheckOptions(timing=args.timing, baselines=("eager",), gate=GpuGate() if args.gate else None)
    tally: dict[str, Counter] = {n: Counter() for n in names}
    t0 = time.monotonic()
    try:
        with Harness("cuda") as harness:
            for _ in range(args.repeats):
                for name in names:
                    path = workdir / f"{name}.py"
                    path.write_text(sources[name], encoding="utf-8")
                    r = harness.check(TASK, path, options)
                    kind = "accepted" if r.accepted else f"{r.stage.value}/{r.reason.value}"
                    tally[name][kind] += 1
                    print(f"[{time.monotonic() - t0:6.0f} s] {name:7s} {kind}: {r.message[:300]!r}", flush=True)
    finally:
        if stress is not None:
            stress.kill()
    print(f"\n{args.repeats} checks a variant; timing {'on' if args.timing else 'off'}, "
          f"stress {'on' if args.stress else 'off'}, gate {'on' if args.gate else 'off'}")
    for name in names:
        print(f"{name:7s} " + ", ".join(f"{k} x{v}" for k, v in tally[name].most_common()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
