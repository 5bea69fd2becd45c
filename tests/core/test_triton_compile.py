"""The Triton kernels compile for an H100/H200 (sm_90) without a GPU: Triton's front end, its MLIR passes and
the bundled ptxas run on the CPU. The interpreter (test_triton_build.py) checks what the kernels compute but
not what the compiler accepts: e.g. a name bound to tensors of two shapes in the branches of a runtime `if`
runs under the interpreter and is a compile error on the GPU. Skips without triton (CI has none)."""

from __future__ import annotations

import inspect
import os

import pytest

triton = pytest.importorskip("triton")
pytestmark = pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET", "") == "1", reason="under TRITON_INTERPRET=1 the kernels are not compiled"
)

from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from ddtree.core import triton_build as tk  # noqa: E402

SM90 = GPUTarget("cuda", 90, 32)


def compile_sm90(kernel, types: dict[str, str], constexprs: dict[str, object], num_warps: int = 8):
    """Compile `kernel` to a cubin for sm_90: types maps every runtime argument to its Triton type string."""
    names = list(inspect.signature(kernel.fn).parameters)
    defaults = {n: p.default for n, p in inspect.signature(kernel.fn).parameters.items()}
    consts = {n: (constexprs[n] if n in constexprs else defaults[n]) for n in names if n not in types}
    signature = {n: ("constexpr" if n in consts else types[n]) for n in names}
    return triton.compile(ASTSource(fn=kernel, signature=signature, constexprs=consts), target=SM90,
                          options={"num_warps": num_warps})


STATS_TYPES = dict(
    x_ptr="*bf16", max_ptr="*fp32", sum_ptr="*fp32", min_ptr="*fp32", V="i32", stride_row="i32", num_splits="i32",
    gmax_ptr="*fp32", num_groups="i32", x_addr_ptr="*i64",
)


@pytest.mark.parametrize(
    "constexprs",
    [
        dict(SPLIT_LEN=38912, BLOCK=2048),  # row_lse_and_min
        dict(SPLIT_LEN=38912, BLOCK=2048, GMAX=True, GROUP=64, INDIRECT=True),  # the select step
        dict(SPLIT_LEN=38912, BLOCK=2048, GMAX=True, GROUP=64, INDIRECT=False),
    ],
)
def test_statistics_kernel_compiles_for_sm90(constexprs: dict) -> None:
    assert compile_sm90(tk._split_stats_kernel, STATS_TYPES, constexprs).asm["cubin"]


SELECT_TYPES = dict(
    x_ptr="*bf16", stride_row="i32", V="i32", gmax_ptr="*fp32", G="i32", part_max_ptr="*fp32",
    part_sum_ptr="*fp32", part_min_ptr="*fp32", S="i32", vals_ptr="*fp32", ids_ptr="*i64", lse_ptr="*fp32",
    min_ptr="*fp32", bad_ptr="*i8", gid_scratch_ptr="*i32", key_scratch_ptr="*i32", id_scratch_ptr="*i32",
    x_addr_ptr="*i64",
)


@pytest.mark.parametrize("k, k_pad, cap", [(16, 16, 16), (128, 128, 512), (256, 256, 1024)])
@pytest.mark.parametrize("indirect", [False, True])
def test_select_kernel_compiles_for_sm90(k: int, k_pad: int, cap: int, indirect: bool) -> None:
    constexprs = dict(K=k, K_PAD=k_pad, CAP=cap, G_PAD=4096, S_PAD=4, GROUP=64, CH=tk.GROUPED_SELECT_CHUNK,
                      INDIRECT=indirect)
    assert compile_sm90(tk._grouped_select_kernel, SELECT_TYPES, constexprs).asm["cubin"]
