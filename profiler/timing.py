"""Timing callables on one CUDA device the way an adversarial candidate cannot fool.

`measure(fns, input_sets)` runs in the sandboxed child and returns plain, picklable data; the trusted parent turns it
into statistics (profiler.stats), validates the sampled outputs and builds the report (profiler.report).

What each timed call looks like (eager mode), all on a timing stream of the highest priority torch allows:

    device sync; reset persisting L2; write the flush buffer (>= 2x L2) as many times as covers `cover_ms`
    t0 = host clock; start.record(); out = fn(inputs[k]); h = host clock; end.record()
    device sync; t1 = host clock; end_all.record(); device sync

- `stream_ms` = start -> end: the device time of fn's work, as triton.testing.do_bench reports it. The flush passes
  (whole-GPU work, default 0.5 ms) are still running while the host launches fn, so the Python launch overhead of a
  Triton kernel (tens to hundreds of microseconds) is not charged, as in do_bench's steady state and nvbench. The
  cover is whole-GPU work on the highest-priority stream, not an idle wait: work a candidate sneaks onto a
  (lower-priority) side stream during it cannot get blocks scheduled until the start event, so it lands in the
  timed interval or in the tail. A call whose host launch time outlasts the cover is marked host-bound (`host_ms`):
  its device time then includes the wait for the host.
- `tail_ms` = end -> end_all: end_all is recorded only after the WHOLE device went idle, so work the candidate left
  on another stream (or a thread's stream) shows up here. An empty call measures the tail an honest call has
  (`calibration`); a call whose tail exceeds it is flagged and the excess is counted in its time (`ms`).
- `wall_ms` = t1 - t0 on the host, against the empty call's wall time: a call whose event time is far below its
  host time is flagged too.
Sustained mode (`burst` > 1, `settle_ms`): a function's calls are queued `burst` at a time, back to back, each after
one flush pass (as do_bench does), and the device is synchronised once after the burst; ahead of each burst, untimed
calls of the same function run for `settle_ms`. Compute-bound kernels (attention, GEMMs) run at a clock that depends
on how hard the GPU has been working for tens of milliseconds: one call at a time, or a 10-call burst from idle, runs
at boost clock (cuDNN attention reads 1.16x faster than do_bench), 30 calls back to back settle where do_bench and a
training step run (docs/BENCHMARKS.md). A later call in a burst counts the device time since the previous call's
end less an empty call's (the flush pass), never less than its own stream time, so work left on a side stream
during the flush is counted; the burst's tail beyond an empty burst's is spread over its calls and flags them
(`count`).
Functions are interleaved A B A B ... with the order rotated every round, so drift (clocks, thermals) hits all of
them alike and per-round ratios are paired. Warm-up calls (a fixed count, default 5) absorb compilation and
autotuning; every call rotates to the next input set.

Outputs of the watched function (the candidate) are checked twice: a cheap fingerprint (float64 sum and sum of
squares of each output tensor) right after each timed call returns, and again later (one round on, or at the end
of the run, within a memory budget) — a change means work finished after the call "returned" (THREATS #16). A
sample of its timed outputs is copied to the CPU, outside the timed region, for the parent to check against the
reference (THREATS #15, #4); with `keep_outputs` none is copied during the run: the outputs stay held and the caller
fetches the calls the parent picks afterwards, so the candidate cannot know which of its calls are checked. Holding
them (up to `hold_bytes`) means a timed call cannot reuse the blocks its previous outputs occupied, as a program
does (and as the baselines do: their outputs are freed): with a cold cache every call's outputs would be a new
cudaMalloc inside its host time, which only the watched function pays (the
suspected cause of the AdamW seed's 0.77 ms of host time a call in `crucible bench` against 0.21 in a plain loop,
315 MB of outputs a call; benchmarks/bench_child_overhead.py measures it). So before the first timed call, blocks
the size of the watched function's warm-up output storages, as many as the re-check will hold at once, are
allocated, NaN-poisoned and freed into the allocator's cache (`device_memory.reserve_outputs`): the held outputs are
carved from them. `config.allocator_segments_timed` counts the segments (cudaMallocs) the timed rounds still needed.

The timer functions are captured when this module is imported (before any candidate code) and called through those
captured references; their identity is checked after the run, and a change is reported as tampering (THREATS #17).

Racing (`race`, a profiler.stats.RaceRule): after each timed round the watched function's stream times so far (a lower
bound on its counted times) go through profiler.stats.race; once its interval lies above the incumbent's band the
rounds stop (`race.stopped_early`), and a contest still open after the planned rounds, its interval across an edge
of the band (profiler.stats.within_margin: not inside it), gets up to `extra_reps` more calls. The trusted parent
repeats the rule on the returned times (sandbox.timing_parent).

The counting arithmetic is profiler.counting; the outputs and the allocator around them, profiler.device_memory;
the plan and the state of the rounds, profiler.timing_plan. Imports: torch, the standard library, profiler.stats
(standard library only) and those three; this module runs inside the sandbox child.
"""
from __future__ import annotations

