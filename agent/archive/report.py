"""`crucible archive report -o report.html`: one static page that shows what an archive holds.

Where the archive holds `crucible batch` runs, the page opens with a KernelBench table per batch: each task's
verdict and speedup over eager and torch.compile with their intervals, then fast_0/1/2 against both, the
geometric-mean speedups and tokens and cost per correct kernel, computed from the archived rows by the batch
summary's own `metrics()` (agent/archive/batch_summary.py). `batch_table()` gives the same numbers to the plain-text and
JSON forms of `crucible archive report --kernelbench`.

Per task: the leaderboard of verified kernels, the speedup over proposals (an inline SVG: each timed kernel with its
95% CI, the best so far as a step line, 1.0x marked), the lineage as a nested list, and the winner's code
highlighted with its diff against its parent. Everything is inline (styles, SVG, highlighting by Pygments, which
rich already brings), so the file opens offline and can be mailed or archived as it is.
"""
from __future__ import annotations

import datetime as _dt
import html
from collections import defaultdict
from pathlib import Path

from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import DiffLexer, PythonLexer

from agent.archive import batch_summary
from agent.archive.records import Batch, Candidate, Reverification
from agent.archive.store import Archive
from agent.archive.browse import (TaskSummary, diff, env_text, speed_text, task_name, task_summaries, uncrowned,
                          winners)

