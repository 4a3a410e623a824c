"""Each request's deadline, derived from the task rather than one constant.

A request to the candidate's process (its setup, one call, a rebuild at a new shape, the soak's calls) gets

    base + calls x max(per_call x the reference's own time a call, pace x the candidate's own time a call)

from the moment it is sent, and never more than what is left of the check's ceiling (CheckOptions.timeout_s). The
base is the compile budget until the parent has timed one of the candidate's calls, and the margin after: time that
is no multiple of the reference. On the GPU both are the time to compile Triton kernels (a new shape compiles
again). On the CPU the compile budget is the time Triton's interpreter may take before the candidate's own pace is
known: it runs a kernel 5 to 10,000 times slower than the reference's PyTorch (the seeds at the CPU's rescaled
shapes: 0.4 to 29 s a first call against 0.04 ms to 2 s), so the reference's multiple is a loose bound there and
later calls go by the candidate's own pace.
The reference's time is the parent's own measurement of the task's Model at the same shape (sandbox.reference);
the candidate's own time is the parent's wall time of its fastest earlier call at that shape, or at a shape already
tried scaled by the ratio of the reference's times where this one's is larger (none before its first call). A task
whose reference is itself slow on the CPU (the MoE backward's Python loop over experts, seconds a call) gives its
calls the time they need. Nothing the candidate's process reports moves a deadline.

On the GPU a long compile is not a hang: while the parent sees compilation going on — a new entry in the candidate's
own Triton cache (Triton stores each stage's IR as it is produced) or a compiler (ptxas, gcc) in its process tree —
the deadline moves to the last such sign plus the compile budget, never past the ceiling. A candidate that writes
into its cache to stay alive gains at most the ceiling, as any slow candidate does.

The timing stage runs under the ceiling alone: its baselines compile with torch.compile, whose time is not the
candidate's.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from .process import child_view, process_tree


@dataclass(frozen=True)
class Budget:
    compile_s: float  # the base before the candidate's pace is known (see the module's docstring)
    margin_s: float  # the base once it is
    per_call: float  # the most a call may take, in multiples of the reference's own time
    pace: float = 3.0  # ... or in multiples of the candidate's own earlier call

    def __post_init__(self) -> None:
        if min(self.compile_s, self.margin_s, self.per_call, self.pace) <= 0:
            raise ValueError("a budget's times and multiples must be positive")


# CPU, measured on every seed at the rescaled shapes on a 2-core machine shared with three other workers: first calls
# took 0.4 to 6.5 s where the reference took under 30 ms (15 s covers them twice over), and the DeepSeek MoE layer's
# 28.7 s against a 0.18 s reference (160x: 250x leaves 15 + 45 s). GPU: a call that takes 20x the reference is
# already a hang, and the compile budget counts from the last sign of compilation, so long compiles go on; the
# margin once the candidate's pace is known is shorter (4 s: a compile at a new shape moves it as the budget does; at
# 6 s a hang on a later correctness call of RMSNorm took 10.5 s to reject on the H200, benchmarks/data/hangs.csv).
BUDGETS = {"cpu": Budget(compile_s=15.0, margin_s=5.0, per_call=250.0),
           "cuda": Budget(compile_s=6.0, margin_s=4.0, per_call=20.0)}
POLL_S = 0.5  # how often the signs of compilation are looked for, at most
SCAN_ENTRIES = 1024  # entries of the candidate's cache looked at a poll (Triton's: a directory per kernel compiled)
COMPILERS = frozenset({"ptxas", "gcc", "cc", "cc1", "as", "ld", "collect2", "clang", "nvlink", "fatbinary"})


class CompileSigns:
    """When the parent last saw the candidate's process compile: a change in its Triton cache directory (entries or
    their modification times) or a compiler process in its tree. Polled at most every POLL_S."""

    def __init__(self, cache_dir: Path, pid: int):
        self.cache_dir, self.pid = child_view(pid, cache_dir), pid  # its own view: the scratch is a tmpfs of its own
        self.last: float | None = None
        self._state = self._cache_state()
        self._polled = 0.0

    def _cache_state(self) -> tuple[int, int]:
        """(entries, newest modification time in ns) of the cache and its top level: Triton puts each kernel's
        files in a directory of its own, so a new file changes that directory's time. The candidate can write
        there: no link is followed and at most SCAN_ENTRIES are looked at (a new one changes the cache's own time)."""
        count, newest = 0, 0
        try:
            fd = os.open(self.cache_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except OSError:
            return count, newest
        try:
            newest = os.fstat(fd).st_mtime_ns
            with os.scandir(fd) as entries:
                for e in entries:
                    count += 1
                    if count > SCAN_ENTRIES:
                        break
                    try:
                        newest = max(newest, e.stat(follow_symlinks=False).st_mtime_ns)
                    except OSError:
                        pass
        except OSError:
            pass
        finally:
            os.close(fd)
        return count, newest

    def _compiler_running(self) -> bool:
        for p in process_tree(self.pid)[1:]:
            try:
                with open(f"/proc/{p}/comm", "rb") as f:
                    if f.read().strip().decode(errors="replace") in COMPILERS:
                        return True
            except OSError:
                pass
        return False

    def __call__(self) -> float | None:
        now = time.monotonic()
        if now - self._polled >= POLL_S:
            self._polled = now
            state = self._cache_state()
            if state != self._state or self._compiler_running():
                self._state, self.last = state, now
        return self.last


@dataclass
class Deadline:
    """One request's deadline; calling it gives the end as a time.monotonic() value, which signs of compilation
    may move later (never past `ceiling`)."""
    what: str  # "the smoke call", named in the message of a request that misses it
    budget: Budget
    start: float
    ceiling: float
    reference_s: float = 0.0  # the reference's own time per call at this shape
    calls: int = 0
    own_s: float | None = None  # the candidate's own earlier call, as the parent measured it (None: none yet)
    signs: Callable[[], float | None] | None = None
    extended: bool = field(default=False, init=False)
    missed: float | None = field(default=None, init=False)  # the end a wait ran past (`miss`): no sign moves it now

    def __post_init__(self) -> None:
        if self.calls < 0 or self.reference_s < 0 or (self.own_s or 0.0) < 0:
            raise ValueError("calls and times per call must be non-negative")

    @property
    def base_s(self) -> float:
        return self.budget.compile_s if self.own_s is None else self.budget.margin_s

    @property
    def per_call_s(self) -> float:
        return max(self.budget.per_call * self.reference_s, self.budget.pace * (self.own_s or 0.0))

    @property
    def granted_s(self) -> float:
        return self.base_s + self.calls * self.per_call_s

    def miss(self) -> None:
        """The wait ran past this deadline: it stays where it was (the message and the verdict's `deadline_s` say
        what was granted; a sign seen while the process is killed, a cache file it left, would move it on)."""
        self.missed = self()

    def __call__(self) -> float:
        if self.missed is not None:
            return self.missed
        end = self.start + self.granted_s
        last = self.signs() if self.signs is not None else None
        if last is not None and last + self.base_s > end:
            end = last + self.base_s
            self.extended = end < self.ceiling or self.extended
        return min(end, self.ceiling)

    @property
    def by_ceiling(self) -> bool:
        """Whether the ceiling, not the task-derived deadline, ended the wait."""
        return self() >= self.ceiling

    def describe(self) -> str:
        """'the smoke call did not finish within 6.0 s (the compile budget of 6 s plus 20x the reference's 0.31 ms)'"""
        parts = [f"the compile budget of {self.base_s:g} s" if self.own_s is None else f"a margin of {self.base_s:g} s"]
        if self.calls:
            calls = f"{self.calls} x " if self.calls > 1 else ""
            if self.budget.pace * (self.own_s or 0.0) > self.budget.per_call * self.reference_s:
                parts.append(f"{calls}{self.budget.pace:g}x its own earlier call's {_secs(self.own_s or 0.0)}")
            else:
                parts.append(f"{calls}{self.budget.per_call:g}x the reference's {_secs(self.reference_s)}")
        how = " plus ".join(parts)
        if self.extended:
            how += ", extended while its kernels compiled"
        waited = self() - self.start
        return f"{self.what} did not finish within {waited:.1f} s ({how})"


def _secs(s: float) -> str:
    return f"{s * 1e3:.2f} ms" if s < 0.1 else f"{s:.2f} s"
