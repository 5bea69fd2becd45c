# Sourced by the device scripts from session 20 on, from the repository root: $OUT and the compile-cache folder, the
# server's wheels (.whl, carried) installed into /tmp/site once a machine, the package and the wheels on the path,
# and the Triton / Inductor caches under /tmp/compile_cache (kept by a warm machine between calls).
mkdir -p "$OUT" /tmp/compile_cache
if [ -d .whl ] && [ ! -d /tmp/site/fastapi ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
fi
export PYTHONPATH="$PWD/src:/tmp/site" PYTHONUNBUFFERED=1
export TRITON_CACHE_DIR=/tmp/compile_cache/triton TORCHINDUCTOR_CACHE_DIR=/tmp/compile_cache/inductor
