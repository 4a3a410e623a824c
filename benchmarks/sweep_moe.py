"""H200 sweep of the grouped GEMM forward (seeds/moe.py) on the ANCHORS shape, in one call of <= 90 s.

64 experts x 2048 rows, H 4096 -> F 1408, bf16 (tasks/moe_grouped_gemm.py), under two loads: uniform, and expert 0
at 8x the average load (the rest spread evenly; SKEW = 8). Rows: the per-expert loop of matmuls (the task's
reference), torch._grouped_mm, the seed's current default (grouped_linear_fwd without options: TMA, 256x128x64,
8 warps, 3 stages, GROUP_M 8, flattened persistent loop) and the variants below. Every row is first checked against
an fp32 product (TF32 off) of input set 0 (relative L2 and the worst row's relative L2, held to 4x the loop's own
error); a wrong row prints WRONG and is not timed. Then triton.testing.do_bench medians over 3 rotating input sets
(benchmarks/_bench.py). Each variant runs both loads back to back (one compile); past --budget seconds (72) no new
variant starts. Prints one table last: ms, TFLOP/s, speedup vs torch._grouped_mm and vs the best baseline, and for
the skewed load the ratio to the same row's uniform speed (the target: within 15%).

Why each variant might win (smem figures from compiling for sm_90 with Triton 3.9; 227 KiB is the limit):
  G4 / G16        GROUP_M 4 or 16: the m-blocks that sweep an expert's 11 n-tiles together (8 blocks = one
                  uniform expert), trading L2 reuse of the expert weight against reuse of A's rows
  split2 s3       two [256, 64] accumulators: the epilogue converts half a tile at a time (180 KiB, not 213)
  split2 s4       ... which lets a 4th stage fit (229 KiB; s4 without the split needs 262 KiB: does not launch)
  split2 s4 G16 / nonflat / tiles   the same with GROUP_M 16, without flattening, or one program per tile
                  (no persistence: the hardware scheduler balances the skewed load)
  s4 nonflat      without flattening the epilogue's scratch reuses the dead stage buffers (197 KiB at s4, no split
                  needed), but the next tile's first loads no longer overlap this tile's epilogue (measured: 642 vs 649)
  split2 s3 tmastore   full blocks of C stored by TMA (213 KiB; without the split 279 KiB, does not launch)
  BK128 s2 split2 half the k-steps (and barrier waits) per tile, 2 stages of 96 KiB (229 KiB)
  ws s4           tl.range(warp_specialize=True): a producer warp for the TMA loads, where Triton 3.6 applies it
  128x128 s5      128-row blocks: half the padding of the skewed load's partial blocks, 5 stages (197 KiB)
  128x256 s4 split2    wider B reuse per A tile; 1408 = 5.5 x 256, so the last n-tile is half empty
Not swept: num_warps 4 (a 256x128 fp32 accumulator is 256 registers a thread; Triton 3.9's warp specialiser
crashes on it), maxnreg (one 8-warp CTA per SM already gets 255 registers a thread).

    PYTHONPATH=. python3 benchmarks/sweep_moe.py                                  # on the GPU machine
    TRITON_INTERPRET=1 python3 benchmarks/sweep_moe.py --smoke                    # CPU: checks the script only
"""
from __future__ import annotations

import importlib.util
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
sys.path.insert(0, str(ROOT / "benchmarks"))

from seeds.moe import grouped_linear_fwd  # noqa: E402
from _bench import parser, rel_l2, rotating_median_ms  # noqa: E402

DEV = "cpu" if SMOKE else "cuda"
SETS = 3
EXPERTS, ROWS, H, F = (16, 384, 48, 40) if SMOKE else (64, 131072, 4096, 1408)
FLOPS = 2 * ROWS * H * F
SKEWS = (1, 8)

