"""`crucible archive VERB`: browse, compare, take away and re-check the candidates every run has kept.

  list       one row per candidate (filter by task, verdict, proposer, date; sort by speedup)
  show ID    one candidate: source, verdict, diagnostics, timings with CI and environment, lineage, duels
  diff A B   the change between two candidates' sources
  lineage ID the tree of its parents and children
  tasks      one row per task: best speedup, % of roofline, tried/verified
  export     ID -o FILE.py: a standalone kernel module; without ID, -o FILE.jsonl: the whole archive
  import     FILE.jsonl...: merge exported archives (records already here are skipped, by uid)
  reverify   re-check winners measured in another environment; marks them confirmed or stale
  report     -o FILE.html: one static page (KernelBench tables of batches, leaderboards, plots, lineage,
             winners' code); --kernelbench: a batch's KernelBench table as text (80 columns), --json as JSON

IDs are the numbers `list` shows, or a uid prefix (6+ hex digits). The archive is --archive PATH, else
$CRUCIBLE_ARCHIVE, else runs/archive.db.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.syntax import Syntax
from rich.table import Table
from rich.tree import Tree

# No emoji codes: a model named `openai:m:` prints as itself; user and model text goes through escape().
console = Console(emoji=False)
err_console = Console(stderr=True, emoji=False)
STATUS_STYLE = {"confirmed": "green", "stale": "red"}


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("archive", help="browse archived candidates", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--archive", type=Path, help="archive file (default: $CRUCIBLE_ARCHIVE, else runs/archive.db)")
    verbs = p.add_subparsers(dest="verb", metavar="VERB")

    ls = verbs.add_parser("list", parents=[common], help="one row per candidate")
    ls.add_argument("--task", help="only this task (path or file name)")
    ls.add_argument("--verdict", choices=["accepted", "rejected", "interrupted"])
    ls.add_argument("--proposer", help="model name (substring), or seed / llm / tuner")
    ls.add_argument("--since", help="created on or after this date (2026-11-29 or 2026-11-29T10:15, UTC)")
    ls.add_argument("--until", help="created on or before this date")
    ls.add_argument("--sort", default="id", help="id (default), speedup (fastest first) or created")
    ls.add_argument("--limit", type=int, help="at most this many rows")
    ls.add_argument("--json", action="store_true", help="one JSON array: id, task, verdict, stage, reason, proposer, "
                                                        "speedup (or null), created")
    show = verbs.add_parser("show", parents=[common], help="one candidate with its source and diagnostics")
    show.add_argument("id", help="candidate id or uid prefix")
    show.add_argument("--json", action="store_true", help="everything recorded, as JSON")
    df = verbs.add_parser("diff", parents=[common], help="unified diff of two candidates' sources")
    df.add_argument("a")
    df.add_argument("b")
    lin = verbs.add_parser("lineage", parents=[common], help="parents and children of a candidate")
    lin.add_argument("id")
    tasks = verbs.add_parser("tasks", parents=[common], help="one row per task")
    tasks.add_argument("--json", action="store_true")
    ex = verbs.add_parser("export", parents=[common], help="a standalone kernel module, or the archive as JSONL")
    ex.add_argument("id", nargs="?", help="the candidate to export as FILE.py; leave out to export the archive")
    ex.add_argument("-o", "--output", type=Path, required=True, help="FILE.py (with ID) or FILE.jsonl (without)")
    ex.add_argument("--task", help="with no ID: only this task's records")
    im = verbs.add_parser("import", parents=[common], help="merge archives exported as JSONL")
    im.add_argument("files", nargs="+", type=Path)
    rv = verbs.add_parser("reverify", parents=[common], help="re-check winners measured in another environment")
    rv.add_argument("--task", help="only this task")
    rv.add_argument("--all", action="store_true", help="every verified candidate, not only each task's best")
    rv.add_argument("--force", action="store_true", help="re-check even when the environment is the same")
    rp = verbs.add_parser("report", parents=[common], help="one static HTML page, or a batch's KernelBench table")
    rp.add_argument("-o", "--output", type=Path, help="the HTML page to write")
    rp.add_argument("--task", help="only this task")
    rp.add_argument("--kernelbench", action="store_true",
                    help="print a `crucible batch` run's KernelBench table (per task correct and speedups, fast_p, "
                         "geomean, tokens per correct kernel) as text, 80 columns wide")
    rp.add_argument("--batch", metavar="ID", help="that batch (an id or its prefix; default: the latest)")
    rp.add_argument("--json", action="store_true", help="the batch's table as one JSON object: tasks and metrics")
    p.set_defaults(func=run, parser=p)


def run(args: argparse.Namespace) -> int:
    from agent.archive.store import Archive, default_path
    from agent.archive.browse import BrowseError
    from agent.archive.export import ExportError
    from agent.archive.reverify import ReverifyError
    from agent.archive.transfer import TransferError

    if args.verb is None:
        args.parser.print_help()
        return 2
    path = args.archive or default_path()
    if args.verb != "import" and not Path(path).exists():
        err_console.print(f"no archive at {path}; run `crucible run TASK` first, or pass --archive PATH")
        return 2
    try:
        archive = Archive(path)
    except Exception as exc:  # noqa: BLE001 - a file the user pointed at: one sentence, no traceback
        err_console.print(f"cannot read the archive {path}: {exc}")
        return 2
    if getattr(args, "task", None):
        from agent.archive.browse import task_arg

        args.task = task_arg(args.task)
    handler = {"list": _list, "show": _show, "diff": _diff, "lineage": _lineage, "tasks": _tasks,
               "export": _export, "import": _import, "reverify": _reverify, "report": _report}[args.verb]
    with archive:
        try:
            return handler(archive, args)
        except (BrowseError, ExportError, ReverifyError, TransferError) as exc:
            err_console.print(str(exc))
            return 2
        except BrokenPipeError:  # the pipe's reader stopped early (`| head`): nothing more to say, and no error
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 0
        except OSError as exc:
            err_console.print(f"cannot write or read {exc.filename}: {exc.strerror}")
            return 2


# ---- browsing -------------------------------------------------------------------------------------------------
def _list(archive: Any, args: argparse.Namespace) -> int:
    from agent.archive.browse import Query, select

    cands = select(archive, Query(task=args.task, verdict=args.verdict, proposer=args.proposer, since=args.since,
                                  until=args.until, sort=args.sort, limit=args.limit))
    if args.json:
        console.print_json(json.dumps([c.summary() for c in cands]))
        return 0
    if not cands:
        console.print("no candidates match")
        return 0
    status = archive.latest_status()
    table = Table("id", "task", "verdict", "proposer", "vs eager [95% CI]", "roofline", "re-check", "created")
    for c in cands:
        t = c.timings
        speed = _short(c.speedup, t.eager_ci_low, t.eager_ci_high) if c.timed else ("not timed" if c.accepted else "")
        verdict = _verdict(c.verdict) + ("" if c.accepted else f" {c.stage or ''} {c.reason}")
        rev = status.get(c.id)
        table.add_row(str(c.id), escape(Path(c.task_path).stem), verdict, escape(c.proposer), speed,
                      "" if t.pct_roofline is None else f"{t.pct_roofline:.0f}%",
                      _status(rev.status) if rev else "", c.created[:16].replace("T", " "))
    console.print(table)
    return 0


def _show(archive: Any, args: argparse.Namespace) -> int:
    from agent.archive.browse import ancestors, env_text, resolve, result_text
    from agent.search.duel import headline

    cand = resolve(archive, args.id)
    revs = archive.reverifications(cand.id)
    duels = archive.duels(candidate_id=cand.id)
    if args.json:
        record = cand.to_dict()
        record["reverifications"] = [r.to_dict() for r in revs]
        record["duels"] = [d.to_dict() for d in duels]
        console.print_json(json.dumps(record, default=str))
        return 0
    line = ancestors(archive, cand)
    kids = archive.children(cand.id)
    info = Table(show_header=False, box=None, padding=(0, 1))
    rows = [("candidate", f"#{cand.id} ({cand.uid})"), ("task", cand.task_path), ("run", cand.run_id or ""),
            ("proposer", escape(f"{cand.proposer} ({cand.origin})")), ("niche", cand.niche or ""),
            ("verdict", f"{_verdict(cand.verdict)} at {cand.stage or '-'} ({cand.reason})"),
            ("message", cand.message), ("result", result_text(cand)), ("environment", env_text(cand.env)),
            ("lineage", " -> ".join([f"#{a.id}" for a in line] + [f"[bold]#{cand.id}[/bold]"])
             + (f" (second parent #{cand.parent2_id})" if cand.parent2_id else "")
             + (f"; children {', '.join(f'#{k.id}' for k in kids)}" if kids else "; no children"))]
    if cand.input_tokens or cand.output_tokens:
        rows.append(("tokens", f"{cand.input_tokens} in, {cand.output_tokens} out"
                               + (f", ${cand.cost_usd:.4f}" if cand.cost_usd is not None else "")))
    for r in revs:
        rows.append(("re-check", f"{_status(r.status)} {r.created}: {r.note}"))
    for d in duels:
        rows.append(("duel", f"{headline(d)} ({d.created}; {d.note})"))
    rows.append(("created", cand.created))
    for k, v in rows:
        info.add_row(k, str(v))
    console.print(info)
    _print_diagnostics(cand.diagnostics or {})
    if cand.source:
        console.print(Syntax(cand.source, "python", line_numbers=True))
    else:
        console.print("(no source: the proposal produced no code)")
    return 0


def _print_diagnostics(diag: dict[str, Any]) -> None:
    stages = diag.get("stages") or []
    if stages:
        table = Table("stage", "result", "seconds", "message", title="harness stages", title_justify="left")
        for s in stages:
            result = "[green]ok[/green]" if s.get("passed") else f"[red]{s.get('reason')}[/red]"
            table.add_row(s.get("stage", ""), result,
                          f"{s.get('seconds') or 0:.2f}", (s.get("message") or "")[:300])
        console.print(table)
    timing = diag.get("timing") or {}
    if timing.get("baselines"):
        table = Table("against", "ms", "speedup (95% CI)", "verdict", title="timing", title_justify="left")
        table.add_row("candidate", _ms(timing.get("candidate_ms")), "", "")
        for name, b in timing["baselines"].items():
            if b.get("ms") is None:
                table.add_row(name, "", "not measured", b.get("reason", ""))
                continue
            table.add_row(name, _ms(b.get("ms")), _speed(b.get("speedup"), b.get("ci_low"), b.get("ci_high")),
                          b.get("verdict", ""))
        console.print(table)
    roof = timing.get("roofline") or {}
    if roof.get("pct_of_roofline") is not None:
        console.print(f"roofline: {roof['pct_of_roofline']:.0f}% ({roof.get('bound')} bound; "
                      f"{roof.get('gbps', 0):.0f} GB/s, {roof.get('tflops', 0):.1f} TFLOP/s)")
    kernels = timing.get("kernels") or []
    if kernels:
        seen = {(k.get("name"), k.get("registers"), k.get("spills"), k.get("num_warps")) for k in kernels}
        console.print("kernels: " + "; ".join(f"{n} ({r} registers, {s} spills, {w} warps)"
                                              for n, r, s, w in sorted(seen, key=str)))


def _diff(archive: Any, args: argparse.Namespace) -> int:
    from agent.archive.browse import diff, label, resolve, result_text

    a, b = resolve(archive, args.a), resolve(archive, args.b)
    for c in (a, b):
        console.print(f"{label(c)}: {result_text(c)}")
    text = diff(a, b)
    if text:
        console.print(Syntax(text, "diff"))
    else:
        console.print("same source")
    return 0


def _lineage(archive: Any, args: argparse.Namespace) -> int:
    from agent.archive.browse import LineageNode, lineage, resolve

    cand = resolve(archive, args.id)
    chain, below = lineage(archive, cand)
    root = tree = None
    for anc in chain:
        branch = Tree(_node_label(anc)) if tree is None else tree.add(_node_label(anc))
        root, tree = root or branch, branch

    def grow(parent: Tree | None, node: LineageNode, mark: bool) -> Tree:
        text = _node_label(node.candidate, second=node.second_parent)
        branch = Tree(f"[reverse]{text}[/reverse]" if mark else text) if parent is None else \
            parent.add(f"[reverse]{text}[/reverse]" if mark else text)
        for child in node.children:
            grow(branch, child, False)
        return branch

    top = grow(tree, below, True)
    console.print(root or top)
    return 0


def _node_label(c: Any, *, second: bool = False) -> str:
    speed = f" {c.speedup:.2f}x" if c.speedup is not None else ""
    cross = f" (crossover, also from #{c.parent_id})" if second else \
        (f" (crossover with #{c.parent2_id})" if c.parent2_id else "")
    return f"#{c.id} {escape(c.proposer)} {_verdict(c.verdict)}{speed}{cross}"


def _tasks(archive: Any, args: argparse.Namespace) -> int:
    from agent.archive.browse import task_summaries

    summaries = task_summaries(archive)
    if args.json:
        console.print_json(json.dumps([
            {"task": s.task, "task_paths": list(s.task_paths), "tried": s.tried, "verified": s.verified,
             "timed": s.timed, "proposals": s.proposals, "best_id": s.best.id if s.best else None,
             "best_speedup": s.best_speedup, "best_pct_roofline": s.best_roofline} for s in summaries]))
        return 0
    table = Table("task", "best", "vs eager [95% CI]", "roofline", "tried", "verified", "timed")
    for s in summaries:
        b = s.best
        speed = "" if b is None else _short(b.speedup, b.timings.eager_ci_low, b.timings.eager_ci_high) \
            if b.timed else "not timed"
        table.add_row(s.task, f"#{b.id}" if b else "none verified", speed,
                      "" if s.best_roofline is None else f"{s.best_roofline:.0f}%", str(s.tried), str(s.verified),
                      str(s.timed))
    console.print(table if summaries else "no candidates")
    return 0


# ---- taking away, bringing in, re-checking --------------------------------------------------------------------
def _export(archive: Any, args: argparse.Namespace) -> int:
    from agent.archive import export, transfer
    from agent.archive.browse import BrowseError, resolve

    if args.id is None:
        if args.output.suffix == ".py":
            raise BrowseError("exporting the whole archive writes JSONL; name a candidate ID to export a .py module")
        counts = transfer.dump_file(archive, args.output, task=args.task)
        console.print(f"wrote {counts['candidate']} candidates, {counts['run']} runs, {counts['reverification']} "
                      f"re-checks, {counts['duel']} duels and {counts['batch']} batches to {args.output}")
        return 0
    if args.output.suffix != ".py":
        raise BrowseError(f"{args.output} does not end in .py; a kernel exports as a Python module")
    cand = resolve(archive, args.id)
    done = export.write(cand, args.output)
    vendored = "; ".join(f"seeds.{m}: {', '.join(n)}" for m, n in done.vendored.items())
    console.print(f"wrote #{cand.id} to {args.output}" + (f" (vendored {vendored})" if vendored else ""))
    return 0


def _import(archive: Any, args: argparse.Namespace) -> int:
    from agent.archive import transfer
    from agent.archive.transfer import TransferError

    for path in args.files:
        if not path.is_file():
            raise TransferError(f"{path}: no such file; give files written by `crucible archive export -o FILE.jsonl`")
    for path in args.files:
        merged = transfer.load_file(archive, path)
        a, s = merged.added, merged.skipped
        console.print(f"{path}: added {a['candidate']} candidates, {a['run']} runs, {a['reverification']} re-checks, "
                      f"{a['duel']} duels, {a['batch']} batches; skipped {sum(s.values())} already here"
                      + (f"; {merged.orphans} parent links to records in neither archive dropped"
                         if merged.orphans else "")
                      + (f"; {merged.unmatched_duels} duels skipped, their challenger or incumbent in neither the "
                         "file nor the archive" if merged.unmatched_duels else ""))
    return 0


def _reverify(archive: Any, args: argparse.Namespace) -> int:
    from agent.archive.reverify import reverify

    def show(o: Any) -> None:
        style = STATUS_STYLE.get(o.record.status, "") if o.record else "dim"
        word = o.record.status if o.record else o.action
        console.print(f"#{o.candidate.id} {Path(o.candidate.task_path).stem}: [{style}]{word}[/{style}] - {o.note}")

    outcomes = reverify(archive, task=args.task, every=args.all, force=args.force, on_outcome=show)
    stale = sum(1 for o in outcomes if o.record and o.record.status == "stale")
    checked = sum(1 for o in outcomes if o.record)
    console.print(f"{checked} re-checked, {stale} stale, {len(outcomes) - checked} not re-checked")
    return 1 if stale else 0


def _report(archive: Any, args: argparse.Namespace) -> int:
    from agent.archive import report
    from agent.archive.browse import BrowseError

    if args.kernelbench or args.json or args.batch:
        return _kernelbench(archive, args)
    if args.output is None:
        raise BrowseError("name the page to write with -o FILE.html, or print a batch's table with --kernelbench")
    out = report.write(archive, args.output, task=args.task)
    console.print(f"wrote {out}")
    return 0


def _kernelbench(archive: Any, args: argparse.Namespace) -> int:
    """A batch's table from the archive alone: as text that a pipe keeps whole, or as JSON."""
    import dataclasses

    from agent.archive import batch_summary, report
    from agent.archive.browse import BrowseError

    batches = archive.batches()
    if args.batch:
        batches = [b for b in batches if b.id.startswith(args.batch)]
        if len(batches) != 1:
            raise BrowseError(f"{'no' if not batches else 'more than one'} batch matches {args.batch!r}; "
                              "`crucible archive report --kernelbench` names the latest one")
    if not batches:
        raise BrowseError("the archive holds no batch; `crucible batch DIR` records one")
    batch, rows, metrics = report.batch_table(archive, batches[-1])
    if args.json:
        print(json.dumps({"batch": dataclasses.asdict(batch), "tasks": rows, "metrics": metrics}, default=str))
        return 0
    plain = Console(emoji=False, highlight=False, soft_wrap=True)  # nothing folded or cut, in a pipe too
    plain.print(f"KernelBench: {batch.folder}", markup=False)
    plain.print(report.batch_title(batch, rows), markup=False)
    plain.print()
    for text in batch_summary.kernelbench_lines(rows, metrics):
        plain.print(text, markup=False)
    others = [b.id for b in archive.batches() if b.id != batch.id]
    if others:
        plain.print(f"{len(others)} other batch(es) in this archive: --batch {others[-1]}"
                    + (" ..." if len(others) > 1 else ""), markup=False)
    return 0


# ---- formatting -----------------------------------------------------------------------------------------------
def _verdict(verdict: str) -> str:
    style = {"accepted": "green", "rejected": "red"}.get(verdict, "yellow")
    return f"[{style}]{verdict}[/{style}]"


def _status(status: str) -> str:
    style = STATUS_STYLE.get(status, "")
    return f"[{style}]{status}[/{style}]"


def _speed(v: float | None, low: float | None, high: float | None) -> str:
    from agent.archive.browse import speed_text

    return speed_text(v, low, high)


def _short(v: float | None, low: float | None, high: float | None) -> str:
    if v is None:
        return "not measured"
    return f"{v:.2f}x" + (f" [{low:.2f}, {high:.2f}]" if low is not None and high is not None else "")


def _ms(v: float | None) -> str:
    return "" if v is None else f"{v:.4f}"
