#!/usr/bin/env bash
# Issue 10 on a machine with two H200s (kind nvidia-h200-x2): `crucible batch` with the tuner over 8 seeded tasks,
# once on one GPU (--gpus 1: one task at a time) and once with one task per GPU (--gpus 2: two at a time), each into its own archive; then
# benchmarks/batch_scaling.py: verified candidates per minute per GPU, the scaling, candidates evaluated twice or lost.
#   GPUS=1 bash benchmarks/gpu_batch_scaling.sh; GPUS=2 bash benchmarks/gpu_batch_scaling.sh
#   (repo root, .whl carried; BUDGET=4 proposals a task; each config ~4-7 min, so one device call each; the
#   analysis runs once both archives exist, here or on the machine the files were fetched to)
set -uo pipefail
OUT=${OUT:-runs/gpu-batch-scaling}; mkdir -p "$OUT"
BUDGET=${BUDGET:-4}
GPUS=${GPUS:-1 2}
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 COLUMNS=${COLUMNS:-160}
DIR=$(mktemp -d)
for t in rmsnorm_fwd softmax_fwd layernorm_fwd swiglu_fwd geglu_fwd geglu_erf_fwd rope_fwd rmsnorm_residual_fwd; do
  cp "tasks/$t.py" "$DIR/"
done
nvidia-smi -L
for g in $GPUS; do
  echo "=== $(date +%T) crucible batch, --gpus $g, budget $BUDGET"
  timeout 540 python3 -m agent.cli batch "$DIR" --device cuda --gpus "$g" --budget "$BUDGET" \
    --final-baselines eager --archive "$OUT/gpus$g.db" --json-out "$OUT/gpus$g.json" > "$OUT/gpus$g.log" 2>&1
  echo "rc=$?"; tail -14 "$OUT/gpus$g.log"
done
[ -f "$OUT/gpus1.json" ] && [ -f "$OUT/gpus2.json" ] && python3 benchmarks/batch_scaling.py "$OUT/gpus1.db" "$OUT/gpus1.json" "$OUT/gpus2.db" "$OUT/gpus2.json" --gpus 2 \
  --out "$OUT/scaling.json"
