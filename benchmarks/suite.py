"""The benchmark suite: every GPU number crucible reports, as one declarative list of rows and one command.

A row names a task file, the task's constants where they differ from the file's, the candidate (the task's
registered seed unless one is named) and the baselines it is compared with. Running a row is `crucible bench` on it:
the candidate is checked through every stage in the sandbox, then timed against the baselines
(sandbox.harness.Harness.bench, the same call agent/commands/bench.py makes). Each implementation's line, and each
comparison, is appended to benchmarks/data/results.csv with the GPU, driver and library versions and the commit, so
that docs/results.md (written by benchmarks/results_page.py) can show the latest measurement of every row.

    python3 benchmarks/suite.py --list                 # the rows, no GPU needed
    python3 benchmarks/suite.py --only rmsnorm --dry-run
    python3 benchmarks/suite.py --only rmsnorm_fwd     # on a CUDA machine: measure, append to the CSV
    python3 benchmarks/results_page.py                 # then rewrite docs/results.md

`--only` takes shell-style patterns (comma-separated) matched against row names; a bare word selects the row of that
name, or every row whose name contains it where no row has that name (`--only moe` runs the four MoE rows,
`--only attention_fwd` only that one).
"""
from __future__ import annotations

import argparse
import csv
import fnmatch
import functools
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script from anywhere: the repository's packages (seeds, sandbox, profiler)
    sys.path.insert(0, str(ROOT))
RESULTS = ROOT / "benchmarks" / "data" / "results.csv"
from benchmarks._bench import commit as repo_commit  # noqa: E402

# One line per implementation and baseline it was compared with (an implementation with no comparison, or one that
# could not be timed, gets one line with `vs` empty). `source` says where a line came from: "suite" for lines this
# script wrote, or the measurement a line was transcribed from.
FIELDS = ["date", "commit", "gpu", "driver", "cuda", "torch", "triton", "liger", "row", "task", "constants", "impl",
          "ms", "iqr_ms", "gbps", "tflops", "pct_of_roofline", "vs", "speedup", "ci_low", "ci_high", "verdict",
          "timing_mode", "status", "note", "source"]

ALL = ("eager", "compile", "liger", "vendor")


@dataclass(frozen=True)
class Bench:
    """One row of the suite. `candidate` is a path from the repository root; None = the task's registered seed."""
    name: str
    task: str
    baselines: tuple[str, ...] = ALL
    constants: dict[str, int] = field(default_factory=dict)
    candidate: str | None = None
    note: str = ""

    def task_path(self) -> Path:
        return ROOT / self.task

    def candidate_path(self) -> Path | None:
        """The file timed: the named candidate, else the seed registered for the task (seeds/registry.py)."""
        if self.candidate is not None:
            return ROOT / self.candidate
        return _seed_files().get(Path(self.task).name)

    def constants_text(self) -> str:
        return " ".join(f"{k}={v}" for k, v in sorted(self.constants.items()))

    def command(self) -> str:
        """The equivalent `crucible bench` command line."""
        cand = self.candidate_path()
        parts = ["crucible bench", self.task]
        if cand is not None:
            parts.append(str(cand.relative_to(ROOT)))
        parts.append("--baselines " + ",".join(self.baselines))
        parts += [f"--set {k}={v}" for k, v in sorted(self.constants.items())]
        return " ".join(parts)


