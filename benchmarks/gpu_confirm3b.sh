#!/usr/bin/env bash
# The next H200 call after session 3 (written when no device time was left): the fixes made after run N, checked
# where run N failed them, and the `crucible bench` rows run N could not give.
#   bash benchmarks/gpu_confirm3b.sh        (repo root, GPU machine, .whl carried; about 6 minutes)
#  - attention fwd+bwd (contiguous gradients): `crucible bench`, sustained timing
#  - linear + cross-entropy (dx summed in fp32): `crucible bench` (acceptance, time, memory via bench_lce.py)
#  - cross-entropy and the other backward tasks (baselines now run with grad): `crucible bench`
#  - AdamW (the host-path variants of bench_adamw.py, crucible-style timing included)
#  - the MoE grouped GEMM (no report within 60 s in run N): `crucible bench` with 150 s
set -uo pipefail
OUT=${OUT:-runs/gpu-confirm3b}; mkdir -p "$OUT"; export OUT
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
bash benchmarks/gpu_bench_tasks.sh "attention_fwd_bwd attention_bwd eager,compile 70" \
  "linear_cross_entropy linear_cross_entropy eager,liger 110" "cross_entropy cross_entropy eager,compile,liger 70" \
  "swiglu_bwd swiglu_bwd eager,compile,liger 50" "rope_bwd rope_bwd eager,compile,liger 50" \
  "moe_grouped_gemm moe eager 150"
echo "=== $(date +%T) bench_adamw.py"; timeout 70 python3 benchmarks/bench_adamw.py > "$OUT/adamw.txt" 2>&1
echo "rc=$?"; tail -25 "$OUT/adamw.txt"
