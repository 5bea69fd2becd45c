"""The reference server's own cost per request: the real app, scheduler and HTTP client around a stub engine
whose rounds are sleeps (a sleep releases the GIL as a CUDA synchronisation does) emitting --tau tokens a row.
With the engine's time known exactly, what the served throughput lacks against it is the server's host work
(HTTP parsing, tokenising, the event loop, the hand-off between threads, the response), reported as
milliseconds per request. Greedy, non-streaming requests of --max-new-tokens, like `gpu_pair/serve_sweep.py`.

    PYTHONPATH=src python benchmarks/server_overhead.py --concurrency 1,8 --round-ms 1 --tau 7 --requests 256

The server runs in a child process (`--serve PORT`), the client in this one; on a machine with few cores the
two compete, so compare runs on the same machine only. The engine-bound rate uses the measured length of the
stub's sleeps, which overshoot their nominal time.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddtree.engine.types import STAGES, GenerationOutput, GenerationRequest


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
class _Row:
    request: GenerationRequest
    on_tokens: Any
    ids: list[int] = field(default_factory=list)
    rounds: int = 0
    t0: float = field(default_factory=time.perf_counter)
    output: GenerationOutput | None = None
    error: BaseException | None = None


class StubEngine:
    """`BatchedEngine`'s batch interface (can_admit / admit / step / cancel_all) with sleeps for the device work."""

    max_context = 4096
    vocab_size = 256
    drafter = "stub"

    def __init__(self, round_s: float, admit_s: float, tau: int, max_batch: int, host_s: float = 0.0) -> None:
        self.round_s, self.admit_s, self.tau, self.max_batch = round_s, admit_s, tau, max_batch
        self.host_s = host_s  # Python work a round does holding the GIL (the real loop's enqueue and bookkeeping)
        self.method, self.budget = "ddtree", 32
        self.active: list[_Row] = []

    def can_admit(self, method: str, budget: int) -> bool:
        return len(self.active) < self.max_batch

    def admit(self, request: GenerationRequest, *, method: str, budget: int, on_tokens=None) -> _Row:
        time.sleep(self.admit_s)
        row = _Row(request, on_tokens)
        self.active.append(row)
        self._emit(row, [65])
        return row

    def step(self) -> list[_Row]:
        until = time.perf_counter() + self.host_s
        while time.perf_counter() < until:  # busy, holding the GIL, as the real loop's host work does
            pass
        time.sleep(self.round_s)
        for row in self.active:
            row.rounds += 1
            self._emit(row, [66] * self.tau)
        finished = [row for row in self.active if row.output is not None]
        self.active = [row for row in self.active if row.output is None]
        return finished

    def cancel_all(self, error: BaseException) -> list[_Row]:
        dropped, self.active = self.active, []
        return dropped

    def _emit(self, row: _Row, ids: list[int]) -> None:
        ids = ids[: row.request.max_new_tokens - len(row.ids)]
        row.ids.extend(ids)
        if row.on_tokens is not None and ids:
            row.on_tokens(ids)
        if len(row.ids) >= row.request.max_new_tokens:
            now = time.perf_counter()
            row.output = GenerationOutput(
                output_ids=row.ids, finish_reason="length", rounds=row.rounds, accept_lens=[self.tau - 1] * row.rounds,
                expected_accept_lens=[float(self.tau - 1)] * row.rounds, stage_times=dict.fromkeys(STAGES, 0.0),
                ttft=0.0, decode_time=now - row.t0, method="ddtree", budget=32)


def slept_ms(ms: float, samples: int = 200) -> float:
    """The mean time time.sleep(ms) takes here (it overshoots by tens of microseconds)."""
    t = time.perf_counter()
    for _ in range(samples):
        time.sleep(ms / 1e3)
    return (time.perf_counter() - t) / samples * 1e3


def serve(args: argparse.Namespace) -> int:
    import uvicorn

    from ddtree.server.app import create_app

    engine = StubEngine(args.round_ms / 1e3, args.admit_ms / 1e3, args.tau, args.max_batch, args.host_ms / 1e3)
    app = create_app(engine, ByteTokenizer(), method="ddtree", budget=32, model_name="stub")
    uvicorn.run(app, host="127.0.0.1", port=args.serve, log_level="warning")
    return 0


