#!/usr/bin/env bash
# The next H200 call for issue 6's fwd+bwd targets (written in session 8; run in session 9 as run AZ):
#  1. the GPU-only tests of the Gluon forward (every variant against float64), its precise-delta option and the
#     Gluon backward;
#  2. the Gluon backward's sweep (dq/dk/dv against float64, then backward-only and fwd+bwd timings against cuDNN
#     SDPA + autograd and the Triton precise backward);
#  3. the forward-with-delta sweep, non-causal (the causal half is a second call: each needs ~3 TFLOP of fp64
#     truths). Logs in $OUT; the tables print last.
#   bash benchmarks/gpu_gluon_next.sh      (repo root, one H200, .whl carried; about 9 minutes)
set -uo pipefail
OUT=${OUT:-runs/gpu-gluon-next}; mkdir -p "$OUT"; export OUT
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
CRUCIBLE_TEST_DEVICE=cuda timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_attention_gluon.py \
  tests/test_attention_gluon_bwd.py -k gpu > "$OUT/tests.log" 2>&1; echo "tests rc=$?" >> "$OUT/tests.log"
timeout 280 python3 benchmarks/sweep_attention_gluon_bwd.py --budget 240 > "$OUT/sweep_bwd.log" 2>&1
timeout 200 python3 benchmarks/sweep_attention_gluon_delta.py --mode full --budget 170 > "$OUT/sweep_delta.log" 2>&1
tail -6 "$OUT/tests.log"; tail -30 "$OUT/sweep_bwd.log"; tail -25 "$OUT/sweep_delta.log"
