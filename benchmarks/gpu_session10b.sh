#!/usr/bin/env bash
# Session 10's second H200 call for issue 6's fwd+bwd targets: the fused preparation (prep="fused": q, k, v copied
# to fp16 with the largest magnitudes in one read, dO's copy and delta in the forward's epilogue, o written as
# bf16 there): the train module's GPU tests (fused against the two-kernel preparation bitwise), the sweep's fp16
# delta-o rows and parts (no dq_ordered rows), the seed's kernel timeline (profile_attention_prep.py --timeline),
# and `crucible bench` of the seed on both fwd+bwd tasks, two benches in one call (the timing parent's memory fix).
#   bash benchmarks/gpu_session10b.sh      (repo root, one H200, .whl carried; about 7 minutes)
set -uo pipefail
OUT=${OUT:-runs/gpu-session10b}; mkdir -p "$OUT"; export OUT
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
CRUCIBLE_TEST_DEVICE=cuda timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_attention_gluon_train.py \
  -k gpu > "$OUT/tests.log" 2>&1; echo "train tests rc=$?" >> "$OUT/tests.log"
timeout 200 python3 benchmarks/sweep_attention_train.py --budget 150 --only "fp16 delta o" --skip ordered \
  > "$OUT/sweep.log" 2>&1
timeout 60 python3 benchmarks/profile_attention_prep.py --timeline > "$OUT/timeline.log" 2>&1
OUT="$OUT/b" bash benchmarks/gpu_bench_tasks.sh "attention_fwd_bwd attention_bwd eager 110" \
  "attention_fwd_bwd_causal attention_bwd eager 110" > "$OUT/bench.log" 2>&1
tail -3 "$OUT/tests.log"; grep -v "^\[" "$OUT/sweep.log" | tail -22; cat "$OUT/timeline.log"; cat "$OUT/bench.log"
