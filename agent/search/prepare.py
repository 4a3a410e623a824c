"""Before a run starts: check the task, complete a resumed run's settings, pick the starting kernel, name the run.

Every way a run cannot start that the user can fix (a bad task file, an unknown run id, a task file changed since the
run, a missing --from file, a negative budget) ends in a LoopError whose message says what to do.
"""
from __future__ import annotations

import datetime as _dt
import secrets
from dataclasses import replace
from pathlib import Path

from agent.archive.store import Archive
from agent.search.runs import LoopError, RunConfig
from sandbox.task import Task, TaskError, load_task
from seeds.registry import seed_for_task


def prepare(config: RunConfig, archive: Archive) -> RunConfig:
    """Check the task and, on resume, fill the settings left unset from the stored run (LoopError if impossible)."""
    task = open_task(config.task_path)
    if config.resume:
        run = (archive.latest_run(task.source_hash) if config.resume == "latest" else archive.get_run(config.resume))
        if run is None:
            what = f"run {config.resume}" if config.resume != "latest" else f"no earlier run of {task.path.name}"
            raise LoopError(f"{what} is not in {archive.path}; start a new run without --resume")
        if run.task_hash != task.source_hash:
            raise LoopError(f"run {run.id} was on another version of {Path(run.task_path).name} (the file changed); "
                            "start a new run without --resume")
        stored = run.config
        fill = {}
        for name in ("model", "budget", "polish", "max_tokens", "max_cost", "target_roofline"):
            if getattr(config, name) is None and stored.get(name) is not None:
                fill[name] = stored[name]
        if config.start_from is None and stored.get("start_from"):
            fill["start_from"] = Path(stored["start_from"])
        if config.device == "auto" and stored.get("device"):
            fill["device"] = stored["device"]
        config = replace(config, resume=run.id, **fill)
    if config.budget is not None and config.budget < 0:
        raise LoopError("--budget must be 0 or more proposals")
    if config.gpus < 1:
        raise LoopError("--gpus must be at least 1")
    resolve_start(config, task.path)
    return config


def open_task(path: Path) -> Task:
    try:
        return load_task(path)
    except TaskError as exc:
        raise LoopError(str(exc)) from None


def resolve_start(config: RunConfig, task_path: Path) -> tuple[Path | None, str]:
    """The kernel to start from and where it came from: --from, else the task's seed, else none."""
    if config.start_from is not None:
        path = Path(config.start_from)
        if not path.is_file():
            raise LoopError(f"--from {path}: no such file; pass the path of a kernel .py file that defines ModelNew")
        return path, f"--from {path}"
    seed = seed_for_task(task_path)
    if seed is not None:
        return seed.path, f"seed {seed.name} ({seed.path.name})"
    return None, ""


def new_run_id(task: Task) -> str:
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    return f"{stamp}-{task.name}-{secrets.token_hex(2)}"
