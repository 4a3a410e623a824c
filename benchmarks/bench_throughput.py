"""How many candidates a run judges a minute: the tuner's search on memory- and compute-bound tasks, end to end.

    python3 benchmarks/bench_throughput.py                                   # on the H200: four tasks, ~4 min
    python3 benchmarks/bench_throughput.py --checks-per-gpu 1 --label serial # the same, one check at a time
    python3 benchmarks/bench_throughput.py --device cpu --tasks rmsnorm_fwd --seconds 20 --checks-per-gpu 2
    python3 benchmarks/bench_throughput.py --tasks attention_fwd_bwd --seconds 240 --timeline runs/timeline
    python3 benchmarks/bench_throughput.py --gpus 2 --label two-gpus          # K checks at once on each of two GPUs

Each task is searched by the offline tuner (no LLM: the proposer costs nothing, so the harness is what is measured)
from its registered seed, for `--seconds` of proposing (the loop's --time-limit), with the run's candidates timed
against eager on the GPU. What is reported, per task:

- verified a minute: accepted proposals whose verdict came between the starting kernel's verdict and the last
  proposal's, over that window (the harness's start, the starting kernel and the final re-check are outside it).
  The slots fill at the starting kernel's verdict and drain after the time limit, so a window of under two rounds
  of proposals measures the first round, not the steady rate, and says so: attention fwd+bwd, about 50 s a
  candidate at four checks and its starting kernel's check 50-60 s of the time limit, needs --seconds 240;
- where a candidate's seconds go (means over the window's proposals): load (forking its process, the CUDA context,
  importing and building ModelNew), compile (the first call, in which Triton compiles every kernel), correctness,
  robustness (other shapes, their compiles, the soak), timing, and of those the seconds spent waiting for the GPU's
  gate (sandbox/gate.py: checks share the GPU, a timing holds it alone);
- the GPU's idle fraction: the share of the window in which no gated GPU work (a check's call, reference or
  comparison, or a timing) was in progress; the timing share; and NVML's utilisation, sampled every 0.2 s where the
  machine has pynvml, with the most GPU memory in use seen (all processes), and seen up to the starting kernel's
  verdict (its check the only one: what one check of the task holds), and of it the most this process's PyTorch
  allocator held (the slots' parents, one allocator: the rest is the candidates' processes and CUDA contexts); with
  `--gpus N`, each of these is the mean over the N GPUs (the memory the most on any one), and the rate is the
  run's over all of them; the parent process's CPU seconds over the run's wall time (near one core: its threads,
  which prepare inputs, references and comparisons for every slot, queue on its interpreter lock; `--parent-cpu N`
  prints where that CPU went, benchmarks/thread_cpu.py);
- the checks in flight: the share of the window at each count of checks running at once (printed; each slot's
  checks as the executor saw them, a retried check in each try), which shows a run that gave checks up for a
  full GPU and when (the timeline keeps the spans and the run's notes);
- how long the gate was held a candidate for each kind of work (`gate_held`, printed and in the CSV): exclusive:time
  is the measurement, shared:call / soak / rebuild / samples / prepare_timing the candidate's requests, shared:inputs /
  reference / compare / timing_inputs / timing_validate the parent's own steps. Shared holds overlap, so their sum
  may pass the window; a long one is what a waiting timing, and every check behind it, waits for.
- the starting kernel's speedup over eager and the best kernel's at the end (its final re-check): whether the search
  found kernels at least as fast;
- the rejected candidates by stage and reason (`rejections`), one message of each kind printed; and how many of the
  verified ones compiled to kernels of their own, not the starting kernel's or another's (`distinct_verified`: a
  tuner edit in a branch the task's shape never takes verifies a kernel already verified).

Every task's line is printed and appended to benchmarks/data/throughput.csv with the GPU, driver, versions and commit.
"""
from __future__ import annotations

