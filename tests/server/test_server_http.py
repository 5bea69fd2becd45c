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
from ddtree.bench.schema import ServerSpec
from ddtree.bench.session import ServerProcess, free_port, port_is_free, server_command, start_server, stop_server
from ddtree.engine.types import GenerationRequest
from ddtree.server.protocol import UNSUPPORTED_COMPLETION, UNSUPPORTED_GENERATE, UNSUPPORTED_SAMPLING

BUDGET = 16
MAX_NEW = 12


def launch(pair: Path, log: Path, method: str = "ddtree") -> ServerProcess:
    port = free_port()
    cmd = server_command(ServerSpec(model=str(pair), method=method, budget=BUDGET), "127.0.0.1", port)
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
        "id", "prompt_tokens", "completion_tokens", "cached_tokens", "finish_reason", "spec_verify_ct",
        "spec_accept_length",
        "e2e_latency", "ttft", "decode_time", "accept_lens", "expected_accept_lens", "spec_expected_accept_length",
        "stage_times", "entropies", "method", "budget"}
    assert meta["id"] == "req-1" and meta["method"] == "ddtree" and meta["budget"] == BUDGET
    assert meta["completion_tokens"] == len(body["output_ids"]) == MAX_NEW  # EOS ignored: full length
    assert meta["finish_reason"] == {"type": "length", "length": MAX_NEW}  # SGLang's FINISH_LENGTH
    assert meta["cached_tokens"] == 0  # no prefix cache
    assert meta["spec_verify_ct"] == len(meta["accept_lens"]) == len(meta["expected_accept_lens"]) >= 1
    assert meta["spec_accept_length"] == pytest.approx(meta["completion_tokens"] / meta["spec_verify_ct"])
    # the first token comes from the prefill; each round commits its accepted drafts + a bonus
    assert sum(meta["accept_lens"]) + meta["spec_verify_ct"] >= meta["completion_tokens"] - 1
    assert all(0 <= a <= BUDGET for a in meta["accept_lens"])
    assert all(e >= 0 for e in meta["expected_accept_lens"])
    assert set(meta["stage_times"]) == {"draft", "tree_build", "tree_compile", "verify", "commit"}
    # the CPU server times its stages by default (`--stage-times auto`: a clock read per stage there)
    assert all(meta["stage_times"][s] > 0 for s in ("draft", "tree_build", "verify", "commit"))
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
    assert (choice["matched_stop"] is None) == (choice["finish_reason"] == "length")
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
    loop = info["engine_loop"]  # the batch scheduler's cumulative phases
    assert loop["rounds"] > 0 and loop["admissions"] >= info["internal_states"][0]["finished_requests"]
    assert loop["wait_s"] > 0 and loop["idle_s"] > 0  # idle between the tests' requests
    # finished non-streaming requests by phase: a row, the engine, the hand-off back to the event loop
    timeline = info["request_timeline"]
    assert timeline["requests"] >= 1 and timeline["engine_s"] > 0
    assert timeline["queue_s"] >= 0 and timeline["handoff_s"] >= 0
    post(server.url, "/generate", {"text": "def f", "sampling_params": {"max_new_tokens": 3, "temperature": 0}})
    after = httpx.get(f"{server.url}/server_info", trust_env=False).json()["request_timeline"]
    assert after["requests"] == timeline["requests"] + 1 and after["engine_s"] > timeline["engine_s"]
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


def stream_events(url: str, path: str, body: dict) -> list[str]:
    with httpx.stream("POST", f"{url}{path}", json=body, timeout=120, trust_env=False) as response:
        assert response.status_code == 200, response.read()
        return [line.removeprefix("data: ") for line in response.iter_lines() if line]


