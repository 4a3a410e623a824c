"""What the row sweeps share (sweep_norms.py, sweep_norm_bwd.py, sweep_fwd_rows.py): one result row, the rows of
the run, Liger's presence, the copy bandwidth row and the markdown table of the rows by op."""
from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from benchmarks._bench import rotating_median_ms


@dataclass
class Row:
    op: str
    impl: str
    kind: str  # "baseline" | "seed" | "variant" | "copy"
    ms: float | None = None
    gbps: float | None = None
    rel_l2: float | None = None
    status: str = ""  # "ok" | "WRONG" | "FAILED ..." | "skipped ..."
    note: str = ""


ROWS: list[Row] = []  # the run's rows, in the order they were measured (one sweep a process)


def liger_available() -> bool:
    try:
        import liger_kernel  # noqa: F401
        return True
    except ImportError:
        return False


def copy_bandwidth(device: str, smoke: bool) -> float:
    """GB/s of a 1 GiB fp16 copy_ (read + write), recorded as a "copy" row."""
    a = torch.randn(1 << (12 if smoke else 29), device=device, dtype=torch.float16)
    b = torch.empty_like(a)
    ms = rotating_median_ms(lambda i: b.copy_(a), 1, smoke)
    gbps = 2 * a.numel() * 2 / ms / 1e6
    ROWS.append(Row("copy", f"torch copy_ {a.numel() * 2 >> 20} MiB", "copy", ms, gbps, status="ok"))
    print(f"copy bandwidth: {gbps:,.0f} GB/s", flush=True)
    return gbps


def table(copy_gbps: float) -> None:
    """The rows by op, each with its % of copy_gbps and its speedup over the op's fastest correct baseline."""
    print(f"\n| op | impl | ms | GB/s | % of copy ({copy_gbps:,.0f}) | vs best baseline | rel L2 | status |")
    print("|---|---|---|---|---|---|---|---|")
    for op in dict.fromkeys(r.op for r in ROWS if r.kind != "copy"):
        rows = [r for r in ROWS if r.op == op]
        base = [r for r in rows if r.kind == "baseline" and r.status == "ok"]
        best = min(base, key=lambda r: r.ms) if base else None
        for r in rows:
            ms = f"{r.ms:.4f}" if r.ms else "–"
            gb = f"{r.gbps:,.0f}" if r.gbps else "–"
            pct = f"{100 * r.gbps / copy_gbps:.1f}%" if r.gbps else "–"
            sp = f"{best.ms / r.ms:.3f}x" if best and r.ms else "–"
            err = f"{r.rel_l2:.1e}" if r.rel_l2 is not None else "–"
            status = r.status + (f"; {r.note}" if r.note else "")
            print(f"| {op} | {r.impl} | {ms} | {gb} | {pct} | {sp} | {err} | {status} |")
        if best:
            print(f"| {op} | (best baseline: {best.impl}) | | | | | | |")


def device_for(smoke: bool) -> str | None:
    """"cpu" for --smoke (under the interpreter), "cuda" on a GPU; None, with one sentence printed, where the run
    cannot happen here (the caller exits 2)."""
    if smoke and os.environ.get("TRITON_INTERPRET") != "1":
        print("--smoke runs the kernels on the CPU interpreter: set TRITON_INTERPRET=1 before Python starts.")
        return None
    if not smoke and not torch.cuda.is_available():
        print("no CUDA device: run on the GPU, or check the script with TRITON_INTERPRET=1 ... --smoke.")
        return None
    return "cpu" if smoke else "cuda"


def announce(device: str) -> dict:
    """Seed the RNG, let torch.compile's backward be timed repeatedly over one graph (retain_graph); print what
    runs where and return it."""
    torch.manual_seed(0)
    import torch._functorch.config as functorch_config
    functorch_config.donated_buffer = False
    import triton
    env = {"gpu": torch.cuda.get_device_name() if device == "cuda" else "cpu (interpreter)",
           "torch": torch.__version__, "triton": triton.__version__, "liger": liger_available()}
    print(env, flush=True)
    return env


def finish(out: str | None, name: str, env: dict, copy_gbps: float, started: float) -> int:
    """Write the rows to out/name as JSON (when out is given), print the table and the run's time; exit code 0."""
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / name).write_text(json.dumps({"env": env, "copy_gbps": copy_gbps,
                                                  "rows": [asdict(r) for r in ROWS]}, indent=1))
    table(copy_gbps)
    print(f"\ntotal {time.time() - started:.0f} s")
    return 0
