"""Patch a model: find its regions, write their task files, have the harness check the best kernel for each at the
model's shapes, and replace the regions whose kernels were accepted. Every region comes back with its outcome.

    report = patching.patch(model, inputs)      # the one-line API; `crucible model patch MODEL.py` on the CLI
"""
from __future__ import annotations

import logging
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn as nn

from patching.extract import extract
from patching.find import find_regions, unmatched_ops
from patching.functions import Installed, install, uninstall
from patching.hf import left_to_pytorch
from patching.kernels import Verifier, instantiate
from patching.records import Kind, Outcome, PatchReport, Region, RegionResult

log = logging.getLogger(__name__)


def survey(model: nn.Module, inputs: list[Any], out_dir: str | Path, name: str,
           forward: Callable[..., Any] | None = None) -> tuple[list[Region], list, PatchReport]:
    """Find the regions and write their task files; nothing is patched. The report lists the regions (outcome
    `no kernel` until checked) and the ops left to PyTorch."""
    regions, misfits = find_regions(model, inputs, forward)
    files = extract(regions, Path(out_dir), name)
    report = PatchReport(name)
    report.unmatched = {**unmatched_ops(model, {"cache": None}), **left_to_pytorch(model),
                        **{f"{m} (unmatched: {why})": 1 for m, why in misfits.items()}}
    return regions, files, report


def patch(model: nn.Module, inputs: list[Any], *, name: str = "model", workdir: str | Path | None = None,
          skip: tuple[str, ...] = (), archive: str | Path | None = None,
          forward: Callable[..., Any] | None = None) -> PatchReport:
    """Replace each region of `model` whose kernels the harness accepts at the shapes `inputs` produce; the report
    says what happened to every region. `skip`: kinds to leave as they are (e.g. ("attention",)). `archive`: the
    archive whose winners are tried before the seeds (None: only the seeds)."""
    unknown = set(skip) - {k.value for k in Kind}
    if unknown:
        raise ValueError(f"unknown region kind(s) {', '.join(sorted(unknown))}; "
                         f"choose from {', '.join(k.value for k in Kind)}")
    workdir = Path(workdir) if workdir is not None else Path(tempfile.mkdtemp(prefix="crucible-model-"))
    regions, files, report = survey(model, inputs, workdir / "tasks", name, forward)
    device = next(model.parameters()).device
    verifier = Verifier("cuda" if device.type == "cuda" else "cpu", Path(archive) if archive else None, workdir)
    named = dict(model.named_modules())
    try:
        for region, tasks in zip(regions, files):
            report.results.append(_patch_region(region, tasks, verifier, named, device, skip))
    finally:
        verifier.close()
    _note_inside_patched_moe(report.results)
    return report


def _note_inside_patched_moe(results: list[RegionResult]) -> None:
    """A patched region whose modules all sit inside patched MoE blocks (Mixtral's experts' SwiGLU) runs only where a
    block falls back to its own forward: the block's kernel computes the experts. Its reason says so."""
    blocks = [m for r in results if r.region.kind is Kind.MOE and r.outcome is Outcome.PATCHED
              for m in r.region.modules]
    for i, r in enumerate(results):
        if (blocks and r.outcome is Outcome.PATCHED and r.region.kind is not Kind.MOE
                and all(any(name.startswith(b + ".") for b in blocks) for name in r.region.modules)):
            results[i] = replace(r, reason=f"{r.reason}; inside the patched MoE blocks, whose kernel computes the "
                                           "experts: called only where a block falls back to its own forward")


def _patch_region(region: Region, tasks, verifier: Verifier, named: dict[str, nn.Module], device: torch.device,
                  skip: tuple[str, ...]) -> RegionResult:
    if region.kind.value in skip:
        return RegionResult(region, Outcome.EXCLUDED, "left out with --skip", tasks)
    if region.dtype != "bfloat16":
        return RegionResult(region, Outcome.NO_KERNEL, f"crucible's tasks are bf16 and this region runs in "
                                                       f"{region.dtype}", tasks)
    kernels: dict[str, nn.Module] = {}
    verdicts = []
    for task in tasks:
        src, seen = verifier.first_accepted(task.path, task.source_task)
        verdicts += seen
        if src is None:
            why = "; ".join(f"{Path(v.kernel).name} ({v.origin}): {v.message}" for v in seen) or "none registered"
            outcome = Outcome.REJECTED if seen else Outcome.NO_KERNEL
            return RegionResult(region, outcome, f"{Path(task.path).name}: {why}", tasks, tuple(verdicts))
        kernels[task.role] = instantiate(src, task.path, device)
    for name in region.modules:
        install(named[name], Installed(region.kind, region.key, {role: k for role, k in kernels.items()}))
    used = ", ".join(f"{t.role}: {Path(v.kernel).name} ({v.origin})" for t, v in
                     zip(tasks, [v for v in verdicts if v.accepted]))
    return RegionResult(region, Outcome.PATCHED, f"accepted at the model's shape; {used}", tasks, tuple(verdicts))


def unpatch(model: nn.Module) -> None:
    """Give every patched module its own forward back."""
    for module in model.modules():
        uninstall(module)


def call_counts(model: nn.Module) -> dict[str, tuple[int, int]]:
    """{module: (calls served by kernels, calls that fell back to the module's own forward)}."""
    return {name: (m.crucible_patch.calls, m.crucible_patch.fallbacks) for name, m in model.named_modules()
            if "crucible_patch" in m.__dict__}
