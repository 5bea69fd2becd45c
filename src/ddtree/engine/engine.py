"""One decoding loop for `ar`, `dflash` and `ddtree` over a (Hugging Face target, DFlash drafter) pair.

A speculative round (stages timed separately, keys of `ddtree.engine.types.STAGES`):
  draft        the drafter's ONE non-causal forward over [bonus, mask * (b - 1)] -> draft logits [1, D, V]
  tree_build   `build_tree` (ddtree) or the argmax chain (dflash), one `DDTreeBuildResult`
  tree_compile `tree_attention` -> positions start + depth and the 4D mask [committed ; ancestors + self]
  verify       ONE target forward over the N tree tokens with the committed KV cache, then the walk
  commit       `commit`, KV compaction to the accepted path, drafter context of the newly committed tokens
`ar` runs the same prefill and token pick (same `process_logits`, same per-request generator), one
target forward per token.

Invariants between rounds: the target KV cache holds exactly the committed tokens before the bonus
(`committed` rows); the drafter cache holds context features of the committed tokens already fed to it,
and `pending_*` holds the features of the ones committed since (fed with the next draft forward).

Every round drafts the full block depth D (one draft-logits shape per budget, so a CUDA-graph tree build
is captured once); the last round's tree may therefore reach up to D - 1 positions past
prompt + max_new_tokens, which RoPE targets (Qwen3, Llama) accept. Its extra tokens are cut by
max_new_tokens and never emitted.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from ddtree import switches
from ddtree.core.attention import tree_attention
from ddtree.core.build import build_tree
from ddtree.core.build_sampling import tree_logit_scale
from ddtree.core.entropy import processed_entropy
from ddtree.core.lossy_verifiers import get_verifier
from ddtree.core.sampling import SamplingParams, process_logits
from ddtree.core.types import DDTreeBuildResult
from ddtree.core.verify import commit, verify_greedy
from ddtree.engine.chain import build_chain
from ddtree.engine.checks import check_budget, check_method, check_request_fields, default_dtype, resolve_dtype
from ddtree.engine.kv import cache_keyword, keep_rows, new_cache
from ddtree.engine.stopping import StopState, append_tokens
from ddtree.engine.types import STAGES, GenerationOutput, GenerationRequest

TokenCallback = Callable[[list[int]], None]
_MASK_CAPABLE_ATTENTION = ("sdpa", "eager")


class _StageClock:
    """Sums wall time per stage; synchronises the device at stage boundaries only when asked to."""

    def __init__(self, device: torch.device, synchronize: bool) -> None:
        self._sync = torch.cuda.synchronize if (synchronize and device.type == "cuda") else None
        self.times = dict.fromkeys(STAGES, 0.0)
        self._last = 0.0

    def now(self) -> float:
        if self._sync is not None:
            self._sync()
        return time.perf_counter()

    def start(self) -> None:
        self._last = self.now()

    def lap(self, stage: str) -> None:
        t = self.now()
        self.times[stage] += t - self._last
        self._last = t


class DecodingEngine:
    """Batch-1 decoding engine; one instance serves requests one at a time (the server serialises them)."""

    def __init__(
        self,
        pair: Any,
        *,
        method: str = "ddtree",
        budget: int = 64,
        device: str | torch.device | None = None,
        dtype: str | torch.dtype | None = None,
        profile_stages: bool = True,
        verifier: str = "exact",
        tree_sampling: bool = False,
    ) -> None:
        check_method(method)
        check_budget(budget)
        # sampling verifier by name (ddtree.core.lossy_verifiers: "exact", or a lossy one for the power panel)
        self.verifier = verifier
        self._verify_sampling = get_verifier(verifier)
        # build sampled-request trees on the drafter marginals processed like the target's (core/build_sampling);
        # otherwise on the raw draft logits at the tree temperature 1 + T (`tree_logit_scale`), as the batched engine
        self.tree_sampling = bool(tree_sampling)
        self._raw_sampled_trees = switches.current().raw_sampled_trees
        self.method = method
        self.budget = int(budget)
        target = pair.target
        self.device = torch.device(device) if device is not None else next(target.parameters()).device
        if isinstance(dtype, str):
            dtype = resolve_dtype(dtype, self.device)
        self.dtype = dtype if dtype is not None else default_dtype(self.device)
        self.target = target.to(device=self.device, dtype=self.dtype).eval()
        self.drafter = pair.drafter.to(device=self.device, dtype=self.dtype).eval() if pair.drafter is not None else None
        self.tokenizer = getattr(pair, "tokenizer", None)
        self.profile_stages = profile_stages
        _use_mask_capable_attention(self.target)
        config = self.target.config
        self.max_context = int(config.max_position_embeddings)
        self.vocab_size = int(self.target.get_output_embeddings().weight.shape[0])
        self._cache_kw = cache_keyword(self.target)
        self._embed = self.target.get_input_embeddings()
        self._lm_head = self.target.get_output_embeddings()
        self._mask_min = torch.finfo(self.dtype).min
        if self.drafter is not None:
            self.block_size = int(self.drafter.config.block_size)
            self.mask_token_id = int(self.drafter.config.mask_token_id)
            self._block_offsets = torch.arange(self.block_size, device=self.device)  # [b]
            # hidden_states index of target layer l is l + 1 (index 0 = embeddings)
            self._feature_layers = sorted({int(i) + 1 for i in self.drafter.config.target_layer_ids})
        else:
            self.block_size, self.mask_token_id = 1, -1

    # ----------------------------------------------------------------------------------------- public
    def generate(
        self,
        request: GenerationRequest,
        *,
        method: str | None = None,
        budget: int | None = None,
        on_tokens: TokenCallback | None = None,
    ) -> GenerationOutput:
        """Decode one request. `on_tokens(new_ids)` is called after each round with the tokens it committed
        to the output (stop rules applied), from the decoding thread: the server streams from it."""
        method = self.method if method is None else method
        budget = self.budget if budget is None else budget
        check_method(method)
        check_budget(budget)
        if method != "ar" and self.drafter is None:
            raise ValueError(f"method {method!r} needs a drafter; this pair has none")
        self._check_request(request)
        params = SamplingParams(temperature=float(request.temperature), top_k=int(request.top_k), top_p=float(request.top_p))
        generator = torch.Generator(device=self.device)
        if request.seed is None:
            generator.seed()
        else:
            generator.manual_seed(int(request.seed))
        with torch.inference_mode():
            if method == "ar":
                return self._generate_ar(request, params, generator, on_tokens)
            return self._generate_spec(request, params, generator, method, int(budget), on_tokens)

    # ------------------------------------------------------------------------------------- internals
    def _check_request(self, request: GenerationRequest) -> None:
        check_request_fields(request, self.vocab_size, has_tokenizer=self.tokenizer is not None)
        ids = request.input_ids
        if len(ids) >= self.max_context:
            raise ValueError(
                f"prompt of {len(ids)} tokens does not fit the context of {self.max_context} tokens"
            )
        if len(ids) + request.max_new_tokens > self.max_context:
            raise ValueError(
                f"prompt ({len(ids)}) + max_new_tokens ({request.max_new_tokens}) exceeds the context "
                f"of {self.max_context} tokens"
            )

    def _forward(self, input_ids, position_ids, cache, *, attention_mask=None, hidden=False, last_only=False):
        kwargs = {self._cache_kw: cache}
        if last_only:
            kwargs["logits_to_keep"] = 1
        return self.target(
            input_ids=input_ids,
            position_ids=position_ids,
            attention_mask=attention_mask,
            use_cache=True,
            output_hidden_states=hidden,
            **kwargs,
        )

    def _pick(self, logits: torch.Tensor, params: SamplingParams, generator: torch.Generator) -> torch.Tensor:
        """logits [1, V] -> token [1] (argmax at T = 0, else a draw from the processed distribution)."""
        if params.temperature == 0:
            return logits.argmax(dim=-1)
        probs = process_logits(logits.float(), params)  # [1, V]
        return torch.multinomial(probs, 1, generator=generator).squeeze(-1)

    def _prefill(self, request, params, generator, cache, clock, *, hidden):
        prompt = torch.tensor([request.input_ids], dtype=torch.long, device=self.device)  # [1, P]
        positions = torch.arange(prompt.shape[1], device=self.device).unsqueeze(0)  # [1, P]
        out = self._forward(prompt, positions, cache, hidden=hidden, last_only=True)
        first = self._pick(out.logits[:, -1], params, generator)  # [1]
        return out, first, positions

    def _finish(self, state, clock, t0, t_first, rounds, accept_lens, expected, method, budget):
        t_end = clock.now()
        return GenerationOutput(
            output_ids=state.output_ids,
            finish_reason=state.finish_reason or "length",
            rounds=rounds,
            accept_lens=accept_lens,
            expected_accept_lens=expected,
            stage_times=dict(clock.times),
            ttft=t_first - t0,
            decode_time=t_end - t_first,
            matched_stop=state.matched_stop,
            method=method,
            budget=budget,
        )

    @staticmethod
    def _appender(stop_kwargs: dict[str, Any], on_tokens: TokenCallback | None) -> Callable[[StopState, list[int]], None]:
        """append_tokens with the stop rules of this request, then the streaming callback with what was kept."""

        def append(state: StopState, tokens: list[int]) -> None:
            kept = append_tokens(state, tokens, **stop_kwargs)
            if on_tokens is not None and kept:
                on_tokens(state.output_ids[-kept:])

        return append

    def _stop_kwargs(self, request: GenerationRequest) -> dict[str, Any]:
        decode = None
        if request.stop_strings:
            tok = self.tokenizer

            def decode(ids: list[int]) -> str:
                return tok.decode(ids, skip_special_tokens=True)

        return {
            "max_new_tokens": request.max_new_tokens,
            "stop_token_ids": frozenset(int(t) for t in request.stop_token_ids),
            "stop_strings": list(request.stop_strings),
            "decode": decode,
        }

    def _generate_ar(self, request, params, generator, on_tokens) -> GenerationOutput:
        clock = _StageClock(self.device, self.profile_stages)
        append = self._appender(self._stop_kwargs(request), on_tokens)
        t0 = clock.now()
        prompt_len = len(request.input_ids)
        cache = new_cache(self.target, prompt_len + request.max_new_tokens + 1)
        _, token, _ = self._prefill(request, params, generator, cache, clock, hidden=False)
        state = StopState(output_ids=[])
        append(state, [int(token)])
        t_first = clock.now()
        clock.start()
        rounds = 0
        position = torch.tensor([[prompt_len]], device=self.device)  # [1, 1]
        while state.finish_reason is None:
            out = self._forward(token.view(1, 1), position, cache)
            token = self._pick(out.logits[:, -1], params, generator)  # [1]
            position += 1
            rounds += 1
            append(state, [int(token)])  # int(): the one host sync per step
            clock.lap("verify")
        return self._finish(state, clock, t0, t_first, rounds, [0] * rounds, [0.0] * rounds, "ar", 0)

    def _generate_spec(self, request, params, generator, method, budget, on_tokens) -> GenerationOutput:
        clock = _StageClock(self.device, self.profile_stages)
        append = self._appender(self._stop_kwargs(request), on_tokens)
        greedy = params.temperature == 0
        depth_max = self.block_size - 1
        num_columns = (budget if method == "ddtree" else depth_max) + 1
        t0 = clock.now()
        prompt_len = len(request.input_ids)
        cache = new_cache(self.target, prompt_len + request.max_new_tokens + num_columns + 1)
        out, bonus, positions = self._prefill(request, params, generator, cache, clock, hidden=True)
        pending_ctx = self.drafter.extract_context(out.hidden_states)  # [1, P, H]
        pending_pos = positions  # [1, P]
        del out
        state = StopState(output_ids=[])
        append(state, [int(bonus)])
        t_first = clock.now()
        clock.start()

        drafter_cache = self.drafter.new_cache()
        block_ids = torch.full((1, self.block_size), self.mask_token_id, dtype=torch.long, device=self.device)
        committed = prompt_len  # rows in the target KV cache; the bonus sits at position `committed`
        accept_lens: list[int] = []
        expected_dev: list[torch.Tensor] = []
        entropy_dev: list[torch.Tensor] = []
        while state.finish_reason is None:
            # 1. draft
            block_ids[:, 0] = bonus
            block_pos = (self._block_offsets + committed).unsqueeze(0)  # [1, b]
            hidden = self.drafter(self._embed(block_ids), block_pos, pending_ctx, pending_pos, drafter_cache)
            draft_logits = self._lm_head(hidden[:, 1:])  # [1, D, V]
            clock.lap("draft")

            # 2. tree_build
            tree_params = params if self.tree_sampling and not greedy else None
            if method == "ddtree" and not greedy and not self.tree_sampling and not self._raw_sampled_trees:
                draft_logits = draft_logits * tree_logit_scale(params.temperature)
            tree = build_tree(draft_logits, budget, sampling=tree_params) if method == "ddtree" else build_chain(draft_logits)
            clock.lap("tree_build")

            # 3. tree_compile
            tokens, tree_pos, mask4 = self._compile(tree, bonus, committed)
            clock.lap("tree_compile")

            # 4. verify
            out = self._forward(tokens, tree_pos, cache, attention_mask=mask4, hidden=True)
            logits = out.logits  # [1, N, V]
            if greedy:
                result = verify_greedy(tree, logits, max_depth=depth_max)
            else:
                result = self._verify_sampling(tree, logits, params, generator=generator, max_depth=depth_max)
            clock.lap("verify")
            entropy_dev.append(processed_entropy(logits[:, 0], params))  # the target's next-token entropy

            # 5. commit
            done = commit(tree, result)
            width = done.accepted_nodes.shape[1]
            host = torch.cat([done.num_kept, done.accepted_nodes[0], done.emitted_tokens[0]]).tolist()
            kept = host[0]
            nodes = host[1 : 1 + kept]
            emitted = host[1 + width : 1 + width + kept]
            contiguous = nodes == list(range(kept))
            rows = None if contiguous else done.accepted_nodes[0, :kept]  # [K]
            keep_rows(cache, committed, rows, kept)
            pending_ctx = self.drafter.extract_context(self._accepted_hidden(out.hidden_states, kept, rows))  # [1, K, H]
            pending_pos = (self._block_offsets[:kept] + committed).unsqueeze(0)  # [1, K]
            bonus = done.emitted_tokens[0, kept - 1]
            committed += kept
            del out, logits
            accept_lens.append(kept - 1)
            expected_dev.append(result.expected_accept_len.reshape(1))
            append(state, emitted)
            clock.lap("commit")

        expected = torch.cat(expected_dev).float().tolist() if expected_dev else []
        recorded_budget = budget if method == "ddtree" else depth_max
        out = self._finish(
            state, clock, t0, t_first, len(accept_lens), accept_lens, expected, method, recorded_budget
        )
        out.entropies = torch.cat(entropy_dev).float().tolist() if entropy_dev else []
        return out

    def _accepted_hidden(self, hidden_states, kept: int, rows: torch.Tensor | None) -> list:
        """The hidden-states tuple restricted to the accepted rows, only for the layers the drafter reads."""
        picked: list = [None] * len(hidden_states)
        for layer in self._feature_layers:
            h = hidden_states[layer]  # [1, N, H]
            picked[layer] = h[:, :kept] if rows is None else h.index_select(1, rows)  # [1, K, H]
        return picked

    def _compile(
        self, tree: DDTreeBuildResult, bonus: torch.Tensor, committed: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Tree tokens [1, N] (root = bonus, padding -> 0), positions [1, N] and the additive 4D mask."""
        attn = tree_attention(tree)
        tokens = tree.token_ids.clone()  # [1, N]
        tokens[:, 0] = bonus
        tokens.clamp_(min=0)  # padding columns (-1) are never attended by real nodes
        positions = attn.position_offsets + committed  # [1, N]
        n = tokens.shape[1]
        mask4 = torch.zeros((1, 1, n, committed + n), dtype=self.dtype, device=self.device)  # [1, 1, N, L + N]
        mask4[:, 0, :, committed:].masked_fill_(~attn.mask, self._mask_min)
        return tokens, positions, mask4


def _use_mask_capable_attention(model: torch.nn.Module) -> None:
    """The tree mask is a custom 4D mask: only attention paths that honour it may run the verify forward."""
    current = getattr(model.config, "_attn_implementation", None)
    if current in _MASK_CAPABLE_ATTENTION:
        return
    if hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation("sdpa")
    else:
        model.config._attn_implementation = "sdpa"
