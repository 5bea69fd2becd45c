"""A torch reference of SGLang 0.5.23's `tree_speculative_sampling_target_only` (its exact contract).

Same arguments, same in-place outputs and the same acceptance rule as the CUDA kernel
(`sglang/kernels/jit/include/sgl_kernel/speculative/sampling.cuh`), which does not run on a CPU:

- per request, start at node 0 with coin `u = uniform_samples[b, 0]` and `acc = 0`;
- try the children in retrieve order (first child, then next siblings); for child token t with
  `p = target_probs[b, node, t]`: `acc += p`; accept iff `p > 0 and (u < acc / threshold_acc or
  p >= threshold_single)` (strict `<`, and a child without target mass is never accepted);
- accept: `predicts[flat id of node] = t`, append the child's flat id to `accept_index`, move there,
  `acc = 0`, `u = uniform_samples[b, child]`; reject: `draft_probs[b, node, t] = p`, next sibling;
- stop when every child is rejected, at a leaf, or after S - 1 accepts; `accept_token_num[b] = k`;
- bonus: inverse CDF with `uniform_samples_for_final_sampling[b]` over `relu(target - draft)` at the last
  node (draft ignored when the depth cap ended the walk), first index whose running sum exceeds
  `u * total` among positive entries, else the last positive entry, else V - 1; written to
  `predicts[flat id of the last node]`. Other entries of `predicts` / `accept_index` are left untouched.

It loops in Python over requests and nodes: a test reference, not a production path.
"""

from __future__ import annotations

import torch


def tree_speculative_sampling_target_only_reference(
    predicts: torch.Tensor,  # [bs * N] int32, out
    accept_index: torch.Tensor,  # [bs, S] int32, out
    accept_token_num: torch.Tensor,  # [bs] int32, out
    candidates: torch.Tensor,  # [bs, N] int64
    retrive_index: torch.Tensor,  # [bs, N] int64
    retrive_next_token: torch.Tensor,  # [bs, N] int64
    retrive_next_sibling: torch.Tensor,  # [bs, N] int64
    uniform_samples: torch.Tensor,  # [bs, N] fp32
    uniform_samples_for_final_sampling: torch.Tensor,  # [bs] fp32
    target_probs: torch.Tensor,  # [bs, N, V] fp32
    draft_probs: torch.Tensor,  # [bs, N, V] fp32, in/out (callers pass fresh zeros)
    threshold_single: float = 1.0,
    threshold_acc: float = 1.0,
    deterministic: bool = True,
) -> None:
    """The kernel's contract in torch (see the module docstring); outputs written in place."""
    del deterministic  # the reference is always deterministic
    bs, _ = candidates.shape
    steps = accept_index.shape[1]
    for b in range(bs):
        node = 0  # local index of the last accepted node (its target row is read)
        coin = float(uniform_samples[b, 0])
        last_flat = int(retrive_index[b, 0])
        accept_index[b, 0] = last_flat
        accepted = 0
        for _ in range(1, steps):
            child = int(retrive_next_token[b, node])
            acc = 0.0
            moved = False
            while child != -1:
                token = int(candidates[b, child])
                p = float(target_probs[b, node, token])
                acc += p
                if p > 0.0 and (coin < acc / threshold_acc or p >= threshold_single):
                    predicts[last_flat] = token
                    accepted += 1
                    last_flat = int(retrive_index[b, child])
                    accept_index[b, accepted] = last_flat
                    node = child
                    coin = float(uniform_samples[b, child])
                    moved = True
                    break
                draft_probs[b, node, token] = target_probs[b, node, token]
                child = int(retrive_next_sibling[b, child])
            if not moved:
                break
        accept_token_num[b] = accepted

        residual = target_probs[b, node].clone()
        if accepted != steps - 1:  # the depth cap leaves no draft probs at the last node
            residual = residual - draft_probs[b, node]
        residual = residual.clamp_min(0.0)
        u = float(uniform_samples_for_final_sampling[b]) * float(residual.sum())
        positive = residual > 0
        beyond = positive & (residual.cumsum(0) > u)
        if bool(beyond.any()):
            sampled = int(beyond.nonzero()[0, 0])
        elif bool(positive.any()):
            sampled = int(positive.nonzero()[-1, 0])
        else:
            sampled = residual.shape[0] - 1
        predicts[last_flat] = sampled
