"""The timing stage samples the candidate's timed outputs after its measurement: the child keeps them on the device,
the parent picks the calls to check only once the exclusive turn is over, and what comes back must be the calls asked
for, on the input sets they were given, unchanged since their call returned."""
import contextlib
import random
import threading
import types
from pathlib import Path

import pytest
import torch

from profiler.device_memory import fingerprint
from sandbox import timing_child, timing_parent
from sandbox.task import load_task

N_SETS, WARM = 35, timing_parent.WARMUP


class _Stop(Exception):
    pass


def _outputs(call: int) -> torch.Tensor:
    return torch.full((4, 8), float(call + 1))


def _measured(calls: int = timing_parent.REPS) -> dict:
    return {"fns": {"candidate": {"ms": [0.1] * calls}},
            "fingerprints": [{"call": i, "input_set": (WARM + i) % N_SETS, "at_return": fingerprint(_outputs(i))}
                             for i in range(calls)]}


class _Child:
    """A fake harness: the candidate's process answers `time` and `samples`, and every request and gate turn is
    logged."""

    def __init__(self, kept=None, send=None, changed=(), input_set=None, n_sets=None, set_of=None):
        self.events: list[str] = []
        self.kept = list(range(timing_parent.REPS)) if kept is None else kept
        self.send, self.changed, self.input_set = send, set(changed), input_set
        self.n_sets, self.set_of = n_sets, set_of or (lambda call: (WARM + call) % self.n_sets)
        self.asked: list[int] = []
        self.time_msg: dict = {}

    def _request(self, run, stage, msg, max_bytes=1 << 30, exclusive=False):
        self.events.append(f"child: {msg['op']}" + (" (the GPU alone)" if exclusive else ""))
        if msg["op"] == "prepare_timing":
            return {"ok": True, "laps": {"child_sets_s": 0.1}}
        if msg["op"] == "time":
            self.time_msg = msg
            if self.n_sets is None:  # as many as the child counts for the message, as a real one does
                self.n_sets = timing_child.set_count_for([torch.zeros(4)], msg)
            return {"ok": True, "measured": _measured(), "n_sets": self.n_sets, "kernels": [], "environment": {},
                    "baselines": {}, "kept_calls": self.kept}
        self.asked = list(msg["calls"])
        calls = self.send if self.send is not None else self.asked
        self.buffers = msg.get("out_buffers")
        samples = [{"call": c, "input_set": self.input_set if self.input_set is not None else self.set_of(c),
                    "outputs": [_outputs(c) + (1.0 if c in self.changed else 0.0)]} for c in calls]
        if self.buffers:  # lent buffers (the fake lending hands the child the parent's own tensors): written in place
            for j, sample in enumerate(samples):
                self.buffers[j].copy_(sample["outputs"][0])
                sample["outputs"] = [{"__gpu_buffer__": j}]
        return {"ok": True, "samples": samples}

    @contextlib.contextmanager
    def _gpu(self, run, exclusive=False, work=""):
        self.events.append("gate: alone" if exclusive else "gate: shared")
        yield

    @contextlib.contextmanager
    def timing_turn(self):  # the gate's, as run.options.gate
        self.events.append("timing turn taken")
        yield 0.25
        self.events.append("timing turn given back")


