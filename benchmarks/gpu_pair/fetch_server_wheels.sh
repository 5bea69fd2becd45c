#!/usr/bin/env bash
# Download (here, where PyPI is reachable) the server's packages that the H200 image lacks, as Python 3.12
# x86-64 wheels into .whl/ (git-ignored; fastapi 0.165 imports opentelemetry-api at start). A device call then carries .whl and installs them first (see
# h200_pair_sweep_call.sh). The image has anyio, h11, click, httpx and annotated-doc already (device KINDS.md).
set -euo pipefail
cd "$(dirname "$0")/../.."
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
    fastapi==0.165.0 starlette==1.10.0 pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.7.0 \
    typing-inspection==0.4.5 uvicorn==0.54.0 opentelemetry-api==1.45.2 uvloop==0.23.0 httptools==0.9.0
ls .whl
