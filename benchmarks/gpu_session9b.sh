#!/usr/bin/env bash
# Session 9: the fp16 working copies with Triton preparation kernels and the forward's epilogue delta
# (seeds/attention_gluon_train.py): the GPU-only tests of the module, the sweep (bf16 precise, fp16 delta dP / o,
# knobs, the parts' times), then `crucible check --no-timing` on both fwd+bwd tasks for the two fp16 candidates.
#   bash benchmarks/gpu_session9b.sh      (repo root, one H200, .whl carried; about 9 minutes)
set -uo pipefail
OUT=${OUT:-runs/gpu-session9b}; mkdir -p "$OUT"; export OUT
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
CRUCIBLE_TEST_DEVICE=cuda timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_attention_gluon_train.py \
  -k gpu > "$OUT/tests.log" 2>&1; echo "tests rc=$?" >> "$OUT/tests.log"
timeout 230 python3 benchmarks/sweep_attention_train.py --budget 190 > "$OUT/sweep.log" 2>&1
for c in benchmarks/candidates/attention_train_fp16_o.py benchmarks/candidates/attention_train_fp16_dp.py; do
  for task in attention_fwd_bwd attention_fwd_bwd_causal; do
    n=$(basename "$c" .py)_$task
    timeout 60 python3 -m agent.cli check "tasks/$task.py" "$c" --device cuda --no-timing --json > "$OUT/c_$n.json" 2> "$OUT/c_$n.err"
    echo "$c $task rc=$? $(python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(r.get('verdict'), r.get('stage'), r.get('reason'), (r.get('message') or '')[:300])" "$OUT/c_$n.json" 2>&1 | tr '\n' ' ')"
  done
done > "$OUT/checks.log" 2>&1
rm -f "$OUT"/c_*.err
tail -4 "$OUT/tests.log"; grep -E "FAILED|Error" "$OUT/tests.log" | head -8; cat "$OUT/checks.log"
grep -v "^\[" "$OUT/sweep.log" | tail -24; grep "part:" "$OUT/sweep.log"
