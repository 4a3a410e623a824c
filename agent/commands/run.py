"""`crucible run TASK`: search for the fastest verified Triton kernel for one task.

With --model openai:NAME / anthropic:NAME (or CRUCIBLE_MODEL) an LLM proposes and the offline tuner polishes at the
end; without a model the tuner proposes, starting from --from KERNEL.py or the task's seed. Every candidate goes
through the harness and into the archive (--archive, CRUCIBLE_ARCHIVE, else runs/archive.db). Ctrl-C stops cleanly;
`--resume` continues the last run of the task.
"""
from __future__ import annotations

import argparse
import json
import signal
import threading
from collections import deque
from pathlib import Path
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from . import BASELINES, add_constants, parse_constants

# Model names, paths and messages are the user's or a model's text: printed literally (no console markup, no
# emoji codes: a model named `openai:m:` stays `openai:m:`).
console = Console(emoji=False)
err_console = Console(stderr=True, emoji=False, markup=False, highlight=False)


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("run", help="search for a faster verified kernel for one task", description=__doc__)
    p.add_argument("task", help="task file (KernelBench format)")
    add_search_options(p)
    p.add_argument("--from", dest="start_from", metavar="KERNEL.py", help="start from this kernel instead of the seed")
    p.add_argument("--resume", nargs="?", const="latest", metavar="RUN_ID",
                   help="continue a run (default: the task's latest); unset options keep the run's values")
    p.add_argument("--json", action="store_true", help="print only the final summary, as JSON")
    p.set_defaults(func=run)


def add_search_options(p: argparse.ArgumentParser, *,
                       gpus_help: str = "evaluation workers, one per GPU (default 1)") -> None:
    """The options `run` and `batch` share (batch says what --gpus means there)."""
    p.add_argument("--model", help="openai:NAME or anthropic:NAME, or several separated by commas (each request goes "
                                   "to one, weighted by verified improvement per dollar; default: $CRUCIBLE_MODEL, "
                                   "else the offline tuner)")
    p.add_argument("--budget", type=int, help="proposals to make (default 20; the starting kernel is not counted)")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                   help="cuda times kernels; cpu checks correctness only, through Triton's interpreter")
    p.add_argument("--gpus", type=int, default=1, help=gpus_help)
    p.add_argument("--archive", type=Path, help="archive file (default: $CRUCIBLE_ARCHIVE, else runs/archive.db)")
    p.add_argument("--max-tokens", type=int, help="stop once the run has used this many tokens")
    p.add_argument("--max-cost", type=float, help="stop once the run has cost this many USD (priced models only)")
    p.add_argument("--time-limit", type=float, metavar="SECONDS",
                   help="stop proposing after this wall time (checks in flight finish; no duel starts past it, one in "
                        "flight ends after its current leg; the best is then checked once more)")
    p.add_argument("--target-roofline", type=float, metavar="PCT", help="stop once a kernel reaches PCT%% of roofline")
    p.add_argument("--polish", type=int, help="tuner proposals at the end of an LLM run (default: a fifth of budget)")
    p.add_argument("--concurrency", type=int, default=4,
                   help="LLM proposals whose outcome is not known yet, counting those still being checked "
                        "(default 4; 1: every request sees the previous one's verdict)")
    p.add_argument("--checks-per-gpu", type=int, metavar="K",
                   help="candidates checked at once on each GPU (default half the CPU's cores within 4 to 8, fewer "
                        "where the task's checks would not fit in the GPU's memory; 1 on the CPU): they compile and "
                        "check their correctness side by side while one at a time is timed, alone on the GPU")
    p.add_argument("--samples", type=int, default=1,
                   help="requests that may share one prompt at a time (parallel sampling; default 1)")
    p.add_argument("--max-output-tokens", type=int, default=8192,
                   help="the most tokens one reply may have (default 8192); a reply cut off there is reported "
                        "to the model as cut off")
    p.add_argument("--temperature", type=float, default=0.7, help="sampling temperature (default 0.7)")
    p.add_argument("--seed", type=int, default=0, help="seed of the search and the tuner (default 0)")
    add_constants(p)
    p.add_argument("--baselines", default="eager",
                   help="what each candidate is timed against on the GPU: eager, compile, liger, vendor (default "
                        "eager: torch.compile adds ~20 s to every check)")
    p.add_argument("--final-baselines", default="eager,compile,liger,vendor",
                   help="what the run's best kernel is timed against in its final re-check (default "
                        "eager,compile,liger,vendor; liger where Liger Kernel has the op, vendor where the task "
                        "names a vendor library's kernel)")