# A variant: (name, (BM, BN, BK, warps, stages, GROUP_M), grouped_gemm options); None: the seed's default call.
FLAT = {"impl": "tma", "flatten": True}
SPLIT = {**FLAT, "split_n": 2}
VARIANTS = [  # most promising first: past --budget the last ones are skipped
    ("default (TMA 256x128x64 s3 G8 flat)", None, {}),
    ("256x128x64 s4 split2", (256, 128, 64, 8, 4, 8), SPLIT),
    ("256x128x64 s4 nonflat", (256, 128, 64, 8, 4, 8), {"impl": "tma"}),
    ("256x128x64 s3 split2", (256, 128, 64, 8, 3, 8), SPLIT),
    ("256x128x64 s3 split2 tmastore", (256, 128, 64, 8, 3, 8), {**SPLIT, "tma_store": True}),
    ("256x128x128 s2 split2", (256, 128, 128, 8, 2, 8), SPLIT),
    ("256x128x64 s4 split2 G16", (256, 128, 64, 8, 4, 16), SPLIT),
    ("256x128x64 s3 G4", (256, 128, 64, 8, 3, 4), FLAT),
    ("256x128x64 s3 G16", (256, 128, 64, 8, 3, 16), FLAT),
    ("256x128x64 s4 split2 tiles", (256, 128, 64, 8, 4, 8), {**SPLIT, "programs": "tiles"}),
    ("256x128x64 s4 split2 nonflat", (256, 128, 64, 8, 4, 8), {"impl": "tma", "split_n": 2}),
    ("256x128x64 s4 ws", (256, 128, 64, 8, 4, 8), {"impl": "tma", "warp_specialize": True}),
    ("128x128x64 s5", (128, 128, 64, 8, 5, 8), FLAT),
    ("128x256x64 s4 split2", (128, 256, 64, 8, 4, 8), SPLIT),
]
T0 = time.time()


def log(msg: str) -> None:
    print(f"[{time.time() - T0:6.1f}s] {msg}", flush=True)


