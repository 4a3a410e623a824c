"""Who may use one GPU now: the checks of several candidates at once, or one candidate's timing alone.

Several candidates are checked on one GPU at once (agent/search/executors.py), so that one compiles, loads and checks its
correctness while another is timed. Their GPU work takes the gate in shared mode, a timing stage takes it in
exclusive mode: a timing waits until the shared holders in progress have finished, and while it waits or runs no
new shared holder starts (writer preference, so a stream of short checks cannot starve a timing). Two timings never
overlap, and at most TIMING_TURNS timing stages hold their input sets on the GPU at once (`timing_turn`). The
parent's own passing peaks (a reference run with its float64 truth: tens of GB for attention's backward) take bytes
of a memory budget (`memory`), so two checks' peaks never meet on the GPU when together they would not fit.

The gate is the parent's (trusted) bookkeeping: it orders the work the parent asks for. Every hold is logged with
its start and end (`holds()`), so a benchmark can say how much of the wall time the GPU had work and a test can
prove that no two exclusive holds overlapped.
"""
from __future__ import annotations

import threading
import time
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

SHARED, EXCLUSIVE = "shared", "exclusive"
MAX_LOGGED = 200_000  # holds kept for holds(); a long run forgets its oldest
# Timing stages in progress on one GPU at once: the one measuring and the next, which builds its input sets (up to
# sandbox/timing_child.set_budget) while it waits for its exclusive turn; the rest wait before building theirs.
TIMING_TURNS = 2


@dataclass(frozen=True)
class Hold:
    """One use of the gate: monotonic start and end (time.monotonic), and how long it waited to start."""

    mode: str  # shared | exclusive
    holder: str  # who held it (the candidate's file name)
    start: float
    end: float
    waited_s: float
    work: str = ""  # what it was held for: the request's op (call, soak, time...) or the parent's step (reference...)


class GpuGate:
    """A writer-preferring shared/exclusive lock for one GPU, with a log of its holds."""

    def __init__(self, name: str = "gpu", memory_bytes: int = 0) -> None:
        self.name = name
        self.memory_bytes = memory_bytes  # the budget of `memory` (0: none, every request admitted at once)
        self._memory_used = 0
        self._memory_holders = 0
        self._memory_alone_waiting = 0  # requests for the whole budget waiting
        self._cond = threading.Condition()
        self._shared = 0  # shared holders now
        self._exclusive = False  # an exclusive holder now
        self._waiting_exclusive = 0
        self._log: deque[Hold] = deque(maxlen=MAX_LOGGED)
        self._turns = threading.BoundedSemaphore(TIMING_TURNS)

    @contextmanager
    def shared(self, holder: str = "", work: str = "") -> Iterator[float]:
        """Hold the GPU together with other shared holders; yields the seconds spent waiting."""
        asked = time.monotonic()
        with self._cond:
            while self._exclusive or self._waiting_exclusive:
                self._cond.wait()
            self._shared += 1
        start = time.monotonic()
        try:
            yield start - asked
        finally:
            end = time.monotonic()
            with self._cond:
                self._shared -= 1
                self._log.append(Hold(SHARED, holder, start, end, start - asked, work))
                self._cond.notify_all()

    @contextmanager
    def exclusive(self, holder: str = "", work: str = "") -> Iterator[float]:
        """Hold the GPU alone; yields the seconds spent waiting for the shared holders to finish."""
        asked = time.monotonic()
        with self._cond:
            self._waiting_exclusive += 1
            try:
                while self._exclusive or self._shared:
                    self._cond.wait()
            finally:
                self._waiting_exclusive -= 1
            self._exclusive = True
        start = time.monotonic()
        try:
            yield start - asked
        finally:
            end = time.monotonic()
            with self._cond:
                self._exclusive = False
                self._log.append(Hold(EXCLUSIVE, holder, start, end, start - asked, work))
                self._cond.notify_all()

    @contextmanager
    def timing_turn(self) -> Iterator[float]:
        """One of the TIMING_TURNS timing stages that may hold their input sets and kept outputs on this GPU at once
        (taken before the stage builds them, given back when its outputs are released); yields the seconds waited.
        Nothing else is waited for while it is held but the gate itself, which never waits for a turn."""
        asked = time.monotonic()
        self._turns.acquire()
        try:
            yield time.monotonic() - asked
        finally:
            self._turns.release()

    @contextmanager
    def memory(self, nbytes: int | None) -> Iterator[float]:
        """Hold `nbytes` of the memory budget for passing work of the parent's (None: all of it, for work whose peak
        is not known yet and is measured alone); yields the seconds waited. A request is admitted when it fits
        beside the others held, and always when nothing is held, whatever its size; never while a request for the
        whole budget waits (that one goes first)."""
        asked = time.monotonic()
        if not self.memory_bytes:
            yield 0.0
            return
        want = self.memory_bytes if nbytes is None else min(max(0, nbytes), self.memory_bytes)
        alone = want >= self.memory_bytes
        with self._cond:
            self._memory_alone_waiting += alone
            try:  # a request for the whole budget goes first: no smaller one slips in ahead of it, not even in the
                # moment after the last holder left and before the waiting whole-budget request was scheduled
                while (self._memory_holders and self._memory_used + want > self.memory_bytes) or \
                        (not alone and self._memory_alone_waiting):
                    self._cond.wait()
            finally:
                self._memory_alone_waiting -= alone
                if alone:
                    self._cond.notify_all()  # the smaller requests waiting behind it look again
            self._memory_used += want
            self._memory_holders += 1
        try:
            yield time.monotonic() - asked
        finally:
            with self._cond:
                self._memory_used -= want
                self._memory_holders -= 1
                self._cond.notify_all()

    def holds(self) -> list[Hold]:
        """The finished holds, oldest first (by end)."""
        with self._cond:
            return list(self._log)


def busy_seconds(holds: list[Hold], since: float, until: float) -> float:
    """Seconds of [since, until] during which at least one hold was in progress (the union of their intervals)."""
    spans = sorted((max(h.start, since), min(h.end, until)) for h in holds if h.end > since and h.start < until)
    total, reach = 0.0, since
    for start, end in spans:
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


def held_by_work(holds: list[Hold], since: float, until: float) -> dict[str, float]:
    """Seconds of [since, until] the holds of each kind of work lasted, summed (shared holds overlap, so the sum may
    pass the window): which work keeps a timing waiting, and the other checks behind it."""
    out: dict[str, float] = {}
    for h in holds:
        span = min(h.end, until) - max(h.start, since)
        if span > 0:
            key = f"{h.mode}:{h.work or '?'}"
            out[key] = out.get(key, 0.0) + span
    return out


def overlapping_exclusive(holds: list[Hold]) -> list[tuple[Hold, Hold]]:
    """Pairs of holds that overlapped although one of them was exclusive (there must be none)."""
    spans = sorted(holds, key=lambda h: h.start)
    bad = []
    for i, a in enumerate(spans):
        for b in spans[i + 1:]:
            if b.start >= a.end:
                break
            if EXCLUSIVE in (a.mode, b.mode):
                bad.append((a, b))
    return bad
