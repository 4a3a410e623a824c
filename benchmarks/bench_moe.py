"""H200 benchmark of the MoE seeds (seeds/moe.py, moe_bwd.py, moe_layer.py) at the ANCHORS shapes, in one call.

Every variant and baseline is checked against a float64 truth on its first call (relative L2 and the worst row's
relative L2; a row that goes missing shows in the second), then timed with triton.testing.do_bench(warmup=25,
rep=100, median) rotating over 3 input sets. Sections (each with its own time budget; a variant past it is skipped,
one that fails to compile prints one line):
  grouped fwd skew1   64 experts x 2048 rows, H 4096 -> F 1408: pointer kernel, TMA kernel (tiles, stages, warp
                      specialisation, flattened loop) vs the per-expert loop, torch._grouped_mm, a uniform bmm
  grouped fwd skew8   the same rows with expert 0 at 8x the average load: pointer kernel and the two fastest correct
                      TMA variants of skew1 vs the loop and torch._grouped_mm
  grouped bwd dX/dW   the skew1 shape: dX = dY_e W_e and dW_e = dY_e^T X_e, pointer vs TMA kernels, against a
                      per-expert loop of matmuls and torch._grouped_mm
  layer deepseek / mixtral   the fused layer forward at 16k tokens (64 experts top-8 H2048 F1408 sigmoid+bias;
                      8 experts top-2 H4096 F14336 softmax): pointer vs TMA variants vs the task's per-expert loop and
                      torch._grouped_mm with routing/sort/SwiGLU/combine as separate PyTorch ops (the layers are
                      checked on their first CHECK_TOKENS tokens: routing is per token)
Prints one table last (op, variant, ms, TFLOP/s, % of the cuBLAS 8192^3 ceiling 694 TFLOP/s, speedup vs the best
baseline, rel L2); writes the rows to $OUT/bench_moe.json when OUT is set. Nothing here is a measured claim until run.

    python3 benchmarks/bench_moe.py            # on the GPU machine, about 150 s
    python3 benchmarks/bench_moe.py --smoke    # CPU interpreter, tiny shapes: checks this script only
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

SMOKE = "--smoke" in sys.argv
if SMOKE:
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402
import triton  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sandbox.task import formula, load_task  # noqa: E402
from profiler.vendor_ops import moe_layer as vendor_moe_layer  # noqa: E402
from seeds.moe import align_counts, grouped_dw, grouped_gemm, grouped_linear_fwd  # noqa: E402
from seeds.moe_layer import moe_layer_fwd  # noqa: E402
from _bench import rel_l2, rotating_median_ms  # noqa: E402

DEV = "cpu" if SMOKE else "cuda"
SETS = 3
CEILING_TFLOPS = 694.0  # ANCHORS.md: cuBLAS bf16 8192^3 on this H200
CHECK_TOKENS = 16 if SMOKE else 1024
SMOKE_CONSTS = {
    "moe_grouped_gemm.py": {"TOKENS": 256, "H": 48, "F": 32},
    "moe_grouped_gemm_bwd.py": {"TOKENS": 256, "H": 48, "F": 32},
    "moe_layer_mixtral.py": {"T": 40, "H": 32, "FFN": 48},
    "moe_layer_deepseek.py": {"T": 40, "H": 32, "FFN": 32},
}
# Section budgets in seconds (compiles cost 1-4 s each on the GPU machine); 150 s in all.
BUDGET = {"grouped fwd skew1": 38, "grouped fwd skew8": 14, "grouped bwd dX": 16, "grouped bwd dW": 14,
          "layer deepseek": 30, "layer mixtral": 30}

# A variant: (name, config (BM, BN, BK, warps, stages, GROUP_M), grouped_gemm's impl options).
TMA, WS, FLAT = {"impl": "tma"}, {"impl": "tma", "warp_specialize": True}, {"impl": "tma", "flatten": True}
PTR = {"impl": "ptr"}
PRE = {"impl": "tma", "pregather": True}  # the layer's x rows copied into sorted order: the up GEMM's A by TMA
FWD = [
    ("ptr 128x256x64 w8 s3", (128, 256, 64, 8, 3, 8), PTR),  # the former measured default (513 TFLOP/s)
    ("tma 128x256x64 w8 s3", (128, 256, 64, 8, 3, 8), TMA),
    ("tma 128x256x64 w8 s4", (128, 256, 64, 8, 4, 8), TMA),
    ("tma 256x128x64 w8 s3", (256, 128, 64, 8, 3, 8), TMA),  # 1408 = 11 x 128: no half-empty n-tile
    ("tma 128x128x64 w8 s4", (128, 128, 64, 8, 4, 8), TMA),
    ("tma+ws 128x256x64 w8 s3", (128, 256, 64, 8, 3, 8), WS),
    ("tma+flat 256x128x64 w8 s3", (256, 128, 64, 8, 3, 8), FLAT),
]
DX = [
    ("ptr 128x256x64 w8 s3", (128, 256, 64, 8, 3, 8), PTR),
    ("tma 128x256x64 w8 s3", (128, 256, 64, 8, 3, 8), TMA),
    ("tma 256x128x64 w8 s3", (256, 128, 64, 8, 3, 8), TMA),
    ("tma+ws 128x256x64 w8 s3", (128, 256, 64, 8, 3, 8), WS),
]
# dW: (name, (BN, BK, rows per step, warps, stages), impl); BLOCK_M of the layout 128.
DW = [
    ("ptr 128x128 r64 w8 s3", (128, 128, 64, 8, 3), "ptr"),
    ("tma 128x128 r64 w8 s3", (128, 128, 64, 8, 3), "tma"),
    ("tma 128x256 r64 w8 s3", (128, 256, 64, 8, 3), "tma"),
    ("tma 128x128 r64 w8 s4", (128, 128, 64, 8, 4), "tma"),
]
# Layer: (name, gate/up config, down config, impl options); one BLOCK_M for both. The layer's GPU
# default is pregather + warp specialisation (seeds/moe_layer.py); the rows before it say so explicitly.
PLAIN = {"pregather": False, "warp_specialize": False}
LAYER = [
    ("ptr up 128x128 down 128x256 s3", (128, 128, 64, 8, 3, 8), (128, 256, 64, 8, 3, 8), PTR),
    ("tma up 128x128 down 128x256 s3", (128, 128, 64, 8, 3, 8), (128, 256, 64, 8, 3, 8), {**TMA, **PLAIN}),
    ("tma up 128x128 s4 down 128x128 s4", (128, 128, 64, 8, 4, 8), (128, 128, 64, 8, 4, 8), {**TMA, **PLAIN}),
    ("tma+ws up 128x128 down 128x256 s3", (128, 128, 64, 8, 3, 8), (128, 256, 64, 8, 3, 8), {**WS, "pregather": False}),
    ("default (pregather + ws since run AC)", None, None, {}),
]
# --layers: the layer sections alone, wider (the layer targets, ANCHORS.md: Mixtral-like >= 640 TFLOP/s,
# DeepSeek-like >= 530): the up GEMM's A rows by TMA after one gather (pregather), TMA stores, warp specialisation.
LAYER_SWEEP = LAYER[1:2] + LAYER[-1:] + [
    # on the H200: flattening (-6 to -8%), 256-row blocks, GROUP_M 4/16 and both 128x128 at 4 stages all lost here;
    # and pregather with ws the best of both layers (now the default), pregather flattened -10 to -25%
    ("pregather up 128x128 down 128x256 s3", (128, 128, 64, 8, 3, 8), (128, 256, 64, 8, 3, 8),
     {**PRE, "warp_specialize": False}),
    ("pregather ws up 128x128 s4 down 128x256 s3", (128, 128, 64, 8, 4, 8), (128, 256, 64, 8, 3, 8),
     {**PRE, "warp_specialize": True}),
    ("pregather ws tmastore", (128, 128, 64, 8, 3, 8), (128, 256, 64, 8, 3, 8),
     {**PRE, "warp_specialize": True, "tma_store": True}),
]
if SMOKE:
    FWD = [("ptr", (16, 32, 16, 4, 1, 4), PTR), ("tma", (16, 32, 16, 4, 1, 4), TMA),
           ("tma+ws", (16, 32, 16, 4, 1, 4), WS), ("tma+flat", (32, 16, 16, 4, 1, 2), FLAT)]
    DX = FWD[:3]
    DW = [("ptr", (32, 16, 16, 4, 1), "ptr"), ("tma", (32, 16, 16, 4, 1), "tma")]
    LAYER = [("ptr", (16, 32, 16, 4, 1, 4), (16, 32, 16, 4, 1, 4), PTR),
             ("tma", (16, 32, 16, 4, 1, 4), (16, 32, 16, 4, 1, 4), TMA)]
    LAYER_SWEEP = LAYER[1:] + [("pregather", (16, 32, 16, 4, 1, 4), (16, 32, 16, 4, 1, 4), PRE),
                               ("default", None, None, {})]
T0 = time.time()
ROWS: list[dict] = []


def log(msg: str) -> None:
    print(f"[{time.time() - T0:6.1f}s] {msg}", flush=True)


def worst_row(got: torch.Tensor, truth: torch.Tensor) -> float:
    """The largest relative L2 error of one row (last dimension): a row left unwritten or misplaced shows here."""
    g = got.detach().double().reshape(-1, got.shape[-1])
    t = truth.detach().double().reshape(-1, truth.shape[-1])
    if not torch.isfinite(g).all():
        return float("inf")
    norms = t.norm(dim=1).clamp_min(1e-30)
    return float(((g - t).norm(dim=1) / norms).max())


class Section:
    """One op: its truth, its baselines' errors, its rows, and its time budget."""

    def __init__(self, op: str, flops: float, truth_fn):
        self.op, self.flops, self.truth_fn = op, flops, truth_fn
        self.start = time.time()
        self.eager_err = None  # (rel L2, worst row) of the first baseline: the bar a seed's error is held to

    def over_budget(self) -> bool:
        return not SMOKE and time.time() - self.start > BUDGET[self.op]

    def run(self, name: str, kind: str, fn, cut=None) -> dict | None:
        """Check fn(0) against the truth, then time fn(i) over the input sets; `cut` trims the output checked."""
        row = {"op": self.op, "variant": name, "kind": kind, "ms": float("nan"), "tflops": float("nan"),
               "rel_l2": float("nan"), "worst_row": float("nan"), "ok": False, "note": ""}
        if self.over_budget():
            row["note"] = "skipped: section budget spent"
            log(f"{self.op} {name}: {row['note']}")
            ROWS.append(row)
            return None
        try:
            got = fn(0)
            got = got if isinstance(got, torch.Tensor) else got[0]
            got = cut(got) if cut else got
            truth = self.truth_fn()
            row["rel_l2"], row["worst_row"] = rel_l2(got, truth), worst_row(got, truth)
            del got
            if kind == "baseline" and self.eager_err is None:
                self.eager_err = (row["rel_l2"], row["worst_row"])
            bar = self.eager_err or (2e-3, 2e-2)
            row["ok"] = row["rel_l2"] <= max(1e-2, 4 * bar[0]) and row["worst_row"] <= max(5e-2, 4 * bar[1])
            if row["ok"] or kind == "baseline":
                row["ms"] = rotating_median_ms(fn, SETS, SMOKE)
                row["tflops"] = self.flops / row["ms"] / 1e9
        except Exception as exc:  # a config that does not compile, or a baseline this torch lacks: say so, go on
            text = str(exc).strip().splitlines()
            row["note"] = f"failed: {type(exc).__name__}: {text[0][:160] if text else ''}"
        ROWS.append(row)
        log(f"{self.op} {name}: {row['ms']:.3f} ms, {row['tflops']:.1f} TFLOP/s, rel L2 {row['rel_l2']:.3g}, "
            f"worst row {row['worst_row']:.3g}{'' if row['ok'] or kind == 'baseline' else ' WRONG'} {row['note']}")
        return row


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


