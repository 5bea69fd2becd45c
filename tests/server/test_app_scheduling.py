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
    """Echoes the prompt's last token; `sleep_s` per request; prompt "boom" raises, "bad" is refused."""

    max_context = 64

    def __init__(self, sleep_s: float) -> None:
        self.sleep_s = sleep_s
        self.order: list[int] = []
        self.active = 0
        self.max_active = 0
        self._lock = threading.Lock()

    def generate(self, request: GenerationRequest, *, method=None, budget=None) -> GenerationOutput:
        with self._lock:
            self.active += 1
            self.max_active = max(self.max_active, self.active)
        try:
            text = bytes(request.input_ids).decode()
            if text == "boom":
                raise RuntimeError("engine exploded")
            if text == "bad":
                raise ValueError("input_ids: refused by the engine")
            self.order.append(request.seed)
            time.sleep(self.sleep_s)
            out = [request.input_ids[-1]] * request.max_new_tokens
            return GenerationOutput(output_ids=out, finish_reason="length", rounds=2, accept_lens=[1, 0],
                                    expected_accept_lens=[0.5, 0.5], stage_times=dict.fromkeys(STAGES, 0.0),
                                    ttft=0.0, decode_time=self.sleep_s)
        finally:
            with self._lock:
                self.active -= 1


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[str, SlowEchoEngine]]:
    engine = SlowEchoEngine(sleep_s=0.05)
    app = create_app(engine, ByteTokenizer(), method="ddtree", budget=8, model_name="double")
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


def test_engine_errors_become_400_and_500_and_serving_goes_on(served) -> None:
    url, _ = served
    with httpx.Client(trust_env=False, timeout=30) as client:
        bad = client.post(f"{url}/generate", json={"text": "bad"})
        assert bad.status_code == 400
        assert bad.json()["error"]["type"] == "invalid_request_error"
        assert "input_ids" in bad.json()["error"]["message"]
        boom = client.post(f"{url}/generate", json={"text": "boom"})
        assert boom.status_code == 500
        assert "engine exploded" in boom.json()["error"]["message"]
        assert client.get(f"{url}/health").status_code == 200
        assert client.post(f"{url}/generate", json={"text": "ok", "sampling_params": {"max_new_tokens": 1}}).json()[
            "text"] == "k"


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


def test_stream_sends_one_event_then_done(served) -> None:
    url, _ = served
    with httpx.stream("POST", f"{url}/generate", json={"text": "ab", "stream": True,
                                                       "sampling_params": {"max_new_tokens": 2}},
                      trust_env=False) as response:
        assert response.status_code == 200
        events = [line for line in response.iter_lines() if line]
    assert events[-1] == "data: [DONE]" and len(events) == 2
    body = json.loads(events[0].removeprefix("data: "))
    assert body["text"] == "bb" and body["meta_info"]["completion_tokens"] == 2
