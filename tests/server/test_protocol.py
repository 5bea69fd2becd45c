"""Request validation of the SGLang dialect (pure functions, no model, no HTTP)."""

from __future__ import annotations

import pytest

from ddtree.server.protocol import (
    MAX_N,
    UNSUPPORTED_COMPLETION,
    UNSUPPORTED_GENERATE,
    UNSUPPORTED_SAMPLING,
    Limits,
    RequestError,
    parse_completion,
    parse_generate,
    parse_json_body,
    sample_seed,
    trim_at_stop,
)
from ddtree.server.streaming import stable_text


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
LIMITS = Limits(max_context=32, vocab_size=64, max_budget=16)


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
        ({"text": "a", "budget": 17}, "budget"),  # above the server's --max-budget
        ({"text": "a", "budget": 300000}, "budget"),
        ({"text": "a", "sampling_params": {"n": 0}}, "sampling_params.n"),
        ({"text": "a", "sampling_params": {"n": MAX_N + 1}}, "sampling_params.n"),
        ({"text": "a", "stream": True, "sampling_params": {"n": 2}}, "sampling_params.n"),
        ({"text": "a", "sampling_params": {"sampling_seed": -1}}, "sampling_params.sampling_seed"),
        ({"text": "a", "sampling_params": {"sampling_seed": 2**64}}, "sampling_params.sampling_seed"),
        ({"text": "a", "sampling_params": {"stop": ["x"] * 33}}, "sampling_params.stop"),
        ({"text": "a", "sampling_params": {"stop": "x" * 257}}, "sampling_params.stop"),
        ({"text": "a", "sampling_params": {"stop_token_ids": [1] * 1025}}, "sampling_params.stop_token_ids"),
        ({"text": "a", "sampling_params": {"ignore_eos": 1}}, "sampling_params.ignore_eos"),
        ({"text": "a", "sampling_params": {"skip_special_tokens": "no"}}, "sampling_params.skip_special_tokens"),
        ({"text": "a", "sampling_params": {"temprature": 0.5}}, "sampling_params.temprature"),  # unknown: a typo
        ({"text": "a", "no_such_field": 1}, "no_such_field"),
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
        ({"prompt": "a", "n": 0}, "n"),
        ({"prompt": "a", "n": 2, "stream": True}, "n"),
        ({"prompt": "a", "n": 2, "best_of": 3}, "best_of"),
        ({"prompt": "a", "stream": "yes"}, "stream"),
        ({"prompt": "a", "stream": True, "stream_options": {"continuous_usage_stats": True}}, "stream_options"),
        ({"prompt": "a", "stream_options": {"include_usage": True}}, "stream_options"),
        ({"prompt": "a", "model": 3}, "model"),
        ({"prompt": "a", "seed": 1.5}, "seed"),
        ({"prompt": "a", "budget": 17}, "budget"),
        ({"prompt": "a", "echo": "yes"}, "echo"),
        ({"prompt": "a", "stop_token_ids": [64]}, "stop_token_ids"),
        ({"prompt": "a", "frobnicate": True}, "frobnicate"),
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


# one value per unsupported parameter that would change the output if it were honoured
NON_NEUTRAL = {
    "min_p": 0.1, "frequency_penalty": 0.5, "presence_penalty": -0.5, "repetition_penalty": 1.2, "min_new_tokens": 2,
    "json_schema": "{}", "regex": "a+", "ebnf": "root ::= 'a'", "structural_tag": "{}", "stop_regex": "a",
    "logit_bias": {"5": 1.0}, "custom_params": {"x": 1}, "watermark": {"key": 1}, "no_stop_trim": True,
    "spaces_between_special_tokens": False, "beam_width": 2, "stream_interval": 4, "return_logprob": True,
    "top_logprobs_num": 2, "token_ids_logprob": [1], "return_hidden_states": True, "return_routed_experts": True,
    "return_indexer_topk": True, "return_prompt_token_ids": True, "return_entropy": True,
    "return_sampling_mask": True, "lora_path": "adapter", "lora_id": "a", "input_embeds": [[0.0]],
    "image_data": "x.png", "video_data": "x.mp4", "audio_data": "x.wav", "session_params": {"id": "s"},
    "custom_logit_processor": "p", "bootstrap_host": "h", "bootstrap_port": 1, "bootstrap_room": 1,
    "min_tokens": 2, "logprobs": 1, "suffix": "x", "response_format": {"type": "json_object"},
    "return_token_ids": True, "return_cached_tokens_details": True, "return_spec_tokens_details": True,
    "mm_processor_kwargs": {"a": 1}, "images_config": {"a": 1},
}


def test_every_unsupported_parameter_has_a_non_neutral_probe() -> None:
    assert set(UNSUPPORTED_SAMPLING) | set(UNSUPPORTED_GENERATE) | set(UNSUPPORTED_COMPLETION) <= set(NON_NEUTRAL)


@pytest.mark.parametrize("name", sorted(UNSUPPORTED_SAMPLING))
def test_unsupported_sampling_params_are_refused_unless_neutral(name: str) -> None:
    for neutral in UNSUPPORTED_SAMPLING[name]:
        gen({"text": "a", "sampling_params": {name: neutral}})  # the default value changes nothing: accepted
    assert field_of({"text": "a", "sampling_params": {name: NON_NEUTRAL[name]}}) == f"sampling_params.{name}"


