"""ddtree.engine: the in-process decoding engine (`ar`, `dflash`, `ddtree`) and its request types."""

from __future__ import annotations

from ddtree._lazy import lazy_getattr
from ddtree.engine.types import METHODS, STAGES, GenerationOutput, GenerationRequest

__all__ = ["METHODS", "STAGES", "DecodingEngine", "GenerationOutput", "GenerationRequest"]


# The engine pulls in torch + transformers; keep `import ddtree.engine` light for the request types.
__getattr__ = lazy_getattr("ddtree.engine", {"DecodingEngine": "ddtree.engine.engine"})
