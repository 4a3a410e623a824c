#!/usr/bin/env bash
# Session 8, third call (one H200): `crucible bench` on both decode tasks with the new defaults (one split, 64-token
# tiles, 2 stages); the duel's A/A check (benchmarks/duel_aa.py: the seed against a copy of itself must not be
# crowned); `crucible run` on the RMSNorm forward with the tuner (the loop's duels end to end); then the Gluon
# attention forward sweep (benchmarks/sweep_attention_gluon.py), last because a hung kernel ends the call.
#   bash benchmarks/gpu_session8c.sh      (repo root, .whl carried; about 9 minutes)
set -uo pipefail
OUT=${OUT:-runs/gpu-session8c}; mkdir -p "$OUT"; export OUT
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv
OUT="$OUT/b" bash benchmarks/gpu_bench_tasks.sh "decode_attention decode eager,compile 90" \
  "decode_attention_paged decode_paged eager 90" > "$OUT/bench.log" 2>&1
timeout 150 python3 benchmarks/duel_aa.py tasks/rmsnorm_fwd.py seeds/rmsnorm.py > "$OUT/duel_aa.log" 2>&1
echo "duel_aa rc=$?" >> "$OUT/duel_aa.log"
timeout 240 python3 -m agent.cli run tasks/rmsnorm_fwd.py --budget 5 --device cuda --archive "$OUT/archive.db" \
  > "$OUT/run_rmsnorm.log" 2>&1; echo "run rc=$?" >> "$OUT/run_rmsnorm.log"
timeout 330 python3 benchmarks/sweep_attention_gluon.py --budget 270 > "$OUT/sweep_gluon.log" 2>&1
echo "gluon sweep rc=$?" >> "$OUT/sweep_gluon.log"
cat "$OUT/bench.log"; tail -8 "$OUT/duel_aa.log"; grep -i "duel\|new best\|vs #\|re-tim\|final\|accepted\|rejected" "$OUT/run_rmsnorm.log" | tail -25
tail -45 "$OUT/sweep_gluon.log"
