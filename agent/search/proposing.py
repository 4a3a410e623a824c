"""What the next proposal asks for: the tuner's next variant, or the messages that ask an LLM for a kernel.

The loop decides when to propose and by whom; this module decides what: which verified kernels a tuner variant or a
prompt builds on (through agent/search/elites.py), and how those kernels and their verdicts are written into the prompt.
A proposal travels through the loop as a `Pending` until its candidate has a verdict.
"""
from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from agent.llm import diffs, prompting
from agent.search import tuner as tuner_mod
from agent.archive.records import Candidate
from agent.archive.store import Archive
from agent.llm.chat import Message, Reply
from agent.search.elites import Search, Selection, rank
from sandbox.task import Task


@dataclass
class Pending:
    """A proposal on its way: requested, extracted, under evaluation."""

    origin: str  # llm | tuner
    proposer: str
    selection: Selection
    prompt: str
    reply: Reply | None = None
    source: str | None = None
    sha: str | None = None
    path: Path | None = None
    slot: int | None = None
    started: float = field(default_factory=time.monotonic)
    retried: bool = False  # checked again once after the harness itself failed (a verdict of harness_error)


def tuner_proposal(search: Search, tuner: tuner_mod.Tuner, elites: list[Candidate], exhausted: set[int],
                   known: set[str]) -> tuple[Pending, Reply] | None:
    """The tuner's next variant of the elites that is not in `known`; None when it has none left.

    An elite the tuner can make nothing new of is added to `exhausted`, so that it is not selected again.
    """
    while True:
        sel = search.select_for_tuner(elites, exhausted)
        if sel is None:
            return None
        prop = None
        if sel.kind == "crossover":
            prop = tuner.crossover(sel.parents[0].source or "", sel.parents[1].source or "", known)
            if prop is None:
                sel = Selection("improve", sel.parents[:1])
        if prop is None:
            prop = tuner.mutate(sel.parents[0].source or "", known)
        if prop is not None:
            # Its parents' file (flattened when they were admitted) with literals changed: nothing to extract or flatten.
            return Pending("tuner", tuner_mod.NAME, sel, prompt=prop.description, source=prop.source), prop.reply
        exhausted.add(sel.parents[0].id)


def tuner_feedback(tuner: tuner_mod.Tuner, pending: Pending, cand: Candidate) -> None:
    """Tell the tuner of its one-parent variant rejected before its timing (Tuner.learn; a harness error or an
    interrupted check says nothing about the kernel, a timing rejection may be a close call), or verified with the
    very kernels its parent ran (Tuner.learn_unchanged)."""
    parents = pending.selection.parents
    if pending.origin != "tuner" or len(parents) != 1 or not parents[0].source or not pending.source:
        return
    if cand.verdict == "rejected" and cand.stage not in (None, "propose", "timing") and \
            cand.reason not in ("harness_error", "interrupted"):
        tuner.learn(parents[0].source, pending.source)
    elif cand.accepted:
        mine = tuner_mod.compiled_signature(cand.diagnostics or {})
        if mine is not None and mine == tuner_mod.compiled_signature(parents[0].diagnostics or {}):
            tuner.learn_unchanged(parents[0].source, pending.source)


def llm_messages(task: Task, sel: Selection, elites: list[Candidate], *, timed: bool,
                 history: Sequence[Candidate] = (), best: Candidate | None = None, max_output_tokens: int = 8192,
                 system: str | None = None, reflection: str | None = None) -> list[Message]:
    """The messages asking for the kernel `sel` calls for: a fix, a crossover, a first kernel or an improvement.

    `history` is this run's proposals so far (with their replies): the attempts made from the kernel shown are
    listed with what changed, the outcome and the time change. A fix also shows `best`, the best verified kernel.
    `system` is the system prompt when the caller made it (with measured facts and a retrieved example).
    """
    task_source = task.path.read_text(encoding="utf-8", errors="replace")
    common = {"task_name": task.name, "task_source": task_source, "system": system, "gpu": "h200" if timed else "cpu",
              "allow_torch_compute": task.meta.allow_torch_compute, "max_output_tokens": max_output_tokens}
    if system is not None:
        common = {k: v for k, v in common.items() if k in ("task_name", "task_source", "system")}
    learnt = {"reflection": reflection or "Nothing yet."}
    if sel.kind == "fix":
        p = sel.parents[0]
        shown = (_one_line(best), best.source or "") if best is not None and best.source else None
        return prompting.fix_messages(broken_source=p.source or "", diagnostics=_diagnostics(p),
                                      attempts=attempts_text(p, history), best=shown, **learnt, **common)
    if sel.kind == "crossover":
        a, b = sel.parents
        return prompting.crossover_messages(source_a=a.source or "", diagnostics_a=_diagnostics(a),
                                            source_b=b.source or "", diagnostics_b=_diagnostics(b), **common)
    if sel.kind == "fresh":
        return prompting.propose_messages(
            parent_source="# No kernel yet.", elites=(),
            parent_diagnostics="There is no kernel for this task yet: write the first one from the reference.",
            attempts=attempts_text(None, history), **learnt, **common)
    parent = sel.parents[0]
    others = sorted((e for e in elites if e.id != parent.id), key=rank, reverse=True)[:2]
    return prompting.propose_messages(parent_source=parent.source or "", parent_diagnostics=_diagnostics(parent),
                                      elites=[(_one_line(e), e.source or "") for e in others],
                                      attempts=attempts_text(parent, history), **learnt, **common)


MAX_ATTEMPTS = 8  # the most recent attempts listed per kernel


