"""What the system prompt says about the machine and the task: measured facts, not boilerplate.

On a GPU: the device's name and SM count, the ceilings `crucible bench --ceilings` measured (copy bandwidth, matmul
rate per dtype), the installed torch and Triton; the task's bytes and FLOPs (from its CRUCIBLE_BYTES / CRUCIBLE_FLOPS
formulas), its floor time at those ceilings, and the time to beat (the fastest of eager, torch.compile, Liger and the
vendor library the archive has measured for this task). On the CPU it says plainly that nothing is timed.

Nothing here is guessed: a fact that was not measured is named as not measured, with the command that measures it.
"""
from __future__ import annotations

from typing import Any

from agent.archive.store import Archive
from sandbox.task import Task, formula

BASELINE_NAMES = {"eager": "eager PyTorch", "compile": "torch.compile", "liger": "Liger Kernel",
                  "vendor": "the vendor library"}


def task_work(task: Task) -> tuple[float | None, float | None]:
    """The task's bytes and FLOPs at its full shapes, from its formulas; None where it declares none."""
    consts = task.current_constants()
    out: list[float | None] = []
    for expr in (task.meta.bytes_formula, task.meta.flops_formula):
        fn = formula(expr)
        try:
            out.append(float(fn(consts)) if fn is not None else None)
        except Exception:  # noqa: BLE001 - a task's formula that fails is reported as not declared
            out.append(None)
    return out[0], out[1]


def baseline_times(archive: Archive, task_hash: str) -> dict[str, float]:
    """The latest time the archive holds for each baseline of this task (ms), from candidates' and final re-checks'
    timings."""
    found: dict[str, float] = {}
    diags = [c.diagnostics for c in archive.candidates(task_hash=task_hash, timed=True)]
    ids = {c.id for c in archive.candidates(task_hash=task_hash, timed=True)}
    diags += [r.diagnostics for r in archive.reverifications() if r.candidate_id in ids]
    for d in diags:
        for name, b in (((d or {}).get("timing") or {}).get("baselines") or {}).items():
            if isinstance(b, dict) and isinstance(b.get("ms"), (int, float)) and b["ms"] > 0:
                found[name] = float(b["ms"])
    return found


def facts_text(task: Task, *, timed: bool, env: dict[str, Any], ceilings: dict[str, Any] | None,
               baselines: dict[str, float]) -> str:
    versions = f"PyTorch {env.get('torch', '?')}, Triton {env.get('triton') or '?'}"
    nbytes, flops = task_work(task)
    work = _work(nbytes, flops)
    if not timed:
        return (f"No GPU in this run: candidates run through Triton's CPU interpreter (TRITON_INTERPRET=1) at reduced "
                f"shapes, so only correctness is checked; nothing is timed, and no speed is reported to you. "
                f"Installed: {versions}. Write the kernel for a modern NVIDIA GPU anyway: correct first, then "
                f"fast (one pass over memory, fp32 accumulation, masked vector loads, no register spills).\n"
                f"The task at its full shapes: {work}.")
    gpu = env.get("gpu") if isinstance(env.get("gpu"), dict) else {}
    lines = [f"Target: {gpu.get('name', 'an NVIDIA GPU')} (compute capability {gpu.get('capability', '?')}, "
             f"{gpu.get('sm_count', '?')} SMs), {versions}."]
    if ceilings:
        rates = ", ".join(f"{k} {v:.0f} TFLOP/s" for k, v in sorted((ceilings.get("matmul_tflops") or {}).items())
                          if isinstance(v, (int, float)))
        lines.append(f"- Measured on this GPU (crucible bench --ceilings): copy {ceilings['copy_gbps']:.0f} GB/s "
                     f"(read + write)" + (f"; matmul {rates}" if rates else "") + ".")
    else:
        lines.append("- This GPU's ceilings are not measured yet (crucible bench --ceilings measures them), so no "
                     "floor time is given.")
    lines.append(f"- The task at its full shapes: {work}.")
    floor = _floor(nbytes, flops, ceilings)
    if floor is not None:
        lines.append(f"- Floor time at those ceilings: {floor[0]:.4g} ms ({floor[1]}-bound). Aim close to it.")
    if baselines:
        name, ms = min(baselines.items(), key=lambda kv: kv[1])
        others = ", ".join(f"{BASELINE_NAMES.get(k, k)} {v:.4g} ms" for k, v in sorted(baselines.items()))
        lines.append(f"- Time to beat: {ms:.4g} ms ({BASELINE_NAMES.get(name, name)}; measured here: {others}).")
    else:
        lines.append("- Time to beat: no baseline measured for this task yet; each kernel is timed against eager.")
    lines.append("- The diagnostics give each kernel's time, % of roofline, what bounds it, and its registers, spills "
                 "and shared memory: use them to find what stops it.")
    return "\n".join(lines)


def _work(nbytes: float | None, flops: float | None) -> str:
    parts = [f"{nbytes / 1e6:.4g} MB moved at least" if nbytes is not None else "bytes not declared by the task",
             f"{flops / 1e9:.4g} GFLOP" if flops is not None else "FLOPs not declared by the task"]
    return ", ".join(parts)


def _floor(nbytes: float | None, flops: float | None, ceilings: dict[str, Any] | None) -> tuple[float, str] | None:
    if not ceilings or nbytes is None:
        return None
    memory_ms = nbytes / (float(ceilings["copy_gbps"]) * 1e9) * 1e3
    rates = [v for v in (ceilings.get("matmul_tflops") or {}).values() if isinstance(v, (int, float)) and v > 0]
    compute_ms = flops / (max(rates) * 1e12) * 1e3 if flops and rates else 0.0
    return (compute_ms, "compute") if compute_ms > memory_ms else (memory_ms, "memory")
