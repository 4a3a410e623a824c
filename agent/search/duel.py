"""Crowning a new best on a GPU: the challenger and the incumbent re-timed back to back before the title changes.

Each candidate is timed against eager in its own check, minutes apart from the others; two such numbers differ by
the drift between them as well as by the kernels (BENCHMARKS.md, on the H200: a launch option the default path never
runs read 10.40x [10.32, 10.60] against the seed's 10.04x [9.90, 10.13], and 10.07x at the final re-check). So a timed
candidate that ranks above the best is a challenger, not a winner:

- it is re-timed only when its lower bound clears the incumbent's standing (`contest`): a rank won inside the
  incumbent's own noise is not worth four re-timings, and the incumbent stays best. The standing is the median of
  the incumbent's speedups over eager, its own check's and every re-time of it in the run's duels so far
  (`standing`), so one check that read it low does not send every later challenger to a duel;
- otherwise both run on one evaluation slot in LEGS order (challenger, incumbent, challenger, incumbent), each leg
  a re-time timed against eager alone: both sources passed every stage in their own checks, so a leg compares its
  first call and validates its timing's sampled calls, and runs the other distributions, shapes and the soak no
  more (sandbox.harness CheckOptions.retime; the final re-check of the winner runs them all again);
- `judge` pairs the legs ABAB-wise. Within a leg every timed round has the kernel's ms and eager's ms of that round
  (profiler.report's rounds_ms), so kernel/eager per round cancels the clock of that moment; round i of challenger
  leg k is paired with round i of incumbent leg k, and profiler.stats.compare takes the median ratio and its seeded
  bootstrap interval. Legs without per-round data are paired as whole checks, which are too few to be significant.
- the challenger is crowned only when that interval lies above 1.0; else it is recorded as "no significant
  difference" or "slower" against the incumbent, which stays best.

The loop (agent/search/loop.py) owns when a duel starts and what happens after; this module holds the pieces that need no
loop: the trigger, a leg's record, the verdict and its sentence.
"""
from __future__ import annotations

import concurrent.futures as cf
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from agent.archive.records import Candidate, Duel, DuelLeg, DuelOutcome
from profiler import stats
from sandbox.records import CheckResult

CHALLENGER, INCUMBENT = "challenger", "incumbent"
LEGS = (CHALLENGER, INCUMBENT, CHALLENGER, INCUMBENT)
BASELINES = ("eager",)  # what each leg is timed against: the per-round normaliser


def retimes(cand_id: int, duels: Iterable[Duel]) -> list[float]:
    """The speedups over eager that the accepted legs of `duels` measured for candidate `cand_id`, on either side."""
    return [leg.speedup_eager for d in duels for leg in d.legs if usable(leg)
            and (d.challenger_id if leg.side == CHALLENGER else d.incumbent_id) == cand_id]


def standing(incumbent: Candidate, duels: Iterable[Duel] = ()) -> float | None:
    """What a challenger's lower bound must clear: the median of the incumbent's own check's speedup over eager and
    of its re-times in `duels` (None: never timed)."""
    seen = [x for x in (incumbent.timings.speedup_eager, *retimes(incumbent.id, duels)) if x is not None]
    return stats.median(seen) if seen else None


def contest(challenger: Candidate, incumbent: Candidate, duels: Iterable[Duel] = ()) -> bool:
    """Worth a duel: the challenger's lower bound beats the incumbent's standing."""
    low, point = challenger.timings.eager_ci_low, standing(incumbent, duels)
    return low is not None and point is not None and low > point


def leg(side: str, result: CheckResult, seconds: float) -> DuelLeg:
    timing = result.timing or {}
    eager = (timing.get("baselines") or {}).get("eager") or {}
    per_round = timing.get("rounds_ms") or {}
    mine, base = per_round.get("candidate") or [], per_round.get("eager") or []
    return DuelLeg(side=side, verdict=result.verdict.value, reason=result.reason.value, message=result.message,
                   speedup_eager=eager.get("speedup"), ci_low=eager.get("ci_low"), ci_high=eager.get("ci_high"),
                   candidate_ms=timing.get("candidate_ms"),
                   rounds=tuple(m / b for m, b in zip(mine, base) if m > 0 and b > 0), seconds=seconds)


def failed_leg(side: str, exc: BaseException, seconds: float) -> DuelLeg:
    return DuelLeg(side=side, verdict="rejected", reason="harness_error", message=f"{type(exc).__name__}: {exc}",
                   seconds=seconds)


def usable(leg: DuelLeg) -> bool:
    return leg.verdict == "accepted" and leg.speedup_eager is not None


