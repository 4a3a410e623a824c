"""H200 sweep of the Gluon FlashAttention-3-style backward (seeds/attention_gluon_bwd.py), B4 H32 S4096 D128 bf16,
non-causal then causal, in ONE call, against SDPA's cuDNN and flash backends (autograd) and seeds/attention.py's
precise Triton backward (attention_bwd(split_ds=True)) timed in the same run.

Every Gluon variant (seeds.attention_gluon_bwd.VARIANTS, the split dS; the first also with one dS operand) takes
lse2 and delta from seeds/attention.py's precise forward (attention_fwd_with_delta(precise=True), delta = sum_j P
dP). Each is first checked against a float64 truth computed on the GPU in (batch, head) chunks, at a small shape
(B2 H8 S2048) and at the full one, its outputs NaN-poisoned before each call (attention_bwd_gluon's out=): WRONG
when any of dq, dk, dv has a relative L2 error above 3x SDPA cuDNN's own for that output at that shape (SDPA
flash's when cuDNN is missing; 1e-2 when neither runs) or anything is not finite; the full-shape call is repeated
and must be bitwise the same (no atomics: "nondeterministic" otherwise). Only a correct variant is timed:
triton.testing.do_bench medians (warmup 25, rep 100 ms) over 3 rotating input sets (benchmarks/_bench.py) of the
backward alone (from that forward's saved outputs) and of forward + backward. A compile or launch failure prints
its error and costs its row; --budget (default 200 s) stops starting new rows. One table last: TFLOP/s = 10 B H
S^2 D for the backward, 14 for fwd+bwd (2.5x and 3.5x the forward's 4 B H S^2 D; half when causal; the precise
path's extra products not counted), and each row's ratio to SDPA cuDNN's time in the same mode (> 1: faster).

    python3 benchmarks/sweep_attention_gluon_bwd.py --budget 200   # the H200 (torch 2.11, triton 3.6), ~3-4 min
    python3 benchmarks/sweep_attention_gluon_bwd.py --smoke        # the CPU: imports, variant configs, the truth
--only / --skip (comma-separated substrings of the Gluon rows' names) and --mode full|causal narrow a rerun (each
row logs its name before it runs, so a hung variant shows). Rows go to $OUT/sweep_attention_gluon_bwd.json when OUT
is set, rewritten after every row.
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
from seeds import attention_gluon_bwd as GB  # noqa: E402

SETS = 3
FULL = (4, 32, 4096, 128)
SMALL = (2, 8, 2048, 128)
SMOKE = (1, 2, 256, 128)
ERR_FACTOR = 3.0   # a variant's error may be at most this times SDPA cuDNN's own, output by output
GRADS = ("dq", "dk", "dv")


def log(t0: float, msg: str) -> None:
    print(f"[{time.time() - t0:6.1f}s] {msg}", flush=True)


def truth(q, k, v, do, causal: bool, chunk: int) -> tuple[torch.Tensor, ...]:
    """(dq, dk, dv) fp32 of the float64 attention's backward, `chunk` (batch, head) pairs at a time:
    P = softmax(q k^T scale), dV = P^T dO, dP = dO V^T, dS = P (dP - rowsum(P dP)), dQ = scale dS K,
    dK = scale dS^T Q (S x S in fp64)."""
    b, h, s, d = q.shape
    scale = 1.0 / math.sqrt(d)
    qf, kf, vf, dof = (t.reshape(b * h, s, d) for t in (q, k, v, do))
    out = [torch.empty(b * h, s, d, dtype=torch.float32, device=q.device) for _ in range(3)]
    mask = torch.ones(s, s, dtype=torch.bool, device=q.device).tril() if causal else None
    for i in range(0, b * h, chunk):
        sl = slice(i, i + chunk)
        qd, kd, vd, dod = (t[sl].double() for t in (qf, kf, vf, dof))
        p = (qd @ kd.transpose(1, 2)) * scale
        if mask is not None:
            p.masked_fill_(~mask, float("-inf"))
        p = torch.softmax(p, dim=-1)
        out[2][sl] = (p.transpose(1, 2) @ dod).float()
        dp = dod @ vd.transpose(1, 2)
        dp -= (p * dp).sum(-1, keepdim=True)
        dp *= p  # dS
        out[0][sl] = (scale * (dp @ kd)).float()
        out[1][sl] = (scale * (dp.transpose(1, 2) @ qd)).float()
        del p, dp
    return tuple(t.view(b, h, s, d) for t in out)


def precise_fwd(q, k, v, do, causal):
    """seeds/attention.py's precise forward: (o, lse2, delta = sum_j P dP)."""
    return A.attention_fwd_with_delta(q, k, v, do, causal, precise=True)


