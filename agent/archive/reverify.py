"""`crucible archive reverify`: re-check archived winners when the environment has changed since they were measured.

A record is due when the fingerprint it was measured on (device, GPU model, driver, CUDA, torch, triton) differs
from this machine's. It is checked again by the harness, on the device it was first checked on, every stage; a kernel
timed on a GPU is timed again. The outcome is appended to the archive (the original record never changes):

- confirmed: accepted again and, where it was timed, the new speedup's CI reaches the old one (not measurably
  slower);
- stale: rejected now (new triton, new numerics), or measurably slower than recorded, or no longer timed.

A record timed on a GPU is skipped on a machine without one: a CPU check cannot confirm a speed.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.archive.records import Candidate, Reverification, Timings, sha256

from agent.archive.store import Archive
from agent.archive.browse import fingerprint, speed_text, task_name, uncrowned, winners

log = logging.getLogger(__name__)
REPO_TASKS = Path(__file__).resolve().parents[2] / "tasks"


class ReverifyError(ValueError):
    """Nothing that can be re-checked was named; one sentence."""


@dataclass(frozen=True)
class Outcome:
    candidate: Candidate
    action: str                       # checked | skipped | current
    note: str
    record: Reverification | None = None


def current_environment(device: str) -> dict[str, Any]:
    """This machine's fingerprint for `device`, built like the one the harness and profiler record."""
    import torch
    import triton

    env: dict[str, Any] = {"device": device, "torch": torch.__version__, "triton": triton.__version__}
    if device == "cuda":
        from profiler.env import environment

        env.update(environment())
    return env


def due(cand: Candidate, current: dict[str, Any]) -> bool:
    return fingerprint(cand.env) != fingerprint(current)


def changes(cand: Candidate, current: dict[str, Any]) -> str:
    old, new = fingerprint(cand.env), fingerprint(current)
    return ", ".join(f"{k} {old[k]} -> {new[k]}" for k in old if old[k] != new[k]) or "no change"


def resolve_task(cand: Candidate) -> Path | None:
    """The task file: its recorded path, else a file of that name under ./tasks or this checkout's tasks/."""
    name = Path(cand.task_path).name
    for path in (Path(cand.task_path), Path("tasks") / name, REPO_TASKS / name):
        if path.is_file():
            return path
    return None


def targets(archive: Archive, *, task: str | None = None, every: bool = False) -> list[Candidate]:
    """Each task's best verified kernel per kind of check (timed, untimed); with `every`, all verified ones."""
    cands = archive.candidates(task=task, verdict="accepted")
    if every:
        return cands
    best: dict[tuple[str, bool], Candidate] = {}
    for c in winners(cands, uncrowned(archive, cands)):
        best.setdefault((task_name(c), c.timed), c)
    return sorted(best.values(), key=lambda c: c.id)


def judge(cand: Candidate, result: Any) -> tuple[str, str]:
    """(status, note) for a new CheckResult of an archived candidate."""
    if not result.accepted:
        return "stale", f"rejected now at {result.stage.value} ({result.reason.value}): {result.message[:300]}"
    if not cand.timed:
        return "confirmed", "accepted again (correctness only, as recorded)"
    new = Timings.from_check(result.timing)
    old = cand.timings
    was = speed_text(old.speedup_eager, old.eager_ci_low, old.eager_ci_high)
    now = speed_text(new.speedup_eager, new.eager_ci_low, new.eager_ci_high)
    if new.speedup_eager is None:
        return "stale", f"accepted, but no speedup was measured now (recorded {was})"
    high = new.eager_ci_high if new.eager_ci_high is not None else new.speedup_eager
    low = old.eager_ci_low if old.eager_ci_low is not None else old.speedup_eager
    if low is not None and high < low:
        return "stale", f"slower now: {now} vs eager, recorded {was}"
    return "confirmed", f"accepted again; {now} vs eager (recorded {was})"


def reverify(archive: Archive, *, task: str | None = None, every: bool = False, force: bool = False,
             harness_factory: Callable[[str], Any] | None = None,
             on_outcome: Callable[[Outcome], None] | None = None) -> list[Outcome]:
    """Re-checks the due targets and appends a Reverification for each one checked."""
    import torch

    from sandbox.harness import Harness

    chosen = targets(archive, task=task, every=every)
    if not chosen:
        raise ReverifyError("no verified candidates" + (f" for {task}" if task else "") + f" in {archive.path}")
    factory = harness_factory or Harness
    harnesses: dict[str, Any] = {}
    envs: dict[str, dict[str, Any]] = {}
    outcomes: list[Outcome] = []

    def emit(outcome: Outcome) -> None:
        outcomes.append(outcome)
        if on_outcome:
            on_outcome(outcome)

    try:
        for cand in chosen:
            device = (cand.env or {}).get("device") or ("cuda" if cand.timed else "cpu")
            if device == "cuda" and not torch.cuda.is_available():
                emit(Outcome(cand, "skipped", "checked on a GPU; reverify it on a machine with one"))
                continue
            if device not in envs:
                envs[device] = current_environment(device)
            if not force and not due(cand, envs[device]):
                emit(Outcome(cand, "current", "measured in this environment already"))
                continue
            task_path = resolve_task(cand)
            if task_path is None:
                emit(Outcome(cand, "skipped", f"task file {cand.task_path} is not here; run from the checkout "
                                              "that has it"))
                continue
            cand = archive.with_source(cand)
            if device not in harnesses:
                harnesses[device] = factory(device)
            rev = archive.add_reverification(recheck(harnesses[device], cand, task_path, device))
            log.info("candidate #%d: %s (%s)", cand.id, rev.status, rev.note)
            emit(Outcome(cand, "checked", rev.note, rev))
    finally:
        for harness in harnesses.values():
            harness.close()
    return outcomes


def recheck(harness: Any, cand: Candidate, task_path: Path, device: str) -> Reverification:
    """One archived candidate through the harness again, every stage, timed again where it was timed."""
    from sandbox.harness import CheckOptions

    baselines = ("eager", "compile") if cand.timings.speedup_compile is not None else ("eager",)
    with tempfile.TemporaryDirectory(prefix="crucible-reverify-") as tmp:
        path = Path(tmp) / f"candidate_{cand.id}.py"
        path.write_text(cand.source or "", encoding="utf-8")
        result = harness.check(task_path, path, CheckOptions(device=device, timing=cand.timed, baselines=baselines))
    rev = record(cand, result)
    note = rev.note
    if sha256(task_path.read_text(encoding="utf-8"))[:16] != cand.task_hash:
        note += "; the task file has changed since it was archived"
    return dataclasses.replace(rev, note=f"{note} [{changes(cand, rev.env or {})}]")


def record(cand: Candidate, result: Any) -> Reverification:
    """A new CheckResult of an archived candidate as the archive keeps it: judged against the candidate's record."""
    status, note = judge(cand, result)
    env = {**(result.environment or {}), **((result.timing or {}).get("environment") or {})}
    return Reverification(
        candidate_id=cand.id, status=status, note=note, verdict=result.verdict.value,
        stage=result.stage.value, reason=result.reason.value, timed=bool(result.timed),
        timings=Timings.from_check(result.timing), diagnostics=result.to_dict(), env=env,
        env_hash=sha256(json.dumps(env, sort_keys=True, default=str))[:16])
