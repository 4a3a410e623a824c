"""Where a process's own CPU goes, thread by thread: what `bench_throughput.py --parent-cpu N` prints.

The search's parent runs every slot's harness on threads of one interpreter (inputs, references, comparisons,
shipping to the children, reading their replies), so with many checks at once its threads can queue on the
interpreter lock: `parent_cpu_frac` near one core says so, this says where. Every `every_s` a thread samples each
other thread's CPU seconds since its last look (Linux's /proc/self/task/<tid>/stat, in clock ticks) and puts them
down to where that thread's Python stack is at that moment: the innermost frame in the project's code, and the
innermost frame of all where it lies outside (a torch call, the pickle module). A sample is a guess at where the
ticks since the last one went, so the attribution is statistical: it says which code holds the CPU over a run of
minutes, not what a single call cost. The sampler's own CPU is reported under its own name.
"""
from __future__ import annotations

import os
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from types import FrameType

ROOT = Path(__file__).resolve().parent.parent
SELF = "(this sampler)"
TICK_S = 1.0 / os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 0.01


def thread_cpu_s(tid: int) -> float | None:
    """The CPU seconds (user and system) of thread `tid` of this process so far; None where it cannot be read (not
    Linux, or the thread has ended)."""
    try:
        with open(f"/proc/self/task/{tid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) * TICK_S  # utime and stime: fields 14 and 15 of stat


def where(frame: FrameType | None, root: Path = ROOT) -> str:
    """'file.py:function' of the innermost frame under `root` (the project's code), with ' > file.py:function' of
    the innermost frame of all where that lies outside it; '?' without a stack."""
    if frame is None:
        return "?"
    leaf, mine = frame, None
    while frame is not None and mine is None:
        path = frame.f_code.co_filename
        if path.startswith(str(root)) and "/.venv/" not in path:
            mine = frame
        frame = frame.f_back
    if mine is None:
        return _name(leaf)
    return _name(mine) if mine is leaf else f"{_name(mine)} > {_name(leaf)}"


def _name(frame: FrameType) -> str:
    return f"{Path(frame.f_code.co_filename).name}:{frame.f_code.co_name}"


class ThreadCpu:
    """A sampler on a thread of its own from `start` to `stop`; `top` lists where the CPU went, most first."""

    def __init__(self, every_s: float = 0.1, root: Path = ROOT):
        self.every_s, self.root = every_s, root
        self.spent: Counter[str] = Counter()  # where -> CPU seconds put down to it
        self._last: dict[int, float] = {}  # native thread id -> its CPU seconds at the last look
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="thread-cpu-sampler")

    def start(self) -> "ThreadCpu":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        me = threading.get_native_id()
        while not self._stop.wait(self.every_s):
            self.sample(me)

    def sample(self, me: int | None = None) -> None:
        """One look at every thread: its CPU since the last look, put down to where its stack is now."""
        frames = sys._current_frames()
        for t in threading.enumerate():
            tid = t.native_id
            if tid is None:
                continue
            now = thread_cpu_s(tid)
            if now is None:
                continue
            spent, self._last[tid] = now - self._last.get(tid, now), now
            if spent > 0:
                self.spent[SELF if tid == me else where(frames.get(t.ident), self.root)] += spent

    def top(self, n: int) -> list[tuple[str, float]]:
        return self.spent.most_common(n)


def show(top: list[tuple[str, float]], seconds: float) -> str:
    """The lines `--parent-cpu` prints: where, CPU seconds and the share of a core over `seconds` of wall time."""
    return "".join(f"\n    {cpu:7.2f} s  {cpu / max(seconds, 1e-9):5.1%} of a core  {at}" for at, cpu in top)
