"""The timing stage's trusted half: asks the candidate's process to time itself against the baselines
(sandbox.timing_child), then validates what came back and builds the report (profiler.report).

Three requests, of which only the second holds the GPU alone: `prepare_timing` (the child builds its input sets and
baselines, and calls each baseline once, so what it pays once a process, cuDNN's plans or torch.compile compiling, is
paid outside the exclusive turn), `time` (the measurement; the candidate's timed outputs stay on the device where
they fit in `defer_bytes`), then `samples`: PICKED_SAMPLES timed calls, picked at random only now, are copied back,
so the candidate cannot know which of its calls are checked and no copy happens inside the exclusive turn. Outputs
too big to keep are sampled during the measurement instead (every `sample_every`-th call and the last).

What the parent checks: the sampled outputs of timed calls against the reference on the same derived input set
(a cache or a warm-up-only fast path returns the wrong values there); the report's own problems (timer tampering,
outputs that changed after their call returned, event time that missed work, a time under the roofline).

With an incumbent's time to beat (CheckOptions.incumbent_ms) the rounds race it (profiler.stats.RaceRule): the child
stops timing a candidate whose interval lies above the incumbent's band, and times a contest still open after REPS
calls, its interval across an edge of the band, for up to EXTRA_REPS more (fewer where their outputs could not all
be kept for sampling: `extra_reps`). The parent repeats the rule on the returned times; the report's `race` says
the rule, the rounds used, whether timing stopped early, and the verdict, which for a candidate stopped early is "not
faster than the incumbent" (its median over the rounds it ran stays in `candidate_ms`, never a speedup it did not
earn).
A child that stopped without the rule holding is a timing problem.
"""
from __future__ import annotations

import math
import random
import time
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Iterator

import torch

from profiler import stats
from profiler.timing_plan import timed_call_set

from . import cudaipc, tolerance
from .handback import claim, poisoned
from .records import GPU_FULL, Reason, Rejected, Stage
from .reference import RUNS, spec_bytes
from .timing_child import derive, set_budget, set_count_for

if TYPE_CHECKING:
    from .harness import Harness, _Run
    from .reference import Reference

REPS, WARMUP, BASE_SETS = 30, 5, 2
# Host memory the sampled outputs of a timing stage may take in the child (they come back by value): a task whose
# outputs are gigabytes is sampled less often, down to its last timed call alone.
SAMPLE_BYTES = 4 << 30
TIMING_MODES = ("auto", "isolated", "sustained")
BURST = 10  # calls queued back to back in sustained mode
SETTLE_MS = 100.0  # untimed calls ahead of each burst, in device ms: the clock settles under load (BENCHMARKS.md, J)
BURST_BYTES = 4 << 30  # outputs one burst may hold alive
RACE_MARGIN, RACE_MIN_ROUNDS = 0.05, 10  # profiler.stats.RaceRule against an incumbent's time
EXTRA_REPS = REPS  # more calls a contest still open after REPS may take
# A candidate's timed calls whose outputs would not all fit in what its child may keep (`defer_bytes`) are cut to
# as many as fit, down to this, so that they are still sampled after the exclusive turn (`timed_reps`): attention
# fwd+bwd's 537 MB of outputs a call keep 19 on an 80 GB GPU. Below it the samples are copied inside the turn, every
# sample_every-th call: gigabytes to the host and back by value while the GPU waits, and calls the candidate can
# tell in advance.
MIN_DEFERRED_REPS = 16
# Timed outputs the child may keep on the device for the parent to sample after the measurement (at least; see
# defer_bytes: the child holds them all, none released early), and how many timed calls the parent then picks.
DEFER_BYTES, PICKED_SAMPLES = 8 << 30, 3
RACE_VERDICTS = {stats.LOST: "not faster than the incumbent", stats.WON: "faster than the incumbent's time",
                 stats.OPEN: "no significant difference from the incumbent"}


