"""A batched engine without a model, for the server's own costs and its process boundary: `BatchedEngine`'s batch
interface (can_admit / admit / step / cancel_all, `loop_stats`) with sleeps where the device would work, and a
byte tokenizer. Used by `benchmarks/server_overhead.py` and the server tests; importable in an engine process
(no torch).

Each round emits `tau` tokens a request (token 66; the first token, from the admission, is 65), so a request of n
tokens decodes in ceil((n - 1) / tau) rounds. Two prompts misbehave on purpose: "crash" ends the engine's process
at admission (os._exit), "fail" raises there (that request alone fails).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any

from ddtree.engine.types import STAGES, GenerationOutput, GenerationRequest, LoopStats

FIRST_TOKEN, ROUND_TOKEN = 65, 66


class ByteTokenizer:
    """UTF-8 bytes as token ids (the server needs encode / decode / len / eos)."""

    eos_token_id = None

    def encode(self, text: str) -> list[int]:
        return list(text.encode())

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return bytes(i % 256 for i in ids).decode(errors="replace")

    def __len__(self) -> int:
        return 256


@dataclass
class StubRow:
    request: GenerationRequest
    on_tokens: Any
    ids: list[int] = field(default_factory=list)
    rounds: int = 0
    t0: float = field(default_factory=time.perf_counter)
    output: GenerationOutput | None = None
    error: BaseException | None = None


class StubEngine:
    """Rounds of `round_s` seconds of sleep (a sleep releases the GIL as a CUDA synchronisation does), after
    `host_s` seconds of Python holding the GIL (the real loop's enqueueing and bookkeeping); admissions `admit_s`."""

    max_context = 4096
    vocab_size = 256
    drafter = "stub"  # not None: every method is served

    def __init__(self, round_s: float = 0.001, admit_s: float = 0.0, tau: int = 4, max_batch: int = 8,
                 host_s: float = 0.0) -> None:
        self.round_s, self.admit_s, self.tau, self.max_batch = round_s, admit_s, tau, max_batch
        self.host_s = host_s
        self.method, self.budget = "ddtree", 32
        self.active: list[StubRow] = []
        self.loop_stats = LoopStats()

    def can_admit(self, method: str, budget: int) -> bool:
        return len(self.active) < self.max_batch

    def admit(self, request: GenerationRequest, *, method: str, budget: int, on_tokens=None) -> StubRow:
        prompt = bytes(i % 256 for i in request.input_ids)
        if prompt == b"crash":
            os._exit(3)
        if prompt == b"fail":
            raise ValueError("the stub engine refuses the prompt 'fail'")
        time.sleep(self.admit_s)
        row = StubRow(request, on_tokens)
        self.active.append(row)
        self.loop_stats.admissions += 1
        self._emit(row, [FIRST_TOKEN])
        if row.output is not None:
            self.active.remove(row)
        return row

    def step(self) -> list[StubRow]:
        until = time.perf_counter() + self.host_s
        while time.perf_counter() < until:  # busy, holding the GIL, as the real loop's host work does
            pass
        time.sleep(self.round_s)
        self.loop_stats.rounds += 1
        self.loop_stats.row_rounds += len(self.active)
        for row in self.active:
            row.rounds += 1
            self._emit(row, [ROUND_TOKEN] * self.tau)
        finished = [row for row in self.active if row.output is not None]
        self.active = [row for row in self.active if row.output is None]
        return finished

    def cancel_all(self, error: BaseException) -> list[StubRow]:
        dropped, self.active = self.active, []
        return dropped

    def _emit(self, row: StubRow, ids: list[int]) -> None:
        ids = ids[: row.request.max_new_tokens - len(row.ids)]
        row.ids.extend(ids)
        ended = len(row.ids) >= row.request.max_new_tokens
        if row.on_tokens is not None and ids:
            try:
                row.on_tokens(ids)
            except Exception as exc:  # the request ends alone, as in `BatchedEngine._emit`
                row.error, ended = exc, True
        if ended:
            now = time.perf_counter()
            row.output = GenerationOutput(
                output_ids=row.ids, finish_reason="length" if row.error is None else "abort", rounds=row.rounds,
                accept_lens=[self.tau - 1] * row.rounds, expected_accept_lens=[float(self.tau - 1)] * row.rounds,
                stage_times=dict.fromkeys(STAGES, 0.0), ttft=0.0, decode_time=now - row.t0, method="ddtree",
                budget=32)
