"""Stop rules of the engine (pure functions, no model)."""

from __future__ import annotations

import pytest

from ddtree.engine.stopping import StopState, append_tokens, find_stop_string, truncate_at_stop_string


def _decode(ids: list[int]) -> str:
    return "".join(chr(ord("a") + i % 26) for i in ids)  # token i -> one letter


def _append(state, tokens, **kw):
    kw.setdefault("max_new_tokens", 100)
    kw.setdefault("stop_token_ids", frozenset())
    return append_tokens(state, tokens, **kw)


def test_max_new_tokens_truncates_the_round():
    state = StopState(output_ids=[0, 1])
    added = _append(state, [2, 3, 4, 5], max_new_tokens=4)
    assert state.output_ids == [0, 1, 2, 3] and added == 2
    assert state.finish_reason == "length" and state.matched_stop is None


def test_stop_token_is_excluded_and_ends_with_stop():
    state = StopState(output_ids=[7])
    _append(state, [1, 9, 2], stop_token_ids=frozenset({9}))
    assert state.output_ids == [7, 1]
    assert state.finish_reason == "stop" and state.matched_stop == 9


def test_stop_token_before_the_length_limit_wins():
    state = StopState(output_ids=[])
    _append(state, [1, 9], max_new_tokens=2, stop_token_ids=frozenset({9}))
    assert state.output_ids == [1] and state.finish_reason == "stop"


def test_no_stop_keeps_going():
    state = StopState(output_ids=[])
    _append(state, [1, 2, 3], stop_strings=["zz"], decode=_decode)
    assert state.output_ids == [1, 2, 3] and state.finish_reason is None


def test_stop_string_keeps_tokens_up_to_the_completing_one():
    state = StopState(output_ids=[0])  # "a"
    _append(state, [1, 2, 3, 4], stop_strings=["bc", "zz"], decode=_decode)  # "abcde": "bc" done by token 2
    assert state.output_ids == [0, 1, 2]
    assert state.finish_reason == "stop" and state.matched_stop == "bc"


def test_stop_string_across_rounds():
    state = StopState(output_ids=[])
    _append(state, [0, 1], stop_strings=["bc"], decode=_decode)
    assert state.finish_reason is None
    _append(state, [2, 3], stop_strings=["bc"], decode=_decode)
    assert state.output_ids == [0, 1, 2] and state.matched_stop == "bc"


def test_stop_strings_need_a_decoder():
    with pytest.raises(ValueError, match="tokenizer"):
        _append(StopState(output_ids=[]), [1], stop_strings=["x"], decode=None)


def test_find_stop_string_earliest_end():
    assert find_stop_string([0, 1, 2, 0, 1], 0, ["ab"], _decode) == (2, "ab")
    assert find_stop_string([0, 1, 2], 0, ["q"], _decode) is None


def test_truncate_text_at_earliest_stop():
    assert truncate_at_stop_string("hello world", ["wor", "lo"]) == "hel"
    assert truncate_at_stop_string("hello", ["x"]) == "hello"
