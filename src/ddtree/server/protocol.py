"""Request parsing and validation for the SGLang-dialect endpoints (pure functions, no I/O).

Every problem with a request raises `RequestError(field, message)`; the app turns it into an
HTTP 400 whose message starts with the offending field's name.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Protocol

from ddtree.engine.types import METHODS, GenerationRequest

DEFAULT_MAX_NEW_TOKENS = 128  # SGLang's default for /generate
DEFAULT_COMPLETION_MAX_TOKENS = 16  # OpenAI's default for /v1/completions


class TokenizerLike(Protocol):
    """What the server needs from a (Hugging Face) tokenizer."""

    eos_token_id: int | None

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int], skip_special_tokens: bool = ...) -> str: ...

    def __len__(self) -> int: ...


class RequestError(ValueError):
    """A client error: the request names a bad field (HTTP 400)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


@dataclass(frozen=True)
class Limits:
    """What a request is checked against."""

    max_context: int  # prompt + new tokens must fit
    vocab_size: int  # valid ids are [0, vocab_size)


@dataclass(frozen=True)
class ParsedGenerate:
    """A validated /generate (or /v1/completions) request, ready for the engine."""

    request: GenerationRequest
    rid: str | None
    method: str | None  # per-request override, None = server default
    budget: int | None
    stream: bool = False  # /generate only: the whole result as one server-sent event, then [DONE]


def parse_json_body(body: bytes) -> dict[str, Any]:
    """Decode a JSON object body; malformed JSON or a non-object names the field `body`."""
    try:
        payload = json.loads(body.decode("utf-8") if body else "")
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RequestError("body", f"malformed JSON ({exc})") from None
    if not isinstance(payload, dict):
        raise RequestError("body", f"expected a JSON object, got {type(payload).__name__}")
    return payload


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)) and math.isfinite(value)


def check_temperature(value: Any, field: str = "temperature") -> float:
    if not _is_number(value) or value < 0:
        raise RequestError(field, f"must be a finite number >= 0, got {value!r}")
    return float(value)


def check_top_p(value: Any, field: str = "top_p") -> float:
    if not _is_number(value) or not 0.0 < value <= 1.0:
        raise RequestError(field, f"must be a number in (0, 1], got {value!r}")
    return float(value)


def check_top_k(value: Any, field: str = "top_k") -> int:
    if not _is_int(value):
        raise RequestError(field, f"must be an integer (-1 or <= 0 disables it), got {value!r}")
    return int(value)


def check_token_ids(value: Any, field: str, vocab_size: int, *, allow_empty: bool) -> list[int]:
    if not isinstance(value, list) or not all(_is_int(v) for v in value):
        raise RequestError(field, "must be a list of integer token ids")
    if not value and not allow_empty:
        raise RequestError(field, "must not be empty")
    bad = [v for v in value if not 0 <= v < vocab_size]
    if bad:
        raise RequestError(field, f"ids outside the vocabulary [0, {vocab_size}): {bad[:5]}")
    return list(value)


def check_stop(value: Any, field: str = "stop") -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value] if value else []
    if isinstance(value, list) and all(isinstance(s, str) for s in value):
        return [s for s in value if s]
    raise RequestError(field, "must be a string or a list of strings")


def check_method(value: Any, field: str = "method") -> str:
    if value not in METHODS:
        raise RequestError(field, f"unknown method {value!r}; expected one of {', '.join(METHODS)}")
    return str(value)


def check_budget(value: Any, field: str = "budget") -> int:
    if not _is_int(value) or value < 1:
        raise RequestError(field, f"must be an integer >= 1, got {value!r}")
    return int(value)


def check_max_new_tokens(value: Any, prompt_len: int, limits: Limits, field: str) -> int:
    if not _is_int(value) or value < 1:
        raise RequestError(field, f"must be an integer >= 1, got {value!r}")
    if prompt_len + value > limits.max_context:
        raise RequestError(
            field,
            f"{value} new tokens after a {prompt_len}-token prompt exceed the context of "
            f"{limits.max_context} tokens",
        )
    return int(value)


def default_length(default: int, prompt_len: int, limits: Limits) -> int:
    """A length the client did not ask for is clipped to the room left; an explicit one is checked."""
    return max(1, min(default, limits.max_context - prompt_len))


def check_prompt_length(ids: list[int], limits: Limits, field: str) -> None:
    if len(ids) >= limits.max_context:
        raise RequestError(
            field, f"prompt of {len(ids)} tokens leaves no room in the context of {limits.max_context} tokens"
        )


def encode_text(text: Any, tokenizer: TokenizerLike, limits: Limits, field: str) -> list[int]:
    if not isinstance(text, str):
        raise RequestError(field, f"must be a string (batched prompts are not supported), got {type(text).__name__}")
    ids = list(tokenizer.encode(text))
    if not ids:
        raise RequestError(field, "encodes to no tokens")
    return ids


def stop_token_ids_for(user_ids: list[int], tokenizer: TokenizerLike, ignore_eos: bool) -> list[int]:
    """SGLang stops at the tokenizer's EOS unless `ignore_eos`; user ids are added to it."""
    ids = list(user_ids)
    eos = getattr(tokenizer, "eos_token_id", None)
    if not ignore_eos and _is_int(eos) and eos not in ids:
        ids.append(int(eos))
    return ids


