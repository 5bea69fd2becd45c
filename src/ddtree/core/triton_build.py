"""Triton kernels of the tree builder (CUDA, or CPU under TRITON_INTERPRET=1; importing needs triton). Each has
a torch twin in build.py that it is probed or checked against once per device or shape.

* `grouped_vocab_topk`: the CUDA vocabulary step (bf16/fp16, k <= 256): one streaming read of the logits [R, V]
  for per-split statistics and the maxima of groups of 64 ids (`_split_stats_kernel`), then one program per row
  that finds the exact top-k from the group maxima (`_grouped_select_kernel`).
* `row_lse_and_min`: the same statistics kernel for the row logsumexp and minimum only (the probe's reference).
* `beam_search` and `tree_from_beam`: the per-depth beam and the tree assembly, one program per request.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ddtree import switches


@triton.jit
def _order_key16(raw):
    """bf16/fp16 values -> int32 key in [0, 65535] whose order is the float order (-0.0 folded onto +0.0)."""
    bits = raw.to(tl.int16, bitcast=True).to(tl.int32)  # sign-extended
    bits = tl.where(bits == -32768, 0, bits)  # -0.0 -> +0.0
    return (bits ^ ((bits >> 15) & 0x7FFF)) + 32768


@triton.jit
def _split_stats_kernel(
    x_ptr,
    max_ptr,
    sum_ptr,
    min_ptr,
    V,
    stride_row,
    num_splits,
    gmax_ptr,  # [R, G] float32 when GMAX: max of each group of GROUP consecutive ids (G = cdiv(V, GROUP))
    num_groups,
    x_addr_ptr,  # [1] int64 when INDIRECT: the address of the logits (x_ptr then only gives their dtype)
    SPLIT_LEN: tl.constexpr,  # constexpr: a few distinct values per process (one per vocabulary/batch shape)
    BLOCK: tl.constexpr,
    GMAX: tl.constexpr = False,  # also write the group maxima (from the same first read)
    GROUP: tl.constexpr = 64,  # BLOCK and SPLIT_LEN are multiples of GROUP: no group straddles two blocks
    INDIRECT: tl.constexpr = False,
):
    row = tl.program_id(0)
    split = tl.program_id(1)
    if INDIRECT:  # a CUDA graph captured once reads whichever buffer the caller passes (no input copy)
        # the caller passes 16-byte aligned buffers only (as Triton's own pointer specialization assumes):
        # without the hint the loads are not vectorized (0.92 vs 0.59 ms for the whole build on an H200)
        x_ptr = tl.multiple_of(tl.load(x_addr_ptr).to(tl.pointer_type(x_ptr.dtype.element_ty)), 16)
    base = x_ptr + row.to(tl.int64) * stride_row
    start = split * SPLIT_LEN
    stop = tl.minimum(start + SPLIT_LEN, V)
    NG: tl.constexpr = BLOCK // GROUP
    offs = tl.arange(0, NG)[:, None] * GROUP + tl.arange(0, GROUP)[None, :]  # [NG, GROUP]: a row of groups
    # ONE read, two levels: each group of GROUP ids gives its max gm and sum exp(v - gm) (one exp per element),
    # and per group slot a running (max, rescaled sum) merges the blocks (two exps per group). A group that
    # is all -inf (or masked) adds exactly 0; +inf or nan make its sum nan (inf - inf, nan - gm), so the
    # row's logsumexp is non-finite and the caller flags it. (Two passes - max, then sum of exp - cost
    # 0.36 ms at R = 960, V = 151,936 bf16 on an H200; the one-level online update with one exp per element
    # 0.16-0.18 ms; one streaming read (torch amax) 0.10 ms.)
    m = tl.full([NG], float("-inf"), tl.float32)
    acc = tl.zeros([NG], tl.float32)
    mn = tl.full([NG, GROUP], float("inf"), tl.float32)
    for s in range(0, SPLIT_LEN, BLOCK):
        idx = start + s + offs
        msk = idx < stop
        raw = tl.load(base + idx, mask=msk, other=float("-inf"))
        v = raw.to(tl.float32)
        gm = tl.max(v, axis=1)  # [NG]; masked lanes are -inf: a short last group keeps the max of its real ids
        gsum = tl.sum(tl.exp(v - gm[:, None]), axis=1)
        gsum = tl.where(gm == float("-inf"), 0.0, gsum)
        new_m = tl.maximum(m, gm)
        live = new_m > float("-inf")
        acc = tl.where(live, acc * tl.exp(m - new_m) + gsum * tl.exp(gm - new_m), acc + gsum)
        m = new_m
        mn = tl.minimum(mn, tl.where(msk, v, float("inf")))
        if GMAX:
            gidx = (start + s) // GROUP + tl.arange(0, NG)
            tl.store(gmax_ptr + row.to(tl.int64) * num_groups + gidx, gm, mask=gidx < num_groups)
    split_max = tl.max(m, 0)
    acc = tl.where(m == float("-inf"), acc * 0.0, acc * tl.exp(m - split_max))
    out = row * num_splits + split
    tl.store(max_ptr + out, split_max)
    tl.store(sum_ptr + out, tl.sum(acc, 0))
    tl.store(min_ptr + out, tl.min(tl.min(mn, 1), 0))


def _num_splits(rows: int, vocab: int, block: int) -> int:
    """Splits per row: enough programs to fill the GPU (`switches.stats_programs`, 4,096 by default: with 1,024,
    R = 960 rows got one split each and ran well under the H200's bandwidth), never splits shorter than a few
    blocks."""
    target_programs = switches.current().stats_programs
    return max(1, min(target_programs // max(rows, 1), vocab // (4 * block)))


def row_lse_and_min(x: torch.Tensor, *, block: int = 2048) -> tuple[torch.Tensor, torch.Tensor]:
    """x: [R, V] CUDA floating tensor (last dim contiguous). Returns (logsumexp [R], min [R]), float32.

    A row holding +inf or nan gives a non-finite logsumexp; a row holding -inf gives min == -inf.
    """
    if x.dim() != 2:
        raise ValueError(f"x must have rank 2, got shape {tuple(x.shape)}")
    if x.stride(1) != 1:
        x = x.contiguous()
    rows, vocab = x.shape
    splits, split_len = _split_geometry(rows, vocab, block)
    part_max = torch.empty((rows, splits), dtype=torch.float32, device=x.device)  # [R, S]
    part_sum = torch.empty_like(part_max)
    part_min = torch.empty_like(part_max)
    _split_stats_kernel[(rows, splits)](
        x, part_max, part_sum, part_min, vocab, x.stride(0), splits, part_max, 1, part_max,
        SPLIT_LEN=split_len, BLOCK=block, num_warps=8,
    )
    return _merge_stats(part_max, part_sum, part_min)


def _split_stats_groupmax(
    x: torch.Tensor, group: int, block: int, x_address: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One read of x [R, V] (last dim contiguous): per-split (max, sum exp, min) [R, S] and the group maxima
    [R, cdiv(V, group)], all float32 (the split statistics are merged by the caller). x_address: see
    `grouped_vocab_topk`."""
    if group < 1 or group & (group - 1) or block % group:
        raise ValueError(f"group must be a power of two dividing block={block}, got {group}")
    rows, vocab = x.shape
    splits, split_len = _split_geometry(rows, vocab, block)
    groups = triton.cdiv(vocab, group)
    part_max = torch.empty((rows, splits), dtype=torch.float32, device=x.device)  # [R, S]
    part_sum = torch.empty_like(part_max)
    part_min = torch.empty_like(part_max)
    gmax = torch.empty((rows, groups), dtype=torch.float32, device=x.device)  # [R, G]
    _split_stats_kernel[(rows, splits)](
        x, part_max, part_sum, part_min, vocab, x.stride(0), splits, gmax, groups,
        part_max if x_address is None else x_address,
        SPLIT_LEN=split_len, BLOCK=block, GMAX=True, GROUP=group, INDIRECT=x_address is not None,
        num_warps=8,
    )
    return part_max, part_sum, part_min, gmax


def _split_geometry(rows: int, vocab: int, block: int) -> tuple[int, int]:
    """(number of splits, split length) of a row; split length is a multiple of block."""
    splits = _num_splits(rows, vocab, block)
    split_len = triton.cdiv(triton.cdiv(vocab, splits), block) * block
    return triton.cdiv(vocab, split_len), split_len


def _merge_stats(
    part_max: torch.Tensor, part_sum: torch.Tensor, part_min: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-split (max, sum exp(x - max), min) [R, S] -> row (logsumexp, min) [R] float32."""
    row_max = part_max.amax(1, keepdim=True)  # [R, 1]
    # merge splits: sum_s sum_s' * exp(max_s - row_max); a -inf split contributes exactly 0
    scale = torch.exp(part_max - row_max)
    scale = torch.where(part_max == float("-inf"), torch.zeros_like(scale), scale)
    lse = row_max.squeeze(1) + torch.log((part_sum * scale).sum(1))
    return lse, part_min.amin(1)


# --------------------------------------------------------------------------------------------------
# grouped vocabulary step: the exact top-k of a row from its group maxima, one program per row
# --------------------------------------------------------------------------------------------------


@triton.jit
def _count_at_least(x_row, gid_row, n_sel, V, t, CH: tl.constexpr, GROUP: tl.constexpr):
    """How many candidates (ids of the n_sel selected groups, gid_row [n_sel] int32) have order key >= t."""
    cnt = 0
    c = 0
    while c < n_sel:
        key, _ = _chunk_keys(x_row, gid_row, n_sel, V, c, CH, GROUP)
        cnt += tl.sum((key >= t).to(tl.int32), 0)
        c += CH
    return cnt


@triton.jit
def _chunk_keys(x_row, gid_row, n_sel, V, c, CH: tl.constexpr, GROUP: tl.constexpr):
    """Order keys ([CH * GROUP] int32, -1 where no id) and ids of the selected groups c .. c + CH - 1, in id
    order. Kept one-dimensional (no reshape), so that the scans over it follow the id order."""
    flat = tl.arange(0, CH * GROUP)
    slot = c + flat // GROUP
    gid = tl.load(gid_row + slot, mask=slot < n_sel, other=0)
    ids = gid * GROUP + flat % GROUP
    real = (slot < n_sel) & (ids < V)
    return tl.where(real, _order_key16(tl.load(x_row + ids, mask=real, other=0.0)), -1), ids


@triton.jit
def _grouped_select_kernel(
    x_ptr,  # [R, V] bf16/fp16 logits
    stride_row,
    V,
    gmax_ptr,  # [R, G] float32 group maxima (from _split_stats_kernel)
    G,
    part_max_ptr,  # [R, S] float32 per-split statistics (from _split_stats_kernel)
    part_sum_ptr,
    part_min_ptr,
    S,
    vals_ptr,  # [R, K] float32 out: the top-K logits, in tie-rule order (logq = vals - lse is taken in torch:
    # in the kernel the compiler may fold the subtraction into lse's own arithmetic and round equal logits apart)
    ids_ptr,  # [R, K] int64 out
    lse_ptr,  # [R] float32 out
    min_ptr,  # [R] float32 out
    bad_ptr,  # [R] int8 out: 1 when the row holds nan or +-inf
    gid_scratch_ptr,  # [R, G_PAD] int32: ids of the selected groups, ascending
    key_scratch_ptr,  # [R, K_PAD] int32: order keys of the top-K, in id order within (above, tied)
    id_scratch_ptr,  # [R, CAP] int32: ids of the candidates >= T1, then the top-K ids in tie-rule order
    x_addr_ptr,  # [1] int64 when INDIRECT: the address of the logits (x_ptr then only gives their dtype)
    K: tl.constexpr,
    K_PAD: tl.constexpr,  # power of two >= max(K, 16)
    CAP: tl.constexpr,  # power of two >= K_PAD: most candidates >= T1 sorted directly
    G_PAD: tl.constexpr,
    S_PAD: tl.constexpr,
    GROUP: tl.constexpr,
    CH: tl.constexpr,  # groups per chunk of the candidate loops
    INDIRECT: tl.constexpr = False,
):
    """Row logsumexp / min merged from the splits, then the exact top-K (value descending, id ascending):

    1. T1 = the K-th largest group maximum (order keys, binary search on counts). Only the groups whose
       maximum is >= T1 can hold a top-K value: K groups hold a value >= T1, so the K-th largest value is
       >= T1, and every top-K value is >= T1.
    2. Usually few more than K values are >= T1 (ties at T1 aside): when at most CAP, a sort of their int64
       keys (order key << 32 | 2**32 - 1 - id) gives the top-K in tie-rule order, from one pass over the
       selected groups.
    3. Otherwise (many ties at T1) by counting: T2 = the K-th largest value among those groups' ids (binary
       search on counts, from T1 up); the values > T2 (fewer than K) and the first K - #(> T2) values == T2
       in id order are the top-K, sorted by the same keys.
    """
    row = tl.program_id(0).to(tl.int64)
    if INDIRECT:  # a CUDA graph captured once reads whichever buffer the caller passes (no input copy)
        x_ptr = tl.multiple_of(tl.load(x_addr_ptr).to(tl.pointer_type(x_ptr.dtype.element_ty)), 16)  # see above
    # row statistics, merged like _merge_stats (a split that saw only -inf adds exactly 0)
    s_offs = tl.arange(0, S_PAD)
    s_mask = s_offs < S
    p_max = tl.load(part_max_ptr + row * S + s_offs, mask=s_mask, other=float("-inf"))
    p_sum = tl.load(part_sum_ptr + row * S + s_offs, mask=s_mask, other=0.0)
    p_min = tl.load(part_min_ptr + row * S + s_offs, mask=s_mask, other=float("inf"))
    row_max = tl.max(p_max, 0)
    scale = tl.where(p_max == float("-inf"), 0.0, tl.exp(p_max - row_max))
    lse = row_max + tl.log(tl.sum(p_sum * scale, 0))
    row_min = tl.min(p_min, 0)
    finite = (lse == lse) & (tl.abs(lse) < float("inf")) & (row_min > float("-inf"))
    tl.store(lse_ptr + row, lse)
    tl.store(min_ptr + row, row_min)
    tl.store(bad_ptr + row, tl.where(finite, 0, 1).to(tl.int8))

    # 1. T1: the largest t with #(group keys >= t) >= K (0 when there are fewer than K groups)
    g_offs = tl.arange(0, G_PAD)
    g_mask = g_offs < G
    g_max = tl.load(gmax_ptr + row * G + g_offs, mask=g_mask, other=0.0)
    g_key = tl.where(g_mask, _order_key16(g_max.to(x_ptr.dtype.element_ty)), -1)  # [G_PAD] in [0, 65535]
    top_key = tl.max(g_key, 0)
    # invariant #(group keys >= lo) >= K: from the smallest key when G >= K, else from 0 (every group is
    # selected and T2's search must reach values below every group maximum)
    lo = tl.where(G >= K, tl.min(tl.where(g_mask, g_key, 65535), 0), 0)
    hi = top_key
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if tl.sum((g_key >= mid).to(tl.int32), 0) >= K:
            lo = mid
        else:
            hi = mid - 1
    t1 = lo

    # the selected groups' ids, ascending (compacted through scratch)
    sel = g_key >= t1
    n_sel = tl.sum(sel.to(tl.int32), 0)
    gid_row = gid_scratch_ptr + row * G_PAD
    tl.store(gid_row + tl.cumsum(sel.to(tl.int32), 0) - 1, g_offs, mask=sel)
    tl.debug_barrier()  # the ids were stored by other threads of this program

    # 2. the candidates >= T1 (their first CAP ids, in id order) and how many there are
    x_row = x_ptr + row * stride_row
    id_row = id_scratch_ptr + row * CAP
    n_cand = 0
    c = 0
    while c < n_sel:
        key, ids = _chunk_keys(x_row, gid_row, n_sel, V, c, CH, GROUP)
        hit = (key >= t1).to(tl.int32)
        pos = n_cand + tl.cumsum(hit, 0) - 1
        tl.store(id_row + pos, ids, mask=(hit > 0) & (pos < CAP))
        n_cand += tl.sum(hit, 0)
        c += CH
    tl.debug_barrier()

    # (the two branches below name their tensors apart: the compiler rejects a name bound to different shapes)
    if n_cand <= CAP:  # sort them all; the first K are the top-K
        cand_slot = tl.arange(0, CAP)
        cand_real = cand_slot < n_cand
        cand = tl.load(id_row + cand_slot, mask=cand_real, other=0).to(tl.int64)
        cand_key = _order_key16(tl.load(x_row + cand, mask=cand_real, other=0.0)).to(tl.int64)
        cand_sorted = tl.sort(tl.where(cand_real, (cand_key << 32) | (4294967295 - cand), -1), descending=True)
        tl.debug_barrier()  # every candidate id was read before the sorted ids overwrite them
        tl.store(id_row + cand_slot, (4294967295 - (cand_sorted & 4294967295)).to(tl.int32), mask=cand_slot < K)
    else:
        # 3. T2: the largest t >= T1 with #(candidates >= t) >= K (K <= V, and #(>= T1) >= min(K, V))
        lo = t1
        hi = top_key
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if _count_at_least(x_row, gid_row, n_sel, V, mid, CH, GROUP) >= K:
                lo = mid
            else:
                hi = mid - 1
        t2 = lo
        n_above = _count_at_least(x_row, gid_row, n_sel, V, t2 + 1, CH, GROUP)  # < K
        need_tied = K - n_above

        # compact the top-K in id order: values > T2 to slots [0, n_above), the first ties after them
        key_row = key_scratch_ptr + row * K_PAD
        seen_above = 0
        seen_tied = 0
        c = 0
        while c < n_sel:
            key, ids = _chunk_keys(x_row, gid_row, n_sel, V, c, CH, GROUP)
            above = (key > t2).to(tl.int32)
            tied = (key == t2).to(tl.int32)
            pos_above = seen_above + tl.cumsum(above, 0) - 1
            pos_tied = seen_tied + tl.cumsum(tied, 0) - 1
            keep = (above > 0) | ((tied > 0) & (pos_tied < need_tied))
            dest = tl.where(above > 0, pos_above, n_above + pos_tied)
            tl.store(key_row + dest, key, mask=keep)
            tl.store(id_row + dest, ids, mask=keep)
            seen_above += tl.sum(above, 0)
            seen_tied += tl.sum(tied, 0)
            c += CH
        tl.debug_barrier()
        top_slot = tl.arange(0, K_PAD)
        top_mask = top_slot < K
        top_ids = tl.load(id_row + top_slot, mask=top_mask, other=0).to(tl.int64)
        top_keys = (tl.load(key_row + top_slot, mask=top_mask, other=0).to(tl.int64) << 32) | (4294967295 - top_ids)
        top_sorted = tl.sort(tl.where(top_mask, top_keys, -1), descending=True)  # value descending, then id ascending
        tl.debug_barrier()
        tl.store(id_row + top_slot, (4294967295 - (top_sorted & 4294967295)).to(tl.int32), mask=top_mask)
    tl.debug_barrier()

    out = tl.arange(0, K_PAD)
    out_mask = out < K
    ids = tl.load(id_row + out, mask=out_mask, other=0).to(tl.int64)
    vals = tl.load(x_row + ids, mask=out_mask, other=0.0).to(tl.float32)
    tl.store(vals_ptr + row * K + out, vals, mask=out_mask)
    tl.store(ids_ptr + row * K + out, ids, mask=out_mask)


GROUPED_SELECT_DTYPES = (torch.bfloat16, torch.float16)
GROUPED_SELECT_MAX_K = 256  # the top-k is sorted as K_PAD int64 keys in one program
GROUPED_SELECT_CHUNK = 32  # groups per chunk of the candidate loops (32 x 64 ids; 64 was slower on an H200)
# Candidates >= T1 sorted directly, as a multiple of K_PAD. For logits of random rows about K + 10-20 values are
# >= T1 (the ties at the K-th group maximum); heavily tied rows (e.g. rounded logits) take the counting path.
GROUPED_SELECT_CAP_FACTOR = 2  # 2 beat 1 and 4 on an H200 (benchmarks/results/2026-12-01/h200-s5)


def grouped_select_fits(vocab: int, k: int, group: int = 64) -> bool:
    """`grouped_vocab_topk` handles this shape: 1 <= k <= min(V, GROUPED_SELECT_MAX_K), < 32768 groups."""
    return 1 <= k <= min(vocab, GROUPED_SELECT_MAX_K) and triton.cdiv(vocab, group) <= 32768


def grouped_vocab_topk(
    x: torch.Tensor,
    k: int,
    *,
    group: int = 64,
    chunk: int | None = None,
    cap: int | None = None,
    block: int = 2048,
    x_address: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The tree builder's vocabulary step for bf16/fp16 logits x [R, V] in two kernels.

    Returns logq [R, k] float32 (logit - row logsumexp, descending), ids [R, k] int64 (value descending, then
    id ascending: exact, ties included), logsumexp [R], min [R] (float32) and bad [R] int8 (1: the row holds
    nan or +-inf). One streaming read for the statistics and group maxima (`_split_stats_kernel`), then one
    program per row selects the top-k from the group maxima (`_grouped_select_kernel`). chunk: groups per
    candidate chunk (None: GROUPED_SELECT_CHUNK); cap: how many candidates may be sorted directly (a power of
    two >= the padded k; None: GROUPED_SELECT_CAP_FACTOR times it; rows with more take the counting path).
    logsumexp is merged in the kernel, so it may differ from `row_lse_and_min`'s in the last bit.

    x_address: an int64 CUDA tensor [1] holding the 16-byte aligned address of the logits to read; x then only gives their
    shape, strides and dtype (x itself is not read). A CUDA graph captured with it reads, on each replay,
    whichever buffer of that layout the address holds then: the caller must keep it alive until the replay ran.
    """
    if x.dim() != 2:
        raise ValueError(f"x must have rank 2, got shape {tuple(x.shape)}")
    if x.dtype not in GROUPED_SELECT_DTYPES:
        raise ValueError(f"x must be bfloat16 or float16, got {x.dtype}")
    rows, vocab = x.shape
    if not isinstance(k, int) or not grouped_select_fits(vocab, k, group):
        raise ValueError(f"k must be an int in [1, min(V={vocab}, {GROUPED_SELECT_MAX_K})], got {k!r}")
    if x.stride(1) != 1:
        if x_address is not None:
            raise ValueError("x_address needs logits whose last dimension is contiguous")
        x = x.contiguous()
    chunk = GROUPED_SELECT_CHUNK if chunk is None else chunk
    k_pad = max(triton.next_power_of_2(k), 16)
    cap = GROUPED_SELECT_CAP_FACTOR * k_pad if cap is None else cap
    if cap < k_pad or cap & (cap - 1):
        raise ValueError(f"cap must be a power of two >= {k_pad}, got {cap}")
    stats = _split_stats_groupmax(x, group, block, x_address)  # part max/sum/min [R, S] x3, group maxima [R, G]
    vals, ids, lse, row_min, bad = select_launcher(x, k, stats, group=group, chunk=chunk, cap=cap,
                                                   x_address=x_address)()
    # one correctly rounded subtraction per value: equal logits get equal logq, and the order stays descending
    return vals - lse.unsqueeze(1), ids, lse, row_min, bad


def select_launcher(
    x: torch.Tensor,
    k: int,
    stats: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
    *,
    group: int,
    chunk: int,
    cap: int,
    x_address: torch.Tensor | None = None,
    num_warps: int = 8,
):
    """The select kernel's outputs and scratch for x [R, V] (contiguous rows) and the statistics `stats` of
    `_split_stats_groupmax`, allocated once; returns a function that launches the kernel into them and returns
    (vals [R, k] float32, ids [R, k] int64, lse [R], min [R] float32, bad [R] int8). Arguments unchecked: see
    `grouped_vocab_topk`, which checks them (benchmarks call this to time the kernel alone)."""
    part_max, part_sum, part_min, gmax = stats
    rows, vocab = x.shape
    splits, groups = part_max.shape[1], gmax.shape[1]
    k_pad = max(triton.next_power_of_2(k), 16)
    g_pad = triton.next_power_of_2(groups)
    dev = x.device
    vals = torch.empty((rows, k), dtype=torch.float32, device=dev)
    ids = torch.empty((rows, k), dtype=torch.int64, device=dev)
    lse = torch.empty((rows,), dtype=torch.float32, device=dev)
    row_min = torch.empty_like(lse)
    bad = torch.empty((rows,), dtype=torch.int8, device=dev)
    gid_scratch = torch.empty((rows, g_pad), dtype=torch.int32, device=dev)
    key_scratch = torch.empty((rows, k_pad), dtype=torch.int32, device=dev)
    id_scratch = torch.empty((rows, cap), dtype=torch.int32, device=dev)

    def launch():
        _grouped_select_kernel[(rows,)](
            x, x.stride(0), vocab, gmax, groups, part_max, part_sum, part_min, splits,
            vals, ids, lse, row_min, bad, gid_scratch, key_scratch, id_scratch,
            part_max if x_address is None else x_address,
            K=k, K_PAD=k_pad, CAP=cap, G_PAD=g_pad, S_PAD=triton.next_power_of_2(splits), GROUP=group, CH=chunk,
            INDIRECT=x_address is not None, num_warps=num_warps,
        )
        return vals, ids, lse, row_min, bad

    return launch


@triton.jit
def _beam_depth(d, lq, ids, ol, ot, op, jj, rr, low, m_mask, w_offs, w_mask, scratch, K: tl.constexpr,
                W: tl.constexpr, W_PAD: tl.constexpr, PRUNE_PAD: tl.constexpr):
    """One depth of the beam: best W of the candidates (parent jj, rank rr), same keys as the torch loop.

    PRUNE_PAD > 0: the candidates (j, 0), j < W, all score at least tau = logw[W - 1] + logq[0] (both rows are
    sorted descending), so the W best score >= tau and every candidate below tau can go. When at most PRUNE_PAD
    candidates are left they are compacted (through `scratch`) and only those are sorted; else all M are."""
    tl.debug_barrier()  # the previous depth's beam was stored by other threads of this program
    cand = tl.load(ol + (d - 1) * W + jj, mask=m_mask, other=float("-inf")) + tl.load(
        lq + d * K + rr, mask=m_mask, other=float("-inf")
    )
    cand = tl.where(cand == 0.0, 0.0, cand)  # fold -0.0 onto +0.0
    bits = cand.to(tl.int32, bitcast=True)
    ordered = bits ^ ((bits >> 31) & 0x7FFFFFFF)
    key = (ordered.to(tl.int64) << 32) + low
    key = tl.where(m_mask, key, -9223372036854775807 - 1)
    if PRUNE_PAD > 0:
        tau = tl.load(ol + (d - 1) * W + (W - 1)) + tl.load(lq + d * K)
        keep = m_mask & (cand >= tau)
        kept = tl.sum(keep.to(tl.int32), 0)
        if kept <= PRUNE_PAD:
            slot = tl.cumsum(keep.to(tl.int32), 0) - 1
            tl.store(scratch + slot, key, mask=keep)
            tl.debug_barrier()  # the kept keys were stored by other threads of this program
            c_offs = tl.arange(0, PRUNE_PAD)
            small = tl.load(scratch + c_offs, mask=c_offs < kept, other=-9223372036854775807 - 1)
            top = tl.topk(small, W_PAD)
        else:
            top = tl.topk(key, W_PAD)
    else:
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


@triton.jit
def _beam_kernel(
    logq_ptr,  # [B, D, K] float32, each row sorted descending
    ids_ptr,  # [B, D, K] int64
    js_ptr,  # [M] int64 candidate beam positions
    rs_ptr,  # [M] int64 candidate ranks
    out_logw_ptr,  # [B, D, W] float32
    out_tok_ptr,  # [B, D, W] int64
    out_par_ptr,  # [B, D, W] int64 (parent's position in the previous depth's beam)
    scratch_ptr,  # [B, PRUNE_PAD] int64 (pruned candidates' keys; unused when PRUNE_PAD = 0)
    D: tl.constexpr,
    K: tl.constexpr,
    W: tl.constexpr,
    M: tl.constexpr,
    W_PAD: tl.constexpr,
    M_PAD: tl.constexpr,
    UNROLL: tl.constexpr,  # unroll the depth loop (measured for W <= 64); a runtime loop keeps compile time bounded
    PRUNE_PAD: tl.constexpr,  # sort at most this many candidates after the tau cut (0: sort all M)
):
    """The per-depth beam of one request, all depths in one program (same keys as the torch loop)."""
    b = tl.program_id(0).to(tl.int64)
    lq = logq_ptr + b * (D * K)
    ids = ids_ptr + b * (D * K)
    ol = out_logw_ptr + b * (D * W)
    ot = out_tok_ptr + b * (D * W)
    op = out_par_ptr + b * (D * W)
    scratch = scratch_ptr + b * PRUNE_PAD
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
    if UNROLL:
        for d in tl.static_range(1, D):
            _beam_depth(d, lq, ids, ol, ot, op, jj, rr, low, m_mask, w_offs, w_mask, scratch, K, W, W_PAD, PRUNE_PAD)
    else:
        for d in range(1, D):
            _beam_depth(d, lq, ids, ol, ot, op, jj, rr, low, m_mask, w_offs, w_mask, scratch, K, W, W_PAD, PRUNE_PAD)


# widths up to this unroll the depth loop (the configuration measured on an H200); wider ones loop at runtime
BEAM_UNROLL_MAX_WIDTH = 64
# the tau cut's default: from this width on, sort at most PRUNE_WIDTHS x the padded width after the cut. Measured on
# the H200 (benchmarks/beam_launch.py, peaky logits): W = 64, B = 1: 62.7 us -> 48.2 us with a cut of 4 W (no gain
# with 2 W: the cut rarely fits it); W = 128: 91 -> 71 us (B = 1), 90 -> 63 us (B = 8); narrower beams sort 256
# keys or fewer anyway
PRUNE_MIN_WIDTH = 64
PRUNE_WIDTHS = 4


def beam_search(
    logq: torch.Tensor, ids: torch.Tensor, js: torch.Tensor, rs: torch.Tensor, width: int, *,
    unroll: bool | None = None, num_warps: int | None = None, prune: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Triton twin of build._beam_torch: logq/ids [B, D, K] -> beam logw/token/parent [B, D, W].

    Widths <= BEAM_UNROLL_MAX_WIDTH unroll the depth loop (static_range, measured on an H200); wider beams
    use a runtime depth loop so that compile time does not grow with D (14 unrolled bitonic sorts of 1024 /
    2048 int64 keys compiled for minutes). `unroll` / `num_warps` override the launch, `prune` the tau cut's
    sort size (0: off; None: PRUNE_WIDTHS x the padded width from PRUNE_MIN_WIDTH on; benchmarks/beam_launch.py
    measures all three).
    """
    b, d, k = logq.shape
    m = js.numel()
    logq = logq.contiguous()
    ids = ids.contiguous()
    out_logw = torch.empty((b, d, width), dtype=torch.float32, device=logq.device)
    out_tok = torch.empty((b, d, width), dtype=torch.int64, device=logq.device)
    out_par = torch.empty((b, d, width), dtype=torch.int64, device=logq.device)
    m_pad = triton.next_power_of_2(m)
    w_pad = triton.next_power_of_2(width)
    if prune is None:
        prune = PRUNE_WIDTHS * w_pad if width >= PRUNE_MIN_WIDTH else 0
    # at least 2 W: W candidates always pass the cut (the (j, 0)), so a cut of W would never fit
    prune_pad = 0 if not prune else max(triton.next_power_of_2(prune), 2 * w_pad, 16)
    if prune_pad >= m_pad:
        prune_pad = 0  # nothing to gain: the cut sorts as many keys as the whole
    # the cut's compaction buffer; without the cut the kernel never touches it (any int64 pointer will do)
    scratch = torch.empty((b, prune_pad), dtype=torch.int64, device=logq.device) if prune_pad else out_par
    _beam_kernel[(b,)](
        logq, ids, js, rs, out_logw, out_tok, out_par, scratch,
        D=d, K=k, W=width, M=m, W_PAD=w_pad, M_PAD=m_pad, PRUNE_PAD=prune_pad,
        # with the cut: the runtime depth loop and 8 warps, the configuration measured (W = 64: 48.2 us; W = 128:
        # 71.2 us at B = 1, 62.9 at B = 8, vs 91 without the cut)
        UNROLL=(width <= BEAM_UNROLL_MAX_WIDTH and not prune_pad) if unroll is None else unroll,
        num_warps=(8 if m_pad >= 2048 or prune_pad else 4) if num_warps is None else num_warps,
    )
    return out_logw, out_tok, out_par


# --------------------------------------------------------------------------------------------------
# the beam's best `budget` prefixes over all depths -> the tree, one program per request
# --------------------------------------------------------------------------------------------------


@triton.jit
def _tree_from_beam_kernel(
    logw_ptr,  # [B, D, W] float32 beam logws (each depth sorted in the prefix order, -inf padding)
    tok_ptr,  # [B, D, W] int64
    par_ptr,  # [B, D, W] int64 parent's position in the previous depth's beam
    node_of_slot_ptr,  # [B, D * W] int32 scratch
    token_ids_ptr,  # [B, N] int64 out (N = BUDGET + 1)
    parents_ptr,  # [B, N] int64 out
    depths_ptr,  # [B, N] int64 out
    node_logws_ptr,  # [B, N] float32 out
    num_nodes_ptr,  # [B] int64 out
    W: tl.constexpr,
    DW: tl.constexpr,  # D * W
    DW_PAD: tl.constexpr,
    BUDGET: tl.constexpr,
    BUDGET_PAD: tl.constexpr,
):
    """Global top-BUDGET over all depths (descending logw, then smaller slot = smaller depth, then beam
    position; the same int64 keys as the torch tail), numbered best-first, parents renumbered."""
    b = tl.program_id(0).to(tl.int64)
    slots = tl.arange(0, DW_PAD)
    s_mask = slots < DW
    logw = tl.load(logw_ptr + b * DW + slots, mask=s_mask, other=float("-inf"))
    logw = tl.where(logw == 0.0, 0.0, logw)  # fold -0.0 onto +0.0
    bits = logw.to(tl.int32, bitcast=True)
    key = ((bits ^ ((bits >> 31) & 0x7FFFFFFF)).to(tl.int64) << 32) + (4294967295 - slots.to(tl.int64))
    key = tl.where(s_mask, key, -9223372036854775807 - 1)
    top = tl.topk(key, BUDGET_PAD)  # [BUDGET_PAD] descending
    i = tl.arange(0, BUDGET_PAD)
    i_mask = i < BUDGET
    slot = tl.where(i_mask, 4294967295 - (top & 4294967295), 0)
    sel_logw = tl.load(logw_ptr + b * DW + slot)
    sel_tok = tl.load(tok_ptr + b * DW + slot)
    sel_par = tl.load(par_ptr + b * DW + slot)
    depth0 = slot // W
    valid = i_mask & (sel_logw > float("-inf"))
    scratch = node_of_slot_ptr + b * DW
    tl.store(scratch + slot, (i + 1).to(tl.int32), mask=i_mask)
    tl.debug_barrier()  # node numbers were stored by other threads of this program
    has_parent = valid & (depth0 > 0)
    # a selected prefix's parent is selected too (it comes first in the order), so its slot holds a number
    parent = tl.load(scratch + (depth0 - 1) * W + sel_par, mask=has_parent, other=0).to(tl.int64)
    n = BUDGET + 1
    out = b * n + 1 + i
    tl.store(token_ids_ptr + out, tl.where(valid, sel_tok, -1), mask=i_mask)
    tl.store(parents_ptr + out, tl.where(valid, parent, -1), mask=i_mask)
    tl.store(depths_ptr + out, tl.where(valid, depth0 + 1, 0), mask=i_mask)
    tl.store(node_logws_ptr + out, tl.where(valid, sel_logw, float("-inf")), mask=i_mask)
    tl.store(token_ids_ptr + b * n, -1)  # the root
    tl.store(parents_ptr + b * n, -1)
    tl.store(depths_ptr + b * n, 0)
    tl.store(node_logws_ptr + b * n, 0.0)
    tl.store(num_nodes_ptr + b, tl.sum(valid.to(tl.int64), 0) + 1)


def tree_from_beam(
    beam_logw: torch.Tensor, beam_tok: torch.Tensor, beam_par: torch.Tensor, budget: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Triton twin of build._tree_from_beam_torch: beam [B, D, W] x3 -> token_ids, parents,
    depths, node_logws [B, budget + 1] and num_nodes [B] (same keys, same numbering, same padding)."""
    b, d, w = beam_logw.shape
    if not 1 <= budget <= d * w:
        raise ValueError(f"budget must be in [1, D * W = {d * w}], got {budget}")
    dev = beam_logw.device
    n = budget + 1
    token_ids = torch.empty((b, n), dtype=torch.int64, device=dev)
    parents = torch.empty_like(token_ids)
    depths = torch.empty_like(token_ids)
    node_logws = torch.empty((b, n), dtype=torch.float32, device=dev)
    num_nodes = torch.empty((b,), dtype=torch.int64, device=dev)
    scratch = torch.empty((b, d * w), dtype=torch.int32, device=dev)
    # tl.topk fails to compile on a size-1 axis (budget 1 or a one-slot beam): pad both axes to at least 16
    budget_pad = max(triton.next_power_of_2(budget), 16)
    dw_pad = max(triton.next_power_of_2(d * w), budget_pad)
    _tree_from_beam_kernel[(b,)](
        beam_logw.contiguous(), beam_tok.contiguous(), beam_par.contiguous(), scratch,
        token_ids, parents, depths, node_logws, num_nodes,
        W=w, DW=d * w, DW_PAD=dw_pad, BUDGET=budget, BUDGET_PAD=budget_pad,
        num_warps=8 if dw_pad >= 2048 else 4,
    )
    return token_ids, parents, depths, node_logws, num_nodes