def _measure(child: _Child, out_bytes: int = 4 * 8 * 4, monkeypatch=None, seed: int = 0, run_on=None,
             complete: bool = False):
    """Runs timing_parent.measure up to the validation against the reference; returns the problems found before
    (`complete`: to the end, with the caller's stand-ins; returns the report)."""
    def validate(run, reference, base, measured, n_sets, asked):
        child.events.append("validate against the reference")
        raise _Stop(measured)
    if not complete:
        monkeypatch.setattr(timing_parent, "_validate", validate)
    monkeypatch.setattr("profiler.roofline.task_roofline", lambda *a: types.SimpleNamespace(bound="memory"))
    monkeypatch.setattr("profiler.ceilings.get_ceilings", lambda gpu: {})
    task = types.SimpleNamespace(make_inputs=lambda seed, distribution, device: [torch.zeros(4)], path="t.py",
                                 overrides={}, declared_roofline=lambda: None)
    run = types.SimpleNamespace(task=task, device="cpu", rng=random.Random(seed), deadline=0.0, laps={},
                                options=types.SimpleNamespace(gpu=0, timing_mode="auto", baselines=("eager",),
                                                              incumbent_ms=None, gate=child))
    specs = [(torch.Size([4, 8]), torch.float32)] if out_bytes == 4 * 8 * 4 else [(torch.Size([out_bytes]), torch.uint8)]
    reference = types.SimpleNamespace(output_specs=lambda inputs: specs, model=None, model_seed=0)
    if run_on is not None:
        run_on(run)
    problems: list[str] = []
    orig = timing_parent._changed_after_return

    def changed(samples, measured, device):
        out = orig(samples, measured, "cpu")  # where these tests' tensors are, whatever device the run names
        problems.extend(out)
        return out
    monkeypatch.setattr(timing_parent, "_changed_after_return", changed)
    orig_fetch = timing_parent._fetch_samples

    def fetch(*a):
        got, probs = orig_fetch(*a)
        problems.extend(probs)
        return got, probs
    monkeypatch.setattr(timing_parent, "_fetch_samples", fetch)
    if complete:
        return timing_parent.measure(child, run, reference, candidate=True)
    with pytest.raises(_Stop):
        timing_parent.measure(child, run, reference, candidate=True)
    return problems


class _RaisedOom(_Child):
    """A candidate whose timed calls ran out of device memory."""

    def _request(self, run, stage, msg, max_bytes=1 << 30, exclusive=False):
        reply = super()._request(run, stage, msg, max_bytes, exclusive)
        if msg["op"] == "time":
            reply["measured"]["fns"]["candidate"]["error"] = {"type": "OutOfMemoryError", "message": "full"}
        return reply


def _reported(child: _Child, monkeypatch) -> tuple[dict, list[str]]:
    """The whole measurement with `child` (no validation against a reference): its report, and the problems the
    parent found with the samples and counts that go into it."""
    found: list[str] = []

    def build(measured, output_problems, **kw):
        found.extend(output_problems)
        return {"problems": [], "baselines": {}}
    monkeypatch.setattr("profiler.report.build_timing", build)
    monkeypatch.setattr(timing_parent, "_validate", lambda *a: [])
    return _measure(child, monkeypatch=monkeypatch, complete=True), found


def test_the_calls_to_check_are_picked_after_the_exclusive_turn(monkeypatch):
    child = _Child()
    assert _measure(child, monkeypatch=monkeypatch) == []
    assert child.time_msg["defer_samples"] is True
    # the child learns which calls are checked only after its measurement, in a request that shares the GPU
    # a timing turn covers the child's input sets and kept outputs, from building them to releasing them
    assert child.events == ["gate: shared", "timing turn taken", "child: prepare_timing", "child: time (the GPU alone)",
                            "child: samples", "timing turn given back", "gate: shared",
                            "validate against the reference"]
    assert len(child.asked) == timing_parent.PICKED_SAMPLES and set(child.asked) <= set(child.kept)
    assert child.asked == sorted(set(child.asked))


def test_on_a_gpu_the_samples_come_back_into_lent_buffers_not_through_host_memory(monkeypatch):
    """The picked calls' outputs are written by the child into poisoned buffers the parent lends (call j's at j times
    the outputs a call), and read from there: the same checks see the same values."""
    lent: list[list[torch.Tensor]] = []

    class Lending:
        def ship(self, tensors, used):
            lent.append(tensors)
            return tensors, tensors  # the child is handed the parent's tensors themselves
    monkeypatch.setattr(timing_parent, "poisoned", lambda shape, dtype, device: torch.full(shape, float("nan")))
    monkeypatch.setattr(timing_parent, "defer_bytes", lambda device: timing_parent.DEFER_BYTES)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    child = _Child()

    def on_gpu(run):
        run.device, run.lending = "cuda:0", Lending()
    assert _measure(child, monkeypatch=monkeypatch, run_on=on_gpu) == []
    assert len(lent) == 1 and len(lent[0]) == timing_parent.PICKED_SAMPLES and child.buffers is lent[0]
    assert all(torch.equal(b, _outputs(c)) for b, c in zip(lent[0], child.asked))
    child = _Child(changed=range(30))  # the changed values arrive through the buffers too, and are caught
    assert any("changed after the call returned" in p for p in
               _measure(child, monkeypatch=monkeypatch, run_on=on_gpu))


