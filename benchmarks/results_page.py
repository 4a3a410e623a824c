"""Write docs/results.md, the current-results page, from benchmarks/data/results.csv.

The CSV is append-only: a measurement is the set of lines that share a row, date, commit and source, and the last
measurement of a row in the file is its current one. The page has one summary line per implementation of each row's
current measurement (against the strongest baseline it was compared with), a detail table per row, each row's
history, the suite rows not measured yet, and two plots written here as SVG (no plotting library):
docs/results-speedup.svg and docs/results-roofline.svg.

    python3 benchmarks/results_page.py [--csv benchmarks/data/results.csv] [--out docs/results.md]
"""
from __future__ import annotations

import argparse
import csv
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from xml.sax.saxutils import escape

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.suite import FIELDS, RESULTS, SUITE  # noqa: E402

BASELINES = ("eager", "compile", "liger", "vendor")
BASELINE_NAMES = {"eager": "eager", "compile": "torch.compile", "liger": "Liger", "vendor": "vendor"}


@dataclass
class Impl:
    """One implementation in one measurement: its own numbers and its comparisons (baseline -> CSV line)."""
    name: str
    line: dict[str, str]
    vs: dict[str, dict[str, str]] = field(default_factory=dict)

    @property
    def is_baseline(self) -> bool:
        return self.name in BASELINES

    def best(self) -> tuple[str, dict[str, str]] | None:
        """The comparison with the strongest baseline: the lowest speedup among those measured."""
        known = [(b, c) for b, c in self.vs.items() if _num(c["speedup"]) is not None]
        return min(known, key=lambda bc: _num(bc[1]["speedup"])) if known else None


@dataclass
class Measurement:
    row: str
    date: str
    commit: str
    source: str
    impls: dict[str, Impl] = field(default_factory=dict)

    @property
    def first(self) -> dict[str, str]:
        return next(iter(self.impls.values())).line

    def subjects(self) -> list[Impl]:
        """The implementations measured against the baselines (the seed, named candidates)."""
        return [i for i in self.impls.values() if not i.is_baseline]

    def headline(self) -> Impl | None:
        """The seed where it has a number, else the first other subject that has one."""
        subs = [i for i in self.subjects() if i.line["status"] != "rejected"]
        seed = [i for i in subs if i.name == "seed"]
        return (seed or subs or [None])[0]


def _num(text: str | None) -> float | None:
    try:
        return float(text) if text not in (None, "") else None
    except ValueError:
        return None


def read(path: Path) -> list[Measurement]:
    """The measurements in file order; ValueError with one sentence for a file that is not the suite's CSV."""
    with path.open(newline="") as fh:
        reader = csv.DictReader(fh)
        if reader.fieldnames != FIELDS:
            raise ValueError(f"{path} does not have the suite's columns ({', '.join(FIELDS)})")
        lines = list(reader)
    out: dict[tuple[str, str, str, str], Measurement] = {}
    for ln in lines:
        key = (ln["row"], ln["date"], ln["commit"], ln["source"])
        m = out.setdefault(key, Measurement(*key))
        impl = m.impls.setdefault(ln["impl"], Impl(ln["impl"], ln))
        if ln["vs"]:
            impl.vs[ln["vs"]] = ln
    return list(out.values())


def current(measurements: list[Measurement]) -> dict[str, Measurement]:
    """The last measurement of each row."""
    latest: dict[str, Measurement] = {}
    for m in measurements:
        latest[m.row] = m
    return latest


def row_order(rows: set[str]) -> list[str]:
    """The suite's order, then rows the suite no longer has (alphabetically)."""
    names = [b.name for b in SUITE]
    return [n for n in names if n in rows] + sorted(rows - set(names))


# ----------------------------------------------------------------------------------------------------------- text
def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _short(text: str, places: int) -> str:
    """A number as written where it has at most `places` decimals (a transcribed value keeps its precision), else
    rounded to `places`."""
    v = _num(text)
    if v is None:
        return ""
    if "." in text and len(text.split(".")[1]) > places:
        return f"{v:,.{places}f}"
    return f"{v:,.{len(text.split('.')[1])}f}" if "." in text else f"{v:,.0f}"


def _rate(line: dict[str, str]) -> str:
    if _num(line["tflops"]) is not None:
        return f"{_short(line['tflops'], 1)} TFLOP/s"
    if _num(line["gbps"]) is not None:
        return f"{_short(line['gbps'], 0)} GB/s"
    return ""


def _ms(line: dict[str, str]) -> str:
    return _short(line["ms"], 4)


def _pct(line: dict[str, str]) -> str:
    v = _short(line["pct_of_roofline"], 1)
    return f"{v}%" if v else ""


def _speedup(c: dict[str, str] | None) -> str:
    if not c or _num(c["speedup"]) is None:
        return ""
    text = f"{_short(c['speedup'], 3)}×"
    if _num(c["ci_low"]) is not None and _num(c["ci_high"]) is not None:
        text += f" [{_short(c['ci_low'], 3)}, {_short(c['ci_high'], 3)}]"
    if c["verdict"] == "no significant difference":
        text += " n.s."
    elif c["verdict"] == "slower":
        text += " slower"
    return text


