"""H200 benchmark of the MoE seeds (seeds/moe.py, moe_bwd.py, moe_layer.py) at the ANCHORS shapes, in one call.

For each op: check the seed against a float64 reference on the GPU (relative L2, next to the eager bf16 loop's own
error; the layers on their first CHECK_TOKENS tokens, routing being per token), then time with
triton.testing.do_bench(warmup=25, rep=100, return_mode="median"), rotating over 3 input sets:
  grouped GEMM fwd, 64 experts x 2048 rows, H 4096 -> F 1408, uniform and SKEW=8 loads:
      seed (several tile configs), the per-expert loop (the task's Model), torch._grouped_mm, a uniform bmm
  grouped GEMM bwd (dx, dW), same shapes: seed (tile configs), the loop's autograd, torch._grouped_mm for dx and dW
  MoE layer fwd, Mixtral-like (8 experts top-2, H 4096, F 14336) and DeepSeek-like (64 experts top-8, H 2048,
      F 1408 with sigmoid + bias routing), 16k tokens: seed (tile configs), the loop (the task's Model), and
      torch._grouped_mm with routing, sort, SwiGLU and combine as separate PyTorch ops
Prints one TFLOP/s table last (FLOPs from each task's CRUCIBLE_FLOPS). Nothing here is a measured claim until run.

    python3 benchmarks/bench_moe.py [--quick]      # on the GPU machine
    python3 benchmarks/bench_moe.py --smoke        # CPU interpreter, tiny shapes: checks this script only
"""
from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from pathlib import Path

SMOKE = "--smoke" in sys.argv
if SMOKE:
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402
import triton  # noqa: E402
import triton.testing  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sandbox.task import formula, load_task  # noqa: E402
from seeds.moe import grouped_linear_fwd  # noqa: E402
from seeds.moe_bwd import grouped_linear_bwd  # noqa: E402
from seeds.moe_layer import moe_layer_fwd  # noqa: E402
from _bench import rel_l2, rotating_median_ms  # noqa: E402

DEV = "cpu" if SMOKE else "cuda"
SETS = 3
CHECK_TOKENS = 16 if SMOKE else 1024
SMOKE_CONSTS = {
    "moe_grouped_gemm.py": {"TOKENS": 300, "H": 40, "F": 24},
    "moe_grouped_gemm_bwd.py": {"TOKENS": 300, "H": 40, "F": 24},
    "moe_layer_mixtral.py": {"T": 40, "H": 32, "FFN": 48},
    "moe_layer_deepseek.py": {"T": 40, "H": 32, "FFN": 24},
}
# (BM, BN, BK, warps, stages, GROUP_M); the first of each list is the launcher's default.
GEMM_CONFIGS = [(128, 128, 64, 8, 4, 8), (128, 256, 64, 8, 3, 8), (64, 128, 64, 4, 4, 8), (128, 128, 32, 4, 5, 8)]
DW_CONFIGS = [(128, 128, 64, 8, 3), (128, 128, 32, 8, 4), (64, 128, 64, 4, 4)]  # (BN, BK, rows per step, w, s)
LAYER_CONFIGS = [  # (gate/up config, down config): one BLOCK_M
    ((128, 64, 64, 8, 4, 8), (128, 128, 64, 8, 4, 8)),
    ((128, 128, 64, 8, 3, 8), (128, 256, 64, 8, 3, 8)),
    ((64, 64, 64, 4, 4, 8), (64, 128, 64, 4, 4, 8)),
    ((128, 64, 32, 4, 5, 8), (128, 128, 32, 4, 5, 8)),
]
if SMOKE:
    GEMM_CONFIGS = [(16, 32, 32, 4, 1, 4), (32, 16, 16, 4, 1, 2)]
    DW_CONFIGS = [(16, 32, 16, 4, 1), (32, 16, 8, 4, 1)]
    LAYER_CONFIGS = [((16, 32, 32, 4, 1, 4), (16, 32, 32, 4, 1, 4)), ((32, 16, 16, 4, 1, 2), (32, 32, 16, 4, 1, 2))]
T0 = time.time()
ROWS: list[dict] = []
CHECKS: list[dict] = []


def log(msg: str) -> None:
    print(f"[{time.time() - T0:6.1f}s] {msg}", flush=True)


def bench(fn) -> float:
    return rotating_median_ms(fn, SETS, SMOKE)


def check(op: str, names, got, eager, truth) -> None:
    for name, g, e, t in zip(names, got, eager, truth):
        row = {"op": op, "output": name, "seed": rel_l2(g, t), "eager": rel_l2(e, t)}
        row["ok"] = row["seed"] <= max(1e-2, 4 * row["eager"])
        CHECKS.append(row)
        log(f"check {op} {name}: seed {row['seed']:.3g} eager {row['eager']:.3g} {'ok' if row['ok'] else 'FAIL'}")


