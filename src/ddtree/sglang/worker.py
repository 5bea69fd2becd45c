"""DDTREE decode worker for SGLang 0.5.23: SGLang's DFlash V2 worker with a tree instead of a chain.

Runs on a CUDA host only (it is constructed by SGLang's scheduler, never by this project's code); the pure
pieces it is built from (`ddtree.sglang.glue`, `ddtree.core`) are tested on CPU. Extend (prefill) and idle
batches are DFlash's own path. One decode round:

1. draft: the drafter's one block forward over `[bonus, mask, ...]` (block columns of the verify window),
   its hidden states x the target's lm_head -> draft logits [B, D, V];
2. build: `ddtree.core.build.build_tree` on the device (batch padded to a power of two, so the tree-build
   graphs captured at start-up cover every batch; sampled rows' logits at the tree temperature 1 + T, as in
   the reference engine), then `encode_retrieve`;
3. verify: ONE target forward over the N = budget + 1 tree tokens, positions prefix + depth, the
   ancestor-only mask (`glue.verify_mask`), the N-column window as out_cache_loc;
4. accept: greedy rows (top_k <= 1) through SGLang's greedy tree kernel on the argmax, sampled rows through
   `tree_speculative_sampling_target_only` with fresh zero draft probs and thresholds 1 (lossless), merged
   per row;
5. commit (one path for both): the accepted path's target KV moved to the window front
   (`move_accept_tokens_to_target_kvcache`), its hidden states compacted to the front and appended to the
   drafter's KV for the first block columns with commit_lens = k + 1; the rest of the window is freed by
   the scheduler as overshoot, as for EAGLE trees.

The result carries next_token_ids [B * block] (stride block), accept_lens = k + 1 (bonus included) and
speculative_num_draft_tokens = N, so `meta_info.spec_accept_length` (completion tokens / verify rounds)
is the tree's tau. SGLang's `spec_accept_rate` divides by N - 1 proposals and means nothing for a tree.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from sglang.kernels.ops.speculative.cache_locs import assign_extend_cache_locs_func
from sglang.kernels.ops.speculative.spec_tree import verify_tree_greedy_func
from sglang.kernels.ops.speculative.verify_sampling import tree_speculative_sampling_target_only
from sglang.srt.layers.logprob_processor import compute_spec_logprobs
from sglang.srt.lora.layers import unwrap_lora_layer
from sglang.srt.managers.scheduler import GenerationBatchResult
from sglang.srt.model_executor.forward_batch_info import (
    CaptureHiddenMode,
    ForwardBatch,
    ForwardMode,
    enable_num_token_non_padded,
)
from sglang.srt.runtime_context import get_parallel, get_spec
from sglang.srt.speculative.dflash_info import DFlashVerifyInput
from sglang.srt.speculative.dflash_info_v2 import DFlashDraftInputV2
from sglang.srt.speculative.dflash_utils import (
    apply_dflash_verify_logits_adjustments,
    build_speculative_verify_target_probs,
)
from sglang.srt.speculative.dflash_worker_v2 import DFlashWorkerV2, _resolve_dflash_embedding_module
from sglang.srt.speculative.draft_worker_common import build_block_pos_offsets, make_draft_block_spec_info
from sglang.srt.speculative.eagle_utils import _verify_coins
from sglang.srt.speculative.eagle_worker_common import _compact_accept_to_front
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
from sglang.srt.speculative.spec_tp_sync import SpecTpSyncSite
from sglang.srt.speculative.spec_utils import draft_tp_context, move_accept_tokens_to_target_kvcache

from ddtree import switches
from ddtree.core.build import build_tree
from ddtree.core.retrieve import encode_retrieve
from ddtree.core.types import DDTreeBuildResult
from ddtree.sglang import graph_hook
from ddtree.sglang.glue import (
    KernelOutputs,
    accepted_paths,
    merge_rows,
    tempered_draft_logits,
    verify_candidates,
    verify_mask,
    verify_mask_numel,
    verify_positions,
)

logger = logging.getLogger(__name__)


def _bucket(bs: int) -> int:
    """Power-of-two batch bucket of the tree build (its CUDA graphs are keyed by shape)."""
    return 1 << max(0, (bs - 1).bit_length())


class DDTreeWorker(DFlashWorkerV2):
    """DFlash V2 worker whose decode round drafts one block, builds a DDTree and verifies it in one forward."""

    def __init__(self, server_args: Any, gpu_id: int, nccl_port: int, target_worker: Any) -> None:
        super().__init__(server_args=server_args, gpu_id=gpu_id, nccl_port=nccl_port, target_worker=target_worker)
        spec = get_spec()
        # DFlashWorkerV2 takes speculative_num_draft_tokens (= N here) as its block: restore the drafter's.
        self.tree_nodes = int(spec.speculative_num_draft_tokens)
        self.block_size = int(spec.speculative_dflash_block_size)
        self._raw_sampled_trees = switches.current().raw_sampled_trees  # trees of sampled rows: raw, for measuring
        self.speculative_num_draft_tokens = self.block_size
        if self.selector is not None or self.lilicorr is not None or self._is_domino:
            raise ValueError("DDTREE: drafters with a candidate selector, LiLiCorr or Domino head are not supported")
        self.draft_model.set_block_size(self.block_size)
        self._block_pos_offsets = build_block_pos_offsets(length=self.block_size, device=self.device)
        self._draft_block_spec_info = make_draft_block_spec_info(draft_token_num=self.block_size, device=self.device)
        self._use_triton_prepare_block = False  # it writes a block-wide window; the tree window is N wide
        self._vocab_size = int(self.model_runner.model_config.vocab_size)
        self._warned_no_sampling_kernel = False
        graph_hook.install()  # before SGLang captures the target-verify graphs (after this constructor)
        if get_parallel().tp_rank == 0:
            logger.info(
                "DDTREE worker: block %d (D = %d), N = %d tree nodes (budget %d)",
                self.block_size, self.block_size - 1, self.tree_nodes, self.tree_nodes - 1,
            )

    # ------------------------------------------------------------------ start-up

    def _maybe_build_draft_sampler(self):
        return None  # DFlash's in-graph sampler is argmax-only; the tree needs the drafter's full logits

    def init_cuda_graphs(self) -> None:
        super().init_cuda_graphs()
        self._capture_tree_builds()

    def _capture_tree_builds(self) -> None:
        """Run the tree build once per batch bucket so its CUDA graphs are captured before serving."""
        max_bs = int(self.model_runner.max_running_requests or 1)
        dtype = self.model_runner.dtype
        bs = 1
        while True:
            logits = torch.zeros((bs, self.block_size - 1, self._vocab_size), dtype=dtype, device=self.device)
            build_tree(logits, self.tree_nodes - 1)
            if bs >= max_bs:
                break
            bs *= 2
        torch.cuda.synchronize(self.device)

    def prewarm_sampling(self):
        """DFlash's rehearsal of the sampled verify, at the tree's width N instead of the block."""
        block = self.block_size
        self.block_size = self.tree_nodes
        try:
            return super().prewarm_sampling()
        finally:
            self.block_size = block

    # ------------------------------------------------------------------ decode

    def forward_batch_generation(
        self, batch: Any, on_publish=None, grammar_barrier=None, pp_proxy_tensors=None
    ) -> GenerationBatchResult:
        if batch.forward_mode.is_extend() or batch.is_extend_in_batch or batch.forward_mode.is_idle():
            return super().forward_batch_generation(
                batch, on_publish=on_publish, grammar_barrier=grammar_barrier, pp_proxy_tensors=pp_proxy_tensors
            )
        if batch.has_grammar:
            raise RuntimeError("DDTREE does not support grammar-constrained requests")
        draft_input = batch.spec_info
        if not isinstance(draft_input, DFlashDraftInputV2):
            raise RuntimeError("DDTREE expected DFlashDraftInputV2 state on the running batch")
        return self._decode(batch, draft_input, on_publish)

    def _window(self, batch: Any, prefix_lens: torch.Tensor, bs: int) -> torch.Tensor:
        """[B * N] this round's KV slots: req_to_token[req, prefix : prefix + N] (reserved by the scheduler)."""
        return assign_extend_cache_locs_func(
            req_pool_indices=batch.req_pool_indices,
            req_to_token=self.model_runner.req_to_token_pool.req_to_token,
            start_offset=prefix_lens,
            end_offset=prefix_lens + self.tree_nodes,
            batch_size=bs,
            draft_token_num=self.tree_nodes,
            device=self.device,
        )

    def _draft_logits(self, batch: Any, draft_input: Any, prefix_lens: torch.Tensor, kv_loc_plan: Any, bs: int):
        """One drafter forward over the block; returns draft logits [B, D, V] (full vocabulary on every rank)."""
        block = self.block_size
        target_model = self.target_worker.model_runner.model
        embed = unwrap_lora_layer(_resolve_dflash_embedding_module(self.draft_model, target_model))
        block_ids = torch.full((bs, block), int(self._mask_token_id), dtype=torch.int64, device=self.device)
        block_ids[:, 0] = draft_input.bonus_tokens
        positions = (prefix_lens.to(torch.int64).unsqueeze(1) + self._block_pos_offsets).reshape(-1)
        if self._full_embed_gpu is not None:
            noise = torch.nn.functional.embedding(block_ids, self._full_embed_gpu)
        else:
            noise = embed(block_ids)
        if self._noise_embed_scale != 1.0:
            noise = noise * self._noise_embed_scale

        seq_lens_cpu = self._draft_seq_lens_cpu(batch, draft_input, bs)
        forward_batch = ForwardBatch(
            forward_mode=ForwardMode.TARGET_VERIFY,
            batch_size=bs,
            input_ids=block_ids.flatten(),
            req_pool_indices=batch.req_pool_indices,
            seq_lens=prefix_lens,
            out_cache_loc=None,  # bound by the plan below: the window's first block columns
            seq_lens_sum=int(seq_lens_cpu.sum()),
            seq_lens_cpu=seq_lens_cpu,
            positions=positions,
            input_embeds=noise.view(-1, noise.shape[-1]),
            spec_algorithm=SpeculativeAlgorithm.DFLASH,
            spec_info=self._draft_block_spec_info,
            capture_hidden_mode=CaptureHiddenMode.NULL,
            num_token_non_padded=(
                torch.full((), bs * block, dtype=torch.int32, device=self.device)
                if enable_num_token_non_padded()
                else None
            ),
            global_num_token_non_padded_cpu=bs * block,
            can_run_decode_cuda_graph=batch.can_run_decode_cuda_graph,
        )
        kv_loc_plan.bind(forward_batch, self.draft_model_runner.kv_index_translator, cols=slice(0, block))
        with torch.inference_mode(), draft_tp_context(self.draft_parallel_layout):
            hidden = self.draft_model_runner.forward(forward_batch).logits_output.hidden_states
        if hidden is None:
            raise RuntimeError("DDTREE: the drafter returned no hidden states")
        hidden = hidden[: bs * block].view(bs, block, -1)[:, 1:, :]  # [B, D, H]
        return self._vocab_logits(hidden), block_ids[:, 0]

    def _draft_seq_lens_cpu(self, batch: Any, draft_input: Any, bs: int) -> torch.Tensor:
        """Host upper bound of the drafter's KV lengths (committed prefix + one block), as DFlash plans it."""
        if batch.seq_lens_cpu is not None:
            return batch.seq_lens_cpu[:bs].to(torch.int64) + self.block_size
        if draft_input.nxt_kv_lens_cpu is not None:
            return draft_input.nxt_kv_lens_cpu[:bs].to(torch.int64)
        return torch.tensor([req.kv.kv_allocated_len for req in batch.reqs], dtype=torch.int64)

    def _vocab_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [B, D, H] x the target's lm_head -> [B, D, V]; vocab-parallel shards all-gathered under TP."""
        lm_head = unwrap_lora_layer(self.target_worker.model_runner.model.lm_head)
        weight = lm_head.weight  # [local padded vocab, H]
        shard = getattr(lm_head, "shard_indices", None)
        local = weight if shard is None else weight[: int(shard.num_org_elements_padded)]
        logits = torch.matmul(hidden.to(weight.dtype), local.T)  # [B, D, V_local]
        tp_group = get_parallel().tp_group
        if shard is not None:
            valid = int(shard.num_org_elements)
            if valid < logits.shape[-1]:
                logits[..., valid:] = float("-inf")  # this rank's padding columns
            if int(tp_group.world_size) > 1:
                # shards are contiguous, in rank order: the gathered column is the token id
                logits = tp_group.all_gather(logits.contiguous(), dim=-1)
        return logits[..., : self._vocab_size]

    def _build(self, draft_logits: torch.Tensor, bs: int) -> DDTreeBuildResult:
        """The tree on the device; identical on every TP rank (rank 0's is broadcast)."""
        padded = _bucket(bs)
        if padded != bs:
            filler = draft_logits.new_zeros((padded - bs, *draft_logits.shape[1:]))
            draft_logits = torch.cat([draft_logits, filler])
        tree = build_tree(draft_logits, self.tree_nodes - 1)
        ints = torch.stack([tree.token_ids[:bs], tree.parents[:bs], tree.depths[:bs]])  # [3, B, N]
        logws = tree.node_logws[:bs].contiguous()
        self._tp_sync.sync(SpecTpSyncSite.DFLASH_ACCEPT_GREEDY, ints)
        self._tp_sync.sync(SpecTpSyncSite.DFLASH_ACCEPT_GREEDY, logws)
        return DDTreeBuildResult(
            token_ids=ints[0], parents=ints[1], depths=ints[2], node_logws=logws, num_nodes=tree.num_nodes[:bs]
        )

    def _accept(self, logits: torch.Tensor, sampling_info: Any, tree: DDTreeBuildResult, candidates: torch.Tensor,
                prefix_lens: torch.Tensor, bs: int) -> KernelOutputs:
        """Greedy rows through the greedy tree kernel, sampled rows through the sampling kernel, merged."""
        n, steps = self.tree_nodes, self.block_size
        enc = encode_retrieve(tree)
        target_predict = logits.argmax(dim=-1).view(bs, n)  # [B, N] int64
        greedy = KernelOutputs.fresh(bs, n, steps, self.device)
        verify_tree_greedy_func(
            greedy.predicts, greedy.accept_index, greedy.accept_token_num, candidates,
            enc.retrieve_index, enc.retrieve_next_token, enc.retrieve_next_sibling, target_predict,
        )
        if sampling_info is None or sampling_info.is_all_greedy:
            return greedy
        if tree_speculative_sampling_target_only is None:
            raise RuntimeError("DDTREE: sampled requests need tree_speculative_sampling_target_only (CUDA)")
        probs = build_speculative_verify_target_probs(
            next_token_logits=logits, sampling_info=sampling_info, draft_token_num=n, bs=bs
        )  # [B, N, V] fp32: temperature, top-k, top-p, softmax
        coins, final_coins = _verify_coins(
            sampling_info=sampling_info, seq_lens=prefix_lens, draft_token_num=n, candidates=candidates,
            device=self.device,
        )
        sampled = KernelOutputs.fresh(bs, n, steps, self.device)
        tree_speculative_sampling_target_only(
            sampled.predicts, sampled.accept_index, sampled.accept_token_num, candidates,
            enc.retrieve_index, enc.retrieve_next_token, enc.retrieve_next_sibling, coins, final_coins,
            probs, torch.zeros_like(probs), 1.0, 1.0, True,
        )
        merged = merge_rows(sampling_info.top_ks.view(-1) <= 1, greedy, sampled)
        for tensor in (merged.predicts, merged.accept_index, merged.accept_token_num):
            self._tp_sync.sync(SpecTpSyncSite.DFLASH_ACCEPT_SAMPLE, tensor)
        return merged

    def _decode(self, batch: Any, draft_input: Any, on_publish) -> GenerationBatchResult:
        batch.seq_lens.record_stream(torch.get_device_module(self.device).current_stream())
        bs = len(batch.seq_lens)
        n, block = self.tree_nodes, self.block_size
        prefix_lens = batch.seq_lens
        window = self._window(batch, prefix_lens, bs)  # [B * N]
        kv_loc_plan = self.target_worker.model_runner.kv_index_translator.plan(
            req_pool_indices=batch.req_pool_indices,
            seq_lens=prefix_lens,
            seq_lens_cpu=batch.seq_lens_cpu if batch.seq_lens_cpu is not None else draft_input.nxt_kv_lens_cpu,
            write_virtual=window,
            read_extent=n,
        )

        # 1) draft, 2) build
        draft_logits, bonus_in = self._draft_logits(batch, draft_input, prefix_lens, kv_loc_plan, bs)
        info = batch.sampling_info
        if info is not None and not info.is_all_greedy and not self._raw_sampled_trees:
            draft_logits = tempered_draft_logits(draft_logits, info.temperatures, info.top_ks)
        tree = self._build(draft_logits, bs)
        candidates = verify_candidates(tree, bonus_in)  # [B, N] int64

        # 3) verify: one target forward over the tree
        seq_lens_sum = batch.seq_lens_sum
        mask_numel = (  # sum_b N * (L_b + N), from the host sum when the scheduler has one (no device read)
            n * int(seq_lens_sum) + bs * n * n if seq_lens_sum is not None else int(verify_mask_numel(prefix_lens, n))
        )
        mask = verify_mask(tree.parents, prefix_lens, mask_numel)
        verify_input = DFlashVerifyInput(
            draft_token=candidates.reshape(-1),
            positions=verify_positions(prefix_lens, tree.depths),
            draft_token_num=n,
            custom_mask=mask,
            capture_hidden_mode=CaptureHiddenMode.FULL,
            kv_loc_plan=kv_loc_plan,
        )
        batch.out_cache_loc = window
        seq_lens_cpu_backup, seq_lens_sum_backup = batch.seq_lens_cpu, seq_lens_sum
        if seq_lens_cpu_backup is not None:
            batch.seq_lens_cpu = seq_lens_cpu_backup + n  # host bound: prefix + the verify window
            batch.seq_lens_sum = int(batch.seq_lens_cpu.sum())
        elif draft_input.nxt_kv_lens_cpu is not None:
            batch.seq_lens_cpu = draft_input.nxt_kv_lens_cpu
            batch.seq_lens_sum = int(draft_input.nxt_kv_lens_sum)
        verify_forward_batch, _ = verify_input.prepare_for_verify(batch, self.target_worker)
        batch.seq_lens_cpu, batch.seq_lens_sum = seq_lens_cpu_backup, seq_lens_sum_backup
        target_out = self.target_worker.forward_batch_generation(
            batch=None, forward_batch=verify_forward_batch, is_verify=True, skip_attn_backend_init=True
        )
        logits_output = target_out.logits_output
        logits = logits_output.next_token_logits  # [B * N, V]
        sampling_info = batch.sampling_info
        if sampling_info is not None:
            apply_dflash_verify_logits_adjustments(next_token_logits=logits, sampling_info=sampling_info, draft_token_num=n)

        # 4) accept
        outputs = self._accept(logits, sampling_info, tree, candidates, prefix_lens, bs)
        paths = accepted_paths(outputs, n)
        out_tokens = paths.emitted_tokens.clamp_min(0)  # [B, block]; rows past commit_lens are not read
        new_seq_lens = prefix_lens + paths.commit_lens.to(prefix_lens.dtype)
        if batch.return_logprob:
            compute_spec_logprobs(batch, logits_output, outputs.predicts.to(torch.int64), accept_index=outputs.accept_index)
        if on_publish is not None:
            on_publish(new_seq_lens)

        # 5) commit: target KV and drafter context of the accepted path, at the window's front
        move_accept_tokens_to_target_kvcache(
            batch, paths.keep_index, paths.accept_len.to(torch.int32), self.model_runner.token_to_kv_pool_allocator
        )
        hidden = logits_output.hidden_states
        if hidden is None:
            raise RuntimeError("DDTREE verify requires target hidden states, but got None")
        hidden = _compact_accept_to_front(hidden[: bs * n], outputs.accept_index, bs, num_draft_tokens=n)
        hidden = hidden.view(bs, n, -1)[:, :block].reshape(bs * block, -1)  # accepted path first
        cache_loc = self._draft_write_ids(kv_loc_plan).view(bs, n)[:, :block].contiguous()
        self._append_target_hidden_to_draft_kv_by_loc(
            target_hidden=hidden,
            cache_loc=cache_loc.reshape(-1),
            cache_loc_2d=cache_loc,
            positions=(prefix_lens.to(torch.int64).unsqueeze(1) + self._block_pos_offsets).reshape(-1),
            commit_lens=paths.commit_lens,
        )
        logits_output.hidden_states = None

        next_draft_input = self._make_next_draft_input_decode(bonus_tokens=paths.bonus, new_seq_lens=new_seq_lens)
        return GenerationBatchResult(
            logits_output=logits_output,
            next_token_ids=out_tokens.reshape(-1),
            accept_lens=paths.commit_lens,
            can_run_cuda_graph=target_out.can_run_cuda_graph,
            next_draft_input=next_draft_input,
            speculative_num_draft_tokens=n,
            speculative_output_stride=block,
            new_seq_lens=new_seq_lens,
            routed_experts_output=target_out.routed_experts_output,
            indexer_topk_output=target_out.indexer_topk_output,
        )
