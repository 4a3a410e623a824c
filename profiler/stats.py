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
