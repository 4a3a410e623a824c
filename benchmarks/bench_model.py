"""End-to-end model benchmark: eager, torch.compile, Liger's kernels and crucible's patch on one model, side by side
in one run. Per variant: training step time (forward, backward, AdamW: torch's default foreach step; crucible's
fused bf16 step, `patching.adamw`, for crucible's variant; fused=True for the optional compile_fused), tokens/s,
peak memory, prefill and decode time, and the loss curve over --steps training steps from the same weights and
batches.

    python3 benchmarks/bench_model.py models/llama.py --preset 1b --out runs/bench-llama      # H200, ~5 min
    python3 benchmarks/bench_model.py models/mixtral.py --preset small --out runs/bench-mixtral
    python3 benchmarks/bench_model.py models/llama.py --preset tiny --device cpu --steps 2 --variants eager,crucible --out /tmp/b

Writes OUT/model.csv (one row per variant, with the GPU, versions and commit; appended to
benchmarks/data/model.csv with --record), OUT/losses.csv, OUT/patch.json (crucible's per-region outcomes) and
OUT/report.html (tables and SVG plots); crucible's variant also OUT/adamw.json (which AdamW it trained with, and
why). Liger's variant calls liger_kernel's autograd Functions on the same modules crucible patches (RMSNorm,
SiLU-mul, RoPE, fused linear cross-entropy), as its apply_liger_kernel_to_llama does.
"""
from __future__ import annotations

import argparse
import copy
import csv
import html
import json
import os
import statistics
import sys
from datetime import datetime, timezone
import time
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks._bench import commit as repo_commit  # noqa: E402
VARIANTS = ("eager", "compile", "liger", "crucible")
# Accepted by --variants but not run by default: torch.compile(model) with torch.optim.AdamW(fused=True), the
# strongest PyTorch baseline (every default variant but crucible's steps with torch's default, foreach, AdamW).
OPTIONAL = ("compile_fused",)


def liger_patch(model) -> int:
    """Point the matched modules' forwards at Liger's Functions; the number of modules patched."""
    from liger_kernel.ops.fused_linear_cross_entropy import LigerFusedLinearCrossEntropyFunction
    from liger_kernel.ops.rms_norm import LigerRMSNormFunction
    from liger_kernel.ops.rope import LigerRopeFunction
    from liger_kernel.ops.swiglu import LigerSiLUMulFunction

    from patching.find import candidates
    from patching.records import Kind

    forwards = {
        Kind.RMSNORM: lambda self, x: LigerRMSNormFunction.apply(x, self.weight, self.eps, 0.0, "llama", False),
        Kind.SWIGLU: lambda self, a, b: LigerSiLUMulFunction.apply(a, b),
        Kind.ROPE: lambda self, q, k, cos, sin: tuple(t.transpose(1, 2) for t in LigerRopeFunction.apply(
            q.transpose(1, 2), k.transpose(1, 2), cos, sin)),
        Kind.LM_LOSS: lambda self, x, w, t: LigerFusedLinearCrossEntropyFunction.apply(
            x, w, t, None, None, -100, 0.0, 0.0, "mean")[0],
    }
    named = dict(model.named_modules())
    n = 0
    for name, kind in candidates(model).items():
        if kind in forwards:
            named[name].forward = types.MethodType(forwards[kind], named[name])
            n += 1
    return n


def sync(device: str) -> None:
    import torch
    if device == "cuda":
        torch.cuda.synchronize()


