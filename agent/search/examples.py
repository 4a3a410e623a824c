"""The example a prompt shows, retrieved by op family instead of one fixed file.

A task's family is read from its file name (norm, softmax, glu, rope, attention, cross-entropy, moe, optimizer,
matmul). The example is, in order: the best verified kernel the archive holds for another task of the same family; a
seed kernel of that family (not the task's own seed, which the run starts from anyway); else the RMSNorm forward kept
with the prompts. Only files that define their kernels themselves are examples. Examples longer than MAX_LINES are
passed over: an example is there to show the form of a valid file, and a long one costs every request its tokens.
"""
from __future__ import annotations

from pathlib import Path

from agent.archive.store import Archive
from agent.search.elites import best_of
from seeds.registry import all_seeds

MAX_LINES = 260
FAMILIES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("attention", ("attention", "attn", "decode", "sdpa", "flash")),
    ("cross-entropy", ("cross_entropy", "logsumexp", "nll")),
    ("norm", ("rmsnorm", "layernorm", "groupnorm", "norm")),
    ("softmax", ("softmax",)),
    ("glu", ("swiglu", "geglu", "glu", "gelu", "silu")),
    ("rope", ("rope", "rotary")),
    ("moe", ("moe", "grouped")),
    ("optimizer", ("adam", "sgd", "lion")),
    ("matmul", ("matmul", "gemm", "linear", "mm")),
)


def family(name: str) -> str | None:
    """The op family of a task or seed name, or None."""
    low = name.lower()
    for fam, words in FAMILIES:
        if any(w in low for w in words):
            return fam
    return None


def retrieve(task_path: Path, archive: Archive | None = None, *, timed: bool = False,
             own_seed: Path | None = None) -> tuple[str, str] | None:
    """(what it is, its source) of the example for this task; None: the default example."""
    fam = family(task_path.stem)
    if fam is None:
        return None
    if archive is not None:
        others: dict[str, list] = {}
        for c in archive.candidates(verdict="accepted", timed=timed):
            stem = Path(c.task_path).stem
            if stem != task_path.stem and family(stem) == fam:
                others.setdefault(stem, []).append(c)
        for stem, cands in sorted(others.items()):
            best = best_of(cands)
            source = archive.with_source(best).source if best is not None else None
            if source and len(source.split("\n")) <= MAX_LINES and _own_kernels(source):
                return (f"the best verified kernel in the archive for `{stem}`, a task of the same family ({fam})",
                        source)
    for seed in all_seeds():
        if own_seed is not None and seed.path.resolve() == Path(own_seed).resolve():
            continue
        if family(seed.name) != fam:
            continue
        source = seed.path.read_text(encoding="utf-8")
        if len(source.split("\n")) <= MAX_LINES and _own_kernels(source):
            return (f"the seed kernel `{seed.name}` ({seed.path.name}), a task of the same family ({fam})", source)
    return None


def _own_kernels(source: str) -> bool:
    """The file defines its kernels itself (a seed that only imports another's shows nothing of the form)."""
    return "@triton.jit" in source or "@gluon.jit" in source
