"""SGLang's `move_accept_tokens_to_target_kvcache`, fed the glue's keep-list, compacts each request's
accepted tree path to the front of its verify window (the slots the next round's prefix covers)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("sglang")
pytestmark = pytest.mark.sglang_kernels

from ddtree.sglang.glue import KernelOutputs, accepted_paths  # noqa: E402


def test_accepted_path_kv_moves_to_the_window_front():
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool
    from sglang.srt.speculative.spec_utils import move_accept_tokens_to_target_kvcache

    bs, n, steps, size = 3, 6, 4, 40
    pool = MHATokenToKVPool(
        size=size, page_size=1, dtype=torch.float32, head_num=2, head_dim=4, layer_num=2, device="cpu",
        enable_memory_saver=False,
    )
    pool.use_native_move_kv_cache = True  # the CUDA copy kernel takes raw pointers; the torch move on CPU
    for layer in range(2):
        slots = torch.arange(size + 1, dtype=torch.float32).view(-1, 1, 1)
        pool.k_buffer[layer].copy_(slots + 1000 * layer)
        pool.v_buffer[layer].copy_(-slots - 1000 * layer)
    g = torch.Generator().manual_seed(0)
    window = torch.randperm(size, generator=g)[: bs * n] + 1  # [bs * N] physical slots (0 is the pad slot)

    # request 0 accepts nodes 0 -> 2 -> 5, request 1 only the root, request 2 the chain 0 -> 1 -> 3 -> 4
    accept_local = torch.tensor([[0, 2, 5, -1], [0, -1, -1, -1], [0, 1, 3, 4]])
    k = torch.tensor([2, 0, 3], dtype=torch.int32)
    flat = torch.where(accept_local >= 0, accept_local + torch.arange(bs).unsqueeze(1) * n, -1).to(torch.int32)
    paths = accepted_paths(KernelOutputs(torch.zeros(bs * n, dtype=torch.int32), flat, k), n)
    before_k = [b.clone() for b in pool.k_buffer]
    before_v = [b.clone() for b in pool.v_buffer]

    batch = SimpleNamespace(seq_lens=torch.tensor([10, 4, 7]), out_cache_loc=window.clone())
    allocator = SimpleNamespace(get_kvcache=lambda: pool)
    move_accept_tokens_to_target_kvcache(batch, paths.keep_index, paths.accept_len, allocator)

    win = window.view(bs, n)
    for b in range(bs):
        for j in range(int(k[b]) + 1):
            src = win[b, accept_local[b, j]]
            dst = win[b, j]
            for layer in range(2):
                assert torch.equal(pool.k_buffer[layer][dst], before_k[layer][src])
                assert torch.equal(pool.v_buffer[layer][dst], before_v[layer][src])
    untouched = torch.ones(size + 1, dtype=torch.bool)
    for b in range(bs):
        untouched[win[b, : int(k[b]) + 1]] = False
    for layer in range(2):
        assert torch.equal(pool.k_buffer[layer][untouched], before_k[layer][untouched])
