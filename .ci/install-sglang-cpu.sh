#!/usr/bin/env bash
# Install sglang==0.5.23 on a CPU-only host without its CUDA-only dependencies (../shared/notes/sglang-0.5.23.md §1):
# the pinned torch 2.14.1 + torchvision 0.29.1 (they import on a GPU-less host), then the wheel with --no-deps and
# the packages its import tiers A (registry, server args), B (workers, scheduler, launch_server) and C (http_server)
# need. Used by .ci/run before the README's test command; the sglang tests skip where this was not run.
set -euo pipefail
pip() { python -m pip install -q "$@"; }
pip torch==2.14.1 torchvision==0.29.1
pip --no-deps sglang==0.5.23
pip triton==3.8.0 numpy==2.4.6 orjson==3.13.0 psutil==7.2.2 pybase64==1.5.1 requests==2.34.2 \
    pillow==13.0.0 starlette==1.10.0 msgspec==0.23.0 pydantic==2.14.4 pyzmq==27.3.0 tqdm==4.70.1 \
    ipython==9.18.1 aiohttp==3.14.5
pip apache-tvm-ffi==0.1.11 transformers==5.19.0 dill==0.4.1 sentencepiece==0.2.1 loguru==0.7.3 gguf==0.19.0 \
    openai==2.8.0 partial_json_parser einops==0.8.2 setproctitle==1.3.8 uvicorn==0.54.0 fastapi==0.165.0
pip --no-deps compressed-tensors==0.18.0 xgrammar==0.2.7
pip uvloop==0.23.0 jsonschema==4.26.0 soundfile==0.13.1 python-multipart==0.0.34
# sglang.bench_serving imports `datasets` (for datasets it downloads; the tests use local files only)
pip --no-deps datasets==5.2.0 xxhash==4.1.0 multiprocess==0.70.19
python - <<'PY'
import sglang, torch, torchvision, transformers
print(f"sglang {sglang.__version__} on torch {torch.__version__}, torchvision {torchvision.__version__}, "
      f"transformers {transformers.__version__}")
PY
