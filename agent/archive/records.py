"""The archive's typed records: a candidate with its verdict and timings, a run, a batch, a duel and its legs, a
re-verification; and the two helpers every writer uses, the source's sha256 key and the UTC timestamp.

They are plain frozen dataclasses that know nothing of SQLite (agent/archive/store.py reads and writes them), so the
search, the exports and the reports can pass them around without opening an archive.
"""
from __future__ import annotations

import dataclasses
import datetime as _dt
import enum
import hashlib
from dataclasses import dataclass
from typing import Any, Iterable

def sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


@dataclass(frozen=True)
class Timings:
    """What the GPU timing stage measured; all None on the CPU."""

    candidate_ms: float | None = None
    speedup_eager: float | None = None
    eager_ci_low: float | None = None
    eager_ci_high: float | None = None
    speedup_compile: float | None = None
    compile_ci_low: float | None = None
    compile_ci_high: float | None = None
    pct_roofline: float | None = None

    @classmethod
    def from_check(cls, timing: dict[str, Any] | None) -> "Timings":
        if not timing:
            return cls()
        base = timing.get("baselines") or {}
        eager, comp = base.get("eager") or {}, base.get("compile") or {}
        roof = timing.get("roofline") or {}
        return cls(candidate_ms=_num(timing.get("candidate_ms")),
                   speedup_eager=_num(eager.get("speedup")), eager_ci_low=_num(eager.get("ci_low")),
                   eager_ci_high=_num(eager.get("ci_high")),
                   speedup_compile=_num(comp.get("speedup")), compile_ci_low=_num(comp.get("ci_low")),
                   compile_ci_high=_num(comp.get("ci_high")),
                   pct_roofline=_num(roof.get("pct_of_roofline")))


@dataclass(frozen=True)
class Candidate:
    """One archived candidate. `id` is 0 until it is written; `source` is filled by get()/with_source()."""

    task_path: str
    task_hash: str
    origin: str
    proposer: str
    verdict: str
    reason: str
    id: int = 0
    uid: str = ""
    run_id: str | None = None
    source_sha: str | None = None
    parent_id: int | None = None
    parent2_id: int | None = None
    niche: str | None = None
    prompt: str | None = None
    reply: str | None = None
    stage: str | None = None
    message: str = ""
    diagnostics: dict[str, Any] | None = None
    timed: bool = False
    timings: Timings = Timings()
    env: dict[str, Any] | None = None
    env_hash: str | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float | None = None
    latency_s: float | None = None
    eval_s: float | None = None
    created: str = ""
    source: str | None = None

    def __post_init__(self) -> None:
        if self.verdict not in ("accepted", "rejected", "interrupted"):
            raise ValueError(f"unknown verdict {self.verdict!r}")
        if self.verdict == "accepted" and (self.reason != "ok" or (self.source_sha is None and self.source is None)):
            raise ValueError("an accepted candidate carries reason ok and a source")
        if self.origin not in ("seed", "llm", "tuner"):
            raise ValueError(f"unknown origin {self.origin!r}")

    @property
    def accepted(self) -> bool:
        return self.verdict == "accepted"

    @property
    def speedup(self) -> float | None:
        return self.timings.speedup_eager if self.timed else None

    def summary(self) -> dict[str, Any]:
        """The row `crucible archive list --json` prints."""
        return {"id": self.id, "task": self.task_path, "verdict": self.verdict, "stage": self.stage,
                "reason": self.reason, "proposer": self.proposer, "speedup": self.speedup, "created": self.created}

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class Reverification:
    """One re-check of an archived candidate in a later environment: `status` confirmed or stale, and why."""

    candidate_id: int
    status: str
    note: str
    verdict: str
    reason: str
    stage: str | None = None
    timed: bool = False
    timings: Timings = Timings()
    diagnostics: dict[str, Any] | None = None
    env: dict[str, Any] | None = None
    env_hash: str | None = None
    id: int = 0
    uid: str = ""
    created: str = ""

    def __post_init__(self) -> None:
        if self.status not in ("confirmed", "stale"):
            raise ValueError(f"unknown reverification status {self.status!r}")
        if self.status == "confirmed" and self.verdict != "accepted":
            raise ValueError("only a candidate the harness accepts again can be confirmed")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class DuelOutcome(str, enum.Enum):
    CROWNED = "crowned"  # paired faster, its interval above 1.0: the challenger is the new best
    NO_DIFFERENCE = "no significant difference"
    SLOWER = "slower"
    WITHIN_NOISE = "not re-timed"  # its lower bound did not clear the incumbent's point estimate: no duel
    FAILED = "failed"  # a leg was rejected, untimed or broke the harness
    INTERRUPTED = "interrupted"  # the run stopped first


@dataclass(frozen=True)
class DuelLeg:
    """One check of a duel. `rounds`: per timed round, the kernel's ms over eager's ms of that same round."""

    side: str  # challenger | incumbent
    verdict: str
    reason: str
    message: str = ""
    speedup_eager: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    candidate_ms: float | None = None
    rounds: tuple[float, ...] = ()
    seconds: float = 0.0

    def __post_init__(self) -> None:
        if self.side not in ("challenger", "incumbent"):
            raise ValueError(f"unknown duel side {self.side!r}")
        object.__setattr__(self, "rounds", tuple(float(r) for r in self.rounds))


@dataclass(frozen=True)
class Duel:
    """A challenger that ranked above the best, re-timed against it back to back; `speedup` is the challenger's
    over the incumbent (> 1: faster), paired, None when it was not measured."""

    task_hash: str
    challenger_id: int
    incumbent_id: int
    outcome: DuelOutcome
    note: str
    run_id: str | None = None
    speedup: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    n_pairs: int = 0
    legs: tuple[DuelLeg, ...] = ()
    seconds: float = 0.0
    id: int = 0
    uid: str = ""
    created: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "outcome", DuelOutcome(self.outcome))
        object.__setattr__(self, "legs", tuple(self.legs))
        measured = self.speedup is not None
        if measured and not (self.ci_low is not None and self.ci_high is not None
                             and self.ci_low <= self.speedup <= self.ci_high):
            raise ValueError(f"duel speedup {self.speedup} lies outside its interval [{self.ci_low}, {self.ci_high}]")
        if self.outcome is DuelOutcome.CROWNED and not (measured and self.ci_low > 1.0):
            raise ValueError("a challenger is crowned only on a paired interval above 1.0")
        if self.outcome is DuelOutcome.SLOWER and not (measured and self.ci_high < 1.0):
            raise ValueError("a duel says slower only on a paired interval below 1.0")
        if self.outcome is DuelOutcome.WITHIN_NOISE and self.legs:
            raise ValueError("a challenger that was not re-timed has no legs")

    @property
    def crowned(self) -> bool:
        return self.outcome is DuelOutcome.CROWNED

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["outcome"] = self.outcome.value
        return d


@dataclass(frozen=True)
class Run:
    id: str
    task_path: str
    task_hash: str
    proposer: str
    device: str
    config: dict[str, Any]
    started: str
    finished: str | None = None
    stop_reason: str | None = None


@dataclass(frozen=True)
class Batch:
    """One `crucible batch` over a folder; its tasks' rows live in `batch_tasks` (Archive.batch_rows)."""

    id: str
    folder: str
    device: str
    config: dict[str, Any]
    started: str
    finished: str | None = None


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and v == v else None


def rows(cands: Iterable[Candidate]) -> list[dict[str, Any]]:
    return [c.summary() for c in cands]
