"""Argument and request checks shared by both engines (ValueError naming the field)."""

from __future__ import annotations

import math

import torch

from ddtree.engine.types import METHODS, GenerationRequest

_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
           "float16": torch.float16, "fp16": torch.float16}


def default_dtype(device: torch.device) -> torch.dtype:
    """float32 on CPU (token identity with plain decoding), bfloat16 on accelerators."""
    return torch.float32 if device.type == "cpu" else torch.bfloat16


def resolve_dtype(dtype: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    if dtype is None:
        return default_dtype(device)
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in _DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; expected one of {sorted(_DTYPES)}")
    return _DTYPES[dtype]


def check_method(method: str) -> None:
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; expected one of {METHODS}")


def check_budget(budget: int) -> None:
    if not isinstance(budget, int) or isinstance(budget, bool) or budget < 1:
        raise ValueError(f"budget must be an int >= 1, got {budget!r}")


def check_request_fields(request: GenerationRequest, vocab_size: int, *, has_tokenizer: bool) -> None:
    """Token ids, max_new_tokens, sampling parameters and stop strings (the context limit is the engine's)."""
    ids = request.input_ids
    if not isinstance(ids, (list, tuple)) or len(ids) == 0:
        raise ValueError("input_ids must be a non-empty list of token ids")
    if any((not isinstance(t, int)) or t < 0 or t >= vocab_size for t in ids):
        raise ValueError(f"input_ids must be ints in [0, {vocab_size})")
    if not isinstance(request.max_new_tokens, int) or request.max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an int >= 1, got {request.max_new_tokens!r}")
    t = request.temperature
    if not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0:
        raise ValueError(f"temperature must be a finite number >= 0, got {t!r}")
    if not isinstance(request.top_k, int):
        raise ValueError(f"top_k must be an int (<= 0 disables it), got {request.top_k!r}")
    p = request.top_p
    if not isinstance(p, (int, float)) or not (0.0 < p <= 1.0):
        raise ValueError(f"top_p must be in (0, 1], got {p!r}")
    if request.stop_strings and not has_tokenizer:
        raise ValueError("stop_strings need a tokenizer; this pair has none")
