"""H200 check and timing of attention forward + backward through the Gluon kernels (seeds/attention_gluon_train.py),
B4 H32 S4096 D128 bf16, non-causal then causal, in ONE call: the bf16 precise numerics, the fp16 working copies
(delta from the forward's dP, or rowsum(dO o O)), a few forward knobs, against SDPA cuDNN + autograd (the tasks'
reference), SDPA FlashAttention-2 and the Triton fwd+bwd (seeds/attention_bwd.py's ModelNew with PRECISE and no
Gluon, i.e. the seed before the Gluon path).

Each row: o, dq, dk, dv against float64 (sweep_attention_gluon_delta.truth) by the harness's own rule
(sandbox/tolerance.compare, cuDNN's output as the reference, FlashAttention-2's as the alternate), on the normal
draw the timing uses; relative L2 errors printed. Only a row inside the bound is timed: do_bench medians over 3
rotating input sets (benchmarks/_bench.py). TFLOP/s: 14 B H S^2 D (the tasks' convention; half causal).
The harness's other draws and shapes are `crucible check`'s job (`crucible check TASK SEED --device cuda --no-timing`).

    python3 benchmarks/sweep_attention_train.py --budget 240   # the H200 (torch 2.11, triton 3.6)
    python3 benchmarks/sweep_attention_train.py --smoke        # the CPU: imports, the exponent rule
Rows go to $OUT/sweep_attention_train.json when OUT is set, rewritten after every row.
"""
from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import torch  # noqa: E402

from _bench import modes, parser, rel_l2, rotating_median_ms, selected, selection_options, versions  # noqa: E402,E501
from sweep_attention_gluon_delta import make_inputs, sdpa_fwd_bwd, truth  # noqa: E402
from sandbox.tolerance import compare  # noqa: E402
from seeds import attention_bwd as AB  # noqa: E402
from seeds import attention_gluon_train as T  # noqa: E402

SETS = 3
FULL = (4, 32, 4096, 128)
NAMES = ("o", "dq", "dk", "dv")


def triton_fwd_bwd(q, k, v, do, causal):
    """seeds/attention_bwd.py's Triton path (the seed before the Gluon one)."""
    return AB.ModelNew(causal).triton_forward(q, k, v, do)


def gluon(numerics: str, delta: str = "dp", fwd: dict | None = None, bwd: dict | None = None,
          prep: str | None = None):
    def run(q, k, v, do, causal):
        return T.attention_fwd_bwd_gluon(q, k, v, do, causal, numerics=numerics, delta=delta, fwd_knobs=fwd,
                                         bwd_knobs=bwd, prep=prep)
    return run


def candidates(causal: bool) -> dict:
    rows = {"gluon bf16 precise": gluon("bf16"),
            "gluon fp16 delta dP": gluon("fp16"),
            "gluon fp16 delta o": gluon("fp16", "o"),
            "gluon fp16 delta o, prep two (session 9)": gluon("fp16", "o", prep="two"),
            "gluon fp16 delta o, bwd dq 128x64": gluon("fp16", "o", bwd=dict()),
            "gluon fp16 delta o, bwd s4 / dq s3": gluon("fp16", "o", bwd=dict(stages=4, dq_stages=3)),
            "gluon fp16 delta o, dQ ordered v2": gluon("fp16", "o", bwd=dict(dq_ordered=True, dq_defer=False)),
            "gluon fp16 delta o, dQ ordered v2 deferred": gluon("fp16", "o", bwd=dict(dq_ordered=True,
                                                                                     dq_defer=True))}
    rows["gluon fp16 delta o, bwd plain (session 10)"] = gluon("fp16", "o", bwd=dict(dq_block_n=128))
    rows["gluon fp16 delta o, bwd pdl"] = gluon("fp16", "o", bwd=dict(dq_block_n=128, pdl=True))
    if causal:
        rows["gluon fp16 delta o, fwd pingpong s2"] = gluon("fp16", "o", fwd=dict(consumers=2))
        for g, pdl in ((4, False), (8, False), (4, True)):  # causal programs heaviest first across groups of heads
            rows[f"gluon fp16 delta o, bwd grouped by {g}{' + pdl' if pdl else ''}"] = gluon(
                "fp16", "o", bwd=dict(dq_block_n=128, group_heads=g, pdl=pdl))
    else:
        rows["gluon fp16 delta o, fwd persistent"] = gluon("fp16", "o", fwd=dict(consumers=2, pingpong=False,
                                                                                persistent=True))
    return rows