import gc
import math
import time
import traceback
from typing import Any, Callable, Iterable

import torch

from . import stats
from .counting import calibrate, count, median
from .device_memory import (
    fingerprint, held_at_once, nbytes, pool_context, private_copy, reserve_outputs, scrub, segments, to_cpu,
)
from .timing_plan import NULL_FN, Bench, Plan, State, make_plan, round_sets

SCHEMA = 1

# ---- the trusted timer, captured before any candidate is imported -------------------------------------------------
_EVENT = torch.cuda.Event
_RECORD = torch.cuda.Event.record
_ELAPSED = torch.cuda.Event.elapsed_time
_EVENT_SYNC = torch.cuda.Event.synchronize
_SYNC = torch.cuda.synchronize
_C_SYNC = getattr(torch._C, "_cuda_synchronize", None)  # absent from CPU-only builds
_PERF = time.perf_counter
_ZERO = torch.Tensor.zero_
_CURRENT_STREAM = torch.cuda.current_stream
HIGHEST_PRIORITY = -1000  # torch maps it to the greatest priority it supports
MAX_HEAT_CALLS = 256  # heating calls before one burst, whatever settle_ms asks

_WATCHED: dict[str, Callable[[], Any]] = {
    "torch.cuda.Event": lambda: torch.cuda.Event,
    "torch.cuda.Event.record": lambda: torch.cuda.Event.record,
    "torch.cuda.Event.elapsed_time": lambda: torch.cuda.Event.elapsed_time,
    "torch.cuda.Event.synchronize": lambda: torch.cuda.Event.synchronize,
    "torch.cuda.synchronize": lambda: torch.cuda.synchronize,
    "torch._C._cuda_synchronize": lambda: getattr(torch._C, "_cuda_synchronize", None),
    "time.perf_counter": lambda: time.perf_counter,
    "torch.Tensor.zero_": lambda: torch.Tensor.zero_,
    "torch.cuda.current_stream": lambda: torch.cuda.current_stream,
}
_CAPTURED = {name: get() for name, get in _WATCHED.items()}


def tampered() -> list[str]:
    """Names of timer/flush functions that are no longer the objects captured at import."""
    out = []
    for name, get in _WATCHED.items():
        try:
            now = get()
        except Exception:  # deleted attribute
            out.append(name)
            continue
        if now is not _CAPTURED[name]:
            out.append(name)
    return out


def _device_sync() -> None:
    _C_SYNC()  # the whole device (every stream), without going through the patchable torch.cuda.synchronize


def _error(exc: BaseException) -> dict[str, str]:
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return {"type": type(exc).__name__, "message": str(exc)[:4000], "traceback": tb[-8000:]}


