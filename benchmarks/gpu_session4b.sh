#!/usr/bin/env bash
# Session 4's second H200 call, on two GPUs (kind nvidia-h200-x2):
#  1. issue 10: `crucible batch` with one task per GPU (GPUS=2 bash benchmarks/gpu_batch_scaling.sh), alone;
#  2. then side by side (they share only the host):
#     GPU 0: benchmarks/diag_attention_precision.py (why the fwd+bwd seed failed run O's outliers draw), then
#            benchmarks/bench_lce.py (the fp32-summed dx's tiles);
#     GPU 1: `crucible bench` on the MoE grouped GEMM (roofline fix), linear + CE (fp32 dx on 2 stages) and AdamW
#            (table="auto").
#   bash benchmarks/gpu_session4b.sh     (repo root, .whl carried; about 9 minutes; logs and archives in $OUT/all.tgz)
set -uo pipefail
OUT=${OUT:-runs/gpu-session4b}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
OUT=$OUT/batch GPUS=2 timeout 250 bash benchmarks/gpu_batch_scaling.sh > "$OUT/batch2.log" 2>&1
echo "##### batch, two GPUs (rc=$?)"; tail -40 "$OUT/batch2.log"
(export CUDA_VISIBLE_DEVICES=0
 echo "=== $(date +%T) diag_attention_precision.py"; timeout 150 python3 benchmarks/diag_attention_precision.py --draws 2
 echo "rc=$?"; echo "=== $(date +%T) bench_lce.py"; OUT=$OUT/lce timeout 150 python3 benchmarks/bench_lce.py --budget 110
 echo "rc=$?") > "$OUT/gpu0.log" 2>&1 &
(export CUDA_VISIBLE_DEVICES=1
 OUT=$OUT/bench bash benchmarks/gpu_bench_tasks.sh "moe_grouped_gemm moe eager 150" \
   "linear_cross_entropy linear_cross_entropy eager,liger 110" "adamw adamw eager,compile 70") > "$OUT/gpu1.log" 2>&1 &
wait
echo "##### GPU 0"; cat "$OUT/gpu0.log"; echo "##### GPU 1"; cat "$OUT/gpu1.log"
tar czf "$OUT/all.tgz" -C "$OUT" batch lce bench batch2.log gpu0.log gpu1.log 2>/dev/null
rm -rf "$OUT/batch" "$OUT/lce" "$OUT/bench"
