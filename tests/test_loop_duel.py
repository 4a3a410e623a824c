"""A new best on a GPU is crowned only by a duel: challenger and incumbent re-timed back to back (agent/search/duel.py).

The evaluator here reports what the harness's timing stage does (30 interleaved rounds of the kernel and eager, with
a bootstrap interval), for two kernels whose true speeds the test sets, plus a drift the test applies to one check:
on the H200 a tuner variant read 10.40x against the seed's 10.04x from drift alone.
"""
import random
import threading

import pytest

from agent.archive.records import DuelOutcome

from agent.archive.store import Archive
from agent.search.duel import LEGS
from agent.search.loop import EventKind, RunConfig, run_search
from agent.search.proposing import rank
from profiler import stats
from sandbox.records import CheckResult, Reason, Stage, StageResult, Verdict
from tests.test_loop import GOOD, TASK

EAGER_MS = 10.0
FINAL = ("eager", "compile", "liger", "vendor")


@pytest.fixture
def task(tmp_path):
    path = tmp_path / "scale.py"
    path.write_text(TASK)
    return path


@pytest.fixture
def kernel(tmp_path):
    path = tmp_path / "start.py"
    path.write_text(GOOD)
    return path


@pytest.fixture
def gpu(monkeypatch):
    """The loop believes it has one GPU; the evaluator below stands in for the harness on it."""
    import agent.search.loop as loop_mod
    import torch
    monkeypatch.setattr(loop_mod, "_device", lambda device: "cuda")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)


def clocked(ms: dict[str, float], drift=lambda kind, baselines: 1.0, on_check=None):
    """An evaluator class: `ms` is each kernel's true time ("seed" for the starting kernel, "variant" for the
    tuner's); `drift(kind, baselines)` scales the kernel's rounds in one check (eager's stay put); every check is
    logged as (kind, baselines) in `log`."""
    log: list[tuple[str, tuple | None]] = []
    retimed: list[bool] = []  # each check's retime flag, in `log`'s order

    class Clocked:
        def __init__(self, *args):
            pass

        def check(self, path, baselines=None, incumbent_ms=None, retime=False):
            kind = "seed" if path.read_text() == GOOD else "variant"
            log.append((kind, baselines))
            retimed.append(retime)
            if on_check is not None:
                on_check(kind, baselines, len(log))
            rng = random.Random(len(log))
            mine = [ms[kind] * drift(kind, baselines) * (1 + 0.004 * rng.gauss(0, 1)) for _ in range(30)]
            eager = [EAGER_MS * (1 + 0.004 * rng.gauss(0, 1)) for _ in range(30)]
            c = stats.compare(mine, eager)
            timing = {"candidate_ms": stats.median(mine), "rounds_ms": {"candidate": mine, "eager": eager},
                      "baselines": {"eager": {"ms": stats.median(eager), "speedup": c.speedup, "ci_low": c.ci_low,
                                              "ci_high": c.ci_high, "significant": c.significant}},
                      "roofline": {"pct_of_roofline": 50.0, "bound": "memory"}}
            return CheckResult(task="t", candidate=str(path), device="cuda", verdict=Verdict.ACCEPTED,
                               stage=Stage.TIMING, reason=Reason.OK, message="ok",
                               stages=(StageResult(Stage.TIMING, True, Reason.OK),), seconds=0.01, timed=True,
                               timing=timing, environment={"gpu": "clocked"})

        def close(self):
            pass

    Clocked.log, Clocked.retimed = log, retimed
    return Clocked


def own_check_drift(kind, baselines):
    """The variant's own check ran on a faster moment of the GPU; nothing else did."""
    return 0.965 if kind == "variant" and baselines is None else 1.0


def by_kind(archive, run_id):
    seed, variant = archive.candidates(run_id=run_id)
    assert seed.origin == "seed" and variant.origin == "tuner"
    return seed, variant


