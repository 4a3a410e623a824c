"""The timing stage's trusted half: asks the candidate's process to time itself against the baselines
(sandbox.timing_child), then validates what came back and builds the report (profiler.report).

What the parent checks: the sampled outputs of timed calls against the reference on the same derived input set
(a cache or a warm-up-only fast path returns the wrong values there); the report's own problems (timer tampering,
outputs that changed after their call returned, event time that missed work, a time under the roofline).
"""
from __future__ import annotations

import random
import time
from typing import TYPE_CHECKING, Any

import torch

from . import tolerance
from .records import Reason, Stage
from .timing_child import derive

if TYPE_CHECKING:
    from .harness import Harness, _Run
    from .reference import Reference

REPS, WARMUP, BASE_SETS = 30, 5, 2
TIMING_MODES = ("auto", "isolated", "sustained")
BURST = 10  # calls queued back to back in sustained mode
SETTLE_MS = 100.0  # untimed calls ahead of each burst, in device ms: the clock settles under load (BENCHMARKS.md, J)
BURST_BYTES = 4 << 30  # outputs one burst may hold alive


def pacing(mode: str, bound: str, out_bytes: int) -> tuple[int, float]:
    """(calls per burst, heating ms ahead of each burst): one call at a time ("isolated"), or sustained: BURST calls
    back to back after SETTLE_MS of the same function's work ("auto" picks it for compute-bound tasks, whose clock
    depends on how busy the GPU has been), as many as BURST_BYTES of outputs allow."""
    if mode not in TIMING_MODES:
        raise ValueError(f"unknown timing mode {mode!r}; use one of {', '.join(TIMING_MODES)}")
    if mode == "isolated" or (mode == "auto" and bound != "compute"):
        return 1, 0.0
    return max(1, min(BURST, BURST_BYTES // max(1, out_bytes))), SETTLE_MS


def run(harness: "Harness", run: "_Run", reference: "Reference") -> tuple[dict[str, Any], dict[str, Any]]:
    from .harness import _Reject

    task = run.task
    harness._request(run, Stage.TIMING, {"op": "rebuild", "init_inputs": reference.init_inputs(),
                                         "state_dict": reference.state_dict(), "seed": reference.model_seed})
    report = measure(harness, run, reference, candidate=True)
    if report["problems"]:
        first = report["problems"][0]
        try:
            reason = Reason(first["reason"])
        except ValueError:
            reason = Reason.TIMING_INCONSISTENT
        raise _Reject(Stage.TIMING, reason, first["message"], details={"timing": report})
    b = report["baselines"].get("eager") or {}
    return report, {"candidate_ms": report["candidate_ms"], "speedup_vs_eager": b.get("speedup"),
                    "constants": task.current_constants()}


def measure(harness: "Harness", run: "_Run", reference: "Reference", *, candidate: bool) -> dict[str, Any]:
    """Time in the child, validate in the parent, return profiler.report's dict."""
    from profiler.ceilings import get_ceilings
    from profiler.report import build_timing
    from profiler.roofline import task_roofline

    task, opts = run.task, run.options
    seeds = [run.rng.randrange(1 << 31) for _ in range(BASE_SETS)]
    base = [task.make_inputs(s, "normal", run.device) for s in seeds]
    out_bytes = reference.output_bytes(base[0])  # the reference alone: no float64 truth to size the transfers
    t_roof = time.monotonic()
    with torch.no_grad():
        roof = task_roofline(task, reference.model, base[0], get_ceilings(opts.gpu))
    if torch.device(run.device).type == "cuda":  # run.device is "cuda:N": what the parent ran stays cached
        torch.cuda.empty_cache()  # else held while the child times (run BD: 102 GiB, the child out of memory)
    msg = {"op": "time", "task": str(task.path), "overrides": dict(task.overrides), "base_seeds": seeds,
           "reps": REPS, "warmup": WARMUP, "baselines": list(opts.baselines), "model_seed": reference.model_seed,
           "sample_every": max(1, REPS // 4)}
    msg["burst"], msg["settle_ms"] = pacing(opts.timing_mode, roof.bound, out_bytes)
    t0 = time.monotonic()
    reply = harness._request(run, Stage.TIMING, msg, max_bytes=(REPS // max(1, REPS // 4) + 2) * out_bytes * 2
                             + (64 << 20))
    t1 = time.monotonic()
    measured = reply["measured"]
    problems = _validate(run, reference, base, measured, reply["n_sets"]) if candidate else []
    t2 = time.monotonic()
    report = build_timing(measured, candidate="candidate" if candidate else None, baselines=reply["baselines"],
                          roof=roof, kernels=reply["kernels"], environment=reply["environment"],
                          output_problems=problems, seed=random.Random(seeds[0]).randrange(1 << 30))
    child_laps = reply.get("laps") if isinstance(reply.get("laps"), dict) else {}
    report["laps"] = {"request_s": t1 - t0, "validate_s": t2 - t1, "roofline_s": t0 - t_roof,
                      "report_s": time.monotonic() - t2,
                      **{str(k): float(v) for k, v in child_laps.items() if isinstance(v, (int, float))}}
    return report


def _validate(run: "_Run", reference: "Reference", base: list[list[Any]], measured: dict[str, Any],
              n_sets: int) -> list[str]:
    problems = []
    meta = run.task.meta
    for sample in measured.get("samples", []):
        k = int(sample["input_set"])
        if not 0 <= k < n_sets:
            problems.append(f"timed call {sample['call']} reported input set {k}, which does not exist")
            continue
        expected = reference.run(derive(base, k, meta.fixed_inputs))
        outs = sample["outputs"] if isinstance(sample["outputs"], list) else [sample["outputs"]]
        if len(outs) != len(expected.ref) or not all(isinstance(o, torch.Tensor) for o in outs):
            problems.append(f"timed call {sample['call']} returned outputs of another structure")
            continue
        for i, (got, ref) in enumerate(zip(outs, expected.ref)):
            truth = expected.truth[i] if expected.truth is not None else None
            if got.shape != ref.shape or got.dtype != ref.dtype:
                problems.append(f"timed call {sample['call']}: output {i} has shape/dtype "
                                f"{list(got.shape)}/{got.dtype}, expected {list(ref.shape)}/{ref.dtype}")
                break
            mismatch = tolerance.compare(f"output {i}", got.to(ref.device), ref, truth, allow_tf32=meta.allow_tf32,
                                         scale=meta.tolerance_scale, alternates=expected.alternates_for(i))
            if mismatch is not None:
                problems.append(f"timed call {sample['call']} (input set {k}) returned a wrong result: "
                                + mismatch.describe())
                break
    return problems
