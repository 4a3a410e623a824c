"""The summary of a `crucible batch`: one row per task and, over the folder, the metrics KernelBench users compare.

Per task: whether a verified (correct) kernel was found, its speedup over eager PyTorch and over torch.compile with
their 95% intervals, the tokens and cost the search spent. Over the folder, as KernelBench defines them: fast_p is
the fraction of ALL the folder's tasks whose kernel is correct and more than p times faster than the baseline
(fast_0 is the fraction correct), for p = 0, 1, 2, against eager and against torch.compile; the geometric mean of
the speedups of the correct kernels that were timed; tokens and cost per correct kernel. Where nothing was timed
(the CPU) the speedup metrics are None ("not measured"), never 0.

The text output fits 80 columns and survives a pipe: on a terminal a table whose task column folds; otherwise one
line per task (name first, long names on their own line) and every path whole, on its own line. The archive keeps
each batch's rows (agent/commands/batch.py), and `crucible archive report` rebuilds the same metrics from them with
`metrics()` here and prints them as `kernelbench_lines()`: one implementation for the batch and the report.
"""
from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

FAST_P = (0, 1, 2)
BASELINES = ("eager", "compile")
CSV_FIELDS = ["task", "status", "correct", "run_id", "proposals", "accepted", "rejected", "timed", "best_id",
              "speedup_eager", "eager_ci_low", "eager_ci_high", "speedup_compile", "compile_ci_low",
              "compile_ci_high", "pct_roofline", "final_check", "tokens", "cost_usd", "eager_ms", "compile_ms",
              "start_from", "best_path", "note"]


def empty_row(task: Path, status: str, note: str = "") -> dict[str, Any]:
    row: dict[str, Any] = {k: None for k in CSV_FIELDS}
    row.update(task=str(task), status=status, correct=False, note=note)
    return row


