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
training step run (docs/BENCHMARKS.md, runs H and J). A later call in a burst counts the device time since the previous call's end less an empty call's (the
flush pass), never less than its own stream time, so work left on a side stream during the flush is counted; the
burst's tail beyond an empty burst's is spread over its calls and flags them (`count`).
Functions are interleaved A B A B ... with the order rotated every round, so drift (clocks, thermals) hits all of
them alike and per-round ratios are paired. Warm-up calls (a fixed count, default 5) absorb compilation and
autotuning; every call rotates to the next input set.

Outputs of the watched function (the candidate) are checked twice: a cheap fingerprint (float64 sum and sum of
squares of each output tensor) right after each timed call returns, and again later (one round on, or at the end
of the run, within a memory budget) — a change means work finished after the call "returned" (THREATS #16). A
sample of its timed outputs is copied to the CPU, outside the timed region, for the parent to check against the
reference (THREATS #15, #4). Holding them (up to `hold_bytes`) means a timed call cannot reuse the blocks its
previous outputs occupied, as a program does (and as the baselines do: their outputs are freed): with a cold cache
every call's outputs would be a new cudaMalloc inside its host time, which only the watched function pays (the
suspected cause of the AdamW seed's 0.77 ms of host time a call in `crucible bench` against 0.21 in a plain loop,
315 MB of outputs a call; benchmarks/bench_child_overhead.py measures it). So before the first timed call, blocks
the size of the watched function's warm-up output storages, as many as the re-check will hold at once, are
allocated, NaN-poisoned and freed into the allocator's cache (`_reserve`): the held outputs are carved from them.
`config.allocator_segments_timed` counts the segments (cudaMallocs) the timed rounds still needed.

The timer functions are captured when this module is imported (before any candidate code) and called through those
captured references; their identity is checked after the run, and a change is reported as tampering (THREATS #17).

Racing (`race`, a profiler.stats.RaceRule): after each timed round the watched function's stream times so far (a lower
bound on its counted times) go through profiler.stats.race; once its interval lies above the incumbent's band the
rounds stop (`race.stopped_early`), and a contest still open after the planned rounds gets up to `extra_reps` more
calls. The trusted parent repeats the rule on the returned times (sandbox.timing_parent).

Imports: torch, the standard library and profiler.stats (standard library only); this module runs inside the sandbox
child.
"""
from __future__ import annotations

import contextlib
import ctypes
import gc
import math
import time
import traceback
from typing import Any, Callable, Iterable

import torch

from . import stats

NULL_FN = "_null"  # the empty call that calibrates the honest tail and wall time
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
_FILL = torch.Tensor.fill_
_CURRENT_STREAM = torch.cuda.current_stream
_MEMPOOL = getattr(torch.cuda, "MemPool", None)  # private allocator pools (torch >= 2.6)
_POOL_BEGIN = getattr(torch._C, "_cuda_beginAllocateCurrentThreadToPool", None)
_POOL_END = getattr(torch._C, "_cuda_endAllocateToPool", None)
_POOL_RELEASE = getattr(torch._C, "_cuda_releasePool", None)
HIGHEST_PRIORITY = -1000  # torch maps it to the greatest priority it supports
MAX_HEAT_CALLS = 256  # heating calls before one burst, whatever settle_ms asks
RESERVE_SHARE = 0.25  # the most of the free device memory the held outputs' reserve may take (see _reserve)

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


# ---- persisting L2 -------------------------------------------------------------------------------------------------
class _PersistingL2:
    """cuCtxResetPersistingL2Cache through the driver (ctypes), else cuda.bindings; records which, or why neither."""

    def __init__(self) -> None:
        self.method: str | None = None
        self.error: str | None = None
        self._call: Callable[[], int] | None = None
        try:
            lib = ctypes.CDLL("libcuda.so.1")
            fn = lib.cuCtxResetPersistingL2Cache
            fn.restype = ctypes.c_int
            self._call, self.method = fn, "cuCtxResetPersistingL2Cache (libcuda, ctypes)"
        except (OSError, AttributeError) as exc:
            self.error = f"libcuda: {exc}"
            try:
                from cuda.bindings import runtime as cudart  # type: ignore[import-not-found]

                def call() -> int:
                    return int(cudart.cudaCtxResetPersistingL2Cache()[0])

                self._call, self.method, self.error = call, "cudaCtxResetPersistingL2Cache (cuda.bindings)", None
            except Exception as exc2:  # noqa: BLE001 - any import failure means: not available
                self.error += f"; cuda.bindings: {exc2}"

    @property
    def working(self) -> bool:
        return self._call is not None

    def reset(self) -> None:
        if self._call is None:
            return
        rc = int(self._call())
        if rc != 0:
            self.error = f"{self.method} returned error {rc}"
            self._call = None


# ---- outputs -------------------------------------------------------------------------------------------------------
def _tensors(out: Any) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (list, tuple)):
        return [t for o in out for t in _tensors(o)]
    if isinstance(out, dict):
        return [t for o in out.values() for t in _tensors(o)]
    return []


def fingerprint(out: Any) -> list[tuple[float, float]]:
    """Per output tensor: (float64 sum, float64 sum of squares). Deterministic for an unchanged tensor."""
    fp = []
    for t in _tensors(out):
        x = t.detach()
        if x.is_complex():
            x = torch.view_as_real(x)
        if x.dtype == torch.bool:
            x = x.to(torch.uint8)
        x64 = x.to(torch.float64) if x.numel() <= (1 << 26) else None
        if x64 is None:  # big outputs: reduce chunk by chunk instead of materialising a float64 copy
            flat = x.reshape(-1)
            s = ss = 0.0
            for i in range(0, flat.numel(), 1 << 26):
                c = flat[i:i + (1 << 26)].to(torch.float64)
                s += float(c.sum())
                ss += float((c * c).sum())
        else:
            s, ss = float(x64.sum()), float((x64 * x64).sum())
        fp.append((s, ss))
    return fp


def _same_fp(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> bool:
    if len(a) != len(b):
        return False
    for (s1, q1), (s2, q2) in zip(a, b):
        for u, v in ((s1, s2), (q1, q2)):
            if not (u == v or (math.isnan(u) and math.isnan(v))):
                return False
    return True


def _nbytes(out: Any) -> int:
    return sum(t.numel() * t.element_size() for t in _tensors(out))


def _to_cpu(out: Any) -> Any:
    if isinstance(out, torch.Tensor):
        return out.detach().to("cpu", copy=True)
    if isinstance(out, (list, tuple)):
        return type(out)(_to_cpu(o) for o in out) if isinstance(out, list) else tuple(_to_cpu(o) for o in out)
    if isinstance(out, dict):
        return {k: _to_cpu(v) for k, v in out.items()}
    return out


def _error(exc: BaseException) -> dict[str, str]:
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return {"type": type(exc).__name__, "message": str(exc)[:4000], "traceback": tb[-8000:]}


def _median(xs: list[float]) -> float:
    s = sorted(xs)
    n = len(s)
    if n == 0:
        return float("nan")
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


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
) -> dict[str, Any]:
    """Time each callable `reps` times, interleaved and rotated, on the current CUDA device.

    fns: name -> callable taking one input set (a list) and returning the output(s). `watch` names the function whose
    outputs are fingerprinted and sampled (default: the first). `sample_every`: every n-th timed call of `watch`
    (and its last; the last alone when n >= reps) is copied to the CPU (default: about four samples). `graph`: time
    CUDA-graph replays, one graph captured per (function, input set) before warm-up; for launch-bound ops.
    `hold_bytes`: memory the fingerprint re-check may keep alive; past it the oldest outputs are re-checked early and
    released. `cover_ms`: device time of flush passes queued ahead of each call, to hide host launch overhead (0: one pass). `burst`: calls of one
    function queued back to back before the device is synchronised (sustained mode, for compute-bound work whose
    clock depends on how busy the GPU has been; 1: one call at a time). Warm-up and timed calls are rounded up to
    whole bursts. `settle_ms`: before each timed burst, untimed calls of the same function on an input set kept for
    this alone (the last one) run back to back for about this much device time, so the burst starts at the clock
    that function settles at under load; their device time is recorded, and heating calls much faster than the
    timed ones flag the burst (`count`). `fresh_inputs`: functions that get a private copy of each input set, made
    before the flush, because they may write over their inputs (Liger's cross-entropy stores the gradient in its
    logits): every function then sees the same values. `reserve`: grow the allocator's cache for the held outputs
    before the timed rounds (see `_reserve`; False only to measure what it saves). `isolate`: functions (the
    baselines) whose results the watched function must never be handed by the caching allocator (THREATS #5):
    their calls and private input copies allocate from a memory pool of their own, and what they return (autograd's
    gradients come from its own thread, outside the pool) and their private inputs are set to NaN bytes before
    being freed. Without torch's MemPool the scrubbing alone applies, with a warning. `race`: stop the rounds once
    the watched function cannot beat the rule's incumbent, and time a contest still open after `reps` calls for up
    to `extra_reps` more (see the module's docstring); without it, exactly `reps`.
    """
    if not torch.cuda.is_available():
        raise RuntimeError("measure needs a CUDA device")
    if not fns:
        raise ValueError("measure needs at least one function")
    if not input_sets:
        raise ValueError("measure needs at least one input set")
    if NULL_FN in fns:
        raise ValueError(f"{NULL_FN!r} is reserved for the calibration call")
    if reps < 2 or warmup < 0 or burst < 1 or settle_ms < 0 or extra_reps < 0:
        raise ValueError("reps must be at least 2, warmup non-negative, burst at least 1 and settle_ms non-negative")
    names = list(fns)
    fresh = set(fresh_inputs)
    if fresh - set(names):
        raise ValueError(f"fresh_inputs names {sorted(fresh - set(names))}, which are not measured")
    isolated = set(isolate)
    if isolated - set(names) or (watch or names[0]) in isolated:
        raise ValueError(f"isolate names {sorted(isolated)}: each must be measured and none the watched function")
    pools = {n: _MEMPOOL() for n in isolated} if _MEMPOOL is not None and _POOL_BEGIN is not None else {}
    watch = names[0] if watch is None else watch
    if watch not in fns:
        raise ValueError(f"watch={watch!r} is not one of {names}")
    warm_rounds, timed_rounds = max(-(-warmup // burst), 1 if settle_ms else 0), -(-reps // burst)
    extra_rounds = -(-extra_reps // burst) if race is not None else 0
    reps = timed_rounds * burst
    race_state: dict[str, Any] | None = None if race is None else \
        {**race.to_dict(), "planned_reps": reps, "extra_reps": extra_rounds * burst, "stopped_early": False,
         "extended": False, "decision": stats.OPEN}
    sample_every = max(1, reps // 3) if sample_every is None else max(1, int(sample_every))

    dev = torch.cuda.current_device()
    props = torch.cuda.get_device_properties(dev)
    l2 = int(getattr(props, "L2_cache_size", 0) or (50 << 20))
    flush_bytes = max(2 * l2, 256 << 20) if flush_bytes is None else int(flush_bytes)
    if flush_bytes < 2 * l2:
        raise ValueError(f"flush_bytes={flush_bytes} is under twice the L2 size ({l2} bytes)")
    flush = _flush_buffer(flush_bytes, dev)
    persisting = _PersistingL2()
    warnings: list[str] = []
    if isolated and not pools:
        warnings.append("this torch has no MemPool: the baselines share the allocator with the candidate (their "
                        "outputs are still scrubbed before they are freed)")
    heat_set = input_sets[-1]
    if settle_ms and len(input_sets) > 1:
        input_sets = input_sets[:-1]  # the heating calls' set is never a timed call's: no result to reuse
    elif settle_ms:
        warnings.append("one input set: the heating calls before each burst use the timed calls' inputs")
    n_sets = len(input_sets)
    if (warm_rounds + timed_rounds) * burst > n_sets:
        warnings.append(f"{n_sets} input sets for {(warm_rounds + timed_rounds) * burst} calls per function: inputs "
                        "are reused, so a candidate that caches results by input address could go unnoticed; pass "
                        "more input sets")
    if persisting.method is None:
        warnings.append(f"persisting L2 could not be reset: {persisting.error}")

    calls: dict[str, Callable[[list], Any]] = {NULL_FN: lambda args: None, **fns}
    order_base = [NULL_FN] + names
    raw: dict[str, list[dict[str, Any]]] = {n: [] for n in order_base}  # timed bursts (the null call's: all)
    errors: dict[str, dict[str, str] | None] = {n: None for n in order_base}
    samples: list[dict[str, Any]] = []
    prints: list[dict[str, Any]] = []  # fingerprints of the watched function's timed calls
    held: list[tuple[int, Any]] = []  # (index into prints, output) awaiting the later re-check
    held_bytes = 0
    graphs: dict[tuple[str, int], tuple[Any, Any]] = {}
    order: list[list[str]] = []
    fatal: dict[str, str] | None = None
    segments_timed: int | None = None
    warm_ms: dict[str, list[float]] = {n: [] for n in order_base}  # warm-up stream times: size the heating
    heat_calls: dict[str, int] = {n: 0 for n in order_base}
    watch_sample: Any = None  # the watched function's last warm-up output: the reserve's pattern
    reserved, segments_before = 0, None

    def recheck(entry_idx: int, out: Any) -> None:
        entry = prints[entry_idx]
        entry["later"] = fingerprint(out)
        entry["changed"] = not _same_fp(entry["at_return"], entry["later"])

    gc_was_enabled = gc.isenabled()
    stream = torch.cuda.Stream(device=dev, priority=HIGHEST_PRIORITY)
    stream.wait_stream(_CURRENT_STREAM())
    passes, pass_ms = 1, 0.0
    stream_ctx = torch.cuda.stream(stream)
    stream_ctx.__enter__()
    try:
        if graph:
            used = sorted({c % n_sets for c in range((warm_rounds + timed_rounds) * burst)})
            for n in names:
                try:
                    graphs.update(_capture(n, calls[n], input_sets, used))
                except Exception as exc:  # noqa: BLE001 - a candidate that cannot be captured is reported, not fatal
                    errors[n] = _error(exc)
            warnings.append("graph mode: each output is the graph's static buffer, so the later fingerprint "
                            "re-check is skipped")
        heat_start, heat_end = _EVENT(enable_timing=True), _EVENT(enable_timing=True)
        starts = [_EVENT(enable_timing=True) for _ in range(burst)]
        ends = [_EVENT(enable_timing=True) for _ in range(burst)]
        end_all = _EVENT(enable_timing=True)
        pass_ms = _flush_pass_ms(flush, starts[0], ends[0])
        passes = max(1, math.ceil(cover_ms / pass_ms)) if pass_ms > 0 else 1
        gc.collect()
        gc.disable()
        for rnd in range(warm_rounds + timed_rounds + extra_rounds):
            if race_state is not None and rnd > warm_rounds:
                done = [s for b in raw[watch] for s in b["stream_ms"]]
                go, race_state["decision"] = stats.keep_racing(done, race, reps, reps + extra_rounds * burst)
                if not go:
                    race_state["stopped_early"] = len(done) < reps
                    break
                race_state["extended"] = len(done) >= reps
            timed = rnd >= warm_rounds
            # the same input sets for every function in a round: ratios are paired
            ks = [(rnd * burst + j) % n_sets for j in range(burst)]
            alive = [n for n in order_base if errors[n] is None]
            shift = rnd % len(alive)
            alive = alive[shift:] + alive[:shift]
            if timed:
                order.append(alive)
            if rnd == warm_rounds and not graph:
                copies = _held_at_once(_nbytes(watch_sample), hold_bytes, timed_rounds, burst)
                reserved = _reserve(watch_sample, copies, dev, warnings) if reserve else 0
                watch_sample = None
                segments_before = _segments(dev)
            if rnd == warm_rounds and settle_ms:
                for n in names:
                    est = _median(warm_ms[n]) if warm_ms[n] else 0.0
                    heat_calls[n] = min(MAX_HEAT_CALLS, math.ceil(settle_ms / est)) if est > 0 else 0
            for n in alive:
                outs: list[Any] = []
                host: list[float] = []
                try:
                    _device_sync()
                    persisting.reset()
                    heating = heat_calls[n] if timed else 0
                    with _pool_context(pools.get(n), dev):
                        args = [_private(input_sets[k]) if n in fresh else input_sets[k] for k in ks]
                        if n in fresh:
                            _device_sync()  # the copies are made before the burst's host wall time starts
                        if heating:
                            heat_args = _private(heat_set) if n in fresh else heat_set
                            _RECORD(heat_start)
                            for _ in range(heating):
                                calls[n](heat_args)
                            _RECORD(heat_end)
                            _device_sync()  # the burst's wall time starts with the device free, as without heating
                            if n in isolated and n in fresh:
                                _scrub(heat_args)
                            del heat_args
                        for _ in range(passes):
                            _ZERO(flush)
                        t0 = _PERF()
                        for j, k in enumerate(ks):
                            if j:
                                _ZERO(flush)
                            g = graphs.get((n, k)) if graph and n != NULL_FN else None
                            th = _PERF()
                            _RECORD(starts[j])
                            if g is not None:
                                g[0].replay()
                                outs.append(g[1])
                            else:
                                outs.append(calls[n](args[j]))
                            host.append((_PERF() - th) * 1e3)
                            _RECORD(ends[j])
                        _device_sync()
                        t1 = _PERF()
                        _RECORD(end_all)
                        _device_sync()
                        if n in isolated and not graph:  # what another thread (autograd's) put outside the pool
                            _scrub(outs)
                            if n in fresh:
                                _scrub(args)
                        del args
                    rec = {"stream_ms": [float(_ELAPSED(starts[j], ends[j])) for j in range(burst)],
                           "gap_ms": [float(_ELAPSED(ends[j - 1], ends[j])) for j in range(1, burst)],
                           "tail_ms": float(_ELAPSED(ends[-1], end_all)), "wall_ms": (t1 - t0) * 1e3,
                           "host_ms": host, "input_set": ks, "heat_calls": heating,
                           "heat_ms": float(_ELAPSED(heat_start, heat_end)) if heating else 0.0}
                except Exception as exc:  # noqa: BLE001 - recorded per function; a dead context ends the run below
                    errors[n] = _error(exc)
                    try:
                        _device_sync()
                    except Exception as exc2:  # noqa: BLE001
                        fatal = _error(exc2)
                        raise _Fatal from None
                    continue
                if n == NULL_FN or timed:
                    raw[n].append(rec)
                else:
                    warm_ms[n].extend(rec["stream_ms"])
                if not timed and n == watch and outs and not graph:
                    watch_sample = outs[-1]
                if not timed or n != watch:
                    del outs
                    continue
                for j, (k, out) in enumerate(zip(ks, outs)):
                    i = (rnd - warm_rounds) * burst + j
                    prints.append({"call": i, "input_set": k, "at_return": fingerprint(out), "later": None,
                                   "changed": False})
                    if (sample_every < reps and i % sample_every == 0) or i == reps - 1:
                        samples.append({"fn": n, "call": i, "input_set": k, "outputs": _to_cpu(out)})
                    if not graph:
                        held.append((len(prints) - 1, out))
                        held_bytes += _nbytes(out)
                        while held_bytes > hold_bytes and len(held) > 1:
                            idx, old = held.pop(0)
                            held_bytes -= _nbytes(old)
                            recheck(idx, old)
                del outs
        if race_state is not None:
            done = [s for b in raw[watch] for s in b["stream_ms"]]
            race_state["decision"] = stats.race(done, race) if done else stats.OPEN
        for idx, old in held:
            recheck(idx, old)
        held.clear()
        segments_timed = None if segments_before is None else _segments(dev) - segments_before
    except _Fatal:
        pass
    finally:
        stream_ctx.__exit__(None, None, None)
        _CURRENT_STREAM().wait_stream(stream)
        if gc_was_enabled:
            gc.enable()

    calibration = calibrate(raw[NULL_FN])
    per = {n: count(raw[n], calibration, first_cover_ms=passes * pass_ms, flush_ms=pass_ms,
                    tail_tolerance_ms=tail_tolerance_ms, tail_tolerance_rel=tail_tolerance_rel)
           for n in names}
    for n in names:
        p = per[n]
        p["error"] = errors[n]
        if p["host_bound"] > len(p["ms"]) // 4:
            warnings.append(f"{n}: in {p['host_bound']} of {len(p['ms'])} calls the host took longer to launch the "
                            f"work (median {_median(p['host_ms']):.3f} ms) than the device work queued ahead of it: "
                            "those times include waiting for the host (graph mode removes launch cost)")

    if persisting.method is not None and not persisting.working:
        warnings.append(f"persisting L2 could not be reset: {persisting.error}")
    mismatched = [{"fn": watch, "call": e["call"], "input_set": e["input_set"]} for e in prints if e["changed"]]
    changed_timer = tampered()
    if changed_timer:
        warnings.append("timer functions were replaced during the run: " + ", ".join(changed_timer))
    if mismatched:
        warnings.append(f"{len(mismatched)} timed outputs of {watch} changed after their call returned")
    del flush, graphs
    return {
        "schema": SCHEMA,
        "device": {"index": dev, "name": props.name, "l2_bytes": l2, "sm_count": props.multi_processor_count},
        "race": race_state,
        "config": {"reps": len(order) * burst, "warmup": warm_rounds * burst, "burst": burst, "settle_ms": settle_ms,
                   "heat_calls": {n: heat_calls[n] for n in names}, "flush_bytes": flush_bytes,
                   "n_input_sets": n_sets, "sample_every": sample_every, "watch": watch, "graph": graph,
                   "tail_tolerance_ms": tail_tolerance_ms, "tail_tolerance_rel": tail_tolerance_rel,
                   "cover_ms": cover_ms, "flush_passes": passes, "flush_pass_ms": pass_ms,
                   "stream_priority": stream.priority, "reserved_bytes": reserved,
                   "allocator_segments_timed": segments_timed},
        "l2": {"flush_bytes": flush_bytes, "persisting_reset": persisting.method if persisting.working else None,
               "persisting_error": persisting.error},
        "calibration": calibration,
        "order": order,
        "fns": per,
        "samples": samples,
        "fingerprints": prints,
        "fingerprint_mismatches": mismatched,
        "tampered": changed_timer,
        "fatal": fatal,
        "warnings": warnings,
    }


# ---- counting: raw events -> each call's time (pure arithmetic, tested on the CPU) ------------------------------
def calibrate(null_bursts: list[dict[str, Any]]) -> dict[str, float]:
    """What an empty call leaves: its tail after the burst, the burst's host wall time, and (bursts of two or more)
    the device time from one call's end to the next, which is the flush pass between them."""
    gaps = [g for b in null_bursts for g in b["gap_ms"]]
    return {"null_tail_ms": _median([b["tail_ms"] for b in null_bursts]) if null_bursts else 0.0,
            "null_wall_ms": _median([b["wall_ms"] for b in null_bursts]) if null_bursts else 0.0,
            "null_stream_ms": _median([s for b in null_bursts for s in b["stream_ms"]]) if null_bursts else 0.0,
            "null_gap_ms": _median(gaps) if gaps else 0.0}


def count(bursts: list[dict[str, Any]], calibration: dict[str, float], *, first_cover_ms: float, flush_ms: float,
          tail_tolerance_ms: float = 0.05, tail_tolerance_rel: float = 0.10) -> dict[str, Any]:
    """Each timed call's counted time from its burst's events.

    The first call of a burst counts its stream time (start -> end). A later call counts the device time since the
    previous call's end less an empty call's (the flush pass between them), and never less than its own stream time:
    work a candidate left running on another stream during the flush slows the flush or the next call and is
    counted. Device work still running after the burst (its tail beyond an empty call's) is spread over the burst's
    calls, and the burst's calls are flagged; so are calls whose host wall time the events cannot explain.
    """
    tol = (tail_tolerance_ms, tail_tolerance_rel)
    p: dict[str, Any] = {"ms": [], "stream_ms": [], "gap_ms": [], "tail_ms": [], "wall_ms": [], "host_ms": [],
                         "input_set": [], "flagged": [], "host_bound": 0}
    cal_gap = calibration.get("null_gap_ms", 0.0)
    for b in bursts:
        first = len(p["ms"])
        ms = []
        for j, s in enumerate(b["stream_ms"]):
            t = s
            if j:
                hidden = b["gap_ms"][j - 1] - cal_gap - s
                if hidden > max(tol[0], tol[1] * s):
                    p["flagged"].append({"call": first + j, "why": "gap", "excess_ms": hidden})
                t = max(s, b["gap_ms"][j - 1] - cal_gap)
            ms.append(t)
        if b.get("heat_calls") and not 0.5 <= b["heat_ms"] / b["heat_calls"] / max(_median(ms), 1e-6) <= 2.0:
            # the untimed heating calls ran far faster or slower than the timed ones: the function behaves
            # differently when it is not timed, and the clock the burst started at is not the one it settles at
            p["flagged"].extend({"call": first + j, "why": "heat", "excess_ms": 0.0} for j in range(len(ms)))
        excess = b["tail_ms"] - calibration["null_tail_ms"]
        if excess > max(tol[0], tol[1] * sum(b["stream_ms"])):
            p["flagged"].extend({"call": first + j, "why": "tail", "excess_ms": excess / len(ms)}
                                for j in range(len(ms)))
            ms = [t + excess / len(ms) for t in ms]
        if b["wall_ms"] - calibration["null_wall_ms"] > 1.5 * sum(ms) + 0.2:
            p["flagged"].extend({"call": first + j, "why": "wall",
                                 "excess_ms": (b["wall_ms"] - calibration["null_wall_ms"] - sum(ms)) / len(ms)}
                                for j in range(len(ms)))
        for j, t in enumerate(ms):
            cover = first_cover_ms if j == 0 else flush_ms + ms[j - 1]
            p["host_bound"] += b["host_ms"][j] > cover
        p["ms"].extend(ms)
        p["stream_ms"].extend(b["stream_ms"])
        p["gap_ms"].extend([None] + list(b["gap_ms"]))
        p["tail_ms"].extend([b["tail_ms"]] * len(ms))
        p["wall_ms"].extend([b["wall_ms"]] * len(ms))
        p["host_ms"].extend(b["host_ms"])
        p["input_set"].extend(b["input_set"])
    p["inconsistent"] = len({f["call"] for f in p["flagged"]}) > max(1, len(p["ms"]) // 4)
    return p


def _storages(out: Any) -> list[int]:
    """Byte sizes of the distinct CUDA storages behind an output (views of one buffer count once)."""
    seen: dict[int, int] = {}
    for t in _tensors(out):
        if t.is_cuda:
            st = t.untyped_storage()
            seen.setdefault(st.data_ptr(), st.nbytes())
    return [b for b in seen.values() if b]


def _held_at_once(out_bytes: int, hold_bytes: int, timed_rounds: int, burst: int) -> int:
    """The most outputs of the watched function alive at once in the timed rounds: those the later re-check holds
    (within hold_bytes, at least one) plus a burst's own, never more than the timed calls; 0 without outputs."""
    if out_bytes <= 0:
        return 0
    return min(timed_rounds * burst, max(1, hold_bytes // out_bytes) + burst)


def _reserve(sample: Any, copies: int, device: int, warnings: list[str]) -> int:
    """Grow the caching allocator (on the current stream) by `copies` blocks of each storage size of `sample` (an
    output of the watched function), poisoned with NaN (all-ones bytes), and by the fingerprint's working memory
    (one fingerprint of the sample while the blocks are taken), then free them all: the outputs measure holds, and
    their fingerprints, are carved from cached blocks instead of a cudaMalloc inside the timed call. Returns the
    bytes reserved; at most RESERVE_SHARE of the free device memory (the baselines' own pool and the candidate's
    working memory need the rest), and a reserve cut short says so in a warning (calls then allocate as before)."""
    storages = _storages(sample)
    per_copy = sum(storages)
    if per_copy:
        free = torch.cuda.mem_get_info(device)[0] + torch.cuda.memory_reserved(device) - \
            torch.cuda.memory_allocated(device)
        affordable = int(free * RESERVE_SHARE) // per_copy
        if affordable < copies:
            warnings.append(f"reserved {affordable} of the {copies} output blocks the re-check may hold (at most "
                            f"{RESERVE_SHARE:.0%} of the free device memory): timed calls beyond them allocate device "
                            "memory inside their host time")
            copies = affordable
    blocks: list[torch.Tensor] = []
    try:
        for _ in range(copies):
            for nbytes in storages:
                blocks.append(torch.empty(nbytes, dtype=torch.uint8, device=device))
        fingerprint(sample)
    except torch.cuda.OutOfMemoryError:
        warnings.append(f"could reserve only {len(blocks)} of {copies * len(storages)} output blocks: timed calls "
                        "beyond them allocate device memory inside their host time")
    for b in blocks:
        _FILL(b, 255)
    reserved = sum(b.numel() for b in blocks)
    del blocks
    return reserved


def _segments(device: int) -> int:
    """Device memory segments the caching allocator has allocated so far (each one a cudaMalloc)."""
    return int(torch.cuda.memory_stats(device).get("segment.all.allocated", 0))


@contextlib.contextmanager
def _pool_context(pool: Any, device: int):
    """This thread's device allocations come from `pool` inside (None: the default pool); torch's use_mem_pool,
    through the functions captured at import."""
    if pool is None:
        yield
        return
    _POOL_BEGIN(device, pool.id)
    try:
        yield
    finally:
        _POOL_END(device, pool.id)
        _POOL_RELEASE(device, pool.id)


def _scrub(out: Any) -> None:
    """Every byte of the CUDA storages behind `out` set to 0xFF (NaN in every float format), before they are freed."""
    for t in _tensors(out):
        if t.is_cuda and t.untyped_storage().nbytes():
            _FILL(torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage()), 255)


def _private(input_set: list) -> list:
    """A copy of an input set's tensors, for a function that may write over its inputs."""
    return [x.clone() if isinstance(x, torch.Tensor) else x for x in input_set]


def _flush_buffer(nbytes: int, device: int) -> torch.Tensor:
    return torch.empty(nbytes // 4, dtype=torch.int32, device=device)


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
    return _median(times[1:])


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
