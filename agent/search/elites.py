"""Choosing what to build on: MAP-Elites niches per task and parent selection mixing exploitation and exploration.

A niche is a coarse description of a kernel read from its source: its algorithm (tiled matmul, reduction, scan or
elementwise; persistent grid or one program per tile; a loop over tiles or one; atomics), how many Triton kernels it
defines (fusion), and the warps, largest block and pipeline stages it sets. Each niche keeps its best verified
kernel, so a fast kernel of one shape does not crowd out a different design that may improve further.

Fitness orders candidates: verified beats rejected; among verified, the measured speedup over eager, by the lower
end of its confidence interval (on the CPU nothing is timed, so verified kernels tie); among rejected, the one that
got through more stages of the harness.

The search holds no database: the loop hands it the elites (harness-verified only) and the failures it may fix.
"""
from __future__ import annotations

import ast
import functools
import random
from collections import defaultdict
from dataclasses import dataclass

from agent.archive.records import Candidate
from agent.search.tuner import find_knobs, skeleton
from sandbox import pyparse

STAGE_RANK = {name: i for i, name in enumerate(
    ["propose", "static", "compile", "smoke", "correctness", "robustness", "timing"])}
MAX_FIXES = 2  # attempts to repair one failed candidate before moving on


@functools.lru_cache(maxsize=64)
def niche(source: str) -> str:
    """e.g. "reduce-grid-loop:k2-w8-b1024-s3": the algorithm, then the launch settings.

    The algorithm: what the kernels compute with (dot: tiled matmul; reduce: row reductions; scan; elementwise),
    whether the grid is persistent (programs stride over the work by tl.num_programs) or one program per tile,
    whether a program loops over tiles or handles one, and "-atomic" when programs combine results atomically (a
    split reduction). The launch settings: how many Triton kernels the file defines (fusion), and the warps, largest
    block and pipeline stages it sets ("?" where the source does not say).
    """
    try:
        tree = pyparse.parse(source)
    except SyntaxError:
        return "unparsed"
    jitted = [n for n in tree.body if isinstance(n, ast.FunctionDef)
              and any("jit" in ast.unparse(d) for d in n.decorator_list)]
    warps, blocks, stages = [], [], []
    for k in find_knobs(source):
        if k.value is None:
            continue
        {"warps": warps, "block": blocks, "stages": stages}.get(k.kind, []).append(k.value)
    def show(values: list[int]) -> str:
        return str(max(values)) if values else "?"
    return f"{algorithm(jitted)}:k{len(jitted)}-w{show(warps)}-b{show(blocks)}-s{show(stages)}"


def algorithm(kernels: list[ast.FunctionDef]) -> str:
    calls = {ast.unparse(n.func).split(".")[-1] for k in kernels for n in ast.walk(k) if isinstance(n, ast.Call)}
    if not kernels:
        return "none"
    kind = ("dot" if "dot" in calls else "scan" if calls & {"cumsum", "cumprod", "associative_scan"} else
            "reduce" if calls & {"sum", "max", "min", "reduce", "argmax", "argmin", "xor_sum"} else "elementwise")
    grid = "persistent" if "num_programs" in calls else "grid"
    loop = "loop" if any(isinstance(n, (ast.For, ast.While)) for k in kernels for n in ast.walk(k)) else "tile"
    atomic = "-atomic" if any(c.startswith("atomic_") for c in calls) else ""
    return f"{kind}-{grid}-{loop}{atomic}"


def fitness(c: Candidate) -> tuple[int, float, int]:
    speed = 0.0
    if c.accepted and c.speedup is not None:
        # The lower end of the speedup's confidence interval: among many noisy variants, the best point estimate is
        # biased upwards (the winner's curse); the lower bound rewards a speedup that was measured to hold.
        low = c.timings.eager_ci_low
        speed = low if low is not None else c.speedup
    return (1 if c.accepted else 0, speed, STAGE_RANK.get(c.stage or "propose", 0))


def rank(c: Candidate) -> tuple:
    """The one order of "best" (the run's best and best.py, `archive tasks`, `archive list --sort speedup`, the
    report): verified first, timed before untimed, then fitness; ties (nothing timed) go to the earliest kernel."""
    return (*fitness(c), -c.id)