def test_a_drift_in_its_own_check_does_not_crown_a_challenger(tmp_path, task, kernel, gpu):
    ev, events = clocked({"seed": 1.0, "variant": 1.0}, own_check_drift), []
    with Archive(tmp_path / "a.db") as archive:
        s = run_search(RunConfig(task_path=task, budget=1, device="cuda", start_from=kernel), archive,
                       evaluator_factory=ev, on_event=events.append)
        seed, variant = by_kind(archive, s.run_id)
        assert variant.timings.eager_ci_low > seed.timings.speedup_eager and rank(variant) > rank(seed)
        (duel,) = archive.duels(run_id=s.run_id)
        assert duel.challenger_id == variant.id and duel.incumbent_id == seed.id
        assert duel.outcome is DuelOutcome.NO_DIFFERENCE and not duel.crowned
        assert duel.ci_low <= 1.0 <= duel.ci_high and duel.n_pairs == 60
        assert tuple(leg.side for leg in duel.legs) == LEGS and all(len(leg.rounds) == 30 for leg in duel.legs)
        assert s.best.id == seed.id and s.best_path.read_text() == GOOD
        # the duel's four checks spent time, not budget; they ran back to back, challenger first
        assert s.progress.proposals == 1
        assert ev.log == [("seed", None), ("variant", None), ("variant", ("eager",)), ("seed", ("eager",)),
                          ("variant", ("eager",)), ("seed", ("eager",)), ("seed", FINAL)]
        assert s.final.candidate_id == seed.id  # the final re-check is of the paired winner, not the top rank
        duel_events = [e for e in events if e.kind is EventKind.DUEL]
        assert len(duel_events) == 1 and duel_events[0].message == (
            f"#{variant.id} vs #{seed.id}: {duel.speedup:.3f}x [{duel.ci_low:.2f}, {duel.ci_high:.2f}], "
            f"no significant difference, #{seed.id} stays best")
        assert [e.candidate.id for e in events if e.kind is EventKind.NEW_BEST] == [seed.id]
        # a resumed run keeps the paired winner: the uncrowned challenger does not become best by its rank
        again = run_search(RunConfig(task_path=task, budget=1, device="cuda", resume="latest"), archive,
                           evaluator_factory=ev)
        assert again.best.id == seed.id and ev.log[-1] == ("seed", FINAL)


def test_a_faster_challenger_is_crowned_after_the_duel(tmp_path, task, kernel, gpu):
    ev, events = clocked({"seed": 1.0, "variant": 0.9}), []
    with Archive(tmp_path / "a.db") as archive:
        s = run_search(RunConfig(task_path=task, budget=1, device="cuda", start_from=kernel), archive,
                       evaluator_factory=ev, on_event=events.append)
        seed, variant = by_kind(archive, s.run_id)
        (duel,) = archive.duels(candidate_id=variant.id)
        assert duel.outcome is DuelOutcome.CROWNED and duel.ci_low > 1.0
        assert duel.speedup == pytest.approx(1 / 0.9, rel=0.01)
        assert s.best.id == variant.id and s.final.candidate_id == variant.id and ev.log[-1] == ("variant", FINAL)
        kinds = [e.kind for e in events]
        crowned = kinds.index(EventKind.DUEL)
        assert kinds[crowned + 1] is EventKind.NEW_BEST and events[crowned + 1].candidate.id == variant.id
        assert events[crowned].message.endswith(f"faster, #{variant.id} is the new best")


