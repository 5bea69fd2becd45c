"""The target-verify CUDA graph hook: SGLang's `get_spec_info` gives a DFlash-family target runner on the
Triton backend no mask (a tree would be captured as a chain); hooked, DDTREE's target runner captures with
the runner's mask buffer, its draft runner and DFLASH itself stay unchanged."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("sglang")


class TritonAttnBackend:  # SGLang resolves the mask policy by the backend's class name
    pass


def runner(spec_algorithm, *, is_draft_worker: bool):
    return SimpleNamespace(
        model_runner=SimpleNamespace(spec_algorithm=spec_algorithm, is_draft_worker=is_draft_worker,
                                     attn_backend=TritonAttnBackend()),
        captured_req_width=65,
        buffers=SimpleNamespace(custom_mask=torch.ones(64, dtype=torch.bool)),
        _capture_ragged_verify_layout=lambda num_tokens: None,
    )


def test_verify_graphs_capture_the_tree_mask(monkeypatch):
    from sglang.srt.model_executor.runner.decode_cuda_graph_runner import DecodeCudaGraphRunner
    from sglang.srt.plugins import load_plugins
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    from ddtree.sglang import graph_hook

    load_plugins()
    ddtree = SpeculativeAlgorithm.from_string("DDTREE")
    monkeypatch.setattr(DecodeCudaGraphRunner, "get_spec_info", DecodeCudaGraphRunner.get_spec_info)  # undo after

    target = runner(ddtree, is_draft_worker=False)
    assert DecodeCudaGraphRunner.get_spec_info(target, 65).custom_mask is None  # SGLang alone: chain capture

    graph_hook.install()
    graph_hook.install()  # idempotent: one wrapper
    hooked = DecodeCudaGraphRunner.get_spec_info
    assert getattr(hooked.__wrapped__, "__ddtree_tree_mask__", False) is False
    info = hooked(target, 65)
    assert info.custom_mask is target.buffers.custom_mask
    assert info.draft_token_num == 65
    assert hooked(runner(ddtree, is_draft_worker=True), 16).custom_mask is None
    assert hooked(runner(SpeculativeAlgorithm.DFLASH, is_draft_worker=False), 16).custom_mask is None
