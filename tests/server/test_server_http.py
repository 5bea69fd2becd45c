"""The real reference server (`python -m ddtree.cli serve`) with the real engine on the tiny pair.

One server process per module (method ddtree, budget 16) over real HTTP on a loopback port;
the SIGTERM test starts its own (method ar).
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from ddtree.bench.http_client import wait_for_health
from ddtree.bench.session import ServerProcess, free_port, port_is_free, server_command, start_server, stop_server
from ddtree.engine.types import GenerationRequest

BUDGET = 16
MAX_NEW = 12


def launch(pair: Path, log: Path, method: str = "ddtree") -> ServerProcess:
    port = free_port()
    cmd = server_command({"model": str(pair), "method": method, "budget": BUDGET}, "127.0.0.1", port)
    server = start_server(cmd, log, port=port)
    try:
        wait_for_health(server.url, 180, process=server.process, log_path=log)
    except BaseException:
        stop_server(server)
        raise
    return server


@pytest.fixture(scope="module")
def server(tiny_pair: Path, tmp_path_factory) -> Iterator[ServerProcess]:
    srv = launch(tiny_pair, tmp_path_factory.mktemp("server") / "server.log")
    yield srv
    stop_server(srv)


@pytest.fixture(scope="module")
def pair(tiny_pair: Path):
    from ddtree.models import load_pair

    return load_pair(tiny_pair, device="cpu", dtype=None)


@pytest.fixture(scope="module")
def prompts(tiny_pair: Path) -> list[str]:
    rows = [json.loads(line) for line in (tiny_pair / "prompts" / "heldout.jsonl").read_text().splitlines()]
    return [r["text"] for r in rows[:3]]


def post(url: str, path: str, body) -> httpx.Response:
    kwargs = {"content": body} if isinstance(body, (bytes, str)) else {"json": body}
    return httpx.post(f"{url}{path}", timeout=120, trust_env=False, **kwargs)


def test_greedy_generate_matches_the_engine_in_process(server: ServerProcess, pair, prompts: list[str]) -> None:
    from ddtree.engine import DecodingEngine

    engine = DecodingEngine(pair, method="ddtree", budget=BUDGET, device="cpu")
    eos = pair.tokenizer.eos_token_id
    for text in prompts:
        body = post(server.url, "/generate",
                    {"text": text, "sampling_params": {"max_new_tokens": MAX_NEW, "temperature": 0.0}}).json()
        ids = pair.tokenizer.encode(text)
        ref = engine.generate(GenerationRequest(input_ids=ids, max_new_tokens=MAX_NEW, temperature=0.0,
                                                stop_token_ids=[eos] if eos is not None else []))
        assert body["output_ids"] == ref.output_ids
        assert body["text"] == pair.tokenizer.decode(ref.output_ids, skip_special_tokens=True)
        meta = body["meta_info"]
        assert meta["prompt_tokens"] == len(ids)
        assert meta["finish_reason"]["type"] == ref.finish_reason
        assert meta["accept_lens"] == ref.accept_lens  # same rounds, same acceptance


def test_meta_info_is_complete_and_consistent(server: ServerProcess, prompts: list[str]) -> None:
    body = post(server.url, "/generate", {"text": prompts[0], "rid": "req-1", "sampling_params": {
        "max_new_tokens": MAX_NEW, "temperature": 0.0, "ignore_eos": True}}).json()
    meta = body["meta_info"]
    assert set(meta) == {
        "id", "prompt_tokens", "completion_tokens", "finish_reason", "spec_verify_ct", "spec_accept_length",
        "e2e_latency", "ttft", "decode_time", "accept_lens", "expected_accept_lens", "spec_expected_accept_length",
        "stage_times", "entropies", "method", "budget"}
    assert meta["id"] == "req-1" and meta["method"] == "ddtree" and meta["budget"] == BUDGET
    assert meta["completion_tokens"] == len(body["output_ids"]) == MAX_NEW  # EOS ignored: full length
    assert meta["finish_reason"] == {"type": "length"}
    assert meta["spec_verify_ct"] == len(meta["accept_lens"]) == len(meta["expected_accept_lens"]) >= 1
    assert meta["spec_accept_length"] == pytest.approx(meta["completion_tokens"] / meta["spec_verify_ct"])
    # the first token comes from the prefill; each round commits its accepted drafts + a bonus
    assert sum(meta["accept_lens"]) + meta["spec_verify_ct"] >= meta["completion_tokens"] - 1
    assert all(0 <= a <= BUDGET for a in meta["accept_lens"])
    assert all(e >= 0 for e in meta["expected_accept_lens"])
    assert set(meta["stage_times"]) == {"draft", "tree_build", "tree_compile", "verify", "commit"}
    assert all(v >= 0 for v in meta["stage_times"].values())
    assert 0 < meta["ttft"] <= meta["e2e_latency"] and meta["decode_time"] >= 0
    assert meta["e2e_latency"] >= meta["ttft"] + meta["decode_time"] - 1e-3


def test_sampling_seed_makes_sampling_reproducible(server: ServerProcess, prompts: list[str]) -> None:
    sp = {"max_new_tokens": MAX_NEW, "temperature": 1.0, "top_p": 0.95, "top_k": 50, "sampling_seed": 1234}
    first, second = (post(server.url, "/generate", {"text": prompts[1], "sampling_params": sp}).json()
                     for _ in range(2))
    assert first["output_ids"] == second["output_ids"]


def test_input_ids_and_stop_token(server: ServerProcess, pair, prompts: list[str]) -> None:
    ids = pair.tokenizer.encode(prompts[0])
    full = post(server.url, "/generate", {"input_ids": ids, "sampling_params": {
        "max_new_tokens": MAX_NEW, "temperature": 0, "ignore_eos": True}}).json()
    stop_id = full["output_ids"][2]
    first = full["output_ids"].index(stop_id)
    cut = post(server.url, "/generate", {"input_ids": ids, "sampling_params": {
        "max_new_tokens": MAX_NEW, "temperature": 0, "ignore_eos": True, "stop_token_ids": [stop_id]}}).json()
    assert cut["output_ids"] == full["output_ids"][:first]  # the stop token itself is not returned
    assert cut["meta_info"]["finish_reason"]["type"] == "stop"


def test_completions(server: ServerProcess, prompts: list[str]) -> None:
    reply = post(server.url, "/v1/completions",
                 {"model": "tiny", "prompt": prompts[0], "max_tokens": 6, "temperature": 0}).json()
    assert reply["object"] == "text_completion" and reply["model"] == "tiny"
    assert reply["id"].startswith("cmpl-") and isinstance(reply["created"], int)
    (choice,) = reply["choices"]
    assert choice["index"] == 0 and choice["logprobs"] is None and choice["finish_reason"] in ("length", "stop")
    assert isinstance(choice["text"], str)
    usage = reply["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert 1 <= usage["completion_tokens"] <= 6
    greedy = post(server.url, "/generate", {"text": prompts[0], "sampling_params": {
        "max_new_tokens": 6, "temperature": 0}}).json()
    assert choice["text"] == greedy["text"]


def test_server_info_and_model_info(server: ServerProcess, tiny_pair: Path) -> None:
    info = httpx.get(f"{server.url}/server_info", trust_env=False).json()
    assert info["model_path"] == str(tiny_pair) and info["method"] == "ddtree" and info["budget"] == BUDGET
    assert info["device"] == "cpu" and info["dtype"] == "float32" and info["version"]
    avg = info["internal_states"][0]["avg_spec_accept_length"]
    assert avg is not None and avg >= 1.0  # requests have finished by now
    model = httpx.get(f"{server.url}/get_model_info", trust_env=False).json()
    assert model["is_generation"] is True and model["model_path"] == str(tiny_pair)
    assert httpx.get(f"{server.url}/health_generate", timeout=60, trust_env=False).status_code == 200


def test_64_concurrent_requests(server: ServerProcess, prompts: list[str]) -> None:
    async def burst() -> tuple[list[httpx.Response], float]:
        limits = httpx.Limits(max_connections=64)
        async with httpx.AsyncClient(timeout=300, limits=limits, trust_env=False) as client:
            tasks = [asyncio.create_task(client.post(f"{server.url}/generate", json={
                "text": prompts[i % len(prompts)], "rid": f"c{i}",
                "sampling_params": {"max_new_tokens": 2, "temperature": 0.5 * (i % 2), "sampling_seed": i}}))
                for i in range(64)]
            await asyncio.sleep(0.2)
            t = time.perf_counter()
            health = await client.get(f"{server.url}/health")
            health_s = time.perf_counter() - t
            assert health.status_code == 200
            return list(await asyncio.gather(*tasks)), health_s

    responses, health_s = asyncio.run(burst())
    assert [r.status_code for r in responses] == [200] * 64
    assert sorted(r.json()["meta_info"]["id"] for r in responses) == sorted(f"c{i}" for i in range(64))
    assert health_s < 5.0  # answered while the queue was decoding


TOO_LONG = [5] * 1100  # the tiny pair's context is 1024


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/generate", b"{not json", "body"),
        ("/generate", b"[1, 2]", "body"),
        ("/generate", {"sampling_params": {"max_new_tokens": 2}}, "text"),
        ("/generate", {"text": "a", "input_ids": [1]}, "text"),
        ("/generate", {"text": "a", "sampling_params": {"temperature": -1}}, "temperature"),
        ("/generate", {"text": "a", "sampling_params": {"top_p": 0}}, "top_p"),
        ("/generate", {"text": "a", "sampling_params": {"top_p": 1.5}}, "top_p"),
        ("/generate", {"text": "a", "sampling_params": {"top_k": 1.5}}, "top_k"),
        ("/generate", {"text": "a", "sampling_params": {"top_k": "4"}}, "top_k"),
        ("/generate", {"text": "a", "sampling_params": {"max_new_tokens": 0}}, "max_new_tokens"),
        ("/generate", {"text": "a", "sampling_params": {"max_new_tokens": 5000}}, "max_new_tokens"),
        ("/generate", {"input_ids": TOO_LONG, "sampling_params": {"max_new_tokens": 1}}, "input_ids"),
        ("/generate", {"text": "x = 1\n" * 1000, "sampling_params": {"max_new_tokens": 1}}, "text"),
        ("/generate", {"text": "a", "method": "beam"}, "method"),
        ("/generate", {"input_ids": [1, 10**6]}, "input_ids"),
        ("/generate", {"input_ids": [-3]}, "input_ids"),
        ("/generate", {"text": "a", "sampling_params": {"stop_token_ids": [10**6]}}, "stop_token_ids"),
        ("/v1/completions", {"max_tokens": 2}, "prompt"),
        ("/v1/completions", {"prompt": "a", "temperature": -2}, "temperature"),
        ("/v1/completions", b"{", "body"),
    ],
)
def test_bad_input_is_a_400_naming_the_field(server: ServerProcess, path: str, body, field: str) -> None:
    response = post(server.url, path, body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and field in error["message"]
    assert httpx.get(f"{server.url}/health", trust_env=False).text == "ok"
    ok = post(server.url, "/generate", {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 1}})
    assert ok.status_code == 200


def test_unknown_method_at_startup_exits_with_a_message(tiny_pair: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "ddtree.cli", "serve", "--model", str(tiny_pair), "--method",
                           "beam", "--port", str(free_port())], capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "unknown --method 'beam'" in done.stderr


def test_sigterm_stops_the_server_within_seconds(tiny_pair: Path, tmp_path: Path) -> None:
    srv = launch(tiny_pair, tmp_path / "server.log", method="ar")
    try:
        body = post(srv.url, "/generate", {"text": "def f(x):\n", "sampling_params": {
            "max_new_tokens": 4, "temperature": 0}}).json()
        assert body["meta_info"]["method"] == "ar" and body["meta_info"]["spec_accept_length"] == pytest.approx(
            body["meta_info"]["completion_tokens"] / body["meta_info"]["spec_verify_ct"])

        async def long_requests() -> None:  # queued work, far longer than the shutdown grace
            async with httpx.AsyncClient(timeout=60, trust_env=False) as client:
                await asyncio.gather(*(client.post(f"{srv.url}/generate", json={"text": "x", "sampling_params": {
                    "max_new_tokens": 1000, "temperature": 0, "ignore_eos": True}}) for _ in range(8)),
                    return_exceptions=True)

        async def scenario() -> float:
            task = asyncio.create_task(long_requests())
            await asyncio.sleep(1.0)
            start = time.monotonic()
            srv.process.send_signal(signal.SIGTERM)
            await asyncio.get_running_loop().run_in_executor(None, srv.process.wait, 30)
            elapsed = time.monotonic() - start
            await task
            return elapsed

        elapsed = asyncio.run(scenario())
        assert elapsed < 10.0, f"took {elapsed:.1f} s"
        assert port_is_free(srv.port)
        assert "Shutting down" in (tmp_path / "server.log").read_text()
    finally:
        stop_server(srv)
