#!/usr/bin/env bash
# Session 8, second call (one H200): the decode sweep with the balanced schedule, then `crucible bench` on the dense
# decode task (the seed, the balanced candidates at one and two programs an SM) and the paged one (the seed, one
# split). Logs in $OUT.
#   bash benchmarks/gpu_session8b.sh      (repo root, .whl carried; about 6 minutes)
set -uo pipefail
OUT=${OUT:-runs/gpu-session8b}; mkdir -p "$OUT"; export OUT
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv
timeout 200 python3 benchmarks/sweep_decode.py --budget 160 > "$OUT/sweep_decode.log" 2>&1; echo "sweep rc=$?"
OUT="$OUT/bench" bash benchmarks/gpu_bench_tasks.sh "decode_attention decode eager,compile 90" > "$OUT/bench.log" 2>&1
for c in decode_balanced decode_balanced2; do
  echo "=== crucible bench tasks/decode_attention.py benchmarks/candidates/$c.py" >> "$OUT/bench.log"
  timeout 90 python3 -m agent.cli bench tasks/decode_attention.py benchmarks/candidates/$c.py \
    --baselines eager,compile --json > "$OUT/bench_$c.json" 2> "$OUT/bench_$c.err"
  python3 benchmarks/show_report.py "$OUT/bench_$c.json" >> "$OUT/bench.log" 2>&1 || tail -4 "$OUT/bench_$c.err" >> "$OUT/bench.log"
done
OUT="$OUT/bench" bash benchmarks/gpu_bench_tasks.sh "decode_attention_paged decode_paged eager 90" >> "$OUT/bench.log" 2>&1
echo "=== crucible bench tasks/decode_attention_paged.py benchmarks/candidates/decode_paged_split1.py" >> "$OUT/bench.log"
timeout 90 python3 -m agent.cli bench tasks/decode_attention_paged.py benchmarks/candidates/decode_paged_split1.py \
  --baselines eager --json > "$OUT/bench_paged_split1.json" 2> "$OUT/bench_paged_split1.err"
python3 benchmarks/show_report.py "$OUT/bench_paged_split1.json" >> "$OUT/bench.log" 2>&1 || tail -4 "$OUT/bench_paged_split1.err" >> "$OUT/bench.log"
grep -A 14 "^decode B64" "$OUT/sweep_decode.log"; grep -A 13 "^paged decode B64 Hq32/8 N8192 D128$" "$OUT/sweep_decode.log"
cat "$OUT/bench.log"
