"""Pure tensor glue between the project's draft tree and SGLang 0.5.23's verify machinery.

No SGLang import: every function here runs on CPU in the tests and on the GPU in the worker, without a
host sync. Shapes: B requests, N = budget + 1 verify nodes (column 0 = the root = previous bonus token),
S = accept_index columns (the drafter's block size: at most D = S - 1 accepted drafts plus the root),
V vocabulary, L_b committed prefix length of request b.

SGLang's tree kernels address nodes by flat id `b * N + i` (`retrieve_index`); their outputs are
- `accept_index [B, S]` int32: flat ids of the accepted path, root first (entries past k untouched),
- `accept_token_num [B]` int32: k, accepted drafts (root and bonus excluded),
- `predicts [B * N]` int32: at the flat id of every accepted node, the token emitted after it (the next
  accepted node's token, and at the last node the bonus).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ddtree.core.attention import ancestor_mask
from ddtree.core.build_sampling import tree_logit_scale
from ddtree.core.types import DDTreeBuildResult


@dataclass(frozen=True)
class KernelOutputs:
    """In-place outputs of SGLang's tree verify kernels (greedy and sampling share the layout)."""

    predicts: torch.Tensor  # [B * N] int32
    accept_index: torch.Tensor  # [B, S] int32, -1 past the accepted path
    accept_token_num: torch.Tensor  # [B] int32

    @staticmethod
    def fresh(batch: int, nodes: int, steps: int, device: torch.device | str) -> "KernelOutputs":
        """Buffers for one verify call: predicts 0, accept_index -1, accept_token_num 0."""
        return KernelOutputs(
            predicts=torch.zeros(batch * nodes, dtype=torch.int32, device=device),
            accept_index=torch.full((batch, steps), -1, dtype=torch.int32, device=device),
            accept_token_num=torch.zeros(batch, dtype=torch.int32, device=device),
        )


@dataclass(frozen=True)
class AcceptedPaths:
    """One round's outcome per request, in the shapes the commit path consumes."""

    accepted_nodes: torch.Tensor  # [B, S] int64, local node indices root first, -1 padded
    accept_len: torch.Tensor  # [B] int64, accepted drafts (root excluded)
    emitted_tokens: torch.Tensor  # [B, S] int64, accepted drafts then the bonus, -1 padded
    commit_lens: torch.Tensor  # [B] int32, accept_len + 1 (tokens emitted = KV rows kept)
    bonus: torch.Tensor  # [B] int64, the last emitted token (next round's root)
    keep_index: torch.Tensor  # [B, S] int64, flat verify rows b * N + node to keep, -1 padded


def verify_candidates(tree: DDTreeBuildResult, bonus: torch.Tensor) -> torch.Tensor:
    """[B, N] int64 verify tokens: the bonus at column 0, node tokens after it, padding = the bonus.

    Padding columns are never reached by the kernels (no retrieve link points at them) but are embedded
    by the verify forward, so they carry a valid token id.
    """
    root = bonus.to(torch.int64).view(-1, 1)  # [B, 1]
    tokens = torch.where(tree.parents >= 0, tree.token_ids, root)  # [B, N]
    tokens[:, 0] = root[:, 0]
    return tokens


def verify_positions(prefix_lens: torch.Tensor, depths: torch.Tensor) -> torch.Tensor:
    """[B * N] int64 positions: the root sits at the first uncommitted position, a node at prefix + depth."""
    return (prefix_lens.to(torch.int64).unsqueeze(1) + depths.to(torch.int64)).reshape(-1)


def verify_mask_numel(seq_lens: torch.Tensor, nodes: int) -> torch.Tensor:
    """0-dim int64: elements of the flat verify mask, sum_b N * (L_b + N) (as SGLang's mask_indptr)."""
    return (nodes * (seq_lens.to(torch.int64) + nodes)).sum()


