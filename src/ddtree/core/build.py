"""DDTree tree builder: the drafter's per-position distributions -> a best-first draft tree.

Two exact builders share one vocabulary step (`depth_topk`) and one total order on prefixes, so they
return identical trees (same nodes, same numbering, bit-identical logws):

* ``heap``: the published per-request best-first heap (host side, Python ``heapq``).
* ``batched``: a per-depth beam of width ``budget`` followed by a global top-``budget``, all tensor ops,
  no host round-trip, batched over requests.

One way per job, chosen once per device (`build_paths`), with the pure-torch reference everywhere else:
* vocabulary step: on CUDA with bf16/fp16 logits and k = min(budget, V) <= 256 the Triton select step
  (`triton_build.grouped_vocab_topk`: one read for the statistics and the maxima of groups of 64 ids, then one
  program per row that selects the exact top-k); otherwise torch (`logsumexp`, `topk`, then the tie rule);
* tail (beam + tree assembly): on CUDA the two one-program Triton kernels, checked against the torch tail on
  the first call per shape; otherwise the torch beam and tail;
* execution: on CUDA with the select step, one CUDA graph per shape that reads each call's logits in place
  through an address set before the replay (no input copy); otherwise eager.
The measurements behind each choice are in benchmarks/NOTES-core.md. `build_tree_capturable` is the same
batched build for callers that capture a whole decoding round in their own CUDA graph (`prepare_build` first).

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
import warnings
from dataclasses import dataclass
from functools import lru_cache
from types import ModuleType

import numpy as np
import torch

from ddtree import switches
from ddtree.core.checks import canonical_device, check_budget, check_tensor
from ddtree.core.graphs import GraphCache, capture
from ddtree.core.sampling import SamplingParams
from ddtree.core.types import DDTreeBuildResult

METHODS = ("auto", "heap", "batched")
GROUP = 64  # ids per group of the select step's group maxima
_KEY16_DTYPES = (torch.bfloat16, torch.float16)  # the select step's order keys are 16 bits
_LOW32 = (1 << 32) - 1


# --------------------------------------------------------------------------------------------------
# validation and method choice
# --------------------------------------------------------------------------------------------------


def _validate(draft_logits: object, budget: object, method: object) -> tuple[torch.Tensor, int]:
    """Shapes, dtype and budget only (finiteness comes from the vocabulary step's row statistics)."""
    if not isinstance(method, str) or method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    budget = check_budget("budget", budget)
    logits = check_tensor("draft_logits", draft_logits, ndim=3, floating=True)
    if logits.shape[1] == 0 or logits.shape[2] == 0:
        raise ValueError(
            f"draft_logits must have D > 0 drafted positions and V > 0 tokens, got shape {tuple(logits.shape)}"
        )
    return logits, budget


def choose_method(batch: int, depth: int, vocab: int, budget: int, device: torch.device | str) -> str:
    """The builder `method="auto"` uses for a shape (rule from the measurements in benchmarks/NOTES-core.md).

    CUDA -> "batched" at every shape. On one H200 (V = 151,936, D = 15, bf16), with the Triton select step,
    beam and tree assembly, the graph-replayed batched build beat the heap in every cell of the issue's grid
    (B 1, 8, 32, 64 x budget 32, 64, 128, 256) and of B 1, 8, 64 x budget 32, 128, 256 in a second run; the
    closest cells, B = 1 / budget 256: 0.45 vs 1.08 ms and 0.43 vs 0.76 ms (benchmarks/results/2026-11-30/h200-s4/).
    With the earlier torch top-k glue the same cell was 0.73-0.91 vs 1.55-2.61 ms
    (benchmarks/results/2026-11-30/h200-s3/).
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


def _vocab_step_torch(x2d: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The reference vocabulary step, any device and dtype: x2d [R, V] -> (logq [R, k] float32 descending,
    ids [R, k] int64, bad 0-dim bool). torch's top-k of the raw logits (its order among ties unspecified), then
    sorted by the tie rule; logq = logit - row logsumexp (float32)."""
    lse = torch.logsumexp(x2d.float(), dim=-1)  # [R]
    bad = ~torch.isfinite(x2d).all()
    vals, ids = x2d.topk(k, dim=-1)  # [R, k] raw dtype, unordered among ties
    vals32 = vals.float()
    order = _descending_key(vals32, ids).argsort(dim=-1, descending=True)  # [R, k]
    return vals32.gather(1, order) - lse.unsqueeze(1), ids.gather(1, order), bad


def _vocab_step_select(
    x2d: torch.Tensor, k: int, x_address: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x2d [R, V] bf16/fp16 -> (logq [R, k] float32 descending, ids [R, k] int64, bad 0-dim bool) in two
    Triton kernels (`grouped_vocab_topk`; k <= 256). x_address: the kernels read the logits at this address
    instead of x2d's (the whole-build graph)."""
    logq, ids, _, _, bad_rows = _triton_build().grouped_vocab_topk(x2d, k, group=GROUP, x_address=x_address)
    return logq, ids, bad_rows.any()


def depth_topk(
    draft_logits: torch.Tensor, k: int, *, x_address: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-position top-k of log_softmax, in a deterministic order.

    Returns logq [B, D, k] float32 (descending), token ids [B, D, k] int64, and a 0-dim bool tensor that is
    True when the logits hold a non-finite value (checked by the caller, so no sync happens here).
    The top-k runs on the raw logits (any float dtype, no float copy); log_softmax = logit - logsumexp.
    Among equal logits the smaller token id gets the smaller rank. Both builders call this, so they share
    one vocabulary step (the Triton select step where `_select_applies`, else the torch reference).
    x_address (only where the select step applies): the select step reads the logits at this address instead.
    """
    b, d, v = draft_logits.shape
    x2d = draft_logits.reshape(b * d, v)  # [R, V]
    if x_address is not None or _select_applies(x2d, k):
        logq, ids, bad = _vocab_step_select(x2d, k, x_address)
    else:
        logq, ids, bad = _vocab_step_torch(x2d, k)
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
    """`_candidate_pairs_cpu` on `device` (js, rs, their tie-break keys), cached: the host-to-device copy must not
    happen inside a CUDA graph capture (`prepare_build` fills the cache)."""
    key = (width, k, str(device))
    if key not in _PAIR_CACHE:
        _refuse_in_capture(device, f"candidate pairs (width {width}, k {k})")
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
    reference of the tail; `triton_build.tree_from_beam` is its one-kernel twin)."""
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


_TAIL_OK: dict[tuple, bool] = {}  # (device, D, k, width, budget) -> the Triton tail equals the torch tail


def _triton_tail(
    logq: torch.Tensor, ids: torch.Tensor, js: torch.Tensor, rs: torch.Tensor, pair_low: torch.Tensor, w: int,
    budget: int,
) -> tuple[torch.Tensor, ...] | None:
    """The Triton tail (one-program beam, then one-program tree assembly) when usable for this shape, else
    None (the caller runs the torch tail). Returns token_ids, parents, depths, node_logws, num_nodes.

    The first call per shape (never inside a graph capture) compiles the kernels and compares their output
    with the torch tail on the real input; a failure or a mismatch turns them off for that shape, with a
    warning. Beams wider than `switches.triton_beam_max_width` (256 by default) take the torch tail.
    """
    paths = build_paths(logq.device)
    if not paths.triton_tail or w > paths.beam_max_width:
        return None
    b, d, k = logq.shape
    key = (canonical_device(logq.device), d, k, w, budget)
    state = _TAIL_OK.get(key)
    if state is False:
        return None
    tb = _triton_build()
    if state is None:
        _refuse_in_capture(logq.device, f"the Triton tail check {key[1:]}")
        try:
            got = tb.tree_from_beam(*tb.beam_search(logq, ids, js, rs, w), budget)
            ref = _tree_from_beam_torch(*_beam_torch(logq, ids, js, rs, pair_low, w), budget)
            ok = all(torch.equal(x, y) for x, y in zip(got, ref))
        except Exception as exc:  # noqa: BLE001 - compile or launch failure: the torch tail is exact too
            warnings.warn(f"ddtree build_tree: Triton beam unavailable for {key} ({exc}); using the torch beam")
            ok = False
        else:
            if not ok:
                warnings.warn(f"ddtree build_tree: Triton beam disagrees with the torch beam for {key}; not used")
        _TAIL_OK[key] = ok
        return got if ok else None
    return tb.tree_from_beam(*tb.beam_search(logq, ids, js, rs, w), budget)


def _tail_tensors(logq: torch.Tensor, ids: torch.Tensor, budget: int) -> tuple[torch.Tensor, ...]:
    """The build after the vocabulary step: per-depth beam of width `budget`, then the tree (Triton on CUDA
    when usable, else torch). logq/ids [B, D, k] -> token_ids, parents, depths, node_logws [B, N], num_nodes."""
    k = logq.shape[2]
    w = budget  # beam width
    js, rs, pair_low = _candidate_pairs(w, k, logq.device)  # [M] x3
    tree = _triton_tail(logq, ids, js, rs, pair_low, w, budget)
    if tree is None:
        tree = _tree_from_beam_torch(*_beam_torch(logq, ids, js, rs, pair_low, w), budget)
    return tree


def _batched_tensors(
    logits: torch.Tensor, budget: int, x_address: torch.Tensor | None = None
) -> tuple[torch.Tensor, ...]:
    """Pure tensor body of the batched build (no host sync; CUDA-graph capturable once its shape was prepared).

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


class _GraphedBuild:
    """One captured batched build for a fixed (shape, dtype, budget, device) that reads the caller's logits in
    place: the two kernels that read them take their address from a device scalar, set before each replay, so
    one graph serves any contiguous, 16-byte aligned buffer of that layout (no copy, nothing kept alive)."""

    def __init__(self, like: torch.Tensor, budget: int) -> None:
        self.budget = budget
        self.address = torch.tensor([like.data_ptr()], dtype=torch.int64, device=like.device)  # [1]
        # `like` gives the layout only: the kernels read self.address
        self.graph, self.static_out = capture(lambda: _batched_tensors(like, budget, self.address), like.device)

    def __call__(self, logits: torch.Tensor) -> tuple[torch.Tensor, ...]:
        self.address.fill_(logits.data_ptr())  # stream-ordered: this replay reads this buffer
        self.graph.replay()
        return tuple(t.clone() for t in self.static_out)


_GRAPHS: GraphCache[_GraphedBuild] = GraphCache("batched build")


def _graph_applies(logits: torch.Tensor, budget: int) -> bool:
    """The whole-build graph serves these logits: graphs on for the device and the select step applies."""
    b, d, v = logits.shape
    return build_paths(logits.device).graph and _select_applies(logits.reshape(b * d, v), min(budget, v))


def _build_batched(logits: torch.Tensor, budget: int) -> DDTreeBuildResult:
    """The batched build: graph replay on CUDA where the select step applies, else eager."""
    if not _graph_applies(logits, budget):
        return _build_batched_eager(logits, budget)
    logits = logits.contiguous()  # the graph reads rows at a fixed stride
    if logits.data_ptr() % 16:  # the kernels assume a 16-byte aligned address (vectorized loads)
        logits = logits.clone()
    key = (tuple(logits.shape), logits.dtype, budget, logits.device.index)
    graphed = _GRAPHS.get(key, lambda: _GraphedBuild(logits, budget))
    if graphed is None:
        return _build_batched_eager(logits, budget)
    tensors = graphed(logits)
    _raise_if_bad(tensors[-1])
    return _result(tensors)


def clear_graph_cache() -> None:
    """Drop every captured build (frees their static buffers)."""
    _GRAPHS.clear()


# --------------------------------------------------------------------------------------------------
# the paths of one device, chosen once (probed against the torch reference)
# --------------------------------------------------------------------------------------------------


@lru_cache(maxsize=1)
def _triton_build() -> ModuleType | None:
    """ddtree.core.triton_build, or None when triton is missing or broken (the torch paths are exact too)."""
    try:
        from ddtree.core import triton_build
    except Exception:  # noqa: BLE001 - any import failure means "no Triton"
        return None
    return triton_build


@dataclass(frozen=True)
class BuildPaths:
    """What the batched build uses on one device (`build_paths`)."""

    select: bool  # the Triton select step (bf16/fp16, k <= 256) passed its probe
    triton_tail: bool  # the Triton beam + tree assembly may be used (still checked per shape on first use)
    graph: bool  # whole-build CUDA graph replay where the select step applies
    beam_max_width: int  # widest beam the Triton tail takes


_PATHS: dict[tuple, BuildPaths] = {}


def _refuse_in_capture(device: torch.device, what: str) -> None:
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        raise RuntimeError(f"ddtree build_tree: {what} not prepared for {device} before a CUDA graph capture: "
                           "call ddtree.core.build.prepare_build(...) with this shape first")


def build_paths(device: torch.device | str) -> BuildPaths:
    """The build paths of `device` under the current switches, decided on the first call (which compiles and
    probes the Triton select step against the exact torch reference) and cached."""
    device = canonical_device(device)
    sw = switches.current()
    key = (device, sw)
    paths = _PATHS.get(key)
    if paths is None:
        _refuse_in_capture(device, "the device probe")
        triton_ok = device.type == "cuda" and not sw.no_triton and _triton_build() is not None
        paths = BuildPaths(
            select=triton_ok and _probe_select(device),
            triton_tail=triton_ok and sw.triton_beam_max_width > 0,
            graph=device.type == "cuda" and not sw.no_cuda_graph,
            beam_max_width=sw.triton_beam_max_width,
        )
        _PATHS[key] = paths
    return paths


def _select_applies(x2d: torch.Tensor, k: int) -> bool:
    """The Triton select step is this input's vocabulary step: probed on the device, bf16/fp16, k fits."""
    if x2d.dtype not in _KEY16_DTYPES or not build_paths(x2d.device).select:
        return False
    return _triton_build().grouped_select_fits(x2d.shape[1], k, GROUP)


def _probe_select(device: torch.device) -> bool:
    """Check the Triton select step once per device against the exact tie-rule top-k and `row_lse_and_min`
    (logsumexp within 1e-6: the select kernel merges the splits itself and may round differently), on bf16/fp16
    rows with many exact ties (some at the k-th position and across group borders) and a short last group,
    with one and with several candidate chunks per row."""
    tb = _triton_build()
    for chunk, k in ((None, 64), (16, 64), (None, 256)):
        name = f"Triton select vocabulary step (chunk {chunk}, k {k})"
        try:
            gen = torch.Generator(device=device).manual_seed(0)
            ok = True
            for dtype in _KEY16_DTYPES:
                x = torch.randn(6, 5003, device=device, generator=gen) * 4
                x[::2] = x[::2].round()
                x = x.to(dtype)
                logq, ids, lse, row_min, _ = tb.grouped_vocab_topk(x, k, group=GROUP, chunk=chunk)
                slot = torch.arange(x.shape[1], device=device).expand(x.shape[0], -1)
                ref_ids = _descending_key(x.float(), slot).topk(k, dim=-1).indices  # [R, k] exact order
                ref_lse, ref_min = tb.row_lse_and_min(x)
                ok &= torch.equal(ids, ref_ids) and torch.equal(logq, x.float().gather(1, ref_ids) - lse[:, None])
                ok &= torch.allclose(lse, ref_lse, rtol=1e-6, atol=1e-6) and torch.equal(row_min, ref_min)
        except Exception as exc:  # noqa: BLE001 - compile or launch failure: the torch step is exact too
            warnings.warn(f"ddtree build_tree: {name} unavailable ({exc}); using torch")
            return False
        if not ok:
            warnings.warn(f"ddtree build_tree: {name} disagrees with torch; not used")
            return False
    return True


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
    logits, budget = _validate(draft_logits, budget, method)
    if method == "auto":
        b, d, v = logits.shape
        method = choose_method(b, d, v, budget, logits.device)
    if method == "heap":
        return _build_heap(logits, budget)
    return _build_batched(logits, budget)


def build_tree_capturable(draft_logits: torch.Tensor, budget: int) -> tuple[DDTreeBuildResult, torch.Tensor]:
    """The batched build as plain stream work, for a caller that captures it inside its own CUDA graph.

    Capture-safe: no host synchronisation, no nested CUDA graph, no first-call probing or compiling, no Python
    branch on tensor values; non-finite logits are reported, not raised. Returns (the tree, a 0-dim bool
    tensor that is True when draft_logits holds nan or inf: the tree is then meaningless). On finite logits
    the tree equals `build_tree(draft_logits, budget)` field for field. Shapes and budget are checked as in
    `build_tree`. On CUDA call `prepare_build` for the shape first; inside a capture a shape that was not
    prepared raises RuntimeError.
    """
    logits, budget = _validate(draft_logits, budget, "batched")
    tensors = _batched_tensors(logits, budget)
    return _result(tensors), tensors[-1]


def build_tree_flagged(draft_logits: torch.Tensor, budget: int) -> tuple[DDTreeBuildResult, torch.Tensor]:
    """`build_tree` with the device's method, returned as (tree, bad) like `build_tree_capturable`, for eager
    callers that report non-finite logits instead of raising (the batched engine off CUDA). One host read of
    the finiteness flag; on nan or inf logits `bad` is True and the tree, built with zeros in their place, is
    meaningless."""
    logits, budget = _validate(draft_logits, budget, "auto")
    bad = ~torch.isfinite(logits).all()
    if bool(bad):
        logits = torch.nan_to_num(logits, nan=0.0, posinf=0.0, neginf=0.0)
    return build_tree(logits, budget), bad


def prepare_build(
    device: torch.device | str, dtype: torch.dtype, batch: int, depth: int, vocab: int, budget: int
) -> BuildPaths:
    """Run every per-device probe and per-shape first-call check (compiling the Triton kernels) and fill the
    constant caches that `build_tree_capturable` needs for draft logits [batch, depth, vocab] of `dtype` and
    this budget, outside any capture. Returns the device's `BuildPaths`."""
    device = canonical_device(device)
    gen = torch.Generator(device=device).manual_seed(0)
    logits = (torch.randn((batch, depth, vocab), generator=gen, device=device) * 3).to(dtype)
    paths = build_paths(device)
    build_tree_capturable(logits, budget)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return paths
