"""The timing stage's half that runs in the candidate's process: input sets, baselines, profiler.timing.measure.

Input sets: a few base sets drawn with the task's own get_inputs() under seeds the parent chose, and the rest
derived on the device by `derive` (roll the last dimension, rescale), which the parent repeats bit for bit to
compute the expected output of any timed call. Every timed call therefore sees different values at a different
address, and the parent can check any of them.

With `defer_samples` the timed outputs of the candidate stay on the device after the measurement (`kept_calls` in
the reply) and a second request, `samples`, copies the calls the parent picked only then: the GPU's exclusive turn
ends before any output is copied, and the candidate cannot know which of its calls are checked.

The baselines (the task's reference eager, under torch.compile, Liger) are trusted code: they run with the sandbox's
trusted flag so torch.compile may start the compiler tools it needs. The candidate's calls do not.
"""
from __future__ import annotations

import gc
import time
from typing import Any, Callable

import torch

from . import policy

SET_BUDGET_BYTES = 24 << 30  # device memory the input sets may take, at most (set_budget)


def derive(base_sets: list[list[Any]], k: int, fixed: tuple[int, ...]) -> list[Any]:
    """Input set k: base set k % len(base_sets), floating inputs rolled along their last dim and rescaled from the
    second round on (the parent repeats this bit for bit). Each is a new contiguous tensor written in one pass."""
    src = base_sets[k % len(base_sets)]
    out = []
    for i, x in enumerate(src):
        if isinstance(x, torch.Tensor):
            if k >= len(base_sets) and x.is_floating_point() and i not in fixed and x.dim() > 0 and x.numel():
                x = rolled(x, (7919 * k) % x.shape[-1], 1.0 + 0.01 * (k % 17) if k % 17 else None)
            else:
                x = x.clone()
        out.append(x)
    return out


def rolled(x: torch.Tensor, shift: int, scale: float | None) -> torch.Tensor:
    """torch.roll(x, shift, dims=-1) times `scale` (None: not scaled), as a new contiguous tensor, bit for bit, in
    one pass over x: the two halves of the roll each multiplied into their place (a 16-bit tensor's product taken in
    float32 and rounded once, as x.mul_(scale) would)."""
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    n = x.shape[-1]
    for src, dst in ((x[..., :n - shift], y[..., shift:]), (x[..., n - shift:], y[..., :shift])):
        if dst.numel() == 0:
            continue
        if scale is None:
            dst.copy_(src)
        else:
            torch.mul(src, scale, out=dst)
    return y


