"""Tree attention over slot caches as one Triton kernel (split-KV, flash-decoding style), for CUDA.

What every forward of the engine attends to has one structure (`Visibility`): a context prefix of the
slot, rows [0, context_len[b]), that every token sees, and the forward's own T tokens, whose K/V sit in rows
[own_start[b], own_start[b] + T) and which see each other through an own-token mask [B, T, T] (causal for a
prefill, ancestor-only for a tree, all-ones for the drafter's block). The torch reference
(`ddtree.engine.fast_model.grouped_attention`) turns that into an additive bias over the whole slot
capacity and calls SDPA; this kernel reads only the visible rows, in place, and never builds the bias.

Why a kernel: at batch 1 a decode step or a small tree has 4-16 query rows per K/V head, so SDPA's
kernels run a handful of programs over the whole capacity while the GPU has 132 SMs. Here the key range
(context + own tokens, a virtual concatenation) is split over SPLITS programs per (row, K/V head, query
block), each keeping an online softmax; the split that finishes last merges them by their log-sum-exp in the
same launch (a ticket counter per tile). Context rows are read as one contiguous range without the mask; only
the own tokens read the own-token mask. The context length is read on the device, so one CUDA graph serves
every length; SPLITS depends only on shapes.

Layouts: q [B, T, h, d] (the q/k/v projection's output viewed per head, any strides with d contiguous);
keys / values [B, h_kv, S, d] (slot views of the cache); output [B, T, h * d]. Query heads kvh * g .. kvh *
g + g - 1 share K/V head kvh (Hugging Face's repeat_kv order).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs: the torch path is used
    triton = None

HAS_TRITON = triton is not None


def available(device: torch.device) -> bool:
    """Whether the kernel can run for tensors on `device` (CUDA with triton; the CPU only under the interpreter)."""
    import os

    if not HAS_TRITON:
        return False
    return device.type == "cuda" or os.environ.get("TRITON_INTERPRET", "") == "1"


@dataclass(frozen=True)
class Launch:
    """Launch parameters of `tree_attention`: query rows per program (BLOCK_M), key tile (BLOCK_N), programs
    per key range (SPLITS; 1 writes the output directly, more go through the log-sum-exp merge), Triton's
    num_warps / num_stages. Checked on construction, so a bad override fails before anything compiles."""

    block_m: int
    block_n: int
    splits: int
    num_warps: int = 4
    num_stages: int = 2

    def __post_init__(self) -> None:
        for name in ("block_m", "block_n", "splits", "num_warps", "num_stages"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"Launch.{name} must be a positive int, got {value!r}")
        # tl.arange and tl.dot need power-of-two tiles of at least 16; Triton needs power-of-two warp counts
        for name, low in (("block_m", 16), ("block_n", 16), ("num_warps", 1)):
            value = getattr(self, name)
            if value < low or value & (value - 1):
                raise ValueError(f"Launch.{name} must be a power of two >= {low}, got {value}")


def launch_shape(batch: int, kv_heads: int, query_rows: int, capacity: int, device: torch.device,
                 head_dim: int = 128) -> Launch:
    """The default launch of a forward on `device` (`launch_rule` with its SM count; 4 off CUDA)."""
    sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 4
    return launch_rule(batch, kv_heads, query_rows, capacity, sms, head_dim)


def launch_rule(batch: int, kv_heads: int, query_rows: int, capacity: int, sms: int, head_dim: int = 128) -> Launch:
    """The default launch for a GPU of `sms` SMs (fixed by shapes, so graph-capturable). Fitted to the H200 launch
    sweeps of the kernel with the merge in the same launch (`benchmarks/attention_launch_sweep.py`, Qwen3-8B heads at
    context 512 and the `gpu` pair's heads at context 256; benchmarks/results/2026-12-03/h200-s11): within 7% of the
    best launch in all 16 tree / block cells (a decode step keeps the session-8 rule, within 5%).

    - a decode step (<= 16 query rows per K/V head): short key tiles, the key range split until the grid holds
      about two waves (at most 8 splits);
    - a tree or block at batch <= 2: 16-row query blocks, 64-key tiles, 4 splits while the tiles fill less than two
      waves (the merge costs no second launch, so splitting pays), else none;
    - larger batches: one split; 64-row blocks (16 when a row has at most 48 query rows).
    Pipeline stages: 3 at head dim <= 64, 2 above (3 measured slower at head dim 128 in most cells: more shared
    memory per program), except 8 warps and 3 stages for 64-row blocks of at most 128 rows at head dim 128 (the
    sweep's best there, 1.34x faster than 4 warps and 2 stages)."""

    def floor_pow2(n: int) -> int:  # splits are powers of two: the sweep's grid
        return 1 << (max(1, n).bit_length() - 1)

    def splits_for(tiles: int, waves: int, block_n: int) -> int:
        return floor_pow2(min(8, (waves * sms) // max(tiles, 1), triton.cdiv(capacity, block_n)))

    stages = 3 if head_dim <= 64 else 2
    if query_rows <= 16:
        return Launch(16, 32, splits_for(batch * kv_heads, 2, 32), num_warps=4, num_stages=3)
    if batch <= 2:
        tiles = batch * kv_heads * triton.cdiv(query_rows, 16)
        splits = floor_pow2(min(4, triton.cdiv(capacity, 64))) if tiles < 2 * sms else 1
        return Launch(16, 64, splits, num_warps=4, num_stages=stages)
    if query_rows <= 48:
        return Launch(16, 64, 1, num_warps=4, num_stages=stages)
    if head_dim > 64 and query_rows <= 128:
        return Launch(64, 64, 1, num_warps=8, num_stages=3)
    return Launch(64, 64, 1, num_warps=4, num_stages=stages)


_COUNTERS: dict[torch.device, torch.Tensor] = {}
_OUTGROWN: list[torch.Tensor] = []


def _split_counters(device: torch.device, tiles: int) -> torch.Tensor:
    """Zeroed int32 tickets, one per output tile, shared by every split launch on `device`: each launch leaves
    its tiles' tickets at zero again, and launches on one stream run one after another. Grown (never shrunk)
    on demand; the engine's eager warm-up reaches every shape before any graph capture, so a capture only
    ever sees the buffer already allocated."""
    buf = _COUNTERS.get(device)
    if buf is None or buf.numel() < tiles:
        if buf is not None:
            _OUTGROWN.append(buf)  # a captured graph may still point at it
        buf = torch.zeros(max(tiles, 4096), device=device, dtype=torch.int32)
        _COUNTERS[device] = buf
    return buf


def tree_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, context_len: torch.Tensor,
                   own_start: torch.Tensor, own_mask: torch.Tensor, launch: Launch | None = None) -> torch.Tensor:
    """q [B, T, h, d]; keys / values [B, h_kv, S, d]; context_len / own_start [B] int64; own_mask [B, T, T]
    bool (query token i sees own token j); launch overrides `launch_shape` (benchmarks, tests). Returns
    [B, T, h * d] in q's dtype."""
    b, t, h, d = q.shape
    kv, capacity = keys.shape[1], keys.shape[2]
    g = h // kv
    rows = g * t
    if q.stride(-1) != 1 or keys.stride(-1) != 1 or values.stride(-1) != 1:
        raise ValueError("tree_attention: the head dimension must be contiguous")
    if d not in (16, 32, 64, 128, 256):
        raise ValueError(f"tree_attention: head_dim {d} is not a power of two in [16, 256]")
    if launch is None:
        launch = launch_shape(b, kv, rows, capacity, q.device, d)
    elif not isinstance(launch, Launch):
        raise ValueError(f"tree_attention: launch must be a Launch, got {type(launch).__name__}")
    block_m, splits = launch.block_m, launch.splits
    mask = own_mask.contiguous().view(torch.uint8)  # bool -> bytes, no copy when already contiguous
    out = torch.empty((b, t, h, d), device=q.device, dtype=q.dtype)
    m_blocks = triton.cdiv(rows, block_m)
    direct = splits == 1
    if direct:
        part = lse = counters = out  # unused placeholders
    else:
        part = torch.empty((b, kv, splits, rows, d), device=q.device, dtype=torch.float32)
        lse = torch.empty((b, kv, splits, rows), device=q.device, dtype=torch.float32)
        counters = _split_counters(q.device, b * kv * m_blocks)
    _tree_attention_splits[(b * kv, m_blocks, splits)](
        q, keys, values, context_len, own_start, mask, part, lse, counters, out,
        q.stride(0), q.stride(1), q.stride(2),
        keys.stride(0), keys.stride(1), keys.stride(2),
        values.stride(0), values.stride(1), values.stride(2),
        mask.stride(0), mask.stride(1),
        t, kv, 1.0 / math.sqrt(d),
        G=g, D=d, BLOCK_M=block_m, BLOCK_N=launch.block_n, SPLITS=splits, DIRECT=direct,
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32", num_warps=launch.num_warps,
        num_stages=launch.num_stages,
    )
    return out.view(b, t, h * d)


if HAS_TRITON:

    @triton.jit
    def _softmax_step(q, k, v, visible, m_i, l_i, acc, sm_scale, PRECISION: tl.constexpr):
        """One key tile of the online softmax: scores, the running max / sum rescaled, P @ V accumulated."""
        s = tl.dot(q, k, input_precision=PRECISION) * sm_scale  # [BLOCK_M, BLOCK_N] fp32
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows that saw nothing yet stay at zero
        p = tl.exp(s - m_safe[:, None])
        alpha = tl.exp(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        return m_new, l_i, acc

    @triton.jit
    def _tree_attention_splits(
        Q, K, V, CTX, OWN, MASK, PART, LSE, COUNT, OUT,
        s_qb, s_qt, s_qh, s_kb, s_kh, s_ks, s_vb, s_vh, s_vs, s_mb, s_mi,
        T, H_KV, sm_scale,
        G: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
        SPLITS: tl.constexpr, DIRECT: tl.constexpr, PRECISION: tl.constexpr,
    ):
        pid = tl.program_id(0)
        b = pid // H_KV
        kvh = pid % H_KV
        split = tl.program_id(2)
        rows = G * T
        offs_m = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)  # query row m = t * G + g
        offs_d = tl.arange(0, D)
        offs_n = tl.arange(0, BLOCK_N)
        m_valid = offs_m < rows
        tok = offs_m // G
        head = kvh * G + offs_m % G
        q = tl.load(Q + b * s_qb + tok[:, None] * s_qt + head[:, None] * s_qh + offs_d[None, :],
                    mask=m_valid[:, None], other=0.0)
        ctx = tl.load(CTX + b)
        own = tl.load(OWN + b)
        # this split's share of the virtual key range (the context rows, then the own tokens), in whole tiles
        chunk = tl.cdiv(tl.cdiv(ctx + T, SPLITS), BLOCK_N) * BLOCK_N
        start = split * chunk
        end = tl.minimum(start + chunk, ctx + T)
        k_base = K + b * s_kb + kvh * s_kh
        v_base = V + b * s_vb + kvh * s_vh
        m_i = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
        l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)
        acc = tl.zeros((BLOCK_M, D), dtype=tl.float32)
        # context rows [start, min(end, ctx)): contiguous and seen by every query, so no mask to read
        ctx_end = tl.minimum(end, ctx)
        for n0 in range(start, ctx_end, BLOCK_N):
            n = n0 + offs_n
            n_valid = n < ctx_end
            k = tl.load(k_base + n[None, :] * s_ks + offs_d[:, None], mask=n_valid[None, :], other=0.0)
            v = tl.load(v_base + n[:, None] * s_vs + offs_d[None, :], mask=n_valid[:, None], other=0.0)
            m_i, l_i, acc = _softmax_step(q, k, v, n_valid[None, :], m_i, l_i, acc, sm_scale, PRECISION)
        # own tokens j in [max(start, ctx), end) - ctx, at rows own + j, seen through the own-token mask
        own_end = end - ctx
        for j0 in range(tl.maximum(start, ctx) - ctx, own_end, BLOCK_N):
            j = j0 + offs_n
            j_valid = j < own_end
            k = tl.load(k_base + (own + j)[None, :] * s_ks + offs_d[:, None], mask=j_valid[None, :], other=0.0)
            v = tl.load(v_base + (own + j)[:, None] * s_vs + offs_d[None, :], mask=j_valid[:, None], other=0.0)
            seen = tl.load(MASK + b * s_mb + tok[:, None] * s_mi + j[None, :],
                           mask=m_valid[:, None] & j_valid[None, :], other=0)
            m_i, l_i, acc = _softmax_step(q, k, v, seen != 0, m_i, l_i, acc, sm_scale, PRECISION)
        has = l_i > 0
        o = acc / tl.where(has, l_i, 1.0)[:, None]
        out_ptr = OUT + ((b * T + tok[:, None]) * (H_KV * G) + head[:, None]) * D + offs_d[None, :]
        if DIRECT:
            tl.store(out_ptr, o.to(OUT.dtype.element_ty), mask=m_valid[:, None])
        else:
            # Split-K with the merge in the same launch: every split stores its partial result, then takes a
            # ticket; the split that finishes last merges them and resets the counter for the next launch.
            # (A second merge kernel cost as much as the attention at small shapes: its launch and its gap.)
            lse = tl.where(has, m_i + tl.log(tl.where(has, l_i, 1.0)), float("-inf"))
            tile = pid * tl.num_programs(1) + tl.program_id(1)
            base = (pid * SPLITS + split) * rows
            tl.store(PART + (base + offs_m[:, None]) * D + offs_d[None, :], o, mask=m_valid[:, None])
            tl.store(LSE + base + offs_m, lse, mask=m_valid)
            tl.debug_barrier()  # every thread's partial is written before the ticket releases it
            ticket = tl.atomic_add(COUNT + tile, 1, sem="acq_rel", scope="gpu")
            if ticket == SPLITS - 1:
                m_run = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
                w_sum = tl.zeros((BLOCK_M,), dtype=tl.float32)
                merged = tl.zeros((BLOCK_M, D), dtype=tl.float32)
                for other in range(SPLITS):
                    at = (pid * SPLITS + other) * rows
                    part_lse = tl.load(LSE + at + offs_m, mask=m_valid, other=float("-inf"), cache_modifier=".cg")
                    m_new = tl.maximum(m_run, part_lse)
                    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
                    alpha = tl.exp(m_run - m_safe)
                    w = tl.exp(part_lse - m_safe)
                    part = tl.load(PART + (at + offs_m[:, None]) * D + offs_d[None, :], mask=m_valid[:, None],
                                   other=0.0, cache_modifier=".cg")
                    merged = merged * alpha[:, None] + w[:, None] * part
                    w_sum = w_sum * alpha + w
                    m_run = m_new
                o = merged / tl.where(w_sum > 0, w_sum, 1.0)[:, None]
                tl.store(out_ptr, o.to(OUT.dtype.element_ty), mask=m_valid[:, None])
                tl.atomic_xchg(COUNT + tile, 0)


def qkv_epilogue(qkv: torch.Tensor, q_heads: int, kv_heads: int, head_dim: int, positions: torch.Tensor,
                 q_norm: torch.Tensor | None, k_norm: torch.Tensor | None, rows: torch.Tensor,
                 keys: torch.Tensor, values: torch.Tensor, eps: float, inv_freq: torch.Tensor) -> torch.Tensor | None:
    """Everything between the q/k/v projection and attention in one launch: per-head RMSNorm of q and k
    (Qwen3; none when the weights are None), RoPE at `positions` (halves layout, cos/sin rounded to the
    model dtype as Hugging Face does), k and v written to cache rows `rows`, q returned.

    qkv [B, T, (q_heads + 2 kv_heads) d] (any strides, d contiguous); positions / rows [B, T] int64;
    keys / values [B, h_kv, S, d] slot views; inv_freq [d / 2] fp32 (`rope_inv_freq`). Returns q [B, T, q_heads, d] (None when q_heads == 0: the
    drafter's context write projects k and v only)."""
    b, t, width = qkv.shape
    d = head_dim
    if width != (q_heads + 2 * kv_heads) * d or qkv.stride(-1) != 1:
        raise ValueError(f"qkv_epilogue: qkv of width {width} (stride {qkv.stride(-1)}) does not hold "
                         f"{q_heads} + 2 x {kv_heads} contiguous heads of {d}")
    q = torch.empty((b, t, max(q_heads, 1), d), device=qkv.device, dtype=qkv.dtype)
    has_norm = k_norm is not None
    _qkv_epilogue[(b * t, q_heads + kv_heads)](
        qkv, positions, inv_freq, q_norm if q_norm is not None else qkv, k_norm if has_norm else qkv, rows, keys, values, q,
        qkv.stride(0), qkv.stride(1), positions.stride(0), rows.stride(0),
        keys.stride(0), keys.stride(1), keys.stride(2), values.stride(0), values.stride(1), values.stride(2),
        t, q_heads, kv_heads, eps,
        D=d, HAS_NORM=has_norm, num_warps=1,
    )
    return q if q_heads else None


if HAS_TRITON:

    @triton.jit
    def _norm_rope_row(x_ptr, w_ptr, pos, inv_freq_ptr, eps, D: tl.constexpr, HAS_NORM: tl.constexpr):
        """One head row [D] -> RMSNorm (fp32, rounded, times the weight, rounded) -> RoPE, in fp32."""
        half: tl.constexpr = D // 2
        offs = tl.arange(0, half)
        x1 = tl.load(x_ptr + offs)
        x2 = tl.load(x_ptr + half + offs)
        dtype = x1.dtype
        a = x1.to(tl.float32)
        c = x2.to(tl.float32)
        if HAS_NORM:
            r = tl.rsqrt((tl.sum(a * a, axis=0) + tl.sum(c * c, axis=0)) / D + eps)
            a = ((a * r).to(dtype).to(tl.float32) * tl.load(w_ptr + offs).to(tl.float32)).to(dtype).to(tl.float32)
            c = ((c * r).to(dtype).to(tl.float32) * tl.load(w_ptr + half + offs).to(tl.float32)).to(dtype).to(tl.float32)
        angle = pos.to(tl.float32) * tl.load(inv_freq_ptr + offs)
        cos = tl.cos(angle).to(dtype).to(tl.float32)
        sin = tl.sin(angle).to(dtype).to(tl.float32)
        return a * cos - c * sin, c * cos + a * sin

    @triton.jit
    def _qkv_epilogue(
        QKV, POS, INV_FREQ, QN, KN, ROWS, K, V, QOUT,
        s_xb, s_xt, s_pb, s_rb, s_kb, s_kh, s_ks, s_vb, s_vh, s_vs,
        T, HQ, HKV, eps,
        D: tl.constexpr, HAS_NORM: tl.constexpr,
    ):
        token = tl.program_id(0)  # b * T + t
        head = tl.program_id(1)  # q heads first, then kv heads
        b = token // T
        t = token % T
        half: tl.constexpr = D // 2
        offs = tl.arange(0, half)
        pos = tl.load(POS + b * s_pb + t)
        base = QKV + b * s_xb + t * s_xt
        if head < HQ:
            lo, hi = _norm_rope_row(base + head * D, QN, pos, INV_FREQ, eps, D, HAS_NORM)
            out = QOUT + (token * HQ + head) * D
            tl.store(out + offs, lo.to(QOUT.dtype.element_ty))
            tl.store(out + half + offs, hi.to(QOUT.dtype.element_ty))
        else:
            kvh = head - HQ
            row = tl.load(ROWS + b * s_rb + t)
            lo, hi = _norm_rope_row(base + (HQ + kvh) * D, KN, pos, INV_FREQ, eps, D, HAS_NORM)
            k_out = K + b * s_kb + kvh * s_kh + row * s_ks
            tl.store(k_out + offs, lo.to(K.dtype.element_ty))
            tl.store(k_out + half + offs, hi.to(K.dtype.element_ty))
            full = tl.arange(0, D)
            v = tl.load(base + (HQ + HKV + kvh) * D + full)
            tl.store(V + b * s_vb + kvh * s_vh + row * s_vs + full, v)
