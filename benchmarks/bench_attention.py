"""H200 benchmark of the attention seeds (seeds/attention.py, attention_bwd.py, decode.py, decode_paged.py) in ONE call.

1. correctness on small odd shapes (rel L2 against float64, next to SDPA bf16's own error): forward and backward,
   causal or not, GQA, D 64/128, varlen; decode dense and paged;
2. correctness at the ANCHORS shapes against SDPA in bf16 (float64 would need S x S in fp64: too big);
3. timing with triton.testing.do_bench(warmup=25, rep=100, return_mode="median"), rotating over 3 input sets:
   seed (default heuristic and 3-4 tile variants) vs SDPA's flash backend vs SDPA's cuDNN backend
   (torch.nn.attention.sdpa_kernel), forward and forward+backward, causal and not (B4 H32 S4096 D128 bf16), and
   decode (batch 64, 8k KV, GQA 32/8, D128) dense and paged vs SDPA enable_gqa;
4. a table last: op, impl, ms, TFLOP/s (attention) or GB/s on the KV bytes (decode), vs the best SDPA backend.
Each part is guarded, so a failing variant (compile error, out of shared memory) costs its row, not the run.

    python3 benchmarks/bench_attention.py [--quick] [--smoke]
    python3 benchmarks/bench_attention.py --hopper [--smoke]
--smoke runs on the CPU interpreter at tiny shapes with a wall-clock timer: it checks this script, not speed.
--quick was run on the H200 (docs/BENCHMARKS.md).

--hopper (the Hopper variants; <= 150 s): only the training-attention rows, B4 H32 S4096 D128 bf16, causal
and not. Every variant is checked against a float64 truth on two heads of the last batch (the largest row
offsets) before it is timed, and a wrong one is marked WRONG. Forward: the pointer path, TMA descriptors at
128 x 64 / 128 x 128 tiles and 2-4 stages, warp specialisation, and (causal) the forward launch order; fwd+bwd:
pointer vs TMA backward around the current tiles. SDPA's flash and cuDNN backends in the same run. One odd shape
(S 1000, GQA 8/2) checks the TMA default's masked tails. A time guard per section skips what does not fit (one
line each). Rows also go to $OUT/bench_attention.json when OUT is set.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

if "--smoke" in sys.argv:
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import triton  # noqa: E402
import triton.testing  # noqa: E402

from seeds import attention as A  # noqa: E402
from seeds import decode as DEC  # noqa: E402
from _bench import rotating_median_ms  # noqa: E402
from _bench import rel_l2 as rel_l2_vs  # noqa: E402

T0 = time.time()
ROWS: list[dict] = []
CHECKS: list[dict] = []
SMOKE = "--smoke" in sys.argv
DEV = "cpu" if SMOKE else "cuda"
HBM_GBPS = 4244.0  # device-to-device copy ceiling (ANCHORS.md)
MATMUL_TFLOPS = 694.0  # cuBLAS bf16 8192^3 (ANCHORS.md): the ceiling the attention rows are read against


def log(msg: str) -> None:
    print(f"[{time.time() - T0:6.1f}s] {msg}", flush=True)


def guarded(fn):
    def run(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except Exception as exc:  # one failing variant costs its row, not the run
            log(f"FAILED {fn.__name__}{args}: {type(exc).__name__}: {exc}")
            traceback.print_exc(limit=3)
            return None
    return run


def bench(fn, sets: int = 3) -> float:
    return rotating_median_ms(fn, sets, SMOKE)


def rel_l2(got: torch.Tensor, truth: torch.Tensor) -> float:
    g, t = got.double(), truth.double()
    if not torch.isfinite(g).all():
        return float("inf")
    return float((g - t).norm()) / max(float(t.norm()), 1e-30)


def check(op: str, names, got, ref, truth) -> None:
    for name, g, r, t in zip(names, got, ref, truth):
        row = {"op": op, "output": name, "seed": rel_l2(g, t), "sdpa": rel_l2(r, t)}
        floor = 1e-2 if g.dtype == torch.bfloat16 else 2e-3
        row["ok"] = row["seed"] <= max(floor, 4 * row["sdpa"])
        CHECKS.append(row)
        log(f"check {op:44s} {name:3s} seed {row['seed']:.3g}  sdpa {row['sdpa']:.3g}  {'ok' if row['ok'] else 'FAIL'}")


def record(op, impl, ms, flops=None, nbytes=None, baseline=False, extra="", rel=None):
    row = {"op": op, "impl": impl, "ms": ms, "baseline": baseline, "extra": extra, "rel_l2": rel}
    if flops:
        row["tflops"] = flops / ms / 1e9
    if nbytes:
        row["gbps"] = nbytes / ms / 1e6
    ROWS.append(row)
    log(f"{op:34s} {impl:52s} {ms:9.4f} ms" + (f" {row['tflops']:7.1f} TFLOP/s" if flops else "")
        + (f" {row['gbps']:7.0f} GB/s" if nbytes else "") + f" {extra}")


def sdpa_backend(name: str):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    return sdpa_kernel({"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
                        "math": SDPBackend.MATH, "efficient": SDPBackend.EFFICIENT_ATTENTION}[name])


def sdpa_grads(q, k, v, do, causal, backend=None):
    with torch.enable_grad():
        q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
        ctx = sdpa_backend(backend) if backend else _null()
        with ctx:
            o = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=q.shape[1] != k.shape[1])
            return (o.detach(), *torch.autograd.grad(o, (q, k, v), do))


class _null:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


# ---- 1. correctness on small odd shapes -------------------------------------------------------------------------
@guarded
def check_small(b, hq, hkv, sq, sk, d, causal, dtype=torch.bfloat16):
    g = torch.Generator(device=DEV).manual_seed(sq * 31 + sk)
    q = torch.randn(b, hq, sq, d, device=DEV, generator=g).to(dtype)
    k, v = (torch.randn(b, hkv, sk, d, device=DEV, generator=g).to(dtype) for _ in range(2))
    do = torch.randn(q.shape, device=DEV, generator=g).to(dtype)
    truth = sdpa_grads(q.double(), k.double(), v.double(), do.double(), causal, None if SMOKE else "math")
    ref = sdpa_grads(q, k, v, do, causal)
    o, lse, delta = A.attention_fwd_with_delta(q, k, v, do, causal)
    got = (o, *A.attention_bwd(do, q, k, v, o, lse, causal, delta=delta))
    tag = f"small B{b} Hq{hq}/{hkv} S{sq}x{sk} D{d}{' causal' if causal else ''}"
    check(tag, ("o", "dq", "dk", "dv"), got, ref, truth)
    o2, lse2 = A.attention_fwd(q, k, v, causal)
    check(tag + " training", ("dq", "dk", "dv"), A.attention_bwd(do, q, k, v, o2, lse2, causal), ref[1:], truth[1:])


@guarded
def check_varlen(causal):
    lens = [5, 300, 1, 129, 77]
    cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32, device=DEV)
    hq, hkv, d = 8, 2, 128
    q = torch.randn(sum(lens), hq, d, device=DEV, dtype=torch.bfloat16)
    k, v = (torch.randn(sum(lens), hkv, d, device=DEV, dtype=torch.bfloat16) for _ in range(2))
    do = torch.randn_like(q)
    o, lse = A.attention_varlen_fwd(q, k, v, cu, cu, max(lens), max(lens), causal)
    dq, dk, dv = A.attention_varlen_bwd(do, q, k, v, o, lse, cu, cu, max(lens), max(lens), causal)
    for i in range(len(lens)):
        sl = slice(int(cu[i]), int(cu[i + 1]))
        per = [t[sl].transpose(0, 1)[None] for t in (q, k, v, do)]
        truth = sdpa_grads(*(t.double() for t in per), causal, None if SMOKE else "math")
        ref = sdpa_grads(*per, causal)
        got = [t[sl].transpose(0, 1)[None] for t in (o, dq, dk, dv)]
        check(f"varlen seq {i} (len {lens[i]}){' causal' if causal else ''}", ("o", "dq", "dk", "dv"), got, ref, truth)


@guarded
def check_decode(b, hkv, group, n, paged):
    d, page = 128, 16
    q = torch.randn(b, hkv * group, 1, d, device=DEV, dtype=torch.bfloat16)
    if paged:
        pages = -(-n // page)
        lens = torch.tensor([n - (i * 37) % (n // 4 + 1) for i in range(b)], dtype=torch.int32, device=DEV)
        table = torch.randperm(b * pages, device=DEV).view(b, pages).to(torch.int32)
        kc, vc = (torch.randn(b * pages, page, hkv, d, device=DEV, dtype=torch.bfloat16) for _ in range(2))
        k, v = (c[table.long()].reshape(b, pages * page, hkv, d).transpose(1, 2) for c in (kc, vc))
        mask = (torch.arange(pages * page, device=DEV)[None, :] < lens[:, None])[:, None, None, :]
        got = DEC.paged_decode_attention(q, kc, vc, table, lens)
    else:
        k, v = (torch.randn(b, hkv, n, d, device=DEV, dtype=torch.bfloat16) for _ in range(2))
        mask = None
        got = DEC.decode_attention(q, k, v)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    truth = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), attn_mask=mask, enable_gqa=True)
    check(f"decode{' paged' if paged else ''} B{b} Hkv{hkv}x{group} N{n}", ("o",), (got,), (ref,), (truth,))


# ---- 2./3. the ANCHORS shapes -----------------------------------------------------------------------------------
FWD_VARIANTS = [None, (128, 64, 8, 3), (128, 128, 8, 2), (128, 64, 4, 4), (64, 64, 4, 3)]
BWD_VARIANTS = [None, (64, 128, 128, 64, 8, 2), (32, 128, 128, 32, 4, 3), (64, 64, 64, 64, 4, 3),
                (64, 128, 128, 64, 8, 1)]


def attention_inputs(b, h, s, d, sets, with_do):
    n = 4 if with_do else 3
    return [[torch.randn(b, h, s, d, device=DEV, dtype=torch.bfloat16) for _ in range(n)] for _ in range(sets)]


@guarded
def bench_forward(b, h, s, d, causal):
    op = f"attn fwd B{b} H{h} S{s} D{d}{' causal' if causal else ''}"
    flops = 4 * b * h * s * s * d / (2 if causal else 1)
    sets = attention_inputs(b, h, s, d, 3, False)
    q, k, v = sets[0]
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    check(op + " vs SDPA bf16", ("o",), (A.attention_fwd(q, k, v, causal)[0],), (ref,), (ref,))
    for backend in ("flash", "cudnn"):
        def run(i, backend=backend):
            with sdpa_backend(backend):
                F.scaled_dot_product_attention(*sets[i], is_causal=causal)
        timed(op, f"SDPA {backend}", run, flops, baseline=True)
    for cfg in FWD_VARIANTS:
        timed(op, f"seed {cfg or 'default ' + str(A.fwd_config(d, q.device))}",
              lambda i, cfg=cfg: A.attention_fwd(*sets[i], causal, config=cfg, store_lse=False), flops)


@guarded
def bench_fwd_bwd(b, h, s, d, causal):
    op = f"attn fwd+bwd B{b} H{h} S{s} D{d}{' causal' if causal else ''}"
    flops = 3.5 * 4 * b * h * s * s * d / (2 if causal else 1)
    sets = attention_inputs(b, h, s, d, 3, True)
    q, k, v, do = sets[0]
    ref = sdpa_grads(q, k, v, do, causal)
    o, lse, delta = A.attention_fwd_with_delta(q, k, v, do, causal)
    got = (o, *A.attention_bwd(do, q, k, v, o, lse, causal, delta=delta))
    check(op + " vs SDPA bf16", ("o", "dq", "dk", "dv"), got, ref, ref)
    for backend in ("flash", "cudnn"):
        timed(op, f"SDPA {backend} + autograd", lambda i, backend=backend: sdpa_grads(*sets[i], causal, backend),
              flops, baseline=True)

    def seed(i, fcfg=None, bcfg=None, training=False, precise=False):
        q, k, v, do = sets[i]
        if training:  # the autograd path: delta by the preprocess kernel from the stored o
            o, lse = A.attention_fwd(q, k, v, causal, config=fcfg)
            return A.attention_bwd(do, q, k, v, o, lse, causal, config=bcfg)
        o, lse, delta = A.attention_fwd_with_delta(q, k, v, do, causal, config=fcfg, precise=precise)
        return A.attention_bwd(do, q, k, v, o, lse, causal, config=bcfg, delta=delta, split_ds=precise)

    o_p, lse_p, delta_p = A.attention_fwd_with_delta(q, k, v, do, causal, precise=True)
    check(op + " precise vs SDPA bf16", ("o", "dq", "dk", "dv"),
          (o_p, *A.attention_bwd(do, q, k, v, o_p, lse_p, causal, delta=delta_p, split_ds=True)), ref, ref)
    timed(op, "seed precise (delta from dP, dS split)", lambda i: seed(i, precise=True), flops)
    timed(op, "seed training path (default)", lambda i: seed(i, training=True), flops)
    for bcfg in BWD_VARIANTS:
        timed(op, f"seed bwd {bcfg or 'default ' + str(A.bwd_config(d, q.device))}",
              lambda i, bcfg=bcfg: seed(i, None, bcfg), flops)
    o, lse = A.attention_fwd(q, k, v, causal)
    timed(op.replace("fwd+bwd", "bwd only"), "seed bwd (default)",
          lambda i: A.attention_bwd(sets[i][3], *sets[i][:3], o, lse, causal), flops / 3.5 * 2.5)


@guarded
def bench_decode(b, hkv, group, n, paged):
    d, page = 128, 16
    op = f"decode{' paged' if paged else ''} B{b} Hq{hkv * group}/{hkv} N{n} D{d}"
    sets = []
    for _ in range(3):
        q = torch.randn(b, hkv * group, 1, d, device=DEV, dtype=torch.bfloat16)
        if paged:
            pages = -(-n // page)
            lens = torch.tensor([n - (i * 37) % (n // 4 + 1) for i in range(b)], dtype=torch.int32, device=DEV)
            table = torch.randperm(b * pages, device=DEV).view(b, pages).to(torch.int32)
            kc, vc = (torch.randn(b * pages, page, hkv, d, device=DEV, dtype=torch.bfloat16) for _ in range(2))
            k, v = (c[table.long()].reshape(b, pages * page, hkv, d).transpose(1, 2).contiguous() for c in (kc, vc))
            mask = (torch.arange(pages * page, device=DEV)[None, :] < lens[:, None])[:, None, None, :]
            sets.append((q, kc, vc, table, lens, k, v, mask))
            kv_tokens = int(lens.sum())
        else:
            k, v = (torch.randn(b, hkv, n, d, device=DEV, dtype=torch.bfloat16) for _ in range(2))
            sets.append((q, k, v))
            kv_tokens = b * n
    nbytes = 2 * kv_tokens * hkv * d * 2
    if paged:
        q, kc, vc, table, lens, k, v, mask = sets[0]
        ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        check(op + " vs SDPA bf16", ("o",), (DEC.paged_decode_attention(q, kc, vc, table, lens),), (ref,), (ref,))
        timed(op, "SDPA enable_gqa on the gathered cache (mask)",
              lambda i: F.scaled_dot_product_attention(sets[i][0], sets[i][5], sets[i][6], attn_mask=sets[i][7],
                                                       enable_gqa=True), nbytes=nbytes, baseline=True)
        for splits in (None, 1, 2, 4, 8, 16):
            timed(op, f"seed splits={splits or 'default'}",
                  lambda i, s=splits: DEC.paged_decode_attention(*sets[i][:5], num_splits=s), nbytes=nbytes)
        return
    q, k, v = sets[0]
    ref = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    check(op + " vs SDPA bf16", ("o",), (DEC.decode_attention(q, k, v),), (ref,), (ref,))
    timed(op, "SDPA enable_gqa", lambda i: F.scaled_dot_product_attention(*sets[i], enable_gqa=True),
          nbytes=nbytes, baseline=True)
    for splits in (None, 1, 2, 4, 8, 16):
        for cfg in (None, (32, 4, 3), (128, 8, 3)):
            timed(op, f"seed splits={splits or 'default'} cfg={cfg or 'default'}",
                  lambda i, s=splits, c=cfg: DEC.decode_attention(*sets[i], num_splits=s, config=c), nbytes=nbytes)


# ---- --hopper: the TMA / warp-specialisation variants -----------------------------------------------------
# (row name, attention_fwd keywords, causal rows only). "default" is whatever fwd_config / tma=None pick.
HOPPER_FWD = [
    ("ptr 128x64 w8 s3 (run E path)", dict(config=(128, 64, 8, 3), tma=False, reverse=False), False),
    ("tma 128x64 w8 s2", dict(config=(128, 64, 8, 2), tma=True), False),
    ("tma 128x64 w8 s3", dict(config=(128, 64, 8, 3), tma=True), False),
    ("tma 128x64 w8 s4", dict(config=(128, 64, 8, 4), tma=True), False),
    ("default (tma 128x128 w8 s2 on the H200)", dict(), False),
    ("tma 128x128 w8 s3", dict(config=(128, 128, 8, 3), tma=True), False),
    ("tma 128x128 w8 s2 warp_specialize", dict(config=(128, 128, 8, 2), tma=True, warp_specialize=True), False),
    ("tma 128x128 w8 s2 forward launch order", dict(config=(128, 128, 8, 2), tma=True, reverse=False), True),
]
# (row name, attention_fwd_with_delta keywords, attention_bwd keywords)
HOPPER_BWD = [
    ("ptr fwd + ptr bwd 64/128,128/64 w8 s2 (run E)", dict(config=(128, 64, 8, 3), tma=False, reverse=False),
     dict(config=(64, 128, 128, 64, 8, 2), tma=False)),
    ("default fwd + default bwd (tma 64/128,128/64 w8 s2)", dict(), dict()),
    ("default fwd + tma bwd 64/128,128/64 w8 s3", dict(), dict(config=(64, 128, 128, 64, 8, 3), tma=True)),
    ("default fwd + tma bwd 32/128,128/32 w4 s3", dict(), dict(config=(32, 128, 128, 32, 4, 3), tma=True)),
]


def _truth_slice(b: int, h: int):
    """The last batch's last two heads: the largest row offsets of the TMA views, small enough for float64."""
    return slice(b - 1, b), slice(max(h - 2, 0), h)