def metrics(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """KernelBench's fast_p against eager and torch.compile, geometric-mean speedups, tokens and cost per correct."""
    n = len(rows)
    correct = [r for r in rows if r.get("correct")]
    out: dict[str, Any] = {"tasks": n, "correct": len(correct), "timed": sum(bool(r.get("timed")) for r in correct)}
    for base in BASELINES:
        speedups = [r[f"speedup_{base}"] for r in correct if r.get(f"speedup_{base}") is not None]
        for p in FAST_P:
            if p == 0:
                value: float | None = len(correct) / n if n else None
            else:  # a kernel not timed against this baseline cannot count as faster: no number rather than 0
                value = sum(s > p for s in speedups) / n if speedups and n else None
            out[f"fast_{p}_{base}"] = value
        out[f"geomean_{base}"] = math.exp(sum(math.log(s) for s in speedups) / len(speedups)) if speedups else None
        out[f"timed_vs_{base}"] = len(speedups)
    tokens = sum(int(r.get("tokens") or 0) for r in rows)
    cost = sum(float(r.get("cost_usd") or 0.0) for r in rows)
    out["tokens"] = tokens
    out["cost_usd"] = cost
    out["tokens_per_correct"] = tokens / len(correct) if correct else None
    out["cost_per_correct"] = cost / len(correct) if correct and cost else None
    return out


def write_json(path: Path, rows: list[dict[str, Any]], summary: dict[str, Any], batch_id: str | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    head = {"batch": batch_id} if batch_id else {}
    path.write_text(json.dumps({**head, "tasks": rows, "metrics": summary}, indent=2) + "\n", encoding="utf-8")


def write_csv(path: Path, rows: list[dict[str, Any]], summary: dict[str, Any]) -> None:
    """One line per task, then one line per folder metric (task column "ALL", the metric's name in status)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=CSV_FIELDS)
        writer.writeheader()
        writer.writerows({k: r.get(k) for k in CSV_FIELDS} for r in rows)
        for name, value in summary.items():
            writer.writerow({"task": "ALL", "status": name, "note": "" if value is None else value})


def speedup_text(row: dict[str, Any], base: str) -> str:
    if not row.get("correct"):
        return "-"
    v = row.get(f"speedup_{base}")
    if v is None:
        return "not timed" if not row.get("timed") else "not measured"
    lo, hi = row.get(f"{base}_ci_low"), row.get(f"{base}_ci_high")
    return f"{v:.2f}x" + (f" [{lo:.2f},{hi:.2f}]" if lo is not None and hi is not None else "")


def _best(row: dict[str, Any]) -> str:
    if row.get("best_id") is None:
        return "none"
    return f"#{row['best_id']}" + (f" ({row['final_check']})" if row.get("final_check") else "")


def _fmt(value: float | None, pct: bool = False) -> str:
    if value is None:
        return "not measured"
    return f"{100 * value:.0f}%" if pct else f"{value:.2f}x"


def metric_lines(summary: dict[str, Any]) -> list[str]:
    n, c = summary["tasks"], summary["correct"]
    lines = [f"correct: {c} of {n} (fast_0 {_fmt(summary['fast_0_eager'], True)})"]
    for base in BASELINES:
        lines.append(f"vs {base}: fast_1 {_fmt(summary[f'fast_1_{base}'], True)}, fast_2 "
                     f"{_fmt(summary[f'fast_2_{base}'], True)}, geomean {_fmt(summary[f'geomean_{base}'])} "
                     f"over {summary[f'timed_vs_{base}']} timed")
    if summary["tokens"]:
        per = summary["tokens_per_correct"]
        cost = summary["cost_per_correct"]
        lines.append(f"tokens: {summary['tokens']:,}" + (f", {per:,.0f} per correct kernel" if per else "")
                     + (f", ${cost:.4f} per correct kernel" if cost else ""))
    return lines


def render(console: Console, rows: list[dict[str, Any]], summary: dict[str, Any], *, reference_only: bool) -> None:
    """The table on a terminal, plain lines elsewhere (module docstring); then the folder's metrics and paths."""
    if reference_only:
        _render_references(console, rows)
    elif console.is_terminal:
        table = Table("task", "status", "best", "vs eager", "vs compile", show_lines=False)
        table.columns[0].overflow = "fold"
        for r in rows:
            table.add_row(Path(r["task"]).name, r["status"], _best(r), speedup_text(r, "eager"),
                          speedup_text(r, "compile"))
        console.print(table)
    else:
        for r in rows:
            line(console, Path(r["task"]).name, f"{r['status']}  best {_best(r)}  eager {speedup_text(r, 'eager')}"
                  f"  compile {speedup_text(r, 'compile')}")
    if not reference_only:
        for text in metric_lines(summary):
            console.print(text, markup=False, highlight=False, soft_wrap=True)
    for r in rows:
        if r.get("note") and r["status"] != "done":
            console.print(f"{Path(r['task']).name}: {r['note']}", markup=False, highlight=False, soft_wrap=True)
    for r in rows:
        if r.get("best_path"):
            console.print(f"best of {Path(r['task']).name}:", markup=False, highlight=False)
            console.print(f"  {r['best_path']}", markup=False, highlight=False, soft_wrap=True)


def _render_references(console: Console, rows: list[dict[str, Any]]) -> None:
    for r in rows:
        detail = r["status"]
        if r.get("eager_ms") is not None:
            detail += f"  eager {r['eager_ms']:.4f} ms"
            if r.get("compile_ms") is not None:
                detail += f"  compile {r['compile_ms']:.4f} ms"
        line(console, Path(r["task"]).name, detail)
    usable = sum(r["status"] == "usable" for r in rows)
    console.print(f"{usable} of {len(rows)} tasks usable", markup=False, highlight=False)


def line(console: Console, name: str, detail: str, width: int = 80) -> None:
    """`name  detail` on one line where it fits `width`, else the name alone and the detail indented below."""
    text = f"{name}  {detail}"
    if len(text) <= width:
        console.print(text, markup=False, highlight=False, soft_wrap=True)
    else:
        console.print(name, markup=False, highlight=False, soft_wrap=True)
        console.print(f"    {detail}", markup=False, highlight=False, soft_wrap=True)


# ---- the KernelBench table, as `crucible archive report --kernelbench` prints it ----------------------------------
KB_WIDTH = 80
SPEED_COL = 20  # "12.34x [12.10,12.60]"
RESULT_COL = 7  # "correct" / "no"


def kb_cell(row: dict[str, Any], base: str) -> str:
    """A task's speedup over `base` with its interval; for a task without a correct kernel, why not."""
    if not row.get("correct") and row.get("status") not in ("done", "usable"):
        return str(row.get("status") or "-")
    return speedup_text(row, base)


def kernelbench_lines(rows: list[dict[str, Any]], summary: dict[str, Any], width: int = KB_WIDTH) -> list[str]:
    """The per-task table and the folder's metrics as plain lines of at most `width` columns. A task name too long
    for its column goes on a line of its own, its numbers on the next; nothing is cut."""
    name_col = width - RESULT_COL - 2 * SPEED_COL - 3 * 2
    lines = [f"{'task':<{name_col}}  {'correct':<{RESULT_COL}}  {'vs eager [95% CI]':<{SPEED_COL}}  "
             f"{'vs compile [95% CI]'}".rstrip()]
    for r in rows:
        name = Path(str(r["task"])).stem
        cells = (f"{'yes' if r.get('correct') else 'no':<{RESULT_COL}}  {kb_cell(r, 'eager'):<{SPEED_COL}}  "
                 f"{kb_cell(r, 'compile')}").rstrip()
        if len(name) > name_col or len(cells) > width - name_col - 2:
            lines.append(name)
            name = ""
        lines.append(f"{name:<{name_col}}  {cells}")
    lines.append("")
    lines.append(f"{'fast_p':<{name_col}}  {'p=0':>5}  {'p=1':>5}  {'p=2':>5}")
    for base in BASELINES:
        cells = "  ".join(f"{_pct(summary.get(f'fast_{p}_{base}')):>5}" for p in FAST_P)
        lines.append(f"{'vs ' + base:<{name_col}}  {cells}")
    if any(summary.get(f"fast_{p}_{base}") is None for p in FAST_P for base in BASELINES):
        lines.append("(-: not measured, no correct kernel was timed against that baseline)")
    lines.append(f"correct: {summary['correct']} of {summary['tasks']} tasks, {summary['timed']} timed")
    for base in BASELINES:
        lines.append(f"geomean speedup vs {base}: {_fmt(summary.get(f'geomean_{base}'))} over "
                     f"{summary.get(f'timed_vs_{base}', 0)} timed")
    per = summary.get("tokens_per_correct")
    cost = summary.get("cost_per_correct")
    lines.append(f"tokens: {summary.get('tokens') or 0:,}"
                 + (f", {per:,.0f} per correct kernel" if per else "")
                 + (f"; ${cost:.4f} per correct kernel" if cost is not None else ""))
    return lines


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.0f}%"
