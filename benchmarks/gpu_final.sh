#!/usr/bin/env bash
# The loop on the H200 (issue 4): where a check's seconds go, then `crucible run` with the offline tuner on two tasks
# (each candidate timed against eager; the best re-checked against eager, torch.compile and Liger at the end), the
# best re-verified by `crucible check`, and `crucible bench` on the two ANCHORS rows the seeds were changed for.
#   bash benchmarks/gpu_final.sh        (repo root, GPU machine, .whl carried: pydantic, tenacity, liger-kernel)
set -uo pipefail
OUT=${OUT:-runs/gpu-final}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD
export PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-6}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
step() { echo; echo "=== $(date +%T) $*"; }
step "ceilings (measured once per machine, cached)"
timeout 120 python3 -m agent.cli bench --ceilings > "$OUT/ceilings.txt" 2>&1; tail -3 "$OUT/ceilings.txt"
step "check cost with the timing stage (eager), ceilings cached"
timeout 120 python3 benchmarks/bench_harness.py --device cuda --n 3 --timing > "$OUT/harness_timing.txt" 2>&1
tail -45 "$OUT/harness_timing.txt"
for t in rmsnorm_fwd softmax_fwd; do
  step "crucible run tasks/$t.py (tuner, budget $BUDGET)"
  timeout 240 python3 -m agent.cli run tasks/$t.py --device cuda --budget "$BUDGET" --archive "$OUT/archive.db" \
    --json > "$OUT/run_$t.json" 2> "$OUT/run_$t.err"; echo "rc=$?"; tail -3 "$OUT/run_$t.err"
  python3 benchmarks/show_report.py "$OUT/run_$t.json"
  best=$(python3 -c "import json; print((json.load(open('$OUT/run_$t.json')).get('best') or {}).get('path') or '')" 2>/dev/null)
  if [ -n "$best" ]; then
    step "re-verify $best with crucible check"
    timeout 90 python3 -m agent.cli check tasks/$t.py "$best" --json > "$OUT/check_$t.json" 2>&1
    python3 -c "
import json; d=json.load(open('$OUT/check_$t.json')); print(d['verdict'], d['stage'], d['reason'], d['message'][:300])"
  fi
done
python3 -m agent.cli archive list --archive "$OUT/archive.db" --json > "$OUT/archive_list.json" 2>&1
for spec in "rmsnorm_fwd rmsnorm" "softmax_fwd softmax"; do set -- $spec
  step "crucible bench tasks/$1.py seeds/$2.py"
  timeout 120 python3 -m agent.cli bench tasks/$1.py seeds/$2.py --baselines eager,compile,liger --json \
    > "$OUT/bench_$1.json" 2> "$OUT/bench_$1.err"
  python3 benchmarks/show_report.py "$OUT/bench_$1.json"
done