def measure(args: argparse.Namespace) -> int:
    import httpx

    from ddtree.bench.session import free_port
    from ddtree.bench.throughput import run_throughput
    from ddtree.server.app import RequestTimeline

    port = free_port()
    server = subprocess.Popen([sys.executable, __file__, "--serve", str(port), "--round-ms", str(args.round_ms),
                               "--admit-ms", str(args.admit_ms), "--tau", str(args.tau), "--host-ms", str(args.host_ms),
                               "--max-batch", str(args.max_batch)])
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        with tempfile.TemporaryDirectory() as tmp:
            prompts = Path(tmp) / "prompts.jsonl"
            prompts.write_text("".join(json.dumps({"text": f"def f{i}(x):\n    return x * {i}\n" * 8}) + "\n"
                                       for i in range(64)))
            rounds = math.ceil((args.max_new_tokens - 1) / args.tau)
            slept, admit_ms = slept_ms(args.round_ms), slept_ms(args.admit_ms)  # what a sleep really takes
            round_ms = args.host_ms + slept
            print(f"stub engine: {args.round_ms} ms a round ({slept:.3f} slept) after {args.host_ms} ms "
                  f"of Python holding the GIL, {args.admit_ms} ms an admission ({admit_ms:.3f} slept), tau {args.tau}, "
                  f"{rounds} rounds a request of {args.max_new_tokens} tokens, batch {args.max_batch}")
            print(f"{'conc':>5} {'requests':>8} {'tok/s':>9} {'engine-bound tok/s':>18} {'efficiency':>10} "
                  f"{'server ms/request':>17}   a request's ms: waiting for a row, in the engine, handed back")
            for level in (int(c) for c in args.concurrency.split(",")):
                for repeat in range(args.repeats + 1):  # the first pass warms the connection pool: not reported
                    out = Path(tmp) / f"records_{level}_{repeat}.jsonl"
                    before = httpx.get(url + "/server_info", timeout=10).json()["request_timeline"]
                    t = time.perf_counter()
                    result = run_throughput(url, prompts, concurrency=[level], num_requests=args.requests,
                                            max_new_tokens=args.max_new_tokens, out=out)
                    wall = time.perf_counter() - t
                    after = httpx.get(url + "/server_info", timeout=10).json()["request_timeline"]
                    if not repeat:
                        continue
                    per_request = RequestTimeline.per_request_ms(before, after) or {}
                    phases = " ".join(f"{per_request.get(k + '_ms', math.nan):7.3f}" for k in ("queue", "engine", "handoff"))
                    tokens = args.requests * args.max_new_tokens
                    rows = min(level, args.max_batch)
                    # the engine's time alone: every admission, then the rounds with `rows` requests each
                    engine_s = args.requests * (admit_ms + rounds * round_ms / rows) / 1e3
                    summary = result["levels"][level]
                    seconds = summary["duration_s"] or wall
                    print(f"{level:>5} {args.requests:>8} {tokens / seconds:>9.0f} {tokens / engine_s:>18.0f} "
                          f"{engine_s / seconds:>10.2f} {(seconds - engine_s) / args.requests * 1e3:>17.3f}   {phases}",
                          flush=True)
    finally:
        server.terminate()
        server.wait(timeout=10)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--serve", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--round-ms", type=float, default=1.0)
    ap.add_argument("--admit-ms", type=float, default=0.3)
    ap.add_argument("--host-ms", type=float, default=0.0, help="Python work a round does before its sleep, holding "
                    "the GIL (the real loop enqueues and keeps its books ~0.4 ms a round at 8 requests on the H200)")
    ap.add_argument("--tau", type=int, default=7)
    ap.add_argument("--max-batch", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--concurrency", default="1,8")
    ap.add_argument("--requests", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    return serve(args) if args.serve is not None else measure(args)


if __name__ == "__main__":
    raise SystemExit(main())
