"""The timing report: raw `measure` data + roofline + statistics -> the dict `CheckResult.timing` carries.

Runs in the trusted parent. The result is plain JSON-able data:

    candidate_ms      median of the candidate's counted times (None when only baselines were timed)
    candidate         {ms, iqr_ms, q1_ms, q3_ms, n} of the candidate
    rounds_ms         {name: [ms of each counted round]}: index i of every list was timed in the same interleaved
                      round, so a later comparison (the loop's paired re-time of two kernels) can pair them again
    baselines         {name: {available, reason, versions, ms, iqr_ms, speedup, ci_low, ci_high, significant, verdict}}
                      speedup = baseline ms / candidate ms per paired round (median, bootstrap CI); > 1 is faster
    roofline          the candidate's (else the fastest baseline's) bytes, flops, gbps, tflops, pct_of_roofline, bound
    kernels           per compiled Triton kernel: registers, spills, shared memory, warps, stages
    environment       GPU, driver, CUDA, torch, triton, Liger, Python
    measurement       how it was measured: reps, warm-up, input sets, L2 flush, persisting-L2 reset, calibration, flags
    problems          [{reason, message}] with sandbox.records.Reason values: any problem means the candidate's time
                      is not a result (timer_tampered, timing_output_mismatch, timing_inconsistent, faster_than_roofline,
                      runtime_error, crash)
    quarantined       True when the time beat the roofline: a suspected cheat or harness fault, never archived
    warnings          notes that do not invalidate the time
    rows              one row per implementation for tables (`crucible bench`), candidate first
"""
from __future__ import annotations

from typing import Any

from . import stats
from .roofline import Roofline, gate

TAMPERED = "timer_tampered"
OUTPUT_CHANGED = "timing_output_mismatch"
INCONSISTENT = "timing_inconsistent"
ROOFLINE = "faster_than_roofline"
RUNTIME_ERROR = "runtime_error"
CRASH = "crash"
PROBLEM_REASONS = (TAMPERED, OUTPUT_CHANGED, INCONSISTENT, ROOFLINE, RUNTIME_ERROR, CRASH)


def _summary(ms: list[float]) -> dict[str, Any]:
    s = stats.summarize(ms)
    return {"ms": s.median, "iqr_ms": s.iqr, "q1_ms": s.q1, "q3_ms": s.q3, "n": s.n}


def build_timing(
    measured: dict[str, Any],
    *,
    candidate: str | None,
    baselines: dict[str, dict[str, Any]] | None = None,
    roof: Roofline | None = None,
    kernels: list[dict[str, Any]] | None = None,
    environment: dict[str, Any] | None = None,
    output_problems: list[str] | None = None,
    seed: int = 0,
) -> dict[str, Any]:
    """The report. `baselines`: name -> Baseline.to_dict() (availability, reason, versions), in display order;
    a name measured but absent here is still reported. `output_problems`: the parent's findings on the sampled
    timed outputs (one sentence each)."""
    fns = measured["fns"]
    if candidate is not None and candidate not in fns:
        raise ValueError(f"candidate {candidate!r} was not measured (measured: {sorted(fns)})")
    problems = _measurement_problems(measured, output_problems)
    warnings = list(measured.get("warnings", []))
    impl_problems, impl_warnings = _implementation_problems(fns, candidate)
    problems += impl_problems
    warnings += impl_warnings

    usable = {n: p["ms"] for n, p in fns.items() if p["ms"] and not p.get("error")}
    cand = _summary(usable[candidate]) if candidate in usable else None
    out_baselines = _baseline_entries(_baseline_info(fns, candidate, baselines), usable, candidate, cand, seed)

    roof_dict = None
    quarantined = False
    if roof is not None:
        roof_dict = _roofline_at(roof, cand, out_baselines)
        roof_problems, roof_warnings = _roofline_verdicts(roof, usable, candidate)
        quarantined = bool(roof_problems)
        problems += roof_problems
        warnings += roof_warnings

    return {
        "candidate_ms": cand["ms"] if cand else None,
        "candidate": cand,
        "rounds_ms": {name: list(ms) for name, ms in usable.items()},
        "baselines": out_baselines,
        "roofline": roof_dict,
        "kernels": list(kernels or []),
        "environment": dict(environment or {}),
        "measurement": _measurement(measured),
        "problems": problems,
        "quarantined": quarantined,
        "warnings": warnings,
        "rows": _rows(candidate, usable, out_baselines, roof, seed),
    }


def _measurement_problems(measured: dict[str, Any], output_problems: list[str] | None) -> list[dict[str, str]]:
    """The problems the measurement itself reports: a failed CUDA context, replaced timers, outputs changed later."""
    problems: list[dict[str, str]] = []
    if measured.get("fatal"):
        f = measured["fatal"]
        problems.append({"reason": CRASH, "message": f"the CUDA context failed during timing: {f['type']}: "
                                                     f"{f['message']}"})
    if measured.get("tampered"):
        problems.append({"reason": TAMPERED, "message": "timer functions were replaced during the run: "
                                                        + ", ".join(measured["tampered"])})
    if measured.get("fingerprint_mismatches"):
        calls = [m["call"] for m in measured["fingerprint_mismatches"]]
        problems.append({"reason": OUTPUT_CHANGED, "message": f"outputs of timed calls {calls} changed after the call "
                                                              "returned: work was finished later than it was timed"})
    for msg in output_problems or []:
        problems.append({"reason": OUTPUT_CHANGED, "message": msg})
    return problems


