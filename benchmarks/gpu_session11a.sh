#!/usr/bin/env bash
# Issue 6's causal fwd+bwd target (written in session 10; session 11 ran BENCH=0 as run BJ and measured the benches
# as gpu_session11b.sh's A/B): the GPU-only test of the program order and of pdl (group_heads, the dQ kernel by
# programmatic dependent launch: bitwise the plain call's), the sweep's fp16 delta-o rows (head-major against
# grouped by 4 and 8, pdl), and `crucible bench` of the seed, the grouped candidate (causal) and the plain
# candidate (both tasks).
# Logs in $OUT.
#   bash benchmarks/gpu_session11a.sh      (repo root, one H200, .whl carried; about 10 minutes: past one call's
#   600 s, so run it as two calls: BENCH=0 (tests and sweep), then BENCH=only (tests and benches))
set -uo pipefail
OUT=${OUT:-runs/gpu-session11a}; mkdir -p "$OUT"; export OUT
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
CRUCIBLE_TEST_DEVICE=cuda timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_attention_gluon_bwd.py \
  -k program_order_and_pdl > "$OUT/tests.log" 2>&1; rc=$?; echo "order / pdl tests rc=$rc" >> "$OUT/tests.log"
skip=ordered; [ "$rc" = 0 ] || skip="ordered,grouped,pdl"
[ "${BENCH:-1}" = only ] || timeout 240 python3 benchmarks/sweep_attention_train.py --budget 200 \
  --only "fp16 delta o" --skip "$skip,prep two,s4" > "$OUT/sweep.log" 2>&1
[ "${BENCH:-1}" = 0 ] || OUT="$OUT/b" bash benchmarks/gpu_bench_tasks.sh \
  "attention_fwd_bwd_causal attention_bwd eager 100" > "$OUT/bench.log" 2>&1
if [ "$rc" = 0 ] && [ "${BENCH:-1}" != 0 ]; then
  OUT="$OUT/c" SEEDS=benchmarks/candidates bash benchmarks/gpu_bench_tasks.sh \
    "attention_fwd_bwd_causal attention_train_grouped eager 100" \
    "attention_fwd_bwd_causal attention_train_plain eager 100" "attention_fwd_bwd attention_train_plain eager 100" \
    >> "$OUT/bench.log" 2>&1
fi
tail -3 "$OUT/tests.log"; grep -v "^\[" "$OUT/sweep.log" 2>/dev/null | tail -24; cat "$OUT/bench.log" 2>/dev/null
