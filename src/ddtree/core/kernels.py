"""Adapter for SGLang's `tree_speculative_sampling_target_only` and a pure-torch reference of it.

Kernel law with all-zero draft probs and both thresholds 1 (read from the kernel source):
- request b starts at the root (local index 0) with coin u = uniform_samples[b, 0];
- at the current node, children are tried in retrieve order (first child, then next siblings, i.e.
  descending draft probability); with acc = running sum of target_probs[b, node, child token], the
  child is accepted when u <= acc (or when its single prob >= threshold_single = 1). Accepting moves
  to the child, resets acc and takes the child's coin uniform_samples[b, child];
- each rejected child's prob is copied into draft_probs[b, node, token] (so the kernel WRITES into
  draft_probs: pass a fresh zero tensor every call);
- at most S - 1 children are accepted (S = accept_index.shape[1]); after the last accepted node the
  bonus is drawn by inverse CDF with uniform_samples_for_final_sampling[b] from relu(target - draft)
  at that node, i.e. the target restricted to the rejected children's complement (draft probs are
  ignored when the depth limit ended the walk);
- outputs: accept_index[b, :k+1] = flat ids (retrieve_index) of the accepted nodes, root first;
  accept_token_num[b] = k; predicts[flat id of an accepted node] = token emitted there (the next
  accepted child's token, or the bonus at the last one). Other entries are left untouched.
P(child) = p(child) for every child and the bonus law is p restricted to non-children, renormalised:
the same law as sample-and-walk.

The adapter costs a second [B, N, V] fp32 buffer (the zero draft probs the kernel requires).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from ddtree.core.checks import check_dim, check_same_device, check_tensor
from ddtree.core.types import DDTreeBuildResult, RetrieveEncoding, VerifyResult
from ddtree.core.verify import path_result

KERNEL_MODULE = "sglang.kernels.ops.speculative.verify_sampling"
KERNEL_NAME = "tree_speculative_sampling_target_only"

Kernel = Callable[..., None]
KERNEL_ARG_ORDER = (
    "predicts", "accept_index", "accept_token_num", "candidates", "retrive_index", "retrive_next_token",
    "retrive_next_sibling", "uniform_samples", "uniform_samples_for_final_sampling", "target_probs", "draft_probs",
)  # then threshold_single, threshold_acc, deterministic


@functools.lru_cache(maxsize=1)
def load_sglang_kernel() -> Kernel | None:
    """The SGLang kernel when importable and not None (it is None on CPU-only installs), else None."""
    try:
        import importlib

        module = importlib.import_module(KERNEL_MODULE)
    except Exception:  # noqa: BLE001 - any failure to import sglang means "unavailable"
        return None
    return getattr(module, KERNEL_NAME, None)


def reference_tree_speculative_sampling_target_only(
    predicts: torch.Tensor,
    accept_index: torch.Tensor,
    accept_token_num: torch.Tensor,
    candidates: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    uniform_samples: torch.Tensor,
    uniform_samples_for_final_sampling: torch.Tensor,
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    threshold_single: float = 1.0,
    threshold_acc: float = 1.0,
    deterministic: bool = True,
) -> None:
    """Pure-torch reference of the kernel (same signature, outputs written in place).

    Vectorised over requests; loops over depth (S - 1) and over siblings (at most N - 1).
    `deterministic` is accepted for signature compatibility (the reference always is).
    """
    del deterministic
    bs, n = candidates.shape
    steps = accept_index.shape[1]
    vocab = target_probs.shape[-1]
    threshold_acc = max(float(threshold_acc), 1e-9)
    rows = torch.arange(bs, device=candidates.device)

    cur_row = torch.zeros(bs, dtype=torch.int64, device=candidates.device)  # node whose target row is used
    coin = uniform_samples[:, 0].clone()  # [bs]
    last_flat = retrive_index[:, 0].clone()  # [bs]
    accept_index[:, 0] = last_flat.to(accept_index.dtype)
    num_acc = torch.zeros(bs, dtype=torch.int64, device=candidates.device)
    active = torch.ones(bs, dtype=torch.bool, device=candidates.device)

    for _ in range(1, steps):
        cur = torch.where(active, retrive_next_token[rows, cur_row], -1)  # first child or -1
        prob_acc = torch.zeros(bs, dtype=target_probs.dtype, device=target_probs.device)
        moved = torch.zeros(bs, dtype=torch.bool, device=candidates.device)
        for _ in range(max(n - 1, 1)):
            live = cur >= 0  # trying child `cur`
            if not bool(live.any()):  # a host read is fine here: this is the CPU test reference
                break
            c = cur.clamp_min(0)
            token = candidates[rows, c].clamp_min(0)  # [bs]
            p = target_probs[rows, cur_row, token]  # [bs]
            prob_acc = torch.where(live, prob_acc + p, prob_acc)
            accept = live & ((coin <= prob_acc / threshold_acc) | (p >= threshold_single))
            reject = live & ~accept
            draft_probs[rows[reject], cur_row[reject], token[reject]] = p[reject]
            predicts[last_flat[accept]] = token[accept].to(predicts.dtype)
            num_acc = num_acc + accept.to(torch.int64)
            flat = retrive_index[rows, c]
            accept_index[rows[accept], num_acc[accept]] = flat[accept].to(accept_index.dtype)
            last_flat = torch.where(accept, flat, last_flat)
            coin = torch.where(accept, uniform_samples[rows, c], coin)
            cur_row = torch.where(accept, c, cur_row)
            moved |= accept
            cur = torch.where(reject, retrive_next_sibling[rows, c], torch.where(accept, -1, cur))
        active &= moved
    accept_token_num.copy_(num_acc.to(accept_token_num.dtype))

    # Bonus: inverse CDF over relu(target - draft) at the last accepted node.
    q = target_probs[rows, cur_row]  # [bs, V]
    use_draft = (num_acc != steps - 1).unsqueeze(1)  # [bs, 1]
    residual = (q - torch.where(use_draft, draft_probs[rows, cur_row], torch.zeros_like(q))).clamp_min(0)
    u = uniform_samples_for_final_sampling * residual.sum(dim=1)  # [bs]
    cdf = residual.cumsum(dim=1)  # [bs, V]
    positive = residual > 0
    hit = (cdf > u.unsqueeze(1)) & positive  # [bs, V]
    first_hit = hit.to(torch.int8).argmax(dim=1)
    last_positive = vocab - 1 - positive.flip(1).to(torch.int8).argmax(dim=1)
    fallback = torch.where(positive.any(dim=1), last_positive, vocab - 1)
    sampled = torch.where(hit.any(dim=1), first_hit, fallback)
    predicts[last_flat] = sampled.to(predicts.dtype)


def prepare_kernel_args(
    tree: DDTreeBuildResult,
    encoding: RetrieveEncoding,
    probs: torch.Tensor,
    coins: torch.Tensor,
    final_coins: torch.Tensor,
    max_depth: int,
) -> dict[str, torch.Tensor]:
    """Keyword arguments of the kernel for one verify: outputs allocated, fresh zero draft probs.

    probs [B, N, V] fp32 processed target probs; coins [B, N] fp32; final_coins [B] fp32.
    """
    batch, cols = tree.token_ids.shape
    check_tensor("probs", probs, ndim=3, floating=True)
    check_dim("probs", probs, 0, batch, "the tree's batch size")
    check_dim("probs", probs, 1, cols, "the tree's column count N")
    check_same_device("probs", probs, "tree", tree.token_ids)
    for name, value in (("encoding.retrieve_index", encoding.retrieve_index),
                        ("encoding.retrieve_next_token", encoding.retrieve_next_token),
                        ("encoding.retrieve_next_sibling", encoding.retrieve_next_sibling)):
        check_tensor(name, value, ndim=2)
        check_dim(name, value, 0, batch, "the tree's batch size")
        check_dim(name, value, 1, cols, "the tree's column count N")
        check_same_device(name, value, "tree", tree.token_ids)
    device = probs.device
    return {
        "predicts": torch.full((batch * cols,), -1, dtype=torch.int32, device=device),
        "accept_index": torch.full((batch, max_depth + 1), -1, dtype=torch.int32, device=device),
        "accept_token_num": torch.zeros(batch, dtype=torch.int32, device=device),
        # The root's and the padding's token are never read by the kernel; keep them non-negative.
        "candidates": tree.token_ids.clamp_min(0).contiguous(),
        "retrive_index": encoding.retrieve_index.to(torch.int64).contiguous(),
        "retrive_next_token": encoding.retrieve_next_token.to(torch.int64).contiguous(),
        "retrive_next_sibling": encoding.retrieve_next_sibling.to(torch.int64).contiguous(),
        "uniform_samples": coins.to(torch.float32).contiguous(),
        "uniform_samples_for_final_sampling": final_coins.to(torch.float32).contiguous(),
        "target_probs": probs.contiguous(),
        "draft_probs": torch.zeros_like(probs, dtype=torch.float32),  # fresh: the kernel writes into it
    }


def kernel_outputs_to_verify_result(
    tree: DDTreeBuildResult,
    accept_index: torch.Tensor,
    accept_token_num: torch.Tensor,
    predicts: torch.Tensor,
    expected_accept_len: torch.Tensor,
) -> VerifyResult:
    """Convert the kernel's outputs (flat ids, int32) into a VerifyResult (local node indices)."""
    batch, cols = tree.token_ids.shape
    accept_len = accept_token_num.to(torch.int64)  # [B]
    flat = accept_index.to(torch.int64)  # [B, D + 1]
    base = (torch.arange(batch, device=flat.device) * cols).unsqueeze(1)  # [B, 1]
    slots = torch.arange(flat.shape[1], device=flat.device).unsqueeze(0)
    valid = (slots <= accept_len.unsqueeze(1)) & (flat >= 0)
    nodes = torch.where(valid, flat - base, torch.full_like(flat, -1))  # [B, D + 1]
    return path_result(accept_len, nodes, predicts.to(torch.int64).view(batch, cols), expected_accept_len)


