"""ddtree.engine: the in-process decoding engine (`ar`, `dflash`, `ddtree`) and its request types."""

from __future__ import annotations

import importlib
from typing import Any

from ddtree.engine.types import METHODS, STAGES, GenerationOutput, GenerationRequest

__all__ = ["METHODS", "STAGES", "DecodingEngine", "GenerationOutput", "GenerationRequest"]


def __getattr__(name: str) -> Any:
    # The engine pulls in torch + transformers; keep `import ddtree.engine` light for the request types.
    if name == "DecodingEngine":
        return importlib.import_module("ddtree.engine.engine").DecodingEngine
    raise AttributeError(f"module 'ddtree.engine' has no attribute {name!r}")