def test_live_progress_counts_the_duels_running_check(tmp_path, task, kernel, gpu):
    """While a leg runs, nothing else is in flight (budget spent, one GPU): the live line says 1, not 0, and not one
    per leg; once the duel is decided it says 0 again."""
    ev, events = clocked({"seed": 1.0, "variant": 0.9}), []
    with Archive(tmp_path / "a.db") as archive:
        run_search(RunConfig(task_path=task, budget=1, device="cuda", start_from=kernel), archive,
                   evaluator_factory=ev, on_event=events.append)
    (started,) = [e for e in events if e.kind is EventKind.NOTE and "re-timing both back to back" in e.message]
    (decided,) = [e for e in events if e.kind is EventKind.DUEL]
    assert started.progress.in_flight == 1 and decided.progress.in_flight == 0
    assert ev.log[2:6] == [(kind, ("eager",)) for kind in ("variant", "seed", "variant", "seed")]
    # The legs re-time two verified sources: only they skip the stages their own checks passed; the final re-check
    # of the winner runs every stage again.
    assert ev.retimed == [False, False, True, True, True, True, False]


def test_a_challenger_inside_the_incumbents_noise_is_not_retimed(tmp_path, task, kernel, gpu):
    ev, events = clocked({"seed": 1.0, "variant": 1.0}, lambda kind, b: 0.997 if kind == "variant" else 1.0), []
    with Archive(tmp_path / "a.db") as archive:
        s = run_search(RunConfig(task_path=task, budget=1, device="cuda", start_from=kernel), archive,
                       evaluator_factory=ev, on_event=events.append)
        seed, variant = by_kind(archive, s.run_id)
        assert rank(variant) > rank(seed) and variant.timings.eager_ci_low <= seed.timings.speedup_eager
        (duel,) = archive.duels(run_id=s.run_id)
        assert duel.outcome is DuelOutcome.WITHIN_NOISE and duel.legs == () and duel.speedup is None
        assert [k for k, b in ev.log] == ["seed", "variant", "seed"]  # no duel checks; the final one of the seed
        assert s.best.id == seed.id
        assert any(e.kind is EventKind.DUEL and f"#{seed.id} stays best" in e.message for e in events)


def test_a_duel_s_re_times_of_the_incumbent_raise_the_bar_for_later_challengers(tmp_path, task, kernel, gpu):
    """The seed's own check read it 3.5% slow; two honest variants as fast as the seed each clear that reading. The
    first is duelled (no difference); its two re-times of the seed put the seed's standing at its true speed, which
    the second variant's lower bound does not clear: it is not re-timed."""
    slow_seed = lambda kind, baselines: 1.035 if kind == "seed" and baselines is None else 1.0  # noqa: E731
    ev, events = clocked({"seed": 1.0, "variant": 1.0}, slow_seed), []
    with Archive(tmp_path / "a.db") as archive:
        s = run_search(RunConfig(task_path=task, budget=2, device="cuda", start_from=kernel), archive,
                       evaluator_factory=ev, on_event=events.append)
        seed, *variants = archive.candidates(run_id=s.run_id)
        assert len(variants) == 2 and all(v.timings.eager_ci_low > seed.timings.speedup_eager for v in variants)
        fought, spared = archive.duels(run_id=s.run_id)
        assert fought.outcome is DuelOutcome.NO_DIFFERENCE and len(fought.legs) == 4
        assert spared.outcome is DuelOutcome.WITHIN_NOISE and spared.legs == ()
        assert "(the median of its own check and 2 re-times)" in spared.note
        assert [b for k, b in ev.log].count(("eager",)) == 4  # one duel's legs, not two
        assert s.best.id == seed.id


def test_an_untimed_cpu_run_never_duels(tmp_path, task, kernel):
    """On the CPU nothing is timed, so nothing changes: even an evaluator that reports timings starts no duel."""
    ev, events = clocked({"seed": 1.0, "variant": 1.0}, own_check_drift), []
    with Archive(tmp_path / "a.db") as archive:
        s = run_search(RunConfig(task_path=task, budget=1, device="cpu", start_from=kernel), archive,
                       evaluator_factory=ev, on_event=events.append)
        seed, variant = by_kind(archive, s.run_id)
        assert ev.log == [("seed", None), ("variant", None)]
        assert archive.duels() == [] and s.duels == ()
        assert not any(e.kind is EventKind.DUEL for e in events)
        assert s.best.id == variant.id  # ranked as it always was


