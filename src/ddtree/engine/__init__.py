"""ddtree.engine: the in-process decoding engines (`ar`, `dflash`, `ddtree`) and their request types.

`make_engine` picks, once: `BatchedEngine` (static slot caches, continuous batching, CUDA graphs on a GPU) for
Qwen3 / Qwen2 / Llama-layout targets, `DecodingEngine` (Hugging Face modules, one request at a time) otherwise."""

from __future__ import annotations

from ddtree._lazy import lazy_getattr
from ddtree.engine.types import METHODS, STAGES, GenerationOutput, GenerationRequest

__all__ = ["METHODS", "STAGES", "BatchedEngine", "DecodingEngine", "GenerationOutput", "GenerationRequest", "make_engine"]


# The engine pulls in torch + transformers; keep `import ddtree.engine` light for the request types.
__getattr__ = lazy_getattr("ddtree.engine", {"DecodingEngine": "ddtree.engine.engine",
                                             "BatchedEngine": "ddtree.engine.batched",
                                             "make_engine": "ddtree.engine.batched"})
