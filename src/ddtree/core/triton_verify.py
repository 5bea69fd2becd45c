"""The project's Triton kernels of the sampling verify (CUDA, or CPU under TRITON_INTERPRET=1; importing needs
triton): the lazy sample-and-walk, `verify_sampling(backend="triton")`.
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl

TRITON_PROBE_ERRORS: dict[str, str] = {}  # "lazy:<device>" -> why the probe failed (for selfcheck and tests)


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


# --------------------------------------------------------------------------------------------------
# Lazy sample-and-walk: ONE read of every row, then draws only along the walk.
# --------------------------------------------------------------------------------------------------
# Sample-and-walk only uses the picks of the nodes on the accepted path, so only those are drawn:
#   pass 1 (`scaled_row_lse_and_min`): every row is read once: lse of x * inv_t (online, fp32) and the
#          row minimum of x. lse and min are both finite exactly when every element is finite (nan or
#          +inf make the sum nan/inf, -inf shows in the min), so this read also replaces the separate
#          finiteness pass. Rows are split over several programs when there are few rows.
#   walk (`lazy_walk`): one program per request. At the current node it draws the pick by inverse CDF
#          with a pre-drawn uniform u (one per depth step): block sums of exp(x * inv_t - lse) only, the
#          in-block cumsum only in the block where the running sum crosses u, and the scan stops there.
#          Greedy rows (T = 0) take the first maximum. The child carrying the pick (children have distinct
#          tokens) becomes the current node, else the pick is the bonus.
#   Each visited node's pick is an independent exact draw from softmax(x * inv_t), so the law is exactly
#   sample-and-walk. Rounding guard: if the fp32 running sum never exceeds u (total mass a hair below 1),
#   the pick is the last token with positive probability; if the crossing block's cumsum disagrees with
#   its block sum, the last positive token of that block. Both fire only when u lies within the fp32
#   rounding of the running sum (about (V / BLOCK + log2 BLOCK) * 2^-24 < 1e-5 for V = 151,936), which
#   bounds the total-variation bias of each draw.
# Cost: 1 read of [B, N, V] + at most D + 1 partial row reads per request (latency-bound, one SM each).


@triton.jit
def _split_lse_min_kernel(x_ptr, inv_t_ptr, max_ptr, sum_ptr, min_ptr, V, rows_per_request, num_splits,
                          SPLIT_LEN: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    split = tl.program_id(1)
    inv_t = tl.load(inv_t_ptr + row // rows_per_request)
    base = row.to(tl.int64) * V
    start = split * SPLIT_LEN
    offs = tl.arange(0, BLOCK)
    m = tl.max(tl.full([BLOCK], float("-inf"), tl.float32), 0)  # scalar running max of x * inv_t
    acc = tl.zeros([BLOCK], tl.float32)  # per-lane sum of exp(x * inv_t - m)
    mn = tl.full([BLOCK], float("inf"), tl.float32)
    for s in range(0, SPLIT_LEN, BLOCK):
        idx = start + s + offs
        msk = idx < V
        x = tl.load(x_ptr + base + idx, mask=msk, other=float("-inf")).to(tl.float32)
        mn = tl.minimum(mn, tl.where(msk, x, float("inf")))
        sc = x * inv_t
        # a split's first block always holds a real lane, so new_m is finite for finite input
        new_m = tl.maximum(m, tl.max(sc, 0))
        acc = acc * tl.exp(m - new_m) + tl.exp(sc - new_m)  # one exp per element
        m = new_m
    out = row * num_splits + split
    tl.store(max_ptr + out, m)
    tl.store(sum_ptr + out, tl.sum(acc, 0))
    tl.store(min_ptr + out, tl.min(mn, 0))


@triton.jit
def _lazy_walk_kernel(x_ptr, lse_ptr, inv_t_ptr, noisy_ptr, u_ptr, parents_ptr, tokens_ptr, nodes_ptr, len_ptr,
                      bonus_ptr, V, N, D, BLOCK: tl.constexpr, NP: tl.constexpr):
    b = tl.program_id(0)
    inv_t = tl.load(inv_t_ptr + b)
    noisy = tl.load(noisy_ptr + b) != 0
    offs = tl.arange(0, BLOCK)
    cols = tl.arange(0, NP)
    par = tl.load(parents_ptr + b * N + cols, mask=cols < N, other=-2)  # [NP]
    tok = tl.load(tokens_ptr + b * N + cols, mask=cols < N, other=-2)  # [NP]
    zero = b * 0  # int32 scalar: loop-carried values need tensor types from the start
    node = zero
    step = zero
    bonus = zero
    go = zero == 0
    while go:
        row = b * N + node
        base = row.to(tl.int64) * V
        if noisy:
            lse = tl.load(lse_ptr + row)
            target = tl.load(u_ptr + b * (D + 1) + step)
            run = target * 0.0
            start = zero
            crossed = zero
            last_pos = zero - 1
            # block sums only, stop at the block where the running sum passes u
            while (crossed == 0) & (start < V):
                idx = start + offs
                e = tl.exp(tl.load(x_ptr + base + idx, mask=idx < V, other=float("-inf")).to(tl.float32)
                           * inv_t - lse)  # [BLOCK], 0 on padding lanes
                bsum = tl.sum(e, 0)
                last_pos = tl.maximum(last_pos, tl.max(tl.where(e > 0, idx, -1), 0))
                crossed = (run + bsum > target).to(tl.int32)
                run = tl.where(crossed != 0, run, run + bsum)
                start = tl.where(crossed != 0, start, start + BLOCK)
            # the crossing block (all padding when never crossed): first cumsum > u with positive mass
            idx = start + offs
            e = tl.exp(tl.load(x_ptr + base + idx, mask=idx < V, other=float("-inf")).to(tl.float32)
                       * inv_t - lse)
            hit = ((run + tl.cumsum(e, 0)) > target) & (e > 0)
            first = tl.min(tl.where(hit, idx, V), 0)
            block_last = tl.max(tl.where(e > 0, idx, -1), 0)
            pick = tl.where(first < V, first, tl.where(crossed != 0, block_last, last_pos))
        else:
            best = tl.full([BLOCK], float("-inf"), tl.float32)
            best_idx = tl.zeros([BLOCK], tl.int32)
            for s in range(0, V, BLOCK):
                idx = s + offs
                x = tl.load(x_ptr + base + idx, mask=idx < V, other=float("-inf")).to(tl.float32)
                better = x > best  # strict: a lane keeps its first maximum
                best = tl.where(better, x, best)
                best_idx = tl.where(better, idx, best_idx)
            top = tl.max(best, 0)
            pick = tl.min(tl.where(best == top, best_idx, V), 0)  # first maximum, as torch.argmax
        tl.store(nodes_ptr + b * (D + 1) + step, node.to(tl.int64))
        child = tl.min(tl.where((par == node) & (tok == pick), cols, NP), 0)
        go = (child < NP) & (step < D)
        bonus = pick
        node = tl.where(go, child, node)
        step = tl.where(go, step + 1, step)
    tl.store(len_ptr + b, step.to(tl.int64))
    tl.store(bonus_ptr + b, bonus.to(tl.int64))




def _pow2_at_least(n: int) -> int:
    return 1 << max(n - 1, 1).bit_length()


def scaled_row_lse_and_min(
    logits: torch.Tensor, inv_temperature: torch.Tensor, *, block: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """ONE read of logits [B, N, V]: (lse [B, N] of logits * inv_temperature[b], min [B, N] of logits), fp32.

    Both are finite exactly when every element of the row is finite (callers check that with one sync).
    """
    batch, cols, vocab = logits.shape
    x = logits.contiguous()
    rows = batch * cols
    block = block or max(16, min(2048, _pow2_at_least(vocab)))
    # few rows: split each row so that ~1000 programs fill the GPU; many rows: one program per row
    splits = max(1, min(1024 // max(rows, 1), vocab // (4 * block)))
    split_len = triton.cdiv(triton.cdiv(vocab, splits), block) * block
    splits = triton.cdiv(vocab, split_len)
    part_max = torch.empty((rows, splits), dtype=torch.float32, device=logits.device)  # [R, S]
    part_sum = torch.empty_like(part_max)
    part_min = torch.empty_like(part_max)
    _split_lse_min_kernel[(rows, splits)](
        x, inv_temperature.to(torch.float32).contiguous(), part_max, part_sum, part_min, vocab, cols, splits,
        SPLIT_LEN=split_len, BLOCK=block, num_warps=8 if block >= 1024 else 4,
    )
    if splits == 1:
        lse, low = part_max + torch.log(part_sum), part_min
    else:
        row_max = part_max.amax(1, keepdim=True)  # [R, 1]
        lse = row_max + torch.log((part_sum * torch.exp(part_max - row_max)).sum(1, keepdim=True))
        low = part_min.amin(1, keepdim=True)
    return lse.view(batch, cols), low.view(batch, cols)


def lazy_walk(
    logits: torch.Tensor,
    lse: torch.Tensor,
    parents: torch.Tensor,
    token_ids: torch.Tensor,
    inv_temperature: torch.Tensor,
    noisy: torch.Tensor,
    uniforms: torch.Tensor,
    max_depth: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sample-and-walk drawing picks only along the walk (one program per request).

    logits [B, N, V] (finite); lse [B, N] fp32 of logits * inv_temperature; parents, token_ids [B, N]
    int64 (a tree: children of a node carry distinct tokens); inv_temperature [B] fp32 (1 for greedy rows);
    noisy [B] bool (False = greedy row: first argmax); uniforms [B, D + 1] fp32 in [0, 1), one per step.
    Returns (accepted_nodes [B, D + 1] int64 root first -1 padded, accept_len [B] int64, bonus [B] int64).
    """
    batch, cols, vocab = logits.shape
    if uniforms.shape != (batch, max_depth + 1):
        raise ValueError(f"uniforms must have shape {(batch, max_depth + 1)}, got {tuple(uniforms.shape)}")
    device = logits.device
    accepted = torch.full((batch, max_depth + 1), -1, dtype=torch.int64, device=device)
    accept_len = torch.empty(batch, dtype=torch.int64, device=device)
    bonus = torch.empty(batch, dtype=torch.int64, device=device)
    block = max(16, min(4096, _pow2_at_least(vocab)))
    _lazy_walk_kernel[(batch,)](
        logits.contiguous(), lse.to(torch.float32).contiguous(), inv_temperature.to(torch.float32).contiguous(),
        noisy.to(torch.int8).contiguous(), uniforms.to(torch.float32).contiguous(),
        parents.to(torch.int32).contiguous(), token_ids.to(torch.int32).contiguous(), accepted, accept_len, bonus,
        vocab, cols, max_depth, BLOCK=block, NP=max(16, _pow2_at_least(cols)), num_warps=8 if block >= 2048 else 4,
    )
    return accepted, accept_len, bonus