def measure(variant: str, spec, args, device: str, out: Path) -> tuple[dict, list[float]]:
    import torch

    import patching
    from patching.steps import train_losses

    torch.manual_seed(0)
    model = spec.build(device)
    note = ""
    if variant == "liger":
        note = f"{liger_patch(model)} modules on Liger's Functions"
    opt = None
    if variant == "crucible":
        report = patching.patch(model, spec.inputs(device), name=spec.name, workdir=out / "crucible",
                                skip=tuple(s for s in args.crucible_skip.split(",") if s),
                                archive=args.archive)
        (out / "patch.json").write_text(json.dumps(report.to_dict(), indent=1))
        note = "; ".join(f"{r.region.kind.value}: {r.outcome.value}" for r in report.results)
        opt, adamw = patching.adamw(model, lr=args.lr, weight_decay=0.0, name=spec.name,
                                    workdir=out / "crucible-adamw")
        (out / "adamw.json").write_text(json.dumps(adamw.to_dict(), indent=1))
        note += f"; optimizer: {adamw.optimizer}'s AdamW ({adamw.reason})"
    elif variant == "compile_fused":
        opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0, fused=True)
        note = "torch.optim.AdamW(fused=True)"
    runner = torch.compile(model) if variant in ("compile", "compile_fused") else model
    batch = lambda step: spec.inputs(device, seed=step)  # noqa: E731
    if device == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    times: list[float] = []
    if opt is None:
        opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    losses = []
    for step in range(args.steps):
        inputs = batch(step)
        sync(device)
        t0 = time.perf_counter()
        loss = runner(*inputs)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync(device)
        times.append(time.perf_counter() - t0)
        losses.append(float(loss.detach()))
    peak = torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else None
    timed = times[args.warmup:] or times
    step_s = statistics.median(timed)
    ids = batch(0)[0]
    tokens = ids.numel()
    prefill_ms, decode_ms = inference(runner, ids, args.decode, device)
    del opt
    row = {"variant": variant, "step_ms": step_s * 1e3, "step_ms_iqr": _iqr(timed) * 1e3,
           "tokens_per_s": tokens / step_s, "peak_gib": peak, "prefill_ms": prefill_ms,
           "decode_ms_per_token": decode_ms, "steps": args.steps, "timed_steps": len(timed), "note": note}
    return row, losses


def inference(model, ids, decode_tokens: int, device: str) -> tuple[float, float]:
    """Prefill of the whole batch into a cache, then decode_tokens greedy steps; ms each (median of 3 runs)."""
    import torch

    base = model._orig_mod if hasattr(model, "_orig_mod") else model
    pre, dec = [], []
    with torch.no_grad():
        for _ in range(3):
            cache = base.new_cache(ids.shape[0], ids.shape[1] + decode_tokens)
            sync(device)
            t0 = time.perf_counter()
            logits = model(ids, cache=cache)
            sync(device)
            pre.append(time.perf_counter() - t0)
            nxt = logits.argmax(-1, keepdim=True)
            t0 = time.perf_counter()
            for _ in range(decode_tokens):  # decode runs eagerly on the compiled model's module (shapes change)
                nxt = base(nxt, cache=cache).argmax(-1, keepdim=True)
            sync(device)
            dec.append((time.perf_counter() - t0) / max(decode_tokens, 1))
    return statistics.median(pre) * 1e3, statistics.median(dec) * 1e3


def _iqr(xs: list[float]) -> float:
    if len(xs) < 4:
        return 0.0
    q = statistics.quantiles(xs, n=4)
    return q[2] - q[0]


def svg_lines(series: dict[str, list[float]], title: str, w: int = 640, h: int = 280) -> str:
    pts = [v for s in series.values() for v in s]
    lo, hi = min(pts), max(pts)
    hi = hi if hi > lo else lo + 1
    n = max(len(s) for s in series.values())
    colors = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728"]
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}"><text x="10" y="16">'
           f'{html.escape(title)} ({lo:.4f} .. {hi:.4f})</text>']
    for i, (name, s) in enumerate(series.items()):
        xy = " ".join(f"{40 + (w - 60) * j / max(n - 1, 1):.1f},{h - 30 - (h - 60) * (v - lo) / (hi - lo):.1f}"
                      for j, v in enumerate(s))
        c = colors[i % len(colors)]
        out.append(f'<polyline fill="none" stroke="{c}" stroke-width="1.5" points="{xy}"/>'
                   f'<text x="{w - 150}" y="{30 + 16 * i}" fill="{c}">{html.escape(name)}</text>')
    return "".join(out) + "</svg>"


