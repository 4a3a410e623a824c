#!/usr/bin/env bash
# Session 4's first H200 call, on a machine with two GPUs (kind nvidia-h200-x2): the checks of
# benchmarks/gpu_confirm3b.sh on GPU 0 and, beside it on GPU 1, the one-GPU `crucible batch` of issue 10
# (benchmarks/gpu_batch_scaling.sh with GPUS=1). The two share only the host (32 cores).
#   bash benchmarks/gpu_session4a.sh      (repo root, .whl carried; about 8 minutes; logs and archives in $OUT/all.tgz)
set -uo pipefail
OUT=${OUT:-runs/gpu-session4a}; mkdir -p "$OUT"
nvidia-smi --query-gpu=index,name,clocks.max.sm,power.limit --format=csv
(CUDA_VISIBLE_DEVICES=0 OUT=$OUT/confirm bash benchmarks/gpu_confirm3b.sh > "$OUT/confirm.log" 2>&1) &
(CUDA_VISIBLE_DEVICES=1 OUT=$OUT/batch GPUS=1 bash benchmarks/gpu_batch_scaling.sh > "$OUT/batch1.log" 2>&1) &
wait
echo "##### confirm"; cat "$OUT/confirm.log"
echo "##### batch, one GPU"; tail -40 "$OUT/batch1.log"
tar czf "$OUT/all.tgz" -C "$OUT" confirm batch confirm.log batch1.log && rm -rf "$OUT/confirm" "$OUT/batch"
