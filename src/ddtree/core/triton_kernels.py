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


_LOW32 = (1 << 32) - 1


@triton.jit
def _beam_kernel(
    logq_ptr,  # [B, D, K] float32, each row sorted descending
    ids_ptr,  # [B, D, K] int64
    js_ptr,  # [M] int64 candidate beam positions
    rs_ptr,  # [M] int64 candidate ranks
    out_logw_ptr,  # [B, D, W] float32
    out_tok_ptr,  # [B, D, W] int64
    out_par_ptr,  # [B, D, W] int64 (parent's position in the previous depth's beam)
    D: tl.constexpr,
    K: tl.constexpr,
    W: tl.constexpr,
    M: tl.constexpr,
    W_PAD: tl.constexpr,
    M_PAD: tl.constexpr,
):
    """The per-depth beam of one request, all depths in one program (same keys as the torch loop)."""
    b = tl.program_id(0).to(tl.int64)
    lq = logq_ptr + b * (D * K)
    ids = ids_ptr + b * (D * K)
    ol = out_logw_ptr + b * (D * W)
    ot = out_tok_ptr + b * (D * W)
    op = out_par_ptr + b * (D * W)
    w_offs = tl.arange(0, W_PAD)
    w_mask = w_offs < W
    first = tl.load(lq + w_offs, mask=w_offs < K, other=float("-inf"))
    tl.store(ol + w_offs, first, mask=w_mask)
    tl.store(ot + w_offs, tl.load(ids + w_offs, mask=w_offs < K, other=0), mask=w_mask)
    tl.store(op + w_offs, tl.zeros([W_PAD], tl.int64), mask=w_mask)
    m_offs = tl.arange(0, M_PAD)
    m_mask = m_offs < M
    jj = tl.load(js_ptr + m_offs, mask=m_mask, other=0)
    rr = tl.load(rs_ptr + m_offs, mask=m_mask, other=0)
    low = 4294967295 - (jj * K + rr)  # smaller candidate number wins ties
    for d in tl.static_range(1, D):
        tl.debug_barrier()  # the previous depth's beam was stored by other threads of this program
        cand = tl.load(ol + (d - 1) * W + jj, mask=m_mask, other=float("-inf")) + tl.load(
            lq + d * K + rr, mask=m_mask, other=float("-inf")
        )
        cand = tl.where(cand == 0.0, 0.0, cand)  # fold -0.0 onto +0.0
        bits = cand.to(tl.int32, bitcast=True)
        ordered = bits ^ ((bits >> 31) & 0x7FFFFFFF)
        key = (ordered.to(tl.int64) << 32) + low
        key = tl.where(m_mask, key, -9223372036854775807 - 1)
        top = tl.topk(key, W_PAD)  # [W_PAD] descending
        flat = 4294967295 - (top & 4294967295)
        j = flat // K
        r = flat % K
        r = tl.where(w_mask, r, 0)
        j = tl.where(w_mask, j, 0)
        # recompute the same float32 add as above (bit-identical), rather than decoding the key
        logw = tl.load(ol + (d - 1) * W + j) + tl.load(lq + d * K + r)
        tl.store(ol + d * W + w_offs, logw, mask=w_mask)
        tl.store(ot + d * W + w_offs, tl.load(ids + d * K + r), mask=w_mask)
        tl.store(op + d * W + w_offs, j, mask=w_mask)


def beam_search(
    logq: torch.Tensor, ids: torch.Tensor, js: torch.Tensor, rs: torch.Tensor, width: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Triton twin of build._beam_torch: logq/ids [B, D, K] -> beam logw/token/parent [B, D, W].

    The depth loop is unrolled (static_range): compile time grows with D and the padded candidate count, so
    build.py only calls this for widths <= 64 (the range checked on an H200).
    """
    b, d, k = logq.shape
    m = js.numel()
    logq = logq.contiguous()
    ids = ids.contiguous()
    out_logw = torch.empty((b, d, width), dtype=torch.float32, device=logq.device)
    out_tok = torch.empty((b, d, width), dtype=torch.int64, device=logq.device)
    out_par = torch.empty((b, d, width), dtype=torch.int64, device=logq.device)
    m_pad = triton.next_power_of_2(m)
    _beam_kernel[(b,)](
        logq, ids, js, rs, out_logw, out_tok, out_par,
        D=d, K=k, W=width, M=m, W_PAD=triton.next_power_of_2(width), M_PAD=m_pad,
        num_warps=8 if m_pad >= 2048 else 4,
    )
    return out_logw, out_tok, out_par