def judge(legs: tuple[DuelLeg, ...]) -> stats.Comparison | None:
    """The challenger's paired speedup over the incumbent; None unless every leg was accepted and timed."""
    chal = [leg for leg in legs if leg.side == CHALLENGER]
    inc = [leg for leg in legs if leg.side == INCUMBENT]
    if not chal or len(chal) != len(inc) or not all(usable(leg) for leg in legs):
        return None
    subject: list[float] = []
    baseline: list[float] = []
    by_round = all(leg.rounds for leg in legs)
    for a, b in zip(chal, inc):
        if by_round:
            n = min(len(a.rounds), len(b.rounds))
            subject += a.rounds[:n]
            baseline += b.rounds[:n]
        else:  # whole checks: time relative to eager is 1 / speedup
            subject.append(1.0 / a.speedup_eager)
            baseline.append(1.0 / b.speedup_eager)
    return stats.compare(subject, baseline)


@dataclass
class Bout:
    """A duel in flight: its legs so far and the check running now, all on one slot."""

    challenger: Candidate
    incumbent: Candidate
    slot: int
    paths: dict[str, Path]
    legs: list[DuelLeg] = field(default_factory=list)
    future: cf.Future | None = None
    leg_started: float = 0.0
    started: float = field(default_factory=time.monotonic)

    @property
    def side(self) -> str:
        """The side of the leg running now (or next)."""
        return LEGS[len(self.legs)]

    @property
    def over(self) -> bool:
        return len(self.legs) == len(LEGS) or any(not usable(leg) for leg in self.legs)

    def decide(self, run_id: str | None) -> Duel:
        """The verdict on the legs so far: all four, a failed one, or fewer (the run stopped)."""
        c, i = self.challenger.id, self.incumbent.id
        legs = tuple(self.legs)
        common = dict(task_hash=self.challenger.task_hash, challenger_id=c, incumbent_id=i, run_id=run_id,
                      legs=legs, seconds=time.monotonic() - self.started)
        bad = next((leg for leg in legs if not usable(leg)), None)
        if bad is not None:
            return Duel(outcome=DuelOutcome.FAILED, note=f"the {bad.side}'s leg {legs.index(bad) + 1} came back "
                                                         f"{bad.verdict} ({bad.reason}): {bad.message}", **common)
        cmp = judge(legs)
        if cmp is None:  # legs missing: the run stopped (a bout is decided only when over, or on a stop)
            return Duel(outcome=DuelOutcome.INTERRUPTED,
                        note=f"the run stopped after {len(legs)} of {len(LEGS)} legs", **common)
        outcome = {stats.FASTER: DuelOutcome.CROWNED, stats.SLOWER: DuelOutcome.SLOWER}.get(
            cmp.verdict, DuelOutcome.NO_DIFFERENCE)
        unit = "paired rounds" if all(leg.rounds for leg in legs) else "paired checks (too few to be significant)"
        note = (f"re-timed back to back ({', '.join(LEGS)}): #{c} is {cmp.speedup:.3f}x #{i} "
                f"[{cmp.ci_low:.3f}, {cmp.ci_high:.3f}] over {cmp.n_pairs} {unit}")
        return Duel(outcome=outcome, note=note, speedup=cmp.speedup, ci_low=cmp.ci_low, ci_high=cmp.ci_high,
                    n_pairs=cmp.n_pairs, **common)


def not_contested(challenger: Candidate, incumbent: Candidate, run_id: str | None,
                  duels: Iterable[Duel] = ()) -> Duel:
    low, point, n = challenger.timings.eager_ci_low, standing(incumbent, duels), len(retimes(incumbent.id, duels))
    over = f" (the median of its own check and {n} re-time{'s' * (n > 1)})" if n else ""
    note = (f"ranked above #{incumbent.id} on its own check, but its lower bound "
            f"{'?' if low is None else f'{low:.2f}x'} does not clear #{incumbent.id}'s "
            f"{'?' if point is None else f'{point:.2f}x'}{over}: within the incumbent's noise, not re-timed")
    return Duel(task_hash=challenger.task_hash, challenger_id=challenger.id, incumbent_id=incumbent.id,
                outcome=DuelOutcome.WITHIN_NOISE, note=note, run_id=run_id)


def queued_unfought(challenger: Candidate, incumbent: Candidate, run_id: str | None) -> Duel:
    return Duel(task_hash=challenger.task_hash, challenger_id=challenger.id, incumbent_id=incumbent.id,
                outcome=DuelOutcome.INTERRUPTED, note="the run stopped before the re-time", run_id=run_id)


def headline(d: Duel) -> str:
    """e.g. "#7 vs #3: 1.004x [0.99, 1.02], no significant difference, #3 stays best"."""
    c, i = d.challenger_id, d.incumbent_id
    after = f"#{c} is the new best" if d.crowned else f"#{i} stays best"
    if d.speedup is None:
        return f"#{c} vs #{i}: {d.outcome.value} ({d.note}), {after}"
    verdict = "faster" if d.crowned else d.outcome.value
    return f"#{c} vs #{i}: {d.speedup:.3f}x [{d.ci_low:.2f}, {d.ci_high:.2f}], {verdict}, {after}"