def cached(fn):
    """fn's value, computed on the first call only (a float64 truth costs a second or more)."""
    box: list = []

    def get():
        if not box:
            box.append(fn())
        return box[0]
    return get


def has_grouped_mm() -> bool:
    return hasattr(torch, "_grouped_mm") and not SMOKE


# ---- grouped GEMM forward -----------------------------------------------------------------------------------------
def grouped_fwd(skew: int, variants) -> list[dict]:
    task = task_for("moe_grouped_gemm.py", SKEW=skew)
    flops = formula(task.meta.flops_formula)(task.current_constants())
    model = make(task, 0)
    w = model.weight.detach()
    sets = [task.make_inputs(10 + i, "normal", DEV) for i in range(SETS)]
    x0, c0 = sets[0]
    sec = Section(f"grouped fwd skew{skew}", flops,
                  cached(lambda: task.module.grouped_linear(x0.double(), w.double(), c0)))
    sec.run("loop over experts", "baseline", lambda i: model(*sets[i]))
    if has_grouped_mm():
        wt, offs = w.transpose(1, 2), [offsets(s[1]) for s in sets]
        sec.run("torch._grouped_mm", "baseline", lambda i: torch._grouped_mm(sets[i][0], wt, offs=offs[i]))
    if skew == 1 and x0.shape[0] % w.shape[0] == 0:
        e = w.shape[0]
        sec.run("uniform bmm", "baseline",
                lambda i: torch.bmm(sets[i][0].view(e, -1, x0.shape[1]), w.transpose(1, 2)).view(x0.shape[0], -1))
    rows = []
    for name, cfg, opts in variants:
        row = sec.run(name, "seed", lambda i, c=cfg, o=opts: grouped_linear_fwd(sets[i][0], w, sets[i][1], c, **o))
        if row is not None:
            rows.append(row | {"cfg": cfg, "opts": opts})
    return rows