# The rows. Baselines are those each task's op has: Liger where Liger has the op, `vendor` where the task names a
# vendor library's kernel (MoE: torch._grouped_mm); the attention rows compare with eager alone (eager is SDPA on
# cuDNN, and torch.compile of SDPA runs the same kernel).
_NORM = ("eager", "compile", "liger")
SUITE: tuple[Bench, ...] = (
    Bench("rmsnorm_fwd", "tasks/rmsnorm_fwd.py", _NORM),
    Bench("rmsnorm_bwd", "tasks/rmsnorm_bwd.py", _NORM),
    Bench("rmsnorm_residual_fwd", "tasks/rmsnorm_residual_fwd.py", _NORM),
    Bench("layernorm_fwd", "tasks/layernorm_fwd.py", _NORM),
    Bench("layernorm_bwd", "tasks/layernorm_bwd.py", _NORM),
    Bench("softmax_fwd", "tasks/softmax_fwd.py", _NORM),
    Bench("softmax_bwd", "tasks/softmax_bwd.py", _NORM),
    Bench("swiglu_fwd", "tasks/swiglu_fwd.py", _NORM),
    Bench("swiglu_bwd", "tasks/swiglu_bwd.py", _NORM),
    Bench("geglu_fwd", "tasks/geglu_fwd.py", _NORM),
    Bench("geglu_bwd", "tasks/geglu_bwd.py", _NORM),
    Bench("geglu_erf_fwd", "tasks/geglu_erf_fwd.py", ("eager", "compile"), note="Liger has no erf GeGLU"),
    Bench("geglu_erf_bwd", "tasks/geglu_erf_bwd.py", ("eager", "compile"), note="Liger has no erf GeGLU"),
    Bench("rope_fwd", "tasks/rope_fwd.py", _NORM),
    Bench("rope_bwd", "tasks/rope_bwd.py", _NORM),
    Bench("cross_entropy", "tasks/cross_entropy.py", _NORM),
    Bench("cross_entropy_smooth_sum", "tasks/cross_entropy_smooth_sum.py", _NORM),
    Bench("linear_cross_entropy", "tasks/linear_cross_entropy.py", ("eager", "liger"),
          note="torch.compile of the step takes minutes to compile; eager holds 13.7 GiB extra"),
    Bench("adamw", "tasks/adamw.py", ("eager", "compile")),
    Bench("adamw_224m", "tasks/adamw.py", ("eager", "compile"),
          constants={"N0": 56_000_000, "N1": 56_000_000, "N2": 56_000_000, "N3": 56_000_000},
          note="224M parameters: the fixed costs of a call are ~1% here"),
    Bench("attention_fwd", "tasks/attention_fwd.py", ("eager",)),
    Bench("attention_fwd_causal", "tasks/attention_fwd_causal.py", ("eager",)),
    Bench("attention_fwd_bwd", "tasks/attention_fwd_bwd.py", ("eager",)),
    Bench("attention_fwd_bwd_causal", "tasks/attention_fwd_bwd_causal.py", ("eager",)),
    Bench("decode_attention", "tasks/decode_attention.py", ("eager", "compile")),
    Bench("decode_attention_paged", "tasks/decode_attention_paged.py", ("eager", "compile"),
          note="eager gathers the pages before SDPA"),
    Bench("moe_grouped_gemm", "tasks/moe_grouped_gemm.py", ("eager", "vendor"),
          note="eager is a loop over experts; vendor is torch._grouped_mm"),
    Bench("moe_grouped_gemm_bwd", "tasks/moe_grouped_gemm_bwd.py", ("eager", "vendor")),
    Bench("moe_layer_deepseek", "tasks/moe_layer_deepseek.py", ("eager", "vendor"),
          note="vendor is torch._grouped_mm with routing, SwiGLU and combine as PyTorch ops"),
    Bench("moe_layer_mixtral", "tasks/moe_layer_mixtral.py", ("eager", "vendor"),
          note="vendor is torch._grouped_mm with routing, SwiGLU and combine as PyTorch ops"),
)


@functools.lru_cache(maxsize=1)
def _seed_files() -> dict[str, Path]:
    """Task file name -> its registered seed's file (seeds/registry.py parses every seed file: do it once)."""
    from seeds.registry import all_seeds

    return {task: seed.path for seed in all_seeds() for task in seed.tasks}


def select(rows: Iterable[Bench], only: str | None) -> list[Bench]:
    """The rows whose name matches one of the comma-separated patterns; all rows when `only` is empty. A word
    without wildcards selects the row of that name, or, where no row has that name, every row containing it."""
    rows = list(rows)
    if not only:
        return rows
    names = {r.name for r in rows}
    pats = [p.strip() for p in only.split(",") if p.strip()]
    pats = [p if any(c in p for c in "*?[") or p in names else f"*{p}*" for p in pats]
    return [r for r in rows if any(fnmatch.fnmatchcase(r.name, p) for p in pats)]