def timed(op: str, impl: str, flops: float, fn) -> None:
    try:
        ms = bench(fn)
    except Exception as exc:  # a baseline that this torch lacks, or a config that does not fit: say so, go on
        log(f"{op} {impl}: failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}")
        ROWS.append({"op": op, "impl": impl, "ms": float("nan"), "tflops": float("nan")})
        return
    ROWS.append({"op": op, "impl": impl, "ms": ms, "tflops": flops / ms / 1e9})
    log(f"{op} {impl}: {ms:.3f} ms, {flops / ms / 1e9:.1f} TFLOP/s")


def task_for(name: str, **consts):
    task = load_task(ROOT / "tasks" / name)
    consts = {**(SMOKE_CONSTS.get(name, {}) if SMOKE else {}), **consts}
    return task.with_constants(consts) if consts else task


def make(task, seed: int):
    """The reference model built on the device (a CPU randn of the Mixtral weights would take minutes)."""
    torch.manual_seed(seed)
    with torch.device(DEV):
        return task.module.Model(*task.init_inputs()).eval()


def offsets(counts: torch.Tensor) -> torch.Tensor:
    return torch.cumsum(counts, 0).to(torch.int32)


# ---- grouped GEMM -------------------------------------------------------------------------------------------------
def grouped_fwd(skew: int) -> None:
    task = task_for("moe_grouped_gemm.py", SKEW=skew)
    op = f"grouped fwd skew{skew}"
    flops = formula(task.meta.flops_formula)(task.current_constants())
    model = make(task, 0)
    w = model.weight.detach()
    sets = [task.make_inputs(10 + i, "normal", DEV) for i in range(SETS)]
    x, counts = sets[0]
    got = grouped_linear_fwd(x, w, counts)
    check(op, ["y"], [got], [model(x, counts)], [task.module.grouped_linear(x.double(), w.double(), counts)])
    for cfg in GEMM_CONFIGS:
        timed(op, f"seed {cfg}", flops, lambda i, c=cfg: grouped_linear_fwd(sets[i][0], w, sets[i][1], c))
    timed(op, "loop over experts", flops, lambda i: model(*sets[i]))
    if hasattr(torch, "_grouped_mm") and not SMOKE:
        wt = w.transpose(1, 2)
        offs = [offsets(s[1]) for s in sets]
        timed(op, "torch._grouped_mm", flops, lambda i: torch._grouped_mm(sets[i][0], wt, offs=offs[i]))
    if skew == 1 and sets[0][0].shape[0] % w.shape[0] == 0:
        e = w.shape[0]
        timed(op, "uniform bmm", flops, lambda i: torch.bmm(sets[i][0].view(e, -1, sets[i][0].shape[1]),
                                                            w.transpose(1, 2)))


def grouped_bwd(skew: int) -> None:
    task = task_for("moe_grouped_gemm_bwd.py", SKEW=skew)
    op = f"grouped bwd skew{skew}"
    flops = formula(task.meta.flops_formula)(task.current_constants())
    model = make(task, 0)
    w = model.weight.detach()
    sets = [task.make_inputs(20 + i, "normal", DEV) for i in range(SETS)]
    x, counts, dy = sets[0]
    got = grouped_linear_bwd(x, w, counts, dy)
    truth = make(task, 0).double()(x.double(), counts, dy.double())
    check(op, ["dx", "dw"], got, model(x, counts, dy), truth)
    for cfg, dw_cfg in zip(GEMM_CONFIGS, DW_CONFIGS):
        timed(op, f"seed {cfg} dw {dw_cfg}", flops,
              lambda i, c=cfg, d=dw_cfg: grouped_linear_bwd(sets[i][0], w, sets[i][1], sets[i][2], c, d))
    timed(op, "loop over experts (autograd)", flops, lambda i: model(*sets[i]))
    if hasattr(torch, "_grouped_mm") and not SMOKE:
        offs = [offsets(s[1]) for s in sets]

        def gmm_bwd(i):
            xx, _, g = sets[i]
            dx = torch._grouped_mm(g, w, offs=offs[i])
            dw = torch._grouped_mm(g.t(), xx, offs=offs[i])
            return dx, dw
        timed(op, "torch._grouped_mm dx + dW", flops, gmm_bwd)


