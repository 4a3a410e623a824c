#!/usr/bin/env bash
# One H200 call that measures what the CPU cannot: where the timing stage's seconds go, the forward-kernel memory
# hints, and the attention and MoE seeds against SDPA's backends and torch._grouped_mm.
#   bash benchmarks/gpu_measure.sh        (repo root, GPU machine, .whl carried: pydantic, tenacity, liger-kernel)
set -uo pipefail
OUT=${OUT:-runs/gpu-measure}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'
step() { echo; echo "=== $(date +%T) $*"; }
step "check cost with the timing stage (eager baseline): where the seconds go"
timeout 90 python3 benchmarks/bench_harness.py --device cuda --n 2 --timing 2>&1 | tail -40
step "forward variants: memory hints and warps vs the seeds and Liger"
timeout 150 python3 benchmarks/bench_fwd_variants.py 2>&1 | tail -45
step "attention seeds (quick)"
timeout 200 python3 benchmarks/bench_attention.py --quick > "$OUT/attention.log" 2>&1; echo "rc=$?"; tail -40 "$OUT/attention.log"
step "MoE seeds (quick)"
timeout 150 python3 benchmarks/bench_moe.py --quick > "$OUT/moe.log" 2>&1; echo "rc=$?"; tail -40 "$OUT/moe.log"
