"""Racing in timing: the stopping rule on synthetic samples (no GPU timing), the parent's reading of a race, and the
incumbent's time as an option."""
import math
import random

import pytest

from profiler import stats
from profiler.stats import LOST, OPEN, WON, RaceRule, keep_racing, median_interval, race
from sandbox import timing_parent
from sandbox.harness import CheckOptions


def _times(rng: random.Random, median_ms: float, n: int, spread: float = 0.02) -> list[float]:
    return [median_ms * math.exp(rng.gauss(0.0, spread)) for _ in range(n)]


# ---- the median's interval ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("n,ranks", [(10, (2, 9)), (20, (6, 15)), (30, (10, 21))])
def test_median_interval_uses_the_binomial_order_statistics(n, ranks):
    xs = [float(i) for i in range(1, n + 1)]  # x_(k) == k
    assert median_interval(xs, 0.95) == ranks  # the standard table's ranks for a 95% interval


def test_median_interval_is_the_whole_range_when_too_few_samples():
    assert median_interval([3.0, 1.0, 2.0], 0.95) == (1.0, 3.0)


def test_median_interval_covers_the_median_about_as_often_as_it_says():
    rng = random.Random(1)
    hits = sum(lo <= 1.0 <= hi for lo, hi in (median_interval(_times(rng, 1.0, 15), 0.95) for _ in range(2000)))
    assert hits / 2000 >= 0.95  # exact intervals cover at least their level (about 0.965 at n=15)


# ---- the rule -----------------------------------------------------------------------------------------------------
def test_a_clearly_slower_candidate_is_lost_only_after_the_minimum_rounds():
    rule = RaceRule(incumbent_ms=1.0, margin=0.05, min_rounds=10)
    slow = _times(random.Random(2), 1.5, 30)
    assert race(slow[:9], rule) == OPEN
    assert race(slow[:10], rule) == LOST


def test_a_clearly_faster_candidate_wins_and_a_close_one_stays_open():
    rule = RaceRule(incumbent_ms=1.0)
    assert race(_times(random.Random(3), 0.6, 20), rule) == WON
    assert race(_times(random.Random(4), 1.02, 30), rule) == OPEN  # inside the incumbent's 5% band


def test_a_noisy_candidate_whose_interval_reaches_the_band_is_not_stopped():
    rule = RaceRule(incumbent_ms=1.0)
    xs = [1.2] * 6 + [1.04] * 4 + [1.3] * 6  # median 1.2, but x_(4) of 16 sits below 1.05
    assert median_interval(xs, 0.95)[0] <= 1.05
    assert race(xs, rule) == OPEN


@pytest.mark.parametrize("kwargs", [dict(incumbent_ms=0.0), dict(incumbent_ms=float("nan")), dict(incumbent_ms=1.0,
                         margin=1.0), dict(incumbent_ms=1.0, min_rounds=2), dict(incumbent_ms=1.0, confidence=0.4)])
def test_a_rule_is_validated(kwargs):
    with pytest.raises(ValueError):
        RaceRule(**kwargs)


def test_the_rule_states_itself():
    text = RaceRule(incumbent_ms=0.25, margin=0.05, min_rounds=10).describe()
    assert text == ("stop once, after at least 10 rounds, the 95% interval of the candidate's median time lies "
                    "entirely above the incumbent's 0.25 ms x 1.05; past the planned rounds, time on only while it "
                    "spans x 0.95 or x 1.05")


# ---- racing round by round ----------------------------------------------------------------------------------------
def _race_out(samples: list[float], rule: RaceRule, planned: int, most: int) -> tuple[int, str]:
    """How many calls a race over `samples` times, as profiler.timing.measure asks keep_racing before each round."""
    done: list[float] = []
    for x in samples[:most]:
        go, decision = keep_racing(done, rule, planned, most)
        if not go:
            return len(done), decision
        done.append(x)
    return len(done), keep_racing(done, rule, planned, most)[1]


def test_a_hopeless_candidate_stops_at_the_minimum_rounds():
    rule = RaceRule(incumbent_ms=1.0, min_rounds=10)
    used, decision = _race_out(_times(random.Random(5), 2.0, 60), rule, planned=30, most=60)
    assert (used, decision) == (10, LOST)


def test_a_winner_is_timed_for_its_planned_rounds_and_no_more():
    rule = RaceRule(incumbent_ms=1.0)
    used, decision = _race_out(_times(random.Random(6), 0.5, 60), rule, planned=30, most=60)
    assert (used, decision) == (30, WON)


def test_a_close_contest_takes_the_extra_rounds():
    rule = RaceRule(incumbent_ms=1.0, margin=0.05)
    samples = [1.04, 1.06] * 30  # the median's interval [1.04, 1.06] across the band's upper edge, 1.05
    used, decision = _race_out(samples, rule, planned=30, most=60)
    assert (used, decision) == (60, OPEN)


