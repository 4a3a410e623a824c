"""`crucible archive list|show`: browse the candidates every run has kept.

The archive is --archive PATH, else $CRUCIBLE_ARCHIVE, else runs/archive.db.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.syntax import Syntax
from rich.table import Table

console = Console()
err_console = Console(stderr=True)


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("archive", help="browse archived candidates", description=__doc__)
    verbs = p.add_subparsers(dest="verb", metavar="VERB")
    ls = verbs.add_parser("list", help="one row per candidate")
    ls.add_argument("--task", help="only this task (path or file name)")
    ls.add_argument("--json", action="store_true", help="one JSON array: id, task, verdict, stage, reason, proposer, "
                                                        "speedup (or null), created")
    ls.add_argument("--archive", type=Path, help="archive file (default: $CRUCIBLE_ARCHIVE, else runs/archive.db)")
    show = verbs.add_parser("show", help="one candidate with its source")
    show.add_argument("id", help="candidate id")
    show.add_argument("--json", action="store_true", help="everything recorded, as JSON")
    show.add_argument("--archive", type=Path, help="archive file (default: $CRUCIBLE_ARCHIVE, else runs/archive.db)")
    p.set_defaults(func=run, parser=p)


def run(args: argparse.Namespace) -> int:
    from agent.archive import Archive, default_path

    if args.verb is None:
        args.parser.print_help()
        return 2
    path = args.archive or default_path()
    if not Path(path).exists():
        err_console.print(f"no archive at {path}; run `crucible run TASK` first, or pass --archive PATH")
        return 2
    try:
        archive = Archive(path)
    except Exception as exc:  # noqa: BLE001 - a file the user pointed at: one sentence, no traceback
        err_console.print(f"cannot read the archive {path}: {exc}")
        return 2
    with archive:
        return _list(archive, args) if args.verb == "list" else _show(archive, args)


def _list(archive: Any, args: argparse.Namespace) -> int:
    cands = archive.candidates(task=args.task)
    if args.json:
        console.print_json(json.dumps([c.summary() for c in cands]))
        return 0
    if not cands:
        console.print("no candidates" + (f" for {args.task}" if args.task else ""))
        return 0
    table = Table("id", "task", "verdict", "stage", "reason", "proposer", "speedup", "created")
    for c in cands:
        speed = f"{c.speedup:.2f}x" if c.speedup is not None else ("not timed" if c.accepted else "")
        style = "green" if c.accepted else "red" if c.verdict == "rejected" else "yellow"
        table.add_row(str(c.id), Path(c.task_path).name, f"[{style}]{c.verdict}[/{style}]", c.stage or "", c.reason,
                      c.proposer, speed, c.created)
    console.print(table)
    return 0


def _show(archive: Any, args: argparse.Namespace) -> int:
    try:
        cand_id = int(args.id)
    except ValueError:
        err_console.print(f"{args.id!r} is not a candidate id; ids are the numbers `crucible archive list` shows")
        return 2
    cand = archive.get(cand_id)
    if cand is None:
        err_console.print(f"no candidate #{cand_id} in {archive.path}")
        return 2
    if args.json:
        console.print_json(json.dumps(cand.to_dict(), default=str))
        return 0
    t = cand.timings
    table = Table(show_header=False, box=None, padding=(0, 1))
    rows = [("candidate", f"#{cand.id} ({cand.uid})"), ("task", cand.task_path), ("run", cand.run_id or ""),
            ("proposer", f"{cand.proposer} ({cand.origin})"),
            ("parents", ", ".join(f"#{p}" for p in (cand.parent_id, cand.parent2_id) if p) or "none"),
            ("verdict", f"{cand.verdict} at {cand.stage or '-'} ({cand.reason})"), ("message", cand.message),
            ("niche", cand.niche or "")]
    if cand.timed:
        rows += [("vs eager", _speed(t.speedup_eager, t.eager_ci_low, t.eager_ci_high)),
                 ("vs torch.compile", _speed(t.speedup_compile, t.compile_ci_low, t.compile_ci_high)),
                 ("roofline", "" if t.pct_roofline is None else f"{t.pct_roofline:.0f}%")]
    else:
        rows.append(("timing", "not timed"))
    if cand.input_tokens or cand.output_tokens:
        rows.append(("tokens", f"{cand.input_tokens} in, {cand.output_tokens} out"
                               + (f", ${cand.cost_usd:.4f}" if cand.cost_usd is not None else "")))
    if cand.env:
        rows.append(("environment", ", ".join(f"{k} {v}" for k, v in cand.env.items() if k != "constants")))
    rows.append(("created", cand.created))
    for k, v in rows:
        table.add_row(k, str(v))
    console.print(table)
    if cand.source:
        console.print(Syntax(cand.source, "python", line_numbers=True))
    else:
        console.print("(no source: the proposal produced no code)")
    return 0


def _speed(v: float | None, low: float | None, high: float | None) -> str:
    if v is None:
        return "not measured"
    return f"{v:.2f}x" + (f" (95% CI {low:.2f}-{high:.2f})" if low is not None and high is not None else "")
