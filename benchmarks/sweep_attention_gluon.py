"""H200 sweep of the Gluon FlashAttention-3-style forward (seeds/attention_gluon.py), B4 H32 S4096 D128 bf16,
non-causal then causal, in ONE call, against SDPA's cuDNN and flash backends and seeds/attention.py (its
attention_fwd defaults, and the launch ModelNew takes on sm_90) timed in the same run.

Every Gluon variant (seeds.attention_gluon.VARIANTS; causal: those with one diagonal key block, the persistent
ones over pairs of query tiles) is first checked against a float64 truth computed on the GPU in (batch, head)
chunks, at a small shape (B2 H8 S2048: 256 tiles, so the persistent rows loop over tiles) and at the full shape,
its outputs NaN-poisoned before each call
(attention_fwd_gluon's out=): WRONG when o's relative L2 error is above 3x SDPA cuDNN's own at that shape (SDPA
flash's when cuDNN is missing; 1e-2 when neither runs), when anything is not finite, or when lse's largest error
(natural log) is above 1e-3. Only a correct variant is timed: triton.testing.do_bench medians (warmup 25, rep
100 ms) over 3 rotating input sets (benchmarks/_bench.py). A compile or launch failure prints its error and costs
its row; --budget (default 240 s) stops starting new rows. One table last: TFLOP/s = 4 B H S^2 D (half when causal)
/ time, and each row's ratio to SDPA cuDNN's time in the same mode (> 1: faster than cuDNN).

    python3 benchmarks/sweep_attention_gluon.py --budget 240   # the H200 (torch 2.11, triton 3.6)
    python3 benchmarks/sweep_attention_gluon.py --smoke        # the CPU: imports, variant configs, the truth
--only / --skip (comma-separated substrings of the Gluon variants' names) and --mode full|causal narrow a rerun
(say, past a variant that hung: each row logs its name before it runs). Rows go to
$OUT/sweep_attention_gluon.json when OUT is set, rewritten after every row. The do= option (the forward with the
precise delta, and the fwd+bwd built on it): benchmarks/sweep_attention_gluon_delta.py.
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

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from _bench import attention_truth as truth  # noqa: E402
from _bench import modes, parser, rel_l2, rotating_median_ms, selected, selection_options, versions  # noqa: E402,E501
from seeds import attention as A  # noqa: E402
from seeds import attention_gluon as G  # noqa: E402

LN2 = math.log(2.0)
SETS = 3
FULL = (4, 32, 4096, 128)
SMALL = (2, 8, 2048, 128)
SMOKE = (1, 2, 256, 128)
ERR_FACTOR = 3.0   # a variant's o error may be at most this times SDPA's own
LSE_TOL = 1e-3     # natural-log units


def log(t0: float, msg: str) -> None:
    print(f"[{time.time() - t0:6.1f}s] {msg}", flush=True)


def sdpa(backend: str):
    """q, k, v, causal -> o through SDPA with one backend."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    chosen = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}[backend]

    def run(q, k, v, causal):
        with sdpa_kernel(chosen):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return run


def seed_fn(modelnew: bool):
    """q, k, v, causal -> (o, lse2) through seeds/attention.py: attention_fwd's defaults, or the launch ModelNew
    takes on sm_90 (hopper_fwd_variant)."""
    def run(q, k, v, causal):
        kw = A.hopper_fwd_variant(q, causal) if modelnew else {}
        return A.attention_fwd(q, k, v, causal, **kw)
    return run


def gluon_fn(knobs: dict):
    """q, k, v, causal, out -> (o, lse2) through the Gluon kernel with one variant's knobs."""
    def run(q, k, v, causal, out=None):
        return G.attention_fwd_gluon(q, k, v, causal, out=out, **knobs)
    return run