def _env(line: dict[str, str]) -> str:
    parts = [line["gpu"]]
    for key, label in (("driver", "driver"), ("cuda", "CUDA"), ("torch", "torch"), ("triton", "Triton"),
                       ("liger", "Liger")):
        if line[key]:
            parts.append(f"{label} {line[key]}")
    return ", ".join(p for p in parts if p)


def summary_table(latest: dict[str, Measurement]) -> list[str]:
    out = ["| row | implementation | ms | rate | % of roofline | vs the strongest baseline | date | commit |",
           "|---|---|---|---|---|---|---|---|"]
    for row in row_order(set(latest)):
        m = latest[row]
        for impl in m.subjects() or list(m.impls.values()):
            best = impl.best()
            vs = f"{_speedup(best[1])} vs {BASELINE_NAMES.get(best[0], best[0])}" if best else ""
            if impl.line["status"] == "rejected":
                vs = f"rejected: {impl.line['note']}"
            out.append(f"| [{row}](#{row}) | {_cell(impl.name)} | {_ms(impl.line)} | {_rate(impl.line)} | "
                       f"{_pct(impl.line)} | {_cell(vs)} | {m.date} | {m.commit} |")
    return out


def detail(m: Measurement) -> list[str]:
    baselines = [b for b in BASELINES if any(b in i.vs for i in m.impls.values())]
    head = ["implementation", "ms", "IQR ms", "GB/s", "TFLOP/s", "% of roofline"]
    head += [f"vs {BASELINE_NAMES[b]}" for b in baselines] + ["note"]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for impl in m.impls.values():
        ln = impl.line
        cells = [impl.name, _ms(ln), _short(ln["iqr_ms"], 4), _short(ln["gbps"], 0), _short(ln["tflops"], 1), _pct(ln)]
        cells += [_speedup(impl.vs.get(b)) for b in baselines]
        note = ln["note"] if ln["status"] not in ("rejected",) else f"rejected: {ln['note']}"
        cells.append(note)
        out.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return out


def history(ms: list[Measurement]) -> list[str]:
    out = ["| date | commit | implementation | ms | rate | vs the strongest baseline | source |",
           "|---|---|---|---|---|---|---|"]
    for m in ms:
        for impl in m.subjects() or list(m.impls.values()):  # a measurement of the baselines alone shows them
            best = impl.best()
            vs = f"{_speedup(best[1])} vs {BASELINE_NAMES.get(best[0], best[0])}" if best else ""
            if impl.line["status"] == "rejected":
                vs = "rejected"
            out.append(f"| {m.date} | {m.commit} | {_cell(impl.name)} | {_ms(impl.line)} | {_rate(impl.line)} | "
                       f"{_cell(vs)} | {_cell(m.source)} |")
    return out


