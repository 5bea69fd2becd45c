#!/usr/bin/env bash
# Third H200 call: train the gpu pair (benchmarks/gpu_pair), then decode its held-out prompts with the
# CUDA-graph engine (ar, dflash, ddtree at T = 0 and 1) in the time left.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
bash benchmarks/gpu_pair/train_and_eval.sh
left=$((575 - SECONDS))
echo "time left for the engine benchmark: ${left}s"
[ -f /tmp/gpu-pair/prompts/heldout.jsonl ] || ls -R /tmp/gpu-pair | head -20
timeout -k 5 $left python -m ddtree.cli bench engine --model /tmp/gpu-pair --num-prompts 8 --max-new-tokens 128 \
  --budgets 16,32,64,128 --temperatures 0,1 --warmup-seconds 5 --no-progress --json-out $OUT/engine_gpu_pair.json 2>&1 | tail -20
