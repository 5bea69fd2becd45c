"""DDTree as a speculative-algorithm plugin of the released SGLang 0.5.23 (no fork).

- `plugin`: `register()` (the `sglang.srt.plugins` entry point), the spec class, server-args handling.
- `glue`: pure tensor functions between the project's tree and SGLang's kernels (candidates, positions,
  the verify mask, accept-index -> accepted nodes / emitted tokens / KV keep-list, per-row kernel merge).
- `kernel_reference`: a torch reference of `tree_speculative_sampling_target_only`'s exact contract.
- `graph_hook`: makes the target-verify CUDA graphs carry the tree mask.
- `worker`: the decode worker, a subclass of SGLang's `DFlashWorkerV2` (GPU only).

Everything here imports sglang lazily except `plugin`, which SGLang itself imports.
"""

ALGORITHM = "DDTREE"  # the --speculative-algorithm name (shared by the plugin and the graph hook)
