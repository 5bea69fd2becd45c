#!/usr/bin/env bash
# The CPU engine, old vs new, on the shipped default pair (issue 12: "CPU: nothing slower than today").
# Old = the Hugging Face engine as it was before the batched engine (the parent of c10099a), new = this checkout;
# the README's engine command for each, interleaved old, new, new, old so drift of the machine hits both alike.
#   [OLD_REV=<rev>] bash benchmarks/engine/cpu_old_vs_new.sh [OUT_DIR]      (about 10 minutes on 2 cores; OLD_REV
#   defaults to the parent of c10099a)
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:-results/cpu_old_vs_new}; mkdir -p "$OUT"
OLD=$(mktemp -d); trap 'rm -rf "$OLD"' EXIT
git archive "${OLD_REV:-c10099a^}" src | tar -x -C "$OLD"
PAIR=src/ddtree/models/embedded/small-seed0
bench() {  # $1 = old|new, $2 = pass number
    src=$PWD/src; [ "$1" = old ] && src=$OLD/src
    PYTHONPATH=$src python3 -m ddtree.cli bench engine --model "$PAIR" --num-prompts 16 --max-new-tokens 128 \
        --budgets 4,16,32,64 --temperatures 0,1 --threads 1 --no-progress \
        --json-out "$OUT/$1_$2.json" > "$OUT/$1_$2.txt" 2>&1
    echo "$1 pass $2:"; grep -E "^ *(method|ar|dflash|ddtree) " "$OUT/$1_$2.txt" || tail -5 "$OUT/$1_$2.txt"
}
bench old 1; bench new 1; bench new 2; bench old 2
python3 benchmarks/engine/compare_engine_runs.py "$OUT"/old_*.json -- "$OUT"/new_*.json | tee "$OUT/compare.txt"
