"""Greedy and lossless sampling verification of a draft tree, and the one commit path both feed.

Both verifiers are "pick one token per node" followed by ONE shared walk:
- greedy: the pick at node i is argmax of the target logits at row i;
- sampling: the pick is one exact sample from the processed target distribution at row i
  (temperature, top-k, top-p), drawn independently per node.
The walk starts at the root and moves to the child whose token equals the pick at the current node
(children carry distinct tokens, so there is at most one); the first pick that is not a child is the
bonus token. Each emitted token is then an exact sample of the target given the emitted prefix, so the
output law equals plain sampling from the target.

`max_depth` (D) fixes the width of `accepted_nodes` ([B, D + 1]) and bounds the walk. Engines should
pass the drafter's D (block_size - 1): it costs nothing. When omitted it is read from
`tree.depths.max()` (one device read). Nodes deeper than `max_depth` are never accepted.

The walk is vectorised over the batch: a loop over depth on [B, N] tensors, no host sync.

Sampling backends (`verify_sampling(..., backend=)`):
- "torch": processes the logits in place in ONE fp32 [B, N, V] buffer (shift, temperature, top-k,
  exp; top-p adds a transient sort), reads each node's edge probability, then draws by inverse CDF
  (in-place cumsum + searchsorted). Runs everywhere; the reference.
- "triton": temperature-only params (top_k <= 0, top_p == 1, T == 0 or T >= 0.05), no [B, N, V] float
  buffer at all. Preferred: the lazy walk (ONE read of every row for lse of x / T and the row min, which
  also replaces the finiteness pass; then one program per request draws picks only at the nodes it
  visits). Fallbacks, each behind its own first-use probe: the inverse-CDF row sampler (2 reads), then
  the exponential race (1 compute-heavy read). CUDA only (or CPU under TRITON_INTERPRET=1).
- "sglang": SGLang's tree_speculative_sampling_target_only (zero draft probs, thresholds 1), fed by
  encode_retrieve; costs the probs buffer plus the kernel's zero draft-probs buffer.
- "reference": the pure-torch reference of that kernel through the same adapter (tests, selfcheck).
- "auto": sglang when importable on CUDA, else triton when usable and the params allow, else torch.
All-greedy params skip sampling entirely (same result as verify_greedy, any backend).
"""

from __future__ import annotations

import torch

from ddtree.core.checks import check_all_finite, check_dim, check_same_device, check_tensor
from ddtree.core.sampling import SamplingParams, process_logits_unchecked, processed_weights
from ddtree.core.types import CommitResult, DDTreeBuildResult, VerifyResult

BACKENDS = ("auto", "torch", "triton", "sglang", "reference")


def _check_tree(tree: object) -> DDTreeBuildResult:
    if not isinstance(tree, DDTreeBuildResult):
        raise ValueError(f"tree must be a DDTreeBuildResult, got {type(tree).__name__}")
    return tree


def check_verify_inputs(tree: DDTreeBuildResult, target_logits: torch.Tensor) -> None:
    """ValueError (naming the argument) unless target_logits is a finite [B, N, V] tensor matching tree."""
    _check_verify_shapes(tree, target_logits)
    check_all_finite("target_logits", target_logits)


def _check_verify_shapes(tree: DDTreeBuildResult, target_logits: torch.Tensor) -> None:
    """check_verify_inputs without the finiteness read (the lazy walk folds it into its one read)."""
    _check_tree(tree)
    check_tensor("target_logits", target_logits, ndim=3, floating=True)
    check_dim("target_logits", target_logits, 0, tree.batch_size, "the tree's batch size")
    check_dim("target_logits", target_logits, 1, tree.num_columns, "the tree's column count N")
    check_same_device("target_logits", target_logits, "tree", tree.token_ids)


def resolve_max_depth(tree: DDTreeBuildResult, max_depth: int | None) -> int:
    """D for `accepted_nodes` [B, D + 1]: the explicit value, else the tree's deepest node."""
    if max_depth is None:
        return int(tree.depths.max()) if tree.depths.numel() else 0
    if isinstance(max_depth, bool) or not isinstance(max_depth, int) or max_depth < 0:
        raise ValueError(f"max_depth must be a non-negative int, got {max_depth!r}")
    return max_depth