def sdpa(backend: str):
    """(forward, backward, both) through SDPA + autograd with one backend: q, k, v, do, causal -> saved state /
    (dq, dk, dv)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    chosen = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}[backend]

    def fwd(q, k, v, do, causal):
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        with sdpa_kernel(chosen), torch.enable_grad():
            return F.scaled_dot_product_attention(*leaves, is_causal=causal), leaves

    def bwd(q, k, v, do, causal, saved, out=None):
        o, leaves = saved
        return torch.autograd.grad(o, leaves, do, retain_graph=True)

    def both(q, k, v, do, causal):
        o, leaves = fwd(q, k, v, do, causal)
        return torch.autograd.grad(o, leaves, do)
    return fwd, bwd, both


def triton_seed():
    """seeds/attention.py's precise fwd+bwd: attention_fwd_with_delta(precise=True) + attention_bwd(split_ds)."""
    def bwd(q, k, v, do, causal, saved, out=None):
        o, lse, delta = saved
        return A.attention_bwd(do, q, k, v, o, lse, causal, delta=delta, split_ds=True)

    def both(q, k, v, do, causal):
        return bwd(q, k, v, do, causal, precise_fwd(q, k, v, do, causal))
    return precise_fwd, bwd, both


def gluon(knobs: dict, split: bool):
    """The Gluon backward of one variant after seeds/attention.py's precise forward."""
    def bwd(q, k, v, do, causal, saved, out=None):
        _, lse, delta = saved
        return GB.attention_bwd_gluon(do, q, k, v, lse, delta, causal, split_ds=split, out=out, **knobs)

    def both(q, k, v, do, causal):
        return bwd(q, k, v, do, causal, precise_fwd(q, k, v, do, causal))
    return precise_fwd, bwd, both


