"""Registers DDTREE with SGLang 0.5.23: the spec class, server-args handling and the worker factory.

SGLang loads `register` through the `sglang.srt.plugins` entry point in every one of its processes
(launcher, scheduler, detokenizer) and swallows any exception a plugin raises, so `register` logs its
own failure at WARNING. Usage:

    python -m sglang.launch_server --model-path T --speculative-algorithm DDTREE \
        --speculative-draft-model-path D --speculative-num-draft-tokens <budget + 1> --attention-backend triton

Server arguments (`--speculative-num-draft-tokens` is the only DDTree knob; a plugin cannot add fields):
N = budget + 1 tree nodes including the root, N >= the drafter's block size. The verify forward needs an
attention backend that honours a tree mask: triton or flashinfer (fa3 ignores the mask at topk 1 and
trtllm_mha is linear only, so the tree would silently verify as a chain). Overlap scheduling is off (the
decode path syncs with the host), page size 1, acceptance thresholds 1.0 (anything lower is lossy).
"""

from __future__ import annotations

import json
import logging
from typing import Any

from ddtree.sglang import ALGORITHM

logger = logging.getLogger(__name__)

TREE_MASK_BACKENDS = ("triton", "flashinfer")
REFUSED_BACKENDS = {
    "fa3": "fa3 ignores a custom attention mask at topk 1",
    "trtllm_mha": "trtllm_mha verifies linear chains only",
}
# Logits rows per verify step are max_running_requests x N: the default keeps them near DFlash's 48 x 16 x 5.
DEFAULT_MAX_VERIFY_ROWS = 4096
DFLASH_DEFAULT_MAX_RUNNING_REQUESTS = 48


