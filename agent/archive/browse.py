"""Reading the archive the way a person does: find a candidate, filter and sort, follow its lineage, compare two,
and sum up each task. No printing here: the CLI renders, the HTML report reuses the same pieces.

A candidate is named by its local id (`12`, `#12`) or by a prefix of its uid (at least 6 hex digits), which stays
the same when archives from several machines are merged.
"""
from __future__ import annotations

import datetime as _dt
import difflib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.archive.records import Candidate

from agent.archive.store import Archive
from agent.search.elites import best_key

SORTS = ("id", "speedup", "created")
FINGERPRINT_KEYS = ("device", "gpu", "driver", "cuda", "torch", "triton")


class BrowseError(ValueError):
    """A reference or filter the user gave that names nothing; the message is one sentence that says what to do."""


# ---- finding candidates ---------------------------------------------------------------------------------------
def resolve(archive: Archive, ref: str) -> Candidate:
    """The candidate `ref` names, with its source."""
    said = str(ref).strip()
    text = said.lstrip("#")
    is_uid = not said.startswith("#") and len(text) >= 6 and all(ch in "0123456789abcdef" for ch in text.lower())
    if text.isdigit():  # an id, or a uid prefix that happens to be all digits (one in forty 8-digit prefixes)
        cand = archive.get(int(text)) if len(text) < 19 else None
        if cand is not None and is_uid and archive.by_uid(text):
            raise BrowseError(f"{text!r} is both candidate #{text} and a uid prefix; write #{text} for the id, or "
                              "give more of the uid")
        if cand is not None:
            return cand
        if not is_uid:
            raise BrowseError(f"no candidate #{text} in {archive.path}; `crucible archive list` shows the ids")
    if is_uid:
        found = archive.by_uid(text.lower())
        if len(found) == 1:
            return archive.with_source(found[0])
        if len(found) > 1:
            raise BrowseError(f"uid prefix {text!r} matches several candidates; give more of it")
        raise BrowseError(f"no candidate with uid {text!r}... in {archive.path}")
    raise BrowseError(f"{ref!r} is not a candidate: give the id `crucible archive list` shows, or a uid prefix "
                      "of 6 or more hex digits")


@dataclass(frozen=True)
class Query:
    """What `crucible archive list` keeps and how it orders it. Dates are inclusive, in UTC."""

    task: str | None = None
    verdict: str | None = None
    proposer: str | None = None
    since: str | None = None
    until: str | None = None
    sort: str = "id"
    limit: int | None = None

    def __post_init__(self) -> None:
        if self.verdict not in (None, "accepted", "rejected", "interrupted"):
            raise BrowseError(f"unknown verdict {self.verdict!r}; use accepted, rejected or interrupted")
        if self.sort not in SORTS:
            raise BrowseError(f"cannot sort by {self.sort!r}; use one of {', '.join(SORTS)}")
        if self.limit is not None and self.limit < 1:
            raise BrowseError("--limit must be a positive number of rows")
        for value in (self.since, self.until):
            if value is not None:
                parse_date(value)


def parse_date(text: str, *, end: bool = False) -> _dt.datetime:
    """"2026-11-29" or "2026-11-29T10:15[:06][+00:00]"; a bare date means its start (or, with end, its end)."""
    try:
        if len(text) == 10:
            day = _dt.date.fromisoformat(text)
            moment = _dt.datetime.combine(day, _dt.time.max if end else _dt.time.min)
        else:
            moment = _dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise BrowseError(f"{text!r} is not a date; write it as 2026-11-29 or 2026-11-29T10:15") from None
    return moment if moment.tzinfo else moment.replace(tzinfo=_dt.timezone.utc)


def task_arg(task: str | None) -> str | None:
    """A task named as the user types it: a path, a file name, or a name without .py."""
    return task if not task or task.endswith(".py") else task + ".py"


def select(archive: Archive, query: Query) -> list[Candidate]:
    cands = archive.candidates(task=task_arg(query.task), verdict=query.verdict)
    if query.proposer:
        want = query.proposer.lower()
        cands = [c for c in cands if want in c.proposer.lower() or want == c.origin]
    if query.since:
        lo = parse_date(query.since)
        cands = [c for c in cands if c.created and parse_date(c.created) >= lo]
    if query.until:
        hi = parse_date(query.until, end=True)
        cands = [c for c in cands if c.created and parse_date(c.created) <= hi]
    if query.sort == "speedup":
        # Fastest first by the lower end of the CI (as the search ranks them); untimed and rejected ones after.
        cands = sorted(cands, key=best_key, reverse=True)
    elif query.sort == "created":
        cands = sorted(cands, key=lambda c: (c.created, c.id))
    return cands[:query.limit] if query.limit else cands


def task_name(c: Candidate | str) -> str:
    return Path(c.task_path if isinstance(c, Candidate) else c).stem


# ---- telling what was measured --------------------------------------------------------------------------------
def speed_text(value: float | None, low: float | None, high: float | None) -> str:
    if value is None:
        return "not measured"
    return f"{value:.2f}x" + (f" (95% CI {low:.2f}-{high:.2f})" if low is not None and high is not None else "")


def result_text(c: Candidate) -> str:
    """The measured result in one line, saying plainly when nothing was timed."""
    if not c.accepted:
        return f"{c.verdict} at {c.stage or '-'} ({c.reason})"
    if not c.timed:
        return "verified, not timed (correctness only; it says nothing about speed)"
    t = c.timings
    parts = [f"{speed_text(t.speedup_eager, t.eager_ci_low, t.eager_ci_high)} vs eager PyTorch"]
    if t.speedup_compile is not None:
        parts.append(f"{speed_text(t.speedup_compile, t.compile_ci_low, t.compile_ci_high)} vs torch.compile")
    if t.candidate_ms is not None:
        parts.append(f"{t.candidate_ms:.4f} ms")
    if t.pct_roofline is not None:
        parts.append(f"{t.pct_roofline:.0f}% of roofline")
    return ", ".join(parts)


