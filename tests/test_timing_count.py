"""profiler.counting (raw events of each burst -> each call's time) and the timing stage's choice of burst:
pure arithmetic, checked on the CPU with event times as an honest call, a side-stream cheat and a host-bound call
would leave them."""
import pytest

from profiler import counting
from sandbox.timing_parent import BURST, SETTLE_MS, pacing

FLUSH = 0.07  # device ms of one flush pass between two calls of a burst
CAL = {"null_tail_ms": 0.010, "null_wall_ms": 0.30, "null_stream_ms": 0.002, "null_gap_ms": FLUSH + 0.002}


def burst(stream, *, hidden=(), tail=0.010, host=0.02, ks=None):
    """A burst's raw record: honest gaps are the flush plus the call; `hidden` adds device time between calls."""
    hidden = list(hidden) + [0.0] * len(stream)
    gaps = [FLUSH + 0.002 + s + hidden[j] for j, s in enumerate(stream[1:])]
    wall = sum(stream) + FLUSH * len(stream) + 0.3
    return {"stream_ms": list(stream), "gap_ms": gaps, "tail_ms": tail, "wall_ms": wall,
            "host_ms": [host] * len(stream), "input_set": ks or list(range(len(stream)))}


def counted(bursts):
    return counting.count(bursts, CAL, first_cover_ms=0.5, flush_ms=FLUSH)


def test_honest_bursts_count_their_stream_time_and_flag_nothing():
    p = counted([burst([1.0, 0.98, 0.97, 0.97]), burst([1.01, 0.97, 0.97, 0.96])])
    assert p["ms"] == pytest.approx([1.0, 0.98, 0.97, 0.97, 1.01, 0.97, 0.97, 0.96], abs=1e-9)
    assert p["flagged"] == [] and not p["inconsistent"] and p["host_bound"] == 0
    assert p["gap_ms"][0] is None and p["gap_ms"][4] is None and len(p["input_set"]) == 8


def test_single_call_bursts_are_the_isolated_timer():
    p = counted([burst([0.5]), burst([0.52], tail=0.2)])
    assert p["ms"][0] == 0.5
    assert p["ms"][1] == pytest.approx(0.52 + 0.19)  # the tail beyond an empty call's is counted
    assert [f["why"] for f in p["flagged"]] == ["tail"]


def test_work_hidden_between_calls_is_counted_and_flagged():
    # a side stream ran 0.3 ms of work during the flush before calls 1 and 2: the gaps grew, the stream times did not
    p = counted([burst([0.2, 0.2, 0.2], hidden=[0.3, 0.3])])
    assert p["ms"] == pytest.approx([0.2, 0.5, 0.5])
    assert [(f["call"], f["why"]) for f in p["flagged"]] == [(1, "gap"), (2, "gap")]


def test_a_bursts_tail_is_spread_over_its_calls_and_flags_them_all():
    p = counted([burst([0.1, 0.1, 0.1, 0.1], tail=0.810)])  # 0.8 ms of work still running after the burst
    assert p["ms"] == pytest.approx([0.3] * 4)
    assert sorted(f["call"] for f in p["flagged"] if f["why"] == "tail") == [0, 1, 2, 3]
    assert p["inconsistent"]  # every call of the only burst is flagged: the times are not a result


def test_noise_below_the_tolerance_is_neither_counted_as_a_flag_nor_lost():
    p = counted([burst([1.0, 1.0], hidden=[0.01])])  # 10 us of flush jitter on a 1 ms call
    assert p["flagged"] == []
    assert p["ms"] == pytest.approx([1.0, 1.01])


def test_host_bound_calls_are_counted_against_the_work_queued_ahead_of_them():
    p = counted([burst([0.05, 0.05, 0.05], host=0.3)])  # launches slower than the 0.5 ms cover and than each call
    assert p["host_bound"] == 2  # the first call had the cover; the later ones only the call and flush before them


def test_wall_time_the_events_cannot_explain_is_flagged():
    b = burst([0.2, 0.2])
    b["wall_ms"] += 5.0
    assert {f["why"] for f in counted([b])["flagged"]} == {"wall"}


def test_calibration_takes_medians_of_empty_bursts():
    nulls = [burst([0.002, 0.002], tail=t) for t in (0.01, 0.02, 0.50)]
    cal = counting.calibrate(nulls)
    assert cal["null_tail_ms"] == 0.02 and cal["null_gap_ms"] == pytest.approx(FLUSH + 0.004)
    assert counting.calibrate([])["null_gap_ms"] == 0.0


@pytest.mark.parametrize("mode,bound,out_bytes,burst_,settle", [
    ("auto", "compute", 128 << 20, BURST, SETTLE_MS), ("auto", "memory", 128 << 20, 1, 0.0),
    ("auto", "unknown", 1, 1, 0.0), ("isolated", "compute", 1, 1, 0.0), ("sustained", "memory", 1, BURST, SETTLE_MS),
    ("sustained", "compute", 2 << 30, 2, SETTLE_MS),  # the outputs one burst holds: at most 4 GiB
    ("sustained", "compute", 64 << 30, 1, SETTLE_MS),
])
def test_pacing_follows_the_mode_the_bound_and_the_output_size(mode, bound, out_bytes, burst_, settle):
    assert pacing(mode, bound, out_bytes) == (burst_, settle)


def test_unknown_mode_is_one_sentence():
    with pytest.raises(ValueError, match="unknown timing mode 'fast'; use one of auto, isolated, sustained"):
        pacing("fast", "compute", 1)


def test_heating_that_matches_the_timed_calls_flags_nothing():
    b = burst([1.0, 1.0, 1.0])
    b.update(heat_calls=50, heat_ms=50 * 1.02)
    assert counted([b])["flagged"] == []


@pytest.mark.parametrize("per_call", [0.1, 5.0])  # heating calls skipped the work / idled the GPU to cool it
def test_heating_unlike_the_timed_calls_flags_the_burst(per_call):
    b = burst([1.0, 1.0, 1.0])
    b.update(heat_calls=50, heat_ms=50 * per_call)
    p = counted([b])
    assert {f["why"] for f in p["flagged"]} == {"heat"} and p["inconsistent"]
    assert p["ms"] == pytest.approx([1.0, 1.0, 1.0])  # flagged, not re-counted: the report refuses the time
