#!/usr/bin/env bash
# Session 8, first call (one H200): the decode sweep (benchmarks/sweep_decode.py: TMA, tiles, splits, dense and
# paged), then `crucible bench` on both decode tasks as the seeds stand. Logs in $OUT.
#   bash benchmarks/gpu_session8a.sh      (repo root, .whl carried; about 6 minutes)
set -uo pipefail
OUT=${OUT:-runs/gpu-session8a}; mkdir -p "$OUT"; export OUT
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
timeout 260 python3 benchmarks/sweep_decode.py --budget 220 > "$OUT/sweep_decode.log" 2>&1; echo "sweep rc=$?"
OUT="$OUT/bench" bash benchmarks/gpu_bench_tasks.sh "decode_attention decode eager,compile 120" \
  "decode_attention_paged decode_paged eager,compile 120" > "$OUT/bench.log" 2>&1
tail -60 "$OUT/sweep_decode.log"; cat "$OUT/bench.log"
