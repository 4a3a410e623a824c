#!/usr/bin/env bash
# The next H200 call for issue 6 (written when session 4's device time was spent): does the attention fwd+bwd seed
# pass the harness with its `precise` numerics, and what do they cost?
#  1. benchmarks/diag_attention_precision.py on both tasks and all four draws, FA2 counted as the harness counts it,
#     with the tolerance scales each variant would need (gpu_attention_precision.sh);
#  2. `crucible check` of benchmarks/candidates/attention_bwd_precise.py on both tasks, then `crucible bench`
#     of it and of the default seed against eager on the non-causal task.
#   bash benchmarks/gpu_attention_next.sh      (repo root, one H200; about 7 minutes)
set -uo pipefail
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD PYTHONUNBUFFERED=1
bash benchmarks/gpu_attention_precision.sh
for t in attention_fwd_bwd attention_fwd_bwd_causal; do
  echo "=== $(date +%T) crucible check $t (precise)"
  timeout 80 python3 -m agent.cli check tasks/$t.py benchmarks/candidates/attention_bwd_precise.py --device cuda \
    --no-timing 2>&1 | tail -6
done
for c in benchmarks/candidates/attention_bwd_precise.py seeds/attention_bwd.py; do
  echo "=== $(date +%T) crucible bench attention_fwd_bwd $c"
  timeout 100 python3 -m agent.cli bench tasks/attention_fwd_bwd.py $c --baselines eager 2>&1 | tail -12
done