def fingerprint(env: dict[str, Any] | None) -> dict[str, Any]:
    """What a measurement depends on: device, GPU model, driver, CUDA, torch, triton (not paths or hostnames)."""
    env = env or {}
    gpu = env.get("gpu")
    out = {k: env.get(k) for k in FINGERPRINT_KEYS}
    out["gpu"] = gpu.get("name") if isinstance(gpu, dict) else gpu
    if out["device"] == "cpu":  # the CPU interpreter: GPU fields say nothing about the result
        out.update(gpu=None, driver=None, cuda=None)
    return out


def env_text(env: dict[str, Any] | None) -> str:
    if not env:
        return "not recorded"
    fp = fingerprint(env)
    parts = [fp["gpu"] or ("CPU (Triton interpreter)" if fp["device"] == "cpu" else fp["device"] or "unknown device")]
    if fp["driver"]:
        parts.append(f"driver {fp['driver']}")
    if fp["cuda"]:
        parts.append(f"CUDA {fp['cuda']}")
    parts += [f"{k} {fp[k]}" for k in ("torch", "triton") if fp[k]]
    consts = env.get("constants")
    if consts:
        parts.append("shape " + ", ".join(f"{k}={v}" for k, v in consts.items()))
    return ", ".join(parts)


# ---- lineage and diffs ----------------------------------------------------------------------------------------
@dataclass
class LineageNode:
    candidate: Candidate
    children: list["LineageNode"] = field(default_factory=list)
    second_parent: bool = False  # this node is a crossover child through its second parent


def ancestors(archive: Archive, cand: Candidate) -> list[Candidate]:
    """First parents, oldest first, ending with `cand`'s parent."""
    chain: list[Candidate] = []
    seen = {cand.id}
    parent_id = cand.parent_id
    while parent_id and parent_id not in seen:
        parent = archive.get(parent_id, with_source=False)
        if parent is None:
            break
        seen.add(parent_id)
        chain.append(parent)
        parent_id = parent.parent_id
    return chain[::-1]


def descendants(archive: Archive, cand: Candidate, *, depth: int = 50) -> LineageNode:
    """The tree of candidates built on `cand` (crossovers appear under both parents, marked on the second)."""
    seen: set[int] = set()

    def grow(c: Candidate, second: bool, level: int) -> LineageNode:
        node = LineageNode(c, second_parent=second)
        if c.id in seen or level >= depth:
            return node
        seen.add(c.id)
        node.children = [grow(k, k.parent_id != c.id, level + 1) for k in archive.children(c.id)]
        return node

    return grow(cand, False, 0)


def lineage(archive: Archive, cand: Candidate) -> tuple[list[Candidate], LineageNode]:
    return ancestors(archive, cand), descendants(archive, cand)


def diff(a: Candidate, b: Candidate, *, context: int = 3) -> str:
    """Unified diff of two candidates' sources ("" when they are the same)."""
    lines = difflib.unified_diff((a.source or "").splitlines(keepends=True), (b.source or "").splitlines(keepends=True),
                                 fromfile=label(a), tofile=label(b), n=context)
    return "".join(line if line.endswith("\n") else line + "\n" for line in lines)


def label(c: Candidate) -> str:
    return f"#{c.id} {c.uid[:8]} ({c.proposer}, {c.verdict})"


# ---- one row per task -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TaskSummary:
    task: str                 # the task file's name without .py
    task_paths: tuple[str, ...]
    tried: int                # candidates with a verdict (interrupted ones excluded)
    verified: int             # accepted by the harness
    timed: int                # verified and timed on a GPU
    best: Candidate | None    # the fastest timed kernel by its CI's lower end, else the earliest verified (best_key)
    proposals: int            # LLM and tuner proposals (seeds excluded)

    @property
    def best_speedup(self) -> float | None:
        return self.best.speedup if self.best is not None else None

    @property
    def best_roofline(self) -> float | None:
        return self.best.timings.pct_roofline if self.best is not None and self.best.timed else None


def task_summaries(archive: Archive, task: str | None = None) -> list[TaskSummary]:
    groups: dict[str, list[Candidate]] = {}
    for c in archive.candidates(task=task_arg(task)):
        groups.setdefault(task_name(c), []).append(c)
    out = []
    for name, cands in sorted(groups.items()):
        ranked = winners(cands, uncrowned(archive, cands))
        out.append(TaskSummary(
            task=name, task_paths=tuple(sorted({c.task_path for c in cands})),
            tried=sum(c.verdict != "interrupted" for c in cands), verified=sum(c.accepted for c in cands),
            timed=sum(c.accepted and c.timed for c in cands), best=ranked[0] if ranked else None,
            proposals=sum(c.origin != "seed" for c in cands)))
    return out


def winners(cands: list[Candidate], held: frozenset[int] | set[int] = frozenset()) -> list[Candidate]:
    """Verified candidates, best first, in the order the run crowns its best (agent/search/elites.py's `best_key`): timed
    ones by the lower end of their CI, then untimed ones, earliest first; challengers no duel crowned after."""
    return sorted((c for c in cands if c.accepted), key=lambda c: best_key(c, held), reverse=True)


def uncrowned(archive: Archive, cands: list[Candidate]) -> set[int]:
    """The challengers among `cands`' tasks that no duel crowned."""
    return set().union(*(archive.uncrowned(h) for h in {c.task_hash for c in cands}))