def draw_coins(
    batch: int, cols: int, device: torch.device, generator: torch.Generator | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(coins [B, N], final coins [B]) uniform in (0, 1): 0 is lifted to the smallest normal float so a
    zero-probability child is never accepted by `u <= acc` (changes nothing else)."""
    tiny = torch.finfo(torch.float32).tiny
    coins = torch.rand((batch, cols), generator=generator, device=device).clamp_min_(tiny)
    final = torch.rand((batch,), generator=generator, device=device)
    return coins, final


def verify_with_kernel(
    tree: DDTreeBuildResult,
    encoding: RetrieveEncoding,
    probs: torch.Tensor,
    *,
    kernel: Kernel,
    generator: torch.Generator | None = None,
    max_depth: int,
    coins: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> VerifyResult:
    """Sampling verify through `kernel` (SGLang's or the reference) with zero draft probs, thresholds 1.

    probs [B, N, V] fp32 processed target probs (not modified). `coins` overrides the drawn
    (coins [B, N], final coins [B]) so two kernels can be compared on the same randomness.
    """
    from ddtree.core.verify import edge_probs, path_products

    batch, cols = tree.token_ids.shape
    coin_tensors = coins if coins is not None else draw_coins(batch, cols, probs.device, generator)
    args = prepare_kernel_args(tree, encoding, probs, coin_tensors[0], coin_tensors[1], max_depth)
    expected = path_products(tree, edge_probs(tree, probs), max_depth)[:, 1:].sum(dim=1)  # [B]
    # Positional, in the kernel's documented order (custom-op wrappers may rename keywords).
    kernel(*(args[name] for name in KERNEL_ARG_ORDER), 1.0, 1.0, True)
    return kernel_outputs_to_verify_result(
        tree, args["accept_index"], args["accept_token_num"], args["predicts"], expected
    )


# --------------------------------------------------------------------------------------------------
# Fused Triton sampler: one read of the logits, no [B, N, V] float buffer at all.
# --------------------------------------------------------------------------------------------------
# For temperature-only sampling (no top-k / top-p) one pass over each row's logits, in their own dtype,
# yields both what the walk needs and what the expectation needs:
#   - the pick: Gumbel-max / exponential race, argmax_v (x_v / T - log E_v), E_v ~ Exp(1) from Philox keyed
#     by a seed drawn from the caller's generator (on the device: no host sync). It is an exact sample
#     of softmax(x / T) up to the 2^-31 resolution of the uniforms;
#   - the row's logsumexp of x / T, from which p(child) = exp(x_child / T - lse(parent row)).
# Greedy rows (T = 0) take the plain argmax (first maximum on ties, as torch.argmax).
# Used on CUDA, or on CPU under TRITON_INTERPRET=1 (tests).

FUSED_MIN_TEMPERATURE = 0.05  # below this x / T grows large enough that fp32 rounding of x / T matters


@functools.lru_cache(maxsize=1)
def _gumbel_rows_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def race_step(x_ptr, base, idx, V, row_ok, inv_t, noisy, bits, run_max, acc, best, best_idx):
        """Consume one [R, SUB] chunk: online logsumexp and the exponential race (see below)."""
        msk = row_ok[:, None] & (idx < V)[None, :]  # [R, SUB]
        x = tl.load(x_ptr + base[:, None] + idx[None, :], mask=msk, other=0.0).to(tl.float32)
        # padding lanes -inf; padding rows 0 (keeps their dead arithmetic free of inf - inf)
        s = tl.where(msk, x * inv_t[:, None], tl.where(row_ok[:, None], float("-inf"), 0.0))
        new_max = tl.maximum(run_max, tl.max(s, 1))  # [R]
        alpha = tl.exp(run_max - new_max)  # [R], rescales everything kept relative to the old max
        e = tl.exp(s - new_max[:, None])  # [R, SUB] unnormalised probabilities
        acc = acc * alpha[:, None] + e
        # Exponential race: the pick is argmax(e / E) with E ~ Exp(1) i.i.d. E = -log(1 - w), w uniform in
        # (0, 1) built from the raw 31-bit integer, so the WINNING tail (E, w near 0) has the integer's fine
        # resolution and E is never 0 (a float uniform rounding to 1.0 would let a random token win).
        bits = bits.to(tl.int32, bitcast=True)
        bits = tl.where(bits < 0, ~bits, bits)  # uniform on [0, 2^31 - 1]
        w = (bits.to(tl.float32) + 0.5) * 4.656612873077393e-10  # (0, 1]
        w_big = tl.minimum(tl.maximum(w, 1e-3), 0.99999994)  # clamped: no log(0) in the unused branch
        expo = tl.where(w < 1e-3, w * (1.0 + w * (0.5 + w * (1.0 / 3.0))), -tl.log(1.0 - w_big))
        # Sampled rows race in units of exp(s - running max) (rescaled by alpha); greedy rows compare s.
        cand = tl.where(noisy[:, None], e / expo, s)
        cand = tl.where(msk, cand, float("-inf"))
        best = best * tl.where(noisy, alpha, 1.0)[:, None]
        better = cand > best  # strict: a lane keeps its first maximum
        best = tl.where(better, cand, best)
        best_idx = tl.where(better, idx[None, :], best_idx)
        return new_max, acc, best, best_idx

    # Triton resolves callees through the module's globals, not the enclosing scope: publish the helper
    # there (kept inside this factory so importing this module never needs triton).
    globals()["_fused_race_step"] = race_step

    @triton.jit
    def gumbel_rows(x_ptr, inv_t_ptr, noisy_ptr, seed_ptr, token_ptr, lse_ptr, V, total_rows, rows_per_request,
                    ROWS: tl.constexpr, SUB: tl.constexpr):
        rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)  # [R] rows of this program
        row_ok = rows < total_rows
        request = rows // rows_per_request
        inv_t = tl.load(inv_t_ptr + request, mask=row_ok, other=1.0)  # [R]
        noisy = tl.load(noisy_ptr + request, mask=row_ok, other=0) != 0  # [R]
        seeds = tl.load(seed_ptr) + rows  # [R], one Philox key per row
        base = rows.to(tl.int64) * V  # [R]
        offs = tl.arange(0, SUB)
        run_max = tl.full([ROWS], float("-inf"), tl.float32)
        acc = tl.zeros([ROWS, SUB], tl.float32)  # per-lane sum of exp(s - run_max)
        best = tl.where(noisy[:, None], tl.full([ROWS, SUB], -1.0, tl.float32), float("-inf"))
        best_idx = tl.zeros([ROWS, SUB], tl.int32)
        for start in range(0, V, 4 * SUB):
            # one Philox call yields the randomness of four chunks
            r0, r1, r2, r3 = tl.randint4x(seeds[:, None], (start // 4 + offs)[None, :])
            run_max, acc, best, best_idx = _fused_race_step(x_ptr, base, start + offs, V, row_ok, inv_t, noisy, r0,
                                                     run_max, acc, best, best_idx)
            run_max, acc, best, best_idx = _fused_race_step(x_ptr, base, start + SUB + offs, V, row_ok, inv_t, noisy,
                                                     r1, run_max, acc, best, best_idx)
            run_max, acc, best, best_idx = _fused_race_step(x_ptr, base, start + 2 * SUB + offs, V, row_ok, inv_t,
                                                     noisy, r2, run_max, acc, best, best_idx)
            run_max, acc, best, best_idx = _fused_race_step(x_ptr, base, start + 3 * SUB + offs, V, row_ok, inv_t,
                                                     noisy, r3, run_max, acc, best, best_idx)
        lse = run_max + tl.log(tl.sum(acc, 1))  # [R]
        top = tl.max(best, 1)
        token = tl.min(tl.where(best == top[:, None], best_idx, V), 1)  # first index among the lanes' maxima
        tl.store(token_ptr + rows, token, mask=row_ok)
        tl.store(lse_ptr + rows, lse, mask=row_ok)

    return gumbel_rows


def triton_sampler_importable() -> bool:
    try:
        _gumbel_rows_kernel()
    except Exception:  # noqa: BLE001 - triton missing or broken
        return False
    return True


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _interpreting() -> bool:
    import os

    return os.environ.get("TRITON_INTERPRET") == "1"


def gumbel_sample_rows(
    logits: torch.Tensor,
    inv_temperature: torch.Tensor,
    noisy: torch.Tensor,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One pick per row of logits [B, N, V] and the row logsumexp of logits * inv_temperature.

    inv_temperature [B] fp32 (1 for greedy rows); noisy [B] bool (False = greedy row: plain argmax).
    Returns (tokens [B, N] int64, lse [B, N] fp32).
    """
    batch, cols, vocab = logits.shape
    kernel = _gumbel_rows_kernel()
    x = logits.contiguous()
    rows = batch * cols
    tokens = torch.empty(rows, dtype=torch.int32, device=logits.device)
    lse = torch.empty(rows, dtype=torch.float32, device=logits.device)
    seed = torch.randint(0, 2**30, (1,), generator=generator, device=logits.device, dtype=torch.int32)
    # Each loop step reads 4 chunks of `sub` columns (one Philox call); small vocabularies (tests, the
    # interpreter) pack several rows per program.
    sub = max(2, min(512, 1 << max(triton_cdiv(vocab, 4) - 1, 1).bit_length()))
    rows_per_program = max(1, min(256, 2048 // (4 * sub)))
    grid = (triton_cdiv(rows, rows_per_program),)
    kernel[grid](
        x, inv_temperature.to(torch.float32).contiguous(), noisy.to(torch.int8).contiguous(), seed,
        tokens, lse, vocab, rows, cols, ROWS=rows_per_program, SUB=sub, num_warps=8 if sub >= 256 else 4,
    )
    return tokens.view(batch, cols).to(torch.int64), lse.view(batch, cols)


TRITON_PROBE_ERRORS: dict[str, str] = {}  # device -> why the probe failed (for selfcheck and tests)


def _probe_sampler(sample_rows: Callable, device: torch.device, error_key: str) -> bool:
    """Run `sample_rows` on a small probe on `device` and compare with torch (lse, greedy argmax, range).

    Any failure is recorded in TRITON_PROBE_ERRORS[error_key] and means "use a slower path".
    """
    if device.type != "cuda" and not _interpreting():
        return False
    if not triton_sampler_importable():
        return False
    try:
        gen = torch.Generator(device=device).manual_seed(0)
        logits = torch.randn((3, 5, 3000), generator=gen, device=device) * 4
        inv_t = torch.tensor([1.0, 1.0 / 0.7, 1.0], device=device)
        noisy = torch.tensor([False, True, True], device=device)
        tokens, lse = sample_rows(logits, inv_t, noisy, gen)
        want_lse = torch.logsumexp(logits * inv_t.view(3, 1, 1), dim=-1)
        ok = torch.allclose(lse, want_lse, rtol=1e-5, atol=1e-4)
        ok = ok and torch.equal(tokens[0], logits[0].argmax(-1))
        ok = ok and bool(((tokens >= 0) & (tokens < 3000)).all())
        if not ok:
            TRITON_PROBE_ERRORS[error_key] = "probe mismatch against torch (lse or greedy argmax)"
        return bool(ok)
    except Exception as exc:  # noqa: BLE001 - a failing probe means "use a slower path"
        TRITON_PROBE_ERRORS[error_key] = f"{type(exc).__name__}: {exc}"
        return False


@functools.lru_cache(maxsize=8)
def triton_sampler_usable(device: torch.device) -> bool:
    """The Gumbel-race sampler is importable, on CUDA (or interpreted), and passes the probe on `device`."""
    return _probe_sampler(gumbel_sample_rows, device, str(device))


# --------------------------------------------------------------------------------------------------
# Inverse-CDF Triton sampler (default fused path): two reads of each row, ONE uniform per row.
# --------------------------------------------------------------------------------------------------
# Design and expected cost (H200, bf16 logits, V = 151,936, B = 64, N = 129: 2.5 GB of logits):
#   pass 1 streams the row once: block-wise online max m and Z = sum exp(x / T - m) (fp32), and the
#          row argmax (first maximum) for greedy rows;
#   u ~ U[0, 1) per row comes from torch.rand with the caller's generator (seeding works), target = u * Z;
#   pass 2 streams the row again: running block sums of exp(x / T - m); the block where the running sum
#          first crosses the target is searched with tl.cumsum. If rounding leaves the target past the last
#          positive-mass token the pick is clamped to that token (as `sample_from_probs_`).
#   Output: token per row and lse = m + log Z per row (edge probabilities p = exp(x / T - lse) need only
#   a [B, N] gather of the logits afterwards).
#   Cost: 2 reads + 2 exps per element and no per-element RNG / log, versus the Gumbel race's 1 read +
#   Philox + exp + log + div per element (compute-bound, ~3x a read): expected ~1.2 ms at 64/128, i.e. about
#   2 reads, near the greedy argmax + finiteness passes. One program per row (33 rows at B = 1 still spread
#   over 33 SMs; each streams ~0.6 MB, a few tens of microseconds).


@functools.lru_cache(maxsize=1)
def _cdf_rows_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def cdf_rows(x_ptr, inv_t_ptr, noisy_ptr, u_ptr, token_ptr, lse_ptr, V, rows_per_request,
                 BLOCK: tl.constexpr):
        row = tl.program_id(0)
        request = row // rows_per_request
        inv_t = tl.load(inv_t_ptr + request)
        noisy = tl.load(noisy_ptr + request) != 0
        base = row.to(tl.int64) * V
        offs = tl.arange(0, BLOCK)
        m = tl.max(tl.full([BLOCK], float("-inf"), tl.float32), 0)  # scalar running max of x / T
        z = tl.sum(tl.zeros([BLOCK], tl.float32), 0)  # scalar sum of exp(x / T - m)
        best = tl.full([BLOCK], float("-inf"), tl.float32)  # per-lane max of raw x (greedy rows)
        best_idx = tl.zeros([BLOCK], tl.int32)
        for start in range(0, V, BLOCK):
            idx = start + offs
            msk = idx < V
            x = tl.load(x_ptr + base + idx, mask=msk, other=float("-inf")).to(tl.float32)
            s = x * inv_t
            new_m = tl.maximum(m, tl.max(s, 0))  # finite: every block holds at least one real (finite) lane
            z = z * tl.exp(m - new_m) + tl.sum(tl.where(msk, tl.exp(s - new_m), 0.0), 0)
            m = new_m
            better = x > best  # strict: a lane keeps its first maximum
            best = tl.where(better, x, best)
            best_idx = tl.where(better, idx, best_idx)
        top = tl.max(best, 0)
        token = tl.min(tl.where(best == top, best_idx, V), 0)  # first maximum
        if noisy:
            target = tl.load(u_ptr + row) * z
            run = tl.sum(tl.zeros([BLOCK], tl.float32), 0)
            found = tl.min(tl.full([BLOCK], V, tl.int32), 0)  # V = not found yet
            last_pos = tl.max(tl.full([BLOCK], -1, tl.int32), 0)
            for start in range(0, V, BLOCK):
                idx = start + offs
                msk = idx < V
                x = tl.load(x_ptr + base + idx, mask=msk, other=float("-inf")).to(tl.float32)
                e = tl.where(msk, tl.exp(x * inv_t - m), 0.0)  # [BLOCK]
                positive = e > 0
                hit = ((run + tl.cumsum(e, 0)) > target) & positive
                first = tl.min(tl.where(hit, idx, V), 0)
                found = tl.where(found == V, first, found)
                last_pos = tl.maximum(last_pos, tl.max(tl.where(positive, idx, -1), 0))
                run += tl.sum(e, 0)
            token = tl.where(found < V, found, last_pos)
        tl.store(token_ptr + row, token)
        tl.store(lse_ptr + row, m + tl.log(z))

    return cdf_rows


def cdf_sample_rows(
    logits: torch.Tensor,
    inv_temperature: torch.Tensor,
    noisy: torch.Tensor,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Same contract as `gumbel_sample_rows`, by inverse CDF with one uniform per row.

    logits [B, N, V] (finite; callers check); inv_temperature [B] fp32; noisy [B] bool.
    Returns (tokens [B, N] int64, lse [B, N] fp32 = logsumexp(logits * inv_temperature)).
    """
    batch, cols, vocab = logits.shape
    kernel = _cdf_rows_kernel()
    x = logits.contiguous()
    rows = batch * cols
    tokens = torch.empty(rows, dtype=torch.int32, device=logits.device)
    lse = torch.empty(rows, dtype=torch.float32, device=logits.device)
    uniforms = torch.rand((rows,), generator=generator, device=logits.device)  # [rows]
    block = max(16, min(4096, 1 << max(vocab - 1, 1).bit_length()))
    kernel[(rows,)](
        x, inv_temperature.to(torch.float32).contiguous(), noisy.to(torch.int8).contiguous(), uniforms,
        tokens, lse, vocab, cols, BLOCK=block, num_warps=8 if block >= 2048 else 4,
    )
    return tokens.view(batch, cols).to(torch.int64), lse.view(batch, cols)


@functools.lru_cache(maxsize=8)
def cdf_sampler_usable(device: torch.device) -> bool:
    """The inverse-CDF sampler compiles on `device` and agrees with torch on the probe."""
    return _probe_sampler(cdf_sample_rows, device, f"cdf:{device}")


# --------------------------------------------------------------------------------------------------
# Lazy sample-and-walk (default fused path): ONE read of every row, then draws only along the walk.
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


@functools.lru_cache(maxsize=1)
def _lazy_kernels():
    import triton
    import triton.language as tl

    @triton.jit
    def split_lse_min(x_ptr, inv_t_ptr, max_ptr, sum_ptr, min_ptr, V, rows_per_request, num_splits,
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
    def lazy_walk(x_ptr, lse_ptr, inv_t_ptr, noisy_ptr, u_ptr, parents_ptr, tokens_ptr, nodes_ptr, len_ptr,
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

    return split_lse_min, lazy_walk


def _pow2_at_least(n: int) -> int:
    return 1 << max(n - 1, 1).bit_length()


def scaled_row_lse_and_min(
    logits: torch.Tensor, inv_temperature: torch.Tensor, *, block: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """ONE read of logits [B, N, V]: (lse [B, N] of logits * inv_temperature[b], min [B, N] of logits), fp32.

    Both are finite exactly when every element of the row is finite (callers check that with one sync).
    """
    batch, cols, vocab = logits.shape
    split_kernel, _ = _lazy_kernels()
    x = logits.contiguous()
    rows = batch * cols
    block = block or max(16, min(2048, _pow2_at_least(vocab)))
    # few rows: split each row so that ~1000 programs fill the GPU; many rows: one program per row
    splits = max(1, min(1024 // max(rows, 1), vocab // (4 * block)))
    split_len = triton_cdiv(triton_cdiv(vocab, splits), block) * block
    splits = triton_cdiv(vocab, split_len)
    part_max = torch.empty((rows, splits), dtype=torch.float32, device=logits.device)  # [R, S]
    part_sum = torch.empty_like(part_max)
    part_min = torch.empty_like(part_max)
    split_kernel[(rows, splits)](
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
    _, walk_kernel = _lazy_kernels()
    device = logits.device
    accepted = torch.full((batch, max_depth + 1), -1, dtype=torch.int64, device=device)
    accept_len = torch.empty(batch, dtype=torch.int64, device=device)
    bonus = torch.empty(batch, dtype=torch.int64, device=device)
    block = max(16, min(4096, _pow2_at_least(vocab)))
    walk_kernel[(batch,)](
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
        _lazy_kernels()
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
