#!/usr/bin/env bash
# Session 3's first H200 call: sustained (burst) timing. GPU cheat tests in both modes; crucible's timer against
# do_bench on SDPA by burst length; `crucible bench` on the attention rows (auto = sustained for compute-bound, and
# isolated for comparison); the cross-entropy task through `crucible bench` (the 8 GiB pinning cap, chunked compare).
#   bash benchmarks/gpu_sustained.sh        (repo root, GPU machine, .whl carried: pydantic, tenacity, liger-kernel)
set -uo pipefail
OUT=${OUT:-runs/gpu-sustained}; mkdir -p "$OUT"; export OUT
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
step() { echo; echo "=== $(date +%T) $*"; }
summ() { python3 benchmarks/show_report.py "$1"; }
step "GPU cheat tests (isolated and burst)"
CRUCIBLE_TEST_DEVICE=cuda timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_harness_gpu.py \
  tests/test_profiler_gpu.py > "$OUT/gpu_tests.txt" 2>&1; echo "rc=$?"; tail -6 "$OUT/gpu_tests.txt"
step "crucible timer by burst length vs do_bench on SDPA"
timeout 120 python3 benchmarks/bench_sdpa_timers.py > "$OUT/sdpa_timers.txt" 2>&1; echo "rc=$?"
tail -16 "$OUT/sdpa_timers.txt"
SEEDS=${SEEDS:-seeds}  # where the seed files come from (a snapshot while seeds/ is being edited)
for spec in "attention_fwd attention auto" "attention_fwd attention isolated" "attention_fwd_causal attention auto"; do
  set -- $spec
  step "crucible bench tasks/$1.py $SEEDS/$2.py --baselines eager,compile --timing-mode $3"
  timeout 100 python3 -m agent.cli bench tasks/$1.py $SEEDS/$2.py --baselines eager,compile --timing-mode $3 --json \
    > "$OUT/bench_$1_$3.json" 2> "$OUT/bench_$1_$3.err"; echo "rc=$?"; summ "$OUT/bench_$1_$3.json"
done
step "crucible bench tasks/cross_entropy.py $SEEDS/cross_entropy.py --baselines eager,compile,liger"
timeout 120 python3 -m agent.cli bench tasks/cross_entropy.py $SEEDS/cross_entropy.py --baselines eager,compile,liger \
  --json > "$OUT/bench_cross_entropy.json" 2> "$OUT/bench_cross_entropy.err"; echo "rc=$?"
summ "$OUT/bench_cross_entropy.json"; tail -3 "$OUT/bench_cross_entropy.err"
