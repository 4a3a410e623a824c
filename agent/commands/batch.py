"""`crucible batch DIR`: run the search on every task file in a folder (KernelBench's level folders too).

On one GPU the tasks run one after another. With --gpus N on CUDA, N tasks run at once, one per GPU: each GPU is a
lane that takes the next task not yet started (so the GPUs stay busy when tasks take unequal times) and runs it with
one evaluation worker on its GPU. A task that cannot start (a broken file) is reported and skipped. The summary
lists the tasks in their folder's order, whatever order they finished in, with KernelBench's metrics (fast_0/1/2
against eager and torch.compile, geometric-mean speedup, tokens per correct kernel: agent/archive/batch_summary.py); it can
also be written as JSON (--json-out, or --json on stdout) and CSV (--csv).

Where each task starts: --from DIR gives each task the kernel in DIR named after it (KernelBench's
`level1/19_ReLU.py` matches `19_ReLU.py`, `19_ReLU_anything.py` or `level_1_problem_19_...py`), else the seed
registered for it. A task with neither, and no model to write one, gets its reference checked (and, on a GPU, its
eager and torch.compile baselines timed) instead of a search; --reference-only does that for every task.

With --executor ray the candidates are evaluated across a Ray cluster (--address; one worker per GPU of the cluster,
docs/ray.md) while the search, the LLM requests and the archive stay in this process; the tasks run one after
another there.

The archive keeps the batch: one record per batch and each task's summary row, written as the task ends, so
`crucible archive report` rebuilds the table and its metrics from the archive alone. --resume continues the folder's
latest batch: the tasks it finished with their budget spent (and the reference checks of tasks that still have
nothing to search from) are kept as they are; every other task continues its latest run, so a batch whose driver
was killed picks up where its archive stops.
"""
from __future__ import annotations

import argparse
import ast
import contextlib
import json
import re
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterator

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from agent.commands import parse_constants
from agent.commands.run import StopOnSignal, add_search_options, baselines_problem, config_from
from agent.archive import batch_summary as summary_mod
from agent.search.lanes import run_lanes
from sandbox import pyparse

console = Console()
err_console = Console(stderr=True)
CSV_FIELDS = summary_mod.CSV_FIELDS


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
                   help="continue the folder's latest batch: keep the tasks it finished, continue each other "
                        "task's latest run instead of starting a new one")
    p.add_argument("--from", dest="from_dir", type=Path, metavar="DIR",
                   help="start each task from the kernel (a file defining ModelNew) in DIR named after it")
    p.add_argument("--reference-only", action="store_true",
                   help="only check each task's reference (on a GPU, also time its eager and torch.compile "
                        "baselines): the folder's usable count")
    p.add_argument("--json-out", type=Path, metavar="FILE", help="write the summary and the metrics as JSON")
    p.add_argument("--csv", type=Path, metavar="FILE", help="write the summary and the metrics as CSV")
    p.add_argument("--json", action="store_true", help="print the summary as one JSON object on stdout")
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
    from agent.archive.store import Archive
    from agent.search.executors import ExecutorError
    from agent.llm.chat import ProviderError
    from agent.llm.pool import make_provider

    out = err_console if args.json else console  # with --json, stdout carries the one JSON object alone
    problem = _flags_problem(args)
    if problem:
        err_console.print(problem)
        return 2
    tasks = find_tasks(args.dir)
    if not tasks:
        err_console.print(f"no task files in {args.dir} (a task defines Model, get_inputs and get_init_inputs)")
        return 2
    try:
        lanes = _lane_count(args, len(tasks))
        constants = parse_constants(args.constants)
    except (ExecutorError, ValueError) as exc:
        err_console.print(str(exc))
        return 2
    starts: dict[Path, Path] = {}
    if args.from_dir is not None:
        if not args.from_dir.is_dir():
            err_console.print(f"--from {args.from_dir} is not a folder; pass the folder of kernels (files that "
                              "define ModelNew, named after the tasks)")
            return 2
        starts = match_kernels(tasks, args.from_dir)
        out.print(f"--from {args.from_dir}: kernels for {len(starts)} of {len(tasks)} tasks", highlight=False,
                  soft_wrap=True)
    try:
        provider = None if args.reference_only else make_provider(args.model)
    except ProviderError as exc:
        err_console.print(str(exc))
        return 2
    from seeds.registry import seed_for_task
    searchable = [t for t in tasks if t in starts or provider is not None or seed_for_task(t) is not None]
    try:  # opened whatever the mode, so a bad --archive is refused rather than silently ignored
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
    reference_mode = args.reference_only or not searchable
    batch = open_batch(archive, args, tasks, searchable=set(searchable), reference_only=reference_mode)
    if batch.kept:
        out.print(f"resuming batch {batch.id}: {len(batch.kept)} of {len(tasks)} tasks finished before are kept",
                  highlight=False, soft_wrap=True)
    if reference_mode:  # the references are checked here, whatever the executor
        if executor is not None:
            executor.close()
        return _check_references(args, tasks, batch, archive, constants, out)
    rows = _search_tasks(args, tasks, batch, archive, executor, lanes=lanes, constants=constants, starts=starts,
                         searchable=searchable, provider=provider, out=out)
    code = _finish(args, rows, batch.id, reference_only=False)
    if any(r["status"] == "interrupted" for r in rows):
        return 130
    return code


