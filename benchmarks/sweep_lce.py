"""H200 sweep of the linear + cross-entropy seed's GEMM options (seeds/linear_cross_entropy.py): the whole fwd+bwd
for the default and each option, with dx_in_dweight off and on, then the three products the vocab form runs, alone,
per GEMM engine, against torch.matmul (cuBLAS) at the same shapes; one table last.

Shape: BT 8192, H 4096, V 128256 bf16 (target: <= 45 ms at <= 1.1 GiB extra). benchmarks/bench_lce.py does the
work: the float64 truth on input set 0, the check (a variant worse than max(1e-2, 4 x eager's relative L2) is WRONG,
not compared), the extra memory (peak allocated during one call minus what was allocated before it), rotating
medians over 3 input sets, the baselines (eager, Liger if importable, torch.compile last and only while 30 s of the
budget remain) and the table. The options (each also with dx_in_dweight and dx_split: the fp32 dx sum in
dweight's last rows, or half of it there and half in dx's own storage, recomputing half as many rows):
    subtile     epilogues by column halves (Gemm.subtile); its own tiles: 128x256x64, 4 stages for the bf16
                outputs (logits, dweight), 3 for dx's fp32 accumulator (the default has 3 and 128x256x32 s3)
    ws          subtile plus warp_specialize on the tile loops (flatten off, as Hopper needs)
    s3          subtile with 3 stages everywhere (4 may not fit beside the stats epilogue)
    group 16    subtile with 16 row tiles per group (weight tiles reused by twice as many x rows)
    ws dx s4    subtile+ws with 4 stages for dx too (warp specialisation needs no epilogue buffer: 192 KiB of
                shared memory when compiled for sm_90 by Triton 3.9 here, tests/test_linear_cross_entropy_gemm.py)
    tma store   subtile+ws with the dweight rows stored through a TMA descriptor (async bulk stores)
The single products at the first recomputed chunk's width n (8192 x n logits: x @ W_c^T; dx (+)= dl @ W_c into
fp32 as the form sums it, cuBLAS writing bf16; dW_c = dl^T @ x; dx_split's half-width dx product) are checked
against a float64 product (relative L2 <= 1e-2) before they are timed. Before the table: torch.profiler's kernel
times of one call (the default and subtile, both with dx_split) with the logits and matmul kernels' TFLOP/s.

    python3 benchmarks/sweep_lce.py [--budget SECONDS] [--no-compile]   (GPU, ~90 s with compiles)
    TRITON_INTERPRET=1 python3 benchmarks/sweep_lce.py --smoke          (CPU interpreter, tiny shapes)
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_lce  # noqa: E402  (puts the repo root on sys.path)
from _bench import rel_l2, rotating_median_ms  # noqa: E402
from bench_lce import ROWS, SETS, Bench, first_line, log, seed_call  # noqa: E402
from seeds.linear_cross_entropy import (CHUNK_ALIGN, GPU_DEFAULT, VOCAB_WORKSPACE, Gemm, dx_tail_rows,  # noqa: E402
                                        matmul, vocab_chunks)

# Seconds after the start at which each section stops starting rows.
VARIANTS_UNTIL, GEMMS_UNTIL, COMPILE_LEFT = 60.0, 72.0, 30.0

SUBTILE = dict(epilogue_subtile=True)
ENGINES = [  # (label, keyword arguments of linear_cross_entropy_fwd_bwd, the Gemm they make)
    ("default", {}, Gemm()),
    ("subtile", SUBTILE, Gemm(subtile=True)),
    ("subtile+ws", dict(SUBTILE, warp_specialize=True), Gemm(subtile=True, warp_specialize=True, flatten=False)),
]


def variants(smoke: bool) -> list[tuple[str, dict]]:
    """The default, then with dx_in_dweight (1.09 GiB: the form inside the budget) and with dx_split as well; then
    each option with dx_split, then without either, in the order the time budget may cut them."""
    s3, s4 = (None, None) if smoke else ((128, 256, 64, 8, 3), (128, 256, 64, 8, 4))
    split = dict(dx_in_dweight=True, dx_split=True)
    rows = [("default", {}), ("default, dx in dW", dict(dx_in_dweight=True)), ("default, dx split", split)]
    rows += [(f"{label}, dx split", dict(kw, **split)) for label, kw, _ in ENGINES[1:]]
    rows += [("subtile, dx in dW", dict(SUBTILE, dx_in_dweight=True)),
             ("subtile s3 logits/dW, dx split", dict(SUBTILE, **split, logits_config=s3, dw_config=s3)),
             ("subtile+ws dx s4, dx split", dict(ENGINES[2][1], **split, dx_config=s4)),
             ("subtile+ws tma store, dx split", dict(ENGINES[2][1], **split, tma_store=True))]
    rows += [(label, dict(kw)) for label, kw, _ in ENGINES[1:]]
    return rows + [("subtile group 16, dx split", dict(SUBTILE, **split, group_m=16))]


def rest(smoke: bool) -> list[tuple[str, dict]]:
    """--rest: ModelNew's GPU default (epilogue subtiles, dx_in_dweight + dx_split, 3-stage 128x256x64 logits/dW
    tiles) and the options a time budget cut from the main sweep, each on top of it."""
    s4 = None if smoke else (128, 256, 64, 8, 4)
    base = {} if smoke else dict(GPU_DEFAULT)
    return [("GPU default (ModelNew)", base),
            ("GPU default + ws, dx 4 stages", dict(base, warp_specialize=True, dx_config=s4)),
            ("GPU default + tma store", dict(base, warp_specialize=True, tma_store=True)),
            ("GPU default + group 16", dict(base, group_m=16))]


def ws_cols(b: Bench) -> int:
    """Columns of the default workspace (the seed's rule)."""
    n = max(1, VOCAB_WORKSPACE // (b.bt * 2))
    return n // CHUNK_ALIGN * CHUNK_ALIGN if n >= CHUNK_ALIGN else n


def executed_flops(b: Bench, kw: dict) -> float:
    """What the form executes: the three products, the logits outside the stored chunks once more, and with
    dx_in_dweight the tail's once more again but for its last workspace piece (kept: true at the task's shape;
    bench_lce.exec_flops counts the whole tail and knows no dx_split)."""
    tail = dx_tail_rows(b.bt, b.h, b.v, 2, kw.get("dx_split", False)) if kw.get("dx_in_dweight") else 0
    cols = ws_cols(b)
    chunks, n_stored = vocab_chunks(b.bt, b.h, b.v - tail, cols, kw.get("store_chunks", 3))
    stored = chunks[n_stored - 1][1] if n_stored else 0
    kept = (tail - 1) % cols + 1 if tail else 0
    return 2 * b.bt * b.h * (4 * b.v - stored + tail - kept)


def chunk_width(b: Bench) -> int:
    """The first recomputed chunk's columns under the default plan (22784 at the task's shape)."""
    chunks, n_stored = vocab_chunks(b.bt, b.h, b.v, ws_cols(b), 3)
    v0, v1, _ = chunks[min(n_stored, len(chunks) - 1)]
    return v1 - v0


def gemm_row(b: Bench, name: str, call, out: torch.Tensor, truth: torch.Tensor, flops: float,
             fresh=None) -> None:
    """Check one product (out after fresh() and one call) against its float64 truth, then time it."""
    if b.over(name, GEMMS_UNTIL):
        return
    try:
        (fresh or (lambda: None))()
        call()
        err = rel_l2(out, truth)
        if not err <= 1e-2:
            log(f"WRONG GEMM {name}: rel L2 {err:.3g}")
            b.wrong.append(name)
            ROWS.append({"op": "GEMM", "variant": name, "error": f"WRONG: rel L2 {err:.3g}"})
            return
        ms = rotating_median_ms(lambda i: call(), SETS, b.smoke)
    except Exception as exc:  # a benchmark row: report and go on
        log(f"FAILED GEMM {name}: {first_line(exc)}")
        b.failed.append(name)
        ROWS.append({"op": "GEMM", "variant": name, "error": first_line(exc)})
        return
    ROWS.append({"op": "GEMM", "variant": name, "ms": ms, "tflops": flops / ms / 1e9, "ok": True})
    log(f"GEMM {name:40s} {ms:8.3f} ms {flops / ms / 1e9:6.1f} TFLOP/s (rel L2 {err:.2g})")


def gemms(b: Bench) -> None:
    """The form's three products at one chunk's width, per engine with the tiles the form gives them, and cuBLAS."""
    n = chunk_width(b)
    x = b.sets[0][0]
    w = b.w[:n]
    g = torch.Generator(device=b.dev).manual_seed(2)
    dl = (torch.randn(b.bt, n, device=b.dev, generator=g) * 1e-3).to(torch.bfloat16)
    logits = torch.empty(b.bt, n, device=b.dev, dtype=torch.bfloat16)
    dw = torch.empty(n, b.h, device=b.dev, dtype=torch.bfloat16)
    dx32 = torch.empty(b.bt, b.h, device=b.dev, dtype=torch.float32)
    dx16 = torch.empty(b.bt, b.h, device=b.dev, dtype=torch.bfloat16)
    products = [  # (name, a, b, seed's output, cuBLAS's output, accumulate)
        (f"logits {b.bt}x{n}x{b.h}", x, w.t(), logits, logits, False),
        (f"dx+= {b.bt}x{b.h}x{n}", dl, w, dx32, dx16, True),
        (f"dW {n}x{b.h}x{b.bt}", dl.t(), x, dw, dw, False),
        # dx_split's: each half of dx's columns apart
        (f"dx+= {b.bt}x{b.h // 2}x{n}", dl, w[:, : b.h // 2], dx32[:, : b.h // 2].contiguous(),
         dx16[:, : b.h // 2].contiguous(), True),
    ]
    for name, a, bb, out, out_cublas, acc in products:
        flops = 2 * a.shape[0] * a.shape[1] * bb.shape[1]
        truth = a.double() @ bb.double()
        gemm_row(b, f"{name} cuBLAS", lambda: torch.matmul(a, bb, out=out_cublas), out_cublas, truth, flops)
        for label, _, engine in ENGINES:
            gemm_row(b, f"{name} {label}", lambda: matmul(a, bb, out, accumulate=acc, gemm=engine), out, truth, flops,
                     fresh=out.zero_ if acc else None)
        del truth
        b.empty_cache()
    del dl, logits, dw, dx32, dx16
    b.empty_cache()


def versus_cublas() -> None:
    """Each seed GEMM row's label gets its speed against the cuBLAS row of its shape."""
    cublas = {r["variant"].rsplit(" ", 1)[0]: r["ms"] for r in ROWS
              if r["op"] == "GEMM" and r["variant"].endswith(" cuBLAS") and "ms" in r}
    for r in ROWS:
        shape = r["variant"].rsplit(" ", 1)[0] if r["op"] == "GEMM" else None
        if "ms" in r and shape in cublas and not r["variant"].endswith(" cuBLAS"):
            r["variant"] += f" {cublas[shape] / r['ms']:.2f}x"


def kernel_breakdown(b: Bench, name: str, kw: dict, top: int = 8) -> None:
    """Where one call's time goes: torch.profiler's kernel times by name (GPU; on the interpreter the CPU ops, which
    checks the code path only). The logits kernel's stats and gradient launches share one name, as do the dx and
    dweight products'."""
    if b.over(f"profile {name}", VARIANTS_UNTIL):
        return
    from torch.profiler import ProfilerActivity, profile
    fn = seed_call(b, kw)
    try:
        fn(0)
        b.empty_cache()
        gpu = not b.smoke
        with profile(activities=[ProfilerActivity.CUDA if gpu else ProfilerActivity.CPU]) as prof:
            fn(0)
            if gpu:
                torch.cuda.synchronize()
    except Exception as exc:  # a diagnostic, not a row
        log(f"profile {name} failed: {first_line(exc)}")
        return
    key = "self_device_time_total" if gpu else "self_cpu_time_total"
    times = sorted(((getattr(e, key, 0.0) / 1e3, e.count, e.key) for e in prof.key_averages()), reverse=True)
    total = sum(t for t, _, _ in times) or float("nan")
    # the products' FLOPs: dx and dweight's, and the logits' (every pass: stats and recomputed gradients)
    products = 2 * 2 * b.bt * b.h * b.v
    flops = {"_tma_matmul_kernel": products, "_tma_logits_kernel": executed_flops(b, kw) - products}
    log(f"profile of one call, {name}: {total:.2f} ms of {'kernels' if gpu else 'CPU ops'}")
    for ms, count, kernel in times[:top]:
        if ms > 0:
            rate = f" {flops[kernel] / ms / 1e9:6.1f} TFLOP/s (if all its launches are TMA)" if kernel in flops else ""
            log(f"    {ms:8.3f} ms {100 * ms / total:5.1f}% {count:4d}x {kernel[:60]}{rate}")


def main() -> int:
    started = bench_lce.start(__doc__.splitlines()[0], 85.0, lambda ap: ap.add_argument(
        "--rest", action="store_true", help="ModelNew's GPU default and the options the first sweep did not reach, only"))
    if isinstance(started, int):
        return started
    args, b = started
    if args.rest:
        for name, kw in rest(b.smoke):
            b.run(name, seed_call(b, kw), VARIANTS_UNTIL, exec_flops=executed_flops(b, kw))
        bench_lce.baselines(b)
        return bench_lce.report(b, bench_lce.table(b))
    rows = variants(b.smoke)
    for name, kw in rows[:3]:  # the default, without and with dx_in_dweight and dx_split, before anything else
        b.run(name, seed_call(b, kw), VARIANTS_UNTIL, exec_flops=executed_flops(b, kw))
    kernel_breakdown(b, *rows[2])
    bench_lce.baselines(b)
    b.run(rows[3][0], seed_call(b, rows[3][1]), VARIANTS_UNTIL, exec_flops=executed_flops(b, rows[3][1]))
    kernel_breakdown(b, *rows[3])  # subtile with dx_split
    for name, kw in rows[4:]:
        b.run(name, seed_call(b, kw), VARIANTS_UNTIL, exec_flops=executed_flops(b, kw))
    gemms(b)
    if not args.no_compile and not b.smoke and not b.over("torch.compile fwd + autograd bwd",
                                                          b.budget - COMPILE_LEFT):
        bench_lce.baselines_compile(b)
    versus_cublas()
    return bench_lce.report(b, bench_lce.table(b))


if __name__ == "__main__":
    sys.exit(main())
