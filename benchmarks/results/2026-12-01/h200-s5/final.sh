#!/usr/bin/env bash
# Final H200 call of the fifth session: indirect vs copy/alias graph at 64x128 and 64x256, then the issue's
# whole grid with whichever graph mode was faster for fresh buffers at 64x128, then the CUDA build tests.
set -u
export PYTHONPATH=/tmp/site:src
timeout 60 python3 benchmarks/build_buffer_modes.py --cells 64x128,64x256 --json-out $OUT/buffer_modes.json | tee $OUT/buffer_modes.txt
mode=$(python3 -c "import json; r = json.load(open('$OUT/buffer_modes.json'))['rows'][0]; print('indirect' if r['indirect_fresh_ms'] <= r['copy_or_alias_fresh_ms'] else 'copy')")
echo "grid graph mode: $mode"
if [ "$mode" = copy ]; then export DDTREE_NO_INDIRECT_GRAPH=1; fi
timeout 270 python3 -m ddtree.cli bench core --check --breakdown 64,128 --json-out $OUT/core_full_grid.json > $OUT/core_full_grid.txt 2>&1
echo "grid rc=$?"; grep -v Warning $OUT/core_full_grid.txt | tail -40
unset DDTREE_NO_INDIRECT_GRAPH
timeout 70 python3 -m pytest -q --tb=line -p no:cacheprovider tests/core/test_build.py -k cuda > $OUT/pytest_build_cuda.txt 2>&1
echo "pytest rc=$?"; tail -5 $OUT/pytest_build_cuda.txt
