"""Dataclasses passed between the stages of one DDTree round.

Shape letters used throughout:
  B  requests in the batch
  D  drafted positions (block size - 1)
  V  vocabulary size
  N  tree columns = budget + 1 (column 0 is the root, i.e. the previous bonus token)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class DDTreeBuildResult:
    """A batch of draft trees, nodes numbered best-first (parents precede children).

    Padding columns (a tree that cannot fill the budget) carry token -1, parent -1,
    depth 0 and logw -inf.
    """

    token_ids: torch.Tensor  # [B, N] int64, root and padding -1
    parents: torch.Tensor  # [B, N] int64, root and padding -1
    depths: torch.Tensor  # [B, N] int64, root 0
    node_logws: torch.Tensor  # [B, N] float32, root 0, padding -inf
    num_nodes: torch.Tensor  # [B] int64, root included

    @property
    def batch_size(self) -> int:
        return int(self.token_ids.shape[0])

    @property
    def num_columns(self) -> int:
        return int(self.token_ids.shape[1])

    @property
    def device(self) -> torch.device:
        return self.token_ids.device

    def valid_mask(self) -> torch.Tensor:
        """[B, N] bool: True for the root and the real nodes, False for padding."""
        cols = torch.arange(self.num_columns, device=self.device)
        return cols.unsqueeze(0) < self.num_nodes.unsqueeze(1)


@dataclass(frozen=True)
class RetrieveEncoding:
    """EAGLE-style tree layout consumed by SGLang's tree kernels (-1 terminates/pads)."""

    retrieve_index: torch.Tensor  # [B, N] int64, flat row id b * N + i (padding -1)
    retrieve_next_token: torch.Tensor  # [B, N] int64, first (most probable) child or -1
    retrieve_next_sibling: torch.Tensor  # [B, N] int64, next sibling in descending logw or -1


@dataclass(frozen=True)
class TreeAttention:
    """What the verify forward needs beyond the tokens."""

    position_offsets: torch.Tensor  # [B, N] int64, = depths (absolute position = start + offset)
    mask: torch.Tensor  # [B, N, N] bool, mask[b, i, j] = node j is i itself or an ancestor of i


@dataclass(frozen=True)
class VerifyResult:
    """Outcome of verifying one tree per request."""

    accept_len: torch.Tensor  # [B] int64, accepted draft nodes (root excluded)
    accepted_nodes: torch.Tensor  # [B, D + 1] int64, node indices root first, -1 padded
    bonus_token: torch.Tensor  # [B] int64, token picked at the last accepted node
    expected_accept_len: torch.Tensor  # [B] float32, sum over nodes of p_target(path to node)


@dataclass(frozen=True)
class CommitResult:
    """What the caller keeps after a round: shared by the greedy and the sampling path."""

    accepted_nodes: torch.Tensor  # [B, D + 1] int64, node indices root first, -1 padded
    num_kept: torch.Tensor  # [B] int64, accept_len + 1 (root included): KV rows to keep
    emitted_tokens: torch.Tensor  # [B, D + 1] int64, accepted tokens then bonus, -1 padded
    num_emitted: torch.Tensor  # [B] int64, accept_len + 1
