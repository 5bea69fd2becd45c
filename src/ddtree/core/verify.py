"""Greedy and lossless sampling verification of a draft tree, and the one commit path both feed.

Both verifiers are "pick one token per node" followed by ONE shared walk (`walk.py`):
- greedy: the pick at node i is argmax of the target logits at row i;
- sampling: the pick is one exact sample from the processed target distribution at row i
  (temperature, top-k, top-p), drawn independently per node.
Each emitted token is then an exact sample of the target given the emitted prefix, so the output law equals
plain sampling from the target.

`max_depth` (D) fixes the width of `accepted_nodes` ([B, D + 1]) and bounds the walk. Engines should
pass the drafter's D (block_size - 1): it costs nothing. When omitted it is read from
`tree.depths.max()` (one device read). Nodes deeper than `max_depth` are never accepted.

Capture-safe calls (for a CUDA graph of a whole decoding round): `verify_greedy(..., validate=False)` and
`verify_sampling(..., validate=False)` with an int `max_depth`, after `prepare_verify(device)`, and `commit`,
never synchronise with the host: they read no tensor value on the host and branch only on shapes and on the
(host) flags of `SamplingParams`. validate=False skips the finiteness read of the logits, so non-finite logits
give unspecified picks instead of a ValueError.

Sampling backends (`verify_sampling(..., backend=)`):
- "torch": processes the logits in place in ONE fp32 [B, N, V] buffer (shift, temperature, top-k,
  exp; top-p adds a transient sort), reads each node's edge probability, then draws by inverse CDF
  (in-place cumsum + searchsorted). Runs everywhere; the reference.
- "triton": temperature-only params (top_k <= 0, top_p == 1, T == 0 or T >= 0.05), no [B, N, V] float
  buffer at all: the lazy walk (`triton_verify.py`: ONE read of every row for lse of x / T and the row min,
  which also replaces the finiteness pass; then one program per request draws picks only at the nodes it
  visits). CUDA only (or CPU under TRITON_INTERPRET=1).
- "sglang": SGLang's tree_speculative_sampling_target_only (zero draft probs, thresholds 1), fed by
  encode_retrieve; costs the probs buffer plus the kernel's zero draft-probs buffer (`sglang_kernel.py`).
- "reference": the pure-torch reference of that kernel through the same adapter (tests, selfcheck; it reads
  tensor values on the host, so it is not capture-safe).
- "auto": sglang when importable on CUDA, else triton when usable and the params allow, else torch. What is
  usable is decided once per device (`verify_paths`).
All-greedy params skip sampling entirely (same result as verify_greedy, any backend).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ddtree.core.checks import canonical_device, check_all_finite, check_dim, check_same_device, check_tensor
from ddtree.core.retrieve import encode_retrieve
from ddtree.core.sampling import SamplingParams, process_logits_unchecked, processed_weights
from ddtree.core.sglang_kernel import (
    load_sglang_kernel,
    reference_tree_speculative_sampling_target_only,
    verify_with_kernel,
)
from ddtree.core.types import CommitResult, DDTreeBuildResult, VerifyResult
from ddtree.core.walk import at_parent_rows, edge_probs, path_products, walk

BACKENDS = ("auto", "torch", "triton", "sglang", "reference")
FUSED_MIN_TEMPERATURE = 0.05  # the Triton walk scales x by 1 / T in fp32: below this its rounding matters


def _check_tree(tree: object) -> DDTreeBuildResult:
    if not isinstance(tree, DDTreeBuildResult):
        raise ValueError(f"tree must be a DDTreeBuildResult, got {type(tree).__name__}")
    return tree


def _check_verify_shapes(tree: DDTreeBuildResult, target_logits: torch.Tensor) -> None:
    """ValueError (naming the argument) unless target_logits is a [B, N, V] float tensor matching tree (shapes
    and device only: no read of the values)."""
    _check_tree(tree)
    check_tensor("target_logits", target_logits, ndim=3, floating=True)
    check_dim("target_logits", target_logits, 0, tree.batch_size, "the tree's batch size")
    check_dim("target_logits", target_logits, 1, tree.num_columns, "the tree's column count N")
    check_same_device("target_logits", target_logits, "tree", tree.token_ids)


def check_verify_inputs(tree: DDTreeBuildResult, target_logits: torch.Tensor) -> None:
    """The checks of a validated verify: shapes agree and the logits are finite (one host read)."""
    _check_verify_shapes(tree, target_logits)
    check_all_finite("target_logits", target_logits)


def resolve_max_depth(tree: DDTreeBuildResult, max_depth: int | None, *, validate: bool = True) -> int:
    """D for `accepted_nodes` [B, D + 1]: the explicit value, else (validate=True only) the tree's deepest node."""
    if max_depth is None:
        if not validate:
            raise ValueError("validate=False needs an explicit int max_depth (reading the tree's depth syncs)")
        return int(tree.depths.max()) if tree.depths.numel() else 0
    if isinstance(max_depth, bool) or not isinstance(max_depth, int) or max_depth < 0:
        raise ValueError(f"max_depth must be a non-negative int, got {max_depth!r}")
    return max_depth