import argparse
import json
import logging
import math
import re
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from benchmarks._bench import append_csv, task_files  # noqa: E402
from benchmarks._bench import commit as repo_commit  # noqa: E402
from benchmarks import thread_cpu  # noqa: E402
from benchmarks.thread_cpu import ThreadCpu  # noqa: E402
CSV = ROOT / "benchmarks" / "data" / "throughput.csv"
TASKS = ("rmsnorm_fwd", "softmax_fwd", "swiglu_fwd", "attention_fwd_bwd")  # three memory-bound, one compute-bound
PARTS = ("static", "load", "compile", "correctness", "robustness", "timing")
FIELDS = ["date", "commit", "label", "device", "gpu", "driver", "torch", "triton", "task", "checks_per_gpu",
          "seconds", "wall_s", "window_s", "proposals", "verified", "rejected", "verified_per_min",
          "proposals_per_min", *(f"{p}_s" for p in PARTS), "gpu_wait_s", "timing_wait_s", "gpu_idle_frac",
          "gpu_timing_frac", "nvml_util_pct", "parent_cpu_frac", "distinct_verified", "start_speedup",
          "best_speedup", "rejections", "gate_held", "gpu_mem_peak_gib", "checks_at_end", "gpus",
          "start_mem_peak_gib", "parent_mem_peak_gib"]


def parts_of(diagnostics: dict[str, Any]) -> dict[str, float]:
    """A verdict record's seconds by part (PARTS), and its waits for the GPU's gate."""
    stages = {s["stage"]: float(s.get("seconds") or 0.0) for s in diagnostics.get("stages", [])}
    costs = diagnostics.get("costs") or {}
    out = {"static": stages.get("static", 0.0), "load": costs.get("spawn_s", 0.0) + stages.get("compile", 0.0),
           "compile": stages.get("smoke", 0.0), "correctness": stages.get("correctness", 0.0),
           "robustness": stages.get("robustness", 0.0), "timing": stages.get("timing", 0.0)}
    out["gpu_wait"] = costs.get("gpu_wait_s", 0.0)
    out["timing_wait"] = costs.get("timing_wait_s", 0.0)
    return out


def laps_of(diagnostics: dict[str, Any]) -> dict[str, float]:
    """Finer than PARTS: the verdict's cost laps (the parent's seconds by phase, e.g. reference_build_s, ship_s,
    compare_s) and the timing stage's own laps (timing.child_measure_s, ...)."""
    out = {k: float(v) for k, v in (diagnostics.get("costs") or {}).items() if isinstance(v, (int, float))}
    laps = ((diagnostics.get("timing") or {}).get("laps") or {})
    out.update({f"timing.{k}": float(v) for k, v in laps.items() if isinstance(v, (int, float))})
    return out


OUTSIDE = re.compile(r"(\d+)/(\d+) elements outside tolerance")
FEW_ELEMENTS = 10


def rejection_kind(stage: str | None, reason: str | None, message: str) -> str:
    """stage/reason of a rejection; a wrong result also says whether a few elements (<= FEW_ELEMENTS: a rounding
    tail) or more were outside tolerance."""
    kind = f"{stage or '-'}/{reason}"
    found = OUTSIDE.search(message or "")
    if found:
        kind += " (a few elements)" if int(found.group(1)) <= FEW_ELEMENTS else " (many elements)"
    return kind


class NvmlSampler:
    """GPU utilisation (%) and the GPU's memory in use (all processes: the harness's and the candidates') every
    `every_s` on a thread; `stop` gives the mean utilisation, None where NVML cannot be read, and `memory` each
    reading, (monotonic time, GiB in use, GiB this process's PyTorch allocator holds there, GiB of that in live
    tensors): the run's own process, whose slots' parents share one allocator, against the candidates' processes and
    every process's CUDA context, the rest; and of the parent's, what it uses against what its allocator keeps
    cached. `peak` reads the most of them (how close the checks at once came to the GPU's size)."""

    IN_USE, RESERVED = 1, 2  # `peak`'s columns of a reading

    def __init__(self, gpu: int, every_s: float = 0.2):
        self.samples: list[float] = []
        self.memory: list[tuple[float, float, float, float]] = []
        self._gpu = gpu
        self._stop = threading.Event()
        self._handle = None
        try:
            import pynvml
            pynvml.nvmlInit()
            self._nvml = pynvml
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(gpu)
        except Exception:  # noqa: BLE001 - no pynvml, no driver: the gate's bookkeeping still says how busy it was
            return
        self._thread = threading.Thread(target=self._run, args=(every_s,), daemon=True)
        self._thread.start()

    def _run(self, every_s: float) -> None:
        import torch
        while not self._stop.wait(every_s):
            self.samples.append(float(self._nvml.nvmlDeviceGetUtilizationRates(self._handle).gpu))
            used = self._nvml.nvmlDeviceGetMemoryInfo(self._handle).used / 2**30
            parent = torch.cuda.memory_reserved(self._gpu) / 2**30
            live = torch.cuda.memory_allocated(self._gpu) / 2**30
            self.memory.append((time.monotonic(), used, parent, live))

    def peak(self, until: float = math.inf, column: int = IN_USE) -> float | None:
        """The most read up to monotonic time `until` of the GPU's memory in use (IN_USE) or of this process's
        allocator's reserve (RESERVED); None where nothing was read by then."""
        return max((reading[column] for reading in self.memory if reading[0] <= until), default=None)

    def stop(self) -> float | None:
        if self._handle is None:
            return None
        self._stop.set()
        self._thread.join(timeout=2)
        return statistics.fmean(self.samples) if self.samples else None


