"""The search loop's own seconds between a verdict and the next checks: what the coordinator spends proposing.

    python3 benchmarks/bench_loop_overhead.py                                  # attention_fwd_bwd, 4 slots, 12
    python3 benchmarks/bench_loop_overhead.py --tasks rmsnorm_fwd,attention_fwd_bwd --budget 16 --no-csv

The tuner searches each task from its registered seed with an evaluator that answers every check at once ("accepted",
after `--check-s`), so the seconds measured are the loop's: extracting, flattening and admitting each proposal,
recording each verdict (its niche, its normal form), the tuner's mutations. Per task it prints and appends to
benchmarks/data/loop_overhead.csv (CPU, Python, commit): from the starting kernel's verdict to the first proposal's
check (`first_submit_s`, when every slot is filled at once) and the mean from any verdict to the next check submitted
(`verdict_to_submit_s`). On the GPU this is time the slots stand idle: a search over a 2,600-line flattened attention
seed spent about 5 s of it before each round of proposals.
"""
from __future__ import annotations

import argparse
import logging
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from benchmarks._bench import append_csv, task_files  # noqa: E402
from benchmarks._bench import commit as repo_commit  # noqa: E402
CSV = ROOT / "benchmarks" / "data" / "loop_overhead.csv"
FIELDS = ["date", "commit", "cpu", "python", "task", "slots", "proposals", "first_submit_s", "verdict_to_submit_s",
          "wall_s"]


def cpu_name() -> str:
    """The CPU's model name and core count, e.g. "AMD EPYC x2"."""
    try:
        text = Path("/proc/cpuinfo").read_text()
        name = next(line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("model name"))
    except (OSError, StopIteration):
        name = platform.processor() or platform.machine()
    return f"{name} x{os.cpu_count() or 1}"


def instant_evaluator(check_s: float, submits: list[float], lock: threading.Lock) -> Any:
    """An evaluator class whose checks accept every candidate after `check_s`, noting when each was submitted."""
    from sandbox.records import CheckResult, Reason, Stage, StageResult, Verdict

    class Instant:
        def __init__(self, *args: Any) -> None:
            pass

        def check(self, path: Path, baselines: Any = None, incumbent_ms: Any = None, retime: bool = False) -> Any:
            with lock:
                submits.append(time.monotonic())
            time.sleep(check_s)
            stage = StageResult(Stage.ROBUSTNESS, True, Reason.OK)
            return CheckResult(task="t", candidate=str(path), device="cpu", verdict=Verdict.ACCEPTED,
                               stage=Stage.ROBUSTNESS, reason=Reason.OK, message="ok", stages=(stage,),
                               seconds=check_s, timed=False, timing=None, environment={})

        def close(self) -> None:
            pass
    return Instant


def measure(task: Path, *, slots: int, budget: int, check_s: float) -> dict[str, Any]:
    from agent.archive.store import Archive
    from agent.search.loop import EventKind, RunConfig, run_search

    submits: list[float] = []
    verdicts: list[float] = []
    lock = threading.Lock()

    def on_event(event: Any) -> None:
        if event.kind is EventKind.EVALUATED:
            verdicts.append(time.monotonic())

    config = RunConfig(task_path=task, device="cpu", budget=budget, checks_per_gpu=slots, polish=0)
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="crucible-loop-") as tmp, Archive(Path(tmp) / "a.db") as archive:
        run_search(config, archive, evaluator_factory=instant_evaluator(check_s, submits, lock), on_event=on_event)
    wall = time.monotonic() - t0
    # each verdict's wait: until the first check submitted after it (a verdict that frees no proposal has none)
    waits = [min(s for s in submits if s > v) - v for v in verdicts if any(s > v for s in submits)]
    return {"task": str(task.relative_to(ROOT)), "slots": slots, "proposals": len(submits) - 1,
            "first_submit_s": waits[0] if waits else None,
            "verdict_to_submit_s": statistics.fmean(waits) if waits else None, "wall_s": wall}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tasks", default="attention_fwd_bwd", help="task names in tasks/ (comma-separated)")
    ap.add_argument("--slots", type=int, default=4, help="checks at once (default 4)")
    ap.add_argument("--budget", type=int, default=12, help="proposals per task (default 12)")
    ap.add_argument("--check-s", type=float, default=0.25, help="seconds each fake check takes (default 0.25)")
    ap.add_argument("--csv", type=Path, default=CSV, help=f"append here (default {CSV.relative_to(ROOT)})")
    ap.add_argument("--no-csv", action="store_true", help="print only")
    args = ap.parse_args(argv)
    tasks, problem = task_files(args.tasks, ROOT)
    if problem:
        print(problem, file=sys.stderr)
        return 2
    if args.slots < 1 or args.budget < 1 or args.check_s < 0:
        print("--slots and --budget must be at least 1 and --check-s not negative", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.WARNING)
    common = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "commit": repo_commit(ROOT),
              "cpu": cpu_name(), "python": platform.python_version()}
    for task in tasks:
        row = measure(task, slots=args.slots, budget=args.budget, check_s=args.check_s)
        print(f"{row['task']}: {row['proposals']} proposals at {row['slots']} slots; the starting kernel's verdict "
              f"to the first check {row['first_submit_s']:.2f} s, a verdict to the next check "
              f"{row['verdict_to_submit_s']:.2f} s on average; {row['wall_s']:.1f} s in all", flush=True)
        if not args.no_csv:
            append_csv(args.csv, FIELDS, [{k: f"{v:.4g}" if isinstance(v, float) else v
                                           for k, v in {**common, **row}.items()}])
    return 0


if __name__ == "__main__":
    sys.exit(main())
