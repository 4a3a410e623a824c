"""Does every KernelBench task load? `crucible check TASK --reference --device cpu --json` on each task file of the
given folders, one process per task under a time limit, and a count of usable / refused with each refusal's reason.

    python benchmarks/kernelbench_load.py KernelBench/level1 KernelBench/level2 KernelBench/level3 \\
        --json-out runs/kernelbench_load.json

The folders are KernelBench's own (github.com/ScalingIntelligence/KernelBench, KernelBench/levelN); docs/kernelbench.md
records the latest count and the commit it was made at.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def task_key(path: Path) -> tuple[int, str]:
    m = re.match(r"(\d+)_", path.name)
    return (int(m.group(1)) if m else 1 << 30, path.name)


def check(path: Path, timeout: float) -> dict:
    cmd = [sys.executable, "-m", "agent.cli", "check", str(path), "--reference", "--device", "cpu", "--json"]
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    t0 = time.monotonic()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env)
    except subprocess.TimeoutExpired:
        return {"task": path.name, "verdict": "timeout", "message": f"no answer within {timeout:.0f} s",
                "seconds": round(time.monotonic() - t0, 1)}
    seconds = round(time.monotonic() - t0, 1)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if not lines:
        tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        return {"task": path.name, "verdict": "crash", "message": tail, "seconds": seconds}
    out = json.loads(lines[-1])
    return {"task": path.name, "verdict": out["verdict"], "message": out.get("message") or out.get("note"),
            "rescaled": out.get("rescaled"), "seconds": seconds}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folders", nargs="+", type=Path)
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per task")
    ap.add_argument("--json-out", type=Path)
    args = ap.parse_args()
    rows = []
    for folder in args.folders:
        files = sorted((p for p in folder.glob("*.py") if not p.name.startswith("_")), key=task_key)
        for path in files:
            row = {"level": folder.name, **check(path, args.timeout)}
            rows.append(row)
            print(f"{row['level']}/{row['task']}: {row['verdict']} ({row['seconds']} s)"
                  + (f": {row['message']}" if row.get("message") else ""), flush=True)
            if args.json_out:
                args.json_out.parent.mkdir(parents=True, exist_ok=True)
                args.json_out.write_text(json.dumps(rows, indent=1))
    for level in dict.fromkeys(r["level"] for r in rows):
        mine = [r for r in rows if r["level"] == level]
        usable = sum(r["verdict"] == "usable" for r in mine)
        print(f"{level}: {usable}/{len(mine)} usable, {sum(r['seconds'] for r in mine):.0f} s")
    usable = sum(r["verdict"] == "usable" for r in rows)
    print(f"all: {usable}/{len(rows)} usable")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
