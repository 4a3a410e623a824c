#!/usr/bin/env bash
# Session 10's third H200 call: dq_ordered v2's GPU-only test (rotated order, transposed accumulator, deferred
# add; a hang is cut by the timeout), the train module's GPU tests (the dQ kernel's diagonal blocks now take dS
# as hi + lo), `crucible bench` of the seed on the causal task (rejected in run BH on 2 elements of dq), and,
# where the v2 test passed, of the dq_ordered candidate on both fwd+bwd tasks. Logs in $OUT.
#   bash benchmarks/gpu_session10c.sh      (repo root, one H200, .whl carried; about 6 minutes)
set -uo pipefail
OUT=${OUT:-runs/gpu-session10c}; mkdir -p "$OUT"; export OUT
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
CRUCIBLE_TEST_DEVICE=cuda timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_attention_gluon_bwd.py \
  -k dq_ordered_on_the_gpu > "$OUT/tests.log" 2>&1; rc=$?; echo "dq_ordered tests rc=$rc" >> "$OUT/tests.log"
CRUCIBLE_TEST_DEVICE=cuda timeout 100 python3 -m pytest -q -p no:cacheprovider tests/test_attention_gluon_train.py \
  -k gpu >> "$OUT/tests.log" 2>&1; echo "train tests rc=$?" >> "$OUT/tests.log"
OUT="$OUT/b" bash benchmarks/gpu_bench_tasks.sh "attention_fwd_bwd_causal attention_bwd eager 100" > "$OUT/bench.log" 2>&1
if [ "$rc" = 0 ]; then
  OUT="$OUT/c" SEEDS=benchmarks/candidates bash benchmarks/gpu_bench_tasks.sh \
    "attention_fwd_bwd attention_train_dq_ordered eager 100" \
    "attention_fwd_bwd_causal attention_train_dq_ordered eager 100" >> "$OUT/bench.log" 2>&1
fi
grep -E "passed|failed|rc=|^E " "$OUT/tests.log" | head -20; cat "$OUT/bench.log"