def poisoned(q: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """(dq, dk, dv) buffers full of NaN: a kernel that skips an element leaves it NaN, which the check catches."""
    return tuple(torch.full(q.shape, float("nan"), dtype=q.dtype, device=q.device) for _ in range(3))


def errors(got, want) -> list[float]:
    return [rel_l2(g, t) for g, t in zip(got, want)]


def make_inputs(shape, device: str, seed: int, sets: int):
    gen = torch.Generator(device=device).manual_seed(seed)
    return [[torch.randn(shape, device=device, generator=gen).to(torch.bfloat16) for _ in range(4)]
            for _ in range(sets)]


def gluon_rows() -> list[tuple[str, dict, bool]]:
    """(row name, knobs, split): every variant with the split dS; the first also with one dS operand."""
    rows = [(f"gluon {name}", kw, True) for name, kw in GB.VARIANTS.items()]
    first, kw = next(iter(GB.VARIANTS.items()))
    rows.append((f"gluon {first} one-operand dS", kw, False))
    return rows


def smoke_run(t0: float) -> list[dict]:
    """CPU: the variants' launch configs resolve, the launcher accepts their arguments up to the CUDA check, and
    the float64 truth runs at a tiny shape (against CPU autograd). No Gluon kernel runs (the interpreter cannot)."""
    rows = []
    (q, k, v, do), = make_inputs(SMOKE, "cpu", 0, 1)
    lse = torch.zeros(SMOKE[:3])
    for causal in (False, True):
        want = truth(q, k, v, do, causal, chunk=1)
        leaves = [t.double().requires_grad_() for t in (q, k, v)]
        o = F.scaled_dot_product_attention(*leaves, is_causal=causal)
        auto = torch.autograd.grad(o, leaves, do.double())
        log(t0, f"{'causal' if causal else 'non-causal'}: truth vs float64 autograd rel L2 "
                f"{', '.join(f'{e:.1e}' for e in errors(want, auto))}")
        for name, kw, split in gluon_rows():
            cfg = GB.bwd_launch_config(SMOKE[3], split_ds=split, **kw)
            status = "smoke: config ok"
            try:
                GB.attention_bwd_gluon(do, q, k, v, lse, lse, causal, split_ds=split, out=poisoned(q), **kw)
                status = "smoke: launcher did not refuse the CPU"
            except ValueError as exc:
                if "CUDA" not in str(exc):
                    status = f"smoke: refused: {exc}"
            rows.append(dict(causal=causal, variant=name, bwd_ms=None, both_ms=None, err=None, small_err=None,
                             status=status, config=cfg))
    return rows


def main() -> int:
    ap = parser(__doc__.splitlines()[0], budget_s=200.0)
    selection_options(ap, "Gluon rows")
    args = ap.parse_args()
    t0 = time.time()
    print(versions(), flush=True)
    if args.smoke:
        rows = smoke_run(t0)
        print_table(rows, FULL, smoke=True)
        return 0

    b, h, s, d = FULL
    sets = make_inputs(FULL, "cuda", 0, SETS)
    small = make_inputs(SMALL, "cuda", 1, 1)[0]
    rows: list[dict] = []
    for causal in modes(args):
        tag = "causal" if causal else "non-causal"
        half = 2 if causal else 1
        fl_bwd, fl_both = 10 * b * h * s * s * d / half, 14 * b * h * s * s * d / half
        full = sets[0]
        small_true = truth(*small, causal, chunk=16)
        full_true = truth(*full, causal, chunk=8)
        small_saved, full_saved = precise_fwd(*small, causal), precise_fwd(*full, causal)
        log(t0, f"{tag}: float64 truths and the precise forward's lse2 / delta done")

        entries = [("SDPA cudnn", sdpa("cudnn"), "baseline"), ("SDPA flash", sdpa("flash"), "baseline"),
                   ("seed attention_bwd precise (Triton)", triton_seed(), "seed")]
        entries += [(name, gluon(kw, split), "gluon") for name, kw, split in gluon_rows()
                    if selected(name, args)]
        bounds: dict[str, list[float]] = {}
        for name, fns, kind in entries:
            fwd, bwd, both = fns
            row = dict(causal=causal, variant=name, bwd_ms=None, both_ms=None, err=None, small_err=None,
                       status=kind)
            if time.time() - t0 > args.budget and kind == "gluon":
                row["status"] = "skipped (budget)"
                rows.append(row)
                log(t0, f"{tag} {name}: skipped (budget of {args.budget:g} s spent)")
                continue
            log(t0, f"{tag} {name}: compiling / checking")
            try:
                if kind == "baseline":
                    ss, fs = fwd(*small, causal), fwd(*full, causal)
                else:
                    ss, fs = small_saved, full_saved
                takes_out = kind == "gluon"
                got_small = bwd(*small, causal, ss, out=poisoned(small[1]) if takes_out else None)
                row["small_err"] = errors(got_small, small_true)
                got_full = bwd(*full, causal, fs, out=poisoned(full[1]) if takes_out else None)
                row["err"] = errors(got_full, full_true)
                if kind == "baseline":
                    bounds.setdefault("small", [ERR_FACTOR * e for e in row["small_err"]])
                    bounds.setdefault("full", [ERR_FACTOR * e for e in row["err"]])
                b_small = bounds.get("small", [1e-2] * 3)
                b_full = bounds.get("full", [1e-2] * 3)
                wrong = [f"{where} {g}" for where, errs, bnd in (("small", row["small_err"], b_small),
                                                                 ("full", row["err"], b_full))
                         for g, e, bb in zip(GRADS, errs, bnd) if not e <= bb]
                if kind == "gluon" and not wrong:
                    again = bwd(*full, causal, fs)
                    if not all(torch.equal(x, y) for x, y in zip(got_full, again)):
                        wrong.append("nondeterministic")
                    del again
                del got_small, got_full
                if wrong and kind != "baseline":
                    row["status"] = f"WRONG ({', '.join(wrong)})"
                else:
                    saved = [fs] + [fwd(*x, causal) if kind == "baseline" else precise_fwd(*x, causal)
                                    for x in sets[1:]]
                    row["bwd_ms"] = rotating_median_ms(lambda i: bwd(*sets[i], causal, saved[i]), SETS, False)
                    del saved
                    row["both_ms"] = rotating_median_ms(lambda i: both(*sets[i], causal), SETS, False)
                    row["bwd_tflops"] = fl_bwd / row["bwd_ms"] / 1e9
                    row["both_tflops"] = fl_both / row["both_ms"] / 1e9
                    row["status"] = "ok" if kind != "baseline" else "baseline"
            except Exception as exc:  # one failing row costs itself, not the run
                row["status"] = f"FAILED {type(exc).__name__}"
                log(t0, f"{tag} {name}: FAILED {type(exc).__name__}: {str(exc)[-600:]}")
                traceback.print_exc(limit=3)
            rows.append(row)
            log(t0, f"{tag} {name}: {row['status']} bwd_ms={row['bwd_ms']} both_ms={row['both_ms']} "
                    f"err={row['err']} small_err={row['small_err']}")
            if kind == "baseline" and name == "SDPA flash":
                log(t0, f"{tag}: WRONG above rel L2 (dq, dk, dv) small {bounds.get('small')}, "
                        f"full {bounds.get('full')}")
            save(rows)  # after every row: a run killed mid-way (a hung kernel) keeps what it measured
        del full_true, small_true, small_saved, full_saved
        torch.cuda.empty_cache()
    save(rows)
    print_table(rows, FULL, smoke=False)
    return 0


def save(rows: list[dict]) -> None:
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "sweep_attention_gluon_bwd.json").write_text(json.dumps(rows, indent=1, default=str))


