"""H200 check and timing of the Gluon forward's do= option (seeds/attention_gluon.py: (o, lse2, delta) with the
precise delta = sum_j P_ij dP_ij), B4 H32 S4096 D128 bf16, non-causal then causal, in ONE call:

1. forward with delta: every Gluon variant that fits it (delta_ok; causal: one diagonal key block), plus the
   non-causal ModelNew launch's knobs (2 consumers, no token, persistent), against seeds/attention.py's
   attention_fwd_with_delta(precise=True) as seeds/attention_bwd.py's ModelNew launches it on sm_90
   (warp_specialize where hopper_fwd_variant says). Checked against float64 (computed on the GPU in (batch, head)
   chunks), outputs NaN-poisoned: WRONG when o's rel L2 error is above 3x SDPA cuDNN's, lse2's largest error
   (natural log) above 1e-3, or delta's rel L2 error above 3x the Triton forward's (1e-5 where that is smaller).
2. fwd+bwd: the fastest correct Gluon forward-with-delta of the mode + seeds.attention.attention_bwd(...,
   delta=delta, split_ds=True, ModelNew's config) against cuDNN SDPA + autograd (the task's reference) and the
   current Triton fwd+bwd (seeds/attention_bwd.py's ModelNew). dq, dk, dv (and o) checked against float64
   gradients: WRONG when one's rel L2 error is above 3x cuDNN's own.
Only a correct row is timed: triton.testing.do_bench medians (warmup 25, rep 100 ms) over 3 rotating input sets
(benchmarks/_bench.py). TFLOP/s: forward with delta 6 B H S^2 D (three products; half causal), fwd+bwd 14 B H S^2 D
(the tasks' convention). A failing row prints its error and costs only itself; --budget (default 480 s) stops
starting new rows.

    python3 benchmarks/sweep_attention_gluon_delta.py --budget 480   # the H200 (torch 2.11, triton 3.6)
    python3 benchmarks/sweep_attention_gluon_delta.py --smoke        # the CPU: imports, configs, the truths
--only / --skip (comma-separated substrings of the Gluon variants' names) and --mode full|causal narrow a rerun.
Rows go to $OUT/sweep_attention_gluon_delta.json when OUT is set, rewritten after every row.
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

from _bench import modes, parser, rel_l2, rotating_median_ms, selected, selection_options, versions  # noqa: E402,E501
from seeds import attention as A  # noqa: E402
from seeds import attention_bwd as AB  # noqa: E402
from seeds import attention_gluon as G  # noqa: E402

LN2 = math.log(2.0)
SETS = 3
FULL = (4, 32, 4096, 128)
SMOKE = (1, 2, 256, 128)
ERR_FACTOR = 3.0
LSE_TOL = 1e-3
# the Gluon variants the forward with delta takes, and the non-causal ModelNew launch's knobs
CANDIDATES = {**{name: kw for name, kw in G.VARIANTS.items() if G.delta_ok(kw)},
              "2 consumers no token 128x128 s2 persistent": dict(consumers=2, pingpong=False, persistent=True)}


def log(t0: float, msg: str) -> None:
    print(f"[{time.time() - t0:6.1f}s] {msg}", flush=True)


def truth(q, k, v, do, causal: bool, chunk: int, grads: bool) -> dict:
    """float64 o, lse (natural), delta = rowsum(P o dP) and (grads) dq, dk, dv, `chunk` (batch, head) pairs at a
    time: dV = P^T dO, dS = P o (dP - delta), dQ = c dS K, dK = c dS^T Q (fp32 storage, fp64 maths)."""
    b, h, s, d = q.shape
    c = 1.0 / math.sqrt(d)
    flat = [t.reshape(b * h, s, d) for t in (q, k, v, do)]
    out = {n: torch.empty(b * h, s, d, dtype=torch.float32, device=q.device) for n in
           (("o", "dq", "dk", "dv") if grads else ("o",))}
    out["lse"] = torch.empty(b * h, s, dtype=torch.float64, device=q.device)
    out["delta"] = torch.empty(b * h, s, dtype=torch.float64, device=q.device)
    mask = torch.ones(s, s, dtype=torch.bool, device=q.device).tril() if causal else None
    for i in range(0, b * h, chunk):
        sl = slice(i, i + chunk)
        qd, kd, vd, dod = (t[sl].double() for t in flat)
        scores = (qd @ kd.transpose(1, 2)) * c
        if mask is not None:
            scores.masked_fill_(~mask, float("-inf"))
        lse = torch.logsumexp(scores, dim=-1)
        prob = torch.exp(scores - lse[..., None])
        del scores
        out["lse"][sl] = lse
        out["o"][sl] = (prob @ vd).float()
        dp = dod @ vd.transpose(1, 2)
        delta = (prob * dp).sum(-1)
        out["delta"][sl] = delta
        if grads:
            out["dv"][sl] = (prob.transpose(1, 2) @ dod).float()
            ds = prob * (dp - delta[..., None])
            del prob, dp
            out["dq"][sl] = (ds @ kd * c).float()
            out["dk"][sl] = (ds.transpose(1, 2) @ qd * c).float()
            del ds
        else:
            del prob, dp
    return {n: (t.view(b, h, s) if n in ("lse", "delta") else t.view(b, h, s, d)) for n, t in out.items()}


def make_inputs(shape, device: str, seed: int, sets: int):
    gen = torch.Generator(device=device).manual_seed(seed)
    return [[torch.randn(shape, device=device, generator=gen).to(torch.bfloat16) for _ in range(4)]
            for _ in range(sets)]


def sdpa_fwd_bwd(backend: str | None):
    """q, k, v, do, causal -> (o, dq, dk, dv) through SDPA (one backend) and autograd: the task's Model."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def run(q, k, v, do, causal):
        with torch.enable_grad():
            q2, k2, v2 = (t.detach().requires_grad_() for t in (q, k, v))
            if backend is None:
                o = F.scaled_dot_product_attention(q2, k2, v2, is_causal=causal)
            else:
                chosen = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}[backend]
                with sdpa_kernel(chosen):
                    o = F.scaled_dot_product_attention(q2, k2, v2, is_causal=causal)
            dq, dk, dv = torch.autograd.grad(o, (q2, k2, v2), do)
        return o.detach(), dq, dk, dv
    return run


