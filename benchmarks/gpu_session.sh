#!/usr/bin/env bash
# One H200 session for the harness and profiler: GPU-only cheat tests, the cost of a check, `crucible bench` on the
# ANCHORS rows (RMSNorm, softmax, SwiGLU seeds against eager / torch.compile / Liger; SDPA attention baselines).
#   bash benchmarks/gpu_session.sh        (repo root, GPU machine, .whl carried: pydantic, tenacity, liger-kernel)
set -uo pipefail
OUT=${OUT:-runs/gpu-session}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'
step() { echo; echo "=== $*"; }
step "GPU cheat tests"
CRUCIBLE_TEST_DEVICE=cuda timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_harness_gpu.py tests/test_profiler_gpu.py 2>&1 | tail -30
step "check cost, no timing stage"
timeout 150 python3 benchmarks/bench_harness.py --device cuda --n 3 2>&1 | tail -30
step "check cost, with the timing stage (eager baseline)"
timeout 150 python3 benchmarks/bench_harness.py --device cuda --n 1 --timing 2>&1 | tail -30
step "crucible bench --ceilings"
timeout 120 python3 -m agent.cli bench --ceilings 2>&1 | tail -12
for spec in "rmsnorm_fwd seeds/rmsnorm.py eager,compile,liger" "softmax_fwd seeds/softmax.py eager,compile,liger" \
            "swiglu_fwd seeds/swiglu.py eager,compile,liger" "attention_fwd - eager,compile"; do
  set -- $spec
  cand=$2; [ "$cand" = "-" ] && cand=""
  step "crucible bench tasks/$1.py $cand --baselines $3"
  timeout 150 python3 -m agent.cli bench tasks/$1.py $cand --baselines $3 --json > "$OUT/bench_$1.json" 2> "$OUT/bench_$1.err"
  echo "rc=$?"; tail -3 "$OUT/bench_$1.err"
  python3 benchmarks/show_report.py "$OUT/bench_$1.json"
done