def _ok(rel: float, sdpa_rel: float) -> bool:
    return rel <= max(1e-2, 4 * sdpa_rel)


def _variant_rows(op, flops, deadline, variants, run, truth, sdpa_rels, sl):
    """Check each variant on input set 0 against the float64 truth, then time it; skip what the deadline leaves."""
    for name, *kw in variants:
        if time.time() > deadline:
            log(f"SKIPPED {op} {name}: this section's time budget is spent")
            continue
        try:
            got = run(0, *kw)
        except Exception as exc:  # a variant that does not compile (out of shared memory, a failing pass)
            log(f"FAILED {op} {name}: {type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}")
            continue
        rels = [rel_l2_vs(g[sl], t) for g, t in zip(got, truth)]
        wrong = not all(_ok(r, sr) for r, sr in zip(rels, sdpa_rels))
        if wrong:
            log(f"WRONG {op} {name}: rel L2 {['%.3g' % r for r in rels]} vs SDPA bf16 {['%.3g' % r for r in sdpa_rels]}")
        if timed(op, name, lambda i, kw=kw: run(i, *kw), flops, rel=max(rels)) is not None:
            ROWS[-1]["wrong"] = wrong


@guarded
def hopper_forward(b, h, s, d, causal, budget_s):
    deadline = time.time() + budget_s
    op = f"attn fwd B{b} H{h} S{s} D{d}{' causal' if causal else ''}"
    flops = 4 * b * h * s * s * d / (2 if causal else 1)
    sets = attention_inputs(b, h, s, d, 3, False)
    sl = _truth_slice(b, h)
    q, k, v = sets[0]
    truth = (F.scaled_dot_product_attention(q[sl].double(), k[sl].double(), v[sl].double(), is_causal=causal),)
    for backend in (None,) if SMOKE else ("flash", "cudnn"):
        with sdpa_backend(backend) if backend else _null():
            rel = rel_l2_vs(F.scaled_dot_product_attention(q, k, v, is_causal=causal)[sl], truth[0])

        def run(i, backend=backend):
            with sdpa_backend(backend) if backend else _null():
                return F.scaled_dot_product_attention(*sets[i], is_causal=causal)
        timed(op, f"SDPA {backend or 'default'}", run, flops, baseline=True, rel=rel)
    sdpa_rel = min(r["rel_l2"] for r in ROWS if r["op"] == op and r["baseline"])
    variants = [(name, kw) for name, kw, causal_only in HOPPER_FWD if causal or not causal_only]
    _variant_rows(op, flops, deadline, variants,
                  lambda i, kw: (A.attention_fwd(*sets[i], causal, store_lse=False, **kw)[0],), truth, [sdpa_rel], sl)


