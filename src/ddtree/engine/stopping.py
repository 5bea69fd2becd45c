"""Stop handling shared by every decoding method (SGLang semantics).

- `max_new_tokens`: the output is cut at that many tokens, finish reason "length".
- stop token id: the token is NOT part of the output, finish reason "stop".
- stop string: the output keeps the tokens up to the one whose decoding completed the string; the
  text is to be cut at the string by whoever renders it (`GenerationOutput.matched_stop`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass
class StopState:
    """Where a request's output stands; `finish_reason` is None while decoding goes on."""

    output_ids: list[int]
    finish_reason: str | None = None
    matched_stop: int | str | None = None


def append_tokens(
    state: StopState,
    new_tokens: Sequence[int],
    *,
    max_new_tokens: int,
    stop_token_ids: frozenset[int],
    stop_strings: Sequence[str] = (),
    decode: Callable[[list[int]], str] | None = None,
) -> int:
    """Append one round's emitted tokens, applying the stop rules; returns how many were appended."""
    start = len(state.output_ids)
    for token in new_tokens:
        if token in stop_token_ids:
            state.finish_reason, state.matched_stop = "stop", int(token)
            break
        state.output_ids.append(int(token))
        if len(state.output_ids) >= max_new_tokens:
            state.finish_reason = "length"
            break
    if stop_strings and len(state.output_ids) > start:
        if decode is None:
            raise ValueError("stop_strings need a tokenizer to decode the output")
        hit = find_stop_string(state.output_ids, start, stop_strings, decode)
        if hit is not None:
            cut, matched = hit
            del state.output_ids[cut:]
            state.finish_reason, state.matched_stop = "stop", matched
    return len(state.output_ids) - start


def find_stop_string(
    output_ids: list[int],
    first_new: int,
    stop_strings: Sequence[str],
    decode: Callable[[list[int]], str],
) -> tuple[int, str] | None:
    """The shortest prefix length (> first_new) whose decoded text holds a stop string, and that string.

    The prefix `output_ids[:first_new]` is known not to hold one. One decode when there is no match;
    otherwise a scan over the new tokens only.
    """
    if not any(s in decode(output_ids) for s in stop_strings):
        return None
    for end in range(first_new + 1, len(output_ids) + 1):
        text = decode(output_ids[:end])
        for s in stop_strings:
            if s in text:
                return end, s
    return None  # unreachable unless decode is not prefix-monotone


def truncate_at_stop_string(text: str, stop_strings: Sequence[str]) -> str:
    """Cut decoded text before the earliest stop string (what the server shows)."""
    cut = len(text)
    for s in stop_strings:
        i = text.find(s)
        if 0 <= i < cut:
            cut = i
    return text[:cut]
