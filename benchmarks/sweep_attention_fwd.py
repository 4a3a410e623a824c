"""H200 sweep of the attention forward seed's Hopper variants (issue 6), B4 H32 S4096 D128 bf16, causal and not,
in ONE call, against SDPA's cuDNN and FlashAttention-2 backends timed in the same run.

Variants (seeds/attention.py, attention_fwd keywords; the seed's default first):
- default: TMA K/V tiles, 128 x 128, 8 warps, 3 stages (run M: 498 / 431 TFLOP/s, 0.82x cuDNN);
- a point of Triton's fused-attention tutorial config space that run M did not try (128 x 64 x 4 warps x 3 stages);
- warp_specialize: the tutorial's Hopper structure (one key loop, Q/K/V descriptors made in the kernel,
  tl.range(warp_specialize=True)), which Triton 3.6 compiles at 4 warps into a TMA producer warp group and two
  consumer warp groups of BLOCK_M / 2 rows (FlashAttention-3's layout), at 128 x 128 x 2 stages, 128 x 64 x 3 / 4
  stages, 256 x 64 x 3 stages (ptxas spills 72 bytes under the 168-register cap), and persistent;
- subtiles=2: two query sub-tiles per program sharing each K/V tile (256 rows at 8 warps, 128 at 4), the second's
  QK^T issued before the first's softmax;
- persistent: one program per SM looping over the (query block, head) tiles, causal the longest first;
- defer_rescale: the FlashAttention-4 rescale threshold (the max moves only when it grows by more than 8, base 2).

Every variant's o and lse are checked against a float64 truth at the full shape (computed head-chunk by
head-chunk) before it is timed: o's relative L2 error must be within max(1e-2, 4x SDPA cuDNN's own), lse's largest
absolute error (natural log) within 1e-3; a wrong variant prints WRONG and is not timed, a failing one (compile
error, out of resources) costs its row. Timing: triton.testing.do_bench medians (warmup 25, rep 100 ms) over 3
rotating input sets (benchmarks/_bench.py), the seed with its lse stored (run M's rows did not store it: 2 MB beside
2.3 ms). One table last: TFLOP/s = 4 B H S^2 D (half when causal) / time.

    python3 benchmarks/sweep_attention_fwd.py            # the H200, about 90 s with compiles
    TRITON_INTERPRET=1 python3 benchmarks/sweep_attention_fwd.py --smoke   # the CPU interpreter, tiny shape
Rows also go to $OUT/sweep_attention_fwd.json when OUT is set.
"""
from __future__ import annotations

import json
import math
import os
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

if "--smoke" in sys.argv:
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from _bench import parser, rel_l2, rotating_median_ms  # noqa: E402
from seeds import attention as A  # noqa: E402

LN2 = math.log(2.0)
SETS = 3
# (name, attention_fwd keywords). config = (BLOCK_M, BLOCK_N, warps, stages); None: the seed's own choice.
VARIANTS = [
    ("default (TMA 128x128 w8 s3)", {}),
    ("tutorial cfg 128x64 w4 s3", dict(config=(128, 64, 4, 3))),
    ("ws 128x128 w4 s2", dict(warp_specialize=True, config=(128, 128, 4, 2))),
    ("ws 128x64 w4 s3", dict(warp_specialize=True, config=(128, 64, 4, 3))),
    ("ws 128x64 w4 s4", dict(warp_specialize=True, config=(128, 64, 4, 4))),
    ("ws 256x64 w4 s3", dict(warp_specialize=True, config=(256, 64, 4, 3))),
    ("ws 128x128 w4 s2 persistent", dict(warp_specialize=True, config=(128, 128, 4, 2), persistent=True)),
    ("subtiles2 256x64 w8 s3", dict(subtiles=2, config=(256, 64, 8, 3))),
    ("subtiles2 128x64 w4 s3", dict(subtiles=2, config=(128, 64, 4, 3))),
    ("persistent 128x128 w8 s3", dict(persistent=True, config=(128, 128, 8, 3))),
    ("persistent 128x128 w8 s2", dict(persistent=True, config=(128, 128, 8, 2))),
    ("defer_rescale 128x128 w8 s3", dict(defer_rescale=True, config=(128, 128, 8, 3))),
    ("defer_rescale subtiles2 256x64 w8 s3", dict(defer_rescale=True, subtiles=2, config=(256, 64, 8, 3))),
]


def log(t0: float, msg: str) -> None:
    print(f"[{time.time() - t0:6.1f}s] {msg}", flush=True)