# ---- measure -------------------------------------------------------------------------------------------------------
def measure(
    fns: dict[str, Callable[[list], Any]],
    input_sets: list[list],
    *,
    reps: int = 30,
    warmup: int = 5,
    burst: int = 1,
    settle_ms: float = 0.0,
    flush_bytes: int | None = None,
    sample_every: int | None = None,
    watch: str | None = None,
    graph: bool = False,
    hold_bytes: int = 8 << 30,
    fresh_inputs: Iterable[str] = (),
    tail_tolerance_ms: float = 0.05,
    tail_tolerance_rel: float = 0.10,
    cover_ms: float = 0.5,
    reserve: bool = True,
    isolate: Iterable[str] = (),
    race: stats.RaceRule | None = None,
    extra_reps: int = 0,
    keep_outputs: dict[int, tuple[int, Any]] | None = None,
) -> dict[str, Any]:
    """Time each callable `reps` times, interleaved and rotated, on the current CUDA device.

    fns: name -> callable taking one input set (a list) and returning the output(s). `watch` names the function whose
    outputs are fingerprinted and sampled (default: the first). `sample_every`: every n-th timed call of `watch` (and
    its last; the last alone when n >= reps) is copied to the CPU (default: about four samples). `graph`: time
    CUDA-graph replays, one graph captured per (function, input set) before warm-up; for launch-bound ops. `hold_bytes`:
    memory the fingerprint re-check may keep alive; past it the oldest outputs are re-checked early and released.
    `cover_ms`: device time of flush passes queued ahead of each call, to hide host launch overhead (0: one pass).
    `burst`: calls of one function queued back to back before the device is synchronised (sustained mode, for
    compute-bound work whose clock depends on how busy the GPU has been; 1: one call at a time). Warm-up and timed calls
    are rounded up to whole bursts. `settle_ms`: before each timed burst, untimed calls of the same function on an input
    set kept for this alone (the last one) run back to back for about this much device time, so the burst starts at the
    clock that function settles at under load; their device time is recorded, and heating calls much faster than the
    timed ones flag the burst (`count`). `fresh_inputs`: functions that get a private copy of each input set, made
    before the flush, because they may write over their inputs (Liger's cross-entropy stores the gradient in its
    logits): every function then sees the same values. `reserve`: grow the allocator's cache for the held outputs before
    the timed rounds (see `reserve_outputs`; False only to measure what it saves). `isolate`: functions (the baselines)
    whose results the watched function must never be handed by the caching allocator (THREATS #5): their calls and
    private input copies allocate from a memory pool of their own, and what they return (autograd's gradients come from
    its own thread, outside the pool) and their private inputs are set to NaN bytes before being freed. Without torch's
    MemPool the scrubbing alone applies, with a warning. `race`: stop the rounds once the watched function cannot beat
    the rule's incumbent, and time a contest still open after `reps` calls for up to `extra_reps` more (see the module's
    docstring); without it, exactly `reps`. `keep_outputs`: a dict to fill with the watched function's timed outputs
    still held at the end ({call: (input set, output)}, fingerprints re-checked), none copied to the CPU during the run:
    the caller samples them later, outside the measurement, at calls chosen after it (eager mode, outputs within
    `hold_bytes`).
    """
    plan = make_plan(fns, input_sets, reps=reps, warmup=warmup, burst=burst, settle_ms=settle_ms, watch=watch,
                 sample_every=sample_every, graph=graph, hold_bytes=hold_bytes, fresh_inputs=fresh_inputs,
                 tail_tolerance=(tail_tolerance_ms, tail_tolerance_rel), cover_ms=cover_ms, reserve=reserve,
                 isolate=isolate, race=race, extra_reps=extra_reps)
    bench = Bench.on_current_device(flush_bytes)
    state = State.start(plan)
    state.kept = keep_outputs if not plan.graph else None
    if bench.persisting.method is None:
        state.warnings.append(f"persisting L2 could not be reset: {bench.persisting.error}")

    gc_was_enabled = gc.isenabled()
    stream = torch.cuda.Stream(device=bench.dev, priority=HIGHEST_PRIORITY)
    stream.wait_stream(_CURRENT_STREAM())
    stream_ctx = torch.cuda.stream(stream)
    stream_ctx.__enter__()
    try:
        _run_rounds(plan, state, bench)
    except _Fatal:
        pass
    finally:
        stream_ctx.__exit__(None, None, None)
        _CURRENT_STREAM().wait_stream(stream)
        if gc_was_enabled:
            gc.enable()
    return _result(plan, state, bench, stream.priority)