def parts(causal: bool) -> dict:
    """The fp16 delta-o path's parts alone (no check: their outputs are the path's), on the first set: the
    fused preparation (and the earlier two kernels), the forward with do's copy in its epilogue and o as bf16."""
    def prep(q, k, v, do, causal):
        return T.fused_copies(q, k, v, do)

    def prep_two(q, k, v, do, causal):
        return T.fp16_copies(q, k, v, do, T.fp16_exponent(q, k, v, do))

    def fwd(q16, k16, v16, do16, causal, do):
        return T.attention_fwd_gluon(q16, k16, v16, causal, do=do, delta_from="o", o_dtype=torch.bfloat16,
                                     do16_out=do16, do_scale=4.0, **T.FWD_KNOBS[causal])

    def bwd(q16, k16, v16, do16, causal, lse2, dlt):
        return T.attention_bwd_gluon(do16, q16, k16, v16, lse2, dlt, causal, split_ds=False,
                                     out_dtype=torch.bfloat16, grad_scale=0.25, **T.BWD_KNOBS[causal])
    return {"part: prep fused (copies + amax, sync)": prep, "part: prep two (amax, sync, copies)": prep_two,
            "part: fwd fp16 delta o, do cast, bf16 o": fwd, "part: bwd fp16": bwd}


def log(t0: float, msg: str) -> None:
    print(f"[{time.time() - t0:6.1f}s] {msg}", flush=True)


def smoke(t0: float) -> int:
    """CPU: the exponent rule at its edges, the launcher's refusal of CPU tensors, the candidates' names."""
    assert T.fp16_exponent_of(5.0, 5.0, 5.0, 5.0, 128) == 2  # 2 x 128 x 25 x 2^2 <= 2^15 < x 2^3
    assert T.fp16_exponent_of(400.0, 400.0, 400.0, 400.0, 128) is None
    assert T.fp16_exponent_of(40000.0, 1.0, 1.0, 1.0, 128) is None
    assert T.fp16_exponent_of(1.0, 1.0, 1.0, 0.0, 128) == 0
    q = torch.zeros(1, 1, 256, 128, dtype=torch.bfloat16)
    assert not T.train_ok(q, q, q, q, False)
    for causal in (False, True):
        log(t0, f"{'causal' if causal else 'non-causal'}: {list(candidates(causal))}")
    return 0