def _optional_seed(value: Any, field: str) -> int | None:
    if value is None:
        return None
    if not _is_int(value):
        raise RequestError(field, f"must be an integer, got {value!r}")
    return int(value)


def _overrides(payload: dict[str, Any]) -> tuple[str | None, int | None]:
    method = check_method(payload["method"]) if payload.get("method") is not None else None
    budget = check_budget(payload["budget"]) if payload.get("budget") is not None else None
    return method, budget


def parse_generate(payload: dict[str, Any], tokenizer: TokenizerLike, limits: Limits) -> ParsedGenerate:
    """Validate a native `/generate` body."""
    has_text, has_ids = payload.get("text") is not None, payload.get("input_ids") is not None
    if has_text == has_ids:
        raise RequestError("text", "send exactly one of `text` or `input_ids`")
    if has_text:
        prompt_field = "text"
        input_ids = encode_text(payload["text"], tokenizer, limits, "text")
    else:
        prompt_field = "input_ids"
        input_ids = check_token_ids(payload["input_ids"], "input_ids", limits.vocab_size, allow_empty=False)
    check_prompt_length(input_ids, limits, prompt_field)

    sp = payload.get("sampling_params")
    sp = {} if sp is None else sp
    if not isinstance(sp, dict):
        raise RequestError("sampling_params", "must be a JSON object")
    max_new = check_max_new_tokens(
        sp.get("max_new_tokens", default_length(DEFAULT_MAX_NEW_TOKENS, len(input_ids), limits)),
        len(input_ids), limits, "sampling_params.max_new_tokens",
    )
    ignore_eos = sp.get("ignore_eos", False)
    if not isinstance(ignore_eos, bool):
        raise RequestError("sampling_params.ignore_eos", f"must be a boolean, got {ignore_eos!r}")
    user_stop_ids = check_token_ids(
        sp.get("stop_token_ids") or [], "sampling_params.stop_token_ids", limits.vocab_size, allow_empty=True
    )
    request = GenerationRequest(
        input_ids=input_ids,
        max_new_tokens=max_new,
        temperature=check_temperature(sp.get("temperature", 1.0), "sampling_params.temperature"),
        top_k=check_top_k(sp.get("top_k", -1), "sampling_params.top_k"),
        top_p=check_top_p(sp.get("top_p", 1.0), "sampling_params.top_p"),
        stop_token_ids=stop_token_ids_for(user_stop_ids, tokenizer, ignore_eos),
        stop_strings=check_stop(sp.get("stop"), "sampling_params.stop"),
        seed=_optional_seed(sp.get("sampling_seed"), "sampling_params.sampling_seed"),
    )
    rid = payload.get("rid")
    if rid is not None and not isinstance(rid, str):
        raise RequestError("rid", f"must be a string, got {type(rid).__name__}")
    stream = payload.get("stream", False)
    if not isinstance(stream, bool):
        raise RequestError("stream", f"must be a boolean, got {stream!r}")
    method, budget = _overrides(payload)
    return ParsedGenerate(request=request, rid=rid, method=method, budget=budget, stream=stream)


def parse_completion(payload: dict[str, Any], tokenizer: TokenizerLike, limits: Limits) -> ParsedGenerate:
    """Validate an OpenAI-style `/v1/completions` body (non-streaming, n = 1)."""
    if payload.get("prompt") is None:
        raise RequestError("prompt", "is required")
    input_ids = encode_text(payload["prompt"], tokenizer, limits, "prompt")
    check_prompt_length(input_ids, limits, "prompt")
    if payload.get("stream"):
        raise RequestError("stream", "streaming is not supported by the reference server")
    if payload.get("n", 1) != 1:
        raise RequestError("n", "only n = 1 is supported")
    max_tokens = check_max_new_tokens(
        payload.get("max_tokens", default_length(DEFAULT_COMPLETION_MAX_TOKENS, len(input_ids), limits)),
        len(input_ids), limits, "max_tokens",
    )
    request = GenerationRequest(
        input_ids=input_ids,
        max_new_tokens=max_tokens,
        temperature=check_temperature(payload.get("temperature", 1.0)),
        top_k=check_top_k(payload.get("top_k", -1)),
        top_p=check_top_p(payload.get("top_p", 1.0)),
        stop_token_ids=stop_token_ids_for([], tokenizer, bool(payload.get("ignore_eos", False))),
        stop_strings=check_stop(payload.get("stop")),
        seed=_optional_seed(payload.get("seed"), "seed"),
    )
    method, budget = _overrides(payload)
    return ParsedGenerate(request=request, rid=None, method=method, budget=budget)


def trim_at_stop(text: str, stop_strings: list[str]) -> tuple[str, str | None]:
    """Cut `text` before the earliest stop string (SGLang does not return it); returns the match too."""
    best, matched = len(text), None
    for stop in stop_strings:
        pos = text.find(stop)
        if 0 <= pos < best:
            best, matched = pos, stop
    return text[:best], matched
