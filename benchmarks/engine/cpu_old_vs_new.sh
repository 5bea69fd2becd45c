#!/usr/bin/env bash
# The CPU engine, old vs new, on the shipped default pair (issue 12: "CPU: nothing slower than today"), as interleaved
# old/new pairs of single generations (`cpu_ab.py`: whole passes one after another drifted by up to 1.7x here).
# Old = the Hugging Face engine before the batched engine (the parent of c10099a) unless OLD_REV names another.
#   [OLD_REV=<rev>] [PAIRS=24] bash benchmarks/engine/cpu_old_vs_new.sh [OUT_DIR]      (about 3 minutes on 2 cores)
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:-results/cpu_old_vs_new}; mkdir -p "$OUT"
OLD=$(mktemp -d); trap 'rm -rf "$OLD"' EXIT
git archive "${OLD_REV:-c10099a^}" src | tar -x -C "$OLD"
python3 benchmarks/engine/cpu_ab.py --old "$OLD/src" --new src --pairs "${PAIRS:-24}" --json-out "$OUT/ab.json" \
    | tee "$OUT/ab.txt"