def default_max_running_requests(n: int) -> int:
    """Running requests for N verify nodes each: DFlash's 48, fewer when N is large (verify rows ~ 4096)."""
    return max(1, min(DFLASH_DEFAULT_MAX_RUNNING_REQUESTS, DEFAULT_MAX_VERIFY_ROWS // n))


class DDTreeArgumentError(ValueError):
    """A server argument DDTREE cannot run with; the message says which and why."""


def _spec_class() -> type:
    """The CustomSpecAlgo subclass (built lazily: SGLang is imported only when registering)."""
    from sglang.srt.speculative.spec_registry import CustomSpecAlgo

    class DDTreeSpecAlgo(CustomSpecAlgo):
        """DDTREE answers the enum's predicates as the DFlash family: it runs on DFlash's machinery
        (V2 worker, target-verify draft forward, aux hidden-state capture, draft KV)."""

        # --- identity: DFlash family, nothing else
        def is_eagle(self) -> bool:
            return False

        def is_eagle3(self) -> bool:
            return False

        def is_frozen_kv_mtp(self) -> bool:
            return False

        def is_dflash(self) -> bool:
            return True

        def is_dflash_family(self) -> bool:
            return True

        def is_dspark(self) -> bool:
            return False

        def is_uno(self) -> bool:
            return False

        def is_standalone(self) -> bool:
            return False

        def is_ngram(self) -> bool:
            return False

        # --- capabilities
        def supports_target_verify_for_draft(self) -> bool:
            return True  # the drafter's block forward runs in TARGET_VERIFY mode, as DFlash's does

        def supports_prefill_shared_read_done(self) -> bool:
            return True  # the draft KV append after a target prefill writes slots known before it

        def supports_mixed_chunk(self) -> bool:
            return False  # the verify width N differs from the draft block: no mixed prefill + verify

        def supports_grammar_overlap(self) -> bool:
            return False  # grammar is out of scope (v1)

        def supports_ragged_verify(self) -> bool:
            return False  # every request verifies exactly N nodes

        def has_draft_kv(self) -> bool:
            return True

        # --- the four enum methods CustomSpecAlgo lacks (the scheduler calls them at start-up)
        def carries_draft_hidden_states(self) -> bool:
            return False

        def create_future_map(
            self,
            device: Any,
            req_to_token_pool: Any,
            needs_cpu_seq_lens: bool = True,
            needs_confidence_relay: bool = False,
        ) -> Any:
            from sglang.srt.managers.overlap_utils import FutureMap

            return FutureMap(device, self, req_to_token_pool, needs_cpu_seq_lens, needs_confidence_relay)

        def need_topk(self) -> bool:
            return False

        def get_platform_worker_cls(self) -> type | None:
            return None

        # --- widths: the drafter runs one block, the target verifies N nodes
        def get_num_tokens_per_req_for_target_verify(self, num_draft_tokens: int, is_draft_worker: bool) -> int:
            if is_draft_worker:
                from sglang.srt.runtime_context import get_spec

                block = get_spec().speculative_dflash_block_size
                if block is None:
                    raise RuntimeError("DDTREE: speculative_dflash_block_size was not resolved at start-up")
                return int(block)
            return int(num_draft_tokens)

        def handle_server_args(self, server_args: Any) -> None:
            handle_server_args(server_args)

    DDTreeSpecAlgo.__name__ = DDTreeSpecAlgo.__qualname__ = "DDTreeSpecAlgo"
    return DDTreeSpecAlgo


def _worker_factory(server_args: Any) -> type:
    from ddtree.sglang.worker import DDTreeWorker

    return DDTreeWorker


def register() -> None:
    """Entry point: register DDTREE once per process (idempotent); a failure is logged at WARNING."""
    try:
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
        from sglang.srt.speculative.spec_registry import get_spec

        if get_spec(ALGORITHM) is not None:
            return
        SpeculativeAlgorithm.register(
            ALGORITHM,
            supports_overlap=False,
            validate_server_args=validate_server_args,
            spec_class=_spec_class(),
        )(_worker_factory)
    except Exception as exc:  # SGLang logs plugin errors at a level a user misses; say it plainly
        logger.warning("ddtree: registering the DDTREE speculative algorithm with SGLang failed: %r", exc)


# --------------------------------------------------------------------------------------------------------
# Server arguments. Both callbacks receive SGLang's recorder (reads = the resolution so far, plain attribute
# writes = declarations) or, in SGLang's own unit paths, a plain object.
# --------------------------------------------------------------------------------------------------------


def _raw_input(cfg: Any, name: str) -> Any:
    """The value the user passed for field `name` (before any default was resolved), when knowable."""
    try:
        from sglang.srt.arg_groups.model_override_base import record_of

        view = object.__getattribute__(cfg, "_cfg")  # the recorder's resolving view
        return getattr(record_of(view), name)
    except (AttributeError, ImportError):
        return getattr(cfg, name)


def drafter_block_size(cfg: Any) -> int:
    """The drafter's block size from `--speculative-dflash-block-size` or the draft model's config."""
    if cfg.speculative_dflash_block_size is not None:
        block = int(cfg.speculative_dflash_block_size)
    else:
        from sglang.srt.speculative.dflash_utils import parse_dflash_draft_config
        from sglang.srt.utils.hf_transformers_utils import get_config

        draft_config = get_config(
            cfg.speculative_draft_model_path,
            trust_remote_code=cfg.trust_remote_code,
            revision=cfg.speculative_draft_model_revision,
            model_override_args=json.loads(cfg.json_model_override_args or "{}"),
        )
        parsed = parse_dflash_draft_config(draft_hf_config=draft_config).resolve_block_size(default=None)
        if parsed is None:
            raise DDTreeArgumentError(
                "DDTREE: the draft model's config has no block_size; pass --speculative-dflash-block-size"
            )
        block = int(parsed)
    if block < 2:
        raise DDTreeArgumentError(f"DDTREE: the drafter's block size must be >= 2, got {block}")
    return block


def verify_attention_backend(cfg: Any) -> str | None:
    """The backend that runs the target-verify forward (hybrid: prefill's unless the mode is decode)."""
    from sglang.srt.arg_groups.model_override_base import attention_backends_of

    prefill, decode = attention_backends_of(cfg)
    return decode if cfg.speculative_attention_mode == "decode" else prefill


def validate_server_args(cfg: Any) -> None:
    """Raise DDTreeArgumentError, naming the option and the reason, for anything DDTREE cannot run with."""
    from sglang.srt.runtime_context import attn_dp_enabled_of

    def refuse(message: str) -> None:
        raise DDTreeArgumentError(f"DDTREE: {message}")

    if not str(cfg.device).startswith("cuda"):
        refuse(f"needs a CUDA device, got --device {cfg.device!r}")
    if cfg.speculative_draft_model_path is None:
        refuse("needs --speculative-draft-model-path (a DFlash drafter)")
    if cfg.pp_size != 1:
        refuse(f"supports --pp-size 1 only, got {cfg.pp_size}")
    if attn_dp_enabled_of(cfg):
        refuse("does not support DP attention (--enable-dp-attention / --attn-dp-size > 1)")
    if bool(cfg.enable_lora) or bool(cfg.lora_paths):
        refuse("does not support LoRA (--enable-lora / --lora-paths): its verify segments assume a uniform chain width, and DDTREE verifies N tree nodes per request")
    if cfg.speculative_draft_window_size is not None:
        refuse("does not support --speculative-draft-window-size (the drafter keeps its full context)")
    if cfg.speculative_use_rejection_sampling or cfg.speculative_use_block_verification:
        refuse(
            "verifies trees with the target-only walk (lossless with deterministic drafts); "
            "drop --speculative-use-rejection-sampling / --speculative-use-block-verification"
        )
    if cfg.speculative_adaptive:
        refuse("does not support --speculative-adaptive (the budget is fixed at start-up)")
    if float(cfg.speculative_accept_threshold_single) != 1.0 or float(cfg.speculative_accept_threshold_acc) != 1.0:
        refuse(
            "needs --speculative-accept-threshold-single 1.0 and --speculative-accept-threshold-acc 1.0 "
            f"(lower thresholds are lossy), got {cfg.speculative_accept_threshold_single} and "
            f"{cfg.speculative_accept_threshold_acc}"
        )
    if cfg.page_size is not None and int(cfg.page_size) != 1:
        refuse(f"needs --page-size 1 (accepted tree nodes are scattered within the window), got {cfg.page_size}")
    if cfg.speculative_num_steps is not None and int(cfg.speculative_num_steps) != 1:
        refuse(f"drafts one block per round: --speculative-num-steps must be 1 or unset, got {cfg.speculative_num_steps}")
    if cfg.speculative_eagle_topk is not None and int(cfg.speculative_eagle_topk) != 1:
        refuse(f"builds its own tree: --speculative-eagle-topk must be 1 or unset, got {cfg.speculative_eagle_topk}")

    block = drafter_block_size(cfg)
    if cfg.speculative_num_draft_tokens is None:
        refuse(
            "needs --speculative-num-draft-tokens = tree budget + 1 (nodes including the root), "
            f">= the drafter's block size {block}"
        )
    n = int(cfg.speculative_num_draft_tokens)
    if n < block:
        refuse(
            f"--speculative-num-draft-tokens is the tree budget + 1 and must be >= the drafter's block size "
            f"{block}, got {n} (budget {n - 1})"
        )

    backend = verify_attention_backend(cfg)
    user_set = any(_raw_input(cfg, f) is not None for f in ("attention_backend", "prefill_attention_backend", "decode_attention_backend"))
    if backend not in TREE_MASK_BACKENDS and user_set:
        why = REFUSED_BACKENDS.get(backend, "it is not known to honour a custom attention mask in target verify")
        refuse(
            f"the target-verify attention backend must honour the tree mask ({' or '.join(TREE_MASK_BACKENDS)}); "
            f"got {backend!r}: {why}, so the tree would silently verify as a chain. Pass --attention-backend triton"
        )
    draft_backend = _raw_input(cfg, "speculative_draft_attention_backend")
    from sglang.srt.arg_groups.choices import DRAFT_ATTENTION_BACKEND_CHOICES

    if draft_backend is not None and draft_backend not in DRAFT_ATTENTION_BACKEND_CHOICES:
        refuse(f"--speculative-draft-attention-backend {draft_backend!r} is not one of {DRAFT_ATTENTION_BACKEND_CHOICES}")


def handle_server_args(cfg: Any) -> None:
    """Declare DDTREE's resolved arguments (plain attribute writes on SGLang's recorder).

    Runs after `validate_server_args`, so every value read here is already known to be acceptable.
    """
    block = drafter_block_size(cfg)
    n = int(cfg.speculative_num_draft_tokens)
    cfg.speculative_dflash_block_size = block
    cfg.speculative_num_draft_tokens = n
    cfg.speculative_num_steps = 1
    cfg.speculative_eagle_topk = 1
    cfg.page_size = 1
    cfg.disable_overlap_schedule = True  # supports_overlap=False: SGLang refuses the worker otherwise

    if verify_attention_backend(cfg) not in TREE_MASK_BACKENDS:
        # validate_server_args refused a user's choice already: this is SGLang's device default (fa3 on Hopper)
        logger.warning(
            "DDTREE: switching the attention backend from %r (SGLang's default here) to 'triton': the verify "
            "forward needs a tree mask",
            verify_attention_backend(cfg),
        )
        cfg.attention_backend = "triton"
        cfg.prefill_attention_backend = None
        cfg.decode_attention_backend = None
    if _raw_input(cfg, "speculative_draft_attention_backend") is None:
        cfg.speculative_draft_attention_backend = verify_attention_backend(cfg)
    if _raw_input(cfg, "max_running_requests") is None:
        cfg.max_running_requests = default_max_running_requests(n)
        logger.warning(
            "DDTREE: max running requests defaults to %d for N = %d verify nodes per request; set "
            "--max-running-requests to override",
            cfg.max_running_requests,
            n,
        )