def test_a_stop_during_a_duel_records_both_and_ends(tmp_path, task, kernel, gpu):
    stop, release = threading.Event(), threading.Event()

    def hang_in_the_second_leg(kind, baselines, n):
        if n == 4:  # seed, variant, the challenger's leg, then the incumbent's leg hangs
            stop.set()
            release.wait(30)

    ev, events = clocked({"seed": 1.0, "variant": 1.0}, own_check_drift, hang_in_the_second_leg), []
    try:
        with Archive(tmp_path / "a.db") as archive:
            s = run_search(RunConfig(task_path=task, budget=1, device="cuda", start_from=kernel), archive,
                           evaluator_factory=ev, on_event=events.append, stop=stop)
            assert s.stop_reason == "interrupted" and archive.get_run(s.run_id).stop_reason == "interrupted"
            seed, variant = by_kind(archive, s.run_id)
            assert seed.accepted and variant.accepted
            (duel,) = archive.duels(run_id=s.run_id)
            assert duel.outcome is DuelOutcome.INTERRUPTED and duel.challenger_id == variant.id
            assert [leg.side for leg in duel.legs] == ["challenger"] and duel.legs[0].verdict == "accepted"
            assert s.best.id == seed.id and s.final is None
            assert any(e.kind is EventKind.DUEL and "interrupted" in e.message for e in events)
            assert events[-1].kind is EventKind.FINISHED
    finally:
        release.set()


def test_a_leg_the_harness_fails_keeps_the_incumbent(tmp_path, task, kernel, gpu):
    def broken_incumbent_leg(kind, baselines, n):
        if n == 4:
            raise RuntimeError("the child died")

    ev = clocked({"seed": 1.0, "variant": 0.9}, on_check=broken_incumbent_leg)
    with Archive(tmp_path / "a.db") as archive:
        s = run_search(RunConfig(task_path=task, budget=1, device="cuda", start_from=kernel), archive,
                       evaluator_factory=ev)
        seed, variant = by_kind(archive, s.run_id)
        (duel,) = archive.duels(run_id=s.run_id)
        assert duel.outcome is DuelOutcome.FAILED and "harness_error" in duel.note and len(duel.legs) == 2
        assert s.best.id == seed.id and s.final.candidate_id == seed.id
        assert len(ev.log) == 5  # no leg after the failed one; then the final re-check


@pytest.mark.parametrize("slow_check, legs", [(2, []), (3, ["challenger"])],
                         ids=["limit passed before the duel", "limit passed during its first leg"])
def test_past_the_time_limit_no_duel_starts_and_none_goes_on(tmp_path, task, kernel, gpu, slow_check, legs):
    """A run keeps to its --time-limit: a challenger queued when it passes is archived unfought, and a duel in
    flight ends with the legs it has (neither crowns); the best is then checked once more, as at any end."""
    import time

    def slow(kind, baselines, n):
        if n == slow_check:
            time.sleep(1.2)

    ev = clocked({"seed": 1.0, "variant": 0.9}, on_check=slow)
    with Archive(tmp_path / "a.db") as archive:
        s = run_search(RunConfig(task_path=task, budget=1, device="cuda", start_from=kernel, time_limit_s=1.0),
                       archive, evaluator_factory=ev)
        seed, variant = by_kind(archive, s.run_id)
        (duel,) = archive.duels(run_id=s.run_id)
        assert duel.outcome is DuelOutcome.INTERRUPTED and not duel.crowned
        assert [leg.side for leg in duel.legs] == legs
        assert s.best.id == seed.id and s.final.candidate_id == seed.id
        assert ev.log == [("seed", None), ("variant", None)] + [("variant", ("eager",))] * len(legs) + \
            [("seed", FINAL)]
