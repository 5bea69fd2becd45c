"""ddtree.models: the DFlash drafter, target + drafter pair loading, and the embedded pair trainer."""

from __future__ import annotations

from ddtree._lazy import lazy_getattr

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
__getattr__ = lazy_getattr("ddtree.models", _EXPORTS)