@functools.lru_cache(maxsize=8)
def lazy_walk_usable(device: torch.device) -> bool:
    """The lazy walk compiles on `device` and agrees with torch on a probe: lse and min of one read, a
    greedy request walking a full chain, sampled picks in range."""
    if device.type != "cuda" and not _interpreting():
        return False
    key = f"lazy:{device}"
    try:
        gen = torch.Generator(device=device).manual_seed(0)
        logits = torch.randn((2, 4, 3000), generator=gen, device=device) * 4  # [B = 2, N = 4, V]
        inv_t = torch.tensor([1.0, 1.0 / 0.7], device=device)
        noisy = torch.tensor([False, True], device=device)
        lse, low = scaled_row_lse_and_min(logits, inv_t)
        ok = torch.allclose(lse, torch.logsumexp(logits * inv_t.view(2, 1, 1), dim=-1), rtol=1e-5, atol=1e-4)
        ok = ok and torch.equal(low, logits.amin(-1))
        # a chain 0 -> 1 -> 2 -> 3 whose tokens are the parent rows' argmax: greedy accepts all of it
        argmax = logits.argmax(-1)  # [2, 4]
        parents = torch.tensor([[-1, 0, 1, 2]] * 2, device=device)
        tokens = torch.cat([torch.full((2, 1), -1, device=device), argmax[:, :3]], dim=1)
        uniforms = torch.rand((2, 4), generator=gen, device=device)
        nodes, length, bonus = lazy_walk(logits, lse, parents, tokens, inv_t, noisy, uniforms, 3)
        ok = ok and nodes[0].tolist() == [0, 1, 2, 3] and int(length[0]) == 3 and int(bonus[0]) == int(argmax[0, 3])
        ok = ok and 0 <= int(bonus[1]) < 3000 and 0 <= int(length[1]) <= 3
        if not ok:
            TRITON_PROBE_ERRORS[key] = "probe mismatch against torch (lse, min or greedy walk)"
        return bool(ok)
    except Exception as exc:  # noqa: BLE001 - a failing probe means "use a slower path"
        TRITON_PROBE_ERRORS[key] = f"{type(exc).__name__}: {exc}"
        return False