def svg_bars(values: dict[str, float], title: str, w: int = 640, h: int = 200) -> str:
    hi = max(values.values()) or 1.0
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}"><text x="10" y="16">'
           f'{html.escape(title)}</text>']
    for i, (name, v) in enumerate(values.items()):
        y = 30 + i * 38
        out.append(f'<rect x="110" y="{y}" width="{(w - 220) * v / hi:.1f}" height="26" fill="#1f77b4"/>'
                   f'<text x="10" y="{y + 18}">{html.escape(name)}</text>'
                   f'<text x="{120 + (w - 220) * v / hi:.1f}" y="{y + 18}">{v:,.1f}</text>')
    return "".join(out) + "</svg>"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model_file")
    p.add_argument("--preset", default=None)
    p.add_argument("--out", required=True, help="folder for model.csv, losses.csv, patch.json, report.html")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cuda")
    p.add_argument("--variants", default=",".join(VARIANTS),
                   help=f"from {', '.join(VARIANTS + OPTIONAL)} (default: all but {', '.join(OPTIONAL)})")
    p.add_argument("--steps", type=int, default=50, help="training steps per variant (the loss curve)")
    p.add_argument("--warmup", type=int, default=5, help="steps left out of the step time")
    p.add_argument("--decode", type=int, default=32, help="tokens decoded after the prefill")
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--crucible-skip", default="attention",
                   help="region kinds crucible leaves to PyTorch (default attention: its training contract "
                        "recomputes the forward in the backward; '' patches every kind)")
    p.add_argument("--archive", default=None, help="try this archive's winners before the seeds")
    p.add_argument("--record", action="store_true", help="also append the rows to benchmarks/data/model.csv")
    args = p.parse_args(argv)
    variants = [v for v in args.variants.split(",") if v]
    if set(variants) - set(VARIANTS + OPTIONAL) or args.steps < 1:
        p.error(f"--variants from {', '.join(VARIANTS + OPTIONAL)}; --steps >= 1")
    if args.device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")
    import torch

    from patching.modelfile import ModelFileError, load_model_file
    from patching.steps import loss_gap
    from profiler.env import environment

    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("no CUDA GPU is visible; use --device cpu with a tiny preset")
    try:
        spec = load_model_file(args.model_file, args.preset)
    except ModelFileError as exc:
        p.error(str(exc))
    if "liger" in variants:
        try:
            import liger_kernel  # noqa: F401
        except ImportError:
            variants.remove("liger")
            print("liger_kernel is not installed: the liger variant is left out")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env = environment(0 if args.device == "cuda" else None)
    rows, curves = [], {}
    for v in variants:
        t0 = time.perf_counter()
        row, losses = measure(v, spec, args, args.device, out)
        gpu = env.get("gpu")
        row.update(date=datetime.now(timezone.utc).isoformat(timespec="seconds"), model=spec.name,
                   device=args.device, gpu=gpu.get("name") if isinstance(gpu, dict) else gpu, torch=env["torch"],
                   triton=env["triton"], liger_kernel=env["liger_kernel"], commit=repo_commit(ROOT),
                   batch_tokens=spec.inputs("cpu")[0].numel(), wall_s=time.perf_counter() - t0)
        rows.append(row)
        curves[v] = losses
        print(json.dumps({k: row[k] for k in ("variant", "step_ms", "tokens_per_s", "peak_gib", "prefill_ms",
                                               "decode_ms_per_token")}), flush=True)
        if args.device == "cuda":
            torch.cuda.empty_cache()
    if "eager" in curves:
        for row in rows:
            row["loss_gap_vs_eager"] = loss_gap(curves["eager"], curves[row["variant"]])
    fields = list(rows[0])
    for path in [out / "model.csv"] + ([ROOT / "benchmarks" / "data" / "model.csv"] if args.record else []):
        new = not path.exists()
        with open(path, "a", newline="") as f:
            w = csv.DictWriter(f, fieldnames=fields)
            if new:
                w.writeheader()
            w.writerows(rows)
    with open(out / "losses.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["step", *curves])
        w.writerows([i, *(c[i] for c in curves.values())] for i in range(args.steps))
    write_report(out / "report.html", spec.name, rows, curves, env)
    print(f"wrote {out}/model.csv, losses.csv, report.html")
    return 0


def write_report(path: Path, name: str, rows: list[dict], curves: dict[str, list[float]], env: dict) -> None:
    cols = ["variant", "step_ms", "tokens_per_s", "peak_gib", "prefill_ms", "decode_ms_per_token",
            "loss_gap_vs_eager", "note"]
    fmt = lambda v: f"{v:,.4g}" if isinstance(v, float) else html.escape(str(v))  # noqa: E731
    table = "<table border=1 cellpadding=4><tr>" + "".join(f"<th>{c}</th>" for c in cols) + "</tr>" + "".join(
        "<tr>" + "".join(f"<td>{fmt(r.get(c))}</td>" for c in cols) + "</tr>" for r in rows) + "</table>"
    body = [f"<h1>{html.escape(name)}</h1><p>{html.escape(str(env.get('gpu')))}, torch {env['torch']}, triton "
            f"{env['triton']}, liger {env['liger_kernel']}, commit {rows[0]['commit']}</p>", table,
            svg_bars({r["variant"]: r["tokens_per_s"] for r in rows}, "training tokens/s"),
            svg_lines(curves, "training loss by step")]
    if all(r["peak_gib"] is not None for r in rows):
        body.append(svg_bars({r["variant"]: r["peak_gib"] for r in rows}, "peak memory (GiB)"))
    path.write_text("<html><body>" + "".join(body) + "</body></html>", encoding="utf-8")


if __name__ == "__main__":
    sys.exit(main())
