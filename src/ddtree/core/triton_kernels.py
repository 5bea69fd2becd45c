"""Triton kernels for the tree builder's vocabulary step (CUDA only; importing needs triton).

`row_lse_and_min(x)` reads bf16/fp16/fp32 logits [R, V] and returns the row logsumexp and row minimum in
float32 without materialising a float copy of the logits (torch's `logsumexp(x.float())` writes and
re-reads a 4-byte copy, and runs max / exp / sum as separate passes). Each row is split over several
programs so that small batches still fill the GPU; the per-split (max, sum-exp) pairs are merged in torch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _split_stats_kernel(
    x_ptr,
    max_ptr,
    sum_ptr,
    min_ptr,
    V,
    stride_row,
    num_splits,
    SPLIT_LEN: tl.constexpr,  # constexpr: a few distinct values per process (one per vocabulary/batch shape)
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    split = tl.program_id(1)
    base = x_ptr + row.to(tl.int64) * stride_row
    start = split * SPLIT_LEN
    stop = tl.minimum(start + SPLIT_LEN, V)
    offs = tl.arange(0, BLOCK)
    # pass 1: max and min over this split (fp32 registers, the logits are read in their own dtype)
    m = tl.full([BLOCK], float("-inf"), tl.float32)
    mn = tl.full([BLOCK], float("inf"), tl.float32)
    for s in range(0, SPLIT_LEN, BLOCK):
        idx = start + s + offs
        msk = idx < stop
        v = tl.load(base + idx, mask=msk, other=float("-inf")).to(tl.float32)
        m = tl.maximum(m, v)
        mn = tl.minimum(mn, tl.where(msk, v, float("inf")))
    split_max = tl.max(m, 0)
    # pass 2: sum of exp(x - max); the split (a few hundred KB at most per program) is mostly still in L2
    acc = tl.zeros([BLOCK], tl.float32)
    for s in range(0, SPLIT_LEN, BLOCK):
        idx = start + s + offs
        msk = idx < stop
        v = tl.load(base + idx, mask=msk, other=float("-inf")).to(tl.float32)
        acc += tl.where(msk, tl.exp(v - split_max), 0.0)
    out = row * num_splits + split
    tl.store(max_ptr + out, split_max)
    tl.store(sum_ptr + out, tl.sum(acc, 0))
    tl.store(min_ptr + out, tl.min(mn, 0))


def _num_splits(rows: int, vocab: int, block: int) -> int:
    # aim for >= ~4 programs per SM-ish (132 SMs on an H200) without splitting below a few blocks
    target_programs = 1024
    splits = max(1, min(target_programs // max(rows, 1), vocab // (4 * block)))
    return max(splits, 1)


def row_lse_and_min(x: torch.Tensor, *, block: int = 2048) -> tuple[torch.Tensor, torch.Tensor]:
    """x: [R, V] CUDA floating tensor (last dim contiguous). Returns (logsumexp [R], min [R]), float32.

    A row holding +inf or nan gives a non-finite logsumexp; a row holding -inf gives min == -inf.
    """
    if x.dim() != 2:
        raise ValueError(f"x must have rank 2, got shape {tuple(x.shape)}")
    if x.stride(1) != 1:
        x = x.contiguous()
    rows, vocab = x.shape
    splits = _num_splits(rows, vocab, block)
    split_len = triton.cdiv(triton.cdiv(vocab, splits), block) * block
    splits = triton.cdiv(vocab, split_len)
    part_max = torch.empty((rows, splits), dtype=torch.float32, device=x.device)  # [R, S]
    part_sum = torch.empty_like(part_max)
    part_min = torch.empty_like(part_max)
    _split_stats_kernel[(rows, splits)](
        x, part_max, part_sum, part_min, vocab, x.stride(0), splits, SPLIT_LEN=split_len, BLOCK=block, num_warps=8
    )
    row_max = part_max.amax(1, keepdim=True)  # [R, 1]
    # merge splits: sum_s sum_s' * exp(max_s - row_max); a -inf split contributes exactly 0
    scale = torch.exp(part_max - row_max)
    scale = torch.where(part_max == float("-inf"), torch.zeros_like(scale), scale)
    lse = row_max.squeeze(1) + torch.log((part_sum * scale).sum(1))
    return lse, part_min.amin(1)
