"""The engine in a process of its own (`ddtree.server.engine_process`): results, streams, cancellation, loop
statistics, a failed start and an engine process that dies, around the model-free stub engine; and the app
served over real HTTP around it. `ddtree serve` itself (which always decodes in an engine process) is covered
end to end with the real engine by test_server_http.py."""

from __future__ import annotations

import asyncio
import functools
import threading
import time
from concurrent.futures import CancelledError

import httpx
import pytest
import uvicorn

from ddtree.bench.session import free_port
from ddtree.engine.types import GenerationRequest
from ddtree.server.app import create_app
from ddtree.server.engine_process import EngineProcess, EngineStartError
from ddtree.server.streaming import RequestCancelled
from ddtree.testing.stub_engine import FIRST_TOKEN, ROUND_TOKEN, ByteTokenizer, StubEngine

TAU = 3


def request(text: str = "hi", max_new_tokens: int = 10) -> GenerationRequest:
    return GenerationRequest(input_ids=list(text.encode()), max_new_tokens=max_new_tokens)


def expected_ids(max_new_tokens: int) -> list[int]:
    return [FIRST_TOKEN] + [ROUND_TOKEN] * (max_new_tokens - 1)


def attached(factory) -> EngineProcess:
    process = EngineProcess(factory)
    process.attach(asyncio.get_running_loop())
    return process


async def result(job, timeout: float = 30.0):
    return await asyncio.wait_for(asyncio.wrap_future(job.future), timeout)


