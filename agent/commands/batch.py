"""`crucible batch DIR`: run the search on every task file in a folder (KernelBench's level folders too).

On one GPU the tasks run one after another. With --gpus N on CUDA, N tasks run at once, one per GPU: each GPU is a
lane that takes the next task not yet started (so the GPUs stay busy when tasks take unequal times) and runs it with
one evaluation worker on its GPU. A task that cannot start (no seed and no model, a broken file) is reported and
skipped. The summary lists the tasks in their folder's order, whatever order they finished in; it can also be
written as JSON (--json-out) and CSV (--csv).

With --executor ray the candidates are evaluated across a Ray cluster (--address; one worker per GPU of the cluster,
docs/ray.md) while the search, the LLM requests and the archive stay in this process; the tasks run one after
another there. --resume continues each task's latest run, so a batch whose driver was killed picks up where its
archive stops.
"""
from __future__ import annotations

import argparse
import ast
import contextlib
import csv
import json
import re
from dataclasses import replace
from pathlib import Path
from typing import Any, Iterator

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from agent.commands.run import StopOnSignal, add_search_options, baselines_problem, config_from
from agent.lanes import run_lanes
from sandbox import pyparse

console = Console()
err_console = Console(stderr=True)
CSV_FIELDS = ["task", "status", "run_id", "proposals", "accepted", "rejected", "timed", "best_id", "speedup_eager",
              "eager_ci_low", "eager_ci_high", "speedup_compile", "pct_roofline", "final_check", "best_path", "note"]


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("batch", help="run the search over a folder of tasks", description=__doc__)
    p.add_argument("dir", type=Path, help="folder of task files")
    add_search_options(p, gpus_help="GPUs of this machine to use (default 1): with N > 1 on CUDA, N tasks run at once, "
                                    "one per GPU, each with one evaluation worker; not used with --executor ray")
    p.add_argument("--executor", choices=["local", "ray"], default="local",
                   help="local: harnesses on this machine (--gpus); ray: one evaluation worker per GPU of a Ray "
                        "cluster (pip install 'kernel-crucible[ray]')")
    p.add_argument("--address", metavar="ADDR",
                   help="the Ray cluster to join (HOST:6379, or auto); default: $RAY_ADDRESS, else the cluster "
                        "`ray start` made on this machine, else a new local one")
    p.add_argument("--resume", dest="resume_all", action="store_true",
                   help="continue each task's latest run in the archive instead of starting new ones")
    p.add_argument("--json-out", type=Path, metavar="FILE", help="write the summary as JSON")
    p.add_argument("--csv", type=Path, metavar="FILE", help="write the summary as CSV")
    p.set_defaults(func=run)