def _fmt(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def csv_lines(bench: Bench, timing: dict[str, Any], *, date: str, commit: str, impl_name: str) -> list[dict[str, str]]:
    """The CSV lines of one `Harness.bench` report: one per (implementation, baseline compared with)."""
    env = timing.get("environment") or {}
    gpu = (env.get("gpu") or {}).get("name") or ""
    m = timing.get("measurement") or {}
    mode = "" if not m else ("sustained" if (m.get("burst") or 1) > 1 else "isolated")
    common = {"date": date, "commit": commit, "gpu": gpu, "driver": _fmt(env.get("driver")),
              "cuda": _fmt(env.get("cuda")), "torch": _fmt(env.get("torch")), "triton": _fmt(env.get("triton")),
              "liger": _fmt(env.get("liger_kernel")), "row": bench.name, "task": bench.task,
              "constants": bench.constants_text(), "timing_mode": mode, "source": "suite"}
    problems = "; ".join(f"{p['reason']}: {p['message']}" for p in timing.get("problems", []))
    out: list[dict[str, str]] = []
    rows = timing.get("rows") or []
    if problems and not any(r.get("impl") == "candidate" for r in rows):
        out.append({**common, "impl": impl_name, "status": "rejected", "note": problems})
    for row in rows:
        impl = impl_name if row["impl"] == "candidate" else row["impl"]
        status = ("rejected" if problems else "accepted") if row["impl"] == "candidate" else \
            ("measured" if row.get("ms") is not None else "unavailable")
        base = {**common, "impl": impl, "status": status,
                "note": problems if row["impl"] == "candidate" and problems else _fmt(row.get("note"))}
        for key in ("ms", "iqr_ms", "gbps", "tflops", "pct_of_roofline"):
            base[key] = _fmt(row.get(key))
        if not row.get("vs"):
            out.append(base)
        for vs, c in row.get("vs", {}).items():
            out.append({**base, "vs": vs, "speedup": _fmt(c.get("speedup")), "ci_low": _fmt(c.get("ci_low")),
                        "ci_high": _fmt(c.get("ci_high")), "verdict": _fmt(c.get("verdict"))})
    return [{k: line.get(k, "") for k in FIELDS} for line in out]


def append(path: Path, lines: list[dict[str, str]]) -> None:
    """Append lines to the CSV, writing the header first if the file is new; refuse a file with other columns."""
    new = not path.exists() or path.stat().st_size == 0
    if not new:
        with path.open(newline="") as fh:
            header = next(csv.reader(fh), [])
        if header != FIELDS:
            raise ValueError(f"{path} has columns {header}, not the suite's; move it aside or fix its header")
    with path.open("a", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=FIELDS)
        if new:
            w.writeheader()
        w.writerows(lines)


def run_rows(rows: list[Bench], *, out: Path, gpu: int, timing_mode: str, commit: str) -> int:
    """Bench each row on CUDA device `gpu` and append its lines to `out` after each row; 0 if every row was
    measured and accepted, 1 otherwise."""
    import torch

    if not torch.cuda.is_available():
        print("the suite times kernels on a CUDA GPU and this machine has none; --list and --dry-run work anywhere",
              file=sys.stderr)
        return 2
    from profiler.baselines import parse_names
    from sandbox.harness import Harness
    from sandbox.task import TaskError, load_task

    failures = 0
    with Harness(device="cuda") as harness:
        for bench in rows:
            cand = bench.candidate_path()
            impl = "seed" if bench.candidate is None else Path(bench.candidate).stem
            print(f"[{bench.name}] {bench.command()}", flush=True)
            start = time.monotonic()
            date = datetime.now(timezone.utc).isoformat(timespec="seconds")
            try:
                task = load_task(bench.task_path())
                task = task.with_constants(bench.constants) if bench.constants else task
                timing = harness.bench(task, cand, baselines=parse_names(",".join(bench.baselines)), gpu=gpu,
                                       timing_mode=timing_mode)
            except (TaskError, ValueError, OSError, RuntimeError) as exc:
                # One row's failure (a task that does not load, CUDA out of memory in the parent) is recorded and the
                # suite goes on to the next row.
                timing = {"rows": [], "problems": [{"reason": type(exc).__name__, "message": str(exc)}]}
            lines = csv_lines(bench, timing, date=date, commit=commit, impl_name=impl)
            append(out, lines)
            ok = not timing.get("problems")
            failures += not ok
            mine = next((ln for ln in lines if ln["impl"] == impl), None)
            summary = f"{mine['ms']} ms" if mine and mine["ms"] else (mine or {}).get("note", "no time")
            print(f"[{bench.name}] {'accepted' if ok else 'FAILED'}: {summary} ({time.monotonic() - start:.0f} s, "
                  f"{len(lines)} lines appended to {out})", flush=True)
            torch.cuda.empty_cache()
    return 1 if failures else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", metavar="PATTERN", help="comma-separated row-name patterns (fnmatch; a bare word "
                                                     "matches as a substring)")
    p.add_argument("--list", action="store_true", help="print the rows and exit")
    p.add_argument("--dry-run", action="store_true", help="print the `crucible bench` command of each row and exit")
    p.add_argument("--out", type=Path, default=RESULTS, help=f"CSV to append to (default {RESULTS.relative_to(ROOT)})")
    p.add_argument("--gpu", type=int, default=0, metavar="N", help="CUDA device index (default 0)")
    p.add_argument("--timing-mode", choices=("auto", "isolated", "sustained"), default="auto",
                   help="as `crucible bench --timing-mode` (default auto: sustained for compute-bound tasks)")
    p.add_argument("--commit", default=None, help="the commit to record (default: git rev-parse HEAD, where the "
                                                   "checkout has its .git)")
    p.add_argument("--merge", type=Path, metavar="FILE", help="append the lines of FILE (a CSV this script wrote "
                                                              "elsewhere, e.g. with --out on a GPU machine) to --out")
    args = p.parse_args(argv)

    if args.merge is not None:
        try:
            with args.merge.open(newline="") as fh:
                reader = csv.DictReader(fh)
                if reader.fieldnames != FIELDS:
                    raise ValueError(f"{args.merge} does not have the suite's columns")
                lines = list(reader)
            append(args.out, lines)
        except (OSError, ValueError) as exc:
            print(f"cannot merge {args.merge}: {exc}", file=sys.stderr)
            return 2
        print(f"appended {len(lines)} lines from {args.merge} to {args.out}")
        return 0
    rows = select(SUITE, args.only)
    if not rows:
        print(f"no row matches --only {args.only!r}; --list shows the rows", file=sys.stderr)
        return 2
    missing = [r for r in rows if not r.task_path().is_file() or r.candidate_path() is None
               or not r.candidate_path().is_file()]
    if missing:
        print("rows without a task file or a candidate: " + ", ".join(r.name for r in missing), file=sys.stderr)
        return 2
    if args.list:
        width = max(len(r.name) for r in rows)
        for r in rows:
            cand = r.candidate_path()
            extra = f"  {r.constants_text()}" if r.constants else ""
            print(f"{r.name:<{width}}  {r.task}  {cand.relative_to(ROOT)}  vs {','.join(r.baselines)}{extra}")
        return 0
    if args.dry_run:
        for r in rows:
            print(f"{r.name}: {r.command()}")
        print(f"would append to {args.out}")
        return 0
    commit = args.commit if args.commit is not None else repo_commit(ROOT)
    if not commit:
        # A copy of the working tree without .git (how a GPU machine often gets it): measure anyway, say so.
        print("no git checkout here to read the commit from: rows are recorded with commit 'unknown'; pass "
              "--commit HASH to record it", file=sys.stderr)
        commit = "unknown"
    return run_rows(rows, out=args.out, gpu=args.gpu, timing_mode=args.timing_mode, commit=commit)


if __name__ == "__main__":
    sys.exit(main())
