#!/usr/bin/env bash
# For the session after 12 (issue 12), first H200 command: session 12's last changes have not run on a GPU:
# the commit's bookkeeping as one Triton launch (`triton_round.commit_rows`), overlapped rounds (round R + 1
# enqueued before round R is read) and the overlapped admission (pinned prefill inputs, the first token read with
# the next round). CUDA tests beside the pair's training, then the pair in the engine at batch 1 and the 8B cost
# model, each with overlapped rounds (the default) and without (DDTREE_NO_OVERLAP=1), in the same process order.
#   tar xzf .triton_cache.tgz; OUT=$OUT bash benchmarks/engine/h200_s13_a.sh      (carry .triton_cache.tgz)
# then, on the warm machine (the trained pair in /tmp/gpu-pair): OUT=$OUT bash benchmarks/engine/h200_s13_b.sh
# Fits the 600 s a command may run: training 330 s beside the tests, then 2 x (70 + 55) s.
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD/src" TRITON_CACHE_DIR="$PWD/.triton_cache" PYTHONUNBUFFERED=1
mkdir -p "$OUT"
(timeout 300 python3 -m pytest -q -p no:cacheprovider tests/engine/test_triton_round.py \
    tests/engine/test_batched.py tests/engine/test_scheduler.py -k "cuda or round_kernels or equals_torch" > "$OUT/tests.txt" 2>&1
 echo "tests rc=$?" >> "$OUT/tests.txt") &
timeout -k 5 330 python3 benchmarks/gpu_pair/train_and_eval.py --pair-dir /tmp/gpu-pair --eval-prompts 0 \
    --max-minutes 5.3 > "$OUT/train.log" 2>&1
echo "train rc=$?"; grep -E "^pair|target :|drafter:" "$OUT/train.log"
wait
tail -3 "$OUT/tests.txt"
for mode in overlap sync; do
    [ "$mode" = sync ] && export DDTREE_NO_OVERLAP=1
    timeout -k 5 70 python3 -m ddtree.cli bench engine --model /tmp/gpu-pair --num-prompts 12 --max-new-tokens 128 \
        --budgets 32,64 --temperatures 0,1 --warmup-seconds 5 --no-progress --json-out "$OUT/pair_engine_$mode.json" \
        > "$OUT/pair_engine_$mode.txt" 2>&1
    echo "engine $mode rc=$?"; grep -E "^ *(ar|dflash|ddtree) " "$OUT/pair_engine_$mode.txt"
    timeout -k 5 55 python3 -m ddtree.cli bench engine --random-weights qwen3-8b --budgets 64 --batch-sizes 1 \
        --rounds 30 --tau 6.58,10.73 --json-out "$OUT/cost_8b_$mode.json" > "$OUT/cost_8b_$mode.txt" 2>&1
    echo "cost 8b $mode rc=$?"; grep -E "^triton" "$OUT/cost_8b_$mode.txt"
done
gzip -f "$OUT/train.log"