def test_picks_differ_between_checks(monkeypatch):
    picks = set()
    for seed in range(6):
        child = _Child()
        _measure(child, monkeypatch=monkeypatch, seed=seed)
        picks.add(tuple(child.asked))
    assert len(picks) > 1


@pytest.mark.parametrize("child, why", [
    (_Child(send=[0, 1, 2]), "asked for the outputs of timed calls"),
    (_Child(changed=range(30)), "changed after the call returned"),
    (_Child(input_set=0), "not the"),
    (_Child(kept=[]), "kept none of its timed outputs"),
], ids=["other calls", "changed since return", "wrong input set", "nothing kept"])
def test_a_sample_that_is_not_what_was_asked_for_is_a_problem(monkeypatch, child, why):
    problems = _measure(child, monkeypatch=monkeypatch)
    assert any(why in p for p in problems), problems


def _sets_as_planned(monkeypatch, *, warmup: int, burst: int, settle_ms: float, n_sets: int, reps: int) -> list[int]:
    """The input set of each timed call as the child's timing loop gives it: the plan `make_plan` builds (its warm
    rounds; the sets it cycles through once heating calls keep one of their own), walked round by round."""
    from profiler.timing_plan import make_plan
    with monkeypatch.context() as patch:
        patch.setattr(torch.cuda, "is_available", lambda: True)  # make_plan checks only that a GPU is there
        plan = make_plan({"candidate": lambda args: None}, [[k] for k in range(n_sets)], reps=reps, warmup=warmup,
                         burst=burst, settle_ms=settle_ms, watch=None, sample_every=None, graph=False, hold_bytes=0,
                         fresh_inputs=(), tail_tolerance=(1.0, 1.0), cover_ms=0.0, reserve=False, isolate=(),
                         race=None, extra_reps=0)
    cycled = [args[0] for args in plan.input_sets]
    return [cycled[(rnd * plan.burst + j) % len(cycled)]
            for rnd in range(plan.warm_rounds, plan.warm_rounds + plan.timed_rounds) for j in range(plan.burst)]


@pytest.mark.parametrize("warmup", [0, 5])
@pytest.mark.parametrize("burst, settle_ms", [(1, 0.0), (8, 0.0), (10, 100.0), (1, 100.0)])
@pytest.mark.parametrize("n_sets", [1, 2, 21, 35, 64])
def test_the_parent_expects_each_timed_call_on_the_set_the_child_s_plan_gives_it(monkeypatch, warmup, burst,
                                                                                 settle_ms, n_sets):
    from profiler.timing_plan import timed_call_set
    planned = _sets_as_planned(monkeypatch, warmup=warmup, burst=burst, settle_ms=settle_ms, n_sets=n_sets, reps=30)
    assert [timed_call_set(c, warmup=warmup, burst=burst, settle_ms=settle_ms, n_sets=n_sets)
            for c in range(len(planned))] == planned


def test_a_sustained_timing_whose_calls_wrap_around_fewer_sets_is_not_called_inconsistent(monkeypatch):
    """Attention fwd+bwd on an 80 GB GPU: 19 input sets fit, one kept for the heating calls, and 8-call bursts
    after one warm round wrap around the other 18. The honest child's sets pass; the sets of a count that forgets
    the heating calls' own set (timed call 14 on set 3, not 4) are a problem."""
    monkeypatch.setattr(timing_parent, "pacing", lambda mode, bound, out_bytes: (8, 100.0))
    monkeypatch.setattr(timing_parent, "set_budget", lambda gpu_bytes: 19 * 4 * 4)  # 19 of the fake's input sets
    planned = _sets_as_planned(monkeypatch, warmup=WARM, burst=8, settle_ms=100.0, n_sets=19, reps=timing_parent.REPS)
    assert planned[14] == 4 and planned[12] == 2
    honest = _Child(n_sets=19, set_of=lambda call: planned[call])
    assert _measure(honest, monkeypatch=monkeypatch) == []
    miscounted = _Child(kept=list(range(10, 30)), n_sets=19, set_of=lambda call: (8 + call) % 19)
    assert any("not the" in p for p in _measure(miscounted, monkeypatch=monkeypatch))


