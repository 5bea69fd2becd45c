"""Make SGLang's target-verify CUDA graphs carry the tree mask.

`DecodeCudaGraphRunner.get_spec_info` builds the spec input a verify graph is captured with. For the DFlash
family it passes `custom_mask=None` on triton / flashinfer / fa3 (DFlash verifies a causal chain), and the
Triton backend then captures a graph that ignores any mask replayed later: a tree would silently verify as
a chain. The wrapper below gives DDTREE's target runner (not the drafter's, whose block is non-causal
without a mask) the runner's mask buffer, as SGLang does for EAGLE and NGRAM trees. At replay the backend
copies the verify input's mask into that buffer.

Installed from the worker's `__init__`, which SGLang runs before it captures the target graphs.
"""

from __future__ import annotations

import functools
from typing import Any

from ddtree.sglang import ALGORITHM

_MARK = "__ddtree_tree_mask__"


def _is_ddtree(spec_algorithm: Any) -> bool:
    return getattr(spec_algorithm, "name", None) == ALGORITHM


def install() -> None:
    """Wrap `DecodeCudaGraphRunner.get_spec_info` once per process (idempotent)."""
    from sglang.srt.model_executor.runner.decode_cuda_graph_runner import DecodeCudaGraphRunner

    original = DecodeCudaGraphRunner.get_spec_info
    if getattr(original, _MARK, False):
        return

    @functools.wraps(original)
    def get_spec_info(self: Any, num_tokens: int) -> Any:
        spec_info = original(self, num_tokens)
        runner = self.model_runner
        if spec_info is not None and _is_ddtree(runner.spec_algorithm) and not runner.is_draft_worker:
            spec_info.custom_mask = self.buffers.custom_mask
        return spec_info

    setattr(get_spec_info, _MARK, True)
    DecodeCudaGraphRunner.get_spec_info = get_spec_info
