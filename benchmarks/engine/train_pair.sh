# Sourced by device scripts from session 25 on, after device_env.sh: trains the `gpu` pair into /tmp/gpu-pair
# (TRAIN_MINUTES, default 4) with the engine's CUDA tests running beside it (TESTS_S, default 280), and writes
# $OUT/versions.txt, $OUT/train.txt and $OUT/cuda_tests.txt.
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/versions.txt"
(timeout ${TESTS_S:-280} python3 -m pytest -q tests/engine/test_batched.py tests/engine/test_scheduler.py -k "cuda" \
    > "$OUT/cuda_tests.txt" 2>&1; echo "cuda tests rc=$?" >> "$OUT/cuda_tests.txt") &
train_minutes=${TRAIN_MINUTES:-4}
OUT=/tmp/train_out timeout -k 5 $((train_minutes * 60 + 60)) python3 benchmarks/gpu_pair/train_and_eval.py \
    --pair-dir /tmp/gpu-pair --eval-prompts 0 --max-minutes "$train_minutes" > /tmp/train.log 2>&1
echo "train rc=$?"; cat /tmp/train_out/table.txt > "$OUT/train.txt" 2>/dev/null; cat "$OUT/train.txt"
wait; grep -E "^FAILED" "$OUT/cuda_tests.txt"; tail -2 "$OUT/cuda_tests.txt"