def test_a_child_that_reports_another_count_of_input_sets_is_not_believed(monkeypatch):
    """The parent counts the input sets itself: a count of the child's choosing would move the set each timed call
    is expected on (a cached warm-up result passing for a timed call's)."""
    _, problems = _reported(_Child(n_sets=N_SETS + 1), monkeypatch)
    assert problems == [f"the candidate's process reported {N_SETS + 1} input sets where the timing asked for {N_SETS}"]
    assert _reported(_Child(), monkeypatch)[1] == []


def test_a_sample_taken_during_the_measurement_must_be_on_the_set_its_call_was_given():
    """Outputs too big to keep are sampled inside the turn, each with the input set the child says it used: the
    parent checks that set against the one the call was given before it compares the outputs on it."""
    compared = []

    def run_reference(inputs):
        compared.append(inputs)
        raise _Stop

    run = types.SimpleNamespace(task=types.SimpleNamespace(meta=types.SimpleNamespace(fixed_inputs=())))
    reference = types.SimpleNamespace(run=run_reference)
    asked = {"warmup": WARM, "burst": 10, "settle_ms": 100.0}
    base = [[torch.zeros(4)], [torch.ones(4)]]
    wrong = {"samples": [{"call": 14, "input_set": 3, "outputs": [torch.zeros(4)]}]}
    assert timing_parent._validate(run, reference, base, wrong, 21, asked) == [
        "timed call 14 reported input set 3, not the 4 it was given"]
    assert compared == []
    with pytest.raises(_Stop):  # the set it was given: on to the comparison
        timing_parent._validate(run, reference, base, {"samples": [{**wrong["samples"][0], "input_set": 4}]}, 21,
                                asked)
    assert len(compared) == 1


def test_outputs_too_big_to_keep_are_sampled_during_the_measurement(monkeypatch):
    child = _Child()
    big = timing_parent.DEFER_BYTES // (timing_parent.MIN_DEFERRED_REPS - 1)
    problems = _measure(child, out_bytes=big, monkeypatch=monkeypatch)
    assert child.time_msg["defer_samples"] is False and problems == []
    assert child.time_msg["reps"] == timing_parent.REPS
    assert "child: samples" not in child.events


def test_outputs_a_little_too_big_for_every_call_get_fewer_calls_still_sampled_after_the_turn(monkeypatch):
    """Where REPS outputs would not fit in what the child keeps but MIN_DEFERRED_REPS or more do, the candidate gets
    as many timed calls as fit, and the parent still picks its samples after the exclusive turn."""
    child = _Child(kept=list(range(25)))
    problems = _measure(child, out_bytes=timing_parent.DEFER_BYTES // 25, monkeypatch=monkeypatch)
    assert child.time_msg["reps"] == 25 and child.time_msg["defer_samples"] is True and problems == []
    assert child.events.index("child: samples") > child.events.index("child: time (the GPU alone)")


def test_a_print_match_tolerates_summation_order_only():
    x = torch.randn(1000, dtype=torch.float32)
    fp = fingerprint(x)
    assert timing_parent._matches_print([x.flip(0)], fp, "cpu")
    y = x.clone()
    y[17] += 1e-3
    assert not timing_parent._matches_print([y], fp, "cpu")
    assert not timing_parent._matches_print([x, x], fp, "cpu")


def test_at_most_two_timings_hold_their_input_sets_at_once():
    import threading
    import time

    from sandbox.gate import TIMING_TURNS, GpuGate

    gate, inside, most, lock = GpuGate(), [0], [0], threading.Lock()

    def timing():
        with gate.timing_turn():
            with lock:
                inside[0] += 1
                most[0] = max(most[0], inside[0])
            time.sleep(0.02)
            with lock:
                inside[0] -= 1
    threads = [threading.Thread(target=timing) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert TIMING_TURNS == 2 and most[0] == TIMING_TURNS


def test_the_kept_outputs_budget_grows_with_the_gpu(monkeypatch):
    assert timing_parent.defer_bytes("cpu") == timing_parent.DEFER_BYTES
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d: types.SimpleNamespace(total_memory=141 << 30))
    assert timing_parent.defer_bytes("cuda:0") == (141 << 30) // 8
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d: types.SimpleNamespace(total_memory=24 << 30))
    assert timing_parent.defer_bytes("cuda:0") == timing_parent.DEFER_BYTES