# ---- the layer ----------------------------------------------------------------------------------------------------
def grouped_mm_layer(model, x: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """torch._grouped_mm for both projections, routing/sort/SwiGLU/combine as separate PyTorch ops."""
    weights, ids = model.route(logits)
    flat = ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    offs = torch.cumsum(torch.bincount(flat, minlength=model.experts), 0).to(torch.int32)
    xs = x.index_select(0, order // model.top_k)
    h = torch._grouped_mm(xs, model.w_gate_up.transpose(1, 2), offs=offs)
    gate, up = h.chunk(2, dim=-1)
    y = torch._grouped_mm(torch.nn.functional.silu(gate) * up, model.w_down.transpose(1, 2), offs=offs)
    out = torch.empty_like(y)
    out[order] = y
    k = model.top_k
    return (out.view(-1, k, x.shape[1]).float() * weights[..., None]).sum(1).to(x.dtype)


def layer(name: str) -> None:
    task = task_for(name)
    op = name.removesuffix(".py").replace("moe_", "")
    flops = formula(task.meta.flops_formula)(task.current_constants())
    model = make(task, 0)
    k, scoring, scale = model.top_k, model.scoring, model.routed_scale
    bias = model.router_bias if scoring == "sigmoid" else None
    wgu, wd = model.w_gate_up.detach(), model.w_down.detach()
    sets = [task.make_inputs(30 + i, "normal", DEV) for i in range(SETS)]
    x, logits = sets[0]
    with torch.no_grad():
        got = moe_layer_fwd(x, logits, wgu, wd, k, scoring, bias, scale)
        eager = model(x, logits)
        n = min(CHECK_TOKENS, x.shape[0])
        truth = make(task, 0).double()(x[:n].double(), logits[:n].double())
        check(op, ["out"], [got[:n]], [eager[:n]], [truth])
        if hasattr(torch, "_grouped_mm") and not SMOKE:
            try:
                log(f"check {op} grouped_mm baseline: rel L2 "
                    f"{rel_l2(grouped_mm_layer(model, x, logits)[:n], truth):.3g}")
            except Exception as exc:
                log(f"check {op} grouped_mm baseline failed: {type(exc).__name__}: {exc}")
        for up_cfg, down_cfg in LAYER_CONFIGS:
            timed(op, f"seed up {up_cfg} down {down_cfg}", flops,
                  lambda i, u=up_cfg, d=down_cfg: moe_layer_fwd(sets[i][0], sets[i][1], wgu, wd, k, scoring, bias,
                                                                scale, u, d))
        timed(op, "loop over experts", flops, lambda i: model(*sets[i]))
        if hasattr(torch, "_grouped_mm") and not SMOKE:
            timed(op, "torch._grouped_mm + torch routing/SwiGLU/combine", flops,
                  lambda i: grouped_mm_layer(model, *sets[i]))
    del model, sets


def table() -> None:
    print("\nchecks (relative L2 vs float64):")
    for c in CHECKS:
        print(f"  {c['op']:<24} {c['output']:<4} seed {c['seed']:.3g}  eager {c['eager']:.3g}  "
              f"{'ok' if c['ok'] else 'FAIL'}")
    print(f"\n{'op':<24} {'impl':<64} {'ms':>9} {'TFLOP/s':>8} {'vs best baseline':>17}")
    for op in dict.fromkeys(r["op"] for r in ROWS):
        rows = [r for r in ROWS if r["op"] == op]
        base = [r["ms"] for r in rows if not r["impl"].startswith("seed") and r["ms"] == r["ms"]]
        best = min(base) if base else float("nan")
        for r in rows:
            print(f"{op:<24} {r['impl'][:64]:<64} {r['ms']:9.3f} {r['tflops']:8.1f} {best / r['ms']:16.2f}x")
    print(f"\n{'SMOKE (CPU interpreter: times mean nothing)' if SMOKE else torch.cuda.get_device_name()}, "
          f"torch {torch.__version__}, triton {triton.__version__}, {time.time() - T0:.0f} s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="CPU interpreter, tiny shapes (checks the script)")
    parser.add_argument("--quick", action="store_true", help="the uniform grouped GEMM and the DeepSeek layer only")
    args = parser.parse_args()
    parts = [lambda: grouped_fwd(1), lambda: layer("moe_layer_deepseek.py")]
    if not args.quick:
        parts += [lambda: grouped_fwd(8), lambda: grouped_bwd(1), lambda: grouped_bwd(8),
                  lambda: layer("moe_layer_mixtral.py")]
    for part in parts:
        try:
            part()
        except Exception:  # one broken part must not lose the others' numbers
            log(traceback.format_exc())
        if not SMOKE:
            torch.cuda.empty_cache()
    table()
    return 0 if all(c["ok"] for c in CHECKS) else 1


if __name__ == "__main__":
    sys.exit(main())
