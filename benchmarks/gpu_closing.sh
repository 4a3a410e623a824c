#!/usr/bin/env bash
# The session's closing H200 call: the harness with outputs handed back in GPU buffers (cheat tests, check cost),
# crucible's timer against do_bench on SDPA, `crucible bench` on the seeds changed since their last measurement, and
# one more `crucible run`.
#   bash benchmarks/gpu_closing.sh        (repo root, GPU machine, .whl carried: pydantic, tenacity, liger-kernel)
set -uo pipefail
OUT=${OUT:-runs/gpu-closing}; mkdir -p "$OUT"; export OUT
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
step() { echo; echo "=== $(date +%T) $*"; }
step "GPU cheat tests"
CRUCIBLE_TEST_DEVICE=cuda timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_harness_gpu.py \
  tests/test_profiler_gpu.py > "$OUT/gpu_tests.txt" 2>&1; echo "rc=$?"; tail -15 "$OUT/gpu_tests.txt"
timeout 60 python3 -m agent.cli bench --ceilings > "$OUT/ceilings.txt" 2>&1
step "check cost with the timing stage (eager)"
timeout 60 python3 benchmarks/bench_harness.py --device cuda --n 3 --timing > "$OUT/harness_timing.txt" 2>&1
grep -E "^run|_s |^total|^calls" "$OUT/harness_timing.txt" | head -40
[ -n "${SKIP_SDPA:-}" ] || { step "crucible timer vs do_bench on SDPA"; timeout 75 python3 benchmarks/bench_sdpa_timers.py > "$OUT/sdpa_timers.txt" 2>&1; echo "rc=$?"; tail -9 "$OUT/sdpa_timers.txt"; }
summ() { python3 benchmarks/show_report.py "$1"; }
for spec in "layernorm_fwd layernorm eager,compile,liger 70" "cross_entropy cross_entropy eager,compile,liger 80" \
            "adamw adamw eager,compile 70" \
            "moe_layer_deepseek moe_layer eager 60"; do
  set -- $spec
  step "crucible bench tasks/$1.py seeds/$2.py --baselines $3"
  timeout $4 python3 -m agent.cli bench tasks/$1.py seeds/$2.py --baselines $3 --json > "$OUT/bench_$1.json" \
    2> "$OUT/bench_$1.err"; echo "rc=$?"; summ "$OUT/bench_$1.json"
done
step "crucible run tasks/layernorm_fwd.py (tuner, budget 4)"
timeout 100 python3 -m agent.cli run tasks/layernorm_fwd.py --device cuda --budget 4 --archive "$OUT/archive.db" \
  --json > "$OUT/run_layernorm_fwd.json" 2> "$OUT/run_layernorm_fwd.err"; echo "rc=$?"
python3 benchmarks/show_report.py "$OUT/run_layernorm_fwd.json"
