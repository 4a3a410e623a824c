#!/usr/bin/env bash
# Session 4's third H200 call, on two GPUs (kind nvidia-h200-x2):
#  1. issue 10 again after the archive's lock fix: `crucible batch --gpus 2` (one task per GPU), alone;
#  2. then side by side: GPU 0 `crucible bench` on attention fwd+bwd, non-causal and causal (outliers draw
#     dropped); GPU 1 `crucible bench` on linear + CE (fp32 dx on BK 32 tiles), with time to finish.
#   bash benchmarks/gpu_session4c.sh     (repo root, .whl carried; about 7 minutes; logs and archives in $OUT/all.tgz)
set -uo pipefail
OUT=${OUT:-runs/gpu-session4c}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
OUT=$OUT/batch GPUS=2 timeout 250 bash benchmarks/gpu_batch_scaling.sh > "$OUT/batch2.log" 2>&1
echo "##### batch, two GPUs (rc=$?)"; tail -32 "$OUT/batch2.log"
(export CUDA_VISIBLE_DEVICES=0
 OUT=$OUT/bench0 bash benchmarks/gpu_bench_tasks.sh "attention_fwd_bwd attention_bwd eager 80" \
   "attention_fwd_bwd_causal attention_bwd eager 80") > "$OUT/gpu0.log" 2>&1 &
(export CUDA_VISIBLE_DEVICES=1
 OUT=$OUT/bench1 bash benchmarks/gpu_bench_tasks.sh "linear_cross_entropy linear_cross_entropy eager,liger 200") \
   > "$OUT/gpu1.log" 2>&1 &
wait
echo "##### GPU 0"; cat "$OUT/gpu0.log"; echo "##### GPU 1"; cat "$OUT/gpu1.log"
tar czf "$OUT/all.tgz" -C "$OUT" batch bench0 bench1 batch2.log gpu0.log gpu1.log 2>/dev/null
rm -rf "$OUT/batch" "$OUT/bench0" "$OUT/bench1"