def print_table(rows: list[dict], shape, smoke: bool) -> None:
    b, h, s, d = shape
    what = "SMOKE (CPU: configs only, nothing timed)" if smoke else f"B{b} H{h} S{s} D{d} bf16"
    print(f"\nattention backward, {what}"
          "; vs cuDNN = SDPA cuDNN's ms / the row's ms (> 1: faster); errors: rel L2 against float64, dq/dk/dv")
    print(f"{'mode':6s} {'variant':46s} {'bwd ms':>8s} {'TFLOP/s':>8s} {'vs cuDNN':>9s} {'f+b ms':>8s} "
          f"{'TFLOP/s':>8s} {'vs cuDNN':>9s} {'full err dq/dk/dv':>26s} {'small err':>26s}  correctness")
    for causal in (False, True):
        mode = [r for r in rows if r["causal"] == causal]
        if not mode:
            continue
        cudnn = next((r for r in mode if r["variant"] == "SDPA cudnn" and r["bwd_ms"]), None)

        def cells(r, key):
            ms = r.get(f"{key}_ms")
            if not ms:
                return "-", "-", "-"
            tf = r.get(f"{key}_tflops")
            base = cudnn.get(f"{key}_ms") if cudnn else None
            return f"{ms:.3f}", f"{tf:.1f}" if tf else "-", f"{base / ms:.3f}x" if base else "-"

        for r in mode:
            bw, fb = cells(r, "bwd"), cells(r, "both")
            fe = "/".join(f"{e:.1e}" for e in r["err"]) if r.get("err") else "-"
            se = "/".join(f"{e:.1e}" for e in r["small_err"]) if r.get("small_err") else "-"
            print(f"{'causal' if causal else 'full':6s} {r['variant']:46s} {bw[0]:>8s} {bw[1]:>8s} {bw[2]:>9s} "
                  f"{fb[0]:>8s} {fb[1]:>8s} {fb[2]:>9s} {fe:>26s} {se:>26s}  {r['status']}")


if __name__ == "__main__":
    sys.exit(main())
