#!/usr/bin/env bash
# One 10-minute H200 command, no training (issue 12, session 11): the tree-attention kernel with the split merge in
# the same launch and the context read without the mask (commit after 6e... see git log), checked, swept and used.
#   1. its CUDA tests (== the SDPA reference, every launch shape of the test file) and, beside them, the batched
#      engine's graph == eager tests;
#   2. the launch sweep at Qwen3-8B heads (B 1 and 8; T 1, 17, 33, 65, 129) and at the `gpu` pair's heads (8 / 4,
#      head dim 64, context 256, 12 layers: 8 target + 4 drafter), to refit `launch_rule` now that splits cost no
#      second launch;
#   3. the 8B cost model with the rule as committed (per stage and per kernel; session 10: ddtree(64) 1.34x floor,
#      tree attention 17.8 us a call at 65 query tokens).
#   tar xzf .triton_cache.tgz; OUT=/tmp/s11b bash benchmarks/engine/h200_s11_b.sh   (limits: env T_TEST, T_SWEEP, T_COST)
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD/src" PYTHONUNBUFFERED=1 TRITON_CACHE_DIR="$PWD/.triton_cache"
OUT=${OUT:-results/h200_s11_b}; R="$OUT/b"; mkdir -p "$R"
python3 benchmarks/versions.py torch transformers triton > "$R/versions.txt" 2>&1
timeout -k 5 "${T_TEST:-150}" python3 -m pytest -q -p no:cacheprovider tests/engine/test_batched.py -k cuda \
    > "$R/tests_batched.txt" 2>&1 &
timeout -k 5 "${T_TEST:-150}" python3 -m pytest -q -p no:cacheprovider tests/engine/test_triton_attention.py \
    > "$R/tests_attention.txt" 2>&1
echo "attention tests rc=$?"; tail -3 "$R/tests_attention.txt"
wait
echo "batched tests done"; tail -3 "$R/tests_batched.txt"
timeout -k 5 "${T_SWEEP:-140}" python3 benchmarks/attention_launch_sweep.py --grid medium --block-n 64,128 \
    --widths 129,65,33,17,1 --batch-sizes 1,8 --deadline-s "$(( ${T_SWEEP:-140} - 40 ))" \
    --json-out "$R/sweep_8b.json" > "$R/sweep_8b.txt" 2>&1
echo "sweep 8B rc=$?"; grep -E "^B=.*default|^ *\(" "$R/sweep_8b.txt" | head -30
timeout -k 5 "${T_SWEEP2:-90}" python3 benchmarks/attention_launch_sweep.py --grid medium --block-n 64,128 \
    --heads 8 --kv-heads 4 --head-dim 64 --context 256 --capacity 1616 --layers 12 \
    --widths 65,33,17,1 --batch-sizes 1,8 --deadline-s "$(( ${T_SWEEP2:-90} - 30 ))" \
    --json-out "$R/sweep_gpu.json" > "$R/sweep_gpu.txt" 2>&1
echo "sweep gpu rc=$?"; grep -E "^B=.*default|^ *\(" "$R/sweep_gpu.txt" | head -30
timeout -k 5 "${T_COST:-180}" python3 -m ddtree.cli bench engine --random-weights qwen3-8b --budgets 16,32,64 \
    --batch-sizes 1,8 --rounds 30 --tau 6.58,10.73 --profile-kernels 12 \
    --json-out "$R/cost_8b.json" > "$R/cost_8b.txt" 2>&1
echo "cost 8B rc=$?"; grep -A14 "^attention  B" "$R/cost_8b.txt"
tar czf "$OUT/b.tgz" -C "$OUT" b && rm -rf "$R"
