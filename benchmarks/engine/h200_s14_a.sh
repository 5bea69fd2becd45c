#!/usr/bin/env bash
# Session 14, second H200 command after the fix (batched.py `_refresh`): the 31 CUDA tests of h200_s13_a.sh
# beside a shorter training of the pair (2 minutes: the same pair for both modes; the issue's pair figures
# need the full 5.3-minute pair), then the pair in the engine with overlapped rounds and without
# (DDTREE_NO_OVERLAP=1). A run past 70 s dumps its threads' stacks (SIGABRT + faulthandler; the session's run
# used faulthandler.dump_traceback_later inline, the same dump). With a cold Triton cache the build kernels'
# compiles alone ran past 70 s: the session re-ran the engine on the warm machine (the results README).
#   tar xzf .triton_cache.tgz; OUT=$OUT bash benchmarks/engine/h200_s14_a.sh      (carry .triton_cache.tgz)
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD/src" TRITON_CACHE_DIR="$PWD/.triton_cache" PYTHONUNBUFFERED=1
mkdir -p "$OUT"
(timeout 300 python3 -m pytest -q -p no:cacheprovider tests/engine/test_triton_round.py \
    tests/engine/test_batched.py tests/engine/test_scheduler.py -k "cuda or round_kernels or equals_torch" > "$OUT/tests.txt" 2>&1
 echo "tests rc=$?" >> "$OUT/tests.txt") &
timeout -k 5 170 python3 benchmarks/gpu_pair/train_and_eval.py --pair-dir /tmp/gpu-pair --eval-prompts 0 \
    --max-minutes 2.0 > /tmp/train.log 2>&1
echo "train rc=$?"; grep -E "^pair|target :|drafter:" /tmp/train.log
wait
grep -E "passed|failed|FAILED|Error" "$OUT/tests.txt" | tail -8; tail -1 "$OUT/tests.txt"
for mode in overlap sync; do
    [ "$mode" = sync ] && export DDTREE_NO_OVERLAP=1
    PYTHONFAULTHANDLER=1 timeout -s ABRT -k 5 70 python3 -m ddtree.cli bench engine --model /tmp/gpu-pair \
        --num-prompts 12 --max-new-tokens 128 --budgets 32,64 --temperatures 0,1 --warmup-seconds 5 --no-progress \
        --json-out "$OUT/pair_engine_$mode.json" > "$OUT/pair_engine_$mode.txt" 2>&1
    echo "engine $mode rc=$?"; grep -E "^ *(ar|dflash|ddtree) |^pass" "$OUT/pair_engine_$mode.txt" || tail -30 "$OUT/pair_engine_$mode.txt"
done