def edge_probs(tree: DDTreeBuildResult, probs: torch.Tensor, row_totals: torch.Tensor | None = None) -> torch.Tensor:
    """[B, N] fp32: probs[b, parent(i), token(i)] for real non-root nodes, 0 for the root and padding.

    With `row_totals` ([B, N, 1]), `probs` holds unnormalised weights and each value is divided by
    its parent row's total.
    """
    values = at_parent_rows(tree, probs)  # [B, N]
    if row_totals is not None:
        values = values / row_totals.reshape(tree.batch_size, -1).gather(1, tree.parents.clamp_min(0))
    return values.masked_fill_(tree.parents < 0, 0.0)  # root and padding have parent -1


def at_parent_rows(tree: DDTreeBuildResult, rows: torch.Tensor) -> torch.Tensor:
    """[B, N] fp32: rows[b, parent(i), token(i)] from a per-node [B, N, V] tensor (root and padding read
    row 0 / token 0: callers mask them)."""
    batch, cols, vocab = rows.shape
    flat = tree.parents.clamp_min(0) * vocab + tree.token_ids.clamp_min(0)  # [B, N]
    return rows.reshape(batch, cols * vocab).gather(1, flat).float()


def _inverse_temperatures(params: SamplingParams, batch: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Temperature-only rows: (greedy [B] bool, 1 / T [B] fp32 with 1 for greedy rows)."""
    temperature, _, _ = params.broadcast(batch, device)
    greedy = temperature == 0  # [B]
    return greedy, torch.where(greedy, torch.ones_like(temperature), temperature).reciprocal_()


def path_products(tree: DDTreeBuildResult, edge_values: torch.Tensor, max_depth: int) -> torch.Tensor:
    """[B, N] fp32: product of `edge_values` along the path from the root (root 1; deeper than D: 0).

    Pointer doubling: after k rounds each node holds the product over itself and its 2^k - 1 nearest
    ancestors (the root, value 1, is its own ancestor), so ceil(log2(D + 1)) rounds of two [B, N] gathers
    replace a loop over the D depths.
    """
    cols = torch.arange(tree.num_columns, device=tree.device)
    within = (tree.parents >= 0) & (tree.depths <= max_depth)  # [B, N] real nodes the walk can reach
    prod = torch.where(within, edge_values.float(), (cols == 0).to(torch.float32))  # [B, N], root 1
    ancestor = tree.parents.clamp_min(0)  # [B, N], root (and padding, whose value is 0) -> root
    for _ in range(max_depth.bit_length()):  # 2^rounds > max_depth
        prod = prod * prod.gather(1, ancestor)
        ancestor = ancestor.gather(1, ancestor)
    return prod


def walk(tree: DDTreeBuildResult, picks: torch.Tensor, edge_p: torch.Tensor, max_depth: int) -> VerifyResult:
    """The shared walk: accept while the pick at the current node is one of its children.

    picks  [B, N] int64: token picked at each node (row i = at node i).
    edge_p [B, N] fp32: processed target prob of each node's token at its parent (for the expectation).
    """
    return _walk(tree, picks, edge_p, max_depth)


def _walk(tree: DDTreeBuildResult, picks: torch.Tensor, edge_p: torch.Tensor | None, max_depth: int) -> VerifyResult:
    """`walk`; edge_p None means greedy picks (expected_accept_len = accept_len, one path product less)."""
    batch, cols = tree.token_ids.shape
    parent = tree.parents.clamp_min(0)
    # Node i matches when it is a real node whose token is the pick at its parent.
    match = (tree.parents >= 0) & (tree.token_ids == picks.gather(1, parent))  # [B, N]
    accepted = path_products(tree, match.to(torch.float32), max_depth) > 0.5  # [B, N], root included
    accept_len = accepted.sum(dim=1) - 1  # [B], root excluded
    if edge_p is None:
        expected = accept_len.to(torch.float32)
    else:
        expected = path_products(tree, edge_p, max_depth)[:, 1:].sum(dim=1)  # [B]

    # One accepted node per depth: scatter node indices into their depth slot (spare slot D + 1 for the rest).
    slot = torch.where(accepted, tree.depths.clamp(0, max_depth), max_depth + 1)  # [B, N]
    node_ids = torch.arange(cols, device=tree.device).expand(batch, cols)
    accepted_nodes = torch.full((batch, max_depth + 2), -1, dtype=torch.int64, device=tree.device)
    accepted_nodes.scatter_(1, slot, node_ids)
    accepted_nodes = accepted_nodes[:, : max_depth + 1].contiguous()  # [B, D + 1]
    return path_result(accept_len, accepted_nodes, picks, expected)


def path_result(
    accept_len: torch.Tensor, accepted_nodes: torch.Tensor, picks: torch.Tensor, expected: torch.Tensor
) -> VerifyResult:
    """VerifyResult of an accepted path: the bonus is the pick at its last node.

    accept_len [B]; accepted_nodes [B, D + 1] (root first, -1 padded); picks [B, N] (token picked at each
    node); expected [B].
    """
    last = accepted_nodes.gather(1, accept_len.unsqueeze(1))  # [B, 1]
    bonus = picks.gather(1, last).squeeze(1)  # [B]
    return VerifyResult(
        accept_len=accept_len,
        accepted_nodes=accepted_nodes,
        bonus_token=bonus,
        expected_accept_len=expected.to(torch.float32),
    )


def verify_greedy(
    tree: DDTreeBuildResult, target_logits: torch.Tensor, *, max_depth: int | None = None
) -> VerifyResult:
    """Greedy verify: argmax pick per node, then the shared walk (expected_accept_len = accept_len)."""
    check_verify_inputs(tree, target_logits)
    return _verify_greedy_unchecked(tree, target_logits, resolve_max_depth(tree, max_depth))


def _verify_greedy_unchecked(tree: DDTreeBuildResult, target_logits: torch.Tensor, depth: int) -> VerifyResult:
    picks = target_logits.argmax(dim=-1)  # [B, N]
    return _walk(tree, picks, None, depth)


def sample_from_probs_(
    probs: torch.Tensor, generator: torch.Generator | None = None, *, uniforms: torch.Tensor | None = None
) -> torch.Tensor:
    """One exact sample per row of probs [..., V] (normalised or not: the draw is scaled by the row
    total) by inverse CDF; DESTROYS probs (cumsum in place). `uniforms` ([...] in [0, 1)) are the coins to
    use instead of drawing from `generator` (the engine's counter-based coins).

    Tokens with zero probability are never drawn: u < total mass, so the first cdf > u is a token
    with positive mass.
    """
    cdf = probs.cumsum_(dim=-1)  # [..., V]
    total = cdf[..., -1:]  # [..., 1]
    if uniforms is None:
        u = torch.rand(total.shape, generator=generator, device=probs.device, dtype=cdf.dtype) * total
    else:
        u = uniforms.reshape(total.shape).to(cdf.dtype) * total
    u = torch.minimum(u, torch.nextafter(total, torch.zeros_like(total)))
    tokens = torch.searchsorted(cdf, u, right=True)  # [..., 1]
    return tokens.clamp_max_(probs.shape[-1] - 1).squeeze(-1)


def _sglang_kernel_usable(device: torch.device) -> bool:
    if device.type != "cuda":
        return False
    from ddtree.core.kernels import load_sglang_kernel

    return load_sglang_kernel() is not None


def _fused_eligible(params: SamplingParams) -> bool:
    """The fused sampler covers temperature-only rows with T >= FUSED_MIN_TEMPERATURE (or greedy)."""
    from ddtree.core.kernels import FUSED_MIN_TEMPERATURE

    return params.max_top_k == 0 and not params.uses_top_p and params.min_positive_temperature >= FUSED_MIN_TEMPERATURE


def _triton_usable(device: torch.device) -> bool:
    from ddtree.core.kernels import cdf_sampler_usable, lazy_walk_usable, triton_sampler_usable

    return lazy_walk_usable(device) or cdf_sampler_usable(device) or triton_sampler_usable(device)


def resolve_backend(backend: str, device: torch.device, params: SamplingParams | None = None) -> str:
    """'auto' -> 'sglang' when the SGLang kernel imports and the tensors are on CUDA; else 'triton' when
    the fused sampler is usable on the device and covers `params`; else 'torch'."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "auto":
        if _sglang_kernel_usable(device):
            return "sglang"
        if device.type == "cuda" and params is not None and _fused_eligible(params) and _triton_usable(device):
            return "triton"
        return "torch"
    if backend == "sglang" and not _sglang_kernel_usable(device):
        raise ValueError(
            "backend='sglang' needs CUDA tensors and an importable "
            "sglang.kernels.ops.speculative.verify_sampling.tree_speculative_sampling_target_only"
        )
    if backend == "triton":
        if params is not None and not _fused_eligible(params):
            raise ValueError(
                "backend='triton' covers temperature-only sampling (top_k <= 0, top_p == 1, temperature 0 or "
                ">= 0.05); use backend='torch' for these params"
            )
        if not _triton_usable(device):
            raise ValueError("backend='triton' needs triton and CUDA tensors (or TRITON_INTERPRET=1)")
    return backend


def verify_sampling(
    tree: DDTreeBuildResult,
    target_logits: torch.Tensor,
    params: SamplingParams,
    generator: torch.Generator | None = None,
    *,
    max_depth: int | None = None,
    backend: str = "auto",
) -> VerifyResult:
    """Lossless sampling verify (sample-and-walk); temperature-0 rows behave exactly as `verify_greedy`.

    backend: "torch" (vectorised reference, everywhere), "triton" (fused one-read sampler for
    temperature-only params, CUDA; no [B, N, V] float buffer), "sglang" (SGLang's
    tree_speculative_sampling_target_only on CUDA, zero draft probs, thresholds 1), "reference"
    (the pure-torch reference of that kernel, through the same adapter), "auto" (sglang when usable,
    else triton when usable and the params are temperature-only, else torch).
    """
    _check_verify_shapes(tree, target_logits)
    if not isinstance(params, SamplingParams):
        raise ValueError(f"params must be a SamplingParams, got {type(params).__name__}")
    depth = resolve_max_depth(tree, max_depth)
    backend = resolve_backend(backend, target_logits.device, params)
    if backend == "triton" and not params.all_greedy:
        from ddtree.core.kernels import lazy_walk_usable

        if lazy_walk_usable(target_logits.device):
            lazy = _verify_lazy(tree, target_logits, params, generator, depth)  # checks finiteness itself
            if lazy is not None:
                return lazy
            backend = "torch"  # finite logits whose x / T overflows fp32: torch shifts by the row max first
    check_all_finite("target_logits", target_logits)
    if params.all_greedy:
        params.broadcast(tree.batch_size, target_logits.device)  # same argument checks as the sampled path
        return _verify_greedy_unchecked(tree, target_logits, depth)

    if backend in ("sglang", "reference"):
        probs = process_logits_unchecked(target_logits, params)  # [B, N, V] fp32
        from ddtree.core.kernels import (
            load_sglang_kernel,
            reference_tree_speculative_sampling_target_only,
            verify_with_kernel,
        )
        from ddtree.core.retrieve import encode_retrieve

        kernel = load_sglang_kernel() if backend == "sglang" else reference_tree_speculative_sampling_target_only
        return verify_with_kernel(
            tree, encode_retrieve(tree), probs, kernel=kernel, generator=generator, max_depth=depth
        )

    if backend == "triton":
        return _verify_fused(tree, target_logits, params, generator, depth)

    weights, totals = processed_weights(target_logits, params)  # [B, N, V] the one fp32 buffer, [B, N, 1]
    edge_p = edge_probs(tree, weights, totals)  # [B, N], read before the buffer is consumed
    picks = sample_from_probs_(weights, generator)  # [B, N]
    return walk(tree, picks, edge_p, depth)


def _verify_lazy(
    tree: DDTreeBuildResult,
    target_logits: torch.Tensor,
    params: SamplingParams,
    generator: torch.Generator | None,
    depth: int,
) -> VerifyResult | None:
    """Temperature-only sample-and-walk drawing picks only along the walk (see kernels.py, lazy walk).

    One read of the logits (row lse of x / T and row min, which also proves finiteness: one host sync),
    one per-request walk kernel, then the exact expectation from a [B, N] gather. Returns None when the
    logits are finite but x / T overflows fp32 (the caller then takes the torch path); raises the
    usual ValueError on non-finite logits.
    """
    from ddtree.core.kernels import lazy_walk, scaled_row_lse_and_min

    batch = target_logits.shape[0]
    greedy, inv_t = _inverse_temperatures(params, batch, target_logits.device)  # [B] each
    lse, low = scaled_row_lse_and_min(target_logits, inv_t)  # [B, N] each
    if not bool(torch.isfinite(lse).all() & torch.isfinite(low).all()):
        check_all_finite("target_logits", target_logits)  # raises unless only x / T overflowed
        return None
    uniforms = torch.rand((batch, depth + 1), generator=generator, device=target_logits.device)  # one per step
    accepted_nodes, accept_len, bonus = lazy_walk(
        target_logits, lse, tree.parents, tree.token_ids, inv_t, ~greedy, uniforms, depth
    )
    x_edge = at_parent_rows(tree, target_logits)  # [B, N]
    edge = torch.exp(x_edge * inv_t.unsqueeze(1) - lse.gather(1, tree.parents.clamp_min(0)))  # masked in path_products
    sampled_expected = path_products(tree, edge, depth)[:, 1:].sum(dim=1)  # [B]
    expected = torch.where(greedy, accept_len.to(torch.float32), sampled_expected)
    return VerifyResult(
        accept_len=accept_len, accepted_nodes=accepted_nodes, bonus_token=bonus, expected_accept_len=expected
    )


def _verify_fused(
    tree: DDTreeBuildResult,
    target_logits: torch.Tensor,
    params: SamplingParams,
    generator: torch.Generator | None,
    depth: int,
) -> VerifyResult:
    """Temperature-only sample-and-walk with a fused Triton sampler: no [B, N, V] float buffer.

    The inverse-CDF sampler (2 reads, one uniform per row) is preferred; the Gumbel race is the fallback
    when its first-use probe fails on this device.
    """
    from ddtree.core.kernels import cdf_sample_rows, cdf_sampler_usable, gumbel_sample_rows

    sampler = cdf_sample_rows if cdf_sampler_usable(target_logits.device) else gumbel_sample_rows

    greedy, inv_t = _inverse_temperatures(params, target_logits.shape[0], target_logits.device)  # [B] each
    picks, lse = sampler(target_logits, inv_t, ~greedy, generator)  # [B, N] each
    real = tree.parents >= 0
    parent = tree.parents.clamp_min(0)
    x_edge = at_parent_rows(tree, target_logits)  # [B, N]
    sampled_edge = torch.exp(x_edge * inv_t.unsqueeze(1) - lse.gather(1, parent))
    greedy_edge = (tree.token_ids == picks.gather(1, parent)).to(torch.float32)
    edge = torch.where(greedy.unsqueeze(1), greedy_edge, sampled_edge).masked_fill_(~real, 0.0)
    return walk(tree, picks, edge, depth)


def commit(tree: DDTreeBuildResult, verify_result: VerifyResult) -> CommitResult:
    """What to keep after a round: accepted node indices (KV / hidden rows) and emitted tokens.

    emitted_tokens[b] = tokens of the accepted nodes after the root, then the bonus, -1 padded.
    """
    _check_tree(tree)
    if not isinstance(verify_result, VerifyResult):
        raise ValueError(f"verify_result must be a VerifyResult, got {type(verify_result).__name__}")
    check_same_device("verify_result.accepted_nodes", verify_result.accepted_nodes, "tree", tree.token_ids)
    check_dim("verify_result.accepted_nodes", verify_result.accepted_nodes, 0, tree.batch_size, "the tree's batch size")
    nodes = verify_result.accepted_nodes  # [B, D + 1]
    accept_len = verify_result.accept_len  # [B]
    width = nodes.shape[1]
    slots = torch.arange(width, device=nodes.device).unsqueeze(0)  # [1, D + 1]
    # Slot j (j < accept_len) emits the token of accepted node j + 1; slot accept_len emits the bonus.
    next_nodes = torch.cat([nodes[:, 1:], torch.full_like(nodes[:, :1], -1)], dim=1)  # [B, D + 1]
    drafted = tree.token_ids.gather(1, next_nodes.clamp_min(0))  # [B, D + 1]
    emitted = torch.where(slots < accept_len.unsqueeze(1), drafted, torch.full_like(drafted, -1))
    emitted = torch.where(slots == accept_len.unsqueeze(1), verify_result.bonus_token.unsqueeze(1), emitted)
    kept = accept_len + 1
    return CommitResult(accepted_nodes=nodes, num_kept=kept, emitted_tokens=emitted, num_emitted=kept.clone())