def main() -> int:
    ap = parser(__doc__.splitlines()[0], budget_s=240.0)
    selection_options(ap, "candidates")
    args = ap.parse_args()
    t0 = time.time()
    print(versions(), flush=True)
    if args.smoke:
        return smoke(t0)
    b, h, s, d = FULL
    sets = make_inputs(FULL, "cuda", 0, SETS)
    rows: list[dict] = []
    for causal in modes(args):
        tag = "causal" if causal else "non-causal"
        flops = 14 * b * h * s * s * d / (2 if causal else 1)
        q, k, v, do = sets[0]
        tr = truth(q, k, v, do, causal, chunk=8, grads=True)
        log(t0, f"{tag}: float64 truths done; fp16 exponent {T.fp16_exponent(q, k, v, do)}")
        ref = sdpa_fwd_bwd("cudnn")(q, k, v, do, causal)
        alt = sdpa_fwd_bwd("flash")(q, k, v, do, causal)
        entries = [("SDPA cudnn + autograd", sdpa_fwd_bwd("cudnn"), True),
                   ("SDPA flash + autograd", sdpa_fwd_bwd("flash"), True),
                   ("Triton fwd+bwd (the seed before)", triton_fwd_bwd, False)]
        entries += [(n, fn, False) for n, fn in candidates(causal).items() if selected(n, args)]
        for name, fn, baseline in entries:
            row = dict(causal=causal, variant=name, ms=None, tflops=None)
            if time.time() - t0 > args.budget:
                row["status"] = "skipped (budget)"
                rows.append(row)
                continue
            try:
                out = fn(q, k, v, do, causal)
                torch.cuda.synchronize()
                row["errs"] = {n: rel_l2(x, tr[n]) for n, x in zip(NAMES, out)}
                bad = [compare(f"{name} {n}", x, r, tr[n], alternates=(a,)) for n, x, r, a in zip(NAMES, out, ref, alt)]
                bad = [m for m in bad if m is not None]
                row["status"] = "baseline" if baseline else ("ok" if not bad else "OUTSIDE: " + bad[0].describe()[:300])
                if baseline or not bad:
                    row["ms"] = rotating_median_ms(lambda i: fn(*sets[i], causal), SETS, False)
                    row["tflops"] = flops / row["ms"] / 1e9
            except Exception as exc:
                row["status"] = f"FAILED {type(exc).__name__}: {str(exc)[-300:]}"
                traceback.print_exc(limit=4)
            rows.append(row)
            log(t0, f"{tag} {name}: {row['status']} ms={row['ms']} errs={row.get('errs')}")
            save(rows)
        del tr, ref, alt
        torch.cuda.empty_cache()
        if time.time() - t0 <= args.budget:  # where the fp16 delta-o path's time goes
            copies = T.fp16_copies(q, k, v, do, 2)
            _, lse2, dlt = T.attention_fwd_gluon(*copies[:3], causal, do=copies[3], delta_from="o",
                                                 **T.FWD_KNOBS[causal])
            for name, fn in parts(causal).items():
                args_ = (q, k, v, do) if name.startswith("part: prep") else copies
                extra = (lse2, dlt) if name == "part: bwd fp16" else (do,) if name.startswith("part: fwd") else ()
                ms = rotating_median_ms(lambda i: fn(*args_, causal, *extra), 1, False)
                rows.append(dict(causal=causal, variant=name, ms=ms, tflops=None, status="part"))
                log(t0, f"{tag} {name}: {ms:.3f} ms")
            save(rows)
    print_table(rows)
    return 0


def save(rows: list[dict]) -> None:
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "sweep_attention_train.json").write_text(json.dumps(rows, indent=1, default=str))


def print_table(rows: list[dict]) -> None:
    b, h, s, d = FULL
    print(f"\nattention fwd+bwd, B{b} H{h} S{s} D{d} bf16; vs cuDNN = SDPA cuDNN's ms / the row's ms (> 1: faster); "
          "errors: rel L2 against float64; status: the harness's rule on this draw")
    print(f"{'mode':6s} {'variant':50s} {'ms':>8s} {'TFLOP/s':>8s} {'vs cuDNN':>9s}  {'o/dq/dk/dv rel L2':34s} status")
    for causal in (False, True):
        mode = [r for r in rows if r["causal"] == causal]
        ref = next((r["ms"] for r in mode if r["variant"] == "SDPA cudnn + autograd" and r.get("ms")), None)
        for r in mode:
            ms = f"{r['ms']:.3f}" if r.get("ms") else "-"
            tf = f"{r['tflops']:.1f}" if r.get("tflops") else "-"
            vs = f"{ref / r['ms']:.3f}x" if r.get("ms") and ref else "-"
            errs = "/".join(f"{e:.1e}" for e in (r.get("errs") or {}).values())
            print(f"{'causal' if causal else 'full':6s} {r['variant']:50s} {ms:>8s} {tf:>8s} {vs:>9s}  {errs:34s} "
                  f"{r['status'][:60]}")


if __name__ == "__main__":
    sys.exit(main())