def page(measurements: list[Measurement], csv_name: str, svgs: list[str]) -> str:
    latest = current(measurements)
    by_row: dict[str, list[Measurement]] = {}
    for m in measurements:
        by_row.setdefault(m.row, []).append(m)
    lines = [
        "# Current results",
        "",
        f"Written by `python3 benchmarks/results_page.py` from [{csv_name}](../{csv_name}); do not edit by hand. "
        "Each row is one entry of the benchmark suite (`python3 benchmarks/suite.py --list`); its current "
        "measurement is the last one in the CSV, and `python3 benchmarks/suite.py --only ROW` measures it again "
        "(on a CUDA GPU) and appends the result. [BENCHMARKS.md](BENCHMARKS.md) says how a measurement is made.",
        "",
        "Speedup = the baseline's time / this time, the median of paired rounds, with its 95% bootstrap interval; "
        "\"n.s.\": no significant difference. Rates count the task's minimum bytes or FLOPs. Lines whose source "
        "names docs/BENCHMARKS.md were transcribed from that document at the commit given (git keeps it); a cell "
        "is empty where it gave no value.",
        "",
        "## Summary",
        "",
        *summary_table(latest),
        "",
    ]
    for svg in svgs:
        lines += [f"![{svg}]({svg})", ""]
    lines += ["## Rows", ""]
    for row in row_order(set(latest)):
        m = latest[row]
        bench = next((b for b in SUITE if b.name == row), None)
        lines += [f"### {row}", ""]
        what = f"`{bench.command()}`" if bench else f"task {m.first['task']} (no longer a suite row)"
        lines += [f"{what}; {m.date}, commit {m.commit}, {_env(m.first)}"
                  + (f", timing {m.first['timing_mode']}" if m.first["timing_mode"] else "")
                  + (f"; {bench.note}" if bench and bench.note else "") + f". Source: {m.source}.", ""]
        lines += detail(m) + [""]
        if len(by_row[row]) > 1:
            lines += ["<details><summary>earlier measurements</summary>", "", *history(by_row[row][:-1]), "",
                      "</details>", ""]
    missing = [b for b in SUITE if b.name not in latest]
    if missing:
        lines += ["## Not measured yet", "", "Suite rows with no line in the CSV:", ""]
        lines += [f"- {b.name}: `{b.command()}`" for b in missing] + [""]
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------------------ SVG
def _svg_bars(title: str, items: list[tuple[str, float, float | None, float | None]], *, unit: str,
              reference: float | None, log: bool) -> str:
    """Horizontal bars (label, value, low, high), an optional reference line (1.0×, 100%), optional log scale."""
    label_w, bar_w, row_h, top = 210, 440, 20, 40
    height = top + row_h * len(items) + 30
    vals = [v for _, v, lo, hi in items] + [hi for *_, hi in items if hi is not None]
    vmax = max(vals + [reference or 0]) * 1.1
    vmin = min([v for _, v, _, _ in items] + [lo for _, _, lo, _ in items if lo is not None] + [reference or 1]) / 1.2

    def x(v: float) -> float:
        if log:
            return label_w + bar_w * (math.log(v) - math.log(vmin)) / (math.log(vmax) - math.log(vmin))
        return label_w + bar_w * v / vmax

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{label_w + bar_w + 90}" height="{height}" '
             'font-family="sans-serif" font-size="11">',
             f'<text x="8" y="18" font-size="13" font-weight="bold">{escape(title)}</text>']
    base = x(vmin) if log else label_w
    for i, (label, v, lo, hi) in enumerate(items):
        y = top + i * row_h
        colour = "#2a7" if reference is None or v >= reference else "#c44"
        parts.append(f'<text x="{label_w - 6}" y="{y + 13}" text-anchor="end">{escape(label)}</text>')
        parts.append(f'<rect x="{base:.1f}" y="{y + 3}" width="{max(x(v) - base, 1):.1f}" height="{row_h - 6}" '
                     f'fill="{colour}"/>')
        if lo is not None and hi is not None:
            parts.append(f'<line x1="{x(lo):.1f}" x2="{x(hi):.1f}" y1="{y + row_h / 2}" y2="{y + row_h / 2}" '
                         'stroke="#000"/>')
        parts.append(f'<text x="{x(max(v, hi or v)) + 4:.1f}" y="{y + 13}">{v:.3g}{unit}</text>')
    if reference is not None:
        rx = x(reference)
        parts.append(f'<line x1="{rx:.1f}" x2="{rx:.1f}" y1="{top - 4}" y2="{height - 24}" stroke="#555" '
                     'stroke-dasharray="4 3"/>')
        parts.append(f'<text x="{rx:.1f}" y="{height - 10}" text-anchor="middle">{reference:g}{unit}</text>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def plots(latest: dict[str, Measurement]) -> dict[str, str]:
    """File name -> SVG text: the headline implementation's speedup over its strongest baseline, and its % of
    the roofline, per row."""
    speed, roof = [], []
    for row in row_order(set(latest)):
        impl = latest[row].headline()
        if impl is None:
            continue
        best = impl.best()
        if best and _num(best[1]["speedup"]):
            c = best[1]
            speed.append((f"{row} vs {BASELINE_NAMES.get(best[0], best[0])}", _num(c["speedup"]),
                          _num(c["ci_low"]), _num(c["ci_high"])))
        if _num(impl.line["pct_of_roofline"]):
            roof.append((row, _num(impl.line["pct_of_roofline"]), None, None))
    out = {}
    if speed:
        out["results-speedup.svg"] = _svg_bars("Speedup over the strongest baseline measured (log scale, 95% CI)",
                                               speed, unit="×", reference=1.0, log=True)
    if roof:
        out["results-roofline.svg"] = _svg_bars("% of the roofline (the device's measured copy or matmul ceiling)",
                                                roof, unit="%", reference=100.0, log=False)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--csv", type=Path, default=RESULTS, help="the suite's CSV (default benchmarks/data/results.csv)")
    p.add_argument("--out", type=Path, default=ROOT / "docs" / "results.md", help="the page to write")
    args = p.parse_args(argv)
    if not args.csv.is_file():
        print(f"{args.csv} does not exist; run benchmarks/suite.py first or pass --csv", file=sys.stderr)
        return 2
    try:
        measurements = read(args.csv)
    except ValueError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    if not measurements:
        print(f"{args.csv} holds no measurement", file=sys.stderr)
        return 2
    svgs = plots(current(measurements))
    for name, text in svgs.items():
        (args.out.parent / name).write_text(text, encoding="utf-8")
    try:
        csv_name = str(args.csv.resolve().relative_to(ROOT))
    except ValueError:
        csv_name = str(args.csv)
    args.out.write_text(page(measurements, csv_name, list(svgs)), encoding="utf-8")
    print(f"wrote {args.out} and {', '.join(svgs) or 'no plot'} from {len(measurements)} measurements")
    return 0


if __name__ == "__main__":
    sys.exit(main())
