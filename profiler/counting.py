"""Counting: the raw events of the timed bursts -> each call's time. Pure arithmetic, tested on the CPU.

profiler.timing records each burst's events (stream, gap, tail, wall and host times); `calibrate` reads what an
empty call leaves, and `count` turns a function's bursts into counted times and flags the calls the events cannot
explain (profiler.timing's docstring says what each interval means).
"""
from __future__ import annotations

from typing import Any


def median(xs: list[float]) -> float:
    s = sorted(xs)
    n = len(s)
    if n == 0:
        return float("nan")
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


def calibrate(null_bursts: list[dict[str, Any]]) -> dict[str, float]:
    """What an empty call leaves: its tail after the burst, the burst's host wall time, and (bursts of two or more)
    the device time from one call's end to the next, which is the flush pass between them."""
    gaps = [g for b in null_bursts for g in b["gap_ms"]]
    return {"null_tail_ms": median([b["tail_ms"] for b in null_bursts]) if null_bursts else 0.0,
            "null_wall_ms": median([b["wall_ms"] for b in null_bursts]) if null_bursts else 0.0,
            "null_stream_ms": median([s for b in null_bursts for s in b["stream_ms"]]) if null_bursts else 0.0,
            "null_gap_ms": median(gaps) if gaps else 0.0}


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
        if b.get("heat_calls") and not 0.5 <= b["heat_ms"] / b["heat_calls"] / max(median(ms), 1e-6) <= 2.0:
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
