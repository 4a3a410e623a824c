#!/usr/bin/env bash
# Session 9, last call: the fp16 preparation's profile, then `crucible bench` (sustained, every check stage) on
# both fwd+bwd tasks with seeds/attention_bwd.py (fp16 working copies, delta from o); where a task rejects it, the
# bf16 precise candidate is benched instead. Logs in $OUT.
#   bash benchmarks/gpu_session9c.sh      (repo root, one H200, .whl carried; about 7 minutes)
set -uo pipefail
OUT=${OUT:-runs/gpu-session9c}; mkdir -p "$OUT"; export OUT
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
timeout 60 python3 benchmarks/profile_attention_prep.py > "$OUT/prep.log" 2>&1
for task in attention_fwd_bwd_causal attention_fwd_bwd; do
  OUT="$OUT/$task" bash benchmarks/gpu_bench_tasks.sh "$task attention_bwd eager 200" > "$OUT/bench_$task.log" 2>&1
  if ! grep -q "accepted" "$OUT/bench_$task.log"; then
    OUT="$OUT/${task}_bf16" SEEDS=benchmarks/candidates bash benchmarks/gpu_bench_tasks.sh \
      "$task attention_train_bf16 eager 200" >> "$OUT/bench_$task.log" 2>&1
  fi
done
head -30 "$OUT/prep.log"; cat "$OUT"/bench_*.log
