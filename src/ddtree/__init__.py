"""DDTree speculative decoding: draft-tree builder, retrieve encoder and lossless verifiers.

The public core API is importable from the package root; it is resolved lazily so that
`import ddtree` does not pull in the model, engine or server stacks.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS: dict[str, str] = {
    "DDTreeBuildResult": "ddtree.core.types",
    "RetrieveEncoding": "ddtree.core.types",
    "TreeAttention": "ddtree.core.types",
    "VerifyResult": "ddtree.core.types",
    "CommitResult": "ddtree.core.types",
    "build_tree": "ddtree.core.build",
    "encode_retrieve": "ddtree.core.retrieve",
    "tree_attention": "ddtree.core.attention",
    "SamplingParams": "ddtree.core.sampling",
    "process_logits": "ddtree.core.sampling",
    "verify_greedy": "ddtree.core.verify",
    "verify_sampling": "ddtree.core.verify",
    "commit": "ddtree.core.verify",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'ddtree' has no attribute {name!r}")
