"""H200 check-and-time of the fused linear + cross-entropy seed (seeds/linear_cross_entropy.py), its variants, and
what a user has today: eager (the task's Model), torch.compile'd forward + autograd backward, Liger Kernel 0.8.5.

Shape: BT 8192, H 4096, V 128256, bf16, ~5% ignore_index; target: <= 45 ms at <= 1.1 GiB extra.
Variants: the GEMM path (gemm "ptr": pointer loads, one program a tile, the 54.3 ms path; "tma": host TMA
descriptors on a persistent grid, 3 or 4 stages, warp_specialize) and how many chunks keep pass 1's logits
(1 stored: 31.6 executed TFLOP; 3 stored: 30.4). Every variant is checked on input set 0 against the float64
reference (relative L2 of loss, dx, dweight; a variant worse than max(1e-2, 4 x eager's error) is marked WRONG,
never compared with the baselines, and the script exits 1 after the table), then timed with benchmarks/_bench.py's
rotating_median_ms over 3 input sets. A variant that fails (compile error, out of resources) prints one line and
the run goes on. "GiB" is extra memory as the target counts it: peak allocated during one call minus what was
allocated before it (inputs), so the outputs dx (64 MiB) and dweight (1002 MiB) are inside it. "TF/s" is the
useful 25.8 TFLOP over the time, "exec TF/s" what the form executes (logits recomputed) over the time, "%790" the
useful rate against cuBLAS's ~790 TFLOP/s. Single GEMMs at the first-chunk shapes (ptr and TMA) come last.
Budget: sections stop starting rows at fixed times so the whole run stays under ~120 s.

    python3 benchmarks/bench_lce.py [--budget SECONDS] [--no-compile]     (GPU; OUT=dir writes bench_lce.json)
    TRITON_INTERPRET=1 python3 benchmarks/bench_lce.py --smoke            (CPU interpreter, tiny shapes)
"""
from __future__ import annotations

import copy
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from _bench import parser, rel_l2, rotating_median_ms  # noqa: E402
from sandbox.task import load_task  # noqa: E402
from seeds.linear_cross_entropy import (Gemm, dx_tail_rows, linear_cross_entropy_fwd_bwd, matmul,  # noqa: E402
                                        vocab_chunks)

SETS = 3
CUBLAS_TFLOPS = 790.0  # ANCHORS.md: cuBLAS's best bf16 product on the H200 (694-788 measured)
# Seconds after the start at which each section stops starting rows (a row can take ~10 s with its compiles; the
# torch.compile baseline ~25 s), so the whole run ends under ~120 s.
VARIANTS_UNTIL, COMPILE_UNTIL, GEMMS_UNTIL = 80.0, 70.0, 100.0
T0 = time.time()
ROWS: list[dict] = []


def log(msg: str) -> None:
    print(f"[{time.time() - T0:6.1f}s] {msg}", flush=True)


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:200] if text else ''}"


