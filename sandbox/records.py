"""Typed records the harness produces: stages, reason codes, per-stage results and the verdict.

Records hold plain data only (strings, numbers, lists, dicts of those) so they pickle across the
sandbox boundary and serialise to JSON unchanged. An exception is stored as its type, message and
traceback text, never as the object.
"""
from __future__ import annotations

import dataclasses
import enum
import traceback
from dataclasses import dataclass, field
from typing import Any


class Stage(str, enum.Enum):
    STATIC = "static"
    COMPILE = "compile"
    SMOKE = "smoke"
    CORRECTNESS = "correctness"
    ROBUSTNESS = "robustness"
    TIMING = "timing"


STAGE_ORDER = list(Stage)
# A harness_error stage's detail where the check ended because the GPU's memory was full: GPU_FULL_HARNESS where
# the parent's own figures show it (its allocation failed, or it held a quarter of the GPU itself), GPU_FULL_SHARED
# where the other processes' share rests on the candidate's own account of its use (sandbox/cudaipc.others_share).
# The search then runs fewer checks at once: at once for the first, if the retry fails so too for the second.
GPU_FULL, GPU_FULL_HARNESS, GPU_FULL_SHARED = "gpu_full", "harness", "shared"


class Reason(str, enum.Enum):
    """Stable reason codes: the loop, the archive and the tests key on these strings."""

    OK = "ok"
    # static
    SYNTAX_ERROR = "syntax_error"
    NO_MODEL_NEW = "no_model_new"
    NO_TRITON_KERNEL = "no_triton_kernel"
    FORBIDDEN_IMPORT = "forbidden_import"
    FORBIDDEN_CALL = "forbidden_call"
    TRY_EXCEPT = "try_except"
    SUBCLASSES_REFERENCE = "subclasses_reference"
    # compile / construction
    IMPORT_ERROR = "import_error"
    COMPILE_ERROR = "compile_error"
    INIT_ERROR = "init_error"
    PARAMETER_MISMATCH = "parameter_mismatch"
    # running
    RUNTIME_ERROR = "runtime_error"
    CRASH = "crash"
    TIMEOUT = "timeout"
    SANDBOX_VIOLATION = "sandbox_violation"
    NO_TRITON_LAUNCH = "no_triton_launch"
    FOREIGN_KERNEL = "foreign_kernel"
    TORCH_COMPUTE = "torch_compute"
    FOREIGN_COMPUTE = "foreign_compute"      # numpy / Python compute, or Python run inside a Triton launch
    TRACE_TAMPERED = "trace_tampered"        # the launch trace's hooks or modes were replaced
    STATE_CARRIED = "state_carried"          # Python state changed between calls (a counter, a cache of outputs)
    THREADS_LEFT_RUNNING = "threads_left_running"
    GLOBAL_FLAGS_CHANGED = "global_flags_changed"
    # outputs
    OUTPUT_TYPE = "output_type"
    OUTPUT_SHAPE = "output_shape"
    OUTPUT_DTYPE = "output_dtype"
    OUTPUT_ALIASES_INPUT = "output_aliases_input"
    INPUT_MUTATED = "input_mutated"
    NONFINITE_MISMATCH = "nonfinite_mismatch"
    OUTPUT_MISMATCH = "output_mismatch"
    NONDETERMINISTIC = "nondeterministic"
    # timing
    TIMING_OUTPUT_MISMATCH = "timing_output_mismatch"
    TIMER_TAMPERED = "timer_tampered"
    TIMING_INCONSISTENT = "timing_inconsistent"
    FASTER_THAN_ROOFLINE = "faster_than_roofline"
    # the task or the invocation, not the candidate
    BAD_TASK = "bad_task"
    HARNESS_ERROR = "harness_error"


class Verdict(str, enum.Enum):
    ACCEPTED = "accepted"
    REJECTED = "rejected"


@dataclass(frozen=True)
class ErrorInfo:
    type: str
    message: str
    traceback: str = ""

    @classmethod
    def from_exception(cls, exc: BaseException) -> "ErrorInfo":
        tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        return cls(type=type(exc).__name__, message=str(exc)[:4000], traceback=tb[-8000:])


@dataclass(frozen=True)
class Mismatch:
    """What a failed comparison returns to the user and to the LLM (Liger's assert_verbose_allclose style)."""

    output: str  # which output, e.g. "out[0]"
    numel: int
    mismatched: int
    worst_index: tuple[int, ...]
    expected: float
    got: float
    max_abs_err: float
    rel_l2_err: float
    rel_l2_bound: float
    nonfinite_expected: int = 0
    nonfinite_got: int = 0
    first_nonfinite_diff: tuple[int, ...] | None = None
    note: str = ""

    def describe(self) -> str:
        lines = [
            f"{self.output}: {self.mismatched}/{self.numel} elements outside tolerance; worst at index "
            f"{list(self.worst_index)}: expected {self.expected:.6g}, got {self.got:.6g} "
            f"(max abs err {self.max_abs_err:.3g}); relative L2 error {self.rel_l2_err:.3g} "
            f"(bound {self.rel_l2_bound:.3g})"
        ]
        if self.nonfinite_expected or self.nonfinite_got or self.first_nonfinite_diff is not None:
            lines.append(
                f"  NaN/Inf: expected {self.nonfinite_expected}, got {self.nonfinite_got}"
                + (f", first differing position {list(self.first_nonfinite_diff)}"
                   if self.first_nonfinite_diff is not None else "")
            )
        if self.note:
            lines.append(f"  {self.note}")
        return "\n".join(lines)


@dataclass(frozen=True)
class StageResult:
    stage: Stage
    passed: bool
    reason: Reason
    message: str = ""
    seconds: float = 0.0
    details: dict[str, Any] = field(default_factory=dict)
    mismatch: Mismatch | None = None
    error: ErrorInfo | None = None

    def __post_init__(self) -> None:
        if self.passed != (self.reason is Reason.OK):
            raise ValueError(f"stage {self.stage.value}: passed={self.passed} with reason {self.reason.value}")


class Rejected(Exception):
    """Ends a check at `stage`: carries the failed stage's result (the harness and the timing stage raise it)."""

    def __init__(self, stage: Stage, reason: Reason, message: str, *, mismatch: Mismatch | None = None,
                 error: ErrorInfo | None = None, details: dict[str, Any] | None = None):
        super().__init__(message)
        self.result = StageResult(stage, False, reason, message, details=details or {}, mismatch=mismatch, error=error)


class TaskError(Exception):
    """The task file cannot be used; the message says what to fix."""


@dataclass(frozen=True)
class CheckResult:
    """The harness's verdict on one candidate for one task."""

    task: str
    candidate: str
    device: str
    verdict: Verdict
    stage: Stage  # the last stage run: the failing one, or the last passed
    reason: Reason
    message: str
    stages: tuple[StageResult, ...]
    seconds: float
    timed: bool  # False on the CPU or with --no-timing: accepted says nothing about speed
    timing: dict[str, Any] | None = None
    environment: dict[str, Any] = field(default_factory=dict)
    # Where the seconds went: the candidate's own calls (kernels, first-launch compilation) vs the harness.
    costs: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if (self.verdict is Verdict.ACCEPTED) != (self.reason is Reason.OK):
            raise ValueError("an accepted verdict must carry reason ok, a rejected one a failure reason")

    @property
    def accepted(self) -> bool:
        return self.verdict is Verdict.ACCEPTED

    def to_dict(self) -> dict[str, Any]:
        return _jsonable(dataclasses.asdict(self))


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, float) and obj != obj:
        return None
    return obj
