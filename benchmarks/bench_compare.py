"""What one comparison of a candidate's output costs the parent (sandbox/tolerance.compare), with the fused kernels
(sandbox/tolerance_fused.py) and with the torch passes, on the outputs of the throughput tasks: time a compare
(median of --reps after one warm call, the GPU synchronised) and whether both say the same (the mismatch count of
a noisy output with a few planted outliers). A check compares a dozen outputs like these; the parent holds the GPU's
shared gate while it does. Rows go to benchmarks/data/compare.csv (--csv to change, --no-csv for none).

    python3 benchmarks/bench_compare.py                 # the GPU
    python3 benchmarks/bench_compare.py --device cpu --no-csv --small    # the CPU: the torch passes against the
                                                                          # interpreted kernels, small shapes
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from benchmarks._bench import append_csv, commit as repo_commit  # noqa: E402
from benchmarks.bench_throughput import environment  # noqa: E402
from sandbox.tolerance import compare  # noqa: E402

# (name, shape, dtype, alternates): the outputs of the throughput tasks (softmax, SwiGLU, attention's o and its
# FlashAttention-2 alternate), and a float32 output
OUTPUTS = [("softmax_fwd y", (16384, 8192), torch.bfloat16, 0),
           ("swiglu_fwd y", (16384, 14336), torch.bfloat16, 0),
           ("attention_fwd_bwd o", (4, 32, 4096, 128), torch.bfloat16, 1),
           ("float32 y", (4096, 8192), torch.float32, 0)]
FIELDS = ["date", "commit", "device", "gpu", "torch", "triton", "output", "shape", "dtype", "alternates", "path",
          "ms", "mismatched"]


def case(shape: tuple[int, ...], dtype: torch.dtype, alternates: int, device: str) -> tuple:
    g = torch.Generator(device=device).manual_seed(0)
    truth = torch.randn(shape, generator=g, device=device, dtype=torch.float64)
    ref = truth.to(dtype)
    noise = lambda s: (truth * (1 + s * torch.randn(shape, generator=g, device=device, dtype=torch.float64)))  # noqa: E731
    alts = tuple(noise(2e-3).to(dtype) for _ in range(alternates))
    got = noise(1e-3).to(dtype)
    flat = got.view(-1)
    flat[torch.randint(0, flat.numel(), (7,), generator=g, device=device)] *= 3.0  # a few far off
    return got, ref, truth, alts


def time_compare(args: tuple, fused: bool, reps: int, device: str) -> tuple[float, int]:
    got, ref, truth, alts = args
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    report = compare("y", got, ref, truth, alternates=alts, fused=fused)  # warm: the kernels compile here
    sync()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        compare("y", got, ref, truth, alternates=alts, fused=fused)
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3, 0 if report is None else report.mismatched


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--small", action="store_true", help="shapes divided by 64 along the first two dimensions")
    ap.add_argument("--csv", default=str(ROOT / "benchmarks" / "data" / "compare.csv"))
    ap.add_argument("--no-csv", action="store_true")
    args = ap.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA GPU here: pass --device cpu (the kernels then run in Triton's interpreter, with "
              "TRITON_INTERPRET=1 set before Python starts)", file=sys.stderr)
        return 2
    env = environment(args.device)
    common = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "commit": repo_commit(ROOT),
              "device": args.device, **{k: env[k] for k in ("gpu", "torch", "triton")}}
    rows, agree = [], True
    for name, shape, dtype, n_alt in OUTPUTS:
        if args.small:
            shape = tuple(max(1, s // 64) if i < 2 else s for i, s in enumerate(shape))
        tensors = case(shape, dtype, n_alt, args.device)
        found = {}
        for fused in (False, True):
            ms, bad = time_compare(tensors, fused, args.reps, args.device)
            found[fused] = bad
            rows.append({**common, "output": name, "shape": "x".join(map(str, shape)), "dtype": str(dtype)[6:],
                         "alternates": n_alt, "path": "fused" if fused else "torch", "ms": f"{ms:.2f}",
                         "mismatched": bad})
            print(f"{name:22s} {str(shape):22s} {'fused' if fused else 'torch':5s} {ms:9.2f} ms a compare, "
                  f"{bad} elements outside", flush=True)
        agree &= found[False] == found[True]
        del tensors
        if args.device == "cuda":
            torch.cuda.empty_cache()
    if not args.no_csv:
        append_csv(Path(args.csv), FIELDS, rows)
    print("the two paths agree on every output" if agree else "THE TWO PATHS DISAGREE")
    return 0 if agree else 1


if __name__ == "__main__":
    sys.exit(main())