class Bench:
    def __init__(self, smoke: bool, budget: float):
        self.smoke, self.budget = smoke, budget
        self.dev = "cpu" if smoke else "cuda"
        self.bt, self.h, self.v = (40, 32, 300) if smoke else (8192, 4096, 128256)
        self.flops = 3 * 2 * self.bt * self.h * self.v
        task = load_task(ROOT / "tasks/linear_cross_entropy.py").with_constants(
            {"BT": self.bt, "H": self.h, "V": self.v})
        self.task = task
        self.model = task.make_reference(0, self.dev)
        self.w = self.model.weight.detach()
        g = torch.Generator(device=self.dev).manual_seed(1)
        self.sets = []
        for _ in range(SETS):
            t = torch.randint(0, self.v, (self.bt,), device=self.dev, generator=g)
            t[torch.rand(self.bt, device=self.dev, generator=g) < 0.05] = -100
            x = torch.randn(self.bt, self.h, device=self.dev, dtype=torch.bfloat16, generator=g)
            self.sets.append((x, t))
        x, t = self.sets[0]
        m64 = copy.deepcopy(self.model).double()
        self.truth = m64(x.double(), t)
        del m64
        self.empty_cache()
        eager = self.model(x, t)
        self.eager_err = [rel_l2(a, b) for a, b in zip(eager, self.truth)]
        del eager
        self.empty_cache()
        log("eager rel L2 (loss, dx, dweight): " + ", ".join(f"{e:.3g}" for e in self.eager_err))
        self.wrong: list[str] = []
        self.failed: list[str] = []

    def empty_cache(self) -> None:
        if not self.smoke:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()

    def over(self, what: str, until: float) -> bool:
        limit = min(until, self.budget)
        if time.time() - T0 > limit and not self.smoke:
            log(f"skipped {what}: past {limit:.0f} s")
            ROWS.append({"op": "linear+CE", "variant": what, "skipped": True})
            return True
        return False

    def peak_gib(self, fn) -> float:
        if self.smoke:
            return float("nan")
        self.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        out = fn(0)
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
        del out
        return peak / 2**30

    def run(self, name: str, fn, until: float, baseline: bool = False, exec_flops: float | None = None) -> None:
        """fn(i) -> (loss, dx, dweight) on input set i: check on set 0, measure memory, time over the sets. A
        failure (compile error, out of resources) costs this row only."""
        if self.over(name, until):
            return
        row = {"op": "linear+CE", "variant": name, "baseline": baseline}
        try:
            got = fn(0)
            errs = [rel_l2(a, b) for a, b in zip(got, self.truth)]
            del got
            ok = all(e <= max(1e-2, 4 * ref) for e, ref in zip(errs, self.eager_err))
            row.update(loss_l2=errs[0], dx_l2=errs[1], dw_l2=errs[2], ok=ok)
            if not ok:
                self.wrong.append(name)
                log(f"WRONG {name}: rel L2 loss {errs[0]:.3g} dx {errs[1]:.3g} dweight {errs[2]:.3g}")
            row["gib"] = self.peak_gib(fn)
            self.empty_cache()
            row["ms"] = rotating_median_ms(fn, SETS, self.smoke)
        except Exception as exc:  # a benchmark row, not a candidate: report and go on
            log(f"FAILED {name}: {first_line(exc)}")
            self.failed.append(name)
            ROWS.append({"op": "linear+CE", "variant": name, "error": first_line(exc)})
            self.empty_cache()
            return
        row["tflops"] = self.flops / row["ms"] / 1e9
        row["exec_tflops"] = (exec_flops or self.flops) / row["ms"] / 1e9
        ROWS.append(row)
        log(f"{name:40s} {row['ms']:9.3f} ms {row['tflops']:6.1f} TFLOP/s {row['gib']:.3f} GiB")

    def gemm(self, name: str, a, b, out, config, gemm: Gemm) -> None:
        if self.over(name, GEMMS_UNTIL):
            return
        flops = 2 * a.shape[0] * a.shape[1] * b.shape[1]
        try:
            ms = rotating_median_ms(lambda i: matmul(a, b, out, config=config, gemm=gemm), SETS, self.smoke)
        except Exception as exc:
            log(f"FAILED GEMM {name}: {first_line(exc)}")
            ROWS.append({"op": "GEMM", "variant": name, "error": first_line(exc)})
            return
        ROWS.append({"op": "GEMM", "variant": name, "ms": ms, "tflops": flops / ms / 1e9})
        log(f"GEMM {name:35s} {ms:9.3f} ms {flops / ms / 1e9:6.1f} TFLOP/s")


def seed_variants(b: Bench) -> tuple[list[tuple[str, dict]], list[tuple[str, dict]]]:
    """(first, rest): the default before the baselines, the others after. The dx tiles of the fp32-summed dx (the
    default's 3 stages of 128 x 256 did not fit beside its fp32 epilogue) and dx summed in bf16."""
    def dx(config):
        return dict(dx_config=None if b.smoke else config)
    first = [("tma s3, 3 stored, dx fp32 128x256x32 s3 (default)", {})]
    rest = [
        ("tma s3, 3 stored, dx bf16 (46.18 ms in run L)", dict(dx_fp32=False)),
        ("dx fp32 summed in dweight's last rows (no 128 MiB accumulator)", dict(dx_in_dweight=True)),
        ("dx fp32, dx tiles 128x128x64 s4", dx((128, 128, 64, 8, 4))),
        ("dx fp32, dx tiles 128x256x64 s2", dx((128, 256, 64, 8, 2))),
        ("dx fp32, dx tiles 128x128x64 s3", dx((128, 128, 64, 8, 3))),
    ]
    return first, rest


