#!/usr/bin/env bash
# Session 11's A/B for the fwd+bwd seed's backward launch (runs BL, BM): `crucible bench` of the seed (pdl; causal
# programs grouped by 4 heads) and of benchmarks/candidates/attention_train_plain.py (session 10's launch)
# interleaved seed, plain, seed (causal) and plain, seed (non-causal) in one call, then the attention modules'
# GPU-only tests with the seed's knobs. Logs in $OUT.
#   bash benchmarks/gpu_session11b.sh      (repo root, one H200, .whl carried; about 8 minutes: TESTS=0 leaves
#   the tests out, TESTS=only runs only them)
set -uo pipefail
OUT=${OUT:-runs/gpu-session11b}; mkdir -p "$OUT"; export OUT
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
C=benchmarks/candidates; i=0
[ "${TESTS:-1}" = only ] || for spec in "seeds attention_fwd_bwd_causal attention_bwd" \
    "$C attention_fwd_bwd_causal attention_train_plain" "seeds attention_fwd_bwd_causal attention_bwd" \
    "$C attention_fwd_bwd attention_train_plain" "seeds attention_fwd_bwd attention_bwd"; do
  set -- $spec; i=$((i+1))
  OUT=$OUT/$i SEEDS=$1 bash benchmarks/gpu_bench_tasks.sh "$2 $3 eager 100" 2>&1 | grep -v "^warning"
done
[ "${TESTS:-1}" = 0 ] || CRUCIBLE_TEST_DEVICE=cuda timeout 280 python3 -m pytest -q -p no:cacheprovider \
  tests/test_attention_gluon_train.py tests/test_attention_gluon_bwd.py tests/test_attention_gluon.py \
  -k "on_the_gpu and not dq_ordered" --tb=short > "$OUT/gpu_tests.log" 2>&1
tail -1 "$OUT/gpu_tests.log" 2>/dev/null
