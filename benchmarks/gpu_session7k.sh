#!/usr/bin/env bash
# Session 7: the GPU-only tests on the H200 (two GPUs). GPU 0: the timer, harness and profiler tests. GPU 1: the
# smem cross-entropy form against the reference (the interpreter cannot run Gluon), then the norm backwards'
# options with the device fixture on CUDA. Logs in $OUT.
#   bash benchmarks/gpu_session7k.sh      (repo root, .whl carried; about 3 minutes)
set -uo pipefail
OUT=${OUT:-runs/gpu-session7k}; mkdir -p "$OUT"; export OUT
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 CRUCIBLE_TEST_DEVICE=cuda
CUDA_VISIBLE_DEVICES=0 timeout 280 python3 -m pytest -q -p no:cacheprovider tests/test_timing_isolation.py \
  tests/test_timing_reserve.py tests/test_harness_gpu.py tests/test_profiler_gpu.py > "$OUT/gpu0.log" 2>&1 &
(CUDA_VISIBLE_DEVICES=1 timeout 140 python3 -m pytest -q -p no:cacheprovider tests/test_seed_cross_entropy.py \
   -k smem_form_on_the_gpu
 CUDA_VISIBLE_DEVICES=1 timeout 130 python3 -m pytest -q -p no:cacheprovider tests/test_norm_bwd_variants.py -x
) > "$OUT/gpu1.log" 2>&1 &
wait
tar czf "$OUT.tgz" -C "$(dirname "$OUT")" "$(basename "$OUT")" 2>/dev/null
tail -15 "$OUT/gpu0.log"; tail -30 "$OUT/gpu1.log"
