"""profiler.stats: quantiles, paired bootstrap speedups, and the rule that noise is never a win."""
import random

import numpy as np
import pytest

from profiler import stats


@pytest.mark.parametrize("n", [1, 2, 7, 30, 101])
@pytest.mark.parametrize("q", [0.0, 0.25, 0.5, 0.75, 0.9, 1.0])
def test_quantile_matches_numpy_linear(n, q):
    rng = random.Random(n)
    xs = [rng.lognormvariate(0, 1) for _ in range(n)]
    assert stats.quantile(xs, q) == pytest.approx(float(np.quantile(xs, q)), rel=1e-12)


def test_summary_median_and_iqr():
    s = stats.summarize([5.0, 1.0, 3.0, 2.0, 4.0, 100.0, 6.0, 7.0, 8.0])
    assert s.median == 5.0
    assert (s.q1, s.q3, s.iqr) == (3.0, 7.0, 4.0)  # the outlier moves neither
    assert s.min == 1.0 and s.max == 100.0 and s.n == 9
    with pytest.raises(ValueError):
        stats.summarize([])


def _noisy(base, n, noise, seed):
    rng = random.Random(seed)
    return [base * (1 + rng.gauss(0, noise)) for _ in range(n)]


def test_clear_speedup_is_significant_and_interval_contains_truth():
    base = _noisy(2.0, 30, 0.02, 1)
    cand = _noisy(1.0, 30, 0.02, 2)
    c = stats.compare(cand, base)
    assert c.verdict == stats.FASTER and c.significant
    assert 1.0 < c.ci_low <= c.speedup <= c.ci_high
    assert c.speedup == pytest.approx(2.0, rel=0.03)


def test_clear_slowdown_is_slower():
    c = stats.compare(_noisy(1.3, 30, 0.02, 3), _noisy(1.0, 30, 0.02, 4))
    assert c.verdict == stats.SLOWER and c.significant and c.ci_high < 1.0


def test_difference_inside_noise_is_no_significant_difference():
    # same distribution, 5% noise: whatever the point estimate says, it is not a win
    c = stats.compare(_noisy(1.0, 30, 0.05, 5), _noisy(1.0, 30, 0.05, 6))
    assert c.verdict == stats.NO_DIFFERENCE and not c.significant
    assert c.ci_low <= 1.0 <= c.ci_high


def test_pairing_cancels_drift_between_rounds():
    # clocks drift from 1 ms to 10 ms over the run; the candidate is 5% faster in every round. Unpaired medians
    # would drown the difference; paired ratios see it.
    rounds = [1.0 + 9.0 * i / 29 for i in range(30)]
    base = [r * (1 + 0.002 * ((i * 7) % 5 - 2)) for i, r in enumerate(rounds)]
    cand = [r * 0.95 for r in rounds]
    c = stats.compare(cand, base)
    assert c.verdict == stats.FASTER
    assert c.speedup == pytest.approx(1 / 0.95, rel=0.01)


def test_bootstrap_is_deterministic_for_a_seed():
    cand, base = _noisy(1.0, 30, 0.05, 7), _noisy(1.02, 30, 0.05, 8)
    assert stats.compare(cand, base, seed=3) == stats.compare(cand, base, seed=3)
    assert stats.compare(cand, base, seed=3).speedup == stats.compare(cand, base, seed=4).speedup


def test_too_few_rounds_is_never_significant():
    c = stats.compare([1.0, 1.0, 1.0], [2.0, 2.0, 2.0])
    assert not c.significant and c.verdict == stats.NO_DIFFERENCE and c.n_pairs == 3


def test_unequal_lengths_pair_the_common_prefix():
    c = stats.compare([1.0] * 10, [2.0] * 7)
    assert c.n_pairs == 7 and c.speedup == 2.0


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf")])
def test_bad_timings_are_refused(bad):
    with pytest.raises(ValueError):
        stats.compare([1.0] * 5 + [bad], [1.0] * 6)


def test_comparison_invariants_are_enforced():
    with pytest.raises(ValueError):
        stats.Comparison(1.5, 1.2, 1.8, False, stats.FASTER, 30, 0.95)  # faster must be significant
    with pytest.raises(ValueError):
        stats.Comparison(1.5, 0.9, 1.8, True, stats.NO_DIFFERENCE, 30, 0.95)
    with pytest.raises(ValueError):
        stats.Comparison(2.0, 1.2, 1.8, True, stats.FASTER, 30, 0.95)  # point outside its interval
