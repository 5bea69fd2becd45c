"""Scheduling and error paths of the app, over real HTTP, around a deterministic engine double.

The double makes timing and failures controllable (a slow decode, an engine that raises); the
model-backed behaviour is covered by test_server_http.py with the real engine.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
import uvicorn

from ddtree.bench.session import free_port
from ddtree.engine.types import STAGES, GenerationOutput, GenerationRequest
from ddtree.server.app import create_app


class ByteTokenizer:
    eos_token_id = None

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return bytes(ids).decode("utf-8", errors="replace")

    def __len__(self) -> int:
        return 256


class SlowEchoEngine:
    """Echoes the prompt's last token, two tokens per "round", `sleep_s` per round, each round handed
    to `on_tokens`; prompt "boom" raises before any token, "late" raises after the first round."""

    max_context = 64
    drafter = object()  # a pair with a drafter: every method is available

    def __init__(self, sleep_s: float) -> None:
        self.sleep_s = sleep_s
        self.order: list[int] = []
        self.active = 0
        self.max_active = 0
        self.rounds_run = 0
        self._lock = threading.Lock()

    def generate(self, request: GenerationRequest, *, method=None, budget=None, on_tokens=None) -> GenerationOutput:
        with self._lock:
            self.active += 1
            self.max_active = max(self.max_active, self.active)
        try:
            text = bytes(request.input_ids).decode()
            if text == "boom":
                raise RuntimeError("engine exploded")
            self.order.append(request.seed)
            out: list[int] = []
            while len(out) < request.max_new_tokens:
                time.sleep(self.sleep_s)
                new = [request.input_ids[-1]] * min(2, request.max_new_tokens - len(out))
                out += new
                self.rounds_run += 1
                if on_tokens is not None:
                    on_tokens(new)
                if text == "late":
                    raise RuntimeError("failed mid-request")
            rounds = (len(out) + 1) // 2
            return GenerationOutput(output_ids=out, finish_reason="length", rounds=rounds, accept_lens=[1] * rounds,
                                    expected_accept_lens=[0.5] * rounds, stage_times=dict.fromkeys(STAGES, 0.0),
                                    ttft=0.0, decode_time=self.sleep_s * rounds, method=method or "ddtree",
                                    budget=budget or 8)
        finally:
            with self._lock:
                self.active -= 1


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[str, SlowEchoEngine]]:
    engine = SlowEchoEngine(sleep_s=0.05)
    app = create_app(engine, ByteTokenizer(), method="ddtree", budget=8, max_budget=32, model_name="double")
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline, "server did not start"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}", engine
    server.should_exit = True
    thread.join(timeout=10)


def test_requests_are_decoded_one_at_a_time_in_arrival_order(served) -> None:
    url, engine = served
    engine.order.clear()

    async def burst() -> tuple[list[httpx.Response], list[float]]:
        async with httpx.AsyncClient(timeout=30, trust_env=False) as client:
            tasks = []
            for i in range(8):
                body = {"text": "a", "sampling_params": {"max_new_tokens": 2, "sampling_seed": i}}
                tasks.append(asyncio.create_task(client.post(f"{url}/generate", json=body)))
                await asyncio.sleep(0.01)  # distinct arrival times
            # the event loop stays free: health answers while the queue drains
            health_times = []
            for _ in range(3):
                t = time.perf_counter()
                assert (await client.get(f"{url}/health")).text == "ok"
                health_times.append(time.perf_counter() - t)
            return list(await asyncio.gather(*tasks)), health_times

    responses, health_times = asyncio.run(burst())
    assert all(r.status_code == 200 for r in responses)
    assert engine.max_active == 1
    assert engine.order == list(range(8))  # FIFO
    assert max(health_times) < 8 * engine.sleep_s  # did not wait for the queue to drain


def test_meta_info_from_engine_output(served) -> None:
    url, _ = served
    body = httpx.post(f"{url}/generate", json={"text": "xy", "rid": "abc", "sampling_params": {"max_new_tokens": 3}},
                      trust_env=False).json()
    meta = body["meta_info"]
    assert body["text"] == "yyy" and body["output_ids"] == [ord("y")] * 3
    assert meta["id"] == "abc" and meta["prompt_tokens"] == 2 and meta["completion_tokens"] == 3
    assert meta["spec_verify_ct"] == 2 and meta["spec_accept_length"] == 1.5
    assert meta["spec_expected_accept_length"] == 1.5
    assert meta["method"] == "ddtree" and meta["budget"] == 8
    assert meta["cached_tokens"] == 0 and meta["finish_reason"] == {"type": "length", "length": 3}


def test_decoding_failures_are_500_and_serving_goes_on(served) -> None:
    url, _ = served
    with httpx.Client(trust_env=False, timeout=30) as client:
        for body in ({"text": "boom"}, {"text": "late", "sampling_params": {"max_new_tokens": 4}},
                     {"text": "boom", "stream": True}):
            failed = client.post(f"{url}/generate", json=body)
            assert failed.status_code == 500, body
            assert failed.json()["error"]["type"] == "internal_error"
            assert "engine exploded" in failed.json()["error"]["message"] or "mid-request" in failed.text
        completion = client.post(f"{url}/v1/completions", json={"prompt": "boom", "stream": True})
        assert completion.status_code == 500 and "engine exploded" in completion.json()["error"]["message"]
        assert client.get(f"{url}/health").status_code == 200
        assert client.post(f"{url}/generate", json={"text": "ok", "sampling_params": {"max_new_tokens": 1}}).json()[
            "text"] == "k"


def test_failure_after_the_first_event_is_an_error_event(served) -> None:
    url, _ = served
    events = sse_events(url, "/generate", {"text": "late", "stream": True, "sampling_params": {"max_new_tokens": 6}})
    assert events[-1] == "[DONE]"
    first, error = json.loads(events[0]), json.loads(events[-2])
    assert first["output_ids"] == [ord("e")] * 2 and first["meta_info"]["finish_reason"] is None
    assert error["error"]["code"] == 500 and "mid-request" in error["error"]["message"]


def test_budget_above_the_maximum_is_a_400_naming_it(served) -> None:
    url, engine = served
    rounds = engine.rounds_run
    with httpx.Client(trust_env=False, timeout=30) as client:
        for path, body in (("/generate", {"text": "a", "budget": 300000}),
                           ("/v1/completions", {"prompt": "a", "budget": 33})):
            refused = client.post(f"{url}{path}", json=body)
            assert refused.status_code == 400 and refused.json()["error"]["message"].startswith("budget:")
        assert engine.rounds_run == rounds  # refused before it reached the engine
        ok = client.post(f"{url}/generate", json={"text": "a", "budget": 32, "sampling_params": {"max_new_tokens": 1}})
        assert ok.status_code == 200 and ok.json()["meta_info"]["budget"] == 32


def test_stop_string_is_trimmed_from_text(served) -> None:
    url, _ = served
    body = httpx.post(f"{url}/generate", json={"text": "a;", "sampling_params": {"max_new_tokens": 3, "stop": ";"}},
                      trust_env=False).json()
    assert body["text"] == "" and body["output_ids"] == [ord(";")] * 3


def test_create_app_refuses_bad_settings() -> None:
    with pytest.raises(ValueError, match="method"):
        create_app(SlowEchoEngine(0), ByteTokenizer(), method="beam", budget=8, model_name="x")
    with pytest.raises(ValueError, match="budget"):
        create_app(SlowEchoEngine(0), ByteTokenizer(), method="ar", budget=0, model_name="x")
    with pytest.raises(ValueError, match="max_budget"):
        create_app(SlowEchoEngine(0), ByteTokenizer(), method="ddtree", budget=8, max_budget=4, model_name="x")


def test_ar_responses_carry_no_speculative_fields(served) -> None:
    url, _ = served
    meta = httpx.post(f"{url}/generate", json={"text": "a", "method": "ar", "sampling_params": {"max_new_tokens": 2}},
                      trust_env=False).json()["meta_info"]
    assert meta["method"] == "ar" and not any(k.startswith("spec_") for k in meta)


def sse_events(url: str, path: str, body: dict) -> list[str]:
    """The `data:` payloads of a streamed response, in order."""
    with httpx.stream("POST", f"{url}{path}", json=body, trust_env=False, timeout=30) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        return [line.removeprefix("data: ") for line in response.iter_lines() if line]


def timed_events(url: str, path: str, body: dict) -> list[tuple[float, str]]:
    with httpx.stream("POST", f"{url}{path}", json=body, trust_env=False, timeout=30) as response:
        return [(time.perf_counter(), line.removeprefix("data: ")) for line in response.iter_lines() if line]


def test_generate_streams_each_round_as_it_commits(served) -> None:
    url, engine = served
    events = timed_events(url, "/generate", {"text": "ab", "stream": True, "rid": "s1",
                                             "sampling_params": {"max_new_tokens": 5}})
    assert events[-1][1] == "[DONE]"
    bodies = [json.loads(e) for _, e in events[:-1]]
    # three rounds (2 + 2 + 1 tokens), then the final event; SGLang's default: cumulative text and ids
    assert [len(b["output_ids"]) for b in bodies] == [2, 4, 5, 5]
    assert [b["text"] for b in bodies] == ["bb", "bbbb", "bbbbb", "bbbbb"]
    assert [b["meta_info"]["completion_tokens"] for b in bodies] == [2, 4, 5, 5]
    assert [b["meta_info"]["finish_reason"] for b in bodies[:-1]] == [None] * 3
    final = bodies[-1]["meta_info"]
    assert final["finish_reason"] == {"type": "length", "length": 5} and final["id"] == "s1"
    assert final["spec_verify_ct"] == 3
    # the rounds arrive one sleep apart, not all at the end
    gaps = [b - a for (a, _), (b, _) in zip(events[:3], events[1:3])]
    assert min(gaps) > 0.5 * engine.sleep_s


def test_streamed_and_plain_responses_agree(served) -> None:
    url, _ = served
    body = {"text": "xyz", "sampling_params": {"max_new_tokens": 7}}
    plain = httpx.post(f"{url}/generate", json=body, trust_env=False).json()
    streamed = json.loads(sse_events(url, "/generate", {**body, "stream": True})[-2])
    assert streamed["text"] == plain["text"] and streamed["output_ids"] == plain["output_ids"]
    comp_plain = httpx.post(f"{url}/v1/completions", json={"prompt": "xyz", "max_tokens": 7}, trust_env=False).json()
    chunks = [json.loads(e) for e in sse_events(url, "/v1/completions", {"prompt": "xyz", "max_tokens": 7,
                                                                        "stream": True})[:-1]]
    assert "".join(c["choices"][0]["text"] for c in chunks) == comp_plain["choices"][0]["text"] == plain["text"]
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None] * (len(chunks) - 1) + ["length"]


def test_completion_stream_with_echo_and_usage(served) -> None:
    url, _ = served
    events = sse_events(url, "/v1/completions", {"prompt": "pq", "max_tokens": 3, "stream": True, "echo": True,
                                                 "stream_options": {"include_usage": True}})
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert "".join(c["choices"][0]["text"] for c in chunks[:-1]) == "pqqqq"
    usage = chunks[-1]
    assert usage["choices"] == [] and usage["usage"] == {"prompt_tokens": 2, "completion_tokens": 3,
                                                           "total_tokens": 5}
    assert len({c["id"] for c in chunks}) == 1 and chunks[0]["id"].startswith("cmpl-")


def test_n_samples_have_their_own_seeds(served) -> None:
    url, engine = served
    engine.order.clear()
    bodies = httpx.post(f"{url}/generate", json={"text": "n", "rid": "r", "sampling_params": {
        "max_new_tokens": 1, "n": 3, "sampling_seed": 10}}, trust_env=False).json()
    assert [b["meta_info"]["id"] for b in bodies] == ["r_0", "r_1", "r_2"] and engine.order == [10, 11, 12]
    reply = httpx.post(f"{url}/v1/completions", json={"prompt": "n", "max_tokens": 2, "n": 2}, trust_env=False).json()
    assert [c["index"] for c in reply["choices"]] == [0, 1] and reply["usage"]["completion_tokens"] == 4
    assert all(c["matched_stop"] is None and c["finish_reason"] == "length" for c in reply["choices"])


def test_closing_a_stream_stops_its_decode(served) -> None:
    url, engine = served
    rounds = engine.rounds_run
    with httpx.stream("POST", f"{url}/generate", json={"text": "a", "stream": True, "sampling_params": {
            "max_new_tokens": 60}}, trust_env=False, timeout=30) as response:
        next(line for line in response.iter_lines() if line)  # the first round, then hang up
    deadline = time.monotonic() + 5
    while engine.active and time.monotonic() < deadline:
        time.sleep(0.01)
    assert engine.active == 0
    assert engine.rounds_run - rounds < 10  # far from the 30 rounds of the whole request


def test_openai_style_discovery(served) -> None:
    url, _ = served
    models = httpx.get(f"{url}/v1/models", trust_env=False).json()
    assert models["object"] == "list" and [m["id"] for m in models["data"]] == ["double"]
    assert models["data"][0]["max_model_len"] == 64
    assert httpx.get(f"{url}/v1/models/double", trust_env=False).json()["id"] == "double"
    assert httpx.get(f"{url}/v1/models/other", trust_env=False).status_code == 404
    assert httpx.get(f"{url}/model_info", trust_env=False).json()["tokenizer_path"] == "double"
    assert httpx.post(f"{url}/flush_cache", trust_env=False).status_code == 200
