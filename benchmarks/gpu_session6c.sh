#!/usr/bin/env bash
# Session 6's third call (two H200s). GPU 0: the attention backward sweep (sweep_attention_bwd.py: warp-specialised
# precise forward, dQ through atomics, dS as one fp16 operand). GPU 1: the MoE layer sweep with pregather
# (bench_moe.py --layers), then `crucible bench` on the AdamW task at 224M parameters (--set: four tensors of 56M),
# where fixed per-call costs are ~1% of the time, against eager and torch.compile. Logs in $OUT.
#   bash benchmarks/gpu_session6c.sh      (repo root, .whl carried; about 4 minutes)
set -uo pipefail
OUT=${OUT:-runs/gpu-session6c}; mkdir -p "$OUT/attn" "$OUT/moe"; export OUT
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
CUDA_VISIBLE_DEVICES=0 OUT="$OUT/attn" timeout 150 python3 benchmarks/sweep_attention_bwd.py --budget 85 \
  > "$OUT/gpu0.log" 2>&1 &
(
  export CUDA_VISIBLE_DEVICES=1
  OUT="$OUT/moe" timeout 100 python3 benchmarks/bench_moe.py --layers
  n=56000000
  echo; echo "=== $(date +%T) crucible bench tasks/adamw.py seeds/adamw.py --set N0..N3=$n"
  timeout 220 python3 -m agent.cli bench tasks/adamw.py seeds/adamw.py --baselines eager,compile \
    --set N0=$n --set N1=$n --set N2=$n --set N3=$n --json > "$OUT/bench_adamw_224m.json" 2> "$OUT/bench_adamw.err"
  echo "rc=$?"; python3 benchmarks/show_report.py "$OUT/bench_adamw_224m.json" || tail -4 "$OUT/bench_adamw.err"
) > "$OUT/gpu1.log" 2>&1 &
wait
tar czf "$OUT.tgz" -C "$(dirname "$OUT")" "$(basename "$OUT")" 2>/dev/null
cat "$OUT/gpu0.log" "$OUT/gpu1.log"