def _flags_problem(args: argparse.Namespace) -> str | None:
    """The sentence refusing a flag that cannot be used as given (before anything is opened), else None."""
    if args.gpus < 1:
        return "--gpus must be at least 1"
    if args.address is not None and args.executor != "ray":
        return "--address is the Ray cluster to join; use it with --executor ray"
    problem = baselines_problem(args)
    if problem:
        return problem
    if not args.dir.is_dir():
        return f"{args.dir} is not a folder; pass a folder of task files"
    return None


def _check_references(args: argparse.Namespace, tasks: list[Path], batch: BatchRecord, archive: Any,
                      constants: dict[str, int], out: Console) -> int:
    """Check each task's reference instead of searching (the batch's tasks kept from before stay as they are)."""
    if not args.reference_only:
        out.print("no model and no kernel to start from: checking each task's reference (and timing its "
                  "baselines on a GPU); to propose kernels, pass --model openai:NAME or anthropic:NAME, or "
                  "--from DIR with kernels named after the tasks", highlight=False, soft_wrap=True)
    with archive:
        todo = [t for t in tasks if t not in batch.kept]
        fresh = dict(zip(todo, reference_rows(todo, args, constants, err_console, on_row=batch.record)))
        archive.finish_batch(batch.id)
    rows = [batch.kept.get(t) or fresh[t] for t in tasks]
    return _finish(args, rows, batch.id, reference_only=True)


