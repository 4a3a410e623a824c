"""A check's verdict record (sandbox.records.CheckResult) from its stages: accepted only where every stage passed,
else the last stage's reason and message; the environment it ran in and where its seconds went (`costs`)."""
from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from .records import CheckResult, Reason, Stage, StageResult, Verdict

if TYPE_CHECKING:
    from .harness import _Run
    from .task import Task


def assemble(device: str, task: Task, candidate: Path, stages: list[StageResult], start: float,
             timing: dict[str, Any] | None, network_isolated: bool = False, run: _Run | None = None) -> CheckResult:
    last = stages[-1]
    accepted = all(s.passed for s in stages)
    if accepted:
        message = ("accepted: re-timed, its first call correct (its earlier check tried every input distribution and "
                   "shape)" if run is not None and run.options.retime else
                   "accepted: correct on every input distribution and shape tried")
        eager = ((timing or {}).get("baselines") or {}).get("eager") or {}
        if eager.get("speedup") is not None:
            message += (f"; {eager['speedup']:.2f}x eager [{eager['ci_low']:.2f}, {eager['ci_high']:.2f}] "
                        f"({eager['verdict']})")
        message += "" if timing else " (not timed)"
    else:
        message = last.message
    return CheckResult(
        task=str(task.path), candidate=str(candidate), device=device,
        verdict=Verdict.ACCEPTED if accepted else Verdict.REJECTED, stage=last.stage,
        reason=Reason.OK if accepted else last.reason, message=message, stages=tuple(stages),
        seconds=time.monotonic() - start, timed=timing is not None, timing=timing,
        environment={"device": device, "torch": torch.__version__, "triton": _triton_version(),
                     "network_isolated": network_isolated, "constants": task.current_constants()},
        costs=costs(stages, run, time.monotonic() - start),
    )


def costs(stages: list[StageResult], run: _Run | None, total: float) -> dict[str, float]:
    """Where the check's seconds went: the candidate's calls, the timing stage, the harness's own, its laps."""
    timing_s = sum(s.seconds for s in stages if s.stage is Stage.TIMING)
    calls_s = run.call_seconds if run else 0.0
    laps = {f"{k}_s": v for k, v in (run.laps if run else {}).items()}
    return {"total_s": total, "candidate_calls_s": calls_s, "calls": float(run.calls if run else 0),
            "kept_files": float(run.kept_files if run else 0),  # its Triton cache kept for its later checks
            # its warmer's kernels planted in its process (sandbox.warmer)
            "warmer_files": float(run.warmer.planted if run and run.warmer is not None else 0),
            "timing_stage_s": timing_s, "harness_s": max(0.0, total - calls_s - timing_s), **laps}


def _triton_version() -> str:
    import triton
    return triton.__version__