def measure(task: Path, *, device: str, seconds: float, checks_per_gpu: int, workdir: Path,
            gpus: int = 1, parent_top: int = 0) -> dict[str, Any]:
    """One tuner run on `task` (on `gpus` GPUs, `checks_per_gpu` checks at once on each); the numbers of one CSV
    line. `parent_top`: how many of the places in the parent's code that took the most of its CPU to list in the
    row's `parent_top` (benchmarks/thread_cpu.py; 0: none, and no sampling)."""
    from agent.archive.store import Archive
    from agent.search.executors import LocalExecutor
    from agent.search.issuing import FEWER_CHECKS, MORE_CHECKS
    from agent.search.loop import EventKind, RunConfig, run_search
    from agent.search.tuner import compiled_signature
    from sandbox.gate import EXCLUSIVE, held_by_work

    verdicts: list[tuple[float, Any]] = []  # (when, candidate) of every verdict, in order
    changes: list[tuple[float, str]] = []  # (when, note) of the run's notes on its checks at once

    def on_event(event: Any) -> None:
        if event.kind is EventKind.EVALUATED and event.candidate is not None:
            verdicts.append((time.monotonic(), event.candidate))
        elif event.kind is EventKind.NOTE and event.message.startswith((FEWER_CHECKS, MORE_CHECKS)):
            changes.append((time.monotonic(), event.message))

    executor = LocalExecutor()
    if device == "cuda":  # the slots the run gets: fewer than asked where the task's checks do not fit at once
        import torch

        from agent.search.executors import checks_that_fit
        from sandbox.task import load_task
        checks_per_gpu = checks_that_fit(load_task(task), torch.cuda.get_device_properties(0).total_memory,
                                         checks_per_gpu)
    config = RunConfig(task_path=task, device=device, budget=100_000, time_limit_s=seconds, polish=0,
                       checks_per_gpu=checks_per_gpu, final_baselines=("eager",), gpus=gpus)
    samplers = [NvmlSampler(gpu) for gpu in range(gpus)] if device == "cuda" else []
    cpu0 = time.process_time()
    t0 = time.monotonic()
    threads = ThreadCpu().start() if parent_top else None
    with Archive(workdir / f"{task.stem}.db") as archive:
        summary = run_search(config, archive, on_event=on_event, executor=executor)
    wall = time.monotonic() - t0
    if threads is not None:
        threads.stop()
    parent_cpu = (time.process_time() - cpu0) / max(wall, 1e-9)  # near 1: the parent's threads queue on its GIL
    utilisations = [sampler.stop() for sampler in samplers]
    nvml = statistics.fmean(utilisations) if utilisations and None not in utilisations else None
    peaks = [p for p in (sampler.peak() for sampler in samplers) if p is not None]
    parent_peaks = [p for p in (sampler.peak(column=NvmlSampler.RESERVED) for sampler in samplers) if p is not None]
    start = next((t for t, c in verdicts if c.origin == "seed"), t0)
    alone = [p for p in (sampler.peak(start) for sampler in samplers) if p is not None] if start > t0 else []
    mine = [(t, c) for t, c in verdicts if c.origin != "seed" and c.verdict != "interrupted" and t > start]
    end = mine[-1][0] if mine else start
    window = max(end - start, 1e-9)
    parts = [parts_of(c.diagnostics or {}) for _, c in mine if c.diagnostics]
    per_gpu = [gate.holds() for gate in executor.gates.values()] or [[]]
    holds = [h for gate_holds in per_gpu for h in gate_holds]
    verified = sum(c.accepted for _, c in mine)
    signatures = [compiled_signature(c.diagnostics or {}) for _, c in mine if c.accepted]
    seeded = {compiled_signature(c.diagnostics or {}) for _, c in verdicts if c.origin == "seed"}
    distinct = len({sig for sig in signatures if sig is not None} - seeded) if any(signatures) else None
    why = Counter(rejection_kind(c.stage, c.reason, c.message) for _, c in mine if not c.accepted)
    first = {}  # one message per kind of rejection, to read what happened
    for _, c in mine:
        if not c.accepted:
            first.setdefault(rejection_kind(c.stage, c.reason, c.message), c.message[:200])
    row: dict[str, Any] = {
        "task": str(task.relative_to(ROOT)) if task.is_relative_to(ROOT) else str(task), "device": device,
        "checks_per_gpu": checks_per_gpu, "seconds": seconds,
        "checks_at_end": gpus * checks_per_gpu + sum(1 if m.startswith(MORE_CHECKS) else -1 for _, m in changes),
        "wall_s": wall, "window_s": window,
        "proposals": len(mine), "verified": verified, "rejected": len(mine) - verified, "distinct_verified": distinct,
        "verified_per_min": verified * 60.0 / window if mine else 0.0,
        "proposals_per_min": len(mine) * 60.0 / window if mine else 0.0,
        "gpu_idle_frac": 1.0 - mean_busy(per_gpu, start, end) if mine else None,
        "gpu_timing_frac": mean_busy([[h for h in g if h.mode == EXCLUSIVE] for g in per_gpu], start, end) if mine
        else None, "nvml_util_pct": nvml, "gpu_mem_peak_gib": max(peaks) if peaks else None, "gpus": gpus,
        "start_mem_peak_gib": max(alone) if alone else None,
        "parent_mem_peak_gib": max(parent_peaks) if parent_peaks else None,
        "parent_cpu_frac": parent_cpu, "stop_reason": summary.stop_reason,
        "start_speedup": summary.start.timings.speedup_eager if summary.start is not None else None,
        "best_speedup": (summary.final.timings.speedup_eager if summary.final is not None
                         else summary.best.timings.speedup_eager if summary.best is not None else None),
        "rejections": "; ".join(f"{k} x{n}" for k, n in why.most_common()), "rejection_examples": first,
        "rejection_messages": [f"{c.stage}/{c.reason} ({_proposed(c)}): {c.message}" for _, c in mine
                               if not c.accepted],
        "seed_verdicts": [f"{'accepted' if c.accepted else 'rejected'}"
                          f"{'' if c.accepted else f' at {c.stage}/{c.reason}: {c.message[:300]}'}"
                          for _, c in verdicts if c.origin == "seed"]}
    for key in (*PARTS, "gpu_wait", "timing_wait"):
        row[f"{key}_s"] = statistics.fmean(p[key] for p in parts) if parts else None
    laps = [laps_of(c.diagnostics) for _, c in mine if c.diagnostics]
    row["laps"] = {k: statistics.fmean(lap.get(k, 0.0) for lap in laps) for k in sorted({k for lap in laps for k in lap})}
    row["gate_held"] = {k: v / len(mine) for k, v in held_by_work(holds, start, end).items()} if mine else {}
    row["duels"] = len(summary.duels)
    row["parent_top"] = threads.top(parent_top) if threads is not None else []
    row["in_flight"] = in_flight_shares(executor.checks, start, end) if mine else {}
    row["timeline"] = timeline(verdicts, holds, summary.duels, t0, checks=executor.checks, notes=changes,
                               memory=[sampler.memory for sampler in samplers])
    return row


