"""Which kernel serves a task file, and the harness's word on it at the model's shape.

The candidates for a task, best first: the archive's verified winners for the shipped task of that name (timed ones
by the lower end of their speedup's interval, then correctness-only ones), then the seed registered for it. Each is
checked by the harness against the task file written at the model's shape (no CPU rescaling); the first accepted is
used, and every verdict is kept for the report.
"""
from __future__ import annotations

import importlib
import importlib.util
import logging
from dataclasses import dataclass
from pathlib import Path

import torch

from patching.records import Verdict
from sandbox.harness import CheckOptions, Harness
from sandbox.task import Task, load_task
from seeds.registry import seed_for_task

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class KernelSource:
    path: Path
    origin: str          # "seed" or "archive #ID"
    module: str | None   # the importable name of a seed module; None for a file written from the archive


def sources_for(task_name: str, archive_path: Path | None, workdir: Path) -> list[KernelSource]:
    out: list[KernelSource] = []
    if archive_path is not None and archive_path.exists():
        from agent.archive.store import Archive

        with Archive(archive_path) as archive:
            winners = archive.candidates(task=task_name, verdict="accepted")
            winners.sort(key=lambda c: (not c.timed, -(c.timings.eager_ci_low or 0.0), -c.id))
            for cand in winners[:2]:
                cand = archive.with_source(cand)
                if not cand.source:
                    continue
                path = workdir / "kernels" / f"{Path(task_name).stem}_archive_{cand.id}.py"
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(cand.source, encoding="utf-8")
                out.append(KernelSource(path, f"archive #{cand.id}", None))
    seed = seed_for_task(task_name)
    if seed is not None:
        out.append(KernelSource(seed.path, "seed", f"seeds.{seed.path.stem}"))
    return out


class Verifier:
    """Checks kernels against task files with one warm harness; a (task file, kernel) pair is checked once."""

    def __init__(self, device: str, archive_path: Path | None, workdir: Path):
        self.device, self.archive_path, self.workdir = device, archive_path, workdir
        self._harness: Harness | None = None
        self._seen: dict[tuple[str, str, str], Verdict] = {}

    def close(self) -> None:
        if self._harness is not None:
            self._harness.close()
            self._harness = None

    def first_accepted(self, task_path: str, shipped: str) -> tuple[KernelSource | None, list[Verdict]]:
        """The first candidate kernel the harness accepts for this task file, and every verdict on the way."""
        verdicts: list[Verdict] = []
        task = load_task(task_path, rescale=False)
        sources = sources_for(shipped, self.archive_path, self.workdir)
        for src in sources:
            verdict = self._check(task, task_path, src)
            verdicts.append(verdict)
            if verdict.accepted:
                return src, verdicts
        return None, verdicts

    def _check(self, task: Task, task_path: str, src: KernelSource) -> Verdict:
        key = (Path(task_path).read_text(encoding="utf-8"), str(src.path), src.path.read_text(encoding="utf-8"))
        if key not in self._seen:
            if self._harness is None:
                self._harness = Harness(self.device)
            result = self._harness.check(task, src.path, CheckOptions(device=self.device, timing=False))
            log.info("%s on %s: %s", src.path.name, Path(task_path).name, result.message)
            self._seen[key] = Verdict(str(task_path), str(src.path), src.origin, result.accepted, result.message)
        return self._seen[key]


def instantiate(src: KernelSource, task_path: str, device: torch.device) -> torch.nn.Module:
    """The kernel's ModelNew, built from the task's init inputs, on the model's device (trusted: the harness
    accepted it and it is a seed or an archived winner)."""
    if src.module is not None:
        module = importlib.import_module(src.module)
    else:
        spec = importlib.util.spec_from_file_location(f"crucible_kernel_{src.path.stem}", src.path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    task = load_task(task_path, rescale=False)
    model = module.ModelNew(*task.init_inputs()).to(device)
    # Only a seed's extra entry points (e.g. swiglu_bwd's `in_place`) are used beside the contract the harness checked.
    object.__setattr__(model, "crucible_seed", src.module is not None)
    return model