def pacing(mode: str, bound: str, out_bytes: int) -> tuple[int, float]:
    """(calls per burst, heating ms ahead of each burst): one call at a time ("isolated"), or sustained: BURST calls
    back to back after SETTLE_MS of the same function's work ("auto" picks it for compute-bound tasks, whose clock
    depends on how busy the GPU has been), as many as BURST_BYTES of outputs allow."""
    if mode not in TIMING_MODES:
        raise ValueError(f"unknown timing mode {mode!r}; use one of {', '.join(TIMING_MODES)}")
    if mode == "isolated" or (mode == "auto" and bound != "compute"):
        return 1, 0.0
    return max(1, min(BURST, BURST_BYTES // max(1, out_bytes))), SETTLE_MS


def run(harness: "Harness", run: "_Run", reference: "Reference") -> tuple[dict[str, Any], dict[str, Any]]:
    task = run.task
    harness._request(run, Stage.TIMING, {"op": "rebuild", "init_inputs": reference.init_inputs(),
                                         "state_dict": reference.state_dict(), "seed": reference.model_seed})
    report = measure(harness, run, reference, candidate=True)
    if report["problems"]:
        first = report["problems"][0]
        try:
            reason = Reason(first["reason"])
        except ValueError:
            reason = Reason.TIMING_INCONSISTENT
        details: dict[str, Any] = {"timing": report}
        message = first["message"]
        blamed = (cudaipc.blame_full_gpu(run.device, message) if reason is Reason.RUNTIME_ERROR
                  and report.get("candidate_error") == "OutOfMemoryError" and run.device != "cpu" else None)
        if blamed is not None:  # the other checks' and the harness's memory, not the candidate's (as at any stage)
            reason, (message, details[GPU_FULL]) = Reason.HARNESS_ERROR, blamed
        raise Rejected(Stage.TIMING, reason, message, details=details)
    b = report["baselines"].get("eager") or {}
    details = {"candidate_ms": report["candidate_ms"], "speedup_vs_eager": b.get("speedup"),
               "constants": task.current_constants()}
    if report.get("race"):
        details["race"] = report["race"]
    return report, details


def measure(harness: "Harness", run: "_Run", reference: "Reference", *, candidate: bool) -> dict[str, Any]:
    """Time in the child, validate in the parent, return profiler.report's dict."""
    from profiler.ceilings import cached_ceilings, get_ceilings
    from profiler.report import build_timing
    from profiler.roofline import task_roofline

    task, opts = run.task, run.options
    seeds = [run.rng.randrange(1 << 31) for _ in range(BASE_SETS)]
    # The parent's own GPU work shares the gate; only the child's measurement holds it alone.
    with harness._gpu(run, work="timing_inputs"):
        base = [task.make_inputs(s, "normal", run.device) for s in seeds]
        specs = reference.output_specs(base[0])  # the reference alone: no float64 truth to size the transfers
        out_bytes = spec_bytes(specs)
        t_roof = time.monotonic()
        ceilings = cached_ceilings(opts.gpu)
        if not ceilings:  # measured once a machine; it switches tf32 process-wide, so no other slot's reference
            with RUNS.exclusive():  # runs meanwhile (sandbox/reference.py RUNS)
                ceilings = get_ceilings(opts.gpu)
        with torch.no_grad(), RUNS.shared():
            roof = task_roofline(task.declared_roofline(), reference.model, base[0], ceilings)
    if torch.device(run.device).type == "cuda":  # run.device is "cuda:N": what the parent ran stays cached
        torch.cuda.empty_cache()  # else held while the child times (H200: 102 GiB held, the child out of memory)
    msg = {"op": "time", "task": str(task.path), "overrides": dict(task.overrides), "base_seeds": seeds,
           "warmup": WARMUP, "baselines": list(opts.baselines), "model_seed": reference.model_seed}
    rule = race_rule(opts.incumbent_ms) if candidate else None
    keep = defer_bytes(run.device)
    msg["reps"] = reps = timed_reps(out_bytes, keep) if candidate else REPS
    msg["sample_every"] = max(1, reps // 4, math.ceil(reps * out_bytes / SAMPLE_BYTES))
    msg["set_bytes"] = set_budget(gpu_bytes(run.device))
    extra = extra_reps(out_bytes, keep, reps) if rule is not None else 0
    if rule is not None:
        msg["race"] = {k: v for k, v in rule.to_dict().items() if k != "rule"}
        msg["extra_reps"] = extra
    msg["burst"], msg["settle_ms"] = pacing(opts.timing_mode, roof.bound, out_bytes)
    calls = reps + extra
    msg["defer_samples"] = defer = candidate and 0 < out_bytes and calls * out_bytes <= keep
    if defer:
        msg["hold_bytes"] = keep
    with _timing_turn(run):  # at most gate.TIMING_TURNS children hold their input sets on the GPU at once
        t_prep = time.monotonic()  # the input sets and baselines, built while other checks may use the GPU
        prepared = harness._request(run, Stage.TIMING, {**msg, "op": "prepare_timing"})
        t0 = time.monotonic()
        reply = harness._request(run, Stage.TIMING, msg, max_bytes=(64 << 20) if defer else
                                 (calls // msg["sample_every"] + 2) * out_bytes * 2 + (64 << 20), exclusive=True)
        t1 = time.monotonic()
        measured = reply["measured"]
        n_sets = set_count_for(base[0], msg)  # counted here, not taken from the candidate's process
        problems = [] if int(reply["n_sets"]) == n_sets else [
            f"the candidate's process reported {reply['n_sets']} input sets where the timing asked for {n_sets}"]
        error = (measured.get("fns", {}).get("candidate") or {}).get("error") if candidate else None
        if defer and error:  # its error is the finding (an out-of-memory one may be the other checks'), not the
            measured["samples"] = []  # outputs it could not keep
        elif defer:  # after the exclusive turn: the calls to check are picked now, and copied while other checks run
            measured["samples"], fetched = _fetch_samples(harness, run, reply, specs, msg, n_sets)
            problems += fetched
        t_fetch = time.monotonic()
    with harness._gpu(run, work="timing_validate"):
        if defer:
            problems += _changed_after_return(measured["samples"], measured, run.device)
        problems += _validate(run, reference, base, measured, n_sets, None if defer else msg) if candidate else []
    t2 = time.monotonic()
    report = build_timing(measured, candidate="candidate" if candidate else None, baselines=reply["baselines"],
                          roof=roof, kernels=reply["kernels"], environment=reply["environment"],
                          output_problems=problems, seed=random.Random(seeds[0]).randrange(1 << 30))
    if isinstance(error, dict):  # its type, for the stage's verdict (an out-of-memory error may be the harness's)
        report["candidate_error"] = str(error.get("type"))
    if rule is not None:
        report["race"], problem = race_report(measured, rule, extra, reps, msg["burst"])
        if problem:
            report["problems"].append({"reason": Reason.TIMING_INCONSISTENT.value, "message": problem})
    child_laps = {**(prepared.get("laps") or {}), **(reply.get("laps") or {})}
    report["laps"] = {"prepare_s": t0 - t_prep, "request_s": t1 - t0, "samples_s": t_fetch - t1,
                      "validate_s": t2 - t_fetch, "roofline_s": t_prep - t_roof,
                      "report_s": time.monotonic() - t2,
                      **{str(k): float(v) for k, v in child_laps.items() if isinstance(v, (int, float))}}
    return report


def gpu_bytes(device: str) -> int:
    """The memory of the GPU `device` names; 0 off the GPU."""
    if torch.device(device).type != "cuda" or not torch.cuda.is_available():
        return 0
    return torch.cuda.get_device_properties(torch.device(device)).total_memory


def defer_bytes(device: str) -> int:
    """The timed outputs a child may keep for sampling after its measurement on `device` (kept_bytes)."""
    return kept_bytes(gpu_bytes(device))


def kept_bytes(gpu: int) -> int:
    """The timed outputs a child may keep on a GPU of `gpu` bytes: DEFER_BYTES, or an eighth of its memory where
    that is more (an H200's 17.6 GB: 60 calls of a 256 MiB output, a raced softmax's)."""
    return max(DEFER_BYTES, gpu // 8)


@contextmanager
def _timing_turn(run: "_Run") -> Iterator[None]:
    """One of the GPU's timing turns (sandbox/gate.py), its wait counted as the gate's waits are: in the check's
    deadline and its `timing_wait` lap."""
    gate = getattr(run.options, "gate", None)
    if gate is None:
        yield
        return
    with gate.timing_turn() as waited:
        run.deadline += waited
        run.laps["timing_wait"] = run.laps.get("timing_wait", 0.0) + waited
        yield


def race_rule(incumbent_ms: float | None) -> stats.RaceRule | None:
    return None if incumbent_ms is None else stats.RaceRule(incumbent_ms, RACE_MARGIN, RACE_MIN_ROUNDS)


def timed_reps(out_bytes: int, keep: int) -> int:
    """A candidate's timed calls: REPS, or as many as the `keep` bytes its child may hold for sampling after the
    exclusive turn take where REPS calls' outputs would not (SwiGLU's 470 MB output on an 80 GB GPU: 22), so their
    samples are still picked after the turn, not copied to the host inside it (SwiGLU's measurement in a search on an
    H100: 3.43 s a candidate with its samples copied inside the turn, 0.21 s with 22 calls kept). Below
    MIN_DEFERRED_REPS the outputs are sampled inside the turn instead, at REPS calls."""
    if out_bytes <= 0 or REPS * out_bytes <= keep:
        return REPS
    fit = keep // out_bytes
    return fit if fit >= MIN_DEFERRED_REPS else REPS


def extra_reps(out_bytes: int, keep: int, reps: int = REPS) -> int:
    """The calls a contest still open after `reps` may take: EXTRA_REPS, fewer where the outputs of them all would
    not fit in the `keep` bytes a child may hold for sampling after its exclusive turn (past that the samples are
    copied to the host inside the turn: a raced SwiGLU timing, 65 calls of 470 MB sampled so, measured 3.5 s in a
    search on the H200, against 0.47 s for the 35 kept calls of a check alone). A close contest of a task with huge
    outputs then ends sooner, as "no significant difference"."""
    if out_bytes <= 0 or reps * out_bytes > keep:
        return EXTRA_REPS  # sampled inside the turn whatever the count: the extra calls cost only their own time
    return max(0, min(EXTRA_REPS, keep // out_bytes - reps))


def race_report(measured: dict[str, Any], rule: stats.RaceRule, extra: int = EXTRA_REPS,
                reps: int = REPS, burst: int = 1) -> tuple[dict[str, Any], str | None]:
    """The race's record from the parent's own reading of the candidate's stream times (the child's stopping
    decision used those, a lower bound on its counted times), and a problem where the child stopped without the
    rule holding. The planned calls are `reps` rounded up to whole bursts, as the child runs them: only calls past
    those make the race `extended`."""
    reps = -(-reps // max(1, burst)) * max(1, burst)
    stream = list((measured.get("fns", {}).get("candidate") or {}).get("stream_ms") or [])
    claimed = measured.get("race") if isinstance(measured.get("race"), dict) else {}
    decision = stats.race(stream, rule) if stream else stats.OPEN
    stopped = bool(claimed.get("stopped_early"))
    record = {**rule.to_dict(), "rounds": len(stream), "planned_reps": reps, "extra_reps": extra,
              "stopped_early": stopped, "extended": len(stream) > reps, "decision": decision,
              "verdict": RACE_VERDICTS[decision] + (" (stopped early)" if stopped else "")}
    if stream:
        record["interval_ms"] = list(stats.median_interval(stream, rule.confidence))
    problem = None
    if stopped and decision != stats.LOST:
        problem = (f"timing stopped after {len(stream)} of {reps} calls although the candidate's interval did not lie "
                   f"above the incumbent's {rule.incumbent_ms:.4g} ms x {1 + rule.margin:g}")
    return record, problem


def _fetch_samples(harness: "Harness", run: "_Run", reply: dict[str, Any], specs: list[tuple[torch.Size, torch.dtype]],
                   asked: dict[str, Any], n_sets: int) -> tuple[list[dict[str, Any]], list[str]]:
    """The outputs of PICKED_SAMPLES timed calls, chosen at random now among those the child kept, and what is wrong
    with them before they meet the reference: another call or input set than asked for. Whether they still match
    their fingerprints at return (work finished later, THREATS #16) is `_changed_after_return`'s, on the GPU.
    On a GPU they come back into buffers the parent lends, shaped as the reference's outputs and poisoned (as a
    call's do, sandbox/handback.py), not through host memory (3 SwiGLU outputs: 1.4 GB, 1.5 s by value)."""
    measured = reply["measured"]
    prints = {int(e["call"]): e for e in measured.get("fingerprints") or [] if isinstance(e, dict) and "call" in e}
    kept = sorted({int(c) for c in reply.get("kept_calls") or []} & set(prints))
    if not kept:
        return [], ["the candidate's process kept none of its timed outputs for the parent to check"]
    picked = sorted(run.rng.sample(kept, min(PICKED_SAMPLES, len(kept))))
    out_bytes = spec_bytes(specs)
    msg: dict[str, Any] = {"op": "samples", "calls": picked}
    staged: list[torch.Tensor | None] = []
    if torch.device(run.device).type == "cuda":
        msg["out_buffers"], staged = run.lending.ship(
            [poisoned(shape, dtype, run.device) for _ in picked for shape, dtype in specs], set())
    got = harness._request(run, Stage.TIMING, msg, max_bytes=len(picked) * out_bytes * 2 + (64 << 20))["samples"]
    for j, sample in enumerate(got):  # each sample's outputs at its place among the buffers: call j's from j * per
        sample["outputs"] = claim(sample["outputs"], staged, start=j * len(specs)) if staged else sample["outputs"]
    problems = []
    if sorted(int(s["call"]) for s in got) != picked:
        problems.append(f"asked for the outputs of timed calls {picked}, the candidate's process sent "
                        f"{sorted(int(s['call']) for s in got)}")
    problems += [p for p in (_other_set(s, asked, n_sets) for s in got if int(s["call"]) in prints) if p]
    return got, problems


def _other_set(sample: dict[str, Any], asked: dict[str, Any], n_sets: int) -> str | None:
    """The problem where a sample reports another input set than its call was given (`asked`: the timing's message,
    whose warm-up, bursts and heating decide it), else None."""
    given = timed_call_set(int(sample["call"]), warmup=asked["warmup"], burst=asked["burst"],
                           settle_ms=asked["settle_ms"], n_sets=n_sets)
    if int(sample["input_set"]) == given:
        return None
    return f"timed call {sample['call']} reported input set {sample['input_set']}, not the {given} it was given"


def _changed_after_return(samples: list[dict[str, Any]], measured: dict[str, Any], device: str) -> list[str]:
    """Fetched samples whose outputs no longer match the fingerprint the timer took when their call returned."""
    prints = {int(e["call"]): e for e in measured.get("fingerprints") or [] if isinstance(e, dict) and "call" in e}
    return [f"timed call {s['call']}'s output changed after the call returned: it no longer matches the fingerprint "
            "taken when it returned" for s in samples
            if int(s["call"]) in prints and not _matches_print(s["outputs"], prints[int(s["call"])].get("at_return"),
                                                               device)]


def _matches_print(outputs: Any, at_return: Any, device: str) -> bool:
    """Whether outputs fetched later still match the (float64 sum, sum of squares) per tensor taken at return; the
    sums are recomputed here in float64, so they agree up to the order of summation."""
    outs = [t for t in (outputs if isinstance(outputs, list) else [outputs]) if isinstance(t, torch.Tensor)]
    if not isinstance(at_return, list) or len(at_return) != len(outs):
        return False
    for t, pair in zip(outs, at_return):
        x = (torch.view_as_real(t) if t.is_complex() else t).detach().to(device).to(torch.float64).reshape(-1)
        s, ss = float(x.sum()), float((x * x).sum())
        s0, ss0 = (float(v) for v in pair)
        if any(math.isnan(v) for v in (s, ss, s0, ss0)):
            if not all(math.isnan(a) == math.isnan(b) for a, b in ((s, s0), (ss, ss0))):
                return False
            continue
        scale = math.sqrt(max(ss, ss0) * max(1, x.numel()))
        if abs(ss - ss0) > 1e-9 * max(ss, ss0) + 1e-300 or abs(s - s0) > 1e-9 * scale + 1e-300:
            return False
    return True


def _validate(run: "_Run", reference: "Reference", base: list[list[Any]], measured: dict[str, Any],
              n_sets: int, asked: dict[str, Any] | None) -> list[str]:
    """The samples' outputs against the reference on their input sets; with the timing's message `asked` (samples
    taken during the measurement), each sample's input set must also be the one its call was given."""
    problems = []
    meta = run.task.meta
    for sample in measured.get("samples", []):
        k = int(sample["input_set"])
        if not 0 <= k < n_sets:
            problems.append(f"timed call {sample['call']} reported input set {k}, which does not exist")
            continue
        other = _other_set(sample, asked, n_sets) if asked is not None else None
        if other:
            problems.append(other)
            continue
        expected = reference.run(derive(base, k, meta.fixed_inputs))
        outs = sample["outputs"] if isinstance(sample["outputs"], list) else [sample["outputs"]]
        if len(outs) != len(expected.ref) or not all(isinstance(o, torch.Tensor) for o in outs):
            problems.append(f"timed call {sample['call']} returned outputs of another structure")
            continue
        for i, (got, ref) in enumerate(zip(outs, expected.ref)):
            truth = expected.truth[i] if expected.truth is not None else None
            if got.shape != ref.shape or got.dtype != ref.dtype:
                problems.append(f"timed call {sample['call']}: output {i} has shape/dtype "
                                f"{list(got.shape)}/{got.dtype}, expected {list(ref.shape)}/{ref.dtype}")
                break
            mismatch = tolerance.compare(f"output {i}", got.to(ref.device), ref, truth, allow_tf32=meta.allow_tf32,
                                         scale=meta.tolerance_scale, alternates=expected.alternates_for(i))
            if mismatch is not None:
                problems.append(f"timed call {sample['call']} (input set {k}) returned a wrong result: "
                                + mismatch.describe())
                break
    return problems
