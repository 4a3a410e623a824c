#!/usr/bin/env bash
# The next H200 call for issue 6's causal fwd+bwd target (written in session 10 when its device time was spent;
# NOT RUN YET): the grouped program order's GPU-only test (group_heads: bitwise the head-major order's), the causal
# sweep's fp16 delta-o rows (head-major against grouped by 4 and 8), and `crucible bench` of the grouped candidate
# on the causal task next to the seed. Logs in $OUT.
#   bash benchmarks/gpu_session11a.sh      (repo root, one H200, .whl carried; about 6 minutes)
set -uo pipefail
OUT=${OUT:-runs/gpu-session11a}; mkdir -p "$OUT"; export OUT
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
CRUCIBLE_TEST_DEVICE=cuda timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_attention_gluon_bwd.py \
  -k grouped_order > "$OUT/tests.log" 2>&1; rc=$?; echo "grouped tests rc=$rc" >> "$OUT/tests.log"
skip=ordered; [ "$rc" = 0 ] || skip="ordered,grouped"
timeout 200 python3 benchmarks/sweep_attention_train.py --budget 150 --mode causal --only "fp16 delta o" \
  --skip "$skip" > "$OUT/sweep.log" 2>&1
OUT="$OUT/b" bash benchmarks/gpu_bench_tasks.sh "attention_fwd_bwd_causal attention_bwd eager 100" > "$OUT/bench.log" 2>&1
if [ "$rc" = 0 ]; then
  OUT="$OUT/c" SEEDS=benchmarks/candidates bash benchmarks/gpu_bench_tasks.sh \
    "attention_fwd_bwd_causal attention_train_grouped eager 100" >> "$OUT/bench.log" 2>&1
fi
tail -3 "$OUT/tests.log"; grep -v "^\[" "$OUT/sweep.log" | tail -14; cat "$OUT/bench.log"
