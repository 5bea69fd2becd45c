#!/usr/bin/env bash
# Session 18, third GPU command (the session's last ~6 minutes of device time): a request's cost beyond its rounds
# with finishes spread out as the server's arrivals are (`churn_cost.py --spread 0.5`: call A's closed loop finished
# whole waves in one round, which the loop reads before launching the next, so its host work went unhidden), with the
# churn loop's phases and top kernels; then where the 8B shape's draft goes at batch 1 and 8 (4.59 ms at batch 8
# in call A) with kernel lists.
#   OUT=$OUT bash benchmarks/engine/h200_s18_c.sh      (carry compile_cache.tgz)
set -uo pipefail
cd "$(dirname "$0")/../.."
mkdir -p "$OUT" /tmp/compile_cache
[ -f compile_cache.tgz ] && [ ! -d /tmp/compile_cache/triton ] && tar xzf compile_cache.tgz -C /tmp/compile_cache
export PYTHONPATH="$PWD/src" PYTHONUNBUFFERED=1
export TRITON_CACHE_DIR=/tmp/compile_cache/triton TORCHINDUCTOR_CACHE_DIR=/tmp/compile_cache/inductor
timeout 100 python3 benchmarks/engine/churn_cost.py --configs dflash:15,ddtree:32 --new-tokens 20 --spread 0.5 \
    --prompt-tokens 80 --rounds 400 --top 15 > "$OUT/churn_spread.txt" 2>&1
echo "churn rc=$?"; grep -E "new tokens|^ *(dflash|ddtree) +[0-9]" "$OUT/churn_spread.txt"
timeout $((200 - SECONDS)) python3 -m ddtree.cli bench engine --random-weights qwen3-8b --methods dflash \
    --batch-sizes 1,8 --rounds 20 --profile-kernels 14 > "$OUT/draft_8b.txt" 2>&1
echo "8B rc=$?"; grep -E "^triton B=" "$OUT/draft_8b.txt"
