"""H200 sweep of the attention forward seed's Hopper variants, B4 H32 S4096 D128 bf16, causal and not,
in ONE call, against SDPA's cuDNN and FlashAttention-2 backends timed in the same run.

Rows (seeds/attention.py, attention_fwd keywords), the seed's launch first (what ModelNew runs on sm_90 at D = 128:
warp-specialised 128 x 128 x 4 warps x 2 stages, persistent when not causal; measured 560.8 / 467.6 TFLOP/s), then:
- the two-loop TMA kernel (128 x 128, 8 warps, 3 stages: attention_fwd's own default; measured 492.4 / 439.7), and the
  warp-specialised kernel in the other launch form (not persistent / persistent): the controls;
- overlap: the warp-specialised key loop rotated so that each step issues the next block's QK^T before
  the previous block's P V, FlashAttention-3's intra-warp-group overlap (the softmax of block j may run while the
  tensor cores do P_{j-1} V_{j-1}), at one block's products more a query block. Compiled here for sm_90 with triton
  3.9 the consumers' wgmma are all waited at once (wait_group 0), so the overlap may need Triton 3.6 to keep one in
  flight: the H200 decides; non-causal persistent and causal;
- pairs (causal): a persistent grid whose programs run whole pairs of a head's query blocks 31 - j and
  j (33 key blocks a pair, equal work), heads in order so that the ~132 programs running at once share ~8 heads'
  K/V in L2. The persistent causal order (longest first across all 128 heads: 132 heads' K/V live at once,
  more than L2) read 407.3 against 467.6 without persistence; pairs tests whether a balanced head-major persistent
  grid wins the non-causal persistent gain (+4.7%) for causal too: warp-specialised, with overlap, and on the
  two-loop kernel (whose unmasked main loop the warp-specialised path cannot have) at 128 x 64 x 8 warps x 3
  stages: persistent at 128 x 128 x 8 warps it spills (264-288 bytes of stack at 2 or 3 stages, compiled for sm_90;
  the measured persistent two-loop rows were those), at 128 x 64 it does not (255 registers, 132 KB).
Not rows: BLOCK_M 256 warp-specialised (two 128-row consumer warp groups, FA3's tile) spills under the pass's 232
registers at BLOCK_N 128 (480 bytes of stack, compiled for sm_90) and computed inf at BLOCK_N 64 (on the H200); 3 stages
at 128 x 128 need 246 KB; the diagonal blocks split from an unmasked warp-specialised loop (products outside the
loop, before or after it) and the rotated loop with a bf16 P carried across steps abort Triton's Hopper pass.

Every variant's o and lse are checked against a float64 truth at the full shape (computed head-chunk by
head-chunk) before it is timed: o's relative L2 error must be within max(1e-2, 4x SDPA cuDNN's own), lse's largest
absolute error (natural log) within 1e-3; a wrong variant prints WRONG and is not timed, a failing one (compile
error, out of resources) costs its row. Timing: triton.testing.do_bench medians (warmup 25, rep 100 ms) over 3
rotating input sets (benchmarks/_bench.py), the seed with its lse stored (2 MB beside 2 ms). 11 compiles; --budget
(default 90 s) stops starting rows. One table last: TFLOP/s = 4 B H S^2 D (half when causal) / time.

    python3 benchmarks/sweep_attention_fwd.py            # the H200, about 60-90 s with compiles
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

from _bench import attention_truth as truth  # noqa: E402
from _bench import parser, rel_l2, rotating_median_ms  # noqa: E402
from seeds import attention as A  # noqa: E402

LN2 = math.log(2.0)
SETS = 3
# (name, attention_fwd keywords). config = (BLOCK_M, BLOCK_N, warps, stages). ONLY: the one mode a row runs in
# (else both); the row of the seed's launch resolves as ModelNew does (launch_kwargs).
WS = dict(warp_specialize=True, config=(128, 128, 4, 2))
VARIANTS = [
    ("seed launch (ModelNew)", dict(SEED_LAUNCH=True)),
    ("two-loop TMA 128x128 w8 s3", dict(config=(128, 128, 8, 3))),
    ("ws 128x128 w4 s2", dict(WS)),
    ("ws 128x128 w4 s2 persistent", dict(WS, persistent=True)),
    ("ws overlap persistent", dict(WS, overlap=True, persistent=True)),
    ("ws overlap", dict(WS, overlap=True)),
    ("ws pairs (persistent)", dict(WS, persistent=True, pairs=True)),
    ("ws overlap pairs (persistent)", dict(WS, overlap=True, persistent=True, pairs=True)),
    ("two-loop pairs 128x64 w8 s3", dict(config=(128, 64, 8, 3), persistent=True, pairs=True)),
]
# the seed's launch covers ws non-causal persistent and causal not: each mode gets the other form as a control
ONLY = {"ws 128x128 w4 s2": False, "ws 128x128 w4 s2 persistent": True, "ws overlap persistent": False,
        "ws overlap": True, "ws pairs (persistent)": True, "ws overlap pairs (persistent)": True,
        "two-loop pairs 128x64 w8 s3": True}


def rows_for(causal: bool) -> list[tuple[str, dict]]:
    """The rows of one mode."""
    return [(name, kw) for name, kw in VARIANTS if ONLY.get(name, causal) == causal]


def log(t0: float, msg: str) -> None:
    print(f"[{time.time() - t0:6.1f}s] {msg}", flush=True)


def launch_kwargs(kw: dict, q: torch.Tensor, causal: bool, smoke: bool) -> dict:
    """attention_fwd keywords of a row: the seed's launch as ModelNew picks it (on the CPU: the H200's, which
    hopper_fwd_variant gives only on a GPU); smoke: at interpreter-sized tiles (a quarter of each block, one stage:
    2 query blocks of 32 rows on the 64-row smoke shape, an even count for pairs), TMA descriptors on."""
    if kw.get("SEED_LAUNCH"):
        kw = (dict(warp_specialize=True, persistent=not causal) if smoke else A.hopper_fwd_variant(q, causal))
    if not smoke:
        return kw
    bm, bn, warps, _ = kw.get("config", A.fwd_config(128, torch.device("cuda"), False, kw.get("warp_specialize")))
    return dict(kw, config=(max(16, bm // 4), max(16, bn // 4), warps, 1), tma=True)


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
    ap = parser(__doc__.splitlines()[0], budget_s=90.0)
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
        for name, kw in rows_for(causal):
            if time.time() - t0 > args.budget:
                log(t0, f"{tag} {name}: skipped (budget of {args.budget:g} s spent)")
                continue
            kw = launch_kwargs(kw, q, causal, smoke)
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