def triton_fwd_delta(q, k, v, do, causal, out=None):
    """(o, lse2, delta) as seeds/attention_bwd.py's ModelNew takes them (precise, warp-specialised on sm_90)."""
    ws = bool(A.hopper_fwd_variant(q, causal))
    return A.attention_fwd_with_delta(q, k, v, do, causal, precise=True, warp_specialize=ws)


def gluon_fwd_delta(knobs: dict):
    def run(q, k, v, do, causal, out=None):
        return G.attention_fwd_gluon(q, k, v, causal, out=out, do=do, **knobs)
    return run


def gluon_fwd_bwd(knobs: dict):
    """q, k, v, do, causal -> (o, dq, dk, dv): the Gluon forward with delta + the precise Triton backward with
    ModelNew's config (seeds/attention_bwd.py)."""
    def run(q, k, v, do, causal):
        o, lse, delta = G.attention_fwd_gluon(q, k, v, causal, do=do, **knobs)
        ws = bool(A.hopper_fwd_variant(q, causal))
        config = AB.CAUSAL_BWD_CONFIG if ws and causal else None
        dq, dk, dv = A.attention_bwd(do, q, k, v, o, lse, causal, delta=delta, split_ds=True, config=config)
        return o, dq, dk, dv
    return run


def triton_fwd_bwd(q, k, v, do, causal):
    return AB.ModelNew(causal).triton_forward(q, k, v, do)  # its Triton path (forward() takes Gluon on sm_90 now)


def poisoned(q: torch.Tensor):
    b, h, s, _ = q.shape
    return (torch.full(q.shape, float("nan"), dtype=q.dtype, device=q.device),
            torch.full((b, h, s), float("nan"), dtype=torch.float32, device=q.device),
            torch.full((b, h, s), float("nan"), dtype=torch.float32, device=q.device))


def lse_err(lse2, lse_true) -> float:
    return float((lse2.double() * LN2 - lse_true).abs().max()) if torch.isfinite(lse2).all() else math.inf