LEADERBOARD_ROWS = 10
LINEAGE_LIMIT = 300  # past this many candidates a task shows only its winner's ancestry
CSS = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #1d232a; padding: 0 1em; }
h1 { font-size: 1.6em; } h2 { margin-top: 2.2em; border-bottom: 2px solid #d0d7de; padding-bottom: .2em; }
table { border-collapse: collapse; margin: .6em 0; } th, td { padding: .25em .7em; border-bottom: 1px solid #e4e8ec; }
th { text-align: left; background: #f3f5f7; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
.ok { color: #116329; } .bad { color: #b42318; } .warn { color: #9a6700; } .muted { color: #5f6b76; }
.code { border: 1px solid #d0d7de; border-radius: 6px; overflow-x: auto; max-height: 640px; }
.code pre { margin: 0; padding: .8em; font: 12.5px/1.4 ui-monospace, monospace; }
ul.tree, ul.tree ul { list-style: none; padding-left: 1.3em; border-left: 1px dotted #aab4be; margin: 0; }
ul.tree { border-left: none; padding-left: 0; } li.win > span { font-weight: 600; background: #fff4c2; }
svg text { font: 11px system-ui, sans-serif; fill: #3d4852; }
"""


def render(archive: Archive, *, task: str | None = None, title: str = "crucible archive report") -> str:
    summaries = task_summaries(archive, task)
    status = archive.latest_status()
    stamp = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    parts = [f"<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'><title>{_e(title)}</title>"
             f"<style>{CSS}</style></head><body>",
             f"<h1>{_e(title)}</h1><p class='muted'>{_e(archive.path)} &middot; {len(summaries)} task(s) &middot; "
             f"written {stamp}</p>"]
    if task is None:
        parts += [_batch_section(*batch_table(archive, b)) for b in archive.batches()]
    parts.append(_overview(summaries))
    for summary in summaries:
        parts.append(_task_section(archive, summary, status))
    if not summaries:
        parts.append("<p>The archive holds no candidates yet.</p>")
    parts.append("</body></html>\n")
    return "\n".join(parts)


def write(archive: Archive, out: Path, *, task: str | None = None) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render(archive, task=task), encoding="utf-8")
    return out


def batch_table(archive: Archive, batch: Batch) -> tuple[Batch, list[dict], dict]:
    """A batch, its task rows in the folder's order and the metrics over them, from the archive alone."""
    rows = archive.batch_rows(batch.id)
    return batch, rows, batch_summary.metrics(rows)


def batch_title(batch: Batch, rows: list[dict]) -> str:
    config = batch.config
    how = (f"model {config['model']}" if config.get("model") else
           f"from {config['from']}" if config.get("from") else
           "references only" if config.get("reference_only") else "seeds and references")
    budget = f", budget {config['budget']}" if config.get("budget") is not None else ""
    state = "finished " + batch.finished if batch.finished else "not finished"
    return f"batch {batch.id}: {len(rows)} tasks on {batch.device}\n{how}{budget}\nstarted {batch.started}, {state}"


# ---- sections -------------------------------------------------------------------------------------------------
def _batch_section(batch: Batch, rows: list[dict], m: dict) -> str:
    body = []
    for r in rows:
        ok = "<span class='ok'>yes</span>" if r.get("correct") else "<span class='bad'>no</span>"
        tokens = f"{r['tokens']:,}" if r.get("tokens") else ""
        cost = f"${r['cost_usd']:.4f}" if r.get("cost_usd") else ""
        body.append(f"<tr><td>{_e(Path(str(r['task'])).stem)}</td><td>{ok}</td>"
                    f"<td>{_e(batch_summary.kb_cell(r, 'eager'))}</td><td>{_e(batch_summary.kb_cell(r, 'compile'))}"
                    f"</td><td class='num'>{tokens}</td><td class='num'>{cost}</td>"
                    f"<td class='muted'>{_e(r.get('note') or '')}</td></tr>")
    fast = []
    for base in batch_summary.BASELINES:
        cells = "".join(f"<td class='num'>{_pct(m[f'fast_{p}_{base}'])}</td>" for p in batch_summary.FAST_P)
        geo = m[f"geomean_{base}"]
        fast.append(f"<tr><td>vs {base}</td>{cells}<td class='num'>{'' if geo is None else f'{geo:.2f}x'}</td>"
                    f"<td class='num'>{m[f'timed_vs_{base}']}</td></tr>")
    per = m["tokens_per_correct"]
    cost = m["cost_per_correct"]
    spend = (f"{m['tokens']:,} tokens" + (f", {per:,.0f} per correct kernel" if per else "")
             + (f"; ${cost:.4f} per correct kernel" if cost is not None else ""))
    return (f"<section class='kernelbench' id='{_e(batch.id)}'><h2>KernelBench: {_e(batch.folder)}</h2>"
            f"<p class='muted'>{_e(batch_title(batch, rows))}</p>"
            "<table class='kb-tasks'><tr><th>task</th><th>correct</th><th>vs eager [95% CI]</th>"
            "<th>vs torch.compile [95% CI]</th><th>tokens</th><th>cost</th><th>note</th></tr>" + "".join(body)
            + "</table><table class='kb-metrics'><tr><th></th><th>fast_0</th><th>fast_1</th><th>fast_2</th>"
            "<th>geomean</th><th>timed</th></tr>" + "".join(fast) + "</table>"
            f"<p>{m['correct']} of {m['tasks']} tasks correct; {_e(spend)}. fast_p counts all the batch's tasks; "
            "empty cells were not measured (nothing timed against that baseline).</p></section>")


def _pct(value: float | None) -> str:
    return "" if value is None else f"{100 * value:.0f}%"


def _overview(summaries: list[TaskSummary]) -> str:
    rows = []
    for s in summaries:
        best = s.best
        speed = speed_text(best.speedup, best.timings.eager_ci_low, best.timings.eager_ci_high) \
            if best is not None and best.timed else ("verified, not timed" if best is not None else "none verified")
        roof = f"{s.best_roofline:.0f}%" if s.best_roofline is not None else ""
        rows.append(f"<tr><td><a href='#task-{_e(s.task)}'>{_e(s.task)}</a></td><td>{_e(speed)}</td>"
                    f"<td class='num'>{roof}</td><td class='num'>{s.tried}</td><td class='num'>{s.verified}</td>"
                    f"<td class='num'>{s.timed}</td></tr>")
    return ("<table id='overview'><tr><th>task</th><th>best vs eager</th><th>% roofline</th><th>tried</th>"
            "<th>verified</th><th>timed</th></tr>" + "".join(rows) + "</table>")


def _task_section(archive: Archive, s: TaskSummary, status: dict[int, Reverification]) -> str:
    cands = [c for c in archive.candidates(task=s.task + ".py") if task_name(c) == s.task]
    out = [f"<section class='task' id='task-{_e(s.task)}'><h2>{_e(s.task)}</h2>",
           f"<p class='muted'>{s.tried} tried ({s.proposals} proposals, seeds excluded), {s.verified} verified, "
           f"{s.timed} timed on a GPU. Task file: {_e(', '.join(s.task_paths))}</p>",
           "<h3>Leaderboard</h3>", _leaderboard(winners(cands, uncrowned(archive, cands)), status),
           "<h3>Speedup over proposals</h3>", plot(cands),
           "<h3>Lineage</h3>", _lineage(cands, s.best)]
    if s.best is not None:
        out += ["<h3>Winner's code</h3>", _winner(archive, s.best)]
    out.append("</section>")
    return "\n".join(out)


def _leaderboard(ranked: list[Candidate], status: dict[int, Reverification]) -> str:
    if not ranked:
        return "<p>No kernel was verified for this task.</p>"
    rows = []
    for rank, c in enumerate(ranked[:LEADERBOARD_ROWS], start=1):
        t = c.timings
        rev = status.get(c.id)
        state = "" if rev is None else f"<span class='{'ok' if rev.status == 'confirmed' else 'bad'}' " \
                                       f"title='{_e(rev.note)}'>{rev.status}</span>"
        rows.append(
            f"<tr><td class='num'>{rank}</td><td>#{c.id} <span class='muted'>{c.uid[:8]}</span></td>"
            f"<td>{_e(c.proposer)} ({c.origin})</td>"
            f"<td>{_e(speed_text(t.speedup_eager, t.eager_ci_low, t.eager_ci_high) if c.timed else 'not timed')}</td>"
            f"<td>{_e(speed_text(t.speedup_compile, t.compile_ci_low, t.compile_ci_high) if c.timed else '')}</td>"
            f"<td class='num'>{'' if t.candidate_ms is None else f'{t.candidate_ms:.4f}'}</td>"
            f"<td class='num'>{'' if t.pct_roofline is None else f'{t.pct_roofline:.0f}%'}</td>"
            f"<td>{state}</td><td class='muted'>{_e(env_text(c.env))}</td></tr>")
    more = f"<p class='muted'>and {len(ranked) - LEADERBOARD_ROWS} more verified.</p>" \
        if len(ranked) > LEADERBOARD_ROWS else ""
    return ("<table class='leaderboard'><tr><th>#</th><th>candidate</th><th>proposer</th><th>vs eager</th>"
            "<th>vs torch.compile</th><th>ms</th><th>roofline</th><th>re-check</th><th>environment</th></tr>"
            + "".join(rows) + "</table>" + more)


def plot(cands: list[Candidate], *, width: int = 720, height: int = 280) -> str:
    """Speedup vs eager of each timed verified kernel, by proposal number, with its CI and the best so far."""
    points = [(n, c) for n, c in enumerate(cands, start=1) if c.accepted and c.speedup is not None]
    if not points:
        return ("<p class='no-plot'>Nothing was timed for this task (checked on the CPU: correctness only), so there "
                "is no speedup to plot.</p>")
    left, right, top, bottom = 56, 16, 14, 40
    values = [v for _, c in points for v in (c.speedup, c.timings.eager_ci_low, c.timings.eager_ci_high)
              if v is not None] + [1.0]
    lo, hi = min(values), max(values)
    pad = max(0.05, (hi - lo) * 0.12)
    lo, hi = max(0.0, lo - pad), hi + pad
    n_max = len(cands)

    def x(n: float) -> float:  # half a proposal of margin each side, so the first and last points show whole
        return left + (n - 0.5) / n_max * (width - left - right)

    def y(v: float) -> float:
        return top + (hi - v) / (hi - lo) * (height - top - bottom)

    svg = [f"<svg class='speedup-plot' xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}' "
           f"viewBox='0 0 {width} {height}' role='img' aria-label='speedup over proposals'>",
           f"<rect x='{left}' y='{top}' width='{width - left - right}' height='{height - top - bottom}' "
           "fill='#fbfcfd' stroke='#d0d7de'/>"]
    for tick in _ticks(lo, hi):
        svg.append(f"<line x1='{left}' x2='{width - right}' y1='{y(tick):.1f}' y2='{y(tick):.1f}' stroke='#eef1f4'/>"
                   f"<text x='{left - 6}' y='{y(tick) + 4:.1f}' text-anchor='end'>{tick:.2f}x</text>")
    svg.append(f"<line x1='{left}' x2='{width - right}' y1='{y(1.0):.1f}' y2='{y(1.0):.1f}' stroke='#8c959f' "
               "stroke-dasharray='5 4'/>"
               f"<text x='{width - right - 4}' y='{y(1.0) - 4:.1f}' text-anchor='end'>eager (1.0x)</text>")
    every = max(1, -(-n_max // 12))
    for n in range(1, n_max + 1, every):
        svg.append(f"<text x='{x(n):.1f}' y='{height - bottom + 17}' text-anchor='middle'>{n}</text>")
    for n, c in enumerate(cands, start=1):  # every proposal gets a tick on the axis: red when rejected
        color = "#116329" if c.accepted else "#b42318" if c.verdict == "rejected" else "#9a6700"
        svg.append(f"<line x1='{x(n):.1f}' x2='{x(n):.1f}' y1='{height - bottom}' y2='{height - bottom + 5}' "
                   f"stroke='{color}'><title>#{c.id} {c.verdict} {c.reason}</title></line>")
    best, steps = None, []
    for n, c in points:
        best = c.speedup if best is None else max(best, c.speedup)
        steps.append((x(n), y(best)))
    path = f"M{steps[0][0]:.1f},{steps[0][1]:.1f}" + "".join(f" H{sx:.1f} V{sy:.1f}" for sx, sy in steps[1:])
    svg.append(f"<path class='best-so-far' d='{path} H{x(n_max + 0.5):.1f}' fill='none' stroke='#0969da' "
               "stroke-width='2'/>")
    for n, c in points:
        t = c.timings
        if t.eager_ci_low is not None and t.eager_ci_high is not None:
            svg.append(f"<line x1='{x(n):.1f}' x2='{x(n):.1f}' y1='{y(t.eager_ci_low):.1f}' "
                       f"y2='{y(t.eager_ci_high):.1f}' stroke='#57606a' stroke-width='1.5'/>")
        svg.append(f"<circle class='point' cx='{x(n):.1f}' cy='{y(c.speedup):.1f}' r='4.5' fill='#0969da' "
                   f"stroke='white'><title>#{c.id} {_e(c.proposer)}: "
                   f"{_e(speed_text(c.speedup, t.eager_ci_low, t.eager_ci_high))}</title></circle>")
    svg.append(f"<text x='{(left + width - right) / 2:.0f}' y='{height - 8}' text-anchor='middle'>proposal "
               f"(1-{len(cands)}, archive order; ticks: green verified, red rejected)</text>"
               f"<text x='14' y='{(top + height - bottom) / 2:.0f}' text-anchor='middle' "
               f"transform='rotate(-90 14 {(top + height - bottom) / 2:.0f})'>speedup vs eager</text></svg>")
    return "".join(svg)


def _ticks(lo: float, hi: float) -> list[float]:
    step = next(s for s in (0.02, 0.05, 0.1, 0.2, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0) if (hi - lo) / s <= 8)
    first = int(lo / step + 0.999) * step
    return [first + i * step for i in range(int((hi - first) / step) + 1)]


def _lineage(cands: list[Candidate], best: Candidate | None) -> str:
    by_id = {c.id: c for c in cands}
    kids: dict[int | None, list[Candidate]] = defaultdict(list)
    for c in cands:
        kids[c.parent_id if c.parent_id in by_id else None].append(c)
    keep: set[int] | None = None
    if len(cands) > LINEAGE_LIMIT and best is not None:
        keep, cur = set(), best
        while cur is not None and cur.id not in keep:
            keep.add(cur.id)
            cur = by_id.get(cur.parent_id) if cur.parent_id else None

    def node(c: Candidate, depth: int) -> str:
        cls = "ok" if c.accepted else "bad" if c.verdict == "rejected" else "warn"
        speed = f" {c.speedup:.2f}x" if c.speedup is not None else ""
        cross = f" &times; #{c.parent2_id}" if c.parent2_id else ""
        sub = [k for k in kids.get(c.id, []) if keep is None or k.id in keep] if depth < 60 else []
        inner = "<ul>" + "".join(node(k, depth + 1) for k in sub) + "</ul>" if sub else ""
        win = " class='win'" if best is not None and c.id == best.id else ""
        return (f"<li{win}><span>#{c.id} {_e(c.proposer)} <span class='{cls}'>{c.verdict}</span>{speed}"
                f"{cross}</span>{inner}</li>")

    roots = [c for c in kids[None] if keep is None or c.id in keep]
    note = "" if keep is None else f"<p class='muted'>{len(cands)} candidates: only the winner's ancestry shown.</p>"
    return note + "<ul class='tree'>" + "".join(node(c, 0) for c in roots) + "</ul>"


def _winner(archive: Archive, best: Candidate) -> str:
    best = archive.with_source(best)
    t = best.timings
    head = (f"<p>#{best.id} ({best.uid}) by {_e(best.proposer)}: "
            f"{_e(speed_text(t.speedup_eager, t.eager_ci_low, t.eager_ci_high) if best.timed else 'not timed')}"
            f"; {_e(env_text(best.env))}</p>")
    code = "<div class='code winner-code'>" + highlight(best.source or "", PythonLexer(),
                                                          HtmlFormatter(noclasses=True)) + "</div>"
    parent = archive.get(best.parent_id) if best.parent_id else None
    if parent is None:
        return head + code + "<p class='muted'>No parent: it was a seed or written from the reference.</p>"
    changed = diff(parent, best)
    diff_html = "<div class='code winner-diff'>" + highlight(changed, DiffLexer(), HtmlFormatter(noclasses=True)) \
        + "</div>" if changed else "<p class='muted'>Same source as its parent.</p>"
    return head + code + f"<h4>Diff against its parent #{parent.id}</h4>" + diff_html


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)