def _run_rounds(plan: Plan, state: State, bench: Bench) -> None:
    """Graph capture (graph mode), the flush cover, then every round; the held outputs are re-checked at the end.
    Raises _Fatal when the CUDA context became unusable. The host seconds of each phase go to state.phase_s."""
    t0 = time.monotonic()
    n_sets = len(plan.input_sets)
    if plan.graph:
        used = sorted({c % n_sets for c in range((plan.warm_rounds + plan.timed_rounds) * plan.burst)})
        for n in plan.names:
            try:
                state.graphs.update(_capture(n, plan.calls[n], plan.input_sets, used))
            except Exception as exc:  # noqa: BLE001 - a candidate that cannot be captured is reported, not fatal
                state.errors[n] = _error(exc)
        state.warnings.append("graph mode: each output is the graph's static buffer, so the later fingerprint "
                              "re-check is skipped")
    events = _Events(plan.burst)
    bench.pass_ms = _flush_pass_ms(bench.flush, events.starts[0], events.ends[0])
    bench.passes = max(1, math.ceil(plan.cover_ms / bench.pass_ms)) if bench.pass_ms > 0 else 1
    gc.collect()
    gc.disable()
    t = state.lap("setup", t0)
    for rnd in range(plan.warm_rounds + plan.timed_rounds + plan.extra_rounds):
        if not _round(plan, state, bench, events, rnd):
            break
        t = state.lap("warm" if rnd < plan.warm_rounds else "timed", t)
    if state.race is not None:
        done = [s for b in state.raw[plan.watch] for s in b["stream_ms"]]
        state.race["decision"] = stats.race(done, plan.race) if done else stats.OPEN
    for idx, old in state.held:
        state.recheck(idx, old)
        if state.kept is not None:
            state.kept[state.prints[idx]["call"]] = (state.prints[idx]["input_set"], old)
    state.held.clear()
    state.lap("recheck", t)
    state.segments_timed = None if state.segments_before is None else segments(bench.dev) - state.segments_before


class _Events:
    """The CUDA events of one burst: heating, each call's start and end, and the whole device idle after it."""

    def __init__(self, burst: int) -> None:
        self.heat_start, self.heat_end = _EVENT(enable_timing=True), _EVENT(enable_timing=True)
        self.starts = [_EVENT(enable_timing=True) for _ in range(burst)]
        self.ends = [_EVENT(enable_timing=True) for _ in range(burst)]
        self.end_all = _EVENT(enable_timing=True)


def _round(plan: Plan, state: State, bench: Bench, events: _Events, rnd: int) -> bool:
    """One round: a burst of each function still without an error, in this round's rotated order. False: the race
    is decided and the rounds stop."""
    if state.race is not None and rnd > plan.warm_rounds:
        done = [s for b in state.raw[plan.watch] for s in b["stream_ms"]]
        go, state.race["decision"] = stats.keep_racing(done, plan.race, plan.reps,
                                                       plan.reps + plan.extra_rounds * plan.burst)
        if not go:
            state.race["stopped_early"] = len(done) < plan.reps
            return False
        state.race["extended"] = len(done) >= plan.reps
    timed = rnd >= plan.warm_rounds
    # the same input sets for every function in a round: ratios are paired
    ks = round_sets(rnd, plan.burst, len(plan.input_sets))
    alive = [n for n in plan.order_base if state.errors[n] is None]
    shift = rnd % len(alive)
    alive = alive[shift:] + alive[:shift]
    if timed:
        state.order.append(alive)
    if rnd == plan.warm_rounds and not plan.graph:
        t0 = time.monotonic()
        copies = held_at_once(nbytes(state.watch_sample), plan.hold_bytes, plan.timed_rounds, plan.burst)
        state.reserved = reserve_outputs(state.watch_sample, copies, bench.dev, state.warnings) if plan.reserve else 0
        state.watch_sample = None
        state.segments_before = segments(bench.dev)
        state.lap("reserve", t0)  # inside the first timed round's seconds
    if rnd == plan.warm_rounds and plan.settle_ms:
        for n in plan.names:
            est = median(state.warm_ms[n]) if state.warm_ms[n] else 0.0
            state.heat_calls[n] = min(MAX_HEAT_CALLS, math.ceil(plan.settle_ms / est)) if est > 0 else 0
    for n in alive:
        burst = _burst(plan, state, bench, events, n, ks, timed)
        if burst is None:
            continue
        rec, outs = burst
        if n == NULL_FN or timed:
            state.raw[n].append(rec)
        else:
            state.warm_ms[n].extend(rec["stream_ms"])
        if not timed and n == plan.watch and outs and not plan.graph:
            state.watch_sample = outs[-1]
        if timed and n == plan.watch:
            _keep(plan, state, rnd, ks, outs)
        del outs
    return True


