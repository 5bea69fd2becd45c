"""DDTree speculative decoding: draft-tree builder, retrieve encoder and lossless verifiers.

The public core API is importable from the package root; it is resolved lazily so that
`import ddtree` does not pull in the model, engine or server stacks.
"""

from __future__ import annotations

from ddtree._lazy import lazy_getattr

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
__getattr__ = lazy_getattr("ddtree", _EXPORTS)
