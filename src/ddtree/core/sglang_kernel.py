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
from ddtree.core.walk import edge_probs, path_products, path_result

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
    batch, cols = tree.token_ids.shape
    coin_tensors = coins if coins is not None else draw_coins(batch, cols, probs.device, generator)
    args = prepare_kernel_args(tree, encoding, probs, coin_tensors[0], coin_tensors[1], max_depth)
    expected = path_products(tree, edge_probs(tree, probs), max_depth)[:, 1:].sum(dim=1)  # [B]
    # Positional, in the kernel's documented order (custom-op wrappers may rename keywords).
    kernel(*(args[name] for name in KERNEL_ARG_ORDER), 1.0, 1.0, True)
    return kernel_outputs_to_verify_result(
        tree, args["accept_index"], args["accept_token_num"], args["predicts"], expected
    )
