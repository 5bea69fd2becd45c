"""DDTree tree builder: the drafter's per-position distributions -> a best-first draft tree.

Two exact builders share one vocabulary step (`depth_topk`) and one total order on prefixes, so they
return identical trees (same nodes, same numbering, bit-identical logws):

* ``heap``: the published per-request best-first heap (host side, Python ``heapq``).
* ``batched``: a per-depth beam of width ``budget`` followed by a global top-``budget``, all tensor ops,
  no host round-trip, batched over requests. On CUDA with bf16/fp16 logits and k = min(budget, V) <= 256
  the vocabulary step is two Triton kernels (one read for row logsumexp, min and the maxima of groups of 64
  ids; then one program per row selects the exact top-k from the group maxima, `grouped_vocab_topk`), and
  the tail is two more (the per-depth beam as one program per request, then the tree assembly). On CUDA the
  whole build is one CUDA graph per shape; with the select step it reads each call's logits in place through
  an address set before the replay (no input copy), otherwise through a static copy, or in place once a
  stable caller buffer was seen twice. Other dtypes or k > 256 use the torch/int32-key vocabulary steps (`grouped_topk16`, `pruned_topk`;
  the radix-select kernel is opt-in with DDTREE_FUSED_TOPK=1). Every Triton piece is probed or checked
  against its torch twin once per device or shape; the torch beam stays the eager reference and the CPU path.

The order on prefixes (the tie rule): descending logw, then smaller depth, then - between two prefixes of
one depth - the earlier parent (in this same order), then the smaller rank (rank r = the r-th most
probable token at that depth, token-id ascending among equal logits). The heap gets it from the key
``(-logw, depth, parent's node index, rank)``; the beam gets it because each depth's beam is kept sorted
in this order and candidates are numbered ``parent_position * k + rank``.

Why the beam is exact: logw never increases along a path, so the best ``budget`` prefixes are
prefix-closed, every depth-d node of the best tree is among the best ``budget`` depth-d prefixes, and
the parent of each of those is among the best ``budget`` depth-(d-1) prefixes. logws are summed in
float32 in the same order in both builders (parent logw + edge log-prob), so they agree exactly.
"""

from __future__ import annotations

import heapq
import os
import warnings
from collections import OrderedDict
from functools import lru_cache

import numpy as np
import torch

from ddtree.core.checks import check_budget, check_tensor
from ddtree.core.sampling import SamplingParams
from ddtree.core.types import DDTreeBuildResult

METHODS = ("auto", "heap", "batched")

_LOW32 = (1 << 32) - 1


# --------------------------------------------------------------------------------------------------
# validation and method choice
# --------------------------------------------------------------------------------------------------


def _validate(
    draft_logits: object, budget: object, method: object, *, check_finite: bool
) -> tuple[torch.Tensor, int]:
    if not isinstance(method, str) or method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    budget = check_budget("budget", budget)
    logits = check_tensor("draft_logits", draft_logits, ndim=3, floating=True)
    if logits.shape[1] == 0 or logits.shape[2] == 0:
        raise ValueError(
            f"draft_logits must have D > 0 drafted positions and V > 0 tokens, got shape {tuple(logits.shape)}"
        )
    if check_finite:
        check_tensor("draft_logits", logits, finite=True)
    return logits, budget


def choose_method(batch: int, depth: int, vocab: int, budget: int, device: torch.device | str) -> str:
    """The builder `method="auto"` uses for a shape (rule from the measurements in benchmarks/NOTES-core.md).

    CUDA -> "batched" at every shape. On one H200 (V = 151,936, D = 15, bf16), with the Triton select step,
    beam and tree assembly, the graph-replayed batched build beat the heap in every cell of the issue's grid
    (B 1, 8, 32, 64 x budget 32, 64, 128, 256) and of B 1, 8, 64 x budget 32, 128, 256 in a second run; the
    closest cells, B = 1 / budget 256: 0.45 vs 1.08 ms and 0.43 vs 0.76 ms (benchmarks/h200-2026-11-30-s4/).
    With the earlier torch top-k glue the same cell was 0.73-0.91 vs 1.55-2.61 ms (h200-2026-11-30-s3/).
    CPU (and other devices) -> "heap": the vocabulary step dominates both builders, and the eager beam's
    extra tensor ops never paid for themselves on CPU (B 1..64, budget 16..256, V = 4096, one thread).
    """
    device = torch.device(device)
    return "batched" if device.type == "cuda" else "heap"


# --------------------------------------------------------------------------------------------------
# shared vocabulary step
# --------------------------------------------------------------------------------------------------


def ordered_int(x: torch.Tensor) -> torch.Tensor:
    """float32 -> int64 whose signed order is the float order (-0.0 folded onto +0.0)."""
    bits = (x.float() + 0.0).view(torch.int32)  # + 0.0 turns -0.0 into +0.0
    return (bits ^ ((bits >> 31) & 0x7FFFFFFF)).to(torch.int64)


def _descending_key(values: torch.Tensor, tiebreak: torch.Tensor) -> torch.Tensor:
    """int64 key: larger value first, then smaller `tiebreak` (0 <= tiebreak < 2**32). All keys distinct."""
    return (ordered_int(values) << 32) + (_LOW32 - tiebreak)