def test_concurrent_requests_come_back_whole_with_their_timestamps() -> None:
    lengths = (1, 5, 10, 17, 30, 4, 9, 2)

    async def scenario() -> None:
        process = attached(functools.partial(StubEngine, round_s=0.002, tau=TAU, max_batch=4))
        try:
            jobs = [process.submit(request(max_new_tokens=n)) for n in lengths]
            for n, job in zip(lengths, jobs):
                output = await result(job)
                assert output.output_ids == expected_ids(n)
                assert output.rounds == -(-(n - 1) // TAU)
                # the engine's clock is the server's (perf_counter is system-wide): arrival <= start <= finish <= now
                assert job.submitted_at <= job.started_at <= job.finished_at <= time.perf_counter()
            stats = process.loop_stats()  # as of the last finished request
            assert stats is not None and stats["admissions"] == 8 and stats["rounds"] > 0
            assert stats["row_rounds"] > stats["rounds"]  # up to 4 rows decoded together
        finally:
            process.stop()

    asyncio.run(scenario())


def test_a_stream_gets_every_token_in_order_and_one_whose_client_leaves_stops() -> None:
    async def scenario() -> None:
        process = attached(functools.partial(StubEngine, round_s=0.002, tau=TAU, max_batch=4))
        try:
            chunks: list[list[int]] = []
            output = await result(process.submit(request(max_new_tokens=11), on_tokens=chunks.append))
            assert [t for chunk in chunks for t in chunk] == output.output_ids == expected_ids(11)
            assert len(chunks) == 1 + -(-10 // TAU)  # the first token, then one chunk a round

            seen: list[int] = []

            def leaving(ids: list[int]) -> None:
                seen.extend(ids)
                if len(seen) > 1:
                    raise RequestCancelled("client gone")

            with pytest.raises(RequestCancelled):
                await result(process.submit(request(max_new_tokens=3000), on_tokens=leaving))
            # stopped within a few rounds of the cancel, far from the 1000 rounds the request asked for
            assert len(seen) < 20 * TAU
        finally:
            process.stop()

    asyncio.run(scenario())


def test_a_request_cancelled_before_it_starts_is_dropped() -> None:
    async def scenario() -> None:
        process = attached(functools.partial(StubEngine, round_s=0.002, tau=1, max_batch=1))
        try:
            first = process.submit(request(max_new_tokens=60))  # holds the only row for ~0.12 s
            queued = process.submit(request(max_new_tokens=5))
            assert queued.future.cancel()
            assert (await result(first)).output_ids == expected_ids(60)
            assert (await result(process.submit(request(max_new_tokens=2)))).output_ids == expected_ids(2)
            with pytest.raises(CancelledError):
                queued.future.result(timeout=0)
            assert process.loop_stats()["admissions"] == 2  # the cancelled one never reached the engine
        finally:
            process.stop()

    asyncio.run(scenario())


def test_a_refused_request_fails_alone() -> None:
    async def scenario() -> None:
        process = attached(functools.partial(StubEngine, round_s=0.002, tau=TAU))
        try:
            bad, good = process.submit(request("fail")), process.submit(request("ok", 4))
            with pytest.raises(ValueError, match="refuses the prompt 'fail'"):
                await result(bad)
            assert (await result(good)).output_ids == expected_ids(4)
        finally:
            process.stop()

    asyncio.run(scenario())


def _refuse_to_start() -> StubEngine:
    raise OSError("no weights at /nowhere")


def test_a_failed_start_raises_with_the_engines_message() -> None:
    with pytest.raises(EngineStartError, match="OSError: no weights at /nowhere"):
        EngineProcess(_refuse_to_start)


def test_submitting_before_attaching_to_a_loop_is_refused() -> None:
    process = EngineProcess(functools.partial(StubEngine, round_s=0.001))
    try:
        with pytest.raises(RuntimeError, match="attach"):
            process.submit(request())
    finally:
        process.stop()


def test_an_engine_process_that_dies_fails_its_requests_and_the_next_ones() -> None:
    async def scenario() -> EngineProcess:
        process = attached(functools.partial(StubEngine, round_s=0.002, tau=1, max_batch=2))
        long = process.submit(request(max_new_tokens=2000))
        crash = process.submit(request("crash"))
        for job in (long, crash):
            with pytest.raises(RuntimeError, match=r"engine process exited \(code 3\)"):
                await result(job)
        with pytest.raises(RuntimeError, match="engine process exited"):
            await result(process.submit(request()), timeout=1)
        assert not process.alive
        process.stop()  # stopping a dead engine is harmless
        return process

    asyncio.run(scenario())


def test_stop_ends_the_process_promptly() -> None:
    async def scenario() -> None:
        process = attached(functools.partial(StubEngine, round_s=0.001))
        assert (await result(process.submit(request()))).output_ids == expected_ids(10)
        t = time.perf_counter()
        process.stop()
        assert not process.alive and time.perf_counter() - t < 3.0

    asyncio.run(scenario())


def test_the_app_over_http_around_an_engine_process() -> None:
    process = EngineProcess(functools.partial(StubEngine, round_s=0.001, tau=TAU, max_batch=4))
    app = create_app(process, ByteTokenizer(), method="ddtree", budget=32, model_name="stub")
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(100):
            if server.started:
                break
            time.sleep(0.05)
        body = httpx.post(f"{url}/generate", json={"text": "hello", "sampling_params": {"max_new_tokens": 7}},
                          timeout=30).json()
        assert body["output_ids"] == expected_ids(7)
        assert body["meta_info"]["spec_verify_ct"] == 2 and body["meta_info"]["completion_tokens"] == 7
        bad = httpx.post(f"{url}/generate", json={"text": "fail", "sampling_params": {"max_new_tokens": 3}},
                         timeout=30)
        assert bad.status_code == 500 and "refuses the prompt" in bad.json()["error"]["message"]
        with httpx.stream("POST", f"{url}/generate", json={"text": "hi", "stream": True,
                                                           "sampling_params": {"max_new_tokens": 8}}, timeout=30) as r:
            events = [line for line in r.iter_lines() if line.startswith("data: ")]
        assert events[-1] == "data: [DONE]" and len(events) >= 3
        info = httpx.get(f"{url}/server_info", timeout=30).json()
        assert info["engine_loop"]["admissions"] == 2 and info["request_timeline"]["requests"] == 1
        assert httpx.get(f"{url}/health", timeout=30).status_code == 200
        crashed = httpx.post(f"{url}/generate", json={"text": "crash", "sampling_params": {"max_new_tokens": 3}},
                             timeout=30)
        assert crashed.status_code == 500 and "engine process exited (code 3)" in crashed.json()["error"]["message"]
        assert httpx.get(f"{url}/health", timeout=30).status_code == 503
    finally:
        server.should_exit = True
        thread.join(timeout=10)
    assert not process.alive  # the app's shutdown stopped the engine process