def smoke_run(t0: float) -> list[dict]:
    """CPU: every candidate's launch config with delta resolves and the launcher takes its arguments up to the
    CUDA check; the float64 truths (forward and gradients) run at a tiny shape against SDPA's CPU autograd."""
    rows = []
    (q, k, v, do), = make_inputs(SMOKE, "cpu", 0, 1)
    for causal in (False, True):
        t = truth(q, k, v, do, causal, chunk=1, grads=True)
        ref = sdpa_fwd_bwd(None)(q, k, v, do, causal)
        errs = {n: rel_l2(r, t[n]) for n, r in zip(("o", "dq", "dk", "dv"), ref)}
        log(t0, f"{'causal' if causal else 'non-causal'}: truths done; CPU SDPA rel L2 {errs}")
        assert all(e < 2e-2 for e in errs.values()), errs
        for name, kw in CANDIDATES.items():
            if causal and not G.causal_ok(kw):
                continue
            cfg = G.fa3_launch_config(SMOKE[3], **kw, with_delta=True)
            status = "smoke: config ok"
            try:
                G.attention_fwd_gluon(q, k, v, causal, out=poisoned(q), do=do, **kw)
                status = "smoke: launcher did not refuse the CPU"
            except ValueError as exc:
                if "CUDA" not in str(exc):
                    status = f"smoke: refused: {exc}"
            rows.append(dict(causal=causal, part="fwd+delta", variant=name, status=status, config=cfg))
    return rows


def timed(row: dict, fn, sets, causal: bool, flops: float) -> None:
    row["ms"] = rotating_median_ms(lambda i: fn(*sets[i], causal), SETS, False)
    row["tflops"] = flops / row["ms"] / 1e9


def main() -> int:
    ap = parser(__doc__.splitlines()[0], budget_s=480.0)
    selection_options(ap, "Gluon variants")
    args = ap.parse_args()
    t0 = time.time()
    print(versions(), flush=True)
    if args.smoke:
        rows = smoke_run(t0)
        for r in rows:
            print(f"{'causal' if r['causal'] else 'full':6s} {r['variant']:44s} {r['status']}")
        return 0

    b, h, s, d = FULL
    sets = make_inputs(FULL, "cuda", 0, SETS)
    rows: list[dict] = []
    for causal in modes(args):
        tag = "causal" if causal else "non-causal"
        half = 2 if causal else 1
        q, k, v, do = sets[0]
        tr = truth(q, k, v, do, causal, chunk=8, grads=True)
        log(t0, f"{tag}: float64 truths done")

        # 0. the references: cuDNN's errors set the o and gradient bounds
        ref_errs = {}
        for name, fn in (("SDPA cudnn + autograd", sdpa_fwd_bwd("cudnn")),
                         ("SDPA flash + autograd", sdpa_fwd_bwd("flash")),
                         ("Triton fwd+bwd (attention_bwd ModelNew)", triton_fwd_bwd)):
            row = dict(causal=causal, part="fwd+bwd", variant=name, ms=None, tflops=None, status="baseline")
            try:
                out = fn(q, k, v, do, causal)
                row["errs"] = {n: rel_l2(x, tr[n]) for n, x in zip(("o", "dq", "dk", "dv"), out)}
                if "cudnn" in name:
                    ref_errs = row["errs"]
                timed(row, fn, sets, causal, 14 * b * h * s * s * d / half)
            except Exception as exc:
                row["status"] = f"FAILED {type(exc).__name__}"
                log(t0, f"{tag} {name}: FAILED {type(exc).__name__}: {str(exc)[-400:]}")
            rows.append(row)
            log(t0, f"{tag} {name}: ms={row['ms']} errs={row.get('errs')}")
        bounds = {n: ERR_FACTOR * e for n, e in ref_errs.items()} or {n: 1e-2 for n in ("o", "dq", "dk", "dv")}
        log(t0, f"{tag}: WRONG above {bounds}")

        # 1. forward with delta: the Triton precise forward, then the Gluon variants
        fwd_flops = 6 * b * h * s * s * d / half
        entries = [("Triton attention_fwd_with_delta(precise)", triton_fwd_delta, False)]
        entries += [(f"gluon {name}", gluon_fwd_delta(kw), True) for name, kw in CANDIDATES.items()
                    if (not causal or G.causal_ok(kw)) and selected(name, args)]
        delta_bound = None
        ref_delta = None  # the Triton forward's delta, when it ran
        best = None  # (ms, knobs) of the fastest correct Gluon forward with delta
        for name, fn, takes_out in entries:
            row = dict(causal=causal, part="fwd+delta", variant=name, ms=None, tflops=None)
            if time.time() - t0 > args.budget:
                row["status"] = "skipped (budget)"
                rows.append(row)
                continue
            log(t0, f"{tag} {name}: compiling / checking")
            try:
                kw = dict(out=poisoned(q)) if takes_out else {}
                o, lse2, delta = fn(q, k, v, do, causal, **kw)
                row["errs"] = dict(o=rel_l2(o, tr["o"]), lse=lse_err(lse2, tr["lse"]),
                                   delta=rel_l2(delta, tr["delta"]))
                if not takes_out:  # the Triton forward: its delta error sets the bound
                    delta_bound = max(ERR_FACTOR * row["errs"]["delta"], 1e-5)
                    ref_delta = delta
                    log(t0, f"{tag}: delta WRONG above rel L2 {delta_bound:.2e}")
                elif ref_delta is not None:
                    row["errs"]["vs_triton_delta"] = rel_l2(delta, ref_delta)
                bound = delta_bound if delta_bound is not None else 1e-5
                wrong = [n for n, bad in (("o", row["errs"]["o"] > bounds["o"]), ("lse", row["errs"]["lse"] > LSE_TOL),
                                          ("delta", row["errs"]["delta"] > bound)) if bad]
                if wrong:
                    row["status"] = f"WRONG ({', '.join(wrong)})"
                else:
                    timed(row, fn, sets, causal, fwd_flops)
                    row["status"] = "ok"
                    if takes_out and (best is None or row["ms"] < best[0]):
                        best = (row["ms"], CANDIDATES[name[len("gluon "):]], name)
            except Exception as exc:
                row["status"] = f"FAILED {type(exc).__name__}"
                log(t0, f"{tag} {name}: FAILED {type(exc).__name__}: {str(exc)[-600:]}")
                traceback.print_exc(limit=3)
            rows.append(row)
            log(t0, f"{tag} {name}: {row['status']} ms={row['ms']} errs={row.get('errs')}")
            save(rows)

        # 2. fwd+bwd with the fastest correct Gluon forward
        if best is not None and time.time() - t0 <= args.budget:
            name = f"{best[2]} fwd + Triton precise bwd"
            row = dict(causal=causal, part="fwd+bwd", variant=name, ms=None, tflops=None)
            fn = gluon_fwd_bwd(best[1])
            try:
                out = fn(q, k, v, do, causal)
                row["errs"] = {n: rel_l2(x, tr[n]) for n, x in zip(("o", "dq", "dk", "dv"), out)}
                wrong = [n for n, e in row["errs"].items() if e > bounds[n]]
                if wrong:
                    row["status"] = f"WRONG ({', '.join(wrong)})"
                else:
                    timed(row, fn, sets, causal, 14 * b * h * s * s * d / half)
                    row["status"] = "ok"
            except Exception as exc:
                row["status"] = f"FAILED {type(exc).__name__}"
                log(t0, f"{tag} {name}: FAILED {type(exc).__name__}: {str(exc)[-600:]}")
                traceback.print_exc(limit=3)
            rows.append(row)
            log(t0, f"{tag} {name}: {row['status']} ms={row['ms']} errs={row.get('errs')}")
        save(rows)
        del tr
        torch.cuda.empty_cache()
    save(rows)
    print_table(rows)
    return 0