def config_from(args: argparse.Namespace, task: Path, **over: Any):
    from agent.search.loop import RunConfig
    return RunConfig(task_path=task, model=args.model, budget=args.budget, device=args.device, gpus=args.gpus,
                     start_from=Path(args.start_from) if getattr(args, "start_from", None) else None,
                     resume=getattr(args, "resume", None), max_tokens=args.max_tokens, max_cost=args.max_cost,
                     time_limit_s=args.time_limit, target_roofline=args.target_roofline, polish=args.polish,
                     concurrency=args.concurrency, samples=args.samples, seed=args.seed,
                     checks_per_gpu=args.checks_per_gpu,
                     reply_max_tokens=args.max_output_tokens, temperature=args.temperature,
                     baselines=_names(args.baselines), final_baselines=_names(args.final_baselines),
                     constants=parse_constants(getattr(args, "constants", [])),
                     rescale=not getattr(args, "no_rescale", False), **over)


def baselines_problem(args: argparse.Namespace) -> str | None:
    """One sentence when --baselines or --final-baselines names something the profiler does not time."""
    for flag, text in (("--baselines", args.baselines), ("--final-baselines", args.final_baselines)):
        if not _names(text) or set(_names(text)) - set(BASELINES):
            return (f"{flag} {text!r}: unknown baseline; name one or more of {', '.join(BASELINES)}, "
                    "separated by commas")
    return None


def options_problem(args: argparse.Namespace) -> str | None:
    """One sentence when a proposing option is out of range."""
    if args.concurrency < 1 or args.samples < 1:
        return "--concurrency and --samples must be at least 1"
    if args.checks_per_gpu is not None and not 1 <= args.checks_per_gpu <= 64:
        return f"--checks-per-gpu {args.checks_per_gpu}: give a number from 1 to 64"
    try:
        parse_constants(args.constants)
    except ValueError as exc:
        return str(exc)
    if args.max_output_tokens < 256:
        return f"--max-output-tokens {args.max_output_tokens}: give at least 256 tokens, room for one kernel edit"
    if not 0.0 <= args.temperature <= 2.0:
        return f"--temperature {args.temperature}: give a value from 0 to 2"
    return None


def _names(text: str) -> tuple[str, ...]:
    return tuple(b.strip() for b in text.split(",") if b.strip())


