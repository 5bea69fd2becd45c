#!/usr/bin/env bash
# Device call C (one H200, right after B on the same warm machine): the server's throughput against
# concurrency on the `gpu` pair, then the old-vs-new core check of issue 15 (old tree carried in .old_core/).
# Limits (seconds, env-overridable) sum to 550 (+10 / +5 s kill grace), inside one 600 s device command.
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD/src" PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
OUT=${OUT:-results/h200_call_c}; mkdir -p "$OUT"
if [ -d /tmp/gpu-pair/target ]; then
    OUT="$OUT/sweep" timeout -k 10 "${T_SWEEP:-300}" python3 benchmarks/gpu_pair/serve_sweep.py --pair /tmp/gpu-pair \
        > "$OUT/sweep.log" 2>&1
    echo "sweep rc=$?"; grep -v "throughput c=" "$OUT/sweep.log" | tail -16
else
    echo "no /tmp/gpu-pair: the sweep needs call B on this machine"
fi
if [ -d .old_core/src/ddtree ]; then
    OLD_SRC=.old_core/src timeout -k 5 "${T_CORE:-250}" python3 benchmarks/core_old_vs_new.py --out "$OUT/core" \
        > "$OUT/core_old_vs_new.txt" 2>&1
    echo "core rc=$?"; tail -22 "$OUT/core_old_vs_new.txt"
fi
