#!/usr/bin/env bash
# Session 7's second call (two H200s). GPU 0: benchmarks/sweep_norm_bwd.py (the norm backwards' prefetch,
# one-reduction, fused partial-sum options); GPU 1: benchmarks/sweep_glu.py (the SwiGLU forward's lean option and
# block sizes). Logs in $OUT.
#   bash benchmarks/gpu_session7b.sh      (repo root, .whl carried; about 2 minutes)
set -uo pipefail
OUT=${OUT:-runs/gpu-session7b}; mkdir -p "$OUT"; export OUT
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
CUDA_VISIBLE_DEVICES=0 python3 benchmarks/sweep_norm_bwd.py --budget 75 --out "$OUT" > "$OUT/sweep_norm_bwd.log" 2>&1 &
CUDA_VISIBLE_DEVICES=1 python3 benchmarks/sweep_glu.py --budget 60 > "$OUT/sweep_glu.log" 2>&1 &
wait
tar czf "$OUT.tgz" -C "$(dirname "$OUT")" "$(basename "$OUT")" 2>/dev/null
tail -40 "$OUT/sweep_norm_bwd.log"; tail -16 "$OUT/sweep_glu.log"
