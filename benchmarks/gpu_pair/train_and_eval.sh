#!/usr/bin/env bash
# One device command: train the `gpu` pair into /tmp/gpu-pair and measure it (see train_and_eval.py).
#   bash benchmarks/gpu_pair/train_and_eval.sh            # one H200: ~20 s preflight + ~5 min; hard stop 8.2 min
#   bash benchmarks/gpu_pair/train_and_eval.sh --smoke    # CPU only, < 2 min
# Everything printed also goes to $OUT/run.log (preflight: $OUT/preflight/); $OUT/status.json records each
# stage as it is reached, so a kill still leaves the stages done.
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
OUT=${OUT:-results/gpu_pair}; export OUT; mkdir -p "$OUT"
if [ "${1:-}" = "--smoke" ]; then
    python3 benchmarks/gpu_pair/train_and_eval.py "$@" --pair-dir /tmp/gpu-pair-smoke 2>&1 | tee "$OUT/run.log"
    exit "${PIPESTATUS[0]}"
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$OUT/env.txt" 2>&1
# Preflight: every CUDA code path of the trainer and the evaluation on the scaled-down preset, so that a
# failure costs seconds, not the 5-minute run.
mkdir -p "$OUT/preflight"
OUT="$OUT/preflight" timeout -k 5 90 python3 benchmarks/gpu_pair/train_and_eval.py --smoke --device cuda \
    --pair-dir /tmp/gpu-pair-preflight > "$OUT/preflight/run.log" 2>&1
rc=$?
tail -12 "$OUT/preflight/run.log"
echo "preflight rc=$rc"
[ "$rc" -eq 0 ] || exit "$rc"
# The preset's wall-clock stops end training by 5.5 min at worst (estimate ~4); this limit keeps a slow
# evaluation from reaching the machine's 10-minute kill (what is under $OUT then still comes back).
timeout -k 10 400 python3 benchmarks/gpu_pair/train_and_eval.py "$@" 2>&1 | tee "$OUT/run.log"
rc=${PIPESTATUS[0]}
echo "train_and_eval rc=$rc"
exit "$rc"
