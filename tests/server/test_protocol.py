"""Request validation of the SGLang dialect (pure functions, no model, no HTTP)."""

from __future__ import annotations

import pytest

from ddtree.server.protocol import (
    Limits,
    RequestError,
    parse_completion,
    parse_generate,
    parse_json_body,
    trim_at_stop,
)


class CharTokenizer:
    """One id per character (ord % 64), EOS = 0: enough to exercise the parser."""

    eos_token_id = 0

    def encode(self, text: str) -> list[int]:
        return [1 + ord(c) % 63 for c in text]

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(chr(i) for i in ids)

    def __len__(self) -> int:
        return 64


TOK = CharTokenizer()
LIMITS = Limits(max_context=32, vocab_size=64)


def gen(payload: dict) -> object:
    return parse_generate(payload, TOK, LIMITS)


def field_of(payload: dict, parser=gen) -> str:
    with pytest.raises(RequestError) as info:
        parser(payload)
    assert str(info.value).startswith(info.value.field)  # the message names the field
    return info.value.field


def test_defaults_follow_sglang() -> None:
    parsed = gen({"text": "abc"})
    req = parsed.request
    assert req.input_ids == TOK.encode("abc")
    assert req.max_new_tokens == 32 - 3  # SGLang's 128, clipped to the room left in the context
    assert req.temperature == 1.0 and req.top_k == -1 and req.top_p == 1.0
    assert req.stop_token_ids == [0]  # EOS stops unless ignore_eos
    assert parsed.method is None and parsed.budget is None and parsed.rid is None


def test_sampling_params_are_passed_through() -> None:
    parsed = gen({
        "input_ids": [1, 2, 3], "rid": "r1", "method": "dflash", "budget": 8,
        "sampling_params": {"max_new_tokens": 5, "temperature": 0.7, "top_k": 4, "top_p": 0.9, "stop": "x",
                            "stop_token_ids": [7], "ignore_eos": True, "sampling_seed": 11},
    })
    req = parsed.request
    assert req.input_ids == [1, 2, 3] and req.max_new_tokens == 5
    assert (req.temperature, req.top_k, req.top_p, req.seed) == (0.7, 4, 0.9, 11)
    assert req.stop_strings == ["x"] and req.stop_token_ids == [7]
    assert (parsed.rid, parsed.method, parsed.budget) == ("r1", "dflash", 8)


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        ({}, "text"),
        ({"text": "a", "input_ids": [1]}, "text"),
        ({"text": ["a", "b"]}, "text"),
        ({"input_ids": []}, "input_ids"),
        ({"input_ids": [1, 64]}, "input_ids"),
        ({"input_ids": [-1]}, "input_ids"),
        ({"input_ids": [1.5]}, "input_ids"),
        ({"input_ids": [1] * 32}, "input_ids"),
        ({"text": "a" * 40}, "text"),
        ({"text": "a", "sampling_params": {"temperature": -0.1}}, "sampling_params.temperature"),
        ({"text": "a", "sampling_params": {"temperature": "hot"}}, "sampling_params.temperature"),
        ({"text": "a", "sampling_params": {"top_p": 0}}, "sampling_params.top_p"),
        ({"text": "a", "sampling_params": {"top_p": 1.01}}, "sampling_params.top_p"),
        ({"text": "a", "sampling_params": {"top_k": 2.5}}, "sampling_params.top_k"),
        ({"text": "a", "sampling_params": {"top_k": True}}, "sampling_params.top_k"),
        ({"text": "a", "sampling_params": {"max_new_tokens": 0}}, "sampling_params.max_new_tokens"),
        ({"text": "a", "sampling_params": {"max_new_tokens": 32}}, "sampling_params.max_new_tokens"),
        ({"text": "a", "sampling_params": {"stop": 3}}, "sampling_params.stop"),
        ({"text": "a", "sampling_params": {"stop_token_ids": [99]}}, "sampling_params.stop_token_ids"),
        ({"text": "a", "sampling_params": {"sampling_seed": "x"}}, "sampling_params.sampling_seed"),
        ({"text": "a", "sampling_params": []}, "sampling_params"),
        ({"text": "a", "method": "beam"}, "method"),
        ({"text": "a", "budget": 0}, "budget"),
        ({"text": "a", "rid": 5}, "rid"),
        ({"text": "a", "stream": "yes"}, "stream"),
    ],
)
def test_bad_generate_requests_name_the_field(payload: dict, field: str) -> None:
    assert field_of(payload) == field


def test_context_boundary_is_inclusive() -> None:
    # 4-token prompt + 28 new tokens fill the 32-token context exactly
    assert gen({"text": "abcd", "sampling_params": {"max_new_tokens": 28}}).request.max_new_tokens == 28
    assert field_of({"text": "abcd", "sampling_params": {"max_new_tokens": 29}}) == "sampling_params.max_new_tokens"


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        ({}, "prompt"),
        ({"prompt": 3}, "prompt"),
        ({"prompt": "a", "max_tokens": 0}, "max_tokens"),
        ({"prompt": "a", "temperature": -1}, "temperature"),
        ({"prompt": "a", "top_p": 2}, "top_p"),
        ({"prompt": "a", "top_k": "3"}, "top_k"),
        ({"prompt": "a", "n": 2}, "n"),
        ({"prompt": "a", "stream": True}, "stream"),
    ],
)
def test_bad_completion_requests_name_the_field(payload: dict, field: str) -> None:
    assert field_of(payload, lambda p: parse_completion(p, TOK, LIMITS)) == field


def test_completion_defaults_follow_openai() -> None:
    req = parse_completion({"prompt": "ab", "stop": ["\n"]}, TOK, LIMITS).request
    assert req.max_new_tokens == 16 and req.temperature == 1.0 and req.stop_strings == ["\n"]


@pytest.mark.parametrize("body", [b"", b"{bad", b"[1, 2]", b"\xff\xfe"])
def test_malformed_bodies(body: bytes) -> None:
    with pytest.raises(RequestError) as info:
        parse_json_body(body)
    assert info.value.field == "body"


def test_trim_at_stop_cuts_at_the_earliest_match() -> None:
    assert trim_at_stop("abc\ndef;", [";", "\n"]) == ("abc", "\n")
    assert trim_at_stop("abc", ["x"]) == ("abc", None)
    assert trim_at_stop("abc", []) == ("abc", None)