def in_flight_shares(spans: list[Any], start: float, end: float) -> dict[int, float]:
    """How many checks ran at once, as the share of [start, end] spent at each count (the slots' check spans, a
    retried check counted in each of its tries); what shows a run that gave up checks for a full GPU."""
    inside = [c for c in spans if c.end > start and c.start < end]
    edges = sorted([(max(c.start, start), 1) for c in inside] + [(min(c.end, end), -1) for c in inside])
    shares: Counter[int] = Counter()
    running, at = 0, start
    for t, step in edges:
        shares[running] += t - at
        running, at = running + step, t
    shares[running] += end - at
    span = max(end - start, 1e-9)
    return {n: v / span for n, v in sorted(shares.items(), reverse=True) if v > 0}


def mean_busy(per_gpu: list[list[Any]], start: float, end: float) -> float:
    """The share of [start, end] in which a GPU's gate was held (any hold, the union of their spans), the mean over
    the GPUs, one list of holds each."""
    from sandbox.gate import busy_seconds
    return statistics.fmean(busy_seconds(holds, start, end) for holds in per_gpu) / max(end - start, 1e-9)


def timeline(verdicts: list[tuple[float, Any]], holds: list[Any], duels: Any, t0: float, *, checks: list[Any],
             notes: list[tuple[float, str]], memory: list[list[tuple[float, float, float, float]]]) -> dict[str, Any]:
    """The run as events on one clock (seconds from its start): each verdict with its stages, laps and timing race,
    each hold of the GPU's gate, each duel, each slot's check (CheckSpan), the run's notes on its checks at once and
    each GPU's memory readings (GiB in use, GiB of it this process's allocator holds, GiB of that in use); what
    `--timeline` writes, to find what a candidate waited for."""
    def rel(t: float) -> float:
        return round(t - t0, 3)
    cands = []
    for t, c in verdicts:
        d = c.diagnostics or {}
        timing = d.get("timing") or {}
        cands.append({"id": c.id, "at": rel(t), "origin": c.origin, "proposal": _proposed(c), "accepted": c.accepted,
                      "stage": c.stage, "reason": c.reason, "message": (c.message or "")[:300],
                      "stages": {s["stage"]: s.get("seconds") for s in d.get("stages", [])},
                      "costs": d.get("costs"), "timing_laps": timing.get("laps"), "race": timing.get("race"),
                      "candidate_ms": timing.get("candidate_ms")})
    return {"candidates": cands,
            "holds": [{"mode": h.mode, "holder": h.holder, "work": h.work, "start": rel(h.start), "end": rel(h.end),
                       "waited_s": round(h.waited_s, 3)} for h in sorted(holds, key=lambda h: h.start)],
            "duels": [{"challenger": d.challenger_id, "incumbent": d.incumbent_id, "outcome": d.outcome.value,
                       "legs": len(d.legs), "seconds": round(d.seconds, 2), "note": d.note} for d in duels],
            "checks": [{"slot": c.slot, "gpu": c.gpu, "candidate": c.candidate, "start": rel(c.start),
                        "end": rel(c.end)} for c in checks],
            "notes": [{"at": rel(t), "message": m} for t, m in notes],
            "memory_gib": [[[round(t - t0, 2), *(round(gib, 2) for gib in reading)] for t, *reading in readings]
                           for readings in memory]}


