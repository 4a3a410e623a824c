#!/usr/bin/env bash
# The next H200 call for issue 6's fwd+bwd targets (written in session 9 when its device time was spent; NOT RUN
# YET): the dq_ordered backward's GPU-only test (dQ added in key-block order by the dK/dV kernel, tickets between
# a head's programs; a hang is cut by the timeout), the train module's GPU tests, the preparation kernels'
# bandwidth by block size (profile_attention_prep.py --variants), the fwd+bwd sweep with the dq_ordered rows, and,
# where the test passed, `crucible bench` of the dq_ordered candidate on both fwd+bwd tasks. Logs in $OUT.
#   bash benchmarks/gpu_session10a.sh      (repo root, one H200, .whl carried; about 9 minutes)
#   BENCH=0 bash benchmarks/gpu_session10a.sh   (everything but the benches, which then run as a second call)
set -uo pipefail
OUT=${OUT:-runs/gpu-session10a}; mkdir -p "$OUT"; export OUT
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
CRUCIBLE_TEST_DEVICE=cuda timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_attention_gluon_bwd.py \
  -k dq_ordered_on_the_gpu > "$OUT/tests.log" 2>&1; rc=$?; echo "dq_ordered tests rc=$rc" >> "$OUT/tests.log"
CRUCIBLE_TEST_DEVICE=cuda timeout 100 python3 -m pytest -q -p no:cacheprovider tests/test_attention_gluon_train.py \
  -k gpu >> "$OUT/tests.log" 2>&1; echo "train tests rc=$?" >> "$OUT/tests.log"
timeout 60 python3 benchmarks/profile_attention_prep.py --variants > "$OUT/prep.log" 2>&1
skip=""; [ "$rc" = 0 ] || skip="--skip ordered"
timeout 240 python3 benchmarks/sweep_attention_train.py --budget 200 $skip > "$OUT/sweep.log" 2>&1
if [ "$rc" = 0 ] && [ "${BENCH:-1}" = 1 ]; then
  OUT="$OUT/b" SEEDS=benchmarks/candidates bash benchmarks/gpu_bench_tasks.sh \
    "attention_fwd_bwd attention_train_dq_ordered eager 120" \
    "attention_fwd_bwd_causal attention_train_dq_ordered eager 120" > "$OUT/bench.log" 2>&1
fi
tail -5 "$OUT/tests.log"; cat "$OUT/prep.log"; grep -v "^\[" "$OUT/sweep.log" | tail -26; cat "$OUT/bench.log" 2>/dev/null