def test_the_input_sets_take_an_eighth_of_the_gpu_at_most():
    """A timing's input sets take what the parent allows for its GPU: an eighth of it, at most SET_BUDGET_BYTES;
    the child makes as many sets as fit (never fewer than two), so a gigabyte task gets fewer sets on a smaller GPU
    rather than running the other checks out of memory."""
    from sandbox import timing_child
    gib = 1 << 30
    assert timing_child.set_budget(int(139.8 * gib)) == int(139.8 * gib) // 8
    assert timing_child.set_budget(1 << 40) == timing_child.SET_BUDGET_BYTES
    assert timing_child.set_budget(0) == timing_child.SET_BUDGET_BYTES  # not on a GPU: the old budget
    swiglu = [torch.empty(16384 * 14336 * 2, dtype=torch.uint8, device="meta")] * 2  # two bf16 inputs, 0.875 GiB
    assert timing_child.set_count(swiglu, 66, timing_child.set_budget(int(139.8 * gib))) == 19
    assert timing_child.set_count(swiglu, 66, timing_child.set_budget(int(79.2 * gib))) == 11
    assert timing_child.set_count(swiglu, 66) == 27
    assert timing_child.set_count(swiglu, 66, 1) == 2
    assert timing_parent.gpu_bytes("cpu") == 0  # the parent sends its GPU's budget; off the GPU, the old one


def test_inputs_drawn_from_a_seed_do_not_depend_on_other_threads():
    """The parent rebuilds a timing's input sets from the seeds it sent the candidate's process; with several checks
    on threads, one check's seed must not be drawn from by another (every honest candidate rejected at random)."""
    root = Path(__file__).resolve().parent
    task = load_task(root / "tasks" / "row_mean.py")
    norm = load_task(root.parent / "tasks" / "rmsnorm_fwd.py")
    seeds = list(range(8))
    want = {s: task.make_inputs(s, "normal")[0] for s in seeds}
    weights = {s: norm.make_reference(s, "cpu").weight.detach().clone() for s in seeds}
    wrong: list[int] = []

    def draw(s: int) -> None:
        for _ in range(200):
            if not torch.equal(task.make_inputs(s, "normal")[0], want[s]):
                wrong.append(s)
            if not torch.equal(norm.make_reference(s, "cpu").weight, weights[s]):
                wrong.append(-s - 1)

    threads = [threading.Thread(target=draw, args=(s,)) for s in seeds]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not wrong


def test_a_raced_timing_takes_no_more_extra_calls_than_can_be_kept(monkeypatch):
    """Raced against an incumbent, a task whose outputs are large gets only the extra calls whose outputs still fit
    in what the child keeps, so its samples are still fetched after the exclusive turn, not copied inside it."""
    child = _Child()

    def raced(run):
        run.options.incumbent_ms = 1.0
    _measure(child, out_bytes=timing_parent.DEFER_BYTES // (timing_parent.REPS + 10), monkeypatch=monkeypatch,
             run_on=raced)
    assert child.time_msg["extra_reps"] == 10 and child.time_msg["defer_samples"] is True
    assert "child: samples" in child.events


def test_a_candidate_that_raised_while_timed_is_judged_on_its_error_not_on_the_outputs_it_could_not_keep(monkeypatch):
    """A timed call that raised (out of memory on a GPU the other checks filled, say) leaves no outputs kept: the
    error is the finding and goes into the report by type, so the stage can put a full GPU down to the harness
    (tests/test_oom_blame.py), not "kept none of its outputs"."""
    child = _RaisedOom(kept=[])
    report, problems = _reported(child, monkeypatch)
    assert problems == [] and "child: samples" not in child.events
    assert report["candidate_error"] == "OutOfMemoryError"
    _, problems = _reported(_Child(kept=[]), monkeypatch)  # without an error, keeping nothing is still a problem
    assert problems == ["the candidate's process kept none of its timed outputs for the parent to check"]
