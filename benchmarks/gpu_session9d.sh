#!/usr/bin/env bash
# Session 9, the last of the device time: the fp16 preparation's profile, one launch over the four tensors against
# one a tensor, then `crucible bench` on both fwd+bwd tasks with the one-a-tensor candidate. Logs in $OUT.
#   bash benchmarks/gpu_session9d.sh      (repo root, one H200, .whl carried; about 3 minutes)
set -uo pipefail
OUT=${OUT:-runs/gpu-session9d}; mkdir -p "$OUT"; export OUT
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
timeout 60 python3 benchmarks/profile_attention_prep.py > "$OUT/prep.log" 2>&1
OUT="$OUT/b" SEEDS=benchmarks/candidates bash benchmarks/gpu_bench_tasks.sh \
  "attention_fwd_bwd attention_train_prep_split eager 100" \
  "attention_fwd_bwd_causal attention_train_prep_split eager 100" > "$OUT/bench.log" 2>&1
grep -v Warning "$OUT/prep.log" | head -40; cat "$OUT/bench.log"