def set_budget(gpu_bytes: int) -> int:
    """The device memory a timing's input sets may take on a GPU of `gpu_bytes` (0: unknown): an eighth of it, as
    the timed outputs kept for sampling may (timing_parent.defer_bytes), and at most SET_BUDGET_BYTES. Two timings
    hold theirs at once beside the other checks (sandbox/gate.py), so a task of gigabytes gets fewer sets, each call
    still at another address than the last, instead of fewer checks at once (SwiGLU at Llama-3 8B's width: 19 sets
    for its 66 calls on the H200, 11 on an H100, 27 before)."""
    return min(SET_BUDGET_BYTES, gpu_bytes // 8) if gpu_bytes > 0 else SET_BUDGET_BYTES


def set_count(base_set: list[Any], wanted: int, budget: int = SET_BUDGET_BYTES) -> int:
    """As many input sets as calls, within `budget` bytes of device memory, and never fewer than two."""
    nbytes = sum(x.numel() * x.element_size() for x in base_set if isinstance(x, torch.Tensor))
    return max(2, min(wanted, budget // max(1, nbytes)))


def set_count_for(base_set: list[Any], msg: dict[str, Any]) -> int:
    """The input sets a timing `msg` gets: one for each of its calls (warm-up, timed and extra, in whole bursts) and
    one for its heating calls, within its `set_bytes`. The parent counts them too, from its own base set."""
    burst = int(msg.get("burst", 1))
    extra = int(msg.get("extra_reps", 0)) if msg.get("race") else 0
    calls = (-(-msg["warmup"] // burst) - (-msg["reps"] // burst) - (-extra // burst)) * burst  # whole bursts
    return set_count(base_set, calls + (1 if msg.get("settle_ms") else 0), int(msg.get("set_bytes", SET_BUDGET_BYTES)))


def _trusted(fn: Callable[[list], Any]) -> Callable[[list], Any]:
    def call(args: list) -> Any:
        with policy.trusted():
            return fn(args)
    return call


def prepare(state: dict[str, Any], msg: dict[str, Any]) -> dict[str, Any]:
    """The input sets, the reference and the baselines of the timing `msg` asks for, built ahead of its `time`
    request (the same fields), each baseline called once, so the GPU's exclusive turn covers the measurement alone."""
    state.pop("prepared", None)
    laps: dict[str, float] = {}
    state["prepared"] = (_fields(msg), _prepare(msg, laps))
    t0 = time.monotonic()
    # The measurement collects garbage once before its rounds (and then holds the collector off): what exists now is
    # collected here and frozen, so that pass, inside the GPU's exclusive turn, walks only what came after.
    gc.collect()
    gc.freeze()
    laps["child_gc_s"] = time.monotonic() - t0
    return {"ok": True, "laps": laps}


def _fields(msg: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in msg.items() if k not in ("op", "defer_samples")}


def _prepare(msg: dict[str, Any], laps: dict[str, float]) -> tuple[Any, ...]:
    from profiler import baselines as baseline_lib
    from profiler import stats
    from profiler.device_memory import first_call

    from .task import load_task

    t0 = time.monotonic()
    with policy.trusted():  # the user's task file, the reference and the baselines: trusted code
        task = load_task(msg["task"])
        if msg["overrides"]:
            task = task.with_constants(msg["overrides"])
        device = "cuda"
        base = [task.make_inputs(seed, "normal", device) for seed in msg["base_seeds"]]
        burst, settle_ms = int(msg.get("burst", 1)), float(msg.get("settle_ms", 0.0))
        race = stats.RaceRule(**msg["race"]) if msg.get("race") else None
        extra = int(msg.get("extra_reps", 0)) if race is not None else 0
        n_sets = set_count_for(base[0], msg)
        sets = [derive(base, k, task.meta.fixed_inputs) for k in range(n_sets)]
        reference = task.make_reference(msg["model_seed"], device)
        laps["child_sets_s"] = time.monotonic() - t0
        built = baseline_lib.build_all(tuple(msg["baselines"]), reference, task.module)
        t1 = time.monotonic()
        laps["child_baselines_s"] = t1 - t0 - laps["child_sets_s"]
        for b in built.values():  # a baseline's once-a-process costs (cuDNN's plans, torch.compile compiling) here,
            if b.available:  # not in the measurement's exclusive turn; an error is the measurement's to report
                first_call(b.fn, sets[-1], torch.cuda.current_device())
    laps["child_first_calls_s"] = time.monotonic() - t1
    return sets, n_sets, built, burst, settle_ms, race, extra


def run(state: dict[str, Any], msg: dict[str, Any]) -> dict[str, Any]:
    from profiler import compile_stats, timing
    from profiler.env import environment

    t_run = time.monotonic()
    laps: dict[str, float] = {}
    fields, prepared = state.pop("prepared", (None, None))
    if fields != _fields(msg):  # not prepared for this timing: built here, inside the measurement's turn
        prepared = _prepare(msg, laps)
    sets, n_sets, built, burst, settle_ms, race, extra = prepared
    fns: dict[str, Callable[[list], Any]] = {}
    model = state.get("model")
    if model is not None:
        fns["candidate"] = lambda args: model(*args)
    for name, b in built.items():
        if b.available:
            fns[name] = _trusted(b.fn)
    t1 = time.monotonic()
    # Baselines get private copies of the inputs (Liger's cross-entropy writes its gradient over the logits) and
    # memory the candidate can never be handed (their results: THREATS #5).
    watch = next(iter(fns))
    others = [n for n in fns if n != watch]
    state.pop("kept", None)
    kept: dict[int, tuple[int, Any]] | None = {} if msg.get("defer_samples") else None
    hold = {"hold_bytes": int(msg["hold_bytes"])} if msg.get("hold_bytes") else {}
    measured = timing.measure(fns, sets, reps=msg["reps"], warmup=msg["warmup"], burst=burst, settle_ms=settle_ms,
                              watch=watch, sample_every=msg["sample_every"], fresh_inputs=others, isolate=others,
                              race=race, extra_reps=extra, keep_outputs=kept, **hold)
    if kept is not None:
        state["kept"] = kept
    laps["child_measure_s"] = time.monotonic() - t1
    del sets, prepared  # the input sets go back to the GPU now, not after the samples (the kept outputs alone stay):
    torch.cuda.empty_cache()  # the next timing on this GPU builds its own meanwhile
    t2 = time.monotonic()
    laps["child_free_sets_s"] = t2 - t1 - laps["child_measure_s"]
    phases = (measured.get("config") or {}).get("phase_s") or {}
    laps.update({f"child_measure_{k}_s": float(v) for k, v in phases.items()})  # where the measurement's time went
    with policy.trusted():
        kernels = [k.to_dict() for k in compile_stats.kernel_stats(state["module"])] if "module" in state else []
        env = environment(torch.cuda.current_device())
    laps["child_stats_env_s"] = time.monotonic() - t2
    reply = {"ok": True, "measured": measured, "n_sets": n_sets, "kernels": kernels, "environment": env,
             "baselines": {name: b.to_dict() for name, b in built.items()}, "laps": laps}
    if kept is not None:
        reply["kept_calls"] = sorted(kept)
    laps["child_run_s"] = time.monotonic() - t_run  # the request's own seconds here; the rest is its journey
    return reply


def samples(state: dict[str, Any], msg: dict[str, Any],
            hand_back: Callable[[list[Any], list[Any], int], list[Any]] | None = None) -> dict[str, Any]:
    """The kept outputs of the timed calls the parent picked after the measurement: into the GPU buffers it lent,
    call after call (`hand_back`, the worker's), else copied to the CPU; every kept output is released."""
    from profiler.device_memory import to_cpu

    kept = state.pop("kept", None) or {}
    buffers = msg.get("out_buffers") or []
    out, at = [], 0
    for c in msg["calls"]:
        if c not in kept:
            continue
        outs = kept[c][1]
        if buffers and hand_back is not None:
            outs = list(outs) if isinstance(outs, (list, tuple)) else [outs]
            sent = hand_back(outs, buffers, at)
            at += len(outs)
        else:
            sent = to_cpu(outs)
        out.append({"call": int(c), "input_set": kept[c][0], "outputs": sent})
    kept.clear()
    torch.cuda.empty_cache()  # the kept outputs and the input sets back to the GPU: the next timing builds its own
    return {"ok": True, "samples": out}