# ---- grouped GEMM backward ----------------------------------------------------------------------------------------
def grouped_bwd() -> None:
    task = task_for("moe_grouped_gemm_bwd.py")
    flops = formula(task.meta.flops_formula)(task.current_constants()) / 2  # each of dX and dW: 2 R H F
    model = make(task, 0)
    w = model.weight.detach()
    sets = [task.make_inputs(20 + i, "normal", DEV) for i in range(SETS)]
    starts = [[0] + torch.cumsum(s[1], 0).tolist()[:-1] for s in sets]
    spans = [list(zip(st, s[1].tolist())) for st, s in zip(starts, sets)]
    x0, c0, dy0 = sets[0]

    def loop_dx(i):
        x, _, dy = sets[i]
        return torch.cat([dy[a:a + n] @ w[e] for e, (a, n) in enumerate(spans[i])])

    def loop_dw(i):
        x, _, dy = sets[i]
        return torch.stack([dy[a:a + n].t() @ x[a:a + n] for e, (a, n) in enumerate(spans[i])])

    dx_sec = Section("grouped bwd dX", flops, cached(lambda: torch.cat(
        [dy0[a:a + n].double() @ w[e].double() for e, (a, n) in enumerate(spans[0])])))
    dx_sec.run("loop over experts", "baseline", loop_dx)
    if has_grouped_mm():
        offs = [offsets(s[1]) for s in sets]
        dx_sec.run("torch._grouped_mm", "baseline", lambda i: torch._grouped_mm(sets[i][2], w, offs=offs[i]))
    for name, cfg, opts in DX:
        def dx(i, c=cfg, o=opts):
            x, counts, dy = sets[i]
            layout = align_counts(counts, x.shape[0], c[0])
            return grouped_gemm(dy, w, layout, torch.empty_like(x), transpose_b=True, config=c, **o)
        dx_sec.run(name, "seed", dx)
    dw_sec = Section("grouped bwd dW", flops, cached(lambda: torch.stack(
        [dy0[a:a + n].double().t() @ x0[a:a + n].double() for a, n in spans[0]])))
    dw_sec.run("loop over experts", "baseline", loop_dw)
    if has_grouped_mm():
        dw_sec.run("torch._grouped_mm", "baseline", lambda i: torch._grouped_mm(sets[i][2].t(), sets[i][0],
                                                                                 offs=offs[i]))
    for name, cfg, impl in DW:
        def dw(i, c=cfg, m=impl):
            x, counts, dy = sets[i]
            layout = align_counts(counts, x.shape[0], 128 if not SMOKE else 16)
            return grouped_dw(dy, x, layout, torch.empty_like(w), config=c, impl=m)
        dw_sec.run(name, "seed", dw)


