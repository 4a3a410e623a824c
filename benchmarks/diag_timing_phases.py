"""Where a timing's exclusive seconds go: `profiler.timing.measure` called as the timing stage's child calls it
(the task's seed against eager, its input sets derived the same way, and the parent's own choices of timed and extra
calls, pacing, and keeping the outputs for sampling after the turn or sampling them during it), in a plain process,
with parts switched off one at a time. Prints the
measurement's phases (setup, warm-up round, timed rounds, fingerprints, re-check) for each variant, and the
functions that took the host's time under cProfile for one of them. A diagnostic: the numbers are not results.

    PYTHONPATH=$PWD python3 benchmarks/diag_timing_phases.py [--task tasks/attention_fwd_bwd.py]   (H100/H200, ~30 s)

The first run in the process pays each function's first calls (Triton compiling the seed, cuDNN's plans for eager);
the timing child now makes the baselines' first calls before its exclusive turn (`device_memory.first_call`).
"""
from __future__ import annotations

import argparse
import cProfile
import importlib.util
import io
import math
import pstats
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from profiler import baselines, timing  # noqa: E402
from sandbox import timing_child, timing_parent  # noqa: E402
from sandbox.task import load_task  # noqa: E402
from seeds.registry import seed_for_task  # noqa: E402


def _seed_model(task, task_path: str, reference: torch.nn.Module) -> torch.nn.Module:
    seed = seed_for_task(task_path)
    if seed is None:
        raise SystemExit(f"{task_path} has no registered seed; pass a task that has one")
    spec = importlib.util.spec_from_file_location("seed_candidate", seed.path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    model = module.ModelNew(*task.init_inputs()).cuda()
    model.load_state_dict(reference.state_dict(), strict=False)
    return model


def _measure(task, model, reference, base, incumbent_ms: float | None, *, settle_ms: float, isolate: bool,
             profile: bool) -> tuple[float, dict, str]:
    out = reference(*[x.clone() if isinstance(x, torch.Tensor) else x for x in base[0]])
    out_bytes = sum(t.numel() * t.element_size() for t in (out if isinstance(out, (list, tuple)) else [out]))
    del out
    keep = timing_parent.defer_bytes("cuda")  # as timing_parent.measure chooses for a candidate
    reps = timing_parent.timed_reps(out_bytes, keep)
    rule = timing_parent.race_rule(incumbent_ms)
    extra = timing_parent.extra_reps(out_bytes, keep, reps) if rule is not None else 0
    burst, _ = timing_parent.pacing("sustained", "compute", out_bytes)
    defer = 0 < out_bytes and (reps + extra) * out_bytes <= keep
    sample_every = max(1, reps // 4, math.ceil(reps * out_bytes / timing_parent.SAMPLE_BYTES))
    calls = (-(-timing_parent.WARMUP // burst) - (-reps // burst) - (-extra // burst)) * burst
    budget = timing_child.set_budget(torch.cuda.mem_get_info()[1])
    sets = [timing_child.derive(base, k, task.meta.fixed_inputs)
            for k in range(timing_child.set_count(base[0], calls + 1, budget))]
    built = baselines.build_all(("eager",), reference, task.module)
    fns = {"candidate": lambda args: model(*args), "eager": built["eager"].fn}
    others = ["eager"] if isolate else []
    profiler = cProfile.Profile() if profile else None
    torch.cuda.synchronize()
    t0 = time.monotonic()
    if profiler:
        profiler.enable()
    measured = timing.measure(fns, sets, reps=reps, warmup=timing_parent.WARMUP, burst=burst, settle_ms=settle_ms,
                              watch="candidate", sample_every=sample_every, fresh_inputs=others, isolate=others,
                              race=rule, extra_reps=extra, keep_outputs={} if defer else None,
                              **({"hold_bytes": keep} if defer else {}))
    if profiler:
        profiler.disable()
    seconds = time.monotonic() - t0
    text = ""
    if profiler:
        buf = io.StringIO()
        pstats.Stats(profiler, stream=buf).sort_stats("tottime").print_stats(15)
        text = buf.getvalue()
    print(f"  {out_bytes / 1e6:.0f} MB of outputs a call: {reps} timed calls, up to {extra} more, bursts of {burst}, "
          f"outputs {'kept for sampling after the turn' if defer else f'sampled every {sample_every} calls during it'}")
    del sets
    torch.cuda.empty_cache()
    return seconds, measured, text


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--task", default="tasks/attention_fwd_bwd.py")
    ap.add_argument("--incumbent-ms", type=float, default=None,
                    help="race against this time (default: the seed's own median from the first run)")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("this diagnostic times kernels on a CUDA GPU; run it on one")
        return 2
    task = load_task(args.task)
    reference = task.make_reference(1, "cuda")
    model = _seed_model(task, args.task, reference)
    base = [task.make_inputs(s, "normal", "cuda") for s in (11, 12)]
    settle = timing_parent.SETTLE_MS
    variants = [("first in the process (compiles)", dict(settle_ms=settle, isolate=True, profile=False), False),
                ("as the child runs it", dict(settle_ms=settle, isolate=True, profile=True), True),
                ("no heating", dict(settle_ms=0.0, isolate=True, profile=False), True),
                ("eager not isolated", dict(settle_ms=settle, isolate=False, profile=False), True),
                ("no race", dict(settle_ms=settle, isolate=True, profile=False), False)]
    incumbent = args.incumbent_ms
    for label, kw, race in variants:
        print(f"{label}:")
        seconds, m, prof = _measure(task, model, reference, base, incumbent if race else None, **kw)
        cfg = m.get("config") or {}
        fns = m.get("fns") or {}
        ms = {n: round(statistics.median(p["ms"]), 3) for n, p in fns.items() if p.get("ms")}
        if incumbent is None:
            incumbent = ms.get("candidate")
        phases = {k: round(v, 2) for k, v in (cfg.get("phase_s") or {}).items()}
        print(f"  {seconds:.2f} s; phases {phases}; timed calls {cfg.get('reps')}; heating calls "
              f"{cfg.get('heat_calls')}; median ms {ms}; race {(m.get('race') or {}).get('decision')}")
        if prof:
            print(prof)
    return 0


if __name__ == "__main__":
    sys.exit(main())
