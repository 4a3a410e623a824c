"""`crucible model ops|extract|patch MODEL.py`: find a model's fusable ops, write their task files, patch verified
kernels in and compare the patched model's training loss with the eager model's (docs/model.md)."""
from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from rich.console import Console
from rich.table import Table

console = Console()
err_console = Console(stderr=True)
KINDS = ("rmsnorm", "swiglu", "rope", "attention", "linear_cross_entropy", "moe")


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("model", help="find a model's ops, patch verified kernels in", description=__doc__)
    verbs = p.add_subparsers(dest="verb", metavar="VERB")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("model_file", metavar="MODEL.py", help="a model file, e.g. models/llama.py")
    common.add_argument("--preset", default=None, help="one of the file's PRESETS (default: its first)")
    common.add_argument("--device", choices=("cpu", "cuda"), default=None,
                        help="default: cuda where a GPU is visible; cpu runs kernels through Triton's interpreter")
    common.add_argument("--out", default=None, metavar="DIR",
                        help="where task files go (default runs/model/<file>-<preset>)")
    common.add_argument("--json", action="store_true", help="print exactly one JSON object")
    verbs.add_parser("ops", parents=[common], help="list the regions crucible matches and the ops left to PyTorch")
    verbs.add_parser("extract", parents=[common], help="write a task file for each region at the model's shapes")
    pp = verbs.add_parser("patch", parents=[common],
                          help="check kernels at the model's shapes, patch them in, compare training losses")
    pp.add_argument("--skip", default="", help=f"region kinds to leave as they are, comma-separated ({', '.join(KINDS)})")
    pp.add_argument("--archive", default=None, help="try this archive's winners before the seeds "
                                                    "(default: runs/archive.db or CRUCIBLE_ARCHIVE, where it exists)")
    pp.add_argument("--steps", type=int, default=3, help="training steps to compare against eager (default 3)")
    p.set_defaults(func=run, parser=p)


def run(args: argparse.Namespace) -> int:
    if args.verb is None:
        args.parser.print_help()
        return 2
    skip = tuple(s.strip() for s in getattr(args, "skip", "").split(",") if s.strip())
    bad = [s for s in skip if s not in KINDS]
    if bad:
        return _bad(args, f"--skip {','.join(bad)}: choose from {', '.join(KINDS)}")
    if getattr(args, "steps", 1) < 1:
        return _bad(args, "--steps must be at least 1")
    if args.device == "cpu" or args.device is None and not _has_gpu():
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before Triton is imported: kernels run in this process
    import torch

    from patching.modelfile import ModelFileError, load_model_file

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        return _bad(args, "--device cuda needs a CUDA GPU and none is visible; use --device cpu")
    try:
        spec = load_model_file(args.model_file, args.preset)
    except ModelFileError as exc:
        return _bad(args, str(exc))
    out = Path(args.out or Path("runs") / "model" / spec.name)
    model = spec.build(device)
    inputs = spec.inputs(device)
    if args.verb in ("ops", "extract"):
        return _survey(args, spec, model, inputs, out)
    return _patch(args, spec, model, inputs, out, skip, device)


def _survey(args, spec, model, inputs, out: Path) -> int:
    import tempfile

    from patching import survey

    where = out / "tasks" if args.verb == "extract" else Path(tempfile.mkdtemp(prefix="crucible-ops-"))
    regions, files, report = survey(model, inputs, where, spec.name)
    rows = [{"kind": r.kind.value, "shape": r.constants, "dtype": r.dtype, "modules": len(r.modules),
             "tasks": [f.path for f in fs]} for r, fs in zip(regions, files)]
    if args.json:
        console.print_json(json.dumps({"model": spec.name, "regions": rows, "unmatched": report.unmatched}))
        return 0
    table = Table("region", "shape", "dtype", "modules", *(["task files"] if args.verb == "extract" else []))
    for r in rows:
        extra = ["\n".join(r["tasks"])] if args.verb == "extract" else []
        table.add_row(r["kind"], ", ".join(f"{k}={v}" for k, v in r["shape"].items()), r["dtype"], str(r["modules"]),
                      *extra)
    console.print(table)
    console.print("left to PyTorch: " + ", ".join(f"{k} x{v}" for k, v in report.unmatched.items()))
    return 0


def _patch(args, spec, model, inputs, out: Path, skip: tuple[str, ...], device: str) -> int:
    import copy

    from agent.archive.store import default_path
    from patching import call_counts, patch
    from patching.steps import loss_gap, train_losses

    eager = copy.deepcopy(model)
    archive = Path(args.archive) if args.archive else default_path()
    if args.archive and not archive.exists():
        return _bad(args, f"archive {archive} does not exist")
    report = patch(model, inputs, name=spec.name, workdir=out, skip=skip, archive=archive)
    batch = lambda step: spec.inputs(device, seed=step)  # noqa: E731
    eager_losses = train_losses(eager, batch, args.steps)
    patched_losses = train_losses(model, batch, args.steps)
    gap = loss_gap(eager_losses, patched_losses)
    counts = call_counts(model)
    fallbacks = sum(f for _, f in counts.values())
    if args.json:
        console.print_json(json.dumps({**report.to_dict(), "eager_losses": eager_losses,
                                       "patched_losses": patched_losses, "max_relative_gap": gap,
                                       "fallback_calls": fallbacks}))
        return 0
    table = Table("region", "shape", "modules", "outcome", "why")
    for r in report.results:
        table.add_row(r.region.kind.value, ", ".join(f"{k}={v}" for k, v in r.region.constants.items()),
                      str(len(r.region.modules)), r.outcome.value, r.reason)
    console.print(table)
    console.print("left to PyTorch: " + ", ".join(f"{k} x{v}" for k, v in report.unmatched.items()))
    console.print(f"{args.steps} training steps: eager {_fmt(eager_losses)}, patched {_fmt(patched_losses)}; "
                  f"largest relative gap {gap:.2e}; {fallbacks} call(s) fell back to PyTorch at unverified shapes")
    return 0


def _fmt(xs: list[float]) -> str:
    return "[" + ", ".join(f"{x:.4f}" for x in xs) + "]"


def _has_gpu() -> bool:
    import torch

    return torch.cuda.is_available()


def _bad(args: argparse.Namespace, message: str) -> int:
    if getattr(args, "json", False):
        console.print_json(json.dumps({"error": message}))
    else:
        err_console.print(message)
    return 2