def _search_tasks(args: argparse.Namespace, tasks: list[Path], batch: BatchRecord, archive: Any, executor: Any, *,
                  lanes: int, constants: dict[str, int], starts: dict[Path, Path], searchable: list[Path],
                  provider: Any, out: Console) -> list[dict[str, Any]]:
    """Search every task not kept from before, `lanes` at a time, with a progress bar each; the rows in task order."""
    from agent.search.executors import LocalExecutor
    from agent.search.loop import LoopError, prepare, run_search

    if lanes > 1:
        out.print(f"{len(tasks)} tasks on {lanes} GPUs: one task per GPU at a time")
    elif args.gpus > 1 and args.executor == "local" and not _visible_gpus(args.device):
        out.print(f"no GPU to use here: --gpus {args.gpus} is ignored and the tasks run one after another on the "
                  "CPU")
    # Each lane evaluates on its own GPU; one lane keeps the loop's own executor (None) or the Ray one.
    executors = [LocalExecutor(gpu_ids=(k,)) for k in range(lanes)] if lanes > 1 else [executor]
    with archive, _closing(executor), StopOnSignal() as stop, Progress(
            TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[status]}"),
            TimeElapsedColumn(), console=out, disable=not out.is_terminal) as bars:
        ids = {t: bars.add_task(t.name, total=args.budget or 20, status="waiting") for t in tasks}

        def one_task(task: Path, lane: int) -> dict[str, Any]:
            if task in batch.kept:
                bars.update(ids[task], status="kept from batch " + batch.id)
                return batch.kept[task]
            return batch.record(task, search_task(task, lane))

        def search_task(task: Path, lane: int) -> dict[str, Any]:
            bar = ids[task]

            def on_event(event: Any) -> None:
                p = event.progress
                best = p.best
                status = ("not timed" if best is not None and not best.timed else
                          f"{best.timings.speedup_eager:.2f}x" if best and best.timings.speedup_eager else "")
                bars.update(bar, completed=p.proposals, total=max(p.budget, 1),
                            status=f"{p.accepted} verified {status}".strip())
            if task not in searchable:
                bars.update(bar, status="reference only")
                row = reference_rows([task], args, constants, None)[0]
                why = ("no kernel named after it in --from, no seed and no model" if args.from_dir else
                       "no seed and no model (--from DIR gives it a kernel)")
                row["note"] = f"{why}: reference checked only" + (f"; {row['note']}" if row["note"] else "")
                return row
            try:
                resume = "latest" if args.resume_all and _has_run(archive, task) else None
                config = replace(config_from(args, task), resume=resume, start_from=starts.get(task),
                                 **({"gpus": 1} if lanes > 1 else {}))
                config = prepare(config, archive)
                summary = run_search(config, archive, provider=provider, on_event=on_event, stop=stop,
                                     executor=executors[lane])
            except LoopError as exc:
                bars.update(bar, status="skipped")
                return _row(task, "skipped", note=str(exc))
            row = _row(task, "interrupted" if summary.stop_reason == "interrupted" else "done", summary)
            row["start_from"] = str(starts[task]) if task in starts else None
            bars.update(bar, status=row["status"] + (" · best #%s" % summary.best.id if summary.best else ""))
            return row

        def not_started(task: Path) -> dict[str, Any]:
            bars.update(ids[task], status="not started")
            return batch.kept.get(task) or _row(task, "interrupted", note="not started")

        def failed(task: Path, exc: Exception) -> dict[str, Any]:
            bars.update(ids[task], status="failed")
            what = (str(exc).splitlines() or [""])[0][:200]
            return batch.record(task, _row(task, "failed", note=f"crucible failed on this task ({type(exc).__name__}: "
                                                                f"{what}); this is a bug in crucible, rerun with -v "
                                                                "for the traceback"))

        rows = run_lanes(tasks, lanes, one_task, not_started=not_started, failed=failed, stop=stop)
        if not any(r["status"] == "interrupted" for r in rows):
            archive.finish_batch(batch.id)
    return rows


def _finish(args: argparse.Namespace, rows: list[dict[str, Any]], batch_id: str, *, reference_only: bool) -> int:
    """Print and write the summary; exit 0 when every task is usable (reference only) or has a verified kernel."""
    summary = summary_mod.metrics(rows)
    if args.json:
        print(json.dumps({"batch": batch_id, "tasks": rows, "metrics": summary}, default=str))
    else:
        summary_mod.render(console, rows, summary, reference_only=reference_only)
        console.print(f"archived as batch {batch_id}; its table again:", markup=False, highlight=False)
        console.print(f"  crucible archive report --kernelbench --batch {batch_id}"
                      + (f" --archive {args.archive}" if args.archive else ""),
                      markup=False, highlight=False, soft_wrap=True)
    if args.json_out:
        summary_mod.write_json(args.json_out, rows, summary, batch_id)
    if args.csv:
        summary_mod.write_csv(args.csv, rows, summary)
    if reference_only:
        return 0 if all(r["status"] == "usable" for r in rows) else 1
    return 0 if all(r["best_id"] is not None for r in rows) else 1


