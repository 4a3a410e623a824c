#!/usr/bin/env bash
# Session 4's last H200 call: the attention fwd+bwd tasks' outputs against the harness's bound, per input
# distribution, for the seed and each of PyTorch's SDPA backends (benchmarks/diag_attention_precision.py, one draw).
#   bash benchmarks/gpu_session4d.sh      (repo root; about 2 minutes)
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
for task in attention_fwd_bwd attention_fwd_bwd_causal; do
  for dist in normal uniform outliers constant_rows; do
    timeout 60 python3 benchmarks/diag_attention_precision.py --task $task --dist $dist --draws 1 2>&1 | grep -A9 "elements outside"
  done
done