def poisoned(q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(o, lse) buffers full of NaN: a kernel that skips an element leaves it NaN, which the check catches."""
    b, h, s, _ = q.shape
    return (torch.full(q.shape, float("nan"), dtype=q.dtype, device=q.device),
            torch.full((b, h, s), float("nan"), dtype=torch.float32, device=q.device))


def check(o, lse2, o_true, lse_true, bound: float) -> tuple[str, float, float | None]:
    """(status, o rel L2, lse max error in natural log) of one output against the float64 truth."""
    err = rel_l2(o, o_true)
    lse_err = None
    if lse2 is not None:
        lse_err = float((lse2.double() * LN2 - lse_true).abs().max()) if torch.isfinite(lse2).all() else math.inf
    ok = err <= bound and (lse_err is None or lse_err <= LSE_TOL)
    return ("ok" if ok else "WRONG"), err, lse_err


def make_inputs(shape, device: str, seed: int, sets: int):
    gen = torch.Generator(device=device).manual_seed(seed)
    return [[torch.randn(shape, device=device, generator=gen).to(torch.bfloat16) for _ in range(3)]
            for _ in range(sets)]


def variants_for(causal: bool) -> list[tuple[str, dict]]:
    return [(name, kw) for name, kw in G.VARIANTS.items() if not causal or G.causal_ok(kw)]


def smoke_run(t0: float) -> list[dict]:
    """CPU: the variants' launch configs resolve, the launcher accepts their arguments up to the CUDA check, and
    the float64 truth runs at a tiny shape. No Gluon kernel runs (the interpreter cannot)."""
    rows = []
    (q, k, v), = make_inputs(SMOKE, "cpu", 0, 1)
    for causal in (False, True):
        o_true, lse_true = truth(q, k, v, causal, chunk=1)
        ref = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        log(t0, f"{'causal' if causal else 'non-causal'}: truth done; CPU SDPA rel L2 {rel_l2(ref, o_true):.2e}")
        for name, kw in variants_for(causal):
            cfg = G.fa3_launch_config(SMOKE[3], **kw)
            status = "smoke: config ok"
            try:
                G.attention_fwd_gluon(q, k, v, causal, out=poisoned(q), **kw)
                status = "smoke: launcher did not refuse the CPU"
            except ValueError as exc:
                if "CUDA" not in str(exc):
                    status = f"smoke: refused: {exc}"
            rows.append(dict(causal=causal, variant=name, ms=None, tflops=None, o_err=None, lse_err=None,
                             small_err=None, status=status, config=cfg))
    return rows


def main() -> int:
    ap = parser(__doc__.splitlines()[0], budget_s=240.0)
    selection_options(ap, "Gluon variants")
    args = ap.parse_args()
    t0 = time.time()
    print(versions(), flush=True)
    if args.smoke:
        rows = smoke_run(t0)
        print_table(rows, FULL, smoke=True)
        return 0

    dev = "cuda"
    b, h, s, d = FULL
    sets = make_inputs(FULL, dev, 0, SETS)
    small = make_inputs(SMALL, dev, 1, 1)[0]
    rows: list[dict] = []
    for causal in modes(args):
        tag = "causal" if causal else "non-causal"
        flops = 4 * b * h * s * s * d / (2 if causal else 1)
        q, k, v = sets[0]
        small_true = truth(*small, causal, chunk=16)
        o_true, lse_true = truth(q, k, v, causal, chunk=8)
        log(t0, f"{tag}: float64 truths done")

        # baselines: SDPA's errors set the bounds
        bounds = {}
        for name in ("cudnn", "flash"):
            fn = sdpa(name)
            row = dict(causal=causal, variant=f"SDPA {name}", ms=None, tflops=None, o_err=None, lse_err=None,
                       small_err=None, status="baseline")
            try:
                row["small_err"] = rel_l2(fn(*small, causal), small_true[0])
                row["o_err"] = rel_l2(fn(q, k, v, causal), o_true)
                bounds.setdefault("small", ERR_FACTOR * row["small_err"])
                bounds.setdefault("full", ERR_FACTOR * row["o_err"])
                row["ms"] = rotating_median_ms(lambda i: fn(*sets[i], causal), SETS, False)
                row["tflops"] = flops / row["ms"] / 1e9
            except Exception as exc:  # a backend this build lacks costs its row
                row["status"] = f"FAILED {type(exc).__name__}"
                log(t0, f"{tag} SDPA {name}: FAILED {type(exc).__name__}: {str(exc)[-300:]}")
            rows.append(row)
            log(t0, f"{tag} SDPA {name}: ms={row['ms']} o_err={row['o_err']} small_err={row['small_err']}")
        b_small, b_full = bounds.get("small", 1e-2), bounds.get("full", 1e-2)
        log(t0, f"{tag}: WRONG above o rel L2 {b_small:.2e} (small), {b_full:.2e} (full)")

        # the current Triton seed (no out=: it allocates its own outputs), then the Gluon variants
        entries = [("seed attention_fwd defaults", seed_fn(False), False),
                   ("seed ModelNew launch (sm_90)", seed_fn(True), False)]
        entries += [(f"gluon {name}", gluon_fn(kw), True) for name, kw in variants_for(causal)
                    if selected(name, args)]
        for name, fn, takes_out in entries:
            row = dict(causal=causal, variant=name, ms=None, tflops=None, o_err=None, lse_err=None, small_err=None)
            if time.time() - t0 > args.budget:
                row["status"] = "skipped (budget)"
                rows.append(row)
                log(t0, f"{tag} {name}: skipped (budget of {args.budget:g} s spent)")
                continue
            log(t0, f"{tag} {name}: compiling / checking")
            try:
                kw = dict(out=poisoned(small[0])) if takes_out else {}
                st_small, row["small_err"], lse_small = check(*fn(*small, causal, **kw), *small_true, b_small)
                kw = dict(out=poisoned(q)) if takes_out else {}
                st_full, row["o_err"], row["lse_err"] = check(*fn(q, k, v, causal, **kw), o_true, lse_true, b_full)
                if lse_small is not None and row["lse_err"] is not None:
                    row["lse_err"] = max(row["lse_err"], lse_small)
                wrong = [where for where, st in (("small", st_small), ("full", st_full)) if st != "ok"]
                if wrong:
                    row["status"] = f"WRONG ({', '.join(wrong)})"
                else:
                    row["ms"] = rotating_median_ms(lambda i: fn(*sets[i], causal), SETS, False)
                    row["tflops"] = flops / row["ms"] / 1e9
                    row["status"] = "ok"
            except Exception as exc:  # one failing variant costs its row, not the run
                row["status"] = f"FAILED {type(exc).__name__}"
                log(t0, f"{tag} {name}: FAILED {type(exc).__name__}: {str(exc)[-600:]}")
                traceback.print_exc(limit=3)
            rows.append(row)
            log(t0, f"{tag} {name}: {row['status']} ms={row['ms']} o_err={row['o_err']} "
                    f"small_err={row['small_err']} lse_err={row['lse_err']}")
            save(rows)  # after every row: a run killed mid-way (a hung kernel) keeps what it measured
        del o_true, lse_true, small_true
        torch.cuda.empty_cache()
    save(rows)
    print_table(rows, FULL, smoke=False)
    return 0


def save(rows: list[dict]) -> None:
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "sweep_attention_gluon.json").write_text(json.dumps(rows, indent=1, default=str))


def print_table(rows: list[dict], shape, smoke: bool) -> None:
    b, h, s, d = shape
    print(f"\nattention forward, {'SMOKE (CPU: configs only, nothing timed)' if smoke else f'B{b} H{h} S{s} D{d} bf16'}"
          "; vs cuDNN = cuDNN's ms / the row's ms (> 1: faster than SDPA cuDNN)")
    print(f"{'mode':6s} {'variant':42s} {'ms':>8s} {'TFLOP/s':>8s} {'vs cuDNN':>9s} {'o relL2':>9s} {'small':>9s} "
          f"{'lse err':>8s}  correctness")
    for causal in (False, True):
        mode = [r for r in rows if r["causal"] == causal]
        if not mode:
            continue
        cudnn = next((r["ms"] for r in mode if r["variant"] == "SDPA cudnn" and r["ms"]), None)
        for r in mode:
            ms = f"{r['ms']:.4f}" if r["ms"] else "-"
            tf = f"{r['tflops']:.1f}" if r["tflops"] else "-"
            vs = f"{cudnn / r['ms']:.3f}x" if r["ms"] and cudnn else "-"
            oe = f"{r['o_err']:.2e}" if r["o_err"] is not None else "-"
            se = f"{r['small_err']:.2e}" if r["small_err"] is not None else "-"
            le = f"{r['lse_err']:.1e}" if r["lse_err"] is not None else "-"
            print(f"{'causal' if causal else 'full':6s} {r['variant']:42s} {ms:>8s} {tf:>8s} {vs:>9s} {oe:>9s} "
                  f"{se:>9s} {le:>8s}  {r['status']}")


if __name__ == "__main__":
    sys.exit(main())
