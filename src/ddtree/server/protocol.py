"""Request parsing and validation for the SGLang-dialect endpoints (pure functions, no I/O).

Every problem with a request raises `RequestError(field, message)`; the app turns it into an
HTTP 400 whose message starts with the offending field's name. Honest parameters: a field the
server knows but does not implement is accepted only at its neutral value (the one that changes
nothing, e.g. `repetition_penalty: 1.0`), so SGLang's own clients, which send some of them at their
defaults, work; any other value, and any field the server does not know, is a 400 naming it.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Protocol

from ddtree.engine.types import DEFAULT_MAX_NEW_TOKENS, METHODS, GenerationRequest

DEFAULT_COMPLETION_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
MAX_N = 16  # samples per request (`n`), decoded one after another
MAX_STOP_STRINGS = 32
MAX_STOP_STRING_CHARS = 256
MAX_STOP_TOKEN_IDS = 1024
SEED_RANGE = 2**64  # torch generators take seeds in [0, 2**64)


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
    max_budget: int = 64  # per-request `budget` overrides are bounded by this
    methods: tuple[str, ...] = METHODS  # what the loaded pair can run (`ar` only without a drafter)


@dataclass(frozen=True)
class ParsedGenerate:
    """A validated /generate (or /v1/completions) request, ready for the engine."""

    request: GenerationRequest
    rid: str | None
    method: str | None  # per-request override, None = server default
    budget: int | None
    stream: bool = False  # server-sent events, one per decoding round that committed tokens
    n: int = 1  # independent samples, decoded one after another
    skip_special_tokens: bool = True  # how output ids are rendered as text
    echo: bool = False  # /v1/completions: the prompt is prepended to the text
    include_usage: bool = False  # /v1/completions stream: a final usage-only chunk


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
        value = [value]
    if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
        raise RequestError(field, "must be a string or a list of strings")
    if len(value) > MAX_STOP_STRINGS or any(len(s) > MAX_STOP_STRING_CHARS for s in value):
        raise RequestError(
            field, f"at most {MAX_STOP_STRINGS} strings of at most {MAX_STOP_STRING_CHARS} characters"
        )
    return [s for s in value if s]


def check_method(value: Any, field: str = "method") -> str:
    if value not in METHODS:
        raise RequestError(field, f"unknown method {value!r}; expected one of {', '.join(METHODS)}")
    return str(value)


def check_budget(value: Any, field: str = "budget", max_budget: int | None = None) -> int:
    if not _is_int(value) or value < 1:
        raise RequestError(field, f"must be an integer >= 1, got {value!r}")
    if max_budget is not None and value > max_budget:
        raise RequestError(field, f"{value} exceeds the server's maximum of {max_budget} (--max-budget)")
    return int(value)


def check_n(value: Any, field: str = "n") -> int:
    if not _is_int(value) or not 1 <= value <= MAX_N:
        raise RequestError(field, f"must be an integer in [1, {MAX_N}], got {value!r}")
    return int(value)


def check_bool(value: Any, field: str) -> bool:
    if not isinstance(value, bool):
        raise RequestError(field, f"must be a boolean, got {value!r}")
    return value


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
    if not _is_int(value) or not 0 <= value < SEED_RANGE:
        raise RequestError(field, f"must be an integer in [0, 2**64), got {value!r}")
    return int(value)


def sample_seed(seed: int | None, index: int) -> int | None:
    """Seed of the `index`-th of `n` samples: distinct samples, reproducible when a seed is given."""
    return None if seed is None else (seed + index) % SEED_RANGE


def _overrides(payload: dict[str, Any], limits: Limits) -> tuple[str | None, int | None]:
    method = None
    if payload.get("method") is not None:
        method = check_method(payload["method"])
        if method not in limits.methods:
            raise RequestError("method", f"{method!r} needs a drafter; this server's pair has none")
    budget = None
    if payload.get("budget") is not None:
        budget = check_budget(payload["budget"], "budget", limits.max_budget)
    return method, budget


# ------------------------------------------------------------------------------- honest parameters
def _is_neutral(value: Any, neutral: tuple[Any, ...]) -> bool:
    # `0 == False` in Python: compare types too, so `min_p: false` is not taken for 0.0
    return any(value == n and (isinstance(value, bool) == isinstance(n, bool)) for n in neutral)


_EMPTY = (None, "", [], {})
# known to SGLang, not implemented here: accepted only at a value that changes nothing
UNSUPPORTED_SAMPLING = {
    "min_p": (None, 0, 0.0),
    "frequency_penalty": (None, 0, 0.0),
    "presence_penalty": (None, 0, 0.0),
    "repetition_penalty": (None, 1, 1.0),
    "min_new_tokens": (None, 0),
    "json_schema": _EMPTY,
    "regex": _EMPTY,
    "ebnf": _EMPTY,
    "structural_tag": _EMPTY,
    "stop_regex": _EMPTY,
    "logit_bias": _EMPTY,
    "custom_params": _EMPTY,
    "watermark": _EMPTY,
    "no_stop_trim": (None, False),
    "spaces_between_special_tokens": (None, True),
    "beam_width": (None, 1),
    "stream_interval": (None, 1),  # every round is streamed
}
IMPLEMENTED_SAMPLING = frozenset({
    "max_new_tokens", "temperature", "top_p", "top_k", "stop", "stop_token_ids", "ignore_eos",
    "sampling_seed", "skip_special_tokens", "n",
})
UNSUPPORTED_GENERATE = {
    "return_logprob": (None, False),
    "top_logprobs_num": (None, 0),
    "token_ids_logprob": _EMPTY,
    "return_hidden_states": (None, False),
    "return_routed_experts": (None, False),
    "return_indexer_topk": (None, False),
    "return_prompt_token_ids": (None, False),
    "return_entropy": (None, False),
    "return_sampling_mask": (None, False),
    "lora_path": _EMPTY,
    "lora_id": _EMPTY,
    "input_embeds": _EMPTY,
    "image_data": _EMPTY,
    "video_data": _EMPTY,
    "audio_data": _EMPTY,
    "session_params": _EMPTY,
    "custom_logit_processor": _EMPTY,
    "bootstrap_host": _EMPTY,
    "bootstrap_port": _EMPTY,
    "bootstrap_room": _EMPTY,
}
# bookkeeping that does not change what is generated (logging, routing, priorities)
IGNORED_GENERATE = frozenset({
    "logprob_start_len", "return_text_in_logprobs", "log_metrics", "no_logs", "custom_labels", "priority",
    "routing_key", "extra_key", "cache_salt", "conversation_id", "data_parallel_rank", "routed_dp_rank",
    "routed_experts_start_len", "session_id", "modalities",
})
IMPLEMENTED_GENERATE = frozenset({"text", "input_ids", "sampling_params", "rid", "stream", "method", "budget"})

UNSUPPORTED_COMPLETION = {
    **{k: UNSUPPORTED_SAMPLING[k] for k in (
        "min_p", "frequency_penalty", "presence_penalty", "repetition_penalty", "json_schema", "regex", "ebnf",
        "stop_regex", "logit_bias", "custom_params", "watermark", "no_stop_trim")},
    "min_tokens": (None, 0),
    "logprobs": (None,),
    "suffix": _EMPTY,
    "response_format": _EMPTY,
    "lora_path": _EMPTY,
    "return_hidden_states": (None, False),
    "return_routed_experts": (None, False),
    "return_token_ids": (None, False),
    "return_cached_tokens_details": (None, False),
    "return_spec_tokens_details": (None, False),
    "custom_logit_processor": _EMPTY,
    "session_params": _EMPTY,
    "mm_processor_kwargs": _EMPTY,
    "images_config": _EMPTY,
    "bootstrap_host": _EMPTY,
    "bootstrap_port": _EMPTY,
    "bootstrap_room": _EMPTY,
}
IGNORED_COMPLETION = frozenset({
    "user", "priority", "extra_key", "cache_salt", "custom_labels", "routed_dp_rank", "data_parallel_rank",
    "disagg_prefill_dp_rank", "session_id", "routed_experts_start_len",
})
IMPLEMENTED_COMPLETION = frozenset({
    "model", "prompt", "max_tokens", "temperature", "top_p", "top_k", "stop", "stop_token_ids", "seed", "n",
    "best_of", "stream", "stream_options", "ignore_eos", "skip_special_tokens", "echo", "rid", "method", "budget",
})


def check_parameters(
    payload: dict[str, Any],
    implemented: frozenset[str],
    unsupported: dict[str, tuple[Any, ...]],
    ignored: frozenset[str] = frozenset(),
    prefix: str = "",
) -> None:
    """400 for an unknown field, or for a known unimplemented one set to anything but its neutral value."""
    for key, value in payload.items():
        if key in implemented or key in ignored:
            continue
        name = f"{prefix}{key}"
        if key in unsupported:
            if not _is_neutral(value, unsupported[key]):
                raise RequestError(name, f"is not supported by the reference server (got {value!r})")
        else:
            raise RequestError(name, "is not a parameter the reference server knows")


def _stop_token_ids(value: Any, field: str, limits: Limits) -> list[int]:
    ids = check_token_ids(value or [], field, limits.vocab_size, allow_empty=True)
    if len(ids) > MAX_STOP_TOKEN_IDS:
        raise RequestError(field, f"at most {MAX_STOP_TOKEN_IDS} ids")
    return ids


def parse_generate(payload: dict[str, Any], tokenizer: TokenizerLike, limits: Limits) -> ParsedGenerate:
    """Validate a native `/generate` body."""
    check_parameters(payload, IMPLEMENTED_GENERATE, UNSUPPORTED_GENERATE, IGNORED_GENERATE)
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
    check_parameters(sp, IMPLEMENTED_SAMPLING, UNSUPPORTED_SAMPLING, prefix="sampling_params.")

    def get(key: str, default: Any) -> Any:  # SGLang treats null as "use the default"
        value = sp.get(key)
        return default if value is None else value

    max_new = check_max_new_tokens(
        get("max_new_tokens", default_length(DEFAULT_MAX_NEW_TOKENS, len(input_ids), limits)),
        len(input_ids), limits, "sampling_params.max_new_tokens",
    )
    ignore_eos = check_bool(get("ignore_eos", False), "sampling_params.ignore_eos")
    user_stop_ids = _stop_token_ids(sp.get("stop_token_ids"), "sampling_params.stop_token_ids", limits)
    request = GenerationRequest(
        input_ids=input_ids,
        max_new_tokens=max_new,
        temperature=check_temperature(get("temperature", 1.0), "sampling_params.temperature"),
        top_k=check_top_k(get("top_k", -1), "sampling_params.top_k"),
        top_p=check_top_p(get("top_p", 1.0), "sampling_params.top_p"),
        stop_token_ids=stop_token_ids_for(user_stop_ids, tokenizer, ignore_eos),
        stop_strings=check_stop(sp.get("stop"), "sampling_params.stop"),
        seed=_optional_seed(sp.get("sampling_seed"), "sampling_params.sampling_seed"),
    )
    rid = payload.get("rid")
    if rid is not None and not isinstance(rid, str):
        raise RequestError("rid", f"must be a string, got {type(rid).__name__}")
    stream = check_bool(payload.get("stream", False), "stream")
    n = check_n(get("n", 1), "sampling_params.n")
    if n > 1 and stream:
        raise RequestError("sampling_params.n", "n > 1 is not supported with stream")
    method, budget = _overrides(payload, limits)
    return ParsedGenerate(
        request=request, rid=rid, method=method, budget=budget, stream=stream, n=n,
        skip_special_tokens=check_bool(get("skip_special_tokens", True), "sampling_params.skip_special_tokens"),
    )


def parse_completion(payload: dict[str, Any], tokenizer: TokenizerLike, limits: Limits) -> ParsedGenerate:
    """Validate an OpenAI-style `/v1/completions` body (one string prompt)."""
    check_parameters(payload, IMPLEMENTED_COMPLETION, UNSUPPORTED_COMPLETION, IGNORED_COMPLETION)
    if payload.get("prompt") is None:
        raise RequestError("prompt", "is required")
    input_ids = encode_text(payload["prompt"], tokenizer, limits, "prompt")
    check_prompt_length(input_ids, limits, "prompt")

    def get(key: str, default: Any) -> Any:
        value = payload.get(key)
        return default if value is None else value

    model = payload.get("model")
    if model is not None and not isinstance(model, str):
        raise RequestError("model", f"must be a string, got {model!r}")
    stream = check_bool(get("stream", False), "stream")
    n = check_n(get("n", 1))
    best_of = payload.get("best_of")
    if best_of is not None and best_of != n:
        raise RequestError("best_of", f"only best_of = n is supported (n = {n}), got {best_of!r}")
    if n > 1 and stream:
        raise RequestError("n", "n > 1 is not supported with stream")
    options = get("stream_options", {})
    if not isinstance(options, dict) or not set(options) <= {"include_usage"}:
        raise RequestError("stream_options", f"only {{'include_usage': bool}} is supported, got {options!r}")
    include_usage = check_bool(options.get("include_usage", False), "stream_options.include_usage")
    if include_usage and not stream:
        raise RequestError("stream_options", "only allowed with stream")
    max_tokens = check_max_new_tokens(
        get("max_tokens", default_length(DEFAULT_COMPLETION_MAX_TOKENS, len(input_ids), limits)),
        len(input_ids), limits, "max_tokens",
    )
    user_stop_ids = _stop_token_ids(payload.get("stop_token_ids"), "stop_token_ids", limits)
    request = GenerationRequest(
        input_ids=input_ids,
        max_new_tokens=max_tokens,
        temperature=check_temperature(get("temperature", 1.0)),
        top_k=check_top_k(get("top_k", -1)),
        top_p=check_top_p(get("top_p", 1.0)),
        stop_token_ids=stop_token_ids_for(user_stop_ids, tokenizer, check_bool(get("ignore_eos", False),
                                                                                "ignore_eos")),
        stop_strings=check_stop(payload.get("stop")),
        seed=_optional_seed(payload.get("seed"), "seed"),
    )
    rid = payload.get("rid")
    if rid is not None and not isinstance(rid, str):
        raise RequestError("rid", f"must be a string, got {type(rid).__name__}")
    method, budget = _overrides(payload, limits)
    return ParsedGenerate(
        request=request, rid=rid, method=method, budget=budget, stream=stream, n=n,
        skip_special_tokens=check_bool(get("skip_special_tokens", True), "skip_special_tokens"),
        echo=check_bool(get("echo", False), "echo"), include_usage=include_usage,
    )


def trim_at_stop(text: str, stop_strings: list[str]) -> tuple[str, str | None]:
    """Cut `text` before the earliest stop string (SGLang does not return it); returns the match too."""
    best, matched = len(text), None
    for stop in stop_strings:
        pos = text.find(stop)
        if 0 <= pos < best:
            best, matched = pos, stop
    return text[:best], matched