class StopOnSignal:
    """SIGINT/SIGTERM set `event` (the loop then records and ends cleanly); a second Ctrl-C raises as usual."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self._old: dict[int, Any] = {}

    def __enter__(self) -> threading.Event:
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._old[sig] = signal.signal(sig, self._handle)
        return self.event

    def _handle(self, signum: int, frame: Any) -> None:
        if self.event.is_set() and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.event.set()

    def __exit__(self, *exc: object) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)


def run(args: argparse.Namespace) -> int:
    from agent.archive.store import Archive
    from agent.llm.chat import ProviderError
    from agent.llm.pool import make_provider
    from agent.search.loop import LoopError, prepare, run_search

    if args.budget is not None and args.budget < 0 or args.gpus < 1:
        err_console.print("--budget must be 0 or more and --gpus at least 1")
        return 2
    problem = options_problem(args)
    if problem:
        err_console.print(problem, markup=False, emoji=False)
        return 2
    problem = baselines_problem(args)
    if problem:
        err_console.print(problem)
        return 2
    try:
        archive = Archive(args.archive)
    except Exception as exc:  # noqa: BLE001 - a path the user gave: say so, no traceback
        err_console.print(f"cannot open the archive {args.archive}: {exc}")
        return 2
    with archive:
        try:
            config = prepare(config_from(args, Path(args.task)), archive)
            provider = make_provider(config.model)
        except (LoopError, ProviderError) as exc:
            err_console.print(str(exc))
            return 2
        view = LiveView(enabled=not args.json)
        with StopOnSignal() as stop, view:
            try:
                summary = run_search(config, archive, provider=provider, on_event=view.update, stop=stop)
            except LoopError as exc:
                err_console.print(str(exc))
                return 2
        if args.json:
            console.print_json(json.dumps(summary_dict(summary, archive.path)))
        else:
            render_summary(summary, archive.path)
        if summary.stop_reason == "interrupted":
            return 130
        if summary.provider_failure and summary.replies == 0:
            # Not one reply: the model or endpoint is unusable as configured (key, name, address), not the kernels.
            err_console.print(summary.provider_failure)
            return 2
        return 0 if summary.best is not None else 1


# ---- rendering ------------------------------------------------------------------------------------------------------

class LiveView:
    """Progress, best verified speedup so far and the last verdicts; plain lines when not on a terminal."""

    def __init__(self, enabled: bool = True):
        self.enabled = enabled
        self.header = ""
        self.last: deque[Text] = deque(maxlen=8)
        self.progress = None
        self.live: Live | None = None

    def __enter__(self) -> "LiveView":
        if self.enabled and console.is_terminal:
            self.live = Live(self._render(), console=console, refresh_per_second=4, transient=False)
            self.live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.live is not None:
            self.live.__exit__(None, None, None)

    def update(self, event: Any) -> None:
        if not self.enabled:
            return
        self.progress = event.progress
        kind = event.kind.value
        if kind == "start":
            self.header = event.message
        line = Text(event.message, style=_style(event))
        if self.live is None:  # a pipe or a log: one line per event, never wrapped, so paths stay whole
            console.print(line, soft_wrap=True)
            return
        if kind != "start":
            self.last.append(line)
        self.live.update(self._render())

    def _render(self) -> Group:
        p = self.progress
        parts: list[Any] = [Text(self.header, style="bold")]
        if p is not None:
            parts.append(Text(
                f"proposals {p.proposals}/{p.budget} ({p.proposer}) · in flight {p.in_flight} · "
                f"verified {p.accepted} · rejected {p.rejected} · tokens {p.input_tokens + p.output_tokens} · "
                f"{cost_text(p.cost_usd)} · {p.elapsed_s:.0f} s"))
            parts.append(Text("best so far: " + _best_text(p.best)))
        parts.extend(self.last)
        return Group(*parts)


def _style(event: Any) -> str:
    c = event.candidate
    if event.kind.value in ("new_best",):
        return "bold green"
    if event.kind.value == "duel":
        return "magenta"
    if c is None:
        return "cyan" if event.kind.value in ("start", "note") else "yellow"
    return "green" if c.accepted else "red" if c.verdict == "rejected" else "yellow"


def _best_text(best: Any) -> str:
    if best is None:
        return "none verified yet"
    if not best.timed:
        return f"#{best.id} verified (not timed)"
    t = best.timings
    return f"#{best.id} {t.speedup_eager:.2f}x vs eager" if t.speedup_eager is not None else f"#{best.id} verified"


def _ci(speed: float | None, low: float | None, high: float | None) -> str:
    if speed is None:
        return "not measured"
    return f"{speed:.2f}x" + (f" (95% CI {low:.2f}-{high:.2f})" if low is not None and high is not None else "")


def summary_dict(s: Any, archive_path: Path) -> dict[str, Any]:
    p = s.progress
    best = None
    if s.best is not None:
        t = s.best.timings
        best = {"id": s.best.id, "origin": s.best.origin, "proposer": s.best.proposer, "timed": s.best.timed,
                "speedup_eager": t.speedup_eager, "eager_ci": [t.eager_ci_low, t.eager_ci_high],
                "speedup_compile": t.speedup_compile, "compile_ci": [t.compile_ci_low, t.compile_ci_high],
                "pct_roofline": t.pct_roofline, "candidate_ms": t.candidate_ms, "path": str(s.best_path)}
    final = None
    if s.final is not None:
        final = {"candidate_id": s.final.candidate_id, "status": s.final.status, "note": s.final.note,
                 "verdict": s.final.verdict, "reason": s.final.reason, "candidate_ms": s.final.timings.candidate_ms,
                 "pct_roofline": s.final.timings.pct_roofline, "vs": final_speedups(s.final)}
    return {"run_id": s.run_id, "task": s.task_path, "device": s.device, "timed": s.timed, "proposer": s.proposer,
            "stop_reason": s.stop_reason, "proposals": p.proposals, "budget": p.budget, "accepted": p.accepted,
            "rejected": p.rejected, "input_tokens": p.input_tokens, "output_tokens": p.output_tokens,
            "cost_usd": p.cost_usd, "requests": p.requests, "verified_per_1k_output_tokens": per_1k(p),
            "elapsed_s": round(p.elapsed_s, 2),
            "proposals_per_minute": p.per_minute, "mean_check_s": p.check_s,
            "start": None if s.start is None else {"id": s.start.id, "verdict": s.start.verdict,
                                                   "reason": s.start.reason},
            "best": best, "final_check": final, "notes": list(s.notes), "not_measured": list(s.not_measured),
            "archive": str(archive_path)}


def final_speedups(rev: Any) -> dict[str, dict[str, Any]]:
    """Baseline name -> speedup, CI, verdict (or why it was not measured) of a final re-check."""
    baselines = (((rev.diagnostics or {}).get("timing") or {}).get("baselines") or {})
    return {name: {"speedup": b.get("speedup"), "ci_low": b.get("ci_low"), "ci_high": b.get("ci_high"),
                   "verdict": b.get("verdict"), "ms": b.get("ms"),
                   "not_measured": None if b.get("available", True) else (b.get("reason") or "not measured")}
            for name, b in baselines.items()}


def render_summary(s: Any, archive_path: Path) -> None:
    p = s.progress
    table = Table(show_header=False, box=None, padding=(0, 1))
    table.add_row("run", Text(f"{s.run_id} ({s.stop_reason})"))
    table.add_row("proposals", Text(f"{p.proposals}/{p.budget} by {s.proposer}: {p.accepted} verified, "
                                    f"{p.rejected} rejected"))
    rate = p.per_minute
    table.add_row("pace", f"{p.elapsed_s:.0f} s"
                  + (f", {rate:.1f} proposals/min" if rate is not None else "")
                  + (f", {p.check_s:.1f} s of harness per candidate" if p.check_s is not None else ""))
    if p.requests or p.input_tokens or p.output_tokens:
        rate = per_1k(p)
        table.add_row("requests", Text(f"{p.requests} to the model; tokens {p.input_tokens} in, {p.output_tokens} out; "
                                       f"cost {cost_text(p.cost_usd)}"
                                       + (f"; {rate:.2f} verified kernels per 1k output tokens" if rate is not None
                                          else "")))
    if s.start is not None:
        table.add_row("starting kernel", f"#{s.start.id} {s.start.verdict} ({s.start.reason})")
    b = s.best
    if b is None:
        table.add_row("best kernel", "[red]none verified[/red]")
    else:
        t = b.timings
        table.add_row("best kernel", Text(f"#{b.id} ({b.origin}, {b.proposer}), written to the best.py below"))
        if b.timed and s.final is not None:
            f = s.final
            colour = "green" if f.status == "confirmed" else "red"
            table.add_row("final re-check", Text.assemble((f.status, colour), f": {f.note}"))
            labels = {"eager": "vs eager", "compile": "vs torch.compile", "liger": "vs Liger",
                      "vendor": "vs vendor library"}
            for name, v in final_speedups(f).items():
                text = _ci(v["speedup"], v["ci_low"], v["ci_high"])
                if v["verdict"] and v["speedup"] is not None:
                    text += f", {v['verdict']}"
                table.add_row(labels.get(name, f"vs {name}"), v["not_measured"] or text)
            ft = f.timings
            table.add_row("roofline", "not measured" if ft.pct_roofline is None else f"{ft.pct_roofline:.0f}%")
            if ft.candidate_ms is not None:
                table.add_row("time", f"{ft.candidate_ms:.4g} ms per call")
        elif b.timed:
            table.add_row("vs eager", _ci(t.speedup_eager, t.eager_ci_low, t.eager_ci_high))
            table.add_row("vs torch.compile", _ci(t.speedup_compile, t.compile_ci_low, t.compile_ci_high))
            table.add_row("roofline", "not measured" if t.pct_roofline is None else f"{t.pct_roofline:.0f}%")
            if t.candidate_ms is not None:
                table.add_row("time", f"{t.candidate_ms:.4g} ms per call")
        else:
            table.add_row("speed", "[yellow]not timed[/yellow]: verified correct only; without timings the "
                                   "verified kernels are not ranked, best.py is the earliest verified one")
    console.print(table)
    for line in s.not_measured:
        console.print(Text.assemble(("not measured", "yellow"), f": {line}"))
    # Paths and the command to paste each on a line of their own, never wrapped or cut (soft_wrap), in a pipe too.
    if b is not None:
        console.print("best kernel:")
        console.print(Text(f"  {s.best_path}"), soft_wrap=True)
    console.print("archive:")
    console.print(Text(f"  {archive_path}"), soft_wrap=True)
    console.print("continue with:")
    console.print(Text(f"  crucible run {s.task_path} --resume {s.run_id}"
                       + (f" --archive {archive_path}" if archive_path != Path("runs/archive.db") else "")),
                  soft_wrap=True)


def cost_text(cost: float | None) -> str:
    """Dollars, or why not: a model without a configured price costs an unknown amount, never $0."""
    return "unknown (no price configured: CRUCIBLE_PRICES)" if cost is None else f"${cost:.4f}"


def per_1k(p: Any) -> float | None:
    """Verified kernels the model proposed per 1,000 output tokens."""
    return round(1000.0 * p.verified_llm / p.output_tokens, 3) if p.output_tokens else None
