"""Batched decoding over static slot caches: `ar`, `dflash` and `ddtree` share one round, eager on the CPU
and replayed from CUDA graphs on a GPU.

Every active request owns one batch row (= cache slot; active rows are kept at 0..n-1) and the batch runs
at the smallest bucket size >= n. One round, as named stages (keys of `ddtree.engine.types.STAGES`):
  draft        append the pending context features (the previous round's accepted path) to the drafter
               cache, then ONE non-causal drafter forward over [bonus, mask * D]   -> draft logits [B, D, V]
  tree_build   `build_tree` (ddtree, padded to the budget), the argmax chain (dflash), the root (ar)
  tree_compile tokens, positions committed + depth, cache rows committed + column, mask [B, N, S]
  verify       ONE target forward over the N tree tokens (writes their K/V), then the walk (greedy argmax or
               sample-and-walk with counter-based coins, one per depth; temperature-only rounds on CUDA take
               the Triton lazy walk, which makes the same draws from the same coins)
  commit       accepted K/V rows moved to follow the committed rows, pending features for the drafter,
               bonus / committed / counter updated, emitted tokens written to the output buffer
`ar` is the same round with a root-only tree (N = 1) and no draft. On CUDA each stage is one CUDA graph per
(bucket, method, budget) (the walk one per sampling variant), captured before serving; the host reads the
emitted tokens once per round, which is the round's only synchronisation. With CUDA graphs rounds overlap
(`overlap`): round R + 1 is enqueued before the host reads round R, so the host's bookkeeping (stop rules,
callbacks, retiring finished rows) runs while the device decodes; a request that finishes in round R is decoded
once more in R + 1 and those outputs are dropped (its slot has the working rows for it). With `profile_stages`
rounds do not overlap, and CUDA events between the stage replays time them without adding synchronisations.

Invariants between rounds, per active row: the target cache holds the committed tokens before the bonus in
rows [0, committed); the drafter cache holds context K/V of positions [0, committed - pending_len), and
`pending` holds the projected features of the last pending_len committed tokens (fed by the next draft).
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from ddtree import switches
from ddtree.core.attention import ancestor_mask
from ddtree.core.build import build_tree_capturable, build_tree_flagged, prepare_build
from ddtree.core.build_sampling import tree_logit_scale
from ddtree.core.checks import canonical_device
from ddtree.core.sampling import SamplingParams, processed_weights
from ddtree.core.types import DDTreeBuildResult, VerifyResult
from ddtree.core.verify import (
    FUSED_MIN_TEMPERATURE,
    commit,
    edge_probs,
    lazy_walk_result,
    prepare_verify,
    sample_from_probs_,
    verify_greedy,
    walk,
)
from ddtree.engine import triton_round
from ddtree.engine.chain import build_chain, chain_parents
from ddtree.engine.checks import check_budget, check_method, check_request_fields, resolve_dtype
from ddtree.engine.fast_model import FusedDecoder, StaticDrafter, Visibility, family_of, round_up
from ddtree.engine.rng import column_keys, keyed_uniforms, request_key
from ddtree.engine.stopping import StopState, append_tokens
from ddtree.engine.types import STAGES, GenerationOutput, GenerationRequest, LoopStats

log = logging.getLogger("ddtree.engine")


def _on_device(method: Callable) -> Callable:
    """Run an engine entry point with the engine's CUDA device current. CUDA's current device is per thread, and
    Triton launches, CUDA-graph captures and event records use the current device's stream, not the device of the
    tensors: an engine on cuda:1 driven from a thread whose current device is cuda:0 (any new thread, such as the
    server's decoding thread) would launch its kernels on the wrong device and read its outputs before they are
    copied."""

    @functools.wraps(method)
    def on_device(self: "BatchedEngine", *args: Any, **kwargs: Any) -> Any:
        if self.device.type != "cuda":
            return method(self, *args, **kwargs)
        with torch.cuda.device(self.device):
            return method(self, *args, **kwargs)

    return on_device


TokenCallback = Callable[[list[int]], None]
Variant = tuple  # ("greedy",) or ("sample", top_k bucket, uses top_p, walks: LAZY / TORCH / BOTH)
# which sampled walks a round runs: every row takes the walk its own parameters choose (`lazy_rows`), so a seeded
# request draws the same tokens whatever shares its batch
TORCH, LAZY, BOTH = 0, 1, 2
# after a prompt's tokens, the staged prefill's input holds the admitted row's fields (`BatchedEngine._admit_row`):
# last prompt index, row, top_k, coin key, then temperature, top_p, the draft scale and a pad as four float32 in
# two int64
ADMIT_FIELDS = 6


def batch_buckets(max_batch: int) -> tuple[int, ...]:
    """Powers of two up to max_batch, and max_batch itself."""
    sizes, b = [], 1
    while b < max_batch:
        sizes.append(b)
        b *= 2
    return (*sizes, max_batch)


PREFILL_BUCKETS = (64, 128, 256, 512, 1024, 2048)  # longer prompts prefill eagerly: their compute hides the host


def prefill_buckets(max_seq_len: int) -> tuple[int, ...]:
    """The staged prefill's padded prompt lengths that fit a slot of max_seq_len rows."""
    return tuple(x for x in PREFILL_BUCKETS if x <= max_seq_len)


@dataclass
class _Active:
    """Host bookkeeping of one request in the batch."""

    request: GenerationRequest
    state: StopState
    append: Callable[[list[int]], int]
    on_tokens: TokenCallback | None
    t_arrival: float
    t_first: float = 0.0
    rounds: int = 0
    accept_lens: list[int] = field(default_factory=list)
    expected: list[float] = field(default_factory=list)
    entropies: list[float] = field(default_factory=list)  # per round: the processed target's entropy at the root
    stage_times: dict[str, float] = field(default_factory=lambda: dict.fromkeys(STAGES, 0.0))
    output: GenerationOutput | None = None
    error: BaseException | None = None  # raised by its on_tokens callback (e.g. the client went away)
    first_slot: int | None = None  # overlapped rounds: its first token's slot in the host ring, not read yet


@dataclass
class _Flight:
    """A launched round whose outputs the host has not read yet: its rows' requests at launch (row order), the
    host buffer its outputs are copied to, and its stage times (profiled rounds only)."""

    entries: list[_Active]
    slot: int
    times: dict[str, float]


class _Stage:
    """One stage of a round: eager, or a CUDA graph of the same function (replay reads static buffers)."""

    def __init__(self, name: str, fn: Callable[[], None]) -> None:
        self.name, self.fn, self.graph = name, fn, None

    def capture(self, device: torch.device, pool) -> None:
        stream = torch.cuda.Stream(device=device)
        stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(stream):
            for _ in range(2):  # compiles kernels, runs first-call probes (none of that may be captured)
                self.fn()
        torch.cuda.current_stream(device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool):
            self.fn()
        self.graph = graph
        graph.replay()  # fills the static outputs, which the next stage's warm-up reads

    def __call__(self) -> None:
        if self.graph is not None:
            self.graph.replay()
        else:
            self.fn()


class BatchedEngine:
    """Decodes up to `max_batch` requests together (one method and budget per batch at a time)."""

    def __init__(
        self,
        pair: Any,
        *,
        method: str = "ddtree",
        budget: int = 64,
        device: str | torch.device | None = None,
        dtype: str | torch.dtype | None = None,
        max_batch: int = 8,
        max_seq_len: int | None = None,
        cuda_graphs: bool = True,
        prefill_graphs: bool | None = None,
        profile_stages: bool = False,
        overlap: bool | None = None,
        attention: str = "auto",
        target: FusedDecoder | None = None,
        drafter: torch.nn.Module | None = None,
        tokenizer: Any = None,
    ) -> None:
        check_method(method)
        check_budget(budget)
        self.method, self.budget = method, int(budget)
        if target is None:
            hf = pair.target
            if family_of(hf.config) is None:
                raise ValueError(f"model family {getattr(hf.config, 'model_type', '?')!r} has no fast path")
            self.device = canonical_device(device) if device is not None else next(hf.parameters()).device
            self.dtype = resolve_dtype(dtype, self.device)
            hf = hf.to(device=self.device, dtype=self.dtype).eval()
            drafter = pair.drafter
            feature_layers = tuple(int(i) for i in drafter.config.target_layer_ids) if drafter is not None else ()
            target = FusedDecoder.from_hf(hf, feature_layers, attention=attention)
            tokenizer = getattr(pair, "tokenizer", None)
        else:
            self.device, self.dtype = target.device, target.dtype
        if self.device.type == "cuda":  # the constructing thread works on the engine's device (`_on_device`)
            torch.cuda.set_device(self.device)
        self.target = target
        self.tokenizer = tokenizer
        self.drafter = (StaticDrafter(drafter.to(device=self.device, dtype=self.dtype).eval(), attention=attention)
                        if drafter is not None else None)
        self.vocab_size = int(target.embed.shape[0])
        self.block_size = self.drafter.block_size if self.drafter is not None else 1
        limit = target.shape.max_position_embeddings
        self.max_seq_len = round_up(min(max_seq_len or 4096, limit), 16)
        # prompt + max_new_tokens the server may accept: the round's working rows (tree + block) come on top
        self.max_context = self.max_seq_len - (self.budget + 1 + self.block_size)
        self.max_batch = int(max_batch)
        if self.max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        self.buckets = batch_buckets(self.max_batch)
        self.profile_stages = profile_stages
        self.round_profile: dict[str, float] = {}  # the last profiled round: seconds per stage object
        self.use_graphs = cuda_graphs and self.device.type == "cuda"
        # the tree builder, chosen once: capture-safe stream work under graphs; eagerly, the device's fastest
        # build (the per-request heap on the CPU: `core.build.choose_method`) with a host-read finiteness flag
        self._build_ddtree = build_tree_capturable if self.use_graphs else build_tree_flagged

        m, dev = self.max_batch, self.device
        self.target_cache = target.allocate_cache(m, self.max_seq_len)
        self.drafter_cache = (
            self.drafter.allocate_cache(m, self.max_seq_len, dev, self.dtype) if self.drafter is not None else None
        )
        # Prefill: an eager forward costs ~2,700 op dispatches (8.7 ms of host time per request on an H200 for the
        # 8-layer `gpu` pair, most of a 128-token request's latency, and at 8 concurrent requests a join every
        # ~2 rounds). Under graphs the prompt is padded to a length bucket and prefilled by one replay into a
        # one-slot staging cache, then copied into the request's slot (padding rows land at or beyond
        # `committed`, which nothing reads). `prefill_graphs` (default: with cuda_graphs) runs the same staged
        # path eagerly off CUDA, so the padding and the copy are tested on the CPU.
        self.staged_prefill = self.use_graphs if prefill_graphs is None else bool(prefill_graphs)
        self.prefill_buckets = prefill_buckets(self.max_seq_len) if self.staged_prefill else ()
        self._prefills: dict[tuple[int, bool], dict[str, Any]] = {}
        if self.prefill_buckets:
            top = self.prefill_buckets[-1]
            self.staging_target = target.allocate_cache(1, top)
            self.staging_drafter = (self.drafter.allocate_cache(1, top, dev, self.dtype)
                                    if self.drafter is not None else None)
        b = self.block_size
        i64 = dict(dtype=torch.int64, device=dev)
        self.committed = torch.zeros(m, **i64)
        self.bonus = torch.zeros(m, **i64)
        self.pending = torch.zeros((m, b, target.shape.hidden_size), dtype=self.dtype, device=dev)
        self.pending_len = torch.zeros(m, **i64)
        self.active_rows = torch.zeros(m, dtype=torch.bool, device=dev)
        self.temperature = torch.zeros(m, dtype=torch.float32, device=dev)
        self.top_k = torch.full((m,), -1, **i64)
        self.top_p = torch.ones(m, dtype=torch.float32, device=dev)
        # the draft logits' factor before the tree build (`tree_logit_scale`: 1 / (1 + T), 1 for greedy rows), applied
        # to the drafter's last hidden state: one [B, D, H] product instead of one over the [B, D, V] logits
        self.draft_scale = torch.ones(m, dtype=self.dtype, device=dev)
        self._raw_sampled_trees = switches.current().raw_sampled_trees
        self.coin_key = torch.zeros(m, **i64)  # request_keys(seed) of each row's request: its coins' key
        self.counter = torch.zeros(m, **i64)
        self.out_tokens = torch.full((m, b), -1, **i64)
        self.out_counts = torch.zeros((m, 2), **i64)  # emitted count, non-finite draft flag
        self.out_expected = torch.zeros((m, 2), dtype=torch.float32, device=dev)  # expected accepts, root entropy
        pin = dev.type == "cuda"
        # Overlapped rounds (default with CUDA graphs): `step` enqueues round R + 1 before it reads round R's
        # outputs, so the device runs R + 1 while the host does R's bookkeeping (stop rules, callbacks, retiring
        # rows). A request that finishes in round R has decoded round R + 1 too; its outputs are dropped. Each
        # launched round's outputs go to one of two pinned host buffers, with an event per buffer.
        self.overlap = (self.use_graphs and not switches.current().no_overlap) if overlap is None else bool(overlap)
        self._host_out = [(torch.empty((m, b), dtype=torch.int64, pin_memory=pin),
                           torch.empty((m, 2), dtype=torch.int64, pin_memory=pin),
                           torch.empty((m, 2), dtype=torch.float32, pin_memory=pin)) for _ in range(2)]
        self._copied = [torch.cuda.Event() for _ in range(2)] if pin else None
        self._next_slot = 0
        self._inflight: _Flight | None = None
        # admitted rows' first tokens, read with the next round (`_stage_first`), and the prefill's pinned inputs
        self._first_host = torch.empty(2 * m, dtype=torch.int64, pin_memory=pin)
        self._first_events = [torch.cuda.Event() for _ in range(2 * m)] if pin else []
        self._first_next = 0
        self._input_ring = ([(torch.empty(0, dtype=torch.int64), torch.cuda.Event()) for _ in range(4)]
                            if pin else [])
        self._input_next = 0
        self._retire_moves = torch.zeros(2, **i64)  # (src, dst) rows of `_retire`
        # every (src, dst) pair on the device: `_retire` picks its pair by a device-side copy (a host-to-device copy
        # would wait for the rounds in flight)
        rows = torch.arange(m, **i64)
        self._retire_pairs = torch.stack(torch.meshgrid(rows, rows, indexing="ij"), dim=-1).contiguous()  # [m, m, 2]
        self._retire_stage: _Stage | None = None

        self.loop_stats = LoopStats()
        self._active: list[_Active] = []
        self._group: tuple[str, int] | None = None
        self._draft_stages: dict[int, _Stage] = {}
        self._draft_logits: dict[int, torch.Tensor] = {}
        self._programs: dict[tuple, dict[str, Any]] = {}
        self._pool = torch.cuda.graph_pool_handle() if self.use_graphs else None
        if self.use_graphs:
            prepare_verify(dev)
        # temperature-only sampled rounds walk with the Triton lazy walk where it runs (CUDA): one read of the
        # target rows and draws only along the walk, no [B, N, V] fp32 buffer; chosen once per engine
        self._lazy_walk = self.device.type == "cuda" and prepare_verify(dev).triton
        # the sampled walks warm-up captures: temperature-only rows (LAZY on CUDA), and the torch walk that rows with
        # 0 < T < FUSED_MIN_TEMPERATURE take; top-k / top-p variants are captured when first seen
        self._warm_walks = (LAZY, TORCH) if self._lazy_walk else (TORCH,)
        # the tree compile, the greedy walk and the commit's bookkeeping as one Triton launch each on CUDA
        # (`triton_round`); torch elsewhere
        self._round_kernels = self.device.type == "cuda" and triton_round.HAS_TRITON

    # ------------------------------------------------------------------------------ public API
    @_on_device
    def warmup(self, methods: Iterable[tuple[str, int]] | None = None, *, buckets: Iterable[int] | None = None,
               sampled: bool = True) -> None:
        """Build (and on CUDA capture) the round programs of these (method, budget) pairs for every bucket,
        greedy and temperature-sampled, before serving, so that no capture happens during a request."""
        pairs = list(methods) if methods is not None else [(self.method, self.budget)]
        variants = [("greedy",)] + ([("sample", 0, False, walks) for walks in self._warm_walks] if sampled else [])
        t0 = time.perf_counter()
        for method, budget in pairs:
            for bucket in (buckets or self.buckets):
                for variant in variants:
                    t = time.perf_counter()
                    with torch.no_grad():
                        self._program(bucket, method, self._effective_budget(method, budget), variant)
                    # one line a program, so a slow start shows which capture (or kernel compile) took the time
                    log.info("round program %s budget %d bucket %d %s: %.2f s", method,
                             self._effective_budget(method, budget), bucket, variant[0], time.perf_counter() - t)
        t = time.perf_counter()
        for with_drafter in sorted({method != "ar" and self.drafter is not None for method, _ in pairs}):
            for length in self.prefill_buckets:
                with torch.no_grad():
                    self._prefill_program(length, with_drafter, row=len(self._active))
        if self.prefill_buckets:
            log.info("prefill programs for lengths %s: %.2f s", self.prefill_buckets, time.perf_counter() - t)
        with torch.no_grad():
            self._retire_program()
        self._reset_rows(range(len(self._active), self.max_batch))
        log.info("round programs ready for %s, buckets %s (%.1f s)", pairs, self.buckets, time.perf_counter() - t0)

    def generate(
        self,
        request: GenerationRequest,
        *,
        method: str | None = None,
        budget: int | None = None,
        on_tokens: TokenCallback | None = None,
    ) -> GenerationOutput:
        """Decode one request on its own (a batch of one)."""
        return self.generate_batch([request], method=method, budget=budget, on_tokens=[on_tokens])[0]

    @_on_device
    def generate_batch(
        self,
        requests: list[GenerationRequest],
        *,
        method: str | None = None,
        budget: int | None = None,
        on_tokens: list[TokenCallback | None] | None = None,
    ) -> list[GenerationOutput]:
        """Decode requests together, up to max_batch at a time; a finished request's slot is refilled at once."""
        method = self.method if method is None else method
        budget = self.budget if budget is None else budget
        callbacks = on_tokens or [None] * len(requests)
        waiting = list(enumerate(zip(requests, callbacks)))
        done: dict[int, GenerationOutput] = {}
        index_of: dict[int, int] = {}  # id(entry) -> request index, for entries still in the batch
        while waiting or self._active:
            while waiting and self.can_admit(method, budget):
                index, (request, callback) = waiting.pop(0)
                entry = self.admit(request, method=method, budget=budget, on_tokens=callback)
                if entry.output is not None:  # finished with its first token
                    done[index] = entry.output
                else:
                    index_of[id(entry)] = index
            for entry in self.step():
                done[index_of.pop(id(entry))] = entry.output
        return [done[i] for i in range(len(requests))]

    # ------------------------------------------------------------------------------ batch control
    @property
    def num_active(self) -> int:
        return len(self._active)

    def can_admit(self, method: str, budget: int) -> bool:
        key = (method, self._effective_budget(method, budget))
        return len(self._active) < self.max_batch and (self._group is None or self._group == key)

    def check_request(self, request: GenerationRequest, method: str, budget: int) -> None:
        """Raise ValueError naming the field for a request this engine cannot decode."""
        check_method(method)
        check_budget(budget)
        if method != "ar" and self.drafter is None:
            raise ValueError(f"method {method!r} needs a drafter; this pair has none")
        check_request_fields(request, self.vocab_size, has_tokenizer=self.tokenizer is not None)
        ids = request.input_ids
        need = len(ids) + request.max_new_tokens + self._columns(method, self._effective_budget(method, budget)) + self.block_size
        if need > self.max_seq_len:
            raise ValueError(
                f"prompt ({len(ids)}) + max_new_tokens ({request.max_new_tokens}) + the round's "
                f"{need - len(ids) - request.max_new_tokens} working rows exceed the engine's max_seq_len "
                f"of {self.max_seq_len} tokens"
            )

    @_on_device
    def admit(self, request: GenerationRequest, *, method: str, budget: int,
              on_tokens: TokenCallback | None = None) -> _Active:
        """Prefill a request into the next free row (one graph replay under graphs) and emit its first token (with
        overlapped rounds: when the next round's outputs are read)."""
        self.check_request(request, method, budget)
        if not self.can_admit(method, budget):
            raise RuntimeError("the batch is full or decodes another method/budget")
        t_arrival = time.perf_counter()
        self._group = (method, self._effective_budget(method, budget))
        stats = self.loop_stats
        row = len(self._active)
        entry = _Active(request=request, state=StopState(output_ids=[]),
                        append=self._appender(request), on_tokens=on_tokens, t_arrival=t_arrival)
        with torch.no_grad():
            self._prefill(row, request, with_drafter=method != "ar")
        self._active.append(entry)
        if self.overlap:  # read with the next round's outputs: a read now would wait for the round in flight
            entry.first_slot = self._stage_first(row)
        else:
            entry.t_first = time.perf_counter()
            self._emit(entry, [int(self.bonus[row])])
            if entry.state.finish_reason is not None:
                self._finish_rows([row])
        stats.admissions += 1
        stats.admit_s += time.perf_counter() - t_arrival
        return entry

    @_on_device
    def step(self) -> list[_Active]:
        """Run one round over the active rows; returns the requests that finished.

        Overlapped (`overlap`, unless stages are profiled): enqueue the next round, then read and apply the previous
        one's outputs while the device runs it, so the requests returned finished in the previous round (none
        after the first launch). Otherwise the round is launched, read and applied in this call."""
        stats = self.loop_stats
        if not self.overlap or self.profile_stages:
            done = self._drain()  # a round left in flight when profiling was switched on
            if not self._active:
                return done
            t_start = time.perf_counter()
            flight = self._launch()
            t_launched = time.perf_counter()
            outputs = self._read(flight)
            t_read = time.perf_counter()
            finished = self._apply(flight, outputs)
            stats.launch_s += t_launched - t_start
        else:
            done = []
            if self._inflight is not None and self._may_all_finish(self._inflight):
                # a round launched now might only decode requests that end with the one in flight: read that one
                # first (at batch 1 a dropped round would cost a whole round a request)
                t_wait = time.perf_counter()
                done = self._drain()
                stats.wait_s += time.perf_counter() - t_wait
            t_start = time.perf_counter()
            flight = self._launch() if self._active else None
            t_launched = time.perf_counter()
            stats.launch_s += t_launched - t_start
            previous, self._inflight = self._inflight, flight
            if previous is None:
                return done
            outputs = self._read(previous)
            t_read = time.perf_counter()
            finished = self._apply(previous, outputs)
            if not self._active:
                self._inflight = None  # every row of the round just launched has finished: nothing to read
        stats.wait_s += t_read - t_launched
        stats.post_s += time.perf_counter() - t_read
        return done + finished

    def _may_all_finish(self, flight: _Flight) -> bool:
        """Whether every request still decoding in `flight` may reach its max_new_tokens with it (a round emits at
        most block_size tokens a request, one for `ar`); stop tokens cannot be foreseen."""
        most = 1 if self._group is not None and self._group[0] == "ar" else self.block_size
        return all(e.request.max_new_tokens - len(e.state.output_ids) <= most
                   for e in flight.entries if e.output is None)

    def _drain(self) -> list[_Active]:
        """Read and apply the round in flight, if any (switching to unoverlapped rounds)."""
        flight, self._inflight = self._inflight, None
        return self._apply(flight, self._read(flight)) if flight is not None else []

    def _launch(self) -> _Flight:
        """Enqueue one round over the active rows and the copy of its outputs to a host buffer."""
        method, budget = self._group  # type: ignore[misc]
        n = len(self._active)
        bucket = next(b for b in self.buckets if b >= n)
        program = self._program(bucket, method, budget, self._variant())
        slot, self._next_slot = self._next_slot, 1 - self._next_slot
        with torch.no_grad():
            times = self._run(program)
            for host, out in zip(self._host_out[slot], (self.out_tokens, self.out_counts, self.out_expected)):
                host[:n].copy_(out[:n], non_blocking=self._copied is not None)
            if self._copied is not None:
                self._copied[slot].record()
        return _Flight(list(self._active), slot, times)

    def _read(self, flight: _Flight) -> tuple[list, list, list]:
        """A launched round's emitted tokens, counts and expectations as Python lists (waits for that round only;
        indexing a tensor per row and field cost ~3 us each, ~0.13 ms a round at 8 rows)."""
        if self._copied is not None:
            self._copied[flight.slot].synchronize()
        n = len(flight.entries)
        tokens, counts, expected = (t[:n].tolist() for t in self._host_out[flight.slot])
        return tokens, counts, expected

    def _apply(self, flight: _Flight, outputs: tuple[list, list, list]) -> list[_Active]:
        """A round's outputs to its requests (stop rules, callbacks); finished requests leave the batch. Rows whose
        request finished before (an overlapped round decodes them once more) are skipped."""
        tokens, counts, expected = outputs
        finished = []
        # requests admitted since the last read: their first tokens come before any round's
        for entry in self._active:
            if entry.first_slot is not None:
                first, entry.first_slot = self._read_first(entry.first_slot), None
                entry.t_first = time.perf_counter()
                self._emit(entry, [first])
                if entry.state.finish_reason is not None:
                    finished.append(entry)
        live = [(row, entry) for row, entry in enumerate(flight.entries)
                if entry.output is None and entry.state.finish_reason is None]
        if any(counts[row][1] for row, _ in live):
            self._fail_all(ValueError("draft logits contain non-finite values (nan or inf)"))
            raise ValueError("draft logits contain non-finite values (nan or inf)")
        for row, entry in live:
            k = counts[row][0]
            entry.rounds += 1
            entry.accept_lens.append(k - 1)
            entry.expected.append(expected[row][0])
            entry.entropies.append(expected[row][1])
            for stage, seconds in flight.times.items():
                entry.stage_times[stage] += seconds
            self._emit(entry, tokens[row][:k])
            if entry.state.finish_reason is not None:
                finished.append(entry)
        self.loop_stats.rounds += 1
        self.loop_stats.row_rounds += len(live)
        row_of = {id(entry): row for row, entry in enumerate(self._active)}  # rows now (compaction moves them)
        return self._finish_rows([row_of[id(entry)] for entry in finished])

    @_on_device
    def cancel_all(self, error: BaseException) -> list[_Active]:
        """Drop every active request (after a failure); returns them."""
        return self._fail_all(error)

    # ------------------------------------------------------------------------------ host helpers
    def _appender(self, request: GenerationRequest) -> Callable[[list[int]], int]:
        stop_ids = frozenset(int(t) for t in request.stop_token_ids)
        decode = None
        if request.stop_strings:
            tok = self.tokenizer

            def decode(ids: list[int]) -> str:
                return tok.decode(ids, skip_special_tokens=True)

        def append(state: StopState, tokens: list[int]) -> int:
            return append_tokens(state, tokens, max_new_tokens=request.max_new_tokens, stop_token_ids=stop_ids,
                                 stop_strings=list(request.stop_strings), decode=decode)

        return append

    def _emit(self, entry: _Active, tokens: list[int]) -> None:
        """Apply the stop rules, then stream. A callback that raises ends that request alone (its `error`)."""
        kept = entry.append(entry.state, tokens)
        if entry.on_tokens is not None and kept:
            try:
                entry.on_tokens(entry.state.output_ids[-kept:])
            except Exception as exc:
                entry.error = exc
                entry.state.finish_reason = entry.state.finish_reason or "abort"

    def _variant(self) -> Variant:
        reqs = [e.request for e in self._active]
        if all(r.temperature == 0 for r in reqs):
            return ("greedy",)
        k = max((r.top_k for r in reqs if r.temperature > 0 and 0 < r.top_k < self.vocab_size), default=0)
        k_bucket = min(1 << (k - 1).bit_length(), self.vocab_size) if k > 0 else 0
        uses_top_p = any(r.temperature > 0 and r.top_p < 1.0 for r in reqs)
        walks = TORCH
        if self._lazy_walk:
            lazy = [lazy_request(r, self.vocab_size) for r in reqs]
            walks = LAZY if all(lazy) else (BOTH if any(lazy) else TORCH)
        return ("sample", k_bucket, uses_top_p, walks)

    def _effective_budget(self, method: str, budget: int) -> int:
        """The recorded budget: tree nodes (ddtree), drafted chain length (dflash), 0 (ar)."""
        if method == "ddtree":
            return int(budget)
        return self.block_size - 1 if method == "dflash" else 0

    @staticmethod
    def _columns(method: str, budget: int) -> int:
        return budget + 1  # root + nodes; dflash: D + 1; ar: 1

    def _run(self, program: dict[str, Any]) -> dict[str, float]:
        stages: list[_Stage] = program["stages"]
        if not self.profile_stages:
            for stage in stages:
                stage()
            return {}
        # seconds per stage object (the walk apart from the forward: `round_profile`), then summed per STAGES name
        parts: dict[str, float] = {}
        if self.device.type == "cuda":
            events = [torch.cuda.Event(enable_timing=True) for _ in range(len(stages) + 1)]
            events[0].record()
            for stage, event in zip(stages, events[1:]):
                stage()
                event.record()
            events[-1].synchronize()
            for stage, start, end in zip(stages, events, events[1:]):
                parts[stage.name] = parts.get(stage.name, 0.0) + start.elapsed_time(end) / 1000.0
        else:
            last = time.perf_counter()
            for stage in stages:
                stage()
                now = time.perf_counter()
                parts[stage.name] = parts.get(stage.name, 0.0) + now - last
                last = now
        self.round_profile = parts
        times = dict.fromkeys(STAGES, 0.0)
        for name, seconds in parts.items():
            times[program["stage_names"][name]] += seconds
        return times

    def _finish_rows(self, rows: list[int]) -> list[_Active]:
        """Finalise finished requests and compact the batch (the last active row moves into a freed row)."""
        finished = []
        for row in sorted(rows, reverse=True):
            entry = self._active[row]
            entry.output = self._output(entry)
            finished.append(entry)
            last = len(self._active) - 1
            moved = self._active[last]  # unfinished when last != row (higher finished rows went first)
            # the moved request's committed rows: prompt + output, plus one round's tokens the host has not read
            # when rounds overlap
            self._retire(last, row, len(moved.request.input_ids) + len(moved.state.output_ids) + self.block_size)
            if row != last:
                self._active[row] = self._active[last]
            self._active.pop()
        if not self._active:
            self._group = None
        return finished

    def _retire(self, src: int, dst: int, rows: int) -> None:
        """Row `src` (the last active one) into row `dst` (a finished one), then `src` cleared; src == dst only
        clears. The cache slots' first `rows` rows are copied directly (at least the moved request's committed
        rows: prompt + output - 1, the rest is scratch; nothing when src == dst); the per-row state moves and
        clears in one replay under graphs (~20 launches eagerly)."""
        if src != dst:
            self.target_cache.copy_slot(src, dst, rows)
            if self.drafter_cache is not None:
                self.drafter_cache.copy_slot(src, dst, rows)
        stage = self._retire_program()
        self._retire_moves.copy_(self._retire_pairs[src, dst])
        stage()

    def _retire_program(self) -> _Stage:
        """`_retire`'s state stage, captured on first use. The capture's runs move row 0's state onto itself (a
        no-op) and clear it, and `_capture` restores every row's state afterwards: safe with requests in the batch."""
        if self._retire_stage is None:
            self._retire_moves.zero_()
            self._retire_stage = _Stage("retire", self._retire_fn)
            self._capture(self._retire_stage)
        return self._retire_stage

    def _retire_fn(self) -> None:
        """Capture-safe state part of `_retire`, reading the rows from `_retire_moves` [2] (src, dst); on CUDA one
        launch (`triton_round.retire_row`) for the ~32 below."""
        if self._round_kernels:
            triton_round.retire_row(self._retire_moves, self.committed, self.bonus, self.pending_len, self.counter,
                                    self.coin_key, self.top_k, self.active_rows, self.temperature, self.top_p,
                                    self.draft_scale, self.pending)
            return
        src, dst = self._retire_moves[0:1], self._retire_moves[1:2]
        for t in self._state_tensors():
            t.index_copy_(0, dst, t.index_select(0, src))
        self._clear_rows(src)

    def _clear_rows(self, index: torch.Tensor) -> None:
        """The rows `index` ([R] int64, on the device) back to a free row's state (capture-safe)."""
        for t in (self.committed, self.bonus, self.pending_len, self.counter, self.coin_key):
            t.index_fill_(0, index, 0)
        self.active_rows.index_fill_(0, index, False)
        self.temperature.index_fill_(0, index, 0.0)
        self.draft_scale.index_fill_(0, index, 1.0)
        self.top_k.index_fill_(0, index, -1)
        self.top_p.index_fill_(0, index, 1.0)

    def _fail_all(self, error: BaseException) -> list[_Active]:
        self._inflight = None  # its outputs belong to the dropped requests
        dropped, self._active = self._active, []
        self._group = None
        self._reset_rows(range(self.max_batch))
        for entry in dropped:
            entry.output = None
        return dropped

    def _output(self, entry: _Active) -> GenerationOutput:
        method, budget = self._group  # type: ignore[misc]
        now = time.perf_counter()
        return GenerationOutput(
            output_ids=entry.state.output_ids,
            finish_reason=entry.state.finish_reason or "length",
            rounds=entry.rounds,
            accept_lens=entry.accept_lens if method != "ar" else [0] * entry.rounds,
            expected_accept_lens=entry.expected if method != "ar" else [0.0] * entry.rounds,
            stage_times=dict(entry.stage_times),
            entropies=entry.entropies if method != "ar" else [],
            ttft=entry.t_first - entry.t_arrival,
            decode_time=now - entry.t_first,
            matched_stop=entry.state.matched_stop,
            method=method,
            budget=budget,
        )

    # ------------------------------------------------------------------------------ device state
    def _state_tensors(self) -> list[torch.Tensor]:
        """Per-row state (moved with a row); the output buffers are rewritten every round."""
        return [self.committed, self.bonus, self.pending, self.pending_len, self.active_rows, self.temperature,
                self.draft_scale, self.top_k, self.top_p, self.coin_key, self.counter]

    def _reset_rows(self, rows: Iterable[int]) -> None:
        rows = list(rows)
        if rows:
            self._clear_rows(torch.tensor(rows, device=self.device))

    def _prefill(self, row: int, request: GenerationRequest, *, with_drafter: bool) -> None:
        """Target forward over the prompt into `row`'s slot, the drafter context of the prompt, the row's state
        (`_admit_row`), the first token (into `bonus[row]`). Staged: one host-to-device copy (from pinned memory,
        so it does not wait for a round in flight) and one replay under graphs."""
        p = len(request.input_ids)
        with_drafter = with_drafter and self.drafter is not None
        length = next((x for x in self.prefill_buckets if x >= p), None)
        seed = request.seed if request.seed is not None else int(torch.randint(0, 2**62, (1,)).item())
        width = length if length is not None else p
        host = torch.zeros(width + ADMIT_FIELDS, dtype=torch.int64)  # tokens (padded), then the admission fields
        host[:p] = torch.tensor(request.input_ids, dtype=torch.int64)
        host[width : width + 4] = torch.tensor([p - 1, row, int(request.top_k), request_key(seed)], dtype=torch.int64)
        floats = host[width + 4 :].view(torch.float32)
        floats[:3] = torch.tensor([request.temperature, request.top_p, 1.0])
        if not self._raw_sampled_trees:  # in float32, then rounded to the model's dtype here (the device copies it)
            floats[2] = tree_logit_scale(floats[0]).to(self.dtype).to(torch.float32)
        if length is not None:  # staged: padded to the bucket, one replay under graphs
            prog = self._prefill_program(length, with_drafter, row=row)
            self._copy_in(prog["inputs"], host)
            prog["stage"]()
            logits = prog["logits"]
        else:  # straight into the slot: the CPU, and prompts beyond the largest bucket
            inputs = host.to(self.device)
            logits = self._prefill_forward(inputs[:p].unsqueeze(0), inputs[p : p + 1], self.target_cache,
                                           self.drafter_cache if with_drafter else None, slot=row)
            self._admit_row(inputs[p:], logits)
        if request.temperature == 0:
            return  # the argmax `_admit_row` wrote
        # a sampled first token: counter 0 of the row's coin key (the rounds use 1, 2, ...)
        dev = self.device
        params = SamplingParams(temperature=float(request.temperature), top_k=int(request.top_k),
                                top_p=float(request.top_p))
        coins = keyed_uniforms(self.coin_key[row : row + 1], torch.zeros(1, dtype=torch.int64, device=dev),
                               column_keys(1, dev))
        self.bonus[row : row + 1].copy_(pick_tokens(logits[:, 0], params, coins))

    def _copy_in(self, dst: torch.Tensor, host: torch.Tensor) -> None:
        """dst (on the device) <- host. On CUDA through the next of a ring of pinned buffers, so the copy waits for
        nothing in flight (from pageable memory it would wait for the whole stream); a buffer is refilled only
        after the copy that last read it has run (its event)."""
        if self._copied is None:
            dst.copy_(host)
            return
        i, self._input_next = self._input_next, (self._input_next + 1) % len(self._input_ring)
        buffer, done = self._input_ring[i]
        done.synchronize()
        if buffer.numel() < host.numel():
            buffer = torch.empty(host.numel(), dtype=host.dtype, pin_memory=True)
        staged = buffer[: host.numel()]
        staged.copy_(host)
        dst.copy_(staged, non_blocking=True)
        done.record()
        self._input_ring[i] = (buffer, done)

    def _stage_first(self, row: int) -> int:
        """Copy `bonus[row]` (the admitted row's first token) to the next slot of a pinned host ring, with an event;
        returns the slot (`_read_first`). The ring holds 2 x max_batch slots: at most max_batch admissions happen
        between two reads, so a slot is read before it is reused."""
        slot, self._first_next = self._first_next, (self._first_next + 1) % self._first_host.numel()
        self._first_host[slot : slot + 1].copy_(self.bonus[row : row + 1], non_blocking=self._copied is not None)
        if self._copied is not None:
            self._first_events[slot].record()
        return slot

    def _read_first(self, slot: int) -> int:
        if self._copied is not None:
            self._first_events[slot].synchronize()
        return int(self._first_host[slot])

    def _admit_row(self, fields: torch.Tensor, logits: torch.Tensor) -> None:
        """Capture-safe: the admitted row's state from its admission fields, int64 [ADMIT_FIELDS] = (last prompt
        index, row, top_k, coin key (`request_key` of the seed, on the host), then float32 temperature, top_p and
        draft scale), and the prompt's last logits [1, 1, V] (the greedy first token goes to `bonus`; a sampled one
        replaces it). On the device, so that admitting a request costs no per-field host copies; on CUDA the argmax
        and one launch (`triton_round.admit_row`) for the ~12 index writes below."""
        row = fields[1:2]
        floats = fields[4:6].view(torch.float32)  # [4]: temperature, top_p, draft scale, pad
        pick = logits[:, 0].argmax(dim=-1)  # [1]
        if self._round_kernels:
            triton_round.admit_row(fields, floats, pick, self.committed, self.bonus, self.pending_len,
                                   self.active_rows, self.temperature, self.draft_scale, self.top_k, self.top_p,
                                   self.coin_key, self.counter)
            return
        self.committed.index_copy_(0, row, fields[0:1] + 1)
        self.bonus.index_copy_(0, row, pick)
        self.pending_len.index_fill_(0, row, 0)
        self.active_rows.index_fill_(0, row, True)
        self.temperature.index_copy_(0, row, floats[0:1])
        self.draft_scale.index_copy_(0, row, floats[2:3].to(self.dtype))
        self.top_k.index_copy_(0, row, fields[2:3])
        self.top_p.index_copy_(0, row, floats[1:2])
        self.coin_key.index_copy_(0, row, fields[3:4])
        self.counter.index_fill_(0, row, 1)

    def _prefill_forward(self, tokens: torch.Tensor, last: torch.Tensor, target_cache, drafter_cache, *,
                         slot: int) -> torch.Tensor:
        """tokens [1, L] at positions 0..L-1 (causal) into `slot` of the caches (the drafter's context too when
        drafter_cache is given) -> logits [1, 1, V] of token `last` ([1] int64)."""
        dev, length = tokens.device, tokens.shape[1]
        positions = torch.arange(length, device=dev).unsqueeze(0)  # [1, L]
        zero = torch.zeros(1, dtype=torch.int64, device=dev)
        causal = torch.ones((1, length, length), dtype=torch.bool, device=dev).tril_()  # [1, L, L]
        vis = Visibility(context_len=zero, own_start=zero, own_mask=causal)  # rows = positions
        logits, features = self.target.forward(tokens, positions, vis, target_cache, first_slot=slot,
                                               logits_at=last, with_features=drafter_cache is not None)
        if drafter_cache is not None:
            self.drafter.write_context(self.drafter.project(features), positions, drafter_cache, first_slot=slot)
        return logits

    def _prefill_program(self, length: int, with_drafter: bool, *, row: int) -> dict[str, Any]:
        """The staged prefill of one length bucket: inputs [L + ADMIT_FIELDS] (tokens, then `_admit_row`'s fields:
        last index, destination row, ...) -> the staging caches -> rows [0, L) of the destination slot, the row's
        state; logits [1, 1, V]. Captured on first use with `row` (a free row: the capture's warm-up runs write
        it) as the destination."""
        key = (length, with_drafter)
        prog = self._prefills.get(key)
        if prog is not None:
            return prog
        if self.use_graphs and self._active:
            log.warning("capturing the prefill of length %d during serving", length)
        inputs = torch.zeros(length + ADMIT_FIELDS, dtype=torch.int64, device=self.device)
        inputs[length + 1] = row
        pairs = [(self.target_cache, self.staging_target)]
        if with_drafter:
            pairs.append((self.drafter_cache, self.staging_drafter))
        prog = {"inputs": inputs}

        def prefill() -> None:
            tokens, last = inputs[:length].unsqueeze(0), inputs[length : length + 1]
            dst = inputs[length + 1 : length + 2]
            prog["logits"] = self._prefill_forward(tokens, last, self.staging_target,
                                                   self.staging_drafter if with_drafter else None, slot=0)
            for cache, staging in pairs:
                for whole, staged in ((cache.keys, staging.keys), (cache.values, staging.values)):
                    whole[:, :, :, :length].index_copy_(1, dst, staged[:, :, :, :length])
            self._admit_row(inputs[length:], prog["logits"])

        prog["stage"] = _Stage("prefill", prefill)
        self._capture(prog["stage"])
        self._prefills[key] = prog
        return prog

    # ------------------------------------------------------------------------------ round programs
    def _program(self, bucket: int, method: str, budget: int, variant: Variant) -> dict[str, Any]:
        key = (bucket, method, budget)
        program = self._programs.get(key)
        if program is None:
            program = self._programs[key] = self._new_program(bucket, method, budget)
        walk_stage = program["walks"].get(variant)
        if walk_stage is None:
            if self.use_graphs and self._active:
                log.warning("capturing round variant %s for %s during serving", variant, key)
            walk_stage = program["walks"][variant] = _Stage("walk", self._walk_fn(program, variant))
            if self.use_graphs:
                self._refresh(program["head"])
            self._capture(walk_stage)
            if program["commit"].graph is None:
                self._capture(program["commit"])
        program["stages"] = [*program["head"], walk_stage, program["commit"]]
        return program

    def _refresh(self, stages: list[_Stage]) -> None:
        """Replay `stages` so that a capture's warm-up runs read this round's inputs. Graphs share one memory pool,
        so a graph's outputs may sit in blocks an earlier-captured graph uses as scratch: between a program's
        rounds its tree and logits hold another program's scratch (a warm-up walking such a tree gathers out of
        bounds). Head stages write static buffers and cache rows at or beyond `committed` only (the draft rewrites
        the pending context it will write again), so the replay changes no request's state."""
        with torch.no_grad():
            for stage in stages:
                stage()

    def _capture(self, stage: _Stage) -> None:
        """CUDA: capture the stage. Its warm-up runs execute it for real, so the rows' state is restored after
        (the other writes land in cache rows at or beyond `committed`, which nothing reads). Eager: nothing."""
        if not self.use_graphs:
            return
        saved = [t.clone() for t in self._state_tensors()]
        with torch.no_grad():
            stage.capture(self.device, self._pool)
        for t, s in zip(self._state_tensors(), saved):
            t.copy_(s)

    def _new_program(self, bucket: int, method: str, budget: int) -> dict[str, Any]:
        """Static buffers and stage functions of one (bucket, method, budget); captured stage by stage."""
        b, dev = bucket, self.device
        n = self._columns(method, budget)
        depth = 0 if method == "ar" else self.block_size - 1
        prog: dict[str, Any] = {"bucket": b, "method": method, "budget": budget, "columns": n, "depth": depth,
                                "walks": {}, "stage_names": {"draft": "draft", "build": "tree_build",
                                                             "compile": "tree_compile", "forward": "verify",
                                                             "walk": "verify", "commit": "commit"}}
        head: list[_Stage] = []
        if method == "ar":
            prog["tree"] = _root_tree(b, dev)
        else:
            head.append(self._draft_stage(b))
            if self.use_graphs:  # a draft stage captured for another program: its output may hold scratch.
                # Defensive: the replay keeps arbitrary bits from the Triton build kernels' warm-ups (the torch build
                # makes a well-formed tree of any floats, NaN too)
                self._refresh(head)

            def build() -> None:
                draft_logits = self._draft_logits[b]  # the draft stage's (static, under graphs) output
                if method == "ddtree":
                    prog["tree"], prog["bad"] = self._build_ddtree(draft_logits, budget)
                else:
                    prog["tree"] = build_chain(draft_logits)
                    prog["bad"] = ~torch.isfinite(draft_logits).all()

            if self.use_graphs and method == "ddtree":  # per-device probes and per-shape checks, outside capture
                prepare_build(dev, self.dtype, b, self.block_size - 1, self.vocab_size, budget)
            head.append(_Stage("build", build))
            self._capture(head[-1])

        # ar's and dflash's trees have the same shape every round (the root alone; a chain), so the torch path builds
        # their ancestor mask once (on the CPU ~0.15 ms a round, half of `ar`'s round besides its forward)
        fixed_mask = None if method == "ddtree" or self._round_kernels else ancestor_mask(
            prog["tree"].parents if method == "ar" else chain_parents(b, depth, dev))

        def compile_tree() -> None:
            tree: DDTreeBuildResult = prog["tree"]
            committed = self.committed[:b]
            if self._round_kernels:  # one launch (triton_round.compile_tree) for the ~30 below
                prog["tokens"], prog["positions"], mask = triton_round.compile_tree(tree, self.bonus[:b], committed)
            else:
                tokens = tree.token_ids.clone()
                tokens[:, 0] = self.bonus[:b]
                prog["tokens"] = tokens.clamp_min_(0)  # padding columns see only themselves
                prog["positions"] = committed.unsqueeze(1) + tree.depths  # [B, N]
                # padding columns (parent -1) see only themselves
                mask = fixed_mask if fixed_mask is not None else ancestor_mask(tree.parents)
            base = committed.clone()  # [B] the committed rows are the context; node j goes to row base + j
            prog["vis"] = Visibility(context_len=base, own_start=base, own_mask=mask)

        def forward() -> None:
            prog["logits"], prog["features"] = self.target.forward(
                prog["tokens"], prog["positions"], prog["vis"], self.target_cache,
                with_features=method != "ar")

        head.append(_Stage("compile", compile_tree))
        self._capture(head[-1])
        head.append(_Stage("forward", forward))
        self._capture(head[-1])
        prog["head"] = head
        # the walk (per variant) writes its result here; commit reads it
        prog["result"] = {"accept_len": torch.zeros(b, dtype=torch.int64, device=dev),
                          "nodes": torch.zeros((b, depth + 1), dtype=torch.int64, device=dev),
                          "bonus": torch.zeros(b, dtype=torch.int64, device=dev),
                          "expected": torch.zeros(b, dtype=torch.float32, device=dev),
                          "entropy": torch.zeros(b, dtype=torch.float32, device=dev)}
        prog["commit"] = _Stage("commit", self._commit_fn(prog))
        return prog

    def _draft_stage(self, b: int) -> _Stage:
        stage = self._draft_stages.get(b)
        if stage is not None:
            return stage
        dev, block = self.device, self.block_size
        offsets = torch.arange(block, device=dev)
        block_ids = torch.full((b, block), self.drafter.mask_token_id, dtype=torch.int64, device=dev)

        def draft() -> None:
            committed, pending_len = self.committed[:b], self.pending_len[:b]
            # pending row j sits at position committed - pending_len + j; rows past pending_len land at or
            # beyond `committed`, where nothing is visible, and are overwritten by later rounds
            ctx_positions = (committed - pending_len).unsqueeze(1) + offsets  # [B, b]
            self.drafter.write_context(self.pending[:b], ctx_positions, self.drafter_cache)
            block_ids[:, 0] = self.bonus[:b]
            embeds = torch.nn.functional.embedding(block_ids, self.target.embed)
            hidden = self.drafter.forward_block(embeds, committed.unsqueeze(1) + offsets, committed.clone(),
                                                self.drafter_cache)
            hidden = hidden * self.draft_scale[:b].view(b, 1, 1)  # sampled rows' tree temperature (argmax unchanged)
            # logits of the whole block, the bonus row's dropped after: cuBLAS tiled the B x D rows of a Qwen3-8B
            # lm_head 16 at a time (8 weight passes: the draft took 4.4 ms at B = 8 on an H100, 1.5 ms this way)
            self._draft_logits[b] = torch.nn.functional.linear(hidden, self.target.lm_head)[:, 1:]  # [B, D, V]

        stage = self._draft_stages[b] = _Stage("draft", draft)
        self._capture(stage)
        return stage

    def _walk_fn(self, prog: dict[str, Any], variant: Variant) -> Callable[[], None]:
        b, depth = prog["bucket"], prog["depth"]
        result = prog["result"]
        params = None
        if variant[0] == "sample":
            params = self._variant_params(b, variant)
            columns = column_keys(depth + 1, self.device)  # one coin per step of the walk: the node at depth d
        walks = variant[3] if variant[0] == "sample" else TORCH

        if depth == 0:  # ar: no tree to walk; the round's token is the root's draw (same coin, same token)
            return self._draw_fn(prog, params, columns if params is not None else None)

        def walk_fn() -> None:
            tree: DDTreeBuildResult = prog["tree"]
            logits = prog["logits"]
            if params is None:
                if self._round_kernels:  # the argmax, then one launch for the walk's ~25
                    res = triton_round.greedy_walk(tree, logits.argmax(dim=-1), depth)
                else:
                    res = verify_greedy(tree, logits, max_depth=depth, validate=False)
                result["entropy"].zero_()  # one-hot distributions
            else:
                coins = keyed_uniforms(self.coin_key[:b], self.counter[:b], columns)  # [B, D + 1]
                temperature = self.temperature[:b]
                if walks == LAZY:
                    res, entropy = lazy_sample_and_walk(tree, logits, temperature, coins, depth)
                elif walks == TORCH:
                    res, entropy = sample_and_walk(tree, logits, params, coins, depth)
                else:  # mixed batch: both walks, each row keeps its own (rows the lazy walk skips run it at T = 1)
                    lazy = lazy_rows(temperature, self.top_k[:b], self.top_p[:b], self.vocab_size)  # [B]
                    res, entropy = sample_and_walk(tree, logits, params, coins, depth)
                    fast, fast_entropy = lazy_sample_and_walk(
                        tree, logits, torch.where(lazy, temperature, torch.ones_like(temperature)), coins, depth)
                    res = VerifyResult(*(torch.where(lazy.view(-1, *[1] * (x.dim() - 1)), y, x) for x, y in zip(
                        (res.accept_len, res.accepted_nodes, res.bonus_token, res.expected_accept_len),
                        (fast.accept_len, fast.accepted_nodes, fast.bonus_token, fast.expected_accept_len))))
                    entropy = torch.where(lazy, fast_entropy, entropy)
                result["entropy"].copy_(entropy)
            result["accept_len"].copy_(res.accept_len)
            result["nodes"].copy_(res.accepted_nodes)
            result["bonus"].copy_(res.bonus_token)
            result["expected"].copy_(res.expected_accept_len)

        return walk_fn

    def _draw_fn(self, prog: dict[str, Any], params: SamplingParams | None,
                 columns: torch.Tensor | None) -> Callable[[], None]:
        """The `ar` round's verify: the root's token alone (argmax, or an inverse-CDF draw with the row's coin),
        without the walk, the edge probabilities and the entropy a tree needs (0.25 ms of a 3 ms CPU step)."""
        b, result = prog["bucket"], prog["result"]

        def draw_fn() -> None:
            root = prog["logits"][:, 0]  # [B, V]
            if params is None:
                result["bonus"].copy_(root.argmax(dim=-1))
            else:
                coins = keyed_uniforms(self.coin_key[:b], self.counter[:b], columns)  # [B, 1]
                result["bonus"].copy_(pick_tokens(root, params, coins))

        # accepted drafts, accepted nodes (the root) and expectations stay 0 (zeros from `_new_program`)
        return draw_fn

    def _variant_params(self, b: int, variant: Variant) -> SamplingParams:
        """SamplingParams over the static per-row buffers whose host flags (greedy rows possible, top-k width,
        top-p) are those of the variant: the flags pick the processing code (captured into the graph on CUDA),
        the buffers hold each row's values. Built once per walk, eager too: validating live values every round
        cost 0.2 ms of a 2 ms CPU step."""
        _, k_bucket, uses_top_p, _ = variant
        temperature, top_k, top_p = self.temperature[:b], self.top_k[:b], self.top_p[:b]
        saved = [t.clone() for t in (temperature, top_k, top_p)]
        temperature.fill_(1.0)
        if b > 1:
            temperature[0] = 0.0  # greedy rows may share the batch
        top_k.fill_(k_bucket if k_bucket > 0 else -1)
        top_p.fill_(0.5 if uses_top_p else 1.0)
        params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p)
        for t, s in zip((temperature, top_k, top_p), saved):
            t.copy_(s)
        return params

    def _commit_fn(self, prog: dict[str, Any]) -> Callable[[], None]:
        b, depth, method = prog["bucket"], prog["depth"], prog["method"]
        width = depth + 1
        result = prog["result"]
        offsets = torch.arange(width, device=self.device)

        def commit_fn() -> None:
            tree: DDTreeBuildResult = prog["tree"]
            committed = self.committed[:b]
            res = VerifyResult(accept_len=result["accept_len"], accepted_nodes=result["nodes"],
                               bonus_token=result["bonus"], expected_accept_len=result["expected"])
            if method != "ar":  # the accepted rows' K/V and features, before `committed` moves
                nodes = result["nodes"].clamp_min(0)  # [B, b]
                base = committed.unsqueeze(1)
                self.target_cache.move_rows(b, base + nodes, base + offsets)
                feats = prog["features"]
                picked = feats.gather(1, nodes.unsqueeze(2).expand(b, width, feats.shape[2]))  # [B, b, k*H]
                self.pending[:b] = self.drafter.project(picked)
            if self._round_kernels:  # the bookkeeping below in one launch
                triton_round.commit_rows(
                    tree.token_ids, res, result["entropy"], self.active_rows[:b],
                    prog["bad"] if method != "ar" else None, committed, self.bonus[:b], self.counter[:b],
                    self.pending_len[:b] if method != "ar" else None, self.out_tokens[:b], self.out_counts[:b],
                    self.out_expected[:b])
                return
            done = commit(tree, res)
            kept = torch.where(self.active_rows[:b], done.num_kept, torch.zeros_like(done.num_kept))  # [B], 0 on padding
            if method != "ar":
                self.pending_len[:b] = kept
                self.out_counts[:b, 1] = prog["bad"].to(torch.int64) & self.active_rows[:b].to(torch.int64)
            else:
                self.out_counts[:b, 1] = 0
            committed.add_(kept)
            self.bonus[:b] = result["bonus"]
            self.counter[:b] += 1
            self.out_tokens[:b, :width] = done.emitted_tokens
            self.out_counts[:b, 0] = done.num_emitted
            self.out_expected[:b, 0] = result["expected"]
            self.out_expected[:b, 1] = result["entropy"]

        return commit_fn