# ---- the layer ----------------------------------------------------------------------------------------------------
def layer(name: str, variants=None) -> None:
    task = task_for(f"moe_layer_{name}.py")
    flops = formula(task.meta.flops_formula)(task.current_constants())
    model = make(task, 0)
    k, scoring, scale = model.top_k, model.scoring, model.routed_scale
    bias = model.router_bias if scoring == "sigmoid" else None
    wgu, wd = model.w_gate_up.detach(), model.w_down.detach()
    sets = [task.make_inputs(30 + i, "normal", DEV) for i in range(SETS)]
    x0, l0 = sets[0]
    n = min(CHECK_TOKENS, x0.shape[0])

    def truth():
        ref = make(task, 0).double()
        out = ref(x0[:n].double(), l0[:n].double())
        del ref
        return out

    sec = Section(f"layer {name}", flops, cached(truth))
    with torch.no_grad():
        sec.run("loop over experts", "baseline", lambda i: model(*sets[i]), cut=lambda o: o[:n])
        if has_grouped_mm():
            sec.run("torch._grouped_mm + torch routing/SwiGLU/combine", "baseline",
                    lambda i, f=vendor_moe_layer(model): f(*sets[i]), cut=lambda o: o[:n])
        for vname, up, down, opts in variants or LAYER:
            sec.run(vname, "seed", lambda i, u=up, d=down, o=opts: moe_layer_fwd(
                sets[i][0], sets[i][1], wgu, wd, k, scoring, bias, scale, u, d, **o), cut=lambda o: o[:n])
    del model, sets