@pytest.mark.parametrize("stop", [None, "\n"])
def test_streamed_and_plain_outputs_are_identical_at_t0(server: ServerProcess, prompts: list[str], stop) -> None:
    for text in prompts:
        sp = {"max_new_tokens": 24, "temperature": 0.0, "ignore_eos": True, "stop": stop}
        plain = post(server.url, "/generate", {"text": text, "sampling_params": sp}).json()
        events = stream_events(server.url, "/generate", {"text": text, "sampling_params": sp, "stream": True})
        assert events[-1] == "[DONE]"
        bodies = [json.loads(e) for e in events[:-1]]
        final = bodies[-1]
        assert final["output_ids"] == plain["output_ids"] and final["text"] == plain["text"]
        assert final["meta_info"]["accept_lens"] == plain["meta_info"]["accept_lens"]
        # at most one event per committed round (prefill + verify rounds; rounds the event loop fell behind on are
        # merged into one event, `TokenStream.next`), each extending the previous one
        counts = [b["meta_info"]["completion_tokens"] for b in bodies[:-1]]
        if stop is None:
            assert 1 <= len(counts) <= 1 + final["meta_info"]["spec_verify_ct"]
        assert counts == sorted(counts) and counts[-1] == len(final["output_ids"])
        for body in bodies[:-1]:
            assert plain["output_ids"][:len(body["output_ids"])] == body["output_ids"]
            assert plain["text"].startswith(body["text"])
        comp = {"prompt": text, "max_tokens": 24, "temperature": 0, "ignore_eos": True, "stop": stop}
        plain_c = post(server.url, "/v1/completions", comp).json()["choices"][0]
        chunks = [json.loads(e) for e in stream_events(server.url, "/v1/completions", {**comp, "stream": True})[:-1]]
        assert "".join(c["choices"][0]["text"] for c in chunks) == plain_c["text"] == plain["text"]
        assert chunks[-1]["choices"][0]["finish_reason"] == plain_c["finish_reason"]
        assert chunks[-1]["choices"][0]["matched_stop"] == plain_c["matched_stop"]


NON_NEUTRAL = {"min_p": 0.1, "frequency_penalty": 0.5, "presence_penalty": 0.5, "repetition_penalty": 1.1,
               "min_new_tokens": 3, "min_tokens": 3, "json_schema": "{}", "regex": "a", "ebnf": "r ::= 'a'",
               "structural_tag": "{}", "stop_regex": "a", "logit_bias": {"1": 2.0}, "custom_params": {"a": 1},
               "watermark": {"k": 1}, "no_stop_trim": True, "spaces_between_special_tokens": False, "beam_width": 2,
               "stream_interval": 3, "logprobs": 2, "response_format": {"type": "json_object"}}


@pytest.mark.parametrize(
    ("path", "where", "name"),
    [("/generate", "sampling_params", n) for n in sorted(UNSUPPORTED_SAMPLING)]
    + [("/generate", "top", n) for n in sorted(UNSUPPORTED_GENERATE)]
    + [("/v1/completions", "top", n) for n in sorted(UNSUPPORTED_COMPLETION)],
)
def test_each_unsupported_parameter_is_a_400_naming_it(server: ServerProcess, path: str, where: str,
                                                       name: str) -> None:
    value = NON_NEUTRAL.get(name, "x")  # "x" is not the neutral value of any boolean, number or null field
    body = {"text": "a"} if path == "/generate" else {"prompt": "a"}
    if where == "sampling_params":
        body["sampling_params"] = {name: value}
    else:
        body[name] = value
    response = post(server.url, path, body)
    assert response.status_code == 400, (name, response.text)
    expected = f"sampling_params.{name}" if where == "sampling_params" else name
    assert response.json()["error"]["message"].startswith(f"{expected}:")


def test_budget_is_bounded_by_max_budget_and_the_server_survives(server: ServerProcess) -> None:
    for path, body in (("/generate", {"text": "a", "budget": 300000}),
                       ("/v1/completions", {"prompt": "a", "budget": BUDGET + 1})):
        response = post(server.url, path, body)
        assert response.status_code == 400 and response.json()["error"]["message"].startswith("budget:")
    info = httpx.get(f"{server.url}/server_info", trust_env=False).json()
    assert info["max_budget"] == BUDGET  # --max-budget defaults to --budget
    ok = post(server.url, "/generate", {"text": "a", "budget": 4, "sampling_params": {"max_new_tokens": 4}})
    assert ok.status_code == 200 and ok.json()["meta_info"]["budget"] == 4