# ---- pure pieces (capture-safe: no host synchronisation) ------------------------------------------------

def _root_tree(batch: int, device: torch.device) -> DDTreeBuildResult:
    """The `ar` round's tree: the root alone."""
    minus = torch.full((batch, 1), -1, dtype=torch.int64, device=device)
    return DDTreeBuildResult(token_ids=minus, parents=minus.clone(), depths=torch.zeros_like(minus),
                             node_logws=torch.zeros((batch, 1), device=device),
                             num_nodes=torch.ones(batch, dtype=torch.int64, device=device))


def sample_and_walk(tree: DDTreeBuildResult, logits: torch.Tensor, params: SamplingParams, coins: torch.Tensor,
                    depth: int) -> tuple[VerifyResult, torch.Tensor]:
    """Lossless sample-and-walk with given coins [B, D + 1], one per depth: every node draws by inverse CDF
    from the processed target distribution with its depth's coin (the walk visits one node per depth, so its
    draws stay independent, and they are the draws `lazy_sample_and_walk` makes with the same coins), then the
    shared walk; greedy rows (temperature 0) pick the argmax. Also returns the processed distribution's
    entropy at the root [B] (nats; 0 for greedy rows)."""
    weights, totals = processed_weights(logits, params)  # [B, N, V], [B, N, 1]
    root = weights[:, 0] / totals[:, 0]  # [B, V]
    entropy = -(root * root.clamp_min(1e-30).log()).sum(dim=-1)
    edge_p = edge_probs(tree, weights, totals)  # [B, N], read before the buffer is consumed
    picks = sample_from_probs_(weights, uniforms=coins.gather(1, tree.depths.clamp(0, depth)))  # [B, N]
    return walk(tree, picks, edge_p, depth), entropy


