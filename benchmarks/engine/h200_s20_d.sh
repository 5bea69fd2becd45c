#!/usr/bin/env bash
# Session 20, fourth GPU command (~8 minutes of device time left): the tree temperature (sampled rows' trees built on
# the draft logits divided by 1 + T, `core.build_sampling.tree_logit_scale`) against the raw trees
# (`DDTREE_RAW_SAMPLED_TREES=1`, the code before it) on the `gpu` pair, in the engine at batch 1, T = 0.5 and 1,
# budgets 32 and 64, 128 new tokens: new, raw, new. The pair is trained for 2.6 minutes only (the device time left);
# beside its training, a cost-model run fills the compile caches.
#   OUT=$OUT bash benchmarks/engine/h200_s20_d.sh      (carry nothing)
set -uo pipefail
cd "$(dirname "$0")/../.."
source benchmarks/engine/device_env.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/versions.txt"
(timeout 180 python3 -m ddtree.cli bench engine --random-weights gpu-pair --budgets 32,64 --batch-sizes 1 \
    --rounds 5 > "$OUT/precompile.txt" 2>&1; echo "precompile rc=$?" >> "$OUT/precompile.txt") &
OUT=/tmp/train_out timeout -k 5 220 python3 benchmarks/gpu_pair/train_and_eval.py --pair-dir /tmp/gpu-pair \
    --eval-prompts 0 --max-minutes 2.6 > /tmp/train.log 2>&1
echo "train rc=$?"; cat /tmp/train_out/table.txt > "$OUT/train.txt" 2>/dev/null; cat "$OUT/train.txt"
wait; tail -1 "$OUT/precompile.txt"
i=0
for side in new raw new; do
    i=$((i + 1))
    [ $((${END_S:-570} - SECONDS)) -lt 40 ] && { echo "== $side (run $i): no time left"; continue; }
    raw=0; [ $side = raw ] && raw=1
    DDTREE_RAW_SAMPLED_TREES=$raw timeout 60 python3 -m ddtree.cli bench engine --model /tmp/gpu-pair \
        --num-prompts 12 --max-new-tokens 128 --methods dflash,ddtree --budgets 32,64 --temperatures 0.5,1 \
        --warmup-seconds 3 > "$OUT/engine_${i}_$side.txt" 2>&1
    echo "== $side (run $i) rc=$?"; grep -E "^ *(dflash|ddtree) " "$OUT/engine_${i}_$side.txt"
done
true