def smoke_kwargs(kw: dict) -> dict:
    """The same variant at interpreter-sized tiles (a quarter of each block, one stage), TMA descriptors on (as on
    the H200; the interpreter's default is pointers)."""
    bm, bn, warps, _ = kw.get("config", (128, 128, 8, 3))
    return dict(kw, config=(max(16, bm // 4), max(16, bn // 4), warps, 1), tma=True)


def truth(q, k, v, causal: bool, chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(o fp32, natural lse fp64) of the float64 softmax, `chunk` (batch, head) pairs at a time (S x S in fp64)."""
    b, h, s, d = q.shape
    qf, kf, vf = (t.reshape(b * h, s, d) for t in (q, k, v))
    o = torch.empty(b * h, s, d, dtype=torch.float32, device=q.device)
    lse = torch.empty(b * h, s, dtype=torch.float64, device=q.device)
    mask = torch.ones(s, s, dtype=torch.bool, device=q.device).tril() if causal else None
    for i in range(0, b * h, chunk):
        sl = slice(i, i + chunk)
        scores = (qf[sl].double() @ kf[sl].double().transpose(1, 2)) / math.sqrt(d)
        if mask is not None:
            scores.masked_fill_(~mask, float("-inf"))
        lse[sl] = torch.logsumexp(scores, dim=-1)
        o[sl] = (torch.exp(scores - lse[sl][..., None]) @ vf[sl].double()).float()
        del scores
    return o.view(b, h, s, d), lse.view(b, h, s)


def sdpa(backend: str | None):
    """q, k, v, causal -> o through SDPA with one backend (None: PyTorch's choice)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def run(q, k, v, causal):
        if backend is None:
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        with sdpa_kernel({"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}[backend]):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return run


def main() -> int:
    ap = parser(__doc__.splitlines()[0], budget_s=140.0)
    args = ap.parse_args()
    t0 = time.time()
    smoke = args.smoke
    dev = "cpu" if smoke else "cuda"
    b, h, s, d = (1, 2, 64, 32) if smoke else (4, 32, 4096, 128)
    gen = torch.Generator(device=dev).manual_seed(0)
    sets = [[torch.randn(b, h, s, d, device=dev, generator=gen).to(torch.bfloat16) for _ in range(3)]
            for _ in range(SETS)]
    rows: list[dict] = []
    for causal in (False, True):
        flops = 4 * b * h * s * s * d / (2 if causal else 1)
        tag = "causal" if causal else "non-causal"
        q, k, v = sets[0]
        o_true, lse_true = truth(q, k, v, causal, chunk=8)
        log(t0, f"{tag}: float64 truth done")
        base_err = None
        for name in ("cudnn", "flash"):
            fn = sdpa(None if smoke else name)
            try:
                err = rel_l2(fn(q, k, v, causal), o_true)
                ms = rotating_median_ms(lambda i: fn(*sets[i], causal), SETS, smoke)
            except Exception as exc:  # a backend this build lacks costs its row
                log(t0, f"{tag} SDPA {name}: FAILED {type(exc).__name__}: {exc}")
                continue
            if name == "cudnn":
                base_err = err
            rows.append(dict(causal=causal, variant=f"SDPA {name}" + (" (smoke: default)" if smoke else ""),
                             ms=ms, tflops=flops / ms / 1e9, o_err=err, lse_err=None, status="baseline"))
            log(t0, f"{tag} SDPA {name}: {ms:.4f} ms {flops / ms / 1e9:.1f} TFLOP/s, o rel L2 {err:.2e}")
        bound = max(1e-2, 4 * base_err) if base_err is not None else 1e-2
        for name, kw in VARIANTS:
            if time.time() - t0 > args.budget:
                log(t0, f"{tag} {name}: skipped (budget of {args.budget:g} s spent)")
                continue
            kw = smoke_kwargs(kw) if smoke else kw
            row = dict(causal=causal, variant=name, ms=None, tflops=None, o_err=None, lse_err=None)
            try:
                o, lse2 = A.attention_fwd(q, k, v, causal, **kw)
                row["o_err"] = rel_l2(o, o_true)
                row["lse_err"] = float((lse2.double() * LN2 - lse_true).abs().max())
                if not (row["o_err"] <= bound and row["lse_err"] <= 1e-3):
                    row["status"] = "WRONG"
                else:
                    # store_lse stays on (one compile per variant; the 2 MB of lse is noise beside 2.3 ms)
                    row["ms"] = rotating_median_ms(lambda i: A.attention_fwd(*sets[i], causal, **kw), SETS, smoke)
                    row["tflops"] = flops / row["ms"] / 1e9
                    row["status"] = "ok"
            except Exception as exc:  # one failing variant costs its row, not the run
                row["status"] = f"FAILED {type(exc).__name__}"
                log(t0, f"{tag} {name}: FAILED {type(exc).__name__}: {str(exc)[-300:]}")
                traceback.print_exc(limit=2)
            rows.append(row)
            log(t0, f"{tag} {name}: {row['status']} ms={row['ms']} o_err={row['o_err']} lse_err={row['lse_err']}")
        del o_true, lse_true
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "sweep_attention_fwd.json").write_text(json.dumps(rows, indent=1))
    print_table(rows, smoke)
    return 0


def print_table(rows: list[dict], smoke: bool) -> None:
    print(f"\nattention forward, {'SMOKE (CPU interpreter, tiny shape: not speed)' if smoke else 'B4 H32 S4096 D128 bf16'}"
          "; speedup against the faster SDPA backend of the same mode")
    print(f"{'mode':10s} {'variant':40s} {'ms':>9s} {'TFLOP/s':>8s} {'vs SDPA':>8s} {'o relL2':>9s} {'lse err':>9s}  status")
    for causal in (False, True):
        mode = [r for r in rows if r["causal"] == causal]
        best = min((r["ms"] for r in mode if r["status"] == "baseline"), default=None)
        for r in mode:
            ms = f"{r['ms']:.4f}" if r["ms"] else "-"
            tf = f"{r['tflops']:.1f}" if r["tflops"] else "-"
            vs = f"{best / r['ms']:.3f}x" if r["ms"] and best else "-"
            oe = f"{r['o_err']:.2e}" if r["o_err"] is not None else "-"
            le = f"{r['lse_err']:.1e}" if r["lse_err"] is not None else "-"
            print(f"{'causal' if causal else 'full':10s} {r['variant']:40s} {ms:>9s} {tf:>8s} {vs:>8s} {oe:>9s} {le:>9s}"
                  f"  {r['status']}")


if __name__ == "__main__":
    sys.exit(main())
