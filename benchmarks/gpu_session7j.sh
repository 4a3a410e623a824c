#!/usr/bin/env bash
# Session 7's last call (two H200s). GPU 0: `crucible run` on the cross-entropy task with the offline tuner from
# its seed (the smem form), 3 proposals: the loop end to end on the new default. GPU 1: `sweep_lce.py --rest` (the
# linear + CE options run AD's budget cut, on top of ModelNew's GPU default). Logs in $OUT.
#   bash benchmarks/gpu_session7j.sh      (repo root, .whl carried; about 3 minutes)
set -uo pipefail
OUT=${OUT:-runs/gpu-session7j}; mkdir -p "$OUT"; export OUT
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
CUDA_VISIBLE_DEVICES=0 timeout 300 python3 -m agent.cli run tasks/cross_entropy.py --budget 3 --device cuda \
  --archive "$OUT/archive.db" > "$OUT/run_ce.log" 2>&1 &
CUDA_VISIBLE_DEVICES=1 timeout 300 python3 benchmarks/sweep_lce.py --rest --budget 80 --no-compile \
  > "$OUT/sweep_lce.log" 2>&1 &
wait
tar czf "$OUT.tgz" -C "$(dirname "$OUT")" "$(basename "$OUT")" 2>/dev/null
tail -40 "$OUT/run_ce.log"; tail -12 "$OUT/sweep_lce.log"
