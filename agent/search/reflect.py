"""The periodic reflection: what has worked for a task and what has not, summarised from the archive.

Every REFLECT_EVERY verdicts a run writes one (and once more at its end) into the archive's `reflections` table.
Requests show the latest one, so the model learns from attempts made in other lineages, in an earlier invocation
(`--resume`) and in earlier runs on the same task, not only from its own parent's children.

It is made from the records, not by a model: the changes that led to verified kernels (fastest first where they were
timed), the failures grouped by reason with one example each, and how many edits did not apply. No request is spent
on it and nothing in it is invented.
"""
from __future__ import annotations

from collections import Counter
from typing import Sequence

from agent.archive.records import Candidate
from agent.search.proposing import what_changed
from agent.search.elites import rank

REFLECT_EVERY = 4  # verdicts of proposals between two reflections
MAX_LINES = 5  # per part


def reflection(cands: Sequence[Candidate]) -> str | None:
    """What `cands` (one task's records, any runs) say has worked and failed; None when there is nothing to say."""
    by_id = {c.id: c for c in cands}
    proposals = [c for c in cands if c.origin in ("llm", "tuner") and c.verdict != "interrupted"
                 and c.reason != "provider_error"]
    if not proposals:
        return None
    worked = sorted((c for c in proposals if c.accepted), key=rank, reverse=True)
    lines = [f"From {len(proposals)} proposals so far: {len(worked)} verified."]
    if worked:
        lines.append("Changes that gave verified kernels" + (" (fastest first):" if worked[0].timed else ":"))
        for c in worked[:MAX_LINES]:
            parent = by_id.get(c.parent_id) if c.parent_id is not None else None
            change = ""
            p_ms, c_ms = (parent.timings.candidate_ms if parent else None), c.timings.candidate_ms
            if p_ms and c_ms:
                change = f", time {100.0 * (c_ms - p_ms) / p_ms:+.1f}% vs #{parent.id}"
            origin = f"from #{parent.id}" if parent else "from scratch"
            timing = f"{c.timings.speedup_eager:.2f}x vs eager" if c.timings.speedup_eager is not None else \
                "not timed"
            lines.append(f"- #{c.id} ({origin}): {what_changed(c)} -> {timing}{change}")
    failed = [c for c in proposals if c.verdict == "rejected" and c.reason not in ("duplicate", "edit_failed")]
    if failed:
        lines.append("What failed, by reason (most frequent first):")
        for reason, n in Counter(c.reason for c in failed).most_common(MAX_LINES):
            example = next(c for c in reversed(failed) if c.reason == reason)
            first = (example.message or "").strip().split("\n")[0][:200]
            lines.append(f"- {reason} x{n}, e.g. #{example.id}: {first}")
    edits = sum(c.reason == "edit_failed" for c in proposals)
    dups = sum(c.reason == "duplicate" for c in proposals)
    if edits or dups:
        lines.append(f"{edits} replies had edits that did not apply; {dups} repeated code already checked.")
    return "\n".join(lines)