# ---- the table ----------------------------------------------------------------------------------------------------
def table() -> None:
    head = (f"{'op':<18} {'variant':<44} {'ms':>8} {'TFLOP/s':>8} {'% ceil':>7} {'vs best base':>12} "
            f"{'rel L2':>9} {'worst row':>9}")
    print("\n" + head)
    for op in dict.fromkeys(r["op"] for r in ROWS):
        rows = [r for r in ROWS if r["op"] == op]
        base = [r["ms"] for r in rows if r["kind"] == "baseline" and r["ms"] == r["ms"]]
        best = min(base) if base else float("nan")
        for r in rows:
            r["pct_ceiling"] = 100 * r["tflops"] / CEILING_TFLOPS
            r["speedup_vs_best_baseline"] = best / r["ms"]
            flag = "" if r["ok"] or r["kind"] == "baseline" else "  WRONG" if r["rel_l2"] == r["rel_l2"] else ""
            print(f"{op:<18} {r['variant'][:44]:<44} {r['ms']:8.3f} {r['tflops']:8.1f} {r['pct_ceiling']:6.1f}% "
                  f"{r['speedup_vs_best_baseline']:11.2f}x {r['rel_l2']:9.2e} {r['worst_row']:9.2e}{flag}"
                  f"{'  ' + r['note'] if r['note'] else ''}")
    env = (f"{'SMOKE (CPU interpreter: times mean nothing)' if SMOKE else torch.cuda.get_device_name()}, "
           f"torch {torch.__version__}, triton {triton.__version__}, {time.time() - T0:.0f} s")
    print(f"\n{env}")
    if os.environ.get("OUT"):
        keep = [{k: v for k, v in r.items() if k not in ("cfg", "opts")} for r in ROWS]
        Path(os.environ["OUT"]).mkdir(parents=True, exist_ok=True)
        (Path(os.environ["OUT"]) / "bench_moe.json").write_text(json.dumps({"env": env, "rows": keep}, indent=1))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="CPU interpreter, tiny shapes (checks the script)")
    parser.add_argument("--layers", action="store_true",
                        help="the two layers alone with the wider LAYER_SWEEP variants (about 110 s)")
    args = parser.parse_args()
    if args.layers:
        BUDGET.update({"layer deepseek": 45, "layer mixtral": 55})
    parts = [(f"layer {n}", lambda n=n: layer(n, LAYER_SWEEP)) for n in ("deepseek", "mixtral")] if args.layers else [
        ("grouped fwd", lambda: grouped_fwd(1, FWD)),
        ("grouped fwd skew8", None),
        ("grouped bwd", grouped_bwd),
        ("layer deepseek", lambda: layer("deepseek")),
        ("layer mixtral", lambda: layer("mixtral")),
    ]
    uniform: list[dict] = []
    for label, part in parts:
        try:
            if label == "grouped fwd":
                uniform = part()
            elif label == "grouped fwd skew8":  # the pointer kernel and the two fastest correct TMA variants
                tma = sorted((r for r in uniform if r["ok"] and r["opts"] != PTR), key=lambda r: r["ms"])[:2]
                grouped_fwd(8, [FWD[0]] + [(r["variant"], r["cfg"], r["opts"]) for r in tma])
            else:
                part()
        except Exception as exc:  # one broken part must not lose the others' numbers
            log(f"{label}: failed: {type(exc).__name__}: {str(exc)[:300]}")
        if not SMOKE:
            torch.cuda.empty_cache()
    table()
    return 0 if all(r["ok"] for r in ROWS if r["kind"] == "seed" and not r["note"]) else 1


if __name__ == "__main__":
    sys.exit(main())