def exec_flops(b: Bench, kw: dict) -> float:
    """What the vocab form executes: the three products plus the logits recomputed outside the stored chunks (and,
    with dx_in_dweight, once more for the tail rows that hold the dx accumulator)."""
    tail = dx_tail_rows(b.bt, b.h, b.v, 2) if kw.get("dx_in_dweight") else 0
    chunks, n_stored = vocab_chunks(b.bt, b.h, b.v - tail, 3072 if not b.smoke else 16, kw.get("store_chunks", 3))
    stored = chunks[n_stored - 1][1] if n_stored else 0
    return 2 * b.bt * b.h * (4 * b.v - stored + tail)


def seed_call(b: Bench, kw: dict):
    return lambda i: linear_cross_entropy_fwd_bwd(b.sets[i][0], b.w, b.sets[i][1], **kw)


def baselines(b: Bench) -> None:
    b.run("eager (task Model)", lambda i: b.model(*b.sets[i]), VARIANTS_UNTIL, baseline=True)
    if b.smoke:
        return
    try:
        lig = b.task.module.crucible_liger(b.model)
    except Exception as exc:  # a missing Liger costs its row, not the run
        log(f"liger unavailable: {first_line(exc)}")
        return
    b.run("liger 0.8.5", lambda i: lig(*b.sets[i]), VARIANTS_UNTIL, baseline=True)


