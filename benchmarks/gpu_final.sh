#!/usr/bin/env bash
# The closing H200 session: crucible bench on ANCHORS rows, then the tuner loop (crucible run) on two tasks with the
# best kernel re-verified by crucible check. Repo root on the GPU machine, .whl carried.
set -uo pipefail
OUT=${OUT:-runs/gpu-final}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
step() { echo; echo "=== $(date +%T) $*"; }
summarise() { python3 - "$1" <<'PY'
import json, sys
try:
    t = json.load(open(sys.argv[1]))
except Exception as exc:
    print("no report:", exc); raise SystemExit
chk = t.get("check") or {}
if chk:
    print("check:", chk.get("verdict"), chk.get("stage"), chk.get("reason"), "costs",
          {k: round(v, 2) for k, v in (chk.get("costs") or {}).items()})
for r in t.get("rows", []):
    vs = " ".join(f"vs {b}: {c['speedup']:.3f} [{c['ci_low']:.3f},{c['ci_high']:.3f}]" for b, c in r.get("vs", {}).items())
    rate = f"{r.get('gbps') or 0:6.0f} GB/s {r.get('pct_of_roofline') or 0:5.1f}%"
    print(f"{r['impl']:10s} {r['ms'] if r['ms'] is None else round(r['ms'], 4)} ms {rate}  {vs}")
for p in t.get("problems", []): print("PROBLEM", str(p)[:300])
PY
}
step "bench rmsnorm"
timeout 60 python3 -m agent.cli bench tasks/rmsnorm_fwd.py seeds/rmsnorm.py --baselines eager,compile,liger --json > "$OUT/bench_rmsnorm_fwd.json"; summarise "$OUT/bench_rmsnorm_fwd.json"
for t in rmsnorm_fwd swiglu_fwd; do
  step "crucible run tasks/$t.py (tuner, budget 4)"
  timeout 50 python3 -m agent.cli run tasks/$t.py --device cuda --budget 4 --baselines eager --archive "$OUT/archive.db" --json > "$OUT/run_$t.json"
  python3 -c "
import json; d=json.load(open('$OUT/run_$t.json')); b=d.get('best') or {}
print({k: d.get(k) for k in ('proposals','accepted','rejected','elapsed_s','proposals_per_minute','mean_check_s','stop_reason')})
print('best', {k: b.get(k) for k in b if k != 'source'})" 2>&1 | tail -3
  best=$(python3 -c "import json; print((json.load(open('$OUT/run_$t.json')).get('best') or {}).get('path') or '')" 2>/dev/null)
  if [ -n "$best" ]; then step "re-verify $best"; timeout 30 python3 -m agent.cli check tasks/$t.py "$best" --json > "$OUT/check_$t.json"; python3 -c "
import json; d=json.load(open('$OUT/check_$t.json')); print(d['verdict'], d['stage'], d['reason'], d['message'][:300])"; fi
done
for t in "softmax_fwd softmax" "swiglu_fwd swiglu"; do set -- $t
  step "bench $1"
  timeout 60 python3 -m agent.cli bench tasks/$1.py seeds/$2.py --baselines eager,compile,liger --json > "$OUT/bench_$1.json"; summarise "$OUT/bench_$1.json"
done