def lazy_sample_and_walk(tree: DDTreeBuildResult, logits: torch.Tensor, temperature: torch.Tensor,
                         coins: torch.Tensor, depth: int) -> tuple[VerifyResult, torch.Tensor]:
    """`sample_and_walk` for temperature-only rows (T = 0 or T >= FUSED_MIN_TEMPERATURE) through the Triton
    lazy walk (CUDA): the same draws from the same coins [B, D + 1], up to fp32 rounding at a CDF boundary;
    the root's entropy from the same read's log-normaliser."""
    from ddtree.core.triton_verify import scaled_row_lse_and_min

    greedy = temperature == 0  # [B]
    inv_t = torch.where(greedy, torch.ones_like(temperature), temperature).reciprocal()
    lse, _ = scaled_row_lse_and_min(logits, inv_t)  # [B, N]
    result = lazy_walk_result(tree, logits, lse, greedy, inv_t, coins, depth)
    result.bonus_token.clamp_(min=0)  # non-finite logits end the walk at -1: keep the next round's input a token id
    gap = lse[:, :1] - logits[:, 0].float() * inv_t.unsqueeze(1)  # [B, V] -log p at the root, >= 0
    entropy = (torch.exp(-gap) * gap).sum(dim=-1)  # E[-log p], without cancelling two large terms
    return result, entropy.masked_fill(greedy, 0.0)


