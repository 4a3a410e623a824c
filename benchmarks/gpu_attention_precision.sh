#!/usr/bin/env bash
# The attention fwd+bwd tasks against the harness's bound as it stands (SDPA's FlashAttention-2 backend counted as a
# second honest reference), per task and distribution, for the seed and SDPA's backends, with the tolerance scales
# that would let each pass: what a CRUCIBLE_TOLERANCE_SCALE for these tasks would have to be, measured.
#   bash benchmarks/gpu_attention_precision.sh      (repo root, one H200; about 2 minutes)
set -uo pipefail
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD PYTHONUNBUFFERED=1
for task in attention_fwd_bwd attention_fwd_bwd_causal; do
  for dist in normal uniform outliers constant_rows; do
    timeout 90 python3 benchmarks/diag_attention_precision.py --task $task --dist $dist --draws 1 --alternates \
      --scales 1,1.5,2,3,4 2>&1 | grep -A9 "elements outside"
  done
done