def attempts_text(parent: Candidate | None, history: Sequence[Candidate]) -> str:
    """The proposals made from `parent` (None: from scratch), oldest first: what changed, outcome, time change."""
    pid = parent.id if parent is not None else None
    mine = [c for c in history if c.parent_id == pid and c.origin in ("llm", "tuner")
            and c.reason not in ("provider_error",) and c.verdict != "interrupted"]
    lines = [f"- #{c.id}: {what_changed(c)} -> {outcome(c, parent)}" for c in mine[-MAX_ATTEMPTS:]]
    if len(mine) > MAX_ATTEMPTS:
        lines.insert(0, f"({len(mine) - MAX_ATTEMPTS} earlier attempts not listed)")
    chain = lineage(parent, history)
    if chain:
        lines.insert(0, "How this kernel came about: " + " -> ".join(chain))
    return "\n".join(lines) or "None yet."


def lineage(c: Candidate | None, history: Sequence[Candidate], limit: int = 6) -> list[str]:
    """The steps from the oldest known ancestor to `c`, each with what changed; empty for a kernel with no parent."""
    by_id = {h.id: h for h in history}
    steps: list[str] = []
    while c is not None and c.parent_id is not None and len(steps) < limit:
        steps.append(f"#{c.id} ({what_changed(c)})")
        c = by_id.get(c.parent_id) or _Stub(c.parent_id)
        if isinstance(c, _Stub):
            steps.append(f"#{c.id}")
            break
    else:
        if c is not None and steps:
            steps.append(f"#{c.id} ({c.origin})")
    return steps[::-1]


class _Stub:
    """An ancestor not in this run's records (an earlier run's)."""

    def __init__(self, cid: int):
        self.id, self.parent_id = cid, None


def what_changed(c: Candidate) -> str:
    """The attempt's own one-line summary: the first sentence of the reply's prose (and the edits' size), or the
    tuner's description."""
    if c.origin == "tuner" or not c.reply:
        return (c.prompt or "?").split("\n")[0][:160]
    prose = []
    fence = False
    for line in c.reply.split("\n"):
        stripped = line.strip()
        if stripped.startswith(("```", "~~~")):
            fence = not fence
            continue
        if fence or not stripped or stripped.startswith(("<<<<<<<", "=======", ">>>>>>>", "<think", "</think")):
            continue
        prose.append(stripped)
        break
    text = prose[0] if prose else "(no summary)"
    text = re.split(r"(?<=[.!?])\s", text, maxsplit=1)[0]
    edits = f" [{diffs.summary(diffs.parse_edits(c.reply))}]" if _parsable_edits(c.reply) else " [whole file]"
    return f'"{text[:160]}"' + (edits if c.stage != "propose" or c.reason == "duplicate" else "")


def _parsable_edits(reply: str) -> bool:
    try:
        return diffs.has_edits(reply) and bool(diffs.parse_edits(reply))
    except diffs.EditError:
        return False


def outcome(c: Candidate, parent: Candidate | None) -> str:
    if c.accepted:
        text = f"verified, {speed(c)}" if c.timed else "verified (not timed)"
        p_ms, c_ms = (parent.timings.candidate_ms if parent is not None else None), c.timings.candidate_ms
        if p_ms and c_ms:
            text += f"; time {100.0 * (c_ms - p_ms) / p_ms:+.1f}% vs #{parent.id}"
        return text
    first = (c.message or "").strip().split("\n")[0][:300]
    if c.reason == "truncated":
        return f"cut off: {first}"
    if c.reason == "edit_failed":
        return f"the edits did not apply: {first}"
    if c.reason == "duplicate":
        return f"not checked: {first}"
    return f"rejected at the {c.stage or '?'} stage ({c.reason}): {first}"


def system_for(task: Task, *, timed: bool, env: dict | None = None, ceilings: dict | None = None,
               archive: Archive | None = None, own_seed: Path | None = None, max_output_tokens: int = 8192) -> str:
    """A run's system prompt: the rules, the answer formats, the facts measured for this device and task
    (agent/search/facts.py; `env` is a check's environment, the installed versions fill what it lacks) and an example of
    the task's op family (agent/search/examples.py)."""
    from importlib import metadata

    import torch

    from agent.search import examples, facts

    versions: dict = {"torch": torch.__version__, "triton": None}
    try:
        versions["triton"] = metadata.version("triton")
    except metadata.PackageNotFoundError:
        pass
    env = {**versions, **(env or {})}
    baselines = facts.baseline_times(archive, task.source_hash) if timed and archive is not None else {}
    text = facts.facts_text(task, timed=timed, env=env, ceilings=ceilings, baselines=baselines)
    example = examples.retrieve(task.path, archive, timed=timed, own_seed=own_seed)
    return prompting.system_prompt(gpu_facts=text, example=example, allow_torch_compute=task.meta.allow_torch_compute,
                                   max_output_tokens=max_output_tokens)


def messages_text(messages: list[Message]) -> str:
    return "\n\n".join(f"[{m.role}]\n{m.content}" for m in messages)


def speed(c: Candidate) -> str:
    t = c.timings
    if t.speedup_eager is None:
        return "not timed"
    text = f"{t.speedup_eager:.2f}x vs eager"
    if t.eager_ci_low is not None and t.eager_ci_high is not None:
        text += f" [{t.eager_ci_low:.2f}, {t.eager_ci_high:.2f}]"
    if t.pct_roofline is not None:
        text += f", {t.pct_roofline:.0f}% of roofline"
    return text


def _diagnostics(c: Candidate) -> str:
    if c.diagnostics:
        return prompting.describe_result(c.diagnostics, c.source)
    return f"{c.verdict} ({c.reason}): {c.message}"


def _one_line(c: Candidate) -> str:
    return f"#{c.id}, {speed(c) if c.timed else 'verified, not timed'}"