@pytest.mark.parametrize("name", sorted(UNSUPPORTED_GENERATE))
def test_unsupported_generate_fields_are_refused_unless_neutral(name: str) -> None:
    for neutral in UNSUPPORTED_GENERATE[name]:
        gen({"text": "a", name: neutral})
    assert field_of({"text": "a", name: NON_NEUTRAL[name]}) == name


@pytest.mark.parametrize("name", sorted(UNSUPPORTED_COMPLETION))
def test_unsupported_completion_fields_are_refused_unless_neutral(name: str) -> None:
    parse = lambda p: parse_completion(p, TOK, LIMITS)  # noqa: E731
    for neutral in UNSUPPORTED_COMPLETION[name]:
        parse({"prompt": "a", name: neutral})
    assert field_of({"prompt": "a", name: NON_NEUTRAL[name]}, parse) == name


def test_a_bool_is_not_taken_for_a_neutral_number() -> None:
    assert field_of({"text": "a", "sampling_params": {"min_p": False}}) == "sampling_params.min_p"
    penalty = {"text": "a", "sampling_params": {"repetition_penalty": True}}
    assert field_of(penalty) == "sampling_params.repetition_penalty"


def test_sglang_bench_serving_payload_is_accepted() -> None:
    """What `sglang.bench_serving --backend sglang` sends by default (0.5.23)."""
    parsed = gen({"text": "ab", "sampling_params": {"temperature": 0.0, "max_new_tokens": 4, "ignore_eos": True},
                  "stream": True, "lora_path": None, "return_logprob": False, "return_routed_experts": False,
                  "logprob_start_len": -1})
    assert parsed.stream and parsed.request.stop_token_ids == [] and parsed.request.max_new_tokens == 4
    completion = parse_completion({"model": "m", "prompt": "ab", "best_of": 1, "max_tokens": 4, "stream": True,
                                   "temperature": 0.0, "ignore_eos": True}, TOK, LIMITS)
    assert completion.stream and completion.n == 1


def test_nulls_mean_defaults_as_in_sglang() -> None:
    req = gen({"text": "ab", "sampling_params": {"temperature": None, "top_p": None, "top_k": None, "n": None,
                                                 "max_new_tokens": None}}).request
    assert (req.temperature, req.top_p, req.top_k, req.max_new_tokens) == (1.0, 1.0, -1, 30)


def test_n_and_implemented_extras() -> None:
    parsed = gen({"text": "ab", "sampling_params": {"n": 3, "skip_special_tokens": False, "sampling_seed": 5}})
    assert parsed.n == 3 and parsed.skip_special_tokens is False
    assert [sample_seed(parsed.request.seed, i) for i in range(3)] == [5, 6, 7]
    assert sample_seed(None, 2) is None and sample_seed(2**64 - 1, 1) == 0
    comp = parse_completion({"prompt": "ab", "n": 2, "best_of": 2, "echo": True, "stop_token_ids": [9],
                             "seed": 3, "user": "someone"}, TOK, LIMITS)
    assert comp.n == 2 and comp.echo and comp.request.stop_token_ids == [9, 0] and comp.request.seed == 3
    stream = parse_completion({"prompt": "ab", "stream": True, "stream_options": {"include_usage": True}}, TOK,
                              LIMITS)
    assert stream.stream and stream.include_usage


def test_method_needs_what_the_pair_has() -> None:
    ar_only = Limits(max_context=32, vocab_size=64, methods=("ar",))
    with pytest.raises(RequestError) as info:
        parse_generate({"text": "a", "method": "ddtree"}, TOK, ar_only)
    assert info.value.field == "method"
    assert parse_generate({"text": "a", "method": "ar"}, TOK, ar_only).method == "ar"


@pytest.mark.parametrize(
    ("text", "stops", "stable"),
    [
        ("abc", [], "abc"),
        ("abc\ufffd", [], "abc"),  # an incomplete character waits for its next byte
        ("ab\n", ["\n\n"], "ab"),  # could become the stop string
        ("ab\nx", ["\n\n"], "ab\nx"),
        ("abEN", ["END", "x"], "ab"),
        ("abE", ["END"], "ab"),
        ("abEND", ["END"], "abEND"),  # a whole stop string is trimmed by render_text, not here
    ],
)
def test_stable_text_holds_back_what_may_change(text: str, stops: list[str], stable: str) -> None:
    assert stable_text(text, stops) == stable


def test_stage_times_are_on_by_default_only_where_they_cost_no_synchronisation():
    import argparse

    from ddtree.server.cli import add_arguments, stage_times_on

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    resolve = lambda *extra: stage_times_on(parser.parse_args(["--model", "m", *extra]))  # noqa: E731
    assert resolve() and resolve("--device", "cpu")
    assert not resolve("--device", "cuda") and not resolve("--device", "cuda:1")
    assert resolve("--device", "cuda", "--stage-times", "on") and not resolve("--stage-times", "off")
