"""What one request looks like, turn by turn, and what each part costs in tokens: `python -m agent.search.turns TASK`.

Builds the four kinds of request the loop sends for a task — fresh (no kernel yet), fix (a rejected kernel with its
diagnostics), improve (a verified kernel, its attempts so far) and crossover (two verified kernels) — from the task's
seed kernel (flattened as a run flattens it), with the CPU's facts and the example a run retrieves, and prints each
message's sections with their size. Tokens are approximated as characters / 4 (the usual rule for English and code
under BPE tokenizers such as OpenAI's cl100k; it is an estimate, not a count by the model's own tokenizer).
docs/agent.md shows its output.

The fix turn's kernel is the seed with one line broken (a call to a function Triton does not have) and the verdict the
harness gives such a file; the improve turn's attempts list holds one edit of the warps. These two are
illustrations, written here; everything else is what the loop sends.
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from agent.archive.records import Candidate
from agent.search.flatten import flatten
from agent.llm.chat import Message
from agent.search.proposing import llm_messages, system_for
from agent.search.elites import Selection
from sandbox.task import load_task
from seeds.registry import seed_for_task

CHARS_PER_TOKEN = 4


def tokens(text: str) -> int:
    return (len(text) + CHARS_PER_TOKEN - 1) // CHARS_PER_TOKEN


def sections(message: Message) -> list[tuple[str, int]]:
    """(heading, approximate tokens) of each `# ` section of a message, the text before the first heading as
    "(preamble)"."""
    out: list[tuple[str, list[str]]] = [("(preamble)", [])]
    fence = False
    for line in message.content.split("\n"):
        if re.match(r"^\s*(```|~~~)", line):
            fence = not fence  # a "# " line inside a code block is code, not a heading
        elif not fence and line.startswith("# "):
            out.append((line[:70], []))
        out[-1][1].append(line)
    return [(head, tokens("\n".join(lines))) for head, lines in out if lines]


def requests(task_path: Path) -> dict[str, list[Message]]:
    task = load_task(task_path)
    seed = seed_for_task(task_path)
    if seed is None:
        raise SystemExit(f"{task_path.name} has no seed kernel; the turns are built from a task's seed")
    source = flatten(seed.path.read_text(encoding="utf-8")).source
    common = dict(task_path=task.path, task_hash=task.source_hash, proposer="m")
    good = Candidate(id=1, origin="seed", verdict="accepted", reason="ok", stage="robustness", source=source, **common)
    lines = source.split("\n")
    at = next(i for i, line in enumerate(lines) if "tl.program_id(0)" in line)
    broken_lines = lines[:at] + [lines[at] + " + tl.no_such_function(1)"] + lines[at + 1:]
    broken_src = "\n".join(broken_lines)
    error = "AttributeError: module 'triton.language' has no attribute 'no_such_function'"
    diag = {"verdict": "rejected", "stage": "smoke", "reason": "runtime_error", "message": error,
            "candidate": "/scratch/cand.py", "stages": [{"stage": "static", "passed": True},
                                                        {"stage": "smoke", "passed": False, "message": error,
                                                         "error": {"type": "AttributeError", "message": error,
                                                                   "traceback": f'  File "/scratch/cand.py", line '
                                                                                f'{at + 1}, in forward\n{error}'}}]}
    broken = Candidate(id=2, origin="llm", verdict="rejected", reason="runtime_error", stage="smoke", parent_id=None,
                       source=broken_src, message=error, diagnostics=diag, **common)
    child = Candidate(id=3, origin="llm", verdict="accepted", reason="ok", stage="robustness", parent_id=1,
                      source=source, reply="Use 8 warps instead of 4.\n<<<<<<< SEARCH\nnum_warps=4\n=======\n"
                                            "num_warps=8\n>>>>>>> REPLACE", **common)
    history = [broken, child]
    system = system_for(task, timed=False, own_seed=seed.path)
    out = {}
    for kind, sel in (("fresh", Selection("fresh")), ("fix", Selection("fix", (broken,))),
                      ("improve", Selection("improve", (good,))), ("crossover", Selection("crossover", (good, child)))):
        out[kind] = llm_messages(task, sel, [good, child], timed=False, history=history, best=good, system=system)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m agent.search.turns", description=__doc__.split("\n\n")[0])
    p.add_argument("task", type=Path)
    args = p.parse_args(argv)
    if not args.task.is_file():
        print(f"{args.task}: no such task file", file=sys.stderr)
        return 2
    for kind, messages in requests(args.task).items():
        total = sum(tokens(m.content) for m in messages)
        print(f"{kind}: ~{total} tokens")
        for m in messages:
            print(f"  [{m.role}] ~{tokens(m.content)}")
            for head, n in sections(m):
                print(f"    {n:6d}  {head}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