def load_task_module():
    spec = importlib.util.spec_from_file_location("moe_grouped_gemm_task", ROOT / "tasks" / "moe_grouped_gemm.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def worst_row(got: torch.Tensor, truth: torch.Tensor) -> float:
    """The largest relative L2 error of one row: a row left unwritten or written with another expert's weights."""
    g, t = got.double(), truth.double()
    if not torch.isfinite(g).all():
        return float("inf")
    return float(((g - t).norm(dim=1) / t.norm(dim=1).clamp_min(1e-30)).max())


def smoke_config(cfg):
    """The interpreter's stand-in for a GPU tile config: small tiles, same warps/stages/GROUP_M (ignored there)."""
    return None if cfg is None else (16, 32, 16, cfg[3], 1, cfg[5])


def resolve(cfg, opts: dict) -> dict:
    """grouped_linear_fwd's keyword options; programs "tiles": one program per tile of the largest layout."""
    opts = dict(opts)
    if opts.get("programs") == "tiles":
        bm, bn = cfg[0], cfg[1]
        opts["programs"] = triton.cdiv(ROWS + EXPERTS * (bm - 1), bm) * triton.cdiv(F, bn)
    return opts


class Load:
    """One routing load: its input sets, counts, fp32 truth of set 0, rows of the table."""

    def __init__(self, task, skew: int, weight: torch.Tensor, xs: list[torch.Tensor]):
        self.skew, self.w, self.xs = skew, weight, xs
        self.counts = torch.tensor(task.expert_counts(ROWS, EXPERTS, skew), device=DEV)
        self.offs = torch.cumsum(self.counts, 0).to(torch.int32)
        self.task = task
        self.truth = None
        self.bar = (1e-2, 5e-2)  # (rel L2, worst row) allowed; tightened to 4x the loop's own error
        self.rows: list[dict] = []

    def fp32_truth(self) -> torch.Tensor:
        if self.truth is None:
            prev = torch.backends.cuda.matmul.allow_tf32
            torch.backends.cuda.matmul.allow_tf32 = False
            self.truth = self.task.grouped_linear(self.xs[0].float(), self.w.float(), self.counts)
            torch.backends.cuda.matmul.allow_tf32 = prev
        return self.truth

    def run(self, name: str, kind: str, fn) -> dict:
        row = {"skew": self.skew, "variant": name, "kind": kind, "ms": float("nan"), "rel_l2": float("nan"),
               "worst_row": float("nan"), "ok": False, "note": ""}
        try:
            got = fn(0)
            truth = self.fp32_truth()
            row["rel_l2"], row["worst_row"] = rel_l2(got, truth), worst_row(got, truth)
            del got
            if kind == "loop":
                self.bar = (max(1e-2, 4 * row["rel_l2"]), max(5e-2, 4 * row["worst_row"]))
            row["ok"] = row["rel_l2"] <= self.bar[0] and row["worst_row"] <= self.bar[1]
            if row["ok"]:
                row["ms"] = rotating_median_ms(fn, SETS, SMOKE)
            else:
                row["note"] = "WRONG"
        except Exception as exc:  # a config that does not compile or launch, a torch without _grouped_mm: say so
            text = str(exc).strip().splitlines()
            row["note"] = f"failed: {type(exc).__name__}: {text[0][:120] if text else ''}"
        self.rows.append(row)
        log(f"skew{self.skew} {name}: {row['ms']:.3f} ms, rel L2 {row['rel_l2']:.3g}, worst row "
            f"{row['worst_row']:.3g} {row['note']}")
        return row


def table(loads: list[Load]) -> None:
    uniform = {r["variant"]: r["ms"] for r in loads[0].rows}
    head = (f"{'load':<6} {'variant':<36} {'ms':>8} {'TFLOP/s':>8} {'vs g_mm':>8} {'vs best':>8} {'vs unif':>8} "
            f"{'rel L2':>9} {'worst row':>9}")
    print("\n" + head)
    for load in loads:
        base = {r["variant"]: r["ms"] for r in load.rows if r["kind"] != "seed" and r["ms"] == r["ms"]}
        best = min(base.values()) if base else float("nan")
        gmm = base.get("torch._grouped_mm", float("nan"))
        for r in load.rows:
            tflops = FLOPS / r["ms"] / 1e9
            vs_unif = uniform.get(r["variant"], float("nan")) / r["ms"] if load.skew != 1 else float("nan")
            print(f"skew{load.skew:<2} {r['variant'][:36]:<36} {r['ms']:8.3f} {tflops:8.1f} {gmm / r['ms']:7.3f}x "
                  f"{best / r['ms']:7.3f}x {vs_unif:7.3f}x {r['rel_l2']:9.2e} {r['worst_row']:9.2e}"
                  f"{'  ' + r['note'] if r['note'] else ''}")
    env = (f"{'SMOKE (CPU interpreter: times mean nothing)' if SMOKE else torch.cuda.get_device_name()}, "
           f"torch {torch.__version__}, triton {triton.__version__}, {time.time() - T0:.0f} s; "
           f"{EXPERTS} experts x {ROWS} rows, H {H} -> F {F}; vs unif: skewed TFLOP/s / the row's uniform TFLOP/s")
    print(f"\n{env}")


def main() -> int:
    args = parser(__doc__.splitlines()[0], 72.0).parse_args()
    task = load_task_module()
    gen = torch.Generator(device=DEV).manual_seed(0)
    w = (torch.randn(EXPERTS, F, H, device=DEV, generator=gen) * H ** -0.5).to(torch.bfloat16)
    xs = [torch.randn(ROWS, H, device=DEV, generator=gen).to(torch.bfloat16) for _ in range(SETS)]
    loads = [Load(task, skew, w, xs) for skew in SKEWS]
    wt = w.transpose(1, 2)
    for load in loads:
        load.run("per-expert loop (task reference)", "loop",
                 lambda i, ld=load: task.grouped_linear(ld.xs[i], ld.w, ld.counts))
        if hasattr(torch, "_grouped_mm") and not SMOKE:
            load.run("torch._grouped_mm", "baseline",
                     lambda i, ld=load: torch._grouped_mm(ld.xs[i], wt, offs=ld.offs))
    for name, cfg, opts in VARIANTS:
        cfg = smoke_config(cfg) if SMOKE else cfg
        kwargs = resolve(cfg, opts) if cfg else opts
        for load in loads:
            if not SMOKE and time.time() - T0 > args.budget:
                load.rows.append({"skew": load.skew, "variant": name, "kind": "seed", "ms": float("nan"),
                                  "rel_l2": float("nan"), "worst_row": float("nan"), "ok": False,
                                  "note": "skipped: budget spent"})
                continue
            load.run(name, "seed", lambda i, ld=load, c=cfg, o=kwargs: grouped_linear_fwd(
                ld.xs[i], ld.w, ld.counts, c, **o))
        if not SMOKE:
            torch.cuda.empty_cache()
    table(loads)
    wrong = [r for ld in loads for r in ld.rows if r["note"] == "WRONG"]
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