def lazy_rows(temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, vocab: int) -> torch.Tensor:
    """[B] bool: rows the lazy walk draws (temperature-only: T = 0 or T >= FUSED_MIN_TEMPERATURE, no top-k, no
    top-p), from the rows' parameter buffers inside a captured round; the host twin is `lazy_request`."""
    no_top_k = (top_k <= 0) | (top_k >= vocab)
    return (temperature == 0) | (no_top_k & (top_p >= 1.0) & (temperature >= FUSED_MIN_TEMPERATURE))


def lazy_request(request: GenerationRequest, vocab: int) -> bool:
    """Whether the lazy walk draws this request's tokens (`lazy_rows` for one request, on the host)."""
    greedy = request.temperature == 0
    no_top_k = request.top_k <= 0 or request.top_k >= vocab
    return greedy or (no_top_k and request.top_p >= 1.0 and request.temperature >= FUSED_MIN_TEMPERATURE)


def pick_tokens(logits: torch.Tensor, params: SamplingParams, coins: torch.Tensor) -> torch.Tensor:
    """logits [B, V] -> tokens [B]: argmax at temperature 0, else an inverse-CDF draw with coins [B, 1]."""
    if params.all_greedy:
        return logits.argmax(dim=-1)
    weights, _ = processed_weights(logits, params)
    return sample_from_probs_(weights, uniforms=coins.reshape(-1))