def gemms(b: Bench) -> None:
    """The vocab form's first-chunk products alone (n = V/3 columns, TMA, 3 stages), and the dx product into an
    fp32 output with the tiles that fit beside its epilogue."""
    n = (b.v // 3) // 256 * 256 if not b.smoke else b.v // 3
    x, _ = b.sets[0]
    dl = torch.randn(b.bt, n, device=b.dev, dtype=torch.bfloat16) * 1e-3
    logits = torch.empty(b.bt, n, device=b.dev, dtype=torch.bfloat16)
    dw = torch.empty(n, b.h, device=b.dev, dtype=torch.bfloat16)
    dx = torch.empty(b.bt, b.h, device=b.dev, dtype=torch.bfloat16)
    dx32 = torch.empty(b.bt, b.h, device=b.dev, dtype=torch.float32)

    def cfg(c):
        return None if b.smoke else c
    s3 = cfg((128, 256, 64, 8, 3))
    b.gemm(f"logits x W^T {b.bt}x{n}x{b.h} tma s3", x, b.w[:n].t(), logits, s3, Gemm())
    b.gemm(f"dW dl^T x {n}x{b.h}x{b.bt} tma s3", dl.t(), x, dw, s3, Gemm())
    b.gemm(f"dx dl W {b.bt}x{b.h}x{n} tma s3", dl, b.w[:n], dx, s3, Gemm())
    for tag, c in (("128x256x64 s2", (128, 256, 64, 8, 2)), ("128x128x64 s4", (128, 128, 64, 8, 4)),
                   ("128x256x32 s3", (128, 256, 32, 8, 3))):
        b.gemm(f"dx fp32 out {b.bt}x{b.h}x{n} {tag}", dl, b.w[:n], dx32, cfg(c), Gemm())
    del dl, logits, dw, dx, dx32
    b.empty_cache()


def table(b: Bench) -> str:
    base = [r["ms"] for r in ROWS if r.get("baseline") and "ms" in r]
    best = min(base) if base else float("nan")
    lines = [f"linear + CE fwd+bwd, BT {b.bt} H {b.h} V {b.v} bf16 ({b.flops / 1e12:.1f} TFLOP); target <= 45 ms at "
             f"<= 1.1 GiB; eager rel L2 loss/dx/dW " + " / ".join(f"{e:.2g}" for e in b.eager_err),
             f"{'op':9s} {'variant':42s} {'ms':>8s} {'TF/s':>6s} {'exec':>6s} {'%790':>5s} {'GiB':>6s} "
             f"{'vs best':>7s} {'loss L2':>8s} {'dx L2':>8s} {'dW L2':>8s} ok"]
    for r in ROWS:
        if r.get("skipped"):
            lines.append(f"{r['op']:9s} {r['variant']:42s} skipped (time budget)")
            continue
        if "error" in r:
            lines.append(f"{r['op']:9s} {r['variant']:42s} FAILED {r['error'][:90]}")
            continue
        win = r["op"] != "GEMM" and not r.get("baseline") and r.get("ok")
        vs = f"{best / r['ms']:6.2f}x" if win else ("  base" if r.get("baseline") else "     -")
        errs = " ".join(f"{r[k]:8.2g}" if k in r else f"{'':8s}" for k in ("loss_l2", "dx_l2", "dw_l2"))
        ok = {True: "ok", False: "WRONG"}.get(r.get("ok"), "")
        gib = r.get("gib", float("nan"))
        ex = r.get("exec_tflops", r["tflops"])
        lines.append(f"{r['op']:9s} {r['variant']:42s} {r['ms']:8.3f} {r['tflops']:6.1f} {ex:6.1f} "
                     f"{100 * r['tflops'] / CUBLAS_TFLOPS:4.0f}% {gib:6.3f} {vs:>7s} {errs} {ok}")
    return "\n".join(lines)


def start(title: str, budget: float, options=None):
    """(args, Bench) from the command line (--budget, --smoke, --no-compile, and what `options(parser)` adds), or
    the exit code 2 with one sentence where the run cannot happen here; shared with sweep_lce.py."""
    ap = parser(title, budget)
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile baseline")
    if options is not None:
        options(ap)
    args = ap.parse_args()
    if args.smoke and os.environ.get("TRITON_INTERPRET") != "1":
        print("--smoke needs TRITON_INTERPRET=1 (the CPU interpreter)", file=sys.stderr)
        return 2
    if not args.smoke and not torch.cuda.is_available():
        print("no CUDA GPU: run on the H200, or use --smoke with TRITON_INTERPRET=1", file=sys.stderr)
        return 2
    if not args.smoke:
        import triton
        log(f"{torch.cuda.get_device_name()} torch {torch.__version__} triton {triton.__version__}")
    return args, Bench(args.smoke, args.budget)


def main() -> int:
    started = start(__doc__.splitlines()[0], 110.0)
    if isinstance(started, int):
        return started
    args, b = started
    # The default and the measured pointer path first, then the baselines (compile included: the best one), the
    # other variants, the single GEMMs.
    first, rest = seed_variants(b)
    for name, kw in first:
        b.run(name, seed_call(b, kw), VARIANTS_UNTIL, exec_flops=exec_flops(b, kw))
    baselines(b)
    if not args.no_compile and not b.smoke and not b.over("torch.compile fwd + autograd bwd", COMPILE_UNTIL):
        baselines_compile(b)
    for name, kw in rest:
        b.run(name, seed_call(b, kw), VARIANTS_UNTIL, exec_flops=exec_flops(b, kw))
    gemms(b)
    text = table(b)
    out = os.environ.get("OUT")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "bench_lce.json").write_text(json.dumps({"rows": ROWS, "eager_rel_l2": b.eager_err,
                                                              "wrong": b.wrong, "failed": b.failed}, indent=1))
    return report(b, text)


def report(b: Bench, text: str) -> int:
    """The table, then the failed and wrong rows; the exit code: 1 if a row was wrong (shared with sweep_lce.py)."""
    print(text, flush=True)
    if b.failed:
        print(f"FAILED variants: {', '.join(b.failed)}", flush=True)
    if b.wrong:
        print(f"WRONG variants: {', '.join(b.wrong)}", flush=True)
        return 1
    return 0


def baselines_compile(b: Bench) -> None:
    """torch.compile'd forward (linear + fp32 cross-entropy) with autograd's backward: what a user compiles."""
    model = b.model

    def loss_of(x, w, t):
        return F.cross_entropy(F.linear(x, w).float(), t, ignore_index=-100)

    compiled = torch.compile(loss_of, dynamic=False)

    def step(i):
        x, t = b.sets[i]
        x = x.detach().requires_grad_()
        loss = compiled(x, model.weight, t)
        dx, dw = torch.autograd.grad(loss, (x, model.weight))
        return loss.detach(), dx, dw

    try:
        step(0)
    except Exception as exc:  # a compile failure costs its row only
        log(f"torch.compile failed: {first_line(exc)}")
        return
    b.run("torch.compile fwd + autograd bwd", step, COMPILE_UNTIL + 30, baseline=True)


if __name__ == "__main__":
    sys.exit(main())
