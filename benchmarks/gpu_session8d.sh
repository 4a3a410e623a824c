#!/usr/bin/env bash
# Session 8, fourth call (one H200): `crucible bench` (sustained, all check stages) on both attention forward tasks
# with the Gluon FA3-style kernel as ModelNew's sm_90 path, and on the non-causal task with its ping-pong 3-stage
# variant as a candidate file. Logs in $OUT.
#   bash benchmarks/gpu_session8d.sh      (repo root, .whl carried; about 5 minutes)
set -uo pipefail
OUT=${OUT:-runs/gpu-session8d}; mkdir -p "$OUT"; export OUT
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv
OUT="$OUT/b" bash benchmarks/gpu_bench_tasks.sh "attention_fwd attention eager 110" \
  "attention_fwd_causal attention eager 110" > "$OUT/bench.log" 2>&1
echo "=== crucible bench tasks/attention_fwd.py benchmarks/candidates/attention_gluon_pingpong.py" >> "$OUT/bench.log"
timeout 110 python3 -m agent.cli bench tasks/attention_fwd.py benchmarks/candidates/attention_gluon_pingpong.py \
  --baselines eager --json > "$OUT/bench_pingpong.json" 2> "$OUT/bench_pingpong.err"
python3 benchmarks/show_report.py "$OUT/bench_pingpong.json" >> "$OUT/bench.log" 2>&1 || tail -5 "$OUT/bench_pingpong.err" >> "$OUT/bench.log"
cat "$OUT/bench.log"
