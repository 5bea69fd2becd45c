#!/usr/bin/env bash
# Tree-build check on one GPU (issue 2's build target): one-read lse + min + group maxima (Triton), then the
# Triton select step (exact top-k from the group maxima, one program per row), the Triton beam up to width 256
# and the one-kernel tree assembly, under the alias CUDA graph (no static input copy).
#
#   PYTHONPATH=/tmp/site:src OUT=/some/dir benchmarks/gpu_build_check.sh          # H200, < 4 minutes
#   PYTHONPATH=/tmp/tritonlib:src benchmarks/gpu_build_check.sh --smoke            # CPU, Triton interpreter
#
# Steps (each under its own time limit; the script goes on after a failure and exits 1 if any step failed):
#   1. compile check at the real shape: the statistics kernel's time; first-
#      call (compile) time and time of the select step (two chunk sizes), the runtime-loop Triton
#      beam and the tree assembly at widths 128 and 256; select top-k == exact reference, lse close to
#      row_lse_and_min, Triton tail == torch tail. The widest beam that compiled and agreed is used below; if the wider ones fail or
#      time out, DDTREE_TRITON_BEAM_MAX_WIDTH is lowered so that those widths use the torch beam.
#   2. the CUDA tests of tests/core/test_build.py (-k cuda) and tests/core/test_triton_kernels.py (without the
#      opt-in radix-select "fused" tests, whose per-shape compiles made the previous run hit its limit).
#   3. ddtree bench core --check over B 1,8,64 x budget 32,128,256 (no verify) + breakdown at 64,128,
#      JSON in $OUT/build_check.json; then B 64,32 x budget 128,256 with verify ($OUT/build_verify_check.json);
#      with BUFFER_MODES=1 also benchmarks/build_buffer_modes.py (the steps' limits then exceed one 10-minute call:
#      lower them or run the pytest step separately). Logs of every step in $OUT/*.log.
set -u
cd "$(dirname "$0")/.."
. benchmarks/check_common.sh
check_setup /tmp/ddtree_build_check "${1:-}"
if [ "$SMOKE" = 1 ]; then
    LIMITS=(120 240 120)
else
    LIMITS=(100 180 120 100)
fi

echo "=== $(date -u +%FT%TZ) smoke=$SMOKE PYTHONPATH=$PYTHONPATH OUT=$OUT"
$PY -c "import torch, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.cuda.is_available())"
$PY -c "import triton; print('triton', triton.__version__)" || echo "triton not importable"

# ---- 1. compile time and agreement of the kernels, one width at a time ----------------------------------
rm -f "$OUT/beam_ok_width"
step compile_check "${LIMITS[0]}" $PY - <<'PY'
import os
import statistics
import time

import torch

from ddtree.core import build
from ddtree.core.triton_kernels import (
    GROUPED_SELECT_CHUNK, beam_search, grouped_vocab_topk, row_lse_and_min, row_lse_min_groupmax, tree_from_beam,
)

smoke = os.environ["SMOKE"] == "1"
dev = torch.device("cpu" if smoke else "cuda")
b, d, v = (2, 3, 5003) if smoke else (64, 15, 151_936)
widths = (16, 32) if smoke else (128, 256)  # widths <= 64 (unrolled, measured before) run in steps 2, 3
gen = torch.Generator(device=dev).manual_seed(0)
x = (torch.randn((b * d, v), generator=gen, device=dev) * 3).to(torch.bfloat16)  # [R, V]
x[::3] = x[::3].round()  # exact ties, also across groups and at the k-th position


def sync():
    if dev.type == "cuda":
        torch.cuda.synchronize()


def first_call(name, fn):
    start = time.perf_counter()
    out = fn()
    sync()
    print(f"{name}: first call (compile + run) {time.perf_counter() - start:.1f} s", flush=True)
    return out


def median_ms(fn, repeats=20):
    if smoke:
        return float("nan")
    fn()
    times = []
    for _ in range(repeats):
        sync()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        sync()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


if not smoke:
    print(f"select step usable (probe): {build._select_usable(x, widths[0])}", flush=True)
    ms = median_ms(lambda: row_lse_min_groupmax(x, group=build.GROUP))
    print(f"one-read statistics: {ms:.3f} ms (eager, includes the torch merge)")