def _row_logsumexp(x2d: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Row logsumexp in float32 and a 0-dim bool 'some logit is non-finite'. x2d: [R, V]."""
    if x2d.is_cuda and _triton_lse_usable(x2d.device):
        from ddtree.core.triton_kernels import row_lse_and_min

        lse, row_min = row_lse_and_min(x2d)  # [R] float32 each
        bad = ~(torch.isfinite(lse) & (row_min > float("-inf"))).all()
        return lse, bad
    lse = torch.logsumexp(x2d.float(), dim=-1)  # [R]
    bad = ~torch.isfinite(x2d).all()
    return lse, bad


GROUP = 64  # ids per group of the group-maxima pruning


def pruned_topk(x2d: torch.Tensor, k: int, group: int = GROUP) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact top-k of each row of x2d [R, V] under the tie rule (value descending, then id ascending), sorted.

    Pruning by group maxima: split a row into groups of `group` consecutive ids; only the `k` groups with
    the largest maxima (ties: smaller group first) can hold a top-k element, because each of those groups
    holds one element at least as large as any element of the other groups. So one streaming `amax` over
    the row, a top-k over the [R, V / group] maxima and a top-k over k * group candidates replace a radix
    select over the whole row (V = 151,936: 2,374 maxima and 8,192 candidates per row at k = 128).
    Ties at the cut keep the smaller ids: groups are ordered by (max, -group index) and candidates by
    (value, -id), so the result equals a full sort by the tie rule. Returns (values raw dtype, ids int64).
    """
    r, v = x2d.shape
    groups = -(-v // group)
    full = v // group
    maxima = x2d[:, : full * group].reshape(r, full, group).amax(dim=-1)  # [R, full]
    if full < groups:
        maxima = torch.cat([maxima, x2d[:, full * group :].amax(dim=-1, keepdim=True)], dim=1)  # [R, G]
    group_ids = torch.arange(groups, device=x2d.device)
    chosen = _descending_key(maxima.float(), group_ids).topk(min(k, groups), dim=-1).indices  # [R, g]
    cand = (chosen.unsqueeze(-1) * group + torch.arange(group, device=x2d.device)).reshape(r, -1)  # [R, g*group]
    real = cand < v  # the last group may be short
    cand = cand.clamp_max(v - 1)
    cand_vals = x2d.gather(1, cand)  # [R, g*group] raw dtype
    keys = _descending_key(cand_vals.float(), cand).masked_fill(~real, torch.iinfo(torch.int64).min)
    pos = keys.topk(k, dim=-1).indices  # [R, k], sorted by the tie rule
    return cand_vals.gather(1, pos), cand.gather(1, pos)


def vocab_topk(x2d: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k values (raw dtype) and ids per row of x2d [R, V].

    CUDA: `pruned_topk` (exact tie rule; measured on one H200 at R = 960, V = 151,936, k = 128, bf16:
    see benchmarks/NOTES-core.md) unless DDTREE_NO_PRUNED_TOPK is set; elsewhere torch's top-k (order among
    ties unspecified; callers sort by the tie rule).
    """
    if x2d.is_cuda and os.environ.get("DDTREE_NO_PRUNED_TOPK", "") not in ("1", "true", "yes"):
        return pruned_topk(x2d, k)
    return x2d.topk(k, dim=-1)


def _probed_once(cache: dict[int, bool], device: torch.device, probe) -> bool:
    """`probe(device)` once per CUDA device, cached in `cache`; False while a CUDA graph is being captured
    (a probe compiles kernels and syncs, which must never happen inside a capture)."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in cache:
        if torch.cuda.is_current_stream_capturing():
            return False
        cache[index] = probe(torch.device("cuda", index))
    return cache[index]


def _fused_topk_usable(x2d: torch.Tensor) -> bool:
    """The fused Triton radix-select vocabulary step applies: CUDA, bf16/fp16, asked for with
    DDTREE_FUSED_TOPK=1, probed once per device. Opt-in: on one H200 (R = 960, V = 151,936, k = 128) it took
    3.10 ms against 1.73 ms for the torch step it replaces (its histogram passes dominate)."""
    if not x2d.is_cuda or x2d.dtype not in (torch.bfloat16, torch.float16):
        return False
    if os.environ.get("DDTREE_FUSED_TOPK", "") not in ("1", "true", "yes"):
        return False
    if not _triton_lse_usable(x2d.device):
        return False
    return _probed_once(_FUSED_TOPK_OK, x2d.device, _probe_fused_topk)


_KEY16_DTYPES = (torch.bfloat16, torch.float16)
_KEY16_LOW = 32767  # 15 low bits of an int32 key: (order key << 15) | (32767 - index), index < 32768


def order_key16(x: torch.Tensor) -> torch.Tensor:
    """bf16/fp16 -> int32 in [0, 65535] whose order is the float order (-0.0 folded onto +0.0)."""
    bits = x.view(torch.int16).to(torch.int32)  # sign-extended
    bits = torch.where(bits == -32768, torch.zeros_like(bits), bits)  # -0.0 -> +0.0
    return (bits ^ ((bits >> 15) & 0x7FFF)) + 32768


def grouped_topk16_fits(vocab: int, k: int) -> bool:
    """The int32 keys of `grouped_topk16` hold: < 32768 groups and <= 32768 candidates."""
    groups = -(-vocab // GROUP)
    return groups <= _KEY16_LOW + 1 and min(k, groups) * GROUP <= _KEY16_LOW + 1


def grouped_topk16(x2d: torch.Tensor, gmax: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact top-k of bf16/fp16 rows x2d [R, V] under the tie rule, sorted, from the group maxima gmax [R, G]
    (float32, groups of GROUP consecutive ids, as `row_lse_min_groupmax` writes them).

    Same pruning as `pruned_topk`, with int32 keys instead of int64: a group's key is
    (order key of its max << 15) | (32767 - group index) (ties -> smaller group); the chosen groups are
    sorted ascending so that a candidate's position follows its id, and a candidate's key is
    (order key of its value << 15) | (32767 - position). Both top-ks then return the tie-rule order
    directly (no argsort afterwards). Needs `grouped_topk16_fits(V, k)`. Returns (values raw dtype, ids int64).
    """
    r, v = x2d.shape
    groups = gmax.shape[1]
    if x2d.dtype not in _KEY16_DTYPES:
        raise ValueError(f"x2d must be bfloat16 or float16, got {x2d.dtype}")
    if groups != -(-v // GROUP) or not grouped_topk16_fits(v, k):
        raise ValueError(f"gmax must be [R, cdiv(V, {GROUP})] with V={v}, k={k} within the int32 keys")
    dev = x2d.device
    g = min(k, groups)
    group_ids = torch.arange(groups, dtype=torch.int32, device=dev)  # [G]
    gkey = (order_key16(gmax.to(x2d.dtype)) << 15) | (_KEY16_LOW - group_ids)  # [R, G] int32, distinct
    chosen = gkey.topk(g, dim=-1, sorted=False).indices.sort(dim=-1).values  # [R, g] ascending group ids
    cand = (chosen.unsqueeze(-1) * GROUP + torch.arange(GROUP, device=dev)).reshape(r, g * GROUP)  # [R, C] ids
    real = cand < v  # the last group may be short
    cand = cand.clamp_max(v - 1)
    cand_vals = x2d.gather(1, cand)  # [R, C] raw dtype
    pos = torch.arange(g * GROUP, dtype=torch.int32, device=dev)  # [C]
    ckey = ((order_key16(cand_vals) << 15) | (_KEY16_LOW - pos)).masked_fill(~real, -1)  # [R, C] int32
    top = ckey.topk(k, dim=-1, sorted=True).indices  # [R, k] in tie-rule order
    return cand_vals.gather(1, top), cand.gather(1, top)


def _grouped_usable(x2d: torch.Tensor, k: int) -> bool:
    """The one-read statistics + group maxima kernel and `grouped_topk16` apply: CUDA, bf16/fp16, keys fit,
    not turned off with DDTREE_NO_GROUPED_TOPK, probed once per device against an exact reference."""
    if not x2d.is_cuda or x2d.dtype not in _KEY16_DTYPES or not grouped_topk16_fits(x2d.shape[1], k):
        return False
    if os.environ.get("DDTREE_NO_GROUPED_TOPK", "") in ("1", "true", "yes"):
        return False
    if not _triton_lse_usable(x2d.device):
        return False
    return _probed_once(_GROUPED_OK, x2d.device, _probe_grouped)


def _vocab_step_grouped(x2d: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x2d [R, V] bf16/fp16 -> (logq [R, k] float32 descending, ids [R, k] int64, bad 0-dim bool): one read
    for logsumexp, min and group maxima (Triton), then the int32-key pruned top-k, already in tie-rule order."""
    from ddtree.core.triton_kernels import row_lse_min_groupmax

    lse, row_min, gmax = row_lse_min_groupmax(x2d, group=GROUP)  # [R], [R], [R, G]
    bad = ~(torch.isfinite(lse) & (row_min > float("-inf"))).all()
    vals, ids = grouped_topk16(x2d, gmax, k)  # [R, k] x2, sorted
    return vals.float() - lse.unsqueeze(1), ids, bad


def _vocab_step_select(
    x2d: torch.Tensor, k: int, x_address: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x2d [R, V] bf16/fp16 -> (logq [R, k] float32 descending, ids [R, k] int64, bad 0-dim bool) in two
    Triton kernels: one read for the statistics and group maxima, then one program per row that selects the
    exact top-k from the group maxima (`grouped_vocab_topk`; k <= 256). x_address: the kernels read the
    logits at this address instead of x2d's (the indirect graph)."""
    from ddtree.core.triton_kernels import grouped_vocab_topk

    logq, ids, _, _, bad_rows = grouped_vocab_topk(x2d, k, group=GROUP, x_address=x_address)  # [R, k] x2, .., [R]
    return logq, ids, bad_rows.any()


def _select_usable(x2d: torch.Tensor, k: int) -> bool:
    """`_vocab_step_select` applies: CUDA, bf16/fp16, k <= 256 and the int32 keys hold, not turned off with
    DDTREE_NO_TRITON_SELECT, probed once per device against an exact reference."""
    if not x2d.is_cuda or x2d.dtype not in _KEY16_DTYPES:
        return False
    if os.environ.get("DDTREE_NO_TRITON_SELECT", "") in ("1", "true", "yes"):
        return False
    if not _triton_lse_usable(x2d.device):
        return False
    from ddtree.core.triton_kernels import grouped_select_fits

    if not grouped_select_fits(x2d.shape[1], k, GROUP):
        return False
    return _probed_once(_SELECT_OK, x2d.device, _probe_select)


def _sorted_logq(
    vals32: torch.Tensor, ids: torch.Tensor, lse: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Order a row's top-k (vals32, ids [R, k]) by the tie rule and subtract the row logsumexp lse [R]."""
    order = _descending_key(vals32, ids).argsort(dim=-1, descending=True)  # [R, k]
    vals32 = vals32.gather(1, order)
    ids = ids.gather(1, order)
    return vals32 - lse.unsqueeze(1), ids  # [R, k] x2


def _vocab_step(x2d: torch.Tensor, k: int, *, fused: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x2d [R, V] -> (logq [R, k] float32 descending, ids [R, k] int64, bad 0-dim bool).

    fused=True: the Triton radix-select kernel (bf16/fp16; exact top-k under the tie rule, row logsumexp
    from the same kernel as `row_lse_and_min`); fused=False: logsumexp + torch top-k.
    """
    if fused:
        from ddtree.core.triton_kernels import row_topk_lse

        vals32, ids, lse, row_min = row_topk_lse(x2d, k)  # [R, k] x2, [R] x2
        bad = ~(torch.isfinite(lse) & (row_min > float("-inf"))).all()
    else:
        lse, bad = _row_logsumexp(x2d)  # [R]
        vals, ids = vocab_topk(x2d, k)  # [R, k] raw dtype, unordered among ties
        vals32 = vals.float()
    logq, ids = _sorted_logq(vals32, ids, lse)
    return logq, ids, bad


def depth_topk(
    draft_logits: torch.Tensor, k: int, *, x_address: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-position top-k of log_softmax, in a deterministic order.

    Returns logq [B, D, k] float32 (descending), token ids [B, D, k] int64, and a 0-dim bool tensor that is
    True when the logits hold a non-finite value (checked by the caller, so no sync happens here).
    The top-k runs on the raw logits (any float dtype, no float copy); log_softmax = logit - logsumexp.
    Among equal logits the smaller token id gets the smaller rank. Both builders call this, so they share
    one vocabulary step (on CUDA with bf16/fp16 logits and k <= 256: the Triton select step).
    x_address (only where `_indirect_usable`): the select step reads the logits at this address instead.
    """
    b, d, v = draft_logits.shape
    x2d = draft_logits.reshape(b * d, v)  # [R, V]
    fused = x_address is None and _fused_topk_usable(x2d)  # the opt-in radix-select step comes first if asked
    if x_address is not None:
        logq, ids, bad = _vocab_step_select(x2d, k, x_address)
    elif not fused and _select_usable(x2d, k):
        logq, ids, bad = _vocab_step_select(x2d, k)
    elif not fused and _grouped_usable(x2d, k):
        logq, ids, bad = _vocab_step_grouped(x2d, k)
    else:
        logq, ids, bad = _vocab_step(x2d, k, fused=fused)
    return logq.reshape(b, d, k), ids.reshape(b, d, k), bad


def _raise_if_bad(bad: torch.Tensor) -> None:
    if bool(bad):
        raise ValueError("draft_logits contains non-finite values (nan or inf)")


# --------------------------------------------------------------------------------------------------
# heap (reference)
# --------------------------------------------------------------------------------------------------


def _heap_one(logq: np.ndarray, ids: np.ndarray, budget: int) -> tuple[list, list, list, list]:
    """Best-first heap for one request. logq, ids: [D, k] (float32, int64). Returns node lists (root excluded)."""
    depth_max, k = logq.shape
    tokens: list[int] = []
    parents: list[int] = []
    depths: list[int] = []
    logws: list[np.float32] = []
    zero = np.float32(0.0)
    first = zero + logq[0, 0]
    # entry: (-logw, depth, parent node index, rank, logw); node indices count the root as 0
    heap = [(-first, 1, 0, 0, first)]
    while heap and len(tokens) < budget:
        _, depth, parent, rank, logw = heapq.heappop(heap)
        if logw == -np.inf:  # everything still queued is -inf as well
            break
        tokens.append(int(ids[depth - 1, rank]))
        parents.append(parent)
        depths.append(depth)
        logws.append(logw)
        index = len(tokens)
        parent_logw = logws[parent - 1] if parent > 0 else zero
        if rank + 1 < k:
            sib = parent_logw + logq[depth - 1, rank + 1]  # float32 add, same as the beam
            heapq.heappush(heap, (-sib, depth, parent, rank + 1, sib))
        if depth < depth_max:
            child = logw + logq[depth, 0]
            heapq.heappush(heap, (-child, depth + 1, index, 0, child))
    return tokens, parents, depths, logws


def _build_heap(logits: torch.Tensor, budget: int) -> DDTreeBuildResult:
    b, _, v = logits.shape
    k = min(budget, v)
    logq, ids, bad = depth_topk(logits, k)
    _raise_if_bad(bad)
    logq_h = logq.cpu().numpy()  # [B, D, k] one host copy for the whole batch
    ids_h = ids.cpu().numpy()
    n = budget + 1
    token_ids = np.full((b, n), -1, dtype=np.int64)
    parents = np.full((b, n), -1, dtype=np.int64)
    depths = np.zeros((b, n), dtype=np.int64)
    node_logws = np.full((b, n), -np.inf, dtype=np.float32)
    node_logws[:, 0] = 0.0
    num_nodes = np.ones(b, dtype=np.int64)
    for i in range(b):
        tok, par, dep, lw = _heap_one(logq_h[i], ids_h[i], budget)
        m = len(tok)
        token_ids[i, 1 : m + 1] = tok
        parents[i, 1 : m + 1] = par
        depths[i, 1 : m + 1] = dep
        node_logws[i, 1 : m + 1] = lw
        num_nodes[i] = m + 1
    dev = logits.device
    return DDTreeBuildResult(
        token_ids=torch.from_numpy(token_ids).to(dev),
        parents=torch.from_numpy(parents).to(dev),
        depths=torch.from_numpy(depths).to(dev),
        node_logws=torch.from_numpy(node_logws).to(dev),
        num_nodes=torch.from_numpy(num_nodes).to(dev),
    )


# --------------------------------------------------------------------------------------------------
# batched beam (eager reference; also the body of the CUDA graph)
# --------------------------------------------------------------------------------------------------


@lru_cache(maxsize=64)
def _candidate_pairs_cpu(width: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(beam position j, rank r) pairs that can reach a depth's top-`width`: (j + 1) * (r + 1) <= width.

    Candidate (j, r) is beaten by every (j', r') with j' <= j, r' <= r (beam and ranks are sorted in the
    prefix order), so if there are `width` or more of those it cannot be selected. Sorted by j * k + r.
    This keeps ~width * ln(width) candidates instead of width * k.
    """
    js, rs = [], []
    for j in range(width):
        r_max = min(k, width // (j + 1))
        js.extend([j] * r_max)
        rs.extend(range(r_max))
    return torch.tensor(js, dtype=torch.int64), torch.tensor(rs, dtype=torch.int64)


_PAIR_CACHE: dict[tuple[int, int, str], tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}


def _candidate_pairs(width: int, k: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    key = (width, k, str(device))
    if key not in _PAIR_CACHE:
        js, rs = _candidate_pairs_cpu(width, k)
        _PAIR_CACHE[key] = (js.to(device), rs.to(device), (_LOW32 - (js * k + rs)).to(device))
    return _PAIR_CACHE[key]


def _beam_torch(
    logq: torch.Tensor, ids: torch.Tensor, js: torch.Tensor, rs: torch.Tensor, pair_low: torch.Tensor, w: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-depth beam of width w (the eager reference): logw, token, parent position, each [B, D, W].

    Each depth's beam is sorted in the prefix order; -inf entries are padding (fewer than w prefixes).
    """
    b, d, k = logq.shape
    dev = logq.device
    # depth 1: the beam is the sorted top-k itself, padded with -inf to the width
    beam_logw = torch.full((b, w), float("-inf"), dtype=torch.float32, device=dev)  # [B, W]
    beam_logw[:, :k] = logq[:, 0]
    beam_tok = torch.zeros((b, w), dtype=torch.int64, device=dev)
    beam_tok[:, :k] = ids[:, 0]
    beam_par = torch.zeros((b, w), dtype=torch.int64, device=dev)  # unused at depth 1 (root)
    all_logw, all_tok, all_par = [beam_logw], [beam_tok], [beam_par]
    for depth in range(1, d):
        cand = beam_logw[:, js] + logq[:, depth, rs]  # [B, M] float32, parent + edge
        key = (ordered_int(cand) << 32) + pair_low  # [B, M] distinct
        pick = key.topk(w, dim=-1, sorted=True).indices  # [B, W], in prefix order
        beam_logw = cand.gather(1, pick)
        beam_par = js[pick]  # [B, W] parent's beam position
        beam_tok = ids[:, depth].gather(1, rs[pick])
        all_logw.append(beam_logw)
        all_tok.append(beam_tok)
        all_par.append(beam_par)
    return torch.stack(all_logw, 1), torch.stack(all_tok, 1), torch.stack(all_par, 1)


def _tree_from_beam_torch(
    beam_logw: torch.Tensor, beam_tok: torch.Tensor, beam_par: torch.Tensor, budget: int
) -> tuple[torch.Tensor, ...]:
    """Beam [B, D, W] x3 -> token_ids, parents, depths, node_logws [B, N] and num_nodes [B] (the eager
    reference of the tail; `triton_kernels.tree_from_beam` is its one-kernel twin)."""
    b, d, w = beam_logw.shape
    dev = beam_logw.device
    flat_logw = beam_logw.reshape(b, d * w)  # [B, D*W], depth-major
    flat_tok = beam_tok.reshape(b, d * w)
    flat_par = beam_par.reshape(b, d * w)

    # global top-budget over all depths: descending logw, then smaller depth, then beam position
    slot = torch.arange(d * w, device=dev)  # [D*W]
    pick = _descending_key(flat_logw, slot.expand(b, -1)).topk(budget, dim=-1, sorted=True).indices  # [B, budget]
    sel_logw = flat_logw.gather(1, pick)
    sel_tok = flat_tok.gather(1, pick)
    sel_depth0 = pick // w  # 0-based depth
    sel_parent_slot = (sel_depth0 - 1) * w + flat_par.gather(1, pick)  # slot of the parent (invalid at depth 0)
    valid = sel_logw > float("-inf")  # [B, budget]

    # renumber: slot -> node index (1..budget), parents remapped through it
    node_of_slot = torch.full((b, d * w), -1, dtype=torch.int64, device=dev)
    node_ids = torch.arange(1, budget + 1, device=dev).expand(b, -1)
    node_of_slot.scatter_(1, pick, node_ids)
    parent_node = node_of_slot.gather(1, sel_parent_slot.clamp(min=0))
    parent_node = torch.where(sel_depth0 == 0, torch.zeros_like(parent_node), parent_node)

    minus1 = torch.full((b, 1), -1, dtype=torch.int64, device=dev)
    token_ids = torch.cat([minus1, torch.where(valid, sel_tok, -1)], 1)  # [B, N]
    parents = torch.cat([minus1, torch.where(valid, parent_node, -1)], 1)
    depths = torch.cat([torch.zeros_like(minus1), torch.where(valid, sel_depth0 + 1, 0)], 1)
    node_logws = torch.cat(
        [torch.zeros((b, 1), dtype=torch.float32, device=dev), torch.where(valid, sel_logw, float("-inf"))], 1
    )
    num_nodes = valid.sum(1) + 1  # [B]
    return token_ids, parents, depths, node_logws, num_nodes


def _tail_tensors(logq: torch.Tensor, ids: torch.Tensor, budget: int) -> tuple[torch.Tensor, ...]:
    """The build after the vocabulary step: per-depth beam of width `budget`, then the tree (Triton on CUDA
    when usable, else torch). logq/ids [B, D, k] -> token_ids, parents, depths, node_logws [B, N], num_nodes."""
    k = logq.shape[2]
    w = budget  # beam width
    js, rs, pair_low = _candidate_pairs(w, k, logq.device)  # [M] x3
    tree = _triton_tail_checked(logq, ids, js, rs, pair_low, w, budget) if logq.is_cuda else None
    if tree is None:
        tree = _tree_from_beam_torch(*_beam_torch(logq, ids, js, rs, pair_low, w), budget)
    return tree


def _batched_tensors(
    logits: torch.Tensor, budget: int, x_address: torch.Tensor | None = None
) -> tuple[torch.Tensor, ...]:
    """Pure tensor body of the batched build (no host sync; CUDA-graph capturable once constants exist).

    Returns token_ids, parents, depths, node_logws [B, N], num_nodes [B], bad (0-dim bool).
    """
    logq, ids, bad = depth_topk(logits, min(budget, logits.shape[2]), x_address=x_address)  # [B, D, k] x2
    return (*_tail_tensors(logq, ids, budget), bad)


def _result(tensors: tuple[torch.Tensor, ...]) -> DDTreeBuildResult:
    token_ids, parents, depths, node_logws, num_nodes, _ = tensors
    return DDTreeBuildResult(
        token_ids=token_ids, parents=parents, depths=depths, node_logws=node_logws, num_nodes=num_nodes
    )


def _build_batched_eager(logits: torch.Tensor, budget: int) -> DDTreeBuildResult:
    tensors = _batched_tensors(logits, budget)
    _raise_if_bad(tensors[-1])
    return _result(tensors)


# --------------------------------------------------------------------------------------------------
# CUDA graph replay of the batched build
# --------------------------------------------------------------------------------------------------


def _capture(body, device: torch.device) -> tuple[torch.cuda.CUDAGraph, tuple[torch.Tensor, ...]]:
    """Run `body()` twice on a side stream (compiles kernels, runs first-call checks, fills constant caches:
    none of that may happen inside a capture), then capture it. Returns the graph and its static outputs."""
    stream = torch.cuda.Stream(device=device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        for _ in range(2):
            body()
    torch.cuda.current_stream(device).wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = body()
    return graph, static_out


class _GraphedBuild:
    """One captured batched build for a fixed (shape, dtype, budget, device), in one of three input modes.

    "indirect" (the default wherever the Triton select step applies): the two kernels that read the logits
    take their address from a device scalar, set before each replay, so the graph reads the caller's buffer
    in place whatever its address (no copy, nothing kept alive). The logits must be contiguous.
    "copy": the input is copied into a static buffer before each replay (0.15 ms at B = 64, V = 151,936 bf16
    on an H200). "alias": the graph reads the caller's tensor `like` in place; it may only be replayed for a
    tensor with the same data_ptr, shape, strides and dtype (then the same bytes), and it keeps `like` alive
    so that its memory cannot be handed to anything else while the graph exists.
    """

    def __init__(self, like: torch.Tensor, budget: int, *, mode: str = "copy") -> None:
        self.budget = budget
        self.mode = mode
        self.address = None
        if mode == "indirect":
            self.address = torch.tensor([like.data_ptr()], dtype=torch.int64, device=like.device)  # [1]
            self.static_in = None
            body_in = like  # gives the layout only: the kernels read self.address
        elif mode == "alias":
            self.static_in = body_in = like
        else:
            self.static_in = body_in = torch.zeros_like(like)
            self.static_in.copy_(like)
        self.graph, self.static_out = _capture(
            lambda: _batched_tensors(body_in, budget, self.address), like.device
        )

    def reads(self, logits: torch.Tensor) -> bool:
        """An alias graph can replay for logits: same memory, same layout (so the same bytes)."""
        x = self.static_in
        return (
            logits.data_ptr() == x.data_ptr() and logits.shape == x.shape
            and logits.stride() == x.stride() and logits.dtype == x.dtype
        )

    def __call__(self, logits: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if self.mode == "indirect":
            self.address.fill_(logits.data_ptr())  # stream-ordered: this replay reads this buffer
        elif self.mode == "copy":
            self.static_in.copy_(logits)
        self.graph.replay()
        return tuple(t.clone() for t in self.static_out)


def _indirect_usable(logits: torch.Tensor, budget: int) -> bool:
    """The whole-build graph can read the caller's buffer through an address (`_GraphedBuild` "indirect"):
    the Triton select step is the vocabulary step for this input, and DDTREE_NO_INDIRECT_GRAPH is not set."""
    if os.environ.get("DDTREE_NO_INDIRECT_GRAPH", "") in ("1", "true", "yes"):
        return False
    b, d, v = logits.shape
    x2d = logits.reshape(b * d, v)
    return not _fused_topk_usable(x2d) and _select_usable(x2d, min(budget, v))


def _cached_graph(cache: OrderedDict, failed: set, key: tuple, make, what: str):
    """The graph for `key` from the LRU `cache` (at most _MAX_GRAPHS), captured by `make()` on first use;
    None when its capture was refused (e.g. inside another capture), which is remembered in `failed` and
    warned about once: the caller then runs `what` eagerly, which is exact too."""
    if key in failed:
        return None
    graphed = cache.get(key)
    if graphed is not None:
        cache.move_to_end(key)
        return graphed
    try:
        graphed = make()
    except RuntimeError as exc:
        warnings.warn(f"ddtree build_tree: CUDA graph capture failed ({exc}); using the eager {what}")
        failed.add(key)
        return None
    _lru_put(cache, key, graphed)
    return graphed


def _lru_put(cache: OrderedDict, key: tuple, graphed: _GraphedBuild) -> None:
    """Insert into an LRU graph cache, evicting the least recently used beyond _MAX_GRAPHS."""
    cache[key] = graphed
    while len(cache) > _MAX_GRAPHS:
        cache.popitem(last=False)


_GRAPHS: OrderedDict[tuple, _GraphedBuild] = OrderedDict()
_UNGRAPHABLE: set[tuple] = set()
_MAX_GRAPHS = 16


def _graphs_enabled() -> bool:
    return os.environ.get("DDTREE_NO_CUDA_GRAPH", "") not in ("1", "true", "yes")


# Where the indirect graph does not apply (float32 logits, k > 256, the opt-in radix step, or
# DDTREE_NO_INDIRECT_GRAPH=1), alias graphs skip the static input copy for callers that
# pass the same buffer every round (e.g. a drafter replayed from its own CUDA graph): once the copying graph
# exists, two calls in a row at one address capture a second graph that reads that buffer in place (one per
# shape key). If the buffer later moves (e.g. a fresh temporary per call that the allocator happened to
# place twice at one address), the alias is dropped and that key never aliases again: one wasted capture.
_ALIAS_GRAPHS: OrderedDict[tuple, _GraphedBuild] = OrderedDict()
_LAST_ADDRESS: dict[tuple, tuple] = {}
_NO_ALIAS: set[tuple] = set()


def _alias_enabled() -> bool:
    return os.environ.get("DDTREE_NO_GRAPH_ALIAS", "") not in ("1", "true", "yes")


def _alias_graph(key: tuple, logits: torch.Tensor, budget: int) -> _GraphedBuild | None:
    """The alias graph for logits' buffer, captured on the second call in a row at one address; else None."""
    if key in _NO_ALIAS:
        return None
    graphed = _ALIAS_GRAPHS.get(key)
    if graphed is not None:
        if graphed.reads(logits):
            _ALIAS_GRAPHS.move_to_end(key)
            return graphed
        del _ALIAS_GRAPHS[key]  # the buffer moved: drop the alias (and the reference it held), stop aliasing
        _NO_ALIAS.add(key)
        return None
    address = (logits.data_ptr(), logits.stride())
    seen_twice = _LAST_ADDRESS.get(key) == address
    _LAST_ADDRESS[key] = address
    if not seen_twice:
        return None
    try:
        graphed = _GraphedBuild(logits, budget, mode="alias")
    except RuntimeError:  # capture refused: the copying graph still serves this key
        _NO_ALIAS.add(key)
        return None
    _lru_put(_ALIAS_GRAPHS, key, graphed)
    return graphed


def _build_batched_graphed(logits: torch.Tensor, budget: int) -> DDTreeBuildResult:
    if _indirect_usable(logits, budget):
        logits = logits.contiguous()  # the graph reads rows at a fixed stride
        if logits.data_ptr() % 16:  # the kernels assume a 16-byte aligned address (vectorized loads)
            logits = logits.clone()
        key = (tuple(logits.shape), logits.dtype, budget, logits.device.index, "indirect")
        graphed = _cached_graph(
            _GRAPHS, _UNGRAPHABLE, key, lambda: _GraphedBuild(logits, budget, mode="indirect"), "batched build"
        )
        if graphed is None:
            return _build_batched_eager(logits, budget)
        tensors = graphed(logits)
        _raise_if_bad(tensors[-1])
        return _result(tensors)
    key = (tuple(logits.shape), logits.dtype, budget, logits.device.index)
    if key in _UNGRAPHABLE:
        return _build_batched_eager(logits, budget)
    aliased = _alias_graph(key, logits, budget) if _alias_enabled() and key in _GRAPHS else None
    if aliased is not None:
        tensors = aliased(logits)
        _raise_if_bad(tensors[-1])
        return _result(tensors)
    graphed = _cached_graph(_GRAPHS, _UNGRAPHABLE, key, lambda: _GraphedBuild(logits, budget), "batched build")
    if graphed is None:
        return _build_batched_eager(logits, budget)
    tensors = graphed(logits)
    _raise_if_bad(tensors[-1])
    return _result(tensors)


def clear_graph_cache() -> None:
    """Drop every captured build (frees their static buffers)."""
    _GRAPHS.clear()
    _ALIAS_GRAPHS.clear()
    _LAST_ADDRESS.clear()
    _NO_ALIAS.clear()
    _UNGRAPHABLE.clear()


# --------------------------------------------------------------------------------------------------
# Triton availability (probed once per device against the torch reference)
# --------------------------------------------------------------------------------------------------

_TRITON_OK: dict[int, bool] = {}


def _triton_lse_usable(device: torch.device) -> bool:
    if os.environ.get("DDTREE_NO_TRITON", "") in ("1", "true", "yes"):
        return False
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _TRITON_OK:
        _TRITON_OK[index] = _probe_triton(torch.device("cuda", index))
    return _TRITON_OK[index]


# The kernel runs the whole per-depth beam of one request in one program, with an in-register bitonic
# top-k over the candidate keys. Widths <= 64 unroll the depth loop (checked and timed on an H200); wider
# beams (up to 256: <= 2048 padded int64 candidates) use a runtime depth loop, because 14 unrolled sorts of
# 1024 / 2048 keys compiled for minutes (benchmarks/NOTES-core.md). DDTREE_TRITON_BEAM_MAX_WIDTH lowers the
# limit (e.g. 64 to return widths 128 / 256 to the torch beam). Every shape is still checked against the
# torch beam on its first call.
def _triton_beam_max_width() -> int:
    value = os.environ.get("DDTREE_TRITON_BEAM_MAX_WIDTH", "")
    return int(value) if value.strip() else _TRITON_BEAM_MAX_WIDTH


_TRITON_BEAM_MAX_WIDTH = 256
_TRITON_TAIL_STATE: dict[tuple, bool] = {}  # (device, D, k, width, budget) -> checked against torch


def _triton_tail_checked(
    logq: torch.Tensor, ids: torch.Tensor, js: torch.Tensor, rs: torch.Tensor, pair_low: torch.Tensor, w: int,
    budget: int,
) -> tuple[torch.Tensor, ...] | None:
    """The Triton tail (one-program beam, then one-program tree assembly) when usable for this shape, else
    None (the caller runs the torch tail). Returns token_ids, parents, depths, node_logws, num_nodes.

    The first call per shape (never inside a graph capture) compiles the kernels and compares their output
    with the torch tail on the real input; a failure or a mismatch turns them off for that shape, with a
    warning. DDTREE_NO_TRITON_BEAM turns both off.
    """
    if os.environ.get("DDTREE_NO_TRITON_BEAM", "") in ("1", "true", "yes"):
        return None
    if w > _triton_beam_max_width() or not _triton_lse_usable(logq.device):
        return None
    b, d, k = logq.shape
    key = (logq.device.index, d, k, w, budget)
    state = _TRITON_TAIL_STATE.get(key)
    if state is False:
        return None
    if state is None and torch.cuda.is_current_stream_capturing():
        return None  # never compile or check inside a capture
    from ddtree.core.triton_kernels import beam_search, tree_from_beam

    if state is None:
        try:
            got = tree_from_beam(*beam_search(logq, ids, js, rs, w), budget)
            ref = _tree_from_beam_torch(*_beam_torch(logq, ids, js, rs, pair_low, w), budget)
            ok = all(torch.equal(x, y) for x, y in zip(got, ref))
        except Exception as exc:  # compile or launch failure: the torch tail is exact too
            warnings.warn(f"ddtree build_tree: Triton beam unavailable for {key} ({exc}); using the torch beam")
            ok = False
        else:
            if not ok:
                warnings.warn(f"ddtree build_tree: Triton beam disagrees with the torch beam for {key}; not used")
        _TRITON_TAIL_STATE[key] = ok
        return got if ok else None
    return tree_from_beam(*beam_search(logq, ids, js, rs, w), budget)


_FUSED_TOPK_OK: dict[int, bool] = {}


def _probe_fused_topk(device: torch.device) -> bool:
    """Check the fused radix-select vocabulary step once per device (`_probe_vocab_step`), its row
    logsumexp and minimum included."""
    def step(x: torch.Tensor, k: int):
        from ddtree.core.triton_kernels import row_topk_lse

        vals, ids, lse, row_min = row_topk_lse(x, k)
        return (*_sorted_logq(vals, ids, lse), lse, row_min)

    return _probe_vocab_step(device, "fused Triton vocabulary step", step)


def _probe_vocab_step(device: torch.device, name: str, step, *, k: int = 300) -> bool:
    """Check a Triton vocabulary step `step(x, k) -> (logq, ids, lse or None, row_min or None)` once per device
    against the exact tie-rule top-k and `row_lse_and_min` (logsumexp within 1e-6: steps that merge their own
    splits may round differently), on bf16/fp16 rows with many exact ties (some at
    the k-th position and across group borders) and a short last group."""
    try:
        from ddtree.core.triton_kernels import row_lse_and_min
    except Exception:
        return False
    try:
        gen = torch.Generator(device=device).manual_seed(0)
        ok = True
        for dtype in _KEY16_DTYPES:
            x = torch.randn(6, 5003, device=device, generator=gen) * 4
            x[::2] = x[::2].round()
            x = x.to(dtype)
            logq, ids, lse, row_min = step(x, k)
            slot = torch.arange(x.shape[1], device=device).expand(x.shape[0], -1)
            ref_ids = _descending_key(x.float(), slot).topk(k, dim=-1).indices  # [R, k] exact order
            ref_lse, ref_min = row_lse_and_min(x)
            own_lse = ref_lse if lse is None else lse  # a step that merges its own splits may round differently
            ok &= torch.equal(ids, ref_ids) and torch.equal(logq, x.float().gather(1, ref_ids) - own_lse[:, None])
            if lse is not None:
                ok &= torch.allclose(lse, ref_lse, rtol=1e-6, atol=1e-6) and torch.equal(row_min, ref_min)
        if not ok:
            warnings.warn(f"ddtree build_tree: {name} disagrees with torch; not used")
        return bool(ok)
    except Exception as exc:
        warnings.warn(f"ddtree build_tree: {name} unavailable ({exc}); using torch")
        return False


_GROUPED_OK: dict[int, bool] = {}


def _probe_grouped(device: torch.device) -> bool:
    """Check `_vocab_step_grouped` once per device (`_probe_vocab_step`)."""
    return _probe_vocab_step(
        device, "grouped int32-key vocabulary step", lambda x, k: (*_vocab_step_grouped(x, k)[:2], None, None)
    )


_SELECT_OK: dict[int, bool] = {}


def _probe_select(device: torch.device) -> bool:
    """Check `grouped_vocab_topk` once per device (`_probe_vocab_step`), with one and with several candidate
    chunks per row."""
    from ddtree.core.triton_kernels import grouped_vocab_topk

    def step(chunk: int | None):
        return lambda x, k: grouped_vocab_topk(x, k, group=GROUP, chunk=chunk)[:4]

    return all(
        _probe_vocab_step(device, f"Triton select vocabulary step (chunk {chunk})", step(chunk), k=k)
        for chunk, k in ((None, 64), (16, 64), (None, 256))
    )


def _probe_triton(device: torch.device) -> bool:
    try:
        from ddtree.core.triton_kernels import row_lse_and_min
    except Exception:  # triton missing or broken: the torch path is exact, only slower
        return False
    try:
        gen = torch.Generator(device=device).manual_seed(0)
        x = (torch.randn(7, 5003, device=device, generator=gen) * 4).to(torch.bfloat16)
        lse, row_min = row_lse_and_min(x)
        ok_lse = torch.allclose(lse, torch.logsumexp(x.float(), -1), rtol=0, atol=1e-4)
        ok_min = torch.equal(row_min, x.float().amin(-1))
        return bool(ok_lse and ok_min)
    except Exception:
        return False


# --------------------------------------------------------------------------------------------------
# public API
# --------------------------------------------------------------------------------------------------


def build_tree(
    draft_logits: torch.Tensor, budget: int, *, method: str = "auto", sampling: SamplingParams | None = None
) -> DDTreeBuildResult:
    """Build one draft tree per request from the drafter's per-position logits.

    draft_logits: [B, D, V], any float dtype, any device. budget: the number of draft nodes (root excluded).
    Returns N = budget + 1 columns, column 0 the root, nodes numbered best-first (see the module docstring
    for the exact order). method: "heap" (per-request reference), "batched" (exact batched beam; CUDA-graph
    replay on CUDA), or "auto" (`choose_method`).
    Raises ValueError naming the argument for bad rank, empty D or V, non-finite logits, a budget that is
    not an int >= 1, or an unknown method.
    sampling: build on the marginals processed like the target's (temperature, top-k, top-p), i.e. on
    `build_sampling.processed_draft_logprobs(draft_logits, sampling)`; greedy rows keep the raw tree.
    """
    if sampling is not None and not sampling.all_greedy:
        from ddtree.core.build_sampling import processed_draft_logprobs

        draft_logits = processed_draft_logprobs(draft_logits, sampling)
    # finiteness is checked from the vocabulary step's row statistics (no extra pass over the logits)
    logits, budget = _validate(draft_logits, budget, method, check_finite=False)
    if method == "auto":
        b, d, v = logits.shape
        method = choose_method(b, d, v, budget, logits.device)
    if method == "heap":
        return _build_heap(logits, budget)
    if logits.is_cuda and _graphs_enabled():
        return _build_batched_graphed(logits, budget)
    return _build_batched_eager(logits, budget)