def _burst(plan: Plan, state: State, bench: Bench, events: _Events, n: str, ks: list[int],
           timed: bool) -> tuple[dict[str, Any], list[Any]] | None:
    """One burst of function `n` on input sets `ks`: its events' record and its outputs, or None when it raised
    (recorded in state.errors). Raises _Fatal when the device cannot be synchronised after the error."""
    outs: list[Any] = []
    host: list[float] = []
    try:
        _device_sync()
        bench.persisting.reset()
        heating = state.heat_calls[n] if timed else 0
        with pool_context(plan.pools.get(n), bench.dev):
            args = [private_copy(plan.input_sets[k]) if n in plan.fresh else plan.input_sets[k] for k in ks]
            if n in plan.fresh:
                _device_sync()  # the copies are made before the burst's host wall time starts
            if heating:
                heat_args = private_copy(plan.heat_set) if n in plan.fresh else plan.heat_set
                _RECORD(events.heat_start)
                for _ in range(heating):
                    plan.calls[n](heat_args)
                _RECORD(events.heat_end)
                _device_sync()  # the burst's wall time starts with the device free, as without heating
                if n in plan.isolated and n in plan.fresh:
                    scrub(heat_args)
                del heat_args
            for _ in range(bench.passes):
                _ZERO(bench.flush)
            t0 = _PERF()
            for j, k in enumerate(ks):
                if j:
                    _ZERO(bench.flush)
                g = state.graphs.get((n, k)) if plan.graph and n != NULL_FN else None
                th = _PERF()
                _RECORD(events.starts[j])
                if g is not None:
                    g[0].replay()
                    outs.append(g[1])
                else:
                    outs.append(plan.calls[n](args[j]))
                host.append((_PERF() - th) * 1e3)
                _RECORD(events.ends[j])
            _device_sync()
            t1 = _PERF()
            _RECORD(events.end_all)
            _device_sync()
            if n in plan.isolated and not plan.graph:  # what another thread (autograd's) put outside the pool
                scrub(outs)
                if n in plan.fresh:
                    scrub(args)
            del args
        starts, ends = events.starts, events.ends
        rec = {"stream_ms": [float(_ELAPSED(starts[j], ends[j])) for j in range(plan.burst)],
               "gap_ms": [float(_ELAPSED(ends[j - 1], ends[j])) for j in range(1, plan.burst)],
               "tail_ms": float(_ELAPSED(ends[-1], events.end_all)), "wall_ms": (t1 - t0) * 1e3,
               "host_ms": host, "input_set": ks, "heat_calls": heating,
               "heat_ms": float(_ELAPSED(events.heat_start, events.heat_end)) if heating else 0.0}
    except Exception as exc:  # noqa: BLE001 - recorded per function; a dead context ends the run below
        state.errors[n] = _error(exc)
        try:
            _device_sync()
        except Exception as exc2:  # noqa: BLE001
            state.fatal = _error(exc2)
            raise _Fatal from None
        return None
    return rec, outs


def _keep(plan: Plan, state: State, rnd: int, ks: list[int], outs: list[Any]) -> None:
    """The watched function's timed outputs: fingerprinted now, sampled to the CPU, held for the later re-check
    (the oldest re-checked early and released past plan.hold_bytes)."""
    for j, (k, out) in enumerate(zip(ks, outs)):
        i = (rnd - plan.warm_rounds) * plan.burst + j
        t0 = time.monotonic()
        state.prints.append({"call": i, "input_set": k, "at_return": fingerprint(out), "later": None,
                             "changed": False})
        state.lap("fingerprints", t0)
        if state.kept is None and ((plan.sample_every < plan.reps and i % plan.sample_every == 0)
                                   or i == plan.reps - 1):
            state.samples.append({"fn": plan.watch, "call": i, "input_set": k, "outputs": to_cpu(out)})
        if not plan.graph:
            state.held.append((len(state.prints) - 1, out))
            state.held_bytes += nbytes(out)
            while state.held_bytes > plan.hold_bytes and len(state.held) > 1:
                idx, old = state.held.pop(0)
                state.held_bytes -= nbytes(old)
                state.recheck(idx, old)