@guarded
def hopper_fwd_bwd(b, h, s, d, causal, budget_s):
    deadline = time.time() + budget_s
    op = f"attn fwd+bwd B{b} H{h} S{s} D{d}{' causal' if causal else ''}"
    flops = 3.5 * 4 * b * h * s * s * d / (2 if causal else 1)
    sets = attention_inputs(b, h, s, d, 3, True)
    sl = _truth_slice(b, h)
    q, k, v, do = sets[0]
    truth = sdpa_grads(*(t[sl].double() for t in (q, k, v, do)), causal, None if SMOKE else "math")
    rels = {}
    for backend in (None,) if SMOKE else ("flash", "cudnn"):
        got = sdpa_grads(q, k, v, do, causal, backend)
        rels[backend] = [rel_l2_vs(g[sl], t) for g, t in zip(got, truth)]
        timed(op, f"SDPA {backend or 'default'} + autograd", lambda i, backend=backend: sdpa_grads(*sets[i], causal, backend),
              flops, baseline=True, rel=max(rels[backend]))
    sdpa_rels = [min(r[j] for r in rels.values()) for j in range(4)]

    def run(i, fkw, bkw):
        q, k, v, do = sets[i]
        o, lse, delta = A.attention_fwd_with_delta(q, k, v, do, causal, **fkw)
        return (o, *A.attention_bwd(do, q, k, v, o, lse, causal, delta=delta, **bkw))
    _variant_rows(op, flops, deadline, HOPPER_BWD, run, truth, sdpa_rels, sl)