def _proposed(c: Any) -> str:
    """What the candidate was: the first line of its proposal (the tuner's says which knob it turned), else its
    origin."""
    first = next((line for line in (c.reply or "").splitlines() if line.strip()), "")
    return first.strip()[:80] or c.origin


def environment(device: str) -> dict[str, str]:
    import torch
    import triton
    out = {"torch": torch.__version__, "triton": triton.__version__, "gpu": "", "driver": ""}
    if device == "cuda":
        from profiler.env import environment as env
        e = env(0)
        out.update(gpu=(e.get("gpu") or {}).get("name") or "", driver=str(e.get("driver") or ""))
    else:
        out["gpu"] = "cpu (Triton interpreter)"
    return out


def first_rounds(row: dict[str, Any]) -> str:
    """A warning where the window holds under two rounds of the slots' proposals: the slots filled once after the
    starting kernel's verdict and drained, so the rate is the pipeline's first round, not its steady rate."""
    k, n = slots(row), row["proposals"]
    if n >= 2 * k:
        return ""
    return (f"\n  only {n} proposals at {k} checks at once: the rate is the first round's, not the steady rate; "
            "give the search more --seconds")


def slots(row: dict[str, Any]) -> int:
    """The checks at once a row's run started with, over all its GPUs (rows from before the `gpus` column: one)."""
    return int(row["checks_per_gpu"]) * int(row.get("gpus") or 1)