def find_tasks(folder: Path) -> list[Path]:
    """Files that define Model, get_inputs and get_init_inputs, in natural order (2_... before 10_...)."""
    found = []
    for path in folder.glob("*.py"):
        if path.name.startswith("_"):
            continue
        try:
            tree = pyparse.parse(path.read_text(encoding="utf-8", errors="replace"))
        except SyntaxError:
            continue
        names = {n.name for n in tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef))}
        if {"Model", "get_inputs", "get_init_inputs"} <= names:
            found.append(path)
    return sorted(found, key=lambda p: [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", p.name)])


def run(args: argparse.Namespace) -> int:
    from agent.archive import Archive
    from agent.executors import ExecutorError, LocalExecutor
    from agent.llm import ProviderError, make_provider
    from agent.loop import LoopError, prepare, run_search

    if args.gpus < 1:
        err_console.print("--gpus must be at least 1")
        return 2
    if args.address is not None and args.executor != "ray":
        err_console.print("--address is the Ray cluster to join; use it with --executor ray")
        return 2
    problem = baselines_problem(args)
    if problem:
        err_console.print(problem)
        return 2
    if not args.dir.is_dir():
        err_console.print(f"{args.dir} is not a folder; pass a folder of task files")
        return 2
    tasks = find_tasks(args.dir)
    if not tasks:
        err_console.print(f"no task files in {args.dir} (a task defines Model, get_inputs and get_init_inputs)")
        return 2
    try:
        lanes = _lane_count(args, len(tasks))
    except ExecutorError as exc:
        err_console.print(str(exc))
        return 2
    try:
        provider = make_provider(args.model)
    except ProviderError as exc:
        err_console.print(str(exc))
        return 2
    try:
        archive = Archive(args.archive)
    except Exception as exc:  # noqa: BLE001 - a file the user pointed at: one sentence, no traceback
        err_console.print(f"cannot open the archive {args.archive}: {exc}")
        return 2
    try:
        executor = _executor(args)
    except ExecutorError as exc:
        archive.close()
        err_console.print(str(exc), markup=False, soft_wrap=True)  # "kernel-crucible[ray]" is not markup
        return 2
    if lanes > 1:
        console.print(f"{len(tasks)} tasks on {lanes} GPUs: one task per GPU at a time")
    elif args.gpus > 1 and args.executor == "local" and not _visible_gpus(args.device):
        console.print(f"no GPU to use here: --gpus {args.gpus} is ignored and the tasks run one after another on the "
                      "CPU")
    # Each lane evaluates on its own GPU; one lane keeps the loop's own executor (None) or the Ray one.
    executors = [LocalExecutor(gpu_ids=(k,)) for k in range(lanes)] if lanes > 1 else [executor]
    with archive, _closing(executor), StopOnSignal() as stop, Progress(
            TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[status]}"),
            TimeElapsedColumn(), console=console) as bars:
        ids = {t: bars.add_task(t.name, total=args.budget or 20, status="waiting") for t in tasks}

        def one_task(task: Path, lane: int) -> dict[str, Any]:
            bar = ids[task]

            def on_event(event: Any) -> None:
                p = event.progress
                best = p.best
                status = ("not timed" if best is not None and not best.timed else
                          f"{best.timings.speedup_eager:.2f}x" if best and best.timings.speedup_eager else "")
                bars.update(bar, completed=p.proposals, total=max(p.budget, 1),
                            status=f"{p.accepted} verified {status}".strip())
            try:
                resume = "latest" if args.resume_all and _has_run(archive, task) else None
                config = replace(config_from(args, task), resume=resume, **({"gpus": 1} if lanes > 1 else {}))
                config = prepare(config, archive)
                summary = run_search(config, archive, provider=provider, on_event=on_event, stop=stop,
                                     executor=executors[lane])
            except LoopError as exc:
                bars.update(bar, status="[yellow]skipped[/yellow]")
                return _row(task, "skipped", note=str(exc))
            row = _row(task, "interrupted" if summary.stop_reason == "interrupted" else "done", summary)
            bars.update(bar, status=row["status"] + (" · best #%s" % summary.best.id if summary.best else ""))
            return row

        def not_started(task: Path) -> dict[str, Any]:
            bars.update(ids[task], status="not started")
            return _row(task, "interrupted", note="not started")

        def failed(task: Path, exc: Exception) -> dict[str, Any]:
            bars.update(ids[task], status="[red]failed[/red]")
            what = (str(exc).splitlines() or [""])[0][:200]
            return _row(task, "failed", note=f"crucible failed on this task ({type(exc).__name__}: {what}); this is "
                                             "a bug in crucible, rerun with -v for the traceback")

        rows = run_lanes(tasks, lanes, one_task, not_started=not_started, failed=failed, stop=stop)
    _table(rows)
    if args.json_out:
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        args.json_out.write_text(json.dumps(rows, indent=2) + "\n", encoding="utf-8")
    if args.csv:
        args.csv.parent.mkdir(parents=True, exist_ok=True)
        with args.csv.open("w", newline="", encoding="utf-8") as fh:
            writer = csv.DictWriter(fh, fieldnames=CSV_FIELDS)
            writer.writeheader()
            writer.writerows(rows)
    if any(r["status"] == "interrupted" for r in rows):
        return 130
    return 0 if all(r["best_id"] is not None for r in rows) else 1


def _executor(args: argparse.Namespace) -> Any:
    """None: the loop's own local executor (harnesses on this machine)."""
    if args.executor == "local":
        return None
    from agent.executors import RayExecutor
    executor = RayExecutor(args.address)
    where = f"{executor.gpus} GPU(s)" if executor.gpus else f"no GPU, {executor.cpus} CPU(s)"
    console.print(f"Ray cluster: {where}; one evaluation worker per {'GPU' if executor.gpus else 'CPU'}"
                  + ("; --gpus is not used" if args.gpus != 1 else ""))
    return executor


def _lane_count(args: argparse.Namespace, tasks: int) -> int:
    """Tasks to run at once: one per GPU with the local executor on CUDA and --gpus > 1, else 1 (one after another,
    the single task of a one-task folder keeping --gpus evaluation workers). ExecutorError when --gpus asks for more
    GPUs than are visible."""
    from agent.executors import ExecutorError
    if args.executor != "local" or args.gpus == 1 or tasks == 1:
        return 1
    visible = _visible_gpus(args.device)
    if not visible:
        return 1  # the CPU, or --device cuda without a GPU: each task's run says so
    if args.gpus > visible:
        raise ExecutorError(f"--gpus {args.gpus} asks for more GPUs than the {visible} visible")
    return min(args.gpus, tasks)


def _visible_gpus(device: str) -> int:
    """GPUs the tasks would run on: 0 when --device resolves to the CPU or no GPU is visible."""
    import torch
    if device == "cpu" or not torch.cuda.is_available():
        return 0
    return torch.cuda.device_count()


@contextlib.contextmanager
def _closing(executor: Any) -> Iterator[None]:
    try:
        yield
    finally:
        if executor is not None:
            executor.close()


def _has_run(archive: Any, task: Path) -> bool:
    from sandbox.task import TaskError, load_task
    try:
        return archive.latest_run(load_task(task).source_hash) is not None
    except TaskError:
        return False  # the run reports the broken file


def _row(task: Path, status: str, summary: Any = None, note: str = "") -> dict[str, Any]:
    row: dict[str, Any] = {k: None for k in CSV_FIELDS}
    row.update(task=str(task), status=status, note=note)
    if summary is None:
        return row
    p, best = summary.progress, summary.best
    row.update(run_id=summary.run_id, proposals=p.proposals, accepted=p.accepted, rejected=p.rejected,
               timed=summary.timed, note=summary.stop_reason)
    if best is not None:
        # The final re-check's numbers where there is one: it is timed against torch.compile, the others are not.
        final = summary.final if summary.final is not None and summary.final.candidate_id == best.id else None
        t = final.timings if final is not None and final.timed else best.timings
        row.update(final_check=final.status if final is not None else None)
        row.update(best_id=best.id, speedup_eager=t.speedup_eager, eager_ci_low=t.eager_ci_low,
                   eager_ci_high=t.eager_ci_high, speedup_compile=t.speedup_compile, pct_roofline=t.pct_roofline,
                   best_path=str(summary.best_path))
    return row


def _table(rows: list[dict[str, Any]]) -> None:
    table = Table("task", "status", "proposals", "verified", "best", "vs eager", "vs compile", "roofline", "note")
    for r in rows:
        if r["best_id"] is None:
            eager = comp = roof = ""
        elif not r["timed"]:
            eager, comp, roof = "not timed", "not timed", "not timed"
        else:
            eager = _ci(r["speedup_eager"], r["eager_ci_low"], r["eager_ci_high"])
            comp = "not measured" if r["speedup_compile"] is None else f"{r['speedup_compile']:.2f}x"
            roof = "not measured" if r["pct_roofline"] is None else f"{r['pct_roofline']:.0f}%"
        table.add_row(Path(r["task"]).name, r["status"], str(r["proposals"] or 0), str(r["accepted"] or 0),
                      (f"#{r['best_id']}" + (f" ({r['final_check']})" if r.get("final_check") else ""))
                      if r["best_id"] else "none", eager, comp, roof, r["note"] or "")
    console.print(table)


def _ci(v: float | None, low: float | None, high: float | None) -> str:
    if v is None:
        return "not measured"
    return f"{v:.2f}x" + (f" [{low:.2f}, {high:.2f}]" if low is not None and high is not None else "")
