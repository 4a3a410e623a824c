#!/usr/bin/env bash
# One H200 session for the harness and profiler: GPU-only cheat tests, check overhead, crucible bench on ANCHORS rows.
#   run from the repo root on the GPU machine, with .whl carried (pydantic, tenacity, liger-kernel wheels)
set -uo pipefail
OUT=${OUT:-runs/gpu-session}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'
step() { echo; echo "=== $*"; }
step "GPU cheat tests"
CRUCIBLE_TEST_DEVICE=cuda timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_harness_gpu.py tests/test_profiler_gpu.py 2>&1 | tail -25
step "check overhead (no timing)"
timeout 120 python3 benchmarks/bench_harness.py --device cuda --n 5 2>&1 | tail -14
for spec in "rmsnorm_fwd rmsnorm" "softmax_fwd softmax" "swiglu_fwd swiglu"; do
  set -- $spec
  step "crucible bench tasks/$1.py seeds/$2.py"
  timeout 200 python3 -m agent.cli bench tasks/$1.py seeds/$2.py --baselines eager,compile,liger --json > "$OUT/bench_$1.json" 2> "$OUT/bench_$1.err"
  echo "rc=$?"; tail -3 "$OUT/bench_$1.err"
  python3 - "$OUT/bench_$1.json" <<'PY'
import json, sys
try:
    t = json.load(open(sys.argv[1]))
except Exception as exc:
    print("no report:", exc); raise SystemExit
for r in t.get("rows", []):
    vs = " ".join(f"vs {b}: {c['speedup']:.3f} [{c['ci_low']:.3f},{c['ci_high']:.3f}]" for b, c in r.get("vs", {}).items())
    print(f"{r['impl']:10s} {r['ms'] if r['ms'] is None else round(r['ms'], 4)} ms  {r.get('gbps') or 0:8.0f} GB/s  {vs}")
for p in t.get("problems", []): print("PROBLEM", p)
for w in t.get("warnings", []): print("warning", w[:200])
PY
done