def _fewer(row: dict[str, Any]) -> str:
    """', N at the end: the GPU's memory was full' where the run gave up checks at once, else ''."""
    end = row.get("checks_at_end")
    if end is None or end == slots(row):
        return ""
    return f", {end} at the end: the GPU's memory was full"


def _gpus(row: dict[str, Any]) -> str:
    """' on each of N GPUs' where the run had more than one, else ''."""
    n = int(row.get("gpus") or 1)
    return f" on each of {n} GPUs" if n > 1 else ""


def show(row: dict[str, Any], messages: bool = False) -> str:
    def f(v: Any, fmt: str = ".2f") -> str:
        return "-" if v is None else format(v, fmt)
    parts = " ".join(f"{p} {f(row[f'{p}_s'])}" for p in PARTS)
    distinct = "" if row.get("distinct_verified") is None else f", {row['distinct_verified']} distinct compiled"
    return (f"{row['task']}: {f(row['verified_per_min'], '.1f')} verified/min ({row['verified']} of "
            f"{row['proposals']} in {row['window_s']:.0f} s{distinct}, "
            f"{f(row['proposals_per_min'], '.1f')} proposals/min; "
            f"K={row['checks_per_gpu']}{_gpus(row)}{_fewer(row)}){first_rounds(row)}\n  seconds a candidate: {parts}; "
            f"waiting for the GPU {f(row['gpu_wait_s'])} + for the timing slot {f(row['timing_wait_s'])}\n  "
            f"vs eager: the starting kernel {f(row.get('start_speedup'), '.3f')}x, the best at the end "
            f"{f(row.get('best_speedup'), '.3f')}x\n  {'GPU' if row['device'] == 'cuda' else 'CPU'} "
            f"idle (no gated work) {f(row['gpu_idle_frac'], '.0%')} of the "
            f"window, timing {f(row['gpu_timing_frac'], '.0%')}, NVML utilisation {f(row['nvml_util_pct'], '.0f')}%, "
            f"GPU memory in use at most {f(row.get('gpu_mem_peak_gib'), '.1f')} GiB "
            f"({f(row.get('start_mem_peak_gib'), '.1f')} up to the starting kernel's verdict, the only check then; "
            f"this process's allocator at most {f(row.get('parent_mem_peak_gib'), '.1f')}), "
            f"{row.get('duels', 0)} duel(s), "
            f"the parent's CPU {f(row['parent_cpu_frac'], '.0%')} of a core"
            f"  (stopped: {row['stop_reason']})\n  checks in flight: " +
            (", ".join(f"{n} for {v:.0%}" for n, v in row.get("in_flight", {}).items() if v >= 0.005) or "-") +
            " of the window\n  the GPU's gate held a candidate (s): " +
            ", ".join(f"{k} {v:.2f}" for k, v in sorted(row.get("gate_held", {}).items(), key=lambda kv: -kv[1])) +
            "\n  laps a candidate (s): " +
            ", ".join(f"{k} {v:.2f}" for k, v in sorted(row.get("laps", {}).items(), key=lambda kv: -kv[1])
                      if k not in ("total_s", "calls") and v >= 0.05) +
            "".join(f"\n  rejected {k}: {m}" for k, m in row.get("rejection_examples", {}).items()) +
            "".join(f"\n  the starting kernel: {v}" for v in row.get("seed_verdicts", [])) +
            (f"\n  the parent's CPU, where it went:{thread_cpu.show(row['parent_top'], row['wall_s'])}"
             if row.get("parent_top") else "") +
            ("".join(f"\n  rejection: {m}" for m in row.get("rejection_messages", [])) if messages else ""))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--tasks", default=",".join(TASKS), help="task names in tasks/ (comma-separated)")
    ap.add_argument("--seconds", type=float, default=40.0, help="proposing time per task (default 40)")
    ap.add_argument("--checks-per-gpu", type=int, default=4, help="candidates checked at once on each GPU (default 4)")
    ap.add_argument("--gpus", type=int, default=1, help="GPUs the run checks on, 0 .. N-1 (default 1)")
    ap.add_argument("--label", default="", help="a word for the CSV line (e.g. serial / pipelined)")
    ap.add_argument("--csv", type=Path, default=CSV, help=f"append here (default {CSV.relative_to(ROOT)})")
    ap.add_argument("--no-csv", action="store_true", help="print only")
    ap.add_argument("--messages", action="store_true", help="print every rejected candidate's message in full")
    ap.add_argument("--check-footprint", type=int, default=None, metavar="N",
                    help="a trial: budget a check at N times its task's inputs on the GPU instead of "
                         "agent.search.executors.CHECK_FOOTPRINT (more or fewer checks fit); the label defaults "
                         "to footprintN")
    ap.add_argument("--no-warm", action="store_true",
                    help="a trial: no check compiles its robustness shapes ahead in a second process "
                         "(sandbox.warmer); the label defaults to nowarm")
    ap.add_argument("--parent-cpu", type=int, default=0, metavar="N",
                    help="print the N places in the parent's code that took the most of its CPU (sampled per thread)")
    ap.add_argument("--timeline", type=Path, default=None, metavar="DIR",
                    help="write each task's run as events (verdicts, gate holds, duels, each slot's checks, the "
                         "notes on checks at once, the GPU's memory in use) to DIR/<task>.json")
    args = ap.parse_args(argv)
    tasks, problem = task_files(args.tasks, ROOT)
    if problem:
        print(problem, file=sys.stderr)
        return 2
    if min(args.checks_per_gpu, args.gpus, args.check_footprint or 1) < 1 or args.seconds <= 0:
        print("--checks-per-gpu, --gpus and --check-footprint must be at least 1 and --seconds above 0",
              file=sys.stderr)
        return 2
    if args.gpus > 1 and args.device != "cuda":
        print(f"--gpus {args.gpus} needs --device cuda: on the CPU the run has its interpreter workers, no GPUs",
              file=sys.stderr)
        return 2
    if args.check_footprint is not None:
        from agent.search import executors
        executors.CHECK_FOOTPRINT = args.check_footprint
        args.label = args.label or f"footprint{args.check_footprint}"
    if args.no_warm:
        from sandbox import warmer
        warmer.WARM_AFTER_S = math.inf
        args.label = args.label or "nowarm"
    if args.device == "cuda":
        import torch
        if not torch.cuda.is_available():
            print("no CUDA GPU is visible; pass --device cpu to measure through Triton's interpreter", file=sys.stderr)
            return 2
        if torch.cuda.device_count() < args.gpus:
            print(f"--gpus {args.gpus}: only {torch.cuda.device_count()} GPU(s) are visible; ask for as many",
                  file=sys.stderr)
            return 2
    logging.basicConfig(level=logging.WARNING)
    common = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "commit": repo_commit(ROOT),
              "label": args.label, **environment(args.device)}
    with tempfile.TemporaryDirectory(prefix="crucible-throughput-") as tmp:
        for task in tasks:
            row = measure(task, device=args.device, seconds=args.seconds, checks_per_gpu=args.checks_per_gpu,
                          workdir=Path(tmp), gpus=args.gpus, parent_top=max(0, args.parent_cpu))
            print(show(row, args.messages), flush=True)
            events = row.pop("timeline")
            if args.timeline is not None:
                args.timeline.mkdir(parents=True, exist_ok=True)
                (args.timeline / f"{task.stem}.json").write_text(json.dumps(events, indent=1, default=str))
            if not args.no_csv:
                held = ";".join(f"{k}={v:.3g}" for k, v in sorted(row["gate_held"].items(), key=lambda kv: -kv[1]))
                append_csv(args.csv, FIELDS, [{k: ("" if v is None else f"{v:.4g}" if isinstance(v, float) else v)
                                               for k, v in {**common, **row, "gate_held": held}.items()}])
    return 0


if __name__ == "__main__":
    sys.exit(main())