def test_n_samples(server: ServerProcess, prompts: list[str]) -> None:
    sp = {"max_new_tokens": 6, "temperature": 1.0, "sampling_seed": 7, "n": 3}
    many = post(server.url, "/generate", {"text": prompts[0], "sampling_params": sp}).json()
    assert len(many) == 3
    for i, body in enumerate(many):  # sample i is the single request with seed 7 + i
        one = post(server.url, "/generate", {"text": prompts[0], "sampling_params": {
            **sp, "n": 1, "sampling_seed": 7 + i}}).json()
        assert body["output_ids"] == one["output_ids"]


def test_the_openai_client(server: ServerProcess, prompts: list[str]) -> None:
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0)
    (model,) = [m.id for m in client.models.list()]
    plain = client.completions.create(model=model, prompt=prompts[1], max_tokens=10, temperature=0)
    stream = client.completions.create(model=model, prompt=prompts[1], max_tokens=10, temperature=0, stream=True,
                                       stream_options={"include_usage": True})
    chunks = list(stream)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == plain.choices[0].text
    assert chunks[-1].usage.completion_tokens == plain.usage.completion_tokens
    with pytest.raises(openai.BadRequestError, match="presence_penalty"):
        client.completions.create(model=model, prompt="a", max_tokens=2, presence_penalty=1.0)


def test_unknown_method_at_startup_exits_with_a_message(tiny_pair: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "ddtree.cli", "serve", "--model", str(tiny_pair), "--method",
                           "beam", "--port", str(free_port())], capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "unknown --method 'beam'" in done.stderr


def test_sigterm_stops_the_server_within_seconds(tiny_pair: Path, tmp_path: Path) -> None:
    srv = launch(tiny_pair, tmp_path / "server.log", method="ar")
    try:
        body = post(srv.url, "/generate", {"text": "def f(x):\n", "sampling_params": {
            "max_new_tokens": 4, "temperature": 0}}).json()
        meta = body["meta_info"]
        assert meta["method"] == "ar" and not any(k.startswith("spec_") for k in meta)  # as SGLang without spec

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


def test_a_decoding_failure_is_a_500_and_the_next_request_succeeds(tiny_pair: Path) -> None:
    """A real engine whose embedding of one token is NaN: a prompt holding that token gets non-finite
    logits, which the sampler refuses inside decoding. That is the server's failure, not the client's."""
    import threading

    import torch
    import uvicorn

    from ddtree.engine import DecodingEngine
    from ddtree.models import load_pair
    from ddtree.server.app import create_app

    pair = load_pair(tiny_pair, device="cpu", dtype=None)
    engine = DecodingEngine(pair, method="ddtree", budget=BUDGET, device="cpu")
    good = GenerationRequest(input_ids=[5, 6, 7], max_new_tokens=4, temperature=0.0)
    used = {*good.input_ids, *engine.generate(good).output_ids, engine.mask_token_id, pair.tokenizer.eos_token_id}
    # a token the good request never embeds, which a text prompt can hold (it survives decode + encode)
    poisoned = next(t for t in range(100, engine.vocab_size) if t not in used
                    and pair.tokenizer.encode(pair.tokenizer.decode([t])) == [t])
    embed = pair.target.get_input_embeddings()
    with torch.no_grad():  # untied first: the output head keeps finite weights
        embed.weight = torch.nn.Parameter(embed.weight.clone())
        embed.weight[poisoned] = float("nan")
    app = create_app(engine, pair.tokenizer, method="ddtree", budget=BUDGET, model_name="poisoned")
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="critical"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for_health(url, 60)
        sampled = {"max_new_tokens": 4, "temperature": 1.0, "sampling_seed": 0}
        for path, body in (("/generate", {"input_ids": [poisoned, 5], "sampling_params": sampled}),
                           ("/generate", {"input_ids": [poisoned, 5], "sampling_params": sampled, "stream": True}),
                           ("/v1/completions", {"prompt": pair.tokenizer.decode([poisoned]), "max_tokens": 4,
                                                "temperature": 1.0})):
            failed = post(url, path, body)
            assert failed.status_code == 500, failed.text
            error = failed.json()["error"]
            assert error["type"] == "internal_error" and "non-finite" in error["message"]
            ok = post(url, "/generate", {"input_ids": good.input_ids, "sampling_params": {
                "max_new_tokens": 4, "temperature": 0.0}})
            assert ok.status_code == 200 and len(ok.json()["output_ids"]) >= 1
    finally:
        server.should_exit = True
        thread.join(timeout=10)
