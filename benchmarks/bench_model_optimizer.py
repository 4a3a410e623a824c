"""AdamW steps on a model file's parameters: torch's default (foreach), torch's fused=True and crucible's AdamW
(patching.optimizer.AdamW, the fused bf16 seed), each timed over 10 steps after 3 with CUDA events, random grads.

    python3 benchmarks/bench_model_optimizer.py models/llama.py --preset 1b      # H200: ~30 s

Rows go to benchmarks/data/adamw_model.csv with the GPU, driver, versions and commit (--no-csv: print only).
"""
from __future__ import annotations

import argparse
import sys
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from benchmarks._bench import append_csv  # noqa: E402
from benchmarks._bench import commit as repo_commit  # noqa: E402
from benchmarks.bench_throughput import environment  # noqa: E402

CSV = ROOT / "benchmarks" / "data" / "adamw_model.csv"
FIELDS = ["date", "commit", "gpu", "driver", "torch", "triton", "model", "preset", "params", "tensors", "optimizer",
          "ms_per_step", "gb_per_s_at_14b"]
WARM, TIMED = 3, 10


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model_file", type=Path)
    ap.add_argument("--preset", default="1b")
    ap.add_argument("--no-csv", action="store_true")
    args = ap.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("no CUDA GPU is visible; this benchmark times optimizer steps on the GPU", file=sys.stderr)
        return 2
    from patching.modelfile import ModelFileError, load_model_file
    from patching.optimizer import AdamW

    try:
        spec = load_model_file(args.model_file, args.preset)
    except ModelFileError as exc:
        print(exc, file=sys.stderr)
        return 2
    model = spec.build("cuda")
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        p.grad = torch.randn_like(p) * 1e-3
    n = sum(p.numel() for p in params)
    common = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "commit": repo_commit(ROOT),
              **environment("cuda"), "model": args.model_file.name, "preset": args.preset, "params": n,
              "tensors": len(params)}
    makers = {"torch foreach (default)": lambda: torch.optim.AdamW(params, lr=1e-4, weight_decay=0.0),
              "torch fused=True": lambda: torch.optim.AdamW(params, lr=1e-4, weight_decay=0.0, fused=True),
              "crucible": lambda: AdamW(params, lr=1e-4, weight_decay=0.0)}
    rows = []
    for name, make in makers.items():
        opt = make()
        for _ in range(WARM):
            opt.step()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        for _ in range(TIMED):
            opt.step()
        end.record()
        torch.cuda.synchronize()
        ms = start.elapsed_time(end) / TIMED
        rows.append({**common, "optimizer": name, "ms_per_step": round(ms, 3),
                     "gb_per_s_at_14b": round(14 * n / ms / 1e6, 1)})
        print(f"{name:24s} {ms:8.2f} ms a step on {n / 1e9:.2f}B params in {len(params)} tensors", flush=True)
        del opt
    if not args.no_csv:
        append_csv(CSV, FIELDS, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