def _count_all(plan: Plan, state: State, bench: Bench) -> tuple[dict[str, float], dict[str, dict[str, Any]]]:
    """The empty call's calibration, and each function's counted calls (`count`) with its error; warns of
    host-bound calls."""
    calibration = calibrate(state.raw[NULL_FN])
    per = {n: count(state.raw[n], calibration, first_cover_ms=bench.passes * bench.pass_ms, flush_ms=bench.pass_ms,
                    tail_tolerance_ms=plan.tail_tolerance[0], tail_tolerance_rel=plan.tail_tolerance[1])
           for n in plan.names}
    for n in plan.names:
        p = per[n]
        p["error"] = state.errors[n]
        if p["host_bound"] > len(p["ms"]) // 4:
            state.warnings.append(f"{n}: in {p['host_bound']} of {len(p['ms'])} calls the host took longer to "
                                  f"launch the work (median {median(p['host_ms']):.3f} ms) than the device work "
                                  "queued ahead of it: those times include waiting for the host (graph mode removes "
                                  "launch cost)")
    return calibration, per


def _result(plan: Plan, state: State, bench: Bench, stream_priority: int) -> dict[str, Any]:
    """measure's record, with the warnings the run's end adds (host-bound calls, persisting L2, tampered timers,
    changed outputs)."""
    calibration, per = _count_all(plan, state, bench)
    if bench.persisting.method is not None and not bench.persisting.working:
        state.warnings.append(f"persisting L2 could not be reset: {bench.persisting.error}")
    mismatched = [{"fn": plan.watch, "call": e["call"], "input_set": e["input_set"]}
                  for e in state.prints if e["changed"]]
    changed_timer = tampered()
    if changed_timer:
        state.warnings.append("timer functions were replaced during the run: " + ", ".join(changed_timer))
    if mismatched:
        state.warnings.append(f"{len(mismatched)} timed outputs of {plan.watch} changed after their call returned")
    bench.flush = None
    state.graphs.clear()
    props = bench.props
    config = {"reps": len(state.order) * plan.burst, "warmup": plan.warm_rounds * plan.burst, "burst": plan.burst,
              "settle_ms": plan.settle_ms, "heat_calls": {n: state.heat_calls[n] for n in plan.names},
              "flush_bytes": bench.flush_bytes, "n_input_sets": len(plan.input_sets),
              "sample_every": plan.sample_every, "watch": plan.watch, "graph": plan.graph,
              "tail_tolerance_ms": plan.tail_tolerance[0], "tail_tolerance_rel": plan.tail_tolerance[1],
              "cover_ms": plan.cover_ms, "flush_passes": bench.passes, "flush_pass_ms": bench.pass_ms,
              "stream_priority": stream_priority, "reserved_bytes": state.reserved,
              "allocator_segments_timed": state.segments_timed, "phase_s": dict(state.phase_s)}
    return {"schema": SCHEMA,
            "device": {"index": bench.dev, "name": props.name, "l2_bytes": bench.l2,
                       "sm_count": props.multi_processor_count},
            "race": state.race, "config": config,
            "l2": {"flush_bytes": bench.flush_bytes,
                   "persisting_reset": bench.persisting.method if bench.persisting.working else None,
                   "persisting_error": bench.persisting.error},
            "calibration": calibration, "order": state.order, "fns": per, "samples": state.samples,
            "fingerprints": state.prints, "fingerprint_mismatches": mismatched, "tampered": changed_timer,
            "fatal": state.fatal, "warnings": state.warnings}


def _flush_pass_ms(flush: torch.Tensor, start: Any, end: Any) -> float:
    """Device time of one write of the flush buffer (median of three), to size the cover ahead of each call."""
    times = []
    for _ in range(4):
        _device_sync()
        _RECORD(start)
        _ZERO(flush)
        _RECORD(end)
        _device_sync()
        times.append(float(_ELAPSED(start, end)))
    return median(times[1:])


class _Fatal(Exception):
    """The CUDA context is unusable: stop timing and return what was measured."""


def _capture(name: str, fn: Callable[[list], Any], input_sets: list[list],
             used: Iterable[int]) -> dict[tuple[str, int], tuple[Any, Any]]:
    """One CUDA graph per input set; fn runs eagerly once first (compilation, autotuning) on a side stream."""
    out: dict[tuple[str, int], tuple[Any, Any]] = {}
    side = torch.cuda.Stream()
    side.wait_stream(_CURRENT_STREAM())
    with torch.cuda.stream(side):
        for k in used:
            fn(input_sets[k])
    _CURRENT_STREAM().wait_stream(side)
    _device_sync()
    for k in used:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            res = fn(input_sets[k])
        out[(name, k)] = (g, res)
    _device_sync()
    return out