def verify_mask(parents: torch.Tensor, seq_lens: torch.Tensor, numel: int) -> torch.Tensor:
    """Flat bool verify mask in SGLang's FULL_MASK layout for TARGET_VERIFY.

    Request b owns N rows of L_b + N columns, row-major, at offset sum_{c<b} N * (L_c + N): the committed
    prefix is visible to every node, then node i sees itself and its ancestors (ancestor-only attention).
    parents [B, N] int64 (-1 root / padding); seq_lens [B] committed prefix lengths; numel the total size
    (`verify_mask_numel`, passed in so that building the mask needs no host read).
    """
    b, n = parents.shape
    dev = parents.device
    lens = seq_lens.to(torch.int64)  # [B]
    width = lens + n  # [B] columns per row
    start = torch.cumsum(n * width, 0) - n * width  # [B] offset of request b
    mask = torch.ones(numel, dtype=torch.bool, device=dev)
    tree = ancestor_mask(parents)  # [B, N, N]
    rows = torch.arange(n, device=dev).view(1, n, 1)
    cols = torch.arange(n, device=dev).view(1, 1, n)
    flat = start.view(b, 1, 1) + rows * width.view(b, 1, 1) + lens.view(b, 1, 1) + cols  # [B, N, N]
    mask[flat.reshape(-1)] = tree.reshape(-1)
    return mask


def tempered_draft_logits(draft_logits: torch.Tensor, temperatures: torch.Tensor, top_ks: torch.Tensor) -> torch.Tensor:
    """draft_logits [B, D, V] at each request's tree temperature (`tree_logit_scale`), from SGLang's sampling fields
    (temperatures [B, 1] or [B], top_ks [B]). SGLang marks a greedy request by top_k <= 1 (its temperature is then
    1.0): such rows keep their logits, so their trees are the raw ones."""
    rows = draft_logits.shape[0]
    temperature = torch.where(top_ks.view(-1) <= 1, 0.0, temperatures.view(-1).float())[:rows]  # [B]
    return draft_logits * tree_logit_scale(temperature).to(draft_logits.dtype).view(rows, 1, 1)


def merge_rows(greedy_rows: torch.Tensor, greedy: KernelOutputs, sampled: KernelOutputs) -> KernelOutputs:
    """Per request, the greedy kernel's outputs where `greedy_rows` [B] bool, else the sampling kernel's."""
    nodes = greedy.predicts.shape[0] // greedy_rows.shape[0]
    flat_rows = greedy_rows.repeat_interleave(nodes)  # [B * N]
    return KernelOutputs(
        predicts=torch.where(flat_rows, greedy.predicts, sampled.predicts),
        accept_index=torch.where(greedy_rows.unsqueeze(1), greedy.accept_index, sampled.accept_index),
        accept_token_num=torch.where(greedy_rows, greedy.accept_token_num, sampled.accept_token_num),
    )


def accepted_paths(outputs: KernelOutputs, nodes: int) -> AcceptedPaths:
    """Map kernel outputs to accepted nodes, emitted tokens and the KV keep-list (no host sync).

    emitted_tokens[b, j] = predicts[accept_index[b, j]] for j <= k: the token of accepted node j + 1,
    and at j = k the bonus.
    """
    accept_index = outputs.accept_index.to(torch.int64)  # [B, S]
    k = outputs.accept_token_num.to(torch.int64)  # [B]
    steps = accept_index.shape[1]
    slots = torch.arange(steps, device=accept_index.device).unsqueeze(0)  # [1, S]
    on_path = slots <= k.unsqueeze(1)  # [B, S]
    keep = torch.where(on_path, accept_index, -1)
    local = torch.where(on_path, keep % nodes, -1)
    emitted = outputs.predicts.to(torch.int64)[keep.clamp_min(0)]  # [B, S]
    emitted = torch.where(on_path, emitted, -1)
    bonus = emitted.gather(1, k.unsqueeze(1)).squeeze(1)
    return AcceptedPaths(
        accepted_nodes=local,
        accept_len=k,
        emitted_tokens=emitted,
        commit_lens=(k + 1).to(torch.int32),
        bonus=bonus,
        keep_index=keep,
    )
