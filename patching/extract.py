"""Write the task files of a model's regions: KernelBench-format files at the shapes and dtypes of a real forward.

Each region gets the shipped task files of its contracts (forward and backward) with the model's constants written
in, so the harness checks kernels at the model's own shapes and `crucible batch DIR` optimises them starting from
their seeds (the files keep the shipped names).
"""
from __future__ import annotations

import ast
from pathlib import Path

from patching.records import Kind, Region, TaskFile

TASKS_DIR = Path(__file__).resolve().parents[1] / "tasks"

# kind -> (role, shipped task); "forward"/"backward" are the two halves of a training kernel (a backward task may
# recompute the forward: attention's and the MoE block's return the forward's output too), "forward+backward" one
# call that returns the loss and its gradients.
CONTRACTS: dict[Kind, tuple[tuple[str, str], ...]] = {
    Kind.RMSNORM: (("forward", "rmsnorm_fwd.py"), ("backward", "rmsnorm_bwd.py")),
    Kind.SWIGLU: (("forward", "swiglu_fwd.py"), ("backward", "swiglu_bwd.py")),
    Kind.ROPE: (("forward", "rope_fwd.py"), ("backward", "rope_bwd.py")),
    Kind.ATTENTION: (("forward", "attention_fwd_causal.py"), ("backward", "attention_fwd_bwd_causal.py")),
    Kind.LM_LOSS: (("forward+backward", "linear_cross_entropy.py"),),
    Kind.MOE: (("forward", "moe_layer_mixtral.py"), ("backward", "moe_block_fwd_bwd.py")),
}


class ExtractError(ValueError):
    """A task file could not be written for a region; the message says which and why."""


def with_constants(source: str, values: dict[str, float], note: str) -> str:
    """The task source with its module-level `NAME = literal` assignments set to `values`, and `note` as comment
    lines after the docstring. ExtractError for a name the file does not assign."""
    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)
    found = set()
    for node in tree.body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                and node.targets[0].id in values and isinstance(node.value, ast.Constant)):
            v, name = node.value, node.targets[0].id
            if v.lineno != v.end_lineno:
                raise ExtractError(f"{name} spans lines; write it as one literal")
            line = lines[v.lineno - 1]
            lines[v.lineno - 1] = line[:v.col_offset] + repr(values[name]) + line[v.end_col_offset:]
            found.add(name)
    missing = set(values) - found
    if missing:
        raise ExtractError(f"the task assigns no literal {', '.join(sorted(missing))}")
    doc_end = tree.body[0].end_lineno if tree.body and isinstance(tree.body[0], ast.Expr) else 0
    comment = "".join(f"# {line}\n" for line in note.splitlines())
    return "".join(lines[:doc_end]) + comment + "".join(lines[doc_end:])


def task_values(region: Region, source: str) -> dict[str, float]:
    """The region's constants and float settings that this task file assigns (EPS only where it has one)."""
    assigned = {t.id for node in ast.parse(source).body if isinstance(node, ast.Assign) for t in node.targets
                if isinstance(t, ast.Name)}
    values: dict[str, float] = dict(region.constants)
    values.update({k: v for k, v in region.floats.items() if k in assigned})
    return values


def extract(regions: list[Region], out_dir: str | Path, model_name: str) -> list[tuple[TaskFile, ...]]:
    """Write each region's task files into out_dir; file names are the shipped ones, suffixed with the shape key
    where one model has two regions of a kind; one tuple of files per region, in order."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    per_kind: dict[Kind, int] = {}
    for r in regions:
        per_kind[r.kind] = per_kind.get(r.kind, 0) + 1
    written: list[tuple[TaskFile, ...]] = []
    for region in regions:
        files = []
        for role, name in CONTRACTS[region.kind]:
            source = (TASKS_DIR / name).read_text(encoding="utf-8")
            note = (f"Written by `crucible model extract` for {model_name}: the {region.kind.value} region at the "
                    f"shape of a real forward\n({', '.join(region.modules[:4])}"
                    f"{', ...' if len(region.modules) > 4 else ''}; {len(region.modules)} module(s)), "
                    f"from {name}.")
            text = with_constants(source, task_values(region, source), note)
            stem = Path(name).stem
            if per_kind[region.kind] > 1:
                stem += "_" + "_".join(str(k) for k in region.key)
            target = out / f"{stem}.py"
            target.write_text(text, encoding="utf-8")
            files.append(TaskFile(role, str(target), name))
        written.append(tuple(files))
    return written
