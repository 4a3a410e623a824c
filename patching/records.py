"""What `crucible model` finds and does, as typed records: regions of a model, the task files that describe them,
and each region's outcome."""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum


class Kind(str, Enum):
    """A fusable region crucible knows: the shipped tasks (forward, backward) that describe it."""

    RMSNORM = "rmsnorm"
    SWIGLU = "swiglu"
    ROPE = "rope"
    ATTENTION = "attention"
    LM_LOSS = "linear_cross_entropy"
    MOE = "moe"


class Outcome(str, Enum):
    PATCHED = "patched"
    NO_KERNEL = "no kernel"
    REJECTED = "rejected"
    EXCLUDED = "excluded"   # the user left this kind out (--skip)


@dataclass(frozen=True)
class Region:
    """One module of the model that computes a fusable op, with the shape it ran at in a real forward.

    `constants` are the task's integer constants at that shape (e.g. {"M": 32, "N": 64}); `key` the part of them a
    kernel must match to serve a call (the rows may vary: the harness's robustness stage checks other row counts)."""

    kind: Kind
    modules: tuple[str, ...]          # qualified names of the modules (layers that share one shape)
    constants: dict[str, int]
    dtype: str
    key: tuple[int, ...]
    floats: dict[str, float] = field(default_factory=dict)  # the task's float settings at the model's (e.g. EPS)

    def __post_init__(self) -> None:
        if not self.modules:
            raise ValueError("a region names at least one module")

    @property
    def label(self) -> str:
        shape = ", ".join(f"{k}={v}" for k, v in self.constants.items())
        return f"{self.kind.value} [{shape}] {self.dtype}"


@dataclass(frozen=True)
class TaskFile:
    """A KernelBench-format task written for a region at the model's shape: the shipped task's file with the
    model's constants."""

    role: str          # "forward", "backward" or "forward+backward": the kernel contract it describes
    path: str
    source_task: str   # the shipped task it was written from


@dataclass(frozen=True)
class Verdict:
    """The harness's word on one kernel for one task file at the model's shape."""

    task: str
    kernel: str        # the kernel file checked (a seed or an archived winner written out)
    origin: str        # "seed" or "archive #ID"
    accepted: bool
    message: str


@dataclass(frozen=True)
class RegionResult:
    region: Region
    outcome: Outcome
    reason: str
    tasks: tuple[TaskFile, ...] = ()
    verdicts: tuple[Verdict, ...] = ()


@dataclass
class PatchReport:
    """Every region the model has, each with its outcome; nothing is left out."""

    model: str
    results: list[RegionResult] = field(default_factory=list)
    unmatched: dict[str, int] = field(default_factory=dict)   # ops left to PyTorch, by name, with their counts

    def count(self, outcome: Outcome) -> int:
        return sum(1 for r in self.results if r.outcome is outcome)

    def to_dict(self) -> dict:
        return {
            "model": self.model,
            "regions": [{"kind": r.region.kind.value, "modules": list(r.region.modules), "constants": r.region.constants,
                         "dtype": r.region.dtype, "outcome": r.outcome.value, "reason": r.reason,
                         "tasks": [t.__dict__ for t in r.tasks], "verdicts": [v.__dict__ for v in r.verdicts]}
                        for r in self.results],
            "unmatched": self.unmatched,
        }
