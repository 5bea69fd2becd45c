"""ddtree.models: the DFlash drafter, target + drafter pair loading, and the embedded pair trainer."""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS: dict[str, str] = {
    "DFlashConfig": "ddtree.models.drafter",
    "DFlashDrafter": "ddtree.models.drafter",
    "DrafterCache": "ddtree.models.drafter",
    "draft_logits": "ddtree.models.drafter",
    "block_input_ids": "ddtree.models.drafter",
    "ModelPair": "ddtree.models.pair",
    "load_pair": "ddtree.models.pair",
    "random_pair": "ddtree.models.pair",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'ddtree.models' has no attribute {name!r}")
