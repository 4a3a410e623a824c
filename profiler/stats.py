"""Statistics for timings: median and IQR, and a paired speedup with a bootstrap confidence interval.

A speedup is the median over rounds of baseline_ms / subject_ms, where both were timed in the same interleaved round
(profiler.timing), so slow drift of clocks or temperature cancels in each ratio. Its confidence interval comes from a
percentile bootstrap over those per-round ratios with a fixed seed (the same data always give the same interval).
A difference is `significant` only when the interval excludes 1.0; otherwise the verdict is
"no significant difference" — never a win.

Standard library only: the trusted parent and the sandbox child both import this.
"""
from __future__ import annotations

import math
import random
from dataclasses import asdict, dataclass
from typing import Sequence

FASTER = "faster"
SLOWER = "slower"
NO_DIFFERENCE = "no significant difference"
MIN_PAIRS = 5  # fewer paired rounds than this never make a difference significant


def quantile(xs: Sequence[float], q: float) -> float:
    """Linear-interpolation quantile (numpy's default), q in [0, 1]."""
    if not xs:
        raise ValueError("quantile of no data")
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"q={q} is outside [0, 1]")
    s = sorted(xs)
    pos = q * (len(s) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def median(xs: Sequence[float]) -> float:
    return quantile(xs, 0.5)


@dataclass(frozen=True)
class Summary:
    n: int
    median: float
    q1: float
    q3: float
    iqr: float
    min: float
    max: float

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


def summarize(xs: Sequence[float]) -> Summary:
    if not xs:
        raise ValueError("no timings to summarise")
    q1, q3 = quantile(xs, 0.25), quantile(xs, 0.75)
    return Summary(n=len(xs), median=median(xs), q1=q1, q3=q3, iqr=q3 - q1, min=min(xs), max=max(xs))


@dataclass(frozen=True)
class Comparison:
    """How much faster the subject (the candidate) is than a baseline: speedup > 1 means faster."""

    speedup: float
    ci_low: float
    ci_high: float
    significant: bool
    verdict: str
    n_pairs: int
    confidence: float

    def __post_init__(self) -> None:
        if self.verdict not in (FASTER, SLOWER, NO_DIFFERENCE):
            raise ValueError(f"unknown verdict {self.verdict!r}")
        if self.significant != (self.verdict != NO_DIFFERENCE):
            raise ValueError("a significant comparison must say faster or slower, and only then")
        if not self.ci_low <= self.speedup <= self.ci_high:
            raise ValueError(f"speedup {self.speedup} lies outside its interval [{self.ci_low}, {self.ci_high}]")

    def to_dict(self) -> dict[str, float | bool | str | int]:
        return asdict(self)


def paired_ratios(subject_ms: Sequence[float], baseline_ms: Sequence[float]) -> list[float]:
    """baseline / subject per round; rounds beyond the shorter list (a function that failed part-way) are dropped."""
    n = min(len(subject_ms), len(baseline_ms))
    out = []
    for s, b in zip(subject_ms[:n], baseline_ms[:n]):
        if s <= 0 or b <= 0 or not (math.isfinite(s) and math.isfinite(b)):
            raise ValueError(f"timings must be positive and finite, got subject {s} and baseline {b}")
        out.append(b / s)
    return out


def compare(subject_ms: Sequence[float], baseline_ms: Sequence[float], *, confidence: float = 0.95,
            resamples: int = 2000, seed: int = 0) -> Comparison:
    """Paired speedup of subject over baseline with a seeded percentile-bootstrap interval over per-round ratios."""
    if not 0.5 < confidence < 1.0:
        raise ValueError(f"confidence={confidence} must lie in (0.5, 1)")
    ratios = paired_ratios(subject_ms, baseline_ms)
    if not ratios:
        raise ValueError("no paired rounds to compare")
    point = median(ratios)
    n = len(ratios)
    if n < MIN_PAIRS:
        return Comparison(point, min(ratios), max(ratios), False, NO_DIFFERENCE, n, confidence)
    rng = random.Random(seed)
    boot = []
    for _ in range(resamples):
        boot.append(median([ratios[rng.randrange(n)] for _ in range(n)]))
    alpha = (1.0 - confidence) / 2
    low, high = quantile(boot, alpha), quantile(boot, 1.0 - alpha)
    low, high = min(low, point), max(high, point)
    if low > 1.0:
        verdict = FASTER
    elif high < 1.0:
        verdict = SLOWER
    else:
        verdict = NO_DIFFERENCE
    return Comparison(point, low, high, verdict != NO_DIFFERENCE, verdict, n, confidence)


# ---- racing: stop timing a candidate once it cannot beat the incumbent --------------------------------------------
LOST = "lost"  # the candidate's interval lies entirely above the incumbent's time x (1 + margin)
WON = "won"  # ... entirely below the incumbent's time x (1 - margin)
OPEN = "open"  # neither, or too few rounds to say


def median_interval(xs: Sequence[float], confidence: float = 0.95) -> tuple[float, float]:
    """A distribution-free interval for the median: order statistics x_(l) and x_(n+1-l), with l the largest rank
    whose binomial(n, 1/2) tail stays within (1 - confidence) / 2. Exact, cheap enough to run after every round;
    with too few samples for any such l, the whole range."""
    if not xs:
        raise ValueError("no samples")
    s = sorted(xs)
    n = len(s)
    alpha = (1.0 - confidence) / 2
    tail, rank = 0.0, 0
    for k in range(n):  # tail = P(Binomial(n, 1/2) <= k)
        tail += math.comb(n, k) / 2.0 ** n
        if tail > alpha:
            break
        rank = k + 1
    if rank == 0:
        return s[0], s[-1]
    return s[rank - 1], s[n - rank]


@dataclass(frozen=True)
class RaceRule:
    """When timing a candidate may stop: after at least `min_rounds` rounds, once the `confidence` interval of its
    median time (median_interval) lies entirely above `incumbent_ms` x (1 + margin). The incumbent was timed in another
    run, so the comparison is not paired: the margin absorbs the drift between runs. A candidate whose interval still
    straddles an edge of the band incumbent x (1 -/+ margin) after the planned rounds is timed on, up to the extra
    rounds allowed (a close contest); one whose interval lies inside the band is as fast as the incumbent within the
    margin, which more rounds would only confirm (`within_margin`), and stops there."""

    incumbent_ms: float
    margin: float = 0.05
    min_rounds: int = 10
    confidence: float = 0.95

    def __post_init__(self) -> None:
        if not (math.isfinite(self.incumbent_ms) and self.incumbent_ms > 0):
            raise ValueError(f"the incumbent's time must be positive and finite, got {self.incumbent_ms}")
        if not 0.0 <= self.margin < 1.0:
            raise ValueError(f"margin={self.margin} must lie in [0, 1)")
        if self.min_rounds < MIN_PAIRS:
            raise ValueError(f"min_rounds={self.min_rounds} is under {MIN_PAIRS}")
        if not 0.5 < self.confidence < 1.0:
            raise ValueError(f"confidence={self.confidence} must lie in (0.5, 1)")

    def describe(self) -> str:
        return (f"stop once, after at least {self.min_rounds} rounds, the {self.confidence:.0%} interval of the "
                f"candidate's median time lies entirely above the incumbent's {self.incumbent_ms:.4g} ms x "
                f"{1 + self.margin:g}; past the planned rounds, time on only while it spans x {1 - self.margin:g} "
                f"or x {1 + self.margin:g}")

    def to_dict(self) -> dict[str, float | int | str]:
        return {**asdict(self), "rule": self.describe()}


def race(subject_ms: Sequence[float], rule: RaceRule) -> str:
    """LOST, WON or OPEN for the subject's times so far against the rule's incumbent."""
    if len(subject_ms) < rule.min_rounds:
        return OPEN
    low, high = median_interval(subject_ms, rule.confidence)
    if low > rule.incumbent_ms * (1 + rule.margin):
        return LOST
    if high < rule.incumbent_ms * (1 - rule.margin):
        return WON
    return OPEN


def within_margin(subject_ms: Sequence[float], rule: RaceRule) -> bool:
    """Whether, after at least the rule's rounds, the subject's interval lies inside incumbent x (1 -/+ margin): no
    significant difference either way, and more rounds would narrow the interval without moving it out."""
    if len(subject_ms) < rule.min_rounds:
        return False
    low, high = median_interval(subject_ms, rule.confidence)
    return rule.incumbent_ms * (1 - rule.margin) <= low and high <= rule.incumbent_ms * (1 + rule.margin)


def keep_racing(done_ms: Sequence[float], rule: RaceRule, planned: int, most: int) -> tuple[bool, str]:
    """(whether to time another round, the decision so far) after len(done_ms) calls: stop as soon as the subject
    LOST; past `planned` calls, go on only while the contest is OPEN with its interval across an edge of the band
    (not `within_margin`), and never past `most`."""
    decision = race(done_ms, rule) if done_ms else OPEN
    n = len(done_ms)
    if n >= most or decision == LOST:
        return False, decision
    if n >= planned:
        return decision == OPEN and not within_margin(done_ms, rule), decision
    return True, decision
