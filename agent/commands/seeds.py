"""`crucible seeds list`: the hand-written kernels that start a search, and the tasks they start it for."""
from __future__ import annotations

import argparse
import json

from rich.console import Console
from rich.table import Table

console = Console()


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("seeds", help="list the seed kernels", description=__doc__)
    verbs = p.add_subparsers(dest="verb", metavar="VERB")
    ls = verbs.add_parser("list", help="one row per seed and task")
    ls.add_argument("--json", action="store_true", help="one JSON array of {name, task, path}")
    p.set_defaults(func=run, parser=p)


def run(args: argparse.Namespace) -> int:
    from seeds.registry import all_seeds

    if args.verb is None:
        args.parser.print_help()
        return 2
    rows = [{"name": s.name, "task": task, "path": str(s.path)} for s in all_seeds() for task in s.tasks]
    if args.json:
        console.print_json(json.dumps(rows))
        return 0
    table = Table("name", "task", "path")
    for r in rows:
        table.add_row(r["name"], r["task"], r["path"])
    console.print(table)
    return 0