def match_kernels(tasks: list[Path], folder: Path) -> dict[Path, Path]:
    """Each task's kernel in `folder` (recursively): a file defining ModelNew whose name is the task's
    (`19_ReLU.py`), starts with it (`19_ReLU_v2.py`) or names KernelBench's problem number (`..._problem_19_...`);
    the first in name order where several match."""
    kernels = []
    for path in sorted(folder.rglob("*.py")):
        try:
            tree = pyparse.parse(path.read_text(encoding="utf-8", errors="replace"))
        except (SyntaxError, OSError):
            continue
        if any(isinstance(n, ast.ClassDef) and n.name == "ModelNew" for n in tree.body):
            kernels.append(path)
    found: dict[Path, Path] = {}
    for task in tasks:
        stem = task.stem
        number = re.match(r"(\d+)_", task.name)
        level = re.search(r"level_?(\d+)", str(task.parent.name))

        def score(path: Path) -> int:
            k = path.stem
            if k == stem:
                return 3
            if k.startswith(stem) and k[len(stem)] in "_-.":
                return 2
            if number and re.search(rf"(?:^|[_-])problem_?{number.group(1)}(?:\D|$)", k):
                wanted = level.group(1) if level else None
                other = re.search(r"level_?(\d+)", k)
                return 1 if wanted is None or other is None or other.group(1) == wanted else 0
            return 0
        ranked = sorted((p for p in kernels if score(p)), key=lambda p: (-score(p), str(p)))
        if ranked:
            found[task] = ranked[0]
    return found


def reference_rows(tasks: list[Path], args: argparse.Namespace, constants: dict[str, int],
                   progress: Console | None,
                   on_row: Callable[[Path, dict[str, Any]], Any] | None = None) -> list[dict[str, Any]]:
    """Each task's reference checked (on the CPU at the rescaled size) and, on a GPU, its baselines timed; `on_row`
    is called with each task's row as soon as it is made."""
    import torch

    from sandbox.reference import check_task
    from sandbox.task import TaskError, load_task
    device = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    rows = []
    harness = None
    try:
        for path in tasks:
            row = summary_mod.empty_row(path, "usable")
            try:
                task = load_task(path, {k: v for k, v in constants.items()} or None, rescale=not args.no_rescale)
                sized = task.scaled_for_cpu() if device == "cpu" else task
                check_task(sized, device)
                row["note"] = sized.rescale_note or ""
            except TaskError as exc:
                row.update(status="refused", note=str(exc))
            except Exception as exc:  # noqa: BLE001 - the task's own code: its failure is reported, not raised
                row.update(status="refused", note=f"{path.name}: {type(exc).__name__}: {exc}")
            if row["status"] == "usable" and device == "cuda":
                from sandbox.harness import Harness
                harness = harness or Harness(device="cuda")
                timing = harness.bench(sized, None, baselines=("eager", "compile"), gpu=0)
                for r in timing.get("rows", []):
                    if r.get("impl") in ("eager", "compile"):
                        row[f"{r['impl']}_ms"] = r.get("ms")
                row["timed"] = row["eager_ms"] is not None
            rows.append(row)
            if on_row is not None:
                on_row(path, row)
            if progress is not None:  # a long folder: each task as it is checked, on stderr
                progress.print(f"[{len(rows)}/{len(tasks)}] {path.name}: {row['status']}", markup=False,
                               highlight=False, soft_wrap=True)
    finally:
        if harness is not None:
            harness.close()
    return rows


@dataclass
class BatchRecord:
    """The archive's record of this batch: `record(task, row)` writes a task's row as it ends; `kept` holds the rows
    a resumed batch keeps from before, by task."""

    archive: Any
    id: str
    position: dict[Path, int]
    kept: dict[Path, dict[str, Any]] = field(default_factory=dict)

    def record(self, task: Path, row: dict[str, Any]) -> dict[str, Any]:
        self.archive.set_batch_row(self.id, self.position[task], row)
        return row