def _inverse_temperatures(params: SamplingParams, batch: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Temperature-only rows: (greedy [B] bool, 1 / T [B] fp32 with 1 for greedy rows)."""
    temperature, _, _ = params.broadcast(batch, device)
    greedy = temperature == 0  # [B]
    return greedy, torch.where(greedy, torch.ones_like(temperature), temperature).reciprocal_()


def verify_greedy(
    tree: DDTreeBuildResult, target_logits: torch.Tensor, *, max_depth: int | None = None, validate: bool = True
) -> VerifyResult:
    """Greedy verify: argmax pick per node, then the shared walk (expected_accept_len = accept_len).

    validate=False (with an int max_depth) is capture-safe: no finiteness read, no host synchronisation.
    """
    _check_verify_shapes(tree, target_logits)
    depth = resolve_max_depth(tree, max_depth, validate=validate)
    if validate:
        check_all_finite("target_logits", target_logits)
    return _verify_greedy_unchecked(tree, target_logits, depth)


def _verify_greedy_unchecked(tree: DDTreeBuildResult, target_logits: torch.Tensor, depth: int) -> VerifyResult:
    """The greedy verify itself (argmax picks, the shared walk): no checks, no host synchronisation."""
    return walk(tree, target_logits.argmax(dim=-1), None, depth)  # picks [B, N]


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


@dataclass(frozen=True)
class VerifyPaths:
    """The sampling backends usable on one device (decided once per device, `verify_paths`)."""

    sglang: bool  # SGLang's kernel imports and the device is CUDA
    triton: bool  # the Triton lazy walk compiles and passed its probe (CUDA, or CPU under TRITON_INTERPRET=1)


_PATHS: dict[torch.device, VerifyPaths] = {}


def verify_paths(device: torch.device | str) -> VerifyPaths:
    """The usable backends on `device`, probed on the first call per device (compiles and checks the Triton
    walk, imports SGLang). Raises RuntimeError when first asked during a CUDA graph capture: call
    `prepare_verify(device)` before capturing."""
    device = canonical_device(device)
    paths = _PATHS.get(device)
    if paths is None:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(f"verify paths for {device} not probed yet: call prepare_verify({device}) first")
        try:
            from ddtree.core.triton_verify import lazy_walk_usable
        except ImportError:  # triton missing: the torch path is exact, only slower
            triton_ok = False
        else:
            triton_ok = lazy_walk_usable(device)
        paths = VerifyPaths(sglang=device.type == "cuda" and load_sglang_kernel() is not None, triton=triton_ok)
        _PATHS[device] = paths
    return paths


def prepare_verify(device: torch.device | str) -> VerifyPaths:
    """Run the per-device probes of the verifiers now (before a CUDA graph capture); returns `verify_paths`."""
    return verify_paths(device)


def _fused_eligible(params: SamplingParams) -> bool:
    """The Triton walk covers temperature-only rows with T >= FUSED_MIN_TEMPERATURE (or greedy)."""
    return params.max_top_k == 0 and not params.uses_top_p and params.min_positive_temperature >= FUSED_MIN_TEMPERATURE


def resolve_backend(backend: str, device: torch.device, params: SamplingParams | None = None) -> str:
    """'auto' -> 'sglang' when the SGLang kernel imports and the tensors are on CUDA; else 'triton' when
    the Triton walk is usable on the device and covers `params`; else 'torch'."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend in ("torch", "reference"):
        return backend
    paths = verify_paths(device)
    if backend == "auto":
        if paths.sglang:
            return "sglang"
        if device.type == "cuda" and params is not None and _fused_eligible(params) and paths.triton:
            return "triton"
        return "torch"
    if backend == "sglang" and not paths.sglang:
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
        if not paths.triton:
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
    validate: bool = True,
) -> VerifyResult:
    """Lossless sampling verify (sample-and-walk); temperature-0 rows behave exactly as `verify_greedy`.

    backend: "torch" (vectorised reference, everywhere), "triton" (Triton lazy walk for temperature-only
    params, CUDA; no [B, N, V] float buffer), "sglang" (SGLang's tree_speculative_sampling_target_only on
    CUDA, zero draft probs, thresholds 1), "reference" (the pure-torch reference of that kernel, through the
    same adapter), "auto" (sglang when usable, else triton when usable and the params are temperature-only,
    else torch).
    validate=False (with an int max_depth, after `prepare_verify`) is capture-safe for every backend but
    "reference": no finiteness read, no host synchronisation (a CUDA generator must be registered with the
    graph by the caller).
    """
    _check_verify_shapes(tree, target_logits)
    if not isinstance(params, SamplingParams):
        raise ValueError(f"params must be a SamplingParams, got {type(params).__name__}")
    depth = resolve_max_depth(tree, max_depth, validate=validate)
    backend = resolve_backend(backend, target_logits.device, params)
    if backend == "triton" and not params.all_greedy:
        lazy = _verify_lazy(tree, target_logits, params, generator, depth, validate)  # checks finiteness itself
        if lazy is not None:
            return lazy
        backend = "torch"  # finite logits whose x / T overflows fp32: torch shifts by the row max first
    if validate:
        check_all_finite("target_logits", target_logits)
    if params.all_greedy:
        params.broadcast(tree.batch_size, target_logits.device)  # same argument checks as the sampled path
        return _verify_greedy_unchecked(tree, target_logits, depth)

    if backend in ("sglang", "reference"):
        probs = process_logits_unchecked(target_logits, params)  # [B, N, V] fp32
        kernel = load_sglang_kernel() if backend == "sglang" else reference_tree_speculative_sampling_target_only
        return verify_with_kernel(
            tree, encode_retrieve(tree), probs, kernel=kernel, generator=generator, max_depth=depth
        )

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
    validate: bool,
) -> VerifyResult | None:
    """Temperature-only sample-and-walk drawing picks only along the walk (triton_verify.py).

    One read of the logits (row lse of x / T and row min, which also proves finiteness: one host sync when
    validate), one per-request walk kernel, then the exact expectation from a [B, N] gather. Returns None when
    the logits are finite but x / T overflows fp32 (the caller then takes the torch path); raises the usual
    ValueError on non-finite logits. validate=False reads nothing on the host (never returns None).
    """
    from ddtree.core.triton_verify import scaled_row_lse_and_min

    batch = target_logits.shape[0]
    greedy, inv_t = _inverse_temperatures(params, batch, target_logits.device)  # [B] each
    lse, low = scaled_row_lse_and_min(target_logits, inv_t)  # [B, N] each
    if validate and not bool(torch.isfinite(lse).all() & torch.isfinite(low).all()):
        check_all_finite("target_logits", target_logits)  # raises unless only x / T overflowed
        return None
    uniforms = torch.rand((batch, depth + 1), generator=generator, device=target_logits.device)  # one per step
    return lazy_walk_result(tree, target_logits, lse, greedy, inv_t, uniforms, depth)


def lazy_walk_result(
    tree: DDTreeBuildResult,
    target_logits: torch.Tensor,
    lse: torch.Tensor,
    greedy: torch.Tensor,
    inv_t: torch.Tensor,
    uniforms: torch.Tensor,
    depth: int,
) -> VerifyResult:
    """The lazy walk with given coins and its exact expectation (capture-safe). lse [B, N] of the logits / T
    (`triton_verify.scaled_row_lse_and_min`); greedy [B] bool; inv_t [B] (1 on greedy rows); uniforms
    [B, D + 1], the coin of the walk's step d in column d (the node it visits at depth d)."""
    from ddtree.core.triton_verify import lazy_walk

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


def commit(tree: DDTreeBuildResult, verify_result: VerifyResult) -> CommitResult:
    """What to keep after a round: accepted node indices (KV / hidden rows) and emitted tokens.

    emitted_tokens[b] = tokens of the accepted nodes after the root, then the bonus, -1 padded.
    Capture-safe: shape checks and tensor ops only, no host synchronisation.
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