def make_engine(pair: Any, *, method: str = "ddtree", budget: int = 64, device: str | torch.device | None = None,
                dtype: str | torch.dtype | None = None, max_batch: int = 8, max_seq_len: int | None = None,
                cuda_graphs: bool = True, profile_stages: bool = False, verifier: str = "exact",
                tree_sampling: bool = False, attention: str = "auto"):
    """The batched engine for the families of `fast_model` (Qwen3, Qwen2, Llama layouts); the Hugging Face
    engine (one request at a time, eager) for every other family and for the experiment-only options (a lossy
    `verifier` for the report's power panel, `tree_sampling`). Chosen once, here."""
    if family_of(pair.target.config) is not None and verifier == "exact" and not tree_sampling:
        return BatchedEngine(pair, method=method, budget=budget, device=device, dtype=dtype, max_batch=max_batch,
                             max_seq_len=max_seq_len, cuda_graphs=cuda_graphs, profile_stages=profile_stages,
                             attention=attention)
    from ddtree.engine.engine import DecodingEngine

    log.info("model family %r: Hugging Face engine (batch 1, eager)", getattr(pair.target.config, "model_type", "?"))
    return DecodingEngine(pair, method=method, budget=budget, device=device, dtype=dtype, profile_stages=profile_stages,
                          verifier=verifier, tree_sampling=tree_sampling)