def test_a_tie_inside_the_margin_stops_at_its_planned_rounds():
    """As fast as the incumbent within the margin both ways: more calls would narrow the interval inside the band,
    never out of it, so the contest ends at the planned calls as no significant difference."""
    rule = RaceRule(incumbent_ms=1.0, margin=0.05)
    samples = _times(random.Random(7), 1.0, 60)
    assert stats.within_margin(samples[:30], rule) and not stats.within_margin(samples[:9], rule)
    used, decision = _race_out(samples, rule, planned=30, most=60)
    assert (used, decision) == (30, OPEN)
    assert not stats.within_margin([1.04, 1.06] * 15, rule)  # across an edge
    assert not stats.within_margin([0.5] * 30, rule)  # faster past the band: a win, not a tie


def test_a_contest_decided_in_the_extra_rounds_stops_there():
    rule = RaceRule(incumbent_ms=1.0, margin=0.05)
    samples = [1.06, 1.03] * 15 + [1.2] * 30  # open after 30 calls, lost once the slow calls pile up
    used, decision = _race_out(samples, rule, planned=30, most=60)
    assert 30 < used < 60 and decision == LOST


# ---- the parent's reading -----------------------------------------------------------------------------------------
def _measured(stream_ms: list[float], stopped: bool) -> dict:
    return {"fns": {"candidate": {"stream_ms": stream_ms}}, "race": {"stopped_early": stopped}}


def test_the_parent_reports_a_candidate_stopped_early_as_not_faster():
    rule = timing_parent.race_rule(1.0)
    record, problem = timing_parent.race_report(_measured(_times(random.Random(8), 1.6, 10), True), rule)
    assert problem is None
    assert record["stopped_early"] and record["rounds"] == 10 and record["decision"] == LOST
    assert record["verdict"] == "not faster than the incumbent (stopped early)"
    assert record["rule"] == rule.describe() and record["interval_ms"][0] > 1.05


def test_a_child_that_stops_without_the_rule_holding_is_a_problem():
    rule = timing_parent.race_rule(1.0)
    record, problem = timing_parent.race_report(_measured(_times(random.Random(9), 1.0, 12), True), rule)
    assert record["decision"] == OPEN and problem is not None and "stopped after 12 of" in problem


def test_an_open_contest_stays_no_significant_difference():
    record, problem = timing_parent.race_report(_measured(_times(random.Random(10), 1.01, 60), False),
                                                timing_parent.race_rule(1.0))
    assert problem is None and record["extended"] and record["verdict"] == stats.NO_DIFFERENCE + " from the incumbent"


def test_calls_that_round_the_plan_up_to_whole_bursts_are_not_an_extension():
    """30 planned calls in bursts of 8 run as 32: the race took no extra call (attention on the H100 read
    "extended" for every tie before); a fifth burst is one."""
    rule = timing_parent.race_rule(1.0)
    for calls, extended in ((32, False), (40, True)):
        record, _ = timing_parent.race_report(_measured(_times(random.Random(11), 1.0, calls), False), rule,
                                              reps=30, burst=8)
        assert record["planned_reps"] == 32 and record["extended"] is extended


def test_no_incumbent_means_no_race():
    assert timing_parent.race_rule(None) is None


@pytest.mark.parametrize("bad", [0.0, -1.0, float("inf")])
def test_check_options_refuse_a_meaningless_incumbent_time(bad):
    with pytest.raises(ValueError, match="incumbent"):
        CheckOptions(incumbent_ms=bad)


def test_extra_calls_only_as_far_as_their_outputs_can_be_kept_for_sampling():
    """A close contest gets EXTRA_REPS more calls, fewer where the outputs of them all would not fit in what a child
    may keep for the parent to sample after its exclusive turn; where even the planned calls do not fit (sampled
    inside the turn anyway) the extra calls cost only their own time and stay."""
    reps, extra, keep = timing_parent.REPS, timing_parent.EXTRA_REPS, 1 << 30
    assert timing_parent.extra_reps(1 << 20, keep) == extra
    assert timing_parent.extra_reps(keep // (reps + 10), keep) == 10
    assert timing_parent.extra_reps(keep // reps, keep) == 0
    assert timing_parent.extra_reps(keep // reps + 1, keep) == extra
    assert timing_parent.extra_reps(0, keep) == extra
    assert timing_parent.extra_reps(keep // 25, keep, reps=22) == 3


def test_timed_calls_cut_to_what_can_be_kept_for_sampling_after_the_turn():
    """A candidate whose REPS outputs would not fit in what its child may keep gets as many timed calls as do fit
    (SwiGLU's 470 MB output beside an 80 GB GPU's eighth: 22), so its samples are still picked after the exclusive
    turn; below MIN_DEFERRED_REPS it keeps REPS and is sampled inside the turn."""
    reps, least = timing_parent.REPS, timing_parent.MIN_DEFERRED_REPS
    keep = (81559 << 20) // 8
    assert timing_parent.timed_reps(16384 * 14336 * 2, keep) == 22
    assert timing_parent.timed_reps(4 * 4 * 32 * 4096 * 128 * 2, keep) == 19  # attention fwd+bwd: o, dq, dk, dv
    assert timing_parent.timed_reps(keep // reps, keep) == reps
    assert timing_parent.timed_reps(keep // least, keep) == least
    assert timing_parent.timed_reps(keep // least + 1, keep) == reps
    assert timing_parent.timed_reps(0, keep) == reps