def hopper(budget_s: float = 140.0) -> None:
    """The --hopper run: odd-shape checks of the defaults (TMA on the GPU), then the forward and fwd+bwd sweeps."""
    start = time.time()
    s_odd = 45 if SMOKE else 1000
    for causal in (True, False):
        if time.time() - start < 25:
            check_small(2, 8, 2, s_odd, s_odd, 128, causal)
        else:
            log(f"SKIPPED odd-shape check (causal={causal}): the checks' 25 s are spent")
    anchors = (1, 2, 64, 64) if SMOKE else (4, 32, 4096, 128)
    left = budget_s - (time.time() - start)
    for causal in (False, True):
        hopper_forward(*anchors, causal, 0.27 * left)
    for causal in (False, True):
        hopper_fwd_bwd(*anchors, causal, max(0.0, (budget_s - (time.time() - start)) / (2 if not causal else 1)))


def timed(op, impl, fn, flops=None, nbytes=None, baseline=False, rel=None):
    try:
        ms = bench(fn)
    except Exception as exc:  # a variant that does not compile or launch costs its row
        log(f"FAILED {op} {impl}: {type(exc).__name__}: {str(exc)[:300]}")
        return None
    record(op, impl, ms, flops, nbytes, baseline, rel=rel)
    return ms