def _implementation_problems(fns: dict[str, dict[str, Any]],
                             candidate: str | None) -> tuple[list[dict[str, str]], list[str]]:
    """Each implementation's error or inconsistent calls: a problem for the candidate, a warning for a baseline."""
    problems: list[dict[str, str]] = []
    warnings: list[str] = []
    for n, p in fns.items():
        if p.get("error"):
            e = p["error"]
            text = f"{n} raised during timing: {e['type']}: {e['message']}"
            if n == candidate:
                problems.append({"reason": RUNTIME_ERROR, "message": text})
            else:
                warnings.append(text)
        if p.get("inconsistent"):
            text = (f"{n}: {len({f['call'] for f in p['flagged']})} of {len(p['ms'])} timed calls left work running "
                    "after their end event or took far longer on the host than on the device")
            if n == candidate:
                problems.append({"reason": INCONSISTENT, "message": text})
            else:
                warnings.append(text)
    return problems, warnings


def _baseline_info(fns: dict[str, Any], candidate: str | None,
                   baselines: dict[str, dict[str, Any]] | None) -> dict[str, dict[str, Any]]:
    """The given baselines' descriptions in display order, then an available one for each other measured name."""
    info = dict(baselines or {})
    for name in fns:
        if name != candidate and name not in info:
            info[name] = {"name": name, "available": True, "reason": "", "versions": {}}
    return info


def _baseline_entries(info: dict[str, dict[str, Any]], usable: dict[str, list[float]], candidate: str | None,
                      cand: dict[str, Any] | None, seed: int) -> dict[str, dict[str, Any]]:
    """Each baseline's report entry: its availability, its time, and the candidate's paired speedup over it."""
    out: dict[str, dict[str, Any]] = {}
    for name, meta in info.items():
        entry = {"available": bool(meta.get("available", True)), "reason": meta.get("reason", ""),
                 "versions": dict(meta.get("versions", {})), "ms": None, "iqr_ms": None, "speedup": None,
                 "ci_low": None, "ci_high": None, "significant": False, "verdict": None}
        if name in usable:
            entry.update({k: v for k, v in _summary(usable[name]).items() if k in ("ms", "iqr_ms")})
            if cand is not None:
                c = stats.compare(usable[candidate], usable[name], seed=seed)
                entry.update({"speedup": c.speedup, "ci_low": c.ci_low, "ci_high": c.ci_high,
                              "significant": c.significant, "verdict": c.verdict})
        elif entry["available"]:
            entry.update({"available": False, "reason": entry["reason"] or "not measured"})
        out[name] = entry
    return out


def _roofline_at(roof: Roofline, cand: dict[str, Any] | None,
                 baselines: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """The roofline of the candidate, or of the fastest baseline when only baselines were timed."""
    subject_ms = cand["ms"] if cand else min((b["ms"] for b in baselines.values() if b["ms"]), default=None)
    return roof.at(subject_ms) if subject_ms else None


def _roofline_verdicts(roof: Roofline, usable: dict[str, list[float]],
                       candidate: str | None) -> tuple[list[dict[str, str]], list[str]]:
    """Times that beat the roofline: a problem (and quarantine) for the candidate, a warning for a baseline."""
    problems: list[dict[str, str]] = []
    warnings: list[str] = []
    for name, ms_list in usable.items():
        verdict = gate(stats.median(ms_list), roof)
        if verdict.ok:
            continue
        if name == candidate:
            problems.append({"reason": ROOFLINE, "message": verdict.message})
        else:
            warnings.append(f"baseline {name} beat the roofline ({verdict.message}); the ceilings look wrong")
    return problems, warnings


def _measurement(measured: dict[str, Any]) -> dict[str, Any]:
    """How the times were measured: the configuration, L2 and calibration, and the per-implementation call flags."""
    fns = measured["fns"]
    return {
        **measured.get("config", {}),
        "l2": measured.get("l2"), "calibration": measured.get("calibration"), "device": measured.get("device"),
        "flagged_calls": {n: len(p["flagged"]) for n, p in fns.items()},
        "host_bound_calls": {n: p.get("host_bound", 0) for n, p in fns.items()},
        "samples_validated": len(measured.get("samples", [])),
    }


def _rows(candidate: str | None, usable: dict[str, list[float]], baselines: dict[str, dict[str, Any]],
          roof: Roofline | None, seed: int) -> list[dict[str, Any]]:
    """One row per implementation: median, IQR, rate, % of roofline, and its speedup over each baseline."""
    names = ([candidate] if candidate else []) + [n for n in baselines]
    rows = []
    for name in names:
        row: dict[str, Any] = {"impl": name, "ms": None, "iqr_ms": None, "gbps": None, "tflops": None,
                               "pct_of_roofline": None, "vs": {}, "note": ""}
        if name not in usable:
            row["note"] = baselines.get(name, {}).get("reason", "") or "not measured"
            rows.append(row)
            continue
        s = _summary(usable[name])
        row.update({"ms": s["ms"], "iqr_ms": s["iqr_ms"]})
        if roof is not None:
            at = roof.at(s["ms"])
            row.update({"gbps": at["gbps"], "tflops": at["tflops"], "pct_of_roofline": at["pct_of_roofline"]})
        for base in baselines:
            if base == name or base not in usable:
                continue
            c = stats.compare(usable[name], usable[base], seed=seed)
            row["vs"][base] = {"speedup": c.speedup, "ci_low": c.ci_low, "ci_high": c.ci_high, "verdict": c.verdict}
        rows.append(row)
    return rows


def primary_rate(roof: dict[str, Any] | None) -> str:
    """Which rate a table shows: GB/s for a memory-bound op, TFLOP/s for a compute-bound one."""
    if roof and roof.get("bound") == "compute":
        return "tflops"
    return "gbps"