ref_lse, _ = row_lse_and_min(x)
slot = torch.arange(v, device=dev).expand(b * d, -1)
for w in widths:
    ref_ids = build._descending_key(x.float(), slot).topk(w, dim=-1).indices
    for chunk in (GROUPED_SELECT_CHUNK, 2 * GROUPED_SELECT_CHUNK):
        logq, ids, lse, _, bad = first_call(f"select step k={w} chunk={chunk}",
                                            lambda: grouped_vocab_topk(x, w, chunk=chunk))
        same_step = torch.equal(ids, ref_ids) and torch.equal(logq, x.float().gather(1, ref_ids) - lse[:, None])
        close = torch.allclose(lse, ref_lse, rtol=1e-6, atol=1e-6)
        ms = median_ms(lambda: grouped_vocab_topk(x, w, chunk=chunk))
        print(f"  exact top-k: {same_step}, lse close: {close}, flags: {int(bad.sum())}, {ms:.3f} ms", flush=True)
        if not (same_step and close) or bool(bad.any()):
            raise SystemExit(1)
    logq, ids = logq.view(b, d, w), ids.view(b, d, w)
    js, rs, low = build._candidate_pairs(w, w, dev)
    beam = first_call(f"beam_search width={w} ({js.numel()} candidates)", lambda: beam_search(logq, ids, js, rs, w))
    tree = first_call(f"tree_from_beam budget={w}", lambda: tree_from_beam(*beam, w))
    ref_beam = build._beam_torch(logq, ids, js, rs, low, w)
    same = all(torch.equal(p, q) for p, q in zip(beam, ref_beam))
    same = same and all(torch.equal(p, q) for p, q in zip(tree, build._tree_from_beam_torch(*ref_beam, w)))
    print(f"  triton tail == torch tail: {same}; beam {median_ms(lambda: beam_search(logq, ids, js, rs, w)):.3f} ms,"
          f" tree {median_ms(lambda: tree_from_beam(*beam, w)):.3f} ms", flush=True)
    if not same:
        raise SystemExit(1)
    with open(os.path.join(os.environ["OUT"], "beam_ok_width"), "w") as f:
        f.write(str(w))
PY
ok_width=$(cat "$OUT/beam_ok_width" 2>/dev/null || echo 0)
if [ "$SMOKE" = 0 ] && [ "$ok_width" -lt 256 ]; then
    export DDTREE_TRITON_BEAM_MAX_WIDTH=$(( ok_width > 64 ? ok_width : 64 ))
    echo "=== Triton beam checked only up to width $ok_width: DDTREE_TRITON_BEAM_MAX_WIDTH=$DDTREE_TRITON_BEAM_MAX_WIDTH"
fi

# ---- 2. tests ------------------------------------------------------------------------------------------
if [ "$SMOKE" = 1 ]; then  # no CUDA: the interpreter runs the kernel tests (the CUDA ones skip)
    step pytest "${LIMITS[1]}" $PY -m pytest -q -rs tests/core/test_triton_kernels.py -k "not fused"
else
    step pytest "${LIMITS[1]}" $PY -m pytest -v --tb=line -rs tests/core/test_build.py tests/core/test_triton_kernels.py \
        -k "(test_build and cuda) or (test_triton_kernels and not fused)"
fi

# ---- 3. benchmark table ----------------------------------------------------------------------------------
if [ "$SMOKE" = 1 ]; then
    step bench "${LIMITS[2]}" $PY -m ddtree.cli bench core --device cpu --vocab 512 --batch-sizes 1,2 \
        --budgets 8,32 --no-verify --check --breakdown 2,32 --repeats 1 --warmup 0 --json-out "$OUT/build_check.json"
else
    step bench "${LIMITS[2]}" $PY -m ddtree.cli bench core --check --batch-sizes 1,8,64 --budgets 32,128,256 \
        --no-verify --breakdown 64,128 --json-out "$OUT/build_check.json"
    step bench_verify "${LIMITS[3]}" $PY -m ddtree.cli bench core --check --batch-sizes 64,32 --budgets 128,256 \
        --json-out "$OUT/build_verify_check.json"
    if [ "${BUFFER_MODES:-0}" = 1 ]; then  # fresh vs repeated buffers, indirect graph vs DDTREE_NO_INDIRECT_GRAPH=1
        step buffer_modes 90 $PY benchmarks/build_buffer_modes.py --json-out "$OUT/build_buffer_modes.json"
    fi
fi
echo "=== done $(date -u +%FT%TZ): status=$status (0 = every step passed)"
exit $status
