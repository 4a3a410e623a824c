"""What `profiler.timing.measure` was asked, checked into a plan; the device it times on; the state its rounds fill.
These are the records the timing loop (profiler.timing) passes between its steps.
"""
from __future__ import annotations

import ctypes
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import torch

from . import stats
from .device_memory import fingerprint, flush_buffer, private_pools, same_fp

NULL_FN = "_null"  # the empty call that calibrates the honest tail and wall time


def warm_rounds(warmup: int, burst: int, settle_ms: float) -> int:
    """The untimed rounds before the first timed one: the warm-up in whole bursts, and at least one where timing
    settles (it estimates how many heating calls fill `settle_ms`)."""
    return max(-(-warmup // burst), 1 if settle_ms else 0)


def cycled_sets(n_sets: int, settle_ms: float) -> int:
    """How many of the `n_sets` input sets the calls cycle through: all but the last where heating calls keep that
    one for themselves (a heating call's result is never a timed call's to reuse)."""
    return n_sets - 1 if settle_ms and n_sets > 1 else n_sets


def round_sets(rnd: int, burst: int, cycled: int) -> list[int]:
    """The input sets of round `rnd`'s calls, the same for every function measured (the ratios are paired)."""
    return [(rnd * burst + j) % cycled for j in range(burst)]


def timed_call_set(call: int, *, warmup: int, burst: int, settle_ms: float, n_sets: int) -> int:
    """The input set that timed call `call` (0 the first timed call) is given: what the parent checks a sample's
    reported set against, from what it asked of the measurement alone."""
    rnd, j = divmod(call, burst)
    return round_sets(warm_rounds(warmup, burst, settle_ms) + rnd, burst, cycled_sets(n_sets, settle_ms))[j]


class PersistingL2:
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


@dataclass(frozen=True)
class Plan:
    """What `measure` was asked to do, checked: the functions, the rounds, and what is done with the outputs."""
    names: list[str]
    calls: dict[str, Callable[[list], Any]]  # the functions, the empty call (NULL_FN) first
    watch: str
    fresh: set[str]
    isolated: set[str]
    pools: dict[str, Any]
    input_sets: list[list]  # the timed calls' sets
    heat_set: list  # the heating calls' set
    burst: int
    reps: int
    warm_rounds: int
    timed_rounds: int
    extra_rounds: int
    sample_every: int
    settle_ms: float
    graph: bool
    hold_bytes: int
    tail_tolerance: tuple[float, float]  # (ms, share of the burst's stream time)
    cover_ms: float
    reserve: bool
    race: stats.RaceRule | None
    warnings: tuple[str, ...]

    @property
    def order_base(self) -> list[str]:
        return [NULL_FN] + self.names


@dataclass
class Bench:
    """The device, its flush buffer and persisting-L2 reset, and the flush cover measured on it."""
    dev: int
    props: Any
    l2: int
    flush_bytes: int
    flush: torch.Tensor | None
    persisting: PersistingL2
    passes: int = 1
    pass_ms: float = 0.0

    @classmethod
    def on_current_device(cls, flush_bytes: int | None) -> "Bench":
        dev = torch.cuda.current_device()
        props = torch.cuda.get_device_properties(dev)
        l2 = int(getattr(props, "L2_cache_size", 0) or (50 << 20))
        flush_bytes = max(2 * l2, 256 << 20) if flush_bytes is None else int(flush_bytes)
        if flush_bytes < 2 * l2:
            raise ValueError(f"flush_bytes={flush_bytes} is under twice the L2 size ({l2} bytes)")
        return cls(dev, props, l2, flush_bytes, flush_buffer(flush_bytes, dev), PersistingL2())


@dataclass
class State:
    """What the rounds have measured and kept so far."""
    raw: dict[str, list[dict[str, Any]]]  # timed bursts (the null call's: all)
    errors: dict[str, dict[str, str] | None]
    warm_ms: dict[str, list[float]]  # warm-up stream times: size the heating
    heat_calls: dict[str, int]
    race: dict[str, Any] | None
    warnings: list[str]
    samples: list[dict[str, Any]] = field(default_factory=list)
    prints: list[dict[str, Any]] = field(default_factory=list)  # fingerprints of the watched function's timed calls
    held: list[tuple[int, Any]] = field(default_factory=list)  # (index into prints, output) awaiting the re-check
    held_bytes: int = 0
    graphs: dict[tuple[str, int], tuple[Any, Any]] = field(default_factory=dict)
    order: list[list[str]] = field(default_factory=list)
    fatal: dict[str, str] | None = None
    segments_timed: int | None = None
    watch_sample: Any = None  # the watched function's last warm-up output: the reserve's pattern
    reserved: int = 0
    segments_before: int | None = None
    kept: dict[int, tuple[int, Any]] | None = None  # measure's keep_outputs: the held outputs, sampled later
    phase_s: dict[str, float] = field(default_factory=dict)  # host seconds by phase of the run (measure's config)

    def lap(self, phase: str, since: float) -> float:
        """Add the seconds since `since` to `phase`; return now."""
        now = time.monotonic()
        self.phase_s[phase] = self.phase_s.get(phase, 0.0) + now - since
        return now

    @classmethod
    def start(cls, plan: Plan) -> "State":
        race = None if plan.race is None else \
            {**plan.race.to_dict(), "planned_reps": plan.reps, "extra_reps": plan.extra_rounds * plan.burst,
             "stopped_early": False, "extended": False, "decision": stats.OPEN}
        return cls({n: [] for n in plan.order_base}, {n: None for n in plan.order_base},
                   {n: [] for n in plan.order_base}, {n: 0 for n in plan.order_base}, race, list(plan.warnings))

    def recheck(self, entry_idx: int, out: Any) -> None:
        entry = self.prints[entry_idx]
        entry["later"] = fingerprint(out)
        entry["changed"] = not same_fp(entry["at_return"], entry["later"])


def make_plan(fns: dict[str, Callable[[list], Any]], input_sets: list[list], *, reps: int, warmup: int, burst: int,
          settle_ms: float, watch: str | None, sample_every: int | None, graph: bool, hold_bytes: int,
          fresh_inputs: Iterable[str], tail_tolerance: tuple[float, float], cover_ms: float, reserve: bool,
          isolate: Iterable[str],
          race: stats.RaceRule | None, extra_reps: int) -> Plan:
    """The arguments checked (ValueError names the wrong one) and the rounds they ask for."""
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
    pools = private_pools(isolated)
    watch = names[0] if watch is None else watch
    if watch not in fns:
        raise ValueError(f"watch={watch!r} is not one of {names}")
    warm, timed_rounds = warm_rounds(warmup, burst, settle_ms), -(-reps // burst)
    extra_rounds = -(-extra_reps // burst) if race is not None else 0
    reps = timed_rounds * burst
    warnings = []
    if isolated and not pools:
        warnings.append("this torch has no MemPool: the baselines share the allocator with the candidate (their "
                        "outputs are still scrubbed before they are freed)")
    heat_set = input_sets[-1]
    if settle_ms and len(input_sets) == 1:
        warnings.append("one input set: the heating calls before each burst use the timed calls' inputs")
    input_sets = input_sets[:cycled_sets(len(input_sets), settle_ms)]  # the heating calls' set is never timed
    if (warm + timed_rounds) * burst > len(input_sets):
        warnings.append(f"{len(input_sets)} input sets for {(warm + timed_rounds) * burst} calls per "
                        "function: inputs are reused, so a candidate that caches results by input address could go "
                        "unnoticed; pass more input sets")
    return Plan(names, {NULL_FN: lambda args: None, **fns}, watch, fresh, isolated, pools, input_sets, heat_set,
                 burst, reps, warm, timed_rounds, extra_rounds,
                 max(1, reps // 3) if sample_every is None else max(1, int(sample_every)), settle_ms, graph,
                 hold_bytes, tail_tolerance, cover_ms, reserve, race, tuple(warnings))
