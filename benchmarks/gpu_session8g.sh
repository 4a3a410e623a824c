#!/usr/bin/env bash
# Session 8: the attention forward tasks with SDPA's FlashAttention-2 backend as a second reference (as the fwd+bwd
# tasks): `crucible check` N times on each, then `crucible bench` on the non-causal task, the seed and the
# persistent no-token candidate one after the other. Logs in $OUT.
#   N=3 bash benchmarks/gpu_session8g.sh      (repo root, .whl carried; about 4 minutes)
set -uo pipefail
OUT=${OUT:-runs/gpu-session8g}; mkdir -p "$OUT"; export OUT
N=${N:-3} bash benchmarks/gpu_session8f.sh
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
for c in seeds/attention.py benchmarks/candidates/attention_gluon_persistent.py; do
  echo "=== crucible bench tasks/attention_fwd.py $c"
  timeout 100 python3 -m agent.cli bench tasks/attention_fwd.py "$c" --baselines eager --json > "$OUT/b.json" \
    2> "$OUT/b.err"; python3 benchmarks/show_report.py "$OUT/b.json" || tail -4 "$OUT/b.err"
done 2>&1 | tee "$OUT/bench.log"
