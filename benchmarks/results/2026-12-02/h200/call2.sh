#!/usr/bin/env bash
# Second H200 call (torch.compile pointwise fusion) of the CUDA-graph engine: CUDA tests of the batched engine, then the 8B cost model.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
nvidia-smi --query-gpu=name,memory.used,clocks.sm,clocks.max.sm --format=csv
python -c "import torch, transformers, triton; print(torch.__version__, transformers.__version__, triton.__version__)"
timeout 200 python -m pytest -q -x tests/engine/test_batched.py -k cuda -p no:cacheprovider 2>&1 | tail -25
timeout 330 python -m ddtree.cli bench engine --random-weights qwen3-8b --budgets 16,64,128,256 --batch-sizes 1,8 \
  --rounds 30 --tau 6.58,10.73 --json-out $OUT/cost_8b.json 2>&1 | tee $OUT/cost_8b.txt
