"""A search run's typed records: its settings, the progress and events it reports, and its summary.

`RunConfig` is what the user asked for (the CLI builds it; on resume the fields left None are filled from the stored
run by agent/search/prepare.py). `Progress` and `Event` are what the loop hands its `on_event` callback while it runs;
`RunSummary` is what it returns. `LoopError` is the one exception a run raises when it cannot start.
"""
from __future__ import annotations

import enum
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from agent.archive.records import Candidate, Duel, Reverification

DEFAULT_BUDGET = 20


class LoopError(Exception):
    """The run cannot start; the message is one sentence saying what to do (the CLI exits 2)."""


@dataclass(frozen=True)
class RunConfig:
    """Settings of one run. On resume, fields left None take the stored run's values."""

    task_path: Path
    model: str | None = None  # provider spec; None: the tuner proposes
    budget: int | None = None  # proposals, the starting kernel not counted
    device: str = "auto"
    gpus: int = 1
    start_from: Path | None = None
    resume: str | None = None  # a run id, or "latest"
    max_tokens: int | None = None  # over the whole run, input + output
    max_cost: float | None = None  # USD over the whole run
    time_limit_s: float | None = None  # wall time of this invocation
    target_roofline: float | None = None  # stop once a verified kernel reaches this % of roofline
    polish: int | None = None  # tuner proposals at the end of an LLM run (default: a fifth of the budget)
    reply_max_tokens: int = 8192
    temperature: float = 0.7
    concurrency: int = 4  # LLM proposals whose outcome is not known yet: requests and candidates being checked
    samples: int = 1  # requests that may share one prompt at a time (parallel sampling)
    seed: int = 0
    check_timeout_s: float = 300.0
    baselines: tuple[str, ...] = ("eager",)  # each candidate's timing (torch.compile alone costs ~20 s a check)
    final_baselines: tuple[str, ...] = ("eager", "compile", "liger", "vendor")  # the best's final re-check
    constants: dict[str, int] = field(default_factory=dict)  # --set: the task's constants replaced (and pinned)
    rescale: bool = True  # False (--no-rescale): the CPU checks the task at its own size
    # candidates checked at once on each GPU, only one of them timed at a time (sandbox/gate.py); None: 4 on a GPU,
    # 1 on the CPU
    checks_per_gpu: int | None = None

    def stored(self) -> dict[str, Any]:
        d = {k: v for k, v in asdict(self).items() if k not in ("resume", "time_limit_s")}
        return json.loads(json.dumps(d, default=str))


class EventKind(str, enum.Enum):
    START = "start"
    NOTE = "note"
    EVALUATED = "evaluated"  # a candidate has its verdict (or failed before evaluation: no code, provider error)
    NEW_BEST = "new_best"
    DUEL = "duel"  # a challenger re-timed against the best (or not, and why): agent/search/duel.py
    STOPPING = "stopping"
    FINISHED = "finished"


@dataclass(frozen=True)
class Progress:
    proposals: int = 0
    budget: int = 0
    in_flight: int = 0  # LLM requests, candidates waiting for or in a check, and a duel's running check (one)
    accepted: int = 0
    rejected: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float | None = 0.0  # None: unknown, a model with no configured price answered
    requests: int = 0  # LLM requests sent (this run, resumed parts included)
    verified_llm: int = 0  # verified kernels the LLM proposed (this run)
    elapsed_s: float = 0.0
    check_s: float | None = None  # mean harness seconds per candidate evaluated in this invocation
    per_minute: float | None = None  # proposals evaluated per minute in this invocation
    proposer: str = ""
    best: Candidate | None = None


@dataclass(frozen=True)
class Event:
    kind: EventKind
    message: str
    progress: Progress
    candidate: Candidate | None = None


@dataclass(frozen=True)
class RunSummary:
    run_id: str
    task_path: str
    device: str
    timed: bool
    proposer: str
    stop_reason: str
    progress: Progress
    start: Candidate | None  # the starting kernel's record (seed or --from), None when the LLM started from scratch
    best: Candidate | None  # the best verified kernel of this task measured like this run (any run): on a GPU, the
    # paired winner (a challenger whose own check ranked higher but that no duel crowned is not it)
    best_path: Path | None
    run_dir: Path
    not_measured: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    provider_failure: str | None = None  # why the run stopped when the provider (not the kernels) failed
    replies: int = 0  # LLM replies received in this invocation
    final: Reverification | None = None  # the best kernel checked again at the end, timed against final_baselines
    duels: tuple[Duel, ...] = ()  # challengers re-timed against the best in this invocation, in order