def best_key(c: Candidate, held: frozenset[int] | set[int] = frozenset()) -> tuple:
    """Sort key, highest best: a challenger no duel crowned (`held`) ranks after the kernels that were not held."""
    return (c.accepted, c.accepted and c.id not in held, c.timed, *rank(c))


def best_of(cands: list[Candidate], held: frozenset[int] | set[int] = frozenset()) -> Candidate | None:
    """The best verified candidate, or None."""
    verified = [c for c in cands if c.accepted]
    return max(verified, key=lambda c: best_key(c, held), default=None)


@dataclass(frozen=True)
class Selection:
    """What to propose next: `kind` is fresh (from the reference), improve, fix or crossover."""

    kind: str
    parents: tuple[Candidate, ...] = ()

    @property
    def parent(self) -> Candidate | None:
        return self.parents[0] if self.parents else None


class Search:
    def __init__(self, seed: int = 0, *, exploit: float = 0.6, crossover: float = 0.2, fix: float = 0.25):
        self.rng = random.Random(seed)
        self.exploit, self.p_crossover, self.p_fix = exploit, crossover, fix
        self.fixes: dict[int, int] = defaultdict(int)
        self.held: set[int] = set()  # ids the loop's duels did not crown: never the exploit pick while another is

    # ---- the pool --------------------------------------------------------------------------------------------
    @staticmethod
    def niches(elites: list[Candidate]) -> dict[str, Candidate]:
        """The best elite of each niche."""
        best: dict[str, Candidate] = {}
        for c in elites:
            key = c.niche or "?"
            if key not in best or fitness(c) > fitness(best[key]):
                best[key] = c
        return best

    def best(self, pool: list[Candidate]) -> Candidate:
        pool = [c for c in pool if c.id not in self.held] or pool
        top = max(fitness(c) for c in pool)
        return self.rng.choice([c for c in pool if fitness(c) == top])

    def explore(self, elites: list[Candidate]) -> Candidate:
        """A random niche's best half the time, a uniformly random elite otherwise."""
        if self.rng.random() < 0.5:
            return self.rng.choice(sorted(self.niches(elites).values(), key=lambda c: c.id))
        return self.rng.choice(elites)

    def pick_parent(self, elites: list[Candidate]) -> Candidate:
        return self.best(elites) if self.rng.random() < self.exploit else self.explore(elites)

    # ---- selection -------------------------------------------------------------------------------------------
    def select_for_llm(self, elites: list[Candidate], failures: list[Candidate]) -> Selection:
        """Elites and failures must carry their source. Failures: this run's rejected candidates with code."""
        fixable = [c for c in failures if self.fixes[c.id] < MAX_FIXES and c.source]
        if not elites:
            if fixable:
                return self._fix(max(fixable, key=lambda c: (fitness(c), c.id)))
            return Selection("fresh")
        r = self.rng.random()
        if r < self.p_crossover and len(elites) >= 2:
            return Selection("crossover", self._pair(elites))
        if r < self.p_crossover + self.p_fix and fixable:
            return self._fix(max(fixable, key=lambda c: c.id))  # the most recent failure, while it is fresh
        return Selection("improve", (self.pick_parent(elites),))

    def select_for_tuner(self, elites: list[Candidate], exhausted: set[int]) -> Selection | None:
        """Mutation of an elite, or crossover of two elites of one lineage; None when every elite is exhausted."""
        usable = [c for c in elites if c.id not in exhausted and c.source]
        if not usable:
            return None
        if self.rng.random() < self.p_crossover:
            lineages: dict[str, list[Candidate]] = defaultdict(list)
            for c in elites:
                key = skeleton(c.source or "")
                if key is not None:
                    lineages[key].append(c)
            groups = [g for g in lineages.values() if len(g) >= 2]
            if groups:
                return Selection("crossover", self._pair(self.rng.choice(groups)))
        return Selection("improve", (self.pick_parent(usable),))

    def _fix(self, c: Candidate) -> Selection:
        self.fixes[c.id] += 1
        return Selection("fix", (c,))

    def _pair(self, pool: list[Candidate]) -> tuple[Candidate, Candidate]:
        """The best of the pool and a partner from another niche where there is one."""
        first = self.pick_parent(pool)
        others = [c for c in pool if c.id != first.id]
        elsewhere = [c for c in others if c.niche != first.niche]
        return first, self.rng.choice(elsewhere or others)