def save(rows: list[dict]) -> None:
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "sweep_attention_gluon_delta.json").write_text(json.dumps(rows, indent=1,
                                                                                         default=str))


def print_table(rows: list[dict]) -> None:
    b, h, s, d = FULL
    print(f"\nattention forward with delta and fwd+bwd, B{b} H{h} S{s} D{d} bf16; vs ref = the reference row's ms / "
          "the row's ms (> 1: faster); fwd+delta's reference: the Triton forward with delta; fwd+bwd's: SDPA cuDNN")
    print(f"{'mode':6s} {'part':9s} {'variant':58s} {'ms':>8s} {'TFLOP/s':>8s} {'vs ref':>8s}  errors / status")
    for causal in (False, True):
        for part, ref_name in (("fwd+delta", "Triton attention_fwd_with_delta(precise)"),
                               ("fwd+bwd", "SDPA cudnn + autograd")):
            mode = [r for r in rows if r["causal"] == causal and r["part"] == part]
            ref = next((r["ms"] for r in mode if r["variant"] == ref_name and r.get("ms")), None)
            for r in mode:
                ms = f"{r['ms']:.4f}" if r.get("ms") else "-"
                tf = f"{r['tflops']:.1f}" if r.get("tflops") else "-"
                vs = f"{ref / r['ms']:.3f}x" if r.get("ms") and ref else "-"
                errs = " ".join(f"{n} {e:.2e}" for n, e in (r.get("errs") or {}).items())
                print(f"{'causal' if causal else 'full':6s} {part:9s} {r['variant']:58s} {ms:>8s} {tf:>8s} {vs:>8s}  "
                      f"{errs}  {r['status']}")


if __name__ == "__main__":
    sys.exit(main())