def open_batch(archive: Any, args: argparse.Namespace, tasks: list[Path], *, searchable: set[Path],
               reference_only: bool) -> BatchRecord:
    """A new batch in the archive, or with --resume the folder's latest one, keeping the rows that are final: a search
    that ended with its budget spent (unless --budget now asks for more) and, for a task that still has nothing to
    search from, its reference check. Every task of the folder gets a row at once ("not started" until it ends), so
    a batch killed midway still counts all its tasks."""
    from agent.archive.records import Batch, now

    folder = str(args.dir.resolve())
    position = {t: i for i, t in enumerate(tasks)}
    earlier = archive.batches(folder=folder) if args.resume_all else []
    if earlier:
        record = BatchRecord(archive, earlier[-1].id, position)
        by_name = {Path(r["task"]).name: r for r in archive.batch_rows(record.id)}
        for task in tasks:
            row = by_name.get(task.name)
            if row is not None and _final(row, args, reference_only or task not in searchable):
                record.kept[task] = row
    else:
        stamp = now().replace(":", "").replace("-", "")[:15]
        record = BatchRecord(archive, f"batch-{stamp}-{uuid.uuid4().hex[:6]}", position)
        archive.add_batch(Batch(id=record.id, folder=folder, device=_device_name(args.device), started=now(),
                                config={"model": args.model, "budget": args.budget,
                                        "from": str(args.from_dir) if args.from_dir else None,
                                        "reference_only": bool(args.reference_only)}))
    for task in tasks:
        if task not in record.kept:
            record.record(task, summary_mod.empty_row(task, "not started"))
    return record


def _final(row: dict[str, Any], args: argparse.Namespace, reference: bool) -> bool:
    if reference:
        return row["status"] in ("usable", "refused")
    if row["status"] != "done" or row.get("note") != "budget spent":
        return False
    return args.budget is None or (row.get("proposals") or 0) >= args.budget


def _device_name(device: str) -> str:
    import torch
    return device if device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")


def _executor(args: argparse.Namespace) -> Any:
    """None: the loop's own local executor (harnesses on this machine)."""
    if args.executor == "local":
        return None
    from agent.search.ray_executor import RayExecutor
    executor = RayExecutor(args.address)
    where = f"{executor.gpus} GPU(s)" if executor.gpus else f"no GPU, {executor.cpus} CPU(s)"
    console.print(f"Ray cluster: {where}; one evaluation worker per {'GPU' if executor.gpus else 'CPU'}"
                  + ("; --gpus is not used" if args.gpus != 1 else ""))
    return executor


def _lane_count(args: argparse.Namespace, tasks: int) -> int:
    """Tasks to run at once: one per GPU with the local executor on CUDA and --gpus > 1, else 1 (one after another,
    the single task of a one-task folder keeping --gpus evaluation workers). ExecutorError when --gpus asks for more
    GPUs than are visible."""
    from agent.search.executors import ExecutorError
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
    row = summary_mod.empty_row(task, status, note)
    if summary is None:
        return row
    p, best = summary.progress, summary.best
    row.update(run_id=summary.run_id, proposals=p.proposals, accepted=p.accepted, rejected=p.rejected,
               timed=summary.timed, note=summary.stop_reason, tokens=p.input_tokens + p.output_tokens,
               cost_usd=p.cost_usd)
    if best is not None:
        # The final re-check's numbers where there is one: it is timed against torch.compile, the others are not.
        final = summary.final if summary.final is not None and summary.final.candidate_id == best.id else None
        t = final.timings if final is not None and final.timed else best.timings
        row.update(final_check=final.status if final is not None else None, correct=True)
        row.update(best_id=best.id, speedup_eager=t.speedup_eager, eager_ci_low=t.eager_ci_low,
                   eager_ci_high=t.eager_ci_high, speedup_compile=t.speedup_compile,
                   compile_ci_low=t.compile_ci_low, compile_ci_high=t.compile_ci_high, pct_roofline=t.pct_roofline,
                   best_path=str(summary.best_path))
    return row