def table() -> None:
    print("\n## correctness (rel L2 vs float64 on small shapes; vs SDPA bf16 at the ANCHORS shapes)")
    for c in CHECKS:
        print(f"{'ok  ' if c['ok'] else 'FAIL'} {c['op']:56s} {c['output']:3s} seed {c['seed']:.3g} sdpa {c['sdpa']:.3g}")
    print("\n## timing (median of do_bench, 3 rotating input sets)")
    print("% ceil: of cuBLAS's 694 TFLOP/s (attention) or of the 4,244 GB/s copy (decode); rel L2 vs float64")
    print(f"| {'op':34s} | {'impl':52s} | {'ms':>9s} | {'TFLOP/s':>8s} | {'GB/s':>7s} | {'% ceil':>6s} "
          f"| vs best SDPA | {'rel L2':>13s} |")
    print("|" + "|".join("-" * w for w in (36, 54, 11, 10, 9, 8, 14, 15)) + "|")
    for op in dict.fromkeys(r["op"] for r in ROWS):
        rows = [r for r in ROWS if r["op"] == op]
        best = min((r["ms"] for r in rows if r["baseline"]), default=None)
        for r in rows:
            tf = f"{r['tflops']:.1f}" if "tflops" in r else ""
            gb = f"{r['gbps']:.0f}" if "gbps" in r else ""
            pc = (f"{100 * r['tflops'] / MATMUL_TFLOPS:.0f}" if "tflops" in r
                  else f"{100 * r['gbps'] / HBM_GBPS:.0f}" if "gbps" in r else "")
            wrong = r.get("wrong", False)
            sp = "WRONG" if wrong else f"{best / r['ms']:.2f}x" if best and not r["baseline"] else ""
            rel = "" if r.get("rel_l2") is None else f"{r['rel_l2']:.3g}" + (" WRONG" if wrong else "")
            print(f"| {op:34s} | {r['impl']:52s} | {r['ms']:9.4f} | {tf:>8s} | {gb:>7s} | {pc:>6s} | {sp:>12s} "
                  f"| {rel:>13s} |")
    fails = sum(not c["ok"] for c in CHECKS)
    print(f"\n{len(CHECKS) - fails}/{len(CHECKS)} checks ok; torch {torch.__version__}, triton {triton.__version__}, "
          f"{torch.cuda.get_device_name() if DEV == 'cuda' else 'CPU interpreter'}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer variants (the defaults and one alternative)")
    parser.add_argument("--smoke", action="store_true", help="CPU interpreter, tiny shapes: checks the script")
    parser.add_argument("--hopper", action="store_true", help="only the TMA / warp-specialisation sweep (<= 150 s)")
    args = parser.parse_args()
    if args.hopper:
        if not SMOKE:
            torch.backends.cuda.matmul.allow_tf32 = False
        log(f"torch {torch.__version__}, triton {triton.__version__}, device {DEV}")
        hopper()
        table()
        write_json()
        return 0
    if args.quick or SMOKE:
        del FWD_VARIANTS[2:], BWD_VARIANTS[2:]
    if SMOKE:
        anchors, dec = (1, 2, 64, 64), (2, 2, 4, 100)
    else:
        torch.backends.cuda.matmul.allow_tf32 = False
        anchors, dec = (4, 32, 4096, 128), (64, 8, 4, 8192)
    log(f"torch {torch.__version__}, triton {triton.__version__}, device {DEV}")
    for d in (64, 128):
        for causal in (False, True):
            check_small(2, 8, 2, 113, 113, d, causal)
    check_small(1, 4, 4, 1, 257, 128, False)
    check_small(1, 4, 1, 200, 77, 128, True)
    for causal in (False, True):
        check_varlen(causal)
    for paged in (False, True):
        check_decode(3, 2, 4, 1000, paged)
        check_decode(2, 8, 4, 1, paged)
    for causal in (False, True):
        bench_forward(*anchors, causal)
    for causal in (False, True):
        bench_fwd_bwd(*anchors, causal)
    for paged in (False, True):
        bench_decode(*dec, paged)
    table()
    write_json()
    return 0


def write_json() -> None:
    if os.environ.get("OUT"):
        path = Path(os.environ["OUT"]) / "bench_attention.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"rows": ROWS, "checks": CHECKS, "torch": torch.__version__,
                                    "triton": triton.__version__,
                                    "device": torch.cuda.get_device_name() if DEV == "cuda" else "CPU interpreter"},
                                   indent=1))
        log(f"wrote {path}")


if __name__ == "__main__":
    sys.exit(main())
