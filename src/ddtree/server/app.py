"""FastAPI app of the reference server, speaking SGLang's HTTP dialect.

Decoding runs in a scheduler (`ddtree.engine.scheduler`): with the batched engine, concurrent requests are
decoded together (continuous batching, admitted in arrival order); with the Hugging Face engine, one at a time
in arrival order. `ddtree serve` runs it in an engine process of its own (`engine_process.EngineProcess`, whose
pipe this event loop reads), so HTTP and decoding do not share a GIL; an engine object passed in directly is
decoded by a daemon thread of this process (tests, benchmarks). The event loop stays free (health answers while
decoding), and a stuck decode never blocks process exit on SIGTERM.
Streaming responses are fed by the engine's per-round `on_tokens` callback (streaming.py), so
they do not depend on how the worker schedules requests.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse

import ddtree
from ddtree.engine.scheduler import make_scheduler
from ddtree.engine.types import METHODS, GenerationOutput, GenerationRequest
from ddtree.server.protocol import (
    Limits,
    ParsedGenerate,
    RequestError,
    TokenizerLike,
    check_budget,
    check_method,
    parse_completion,
    parse_generate,
    parse_json_body,
    sample_seed,
)
from ddtree.server.streaming import Failed, Finished, RequestCancelled, TokenStream, render_text, stable_text

log = logging.getLogger("ddtree.server")


class EngineLike(Protocol):
    """What the server needs from an engine (`ddtree.engine.make_engine`); the scheduler drives it."""

    max_context: int

    def generate(
        self,
        request: GenerationRequest,
        *,
        method: str | None = None,
        budget: int | None = None,
        on_tokens: Callable[[list[int]], None] | None = None,
    ) -> GenerationOutput: ...


@dataclass
class RequestTimeline:
    """Where finished non-streaming samples spent their time in the server, cumulative seconds (`/server_info`'s
    `request_timeline`; a benchmark differences two snapshots): waiting for a batch row (arrival to admission),
    in the engine (admission to its result: prefill, rounds, the round in flight when it ended), and the hand-off
    back to the event loop (the decoding thread's result to the handler resuming: the loop's and the GIL's
    latency). A client's cycle less their sum is the rest: HTTP both ways, parsing the request and writing the
    response, and the client's own time."""

    requests: int = 0
    queue_s: float = 0.0
    engine_s: float = 0.0
    handoff_s: float = 0.0

    def add(self, job: Any, arrival: float, resumed: float) -> None:
        if job.started_at is None or job.finished_at is None:
            return
        self.requests += 1
        self.queue_s += job.started_at - arrival
        self.engine_s += job.finished_at - job.started_at
        self.handoff_s += resumed - job.finished_at

    @staticmethod
    def per_request_ms(before: dict[str, float] | None, after: dict[str, float] | None) -> dict[str, float] | None:
        """Mean ms a finished request spent in each phase between two `/server_info` snapshots of the timeline
        (None when a snapshot is missing or no request finished in between)."""
        if not before or not after or after["requests"] <= before["requests"]:
            return None
        n = after["requests"] - before["requests"]
        return {f"{k}_ms": 1e3 * (after[f"{k}_s"] - before[f"{k}_s"]) / n for k in ("queue", "engine", "handoff")}


@dataclass
class ServerState:
    engine: EngineLike
    tokenizer: TokenizerLike
    method: str
    budget: int
    model_name: str
    tokenizer_path: str
    device: str
    dtype: str
    limits: Limits
    worker: Any  # ddtree.engine.scheduler scheduler: submit(request, method=, budget=, on_tokens=) -> Job
    created: int  # when the model was loaded (unix seconds), for /v1/models
    accept_length_sum: float = 0.0  # over finished speculative requests, for avg_spec_accept_length
    finished: int = 0
    timeline: RequestTimeline = field(default_factory=RequestTimeline)
    extra_info: dict[str, Any] = field(default_factory=dict)


class InternalError(Exception):
    """An unexpected failure while serving a request (HTTP 500)."""


def error_response(status: int, message: str, kind: str) -> JSONResponse:
    return JSONResponse(status_code=status, content={"error": {"message": message, "type": kind}})


def as_http_error(exc: BaseException) -> Exception:
    """Requests are validated before they reach the engine, so whatever the engine raises (KV
    capacity, non-finite logits, ...) is the server's fault: a 500, and the server keeps serving."""
    if isinstance(exc, RequestError):
        return exc
    log.error("generation failed", exc_info=(type(exc), exc, exc.__traceback__))
    return InternalError(f"internal error: {type(exc).__name__}: {exc}")


def sse(body: Any) -> bytes:
    return f"data: {json.dumps(body)}\n\n".encode()


SSE_DONE = b"data: [DONE]\n\n"


def infer_vocab_size(engine: Any, tokenizer: TokenizerLike, model_vocab_size: int | None = None) -> int:
    """Ids must be valid for both the model's embedding and the tokenizer's decoder."""
    sizes = [len(tokenizer)]
    for value in (model_vocab_size, getattr(engine, "vocab_size", None)):
        if isinstance(value, int) and value > 0:
            sizes.append(value)
    return min(sizes)


def finish_reason(output: GenerationOutput, request: GenerationRequest) -> dict[str, Any]:
    """SGLang's `finish_reason`: {"type": "length", "length": max_new_tokens} or {"type": "stop",
    "matched": the stop token id or stop string}."""
    if output.finish_reason == "length":
        return {"type": "length", "length": request.max_new_tokens}
    reason: dict[str, Any] = {"type": output.finish_reason}
    matched = getattr(output, "matched_stop", None)
    if matched is not None:
        reason["matched"] = matched
    return reason


def ran_method(state: ServerState, parsed: ParsedGenerate, output: GenerationOutput) -> str:
    return getattr(output, "method", "") or parsed.method or state.method


def build_meta_info(
    state: ServerState,
    parsed: ParsedGenerate,
    output: GenerationOutput,
    *,
    rid: str,
    queue_wait: float,
    e2e_latency: float,
) -> dict[str, Any]:
    """`meta_info` with the keys of docs/CONTRACTS.md (the `spec_*` ones only for speculative methods,
    as SGLang sends them only with speculative decoding on)."""
    completion = len(output.output_ids)
    rounds = int(output.rounds)
    expected = [float(x) for x in output.expected_accept_lens]
    method = ran_method(state, parsed, output)
    meta: dict[str, Any] = {
        "id": rid,
        "prompt_tokens": len(parsed.request.input_ids),
        "completion_tokens": completion,
        "cached_tokens": 0,  # no prefix cache: every prompt token is computed
        "finish_reason": finish_reason(output, parsed.request),
    }
    if method != "ar":
        meta["spec_verify_ct"] = rounds
        # SGLang's definition: committed tokens per verify round, bonus included
        meta["spec_accept_length"] = completion / max(rounds, 1)
        # expected tokens per round incl. the bonus, the variance-free counterpart of tau
        meta["spec_expected_accept_length"] = (1.0 + sum(expected) / len(expected)) if expected else None
    meta.update({
        "e2e_latency": e2e_latency,
        "ttft": queue_wait + float(output.ttft),  # from arrival, like SGLang
        "decode_time": float(output.decode_time),
        "accept_lens": [int(x) for x in output.accept_lens],
        "expected_accept_lens": expected,
        "stage_times": {k: float(v) for k, v in output.stage_times.items()},
        # per round, nats: the target's processed next-token entropy at the round's root (speculative methods)
        "entropies": [float(x) for x in getattr(output, "entropies", [])],
        # the engine reports what it actually ran (budget 0 for ar, the chain length for dflash)
        "method": method,
        "budget": getattr(output, "budget", 0) if getattr(output, "method", "") else parsed.budget or state.budget,
    })
    return meta


@dataclass
class Generation:
    """One sample of a request, queued on the decoding scheduler."""

    task: asyncio.Future  # -> GenerationOutput
    arrival: float  # perf_counter
    job: Any  # the scheduler's Job: started_at is set when decoding begins
    tokens: TokenStream | None  # chunks as rounds commit them (streaming only)

    def timings(self) -> tuple[float, float]:
        """(queue wait, e2e latency so far), both from arrival."""
        now = time.perf_counter()
        started = self.job.started_at
        return (started if started is not None else now) - self.arrival, now - self.arrival


def start_generation(state: ServerState, parsed: ParsedGenerate, index: int = 0, *, stream: bool = False) -> Generation:
    """Queue sample `index` of `parsed` (its own seed when n > 1); with `stream`, its tokens flow
    into `Generation.tokens` as the engine commits them. The result and the chunks both reach the event
    loop through call_soon_threadsafe from the decoding thread, so the result never overtakes a chunk."""
    request = dataclasses.replace(parsed.request, seed=sample_seed(parsed.request.seed, index))
    tokens = TokenStream(asyncio.get_running_loop()) if stream else None
    arrival = time.perf_counter()
    job = state.worker.submit(request, method=parsed.method or state.method, budget=parsed.budget or state.budget,
                              on_tokens=tokens.on_tokens if tokens is not None else None)
    task = asyncio.wrap_future(job.future)  # cancelling it drops a request that has not started
    if tokens is not None:
        task.add_done_callback(tokens.settle)
    return Generation(task=task, arrival=arrival, job=job, tokens=tokens)


async def run_all(state: ServerState, parsed: ParsedGenerate) -> list[tuple[GenerationOutput, float, float]]:
    """Decode the request's n samples; returns (output, queue wait, e2e latency) per sample."""
    generations = [start_generation(state, parsed, i) for i in range(parsed.n)]
    results: list[tuple[GenerationOutput, float, float]] = []
    errors: list[BaseException] = []
    for gen in generations:  # awaited in order: every sample settles, none is left unretrieved
        try:
            output = await gen.task
        except asyncio.CancelledError:
            for other in generations:
                other.task.cancel()
            raise
        except Exception as exc:
            errors.append(exc)
            continue
        state.timeline.add(gen.job, gen.arrival, time.perf_counter())
        results.append((output, *gen.timings()))
    if errors:
        raise as_http_error(errors[0])
    return results


def _record_finished(state: ServerState, meta: dict[str, Any]) -> None:
    if "spec_accept_length" in meta:
        state.accept_length_sum += meta["spec_accept_length"]
        state.finished += 1


def _text(state: ServerState, parsed: ParsedGenerate, ids: list[int]) -> str:
    return render_text(state.tokenizer, ids, parsed.request.stop_strings, parsed.skip_special_tokens)


def generate_body(
    state: ServerState, parsed: ParsedGenerate, output: GenerationOutput, rid: str, queue_wait: float, e2e: float
) -> dict[str, Any]:
    meta = build_meta_info(state, parsed, output, rid=rid, queue_wait=queue_wait, e2e_latency=e2e)
    _record_finished(state, meta)
    return {"text": _text(state, parsed, output.output_ids), "output_ids": list(output.output_ids), "meta_info": meta}


async def first_item(gen: Generation) -> list[int] | Finished:
    """Wait for the first chunk before answering, so a failure before any token is a plain 500."""
    assert gen.tokens is not None
    try:
        item = await gen.tokens.next()
    except asyncio.CancelledError:  # the client left while the request was queued
        gen.tokens.cancel()
        raise
    if isinstance(item, Failed):
        raise as_http_error(item.error)
    return item


async def stream_events(
    gen: Generation, first: list[int] | Finished, on_chunk: Callable[[list[int]], list[bytes]],
    on_finished: Callable[[Finished], list[bytes]],
) -> AsyncIterator[bytes]:
    """SSE body: events for each chunk, the final events, `[DONE]`. A failure after the first event
    becomes an error event (SGLang's behaviour); a client that leaves stops the decode."""
    assert gen.tokens is not None
    item: Any = first
    ended = False
    try:
        while not ended:
            if isinstance(item, Finished):
                ended = True
                for event in on_finished(item):
                    yield event
            elif isinstance(item, Failed):
                ended = True
                if not isinstance(item.error, RequestCancelled):
                    error = as_http_error(item.error)
                    yield sse({"error": {"message": str(error), "type": "internal_error", "code": 500}})
            else:
                for event in on_chunk(item):
                    yield event
                item = await gen.tokens.next()
        yield SSE_DONE
    finally:
        if not ended:
            gen.tokens.cancel()


def create_app(
    engine: EngineLike,
    tokenizer: TokenizerLike,
    *,
    method: str,
    budget: int,
    model_name: str,
    max_budget: int | None = None,
    tokenizer_path: str | None = None,
    device: str = "cpu",
    dtype: str = "float32",
    vocab_size: int | None = None,
    extra_info: dict[str, Any] | None = None,
) -> FastAPI:
    """Build the app around any object with `generate(request, method=, budget=, on_tokens=)` and
    `max_context` (decoded by a scheduler thread of this process), or around an `EngineProcess` (decoding in
    its own process: what `ddtree serve` runs). Per-request budgets are bounded by `max_budget` (default:
    `budget`)."""
    method = check_method(method, "method")
    budget = check_budget(budget, "budget")
    max_budget = budget if max_budget is None else check_budget(max_budget, "max_budget")
    if max_budget < budget:
        raise ValueError(f"max_budget ({max_budget}) must be >= budget ({budget})")
    max_context = getattr(engine, "max_context", None)
    if not isinstance(max_context, int) or max_context < 2:
        raise ValueError(f"engine.max_context must be an int >= 2, got {max_context!r}")
    # an engine without a drafter (an `ar`-only pair) says so with `drafter = None`
    methods = ("ar",) if getattr(engine, "drafter", True) is None else METHODS
    if method not in methods:
        raise ValueError(f"method {method!r} needs a drafter; this pair has none")
    state = ServerState(
        engine=engine,
        tokenizer=tokenizer,
        method=method,
        budget=budget,
        model_name=model_name,
        tokenizer_path=tokenizer_path or model_name,
        device=device,
        dtype=dtype,
        limits=Limits(max_context=max_context, vocab_size=infer_vocab_size(engine, tokenizer, vocab_size),
                      max_budget=max_budget, methods=methods),
        # an engine in another process (`engine_process.EngineProcess`) is its own scheduler
        worker=engine if hasattr(engine, "submit") else make_scheduler(engine),
        created=int(time.time()),
        extra_info=dict(extra_info or {}),
    )

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        attach = getattr(state.worker, "attach", None)
        if attach is not None:  # an engine process: its results are read on this loop
            attach(asyncio.get_running_loop())
        yield
        state.worker.stop()

    app = FastAPI(title="ddtree reference server", version=ddtree.__version__, lifespan=lifespan)
    app.state.ddtree = state

    @app.exception_handler(RequestError)
    async def _bad_request(_: Request, exc: RequestError) -> JSONResponse:
        return error_response(400, str(exc), "invalid_request_error")

    @app.exception_handler(InternalError)
    async def _internal(_: Request, exc: InternalError) -> JSONResponse:
        return error_response(500, str(exc), "internal_error")

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        log.error("unexpected error", exc_info=(type(exc), exc, exc.__traceback__))
        return error_response(500, f"internal error: {type(exc).__name__}: {exc}", "internal_error")

    def model_card() -> dict[str, Any]:
        return {"id": model_name, "object": "model", "created": state.created, "owned_by": "ddtree",
                "root": model_name, "parent": None, "max_model_len": max_context}

    @app.get("/health")
    async def health() -> PlainTextResponse:
        if not getattr(state.worker, "alive", True):  # the engine process has exited: nothing can be decoded
            return PlainTextResponse("the engine process has exited", status_code=503)
        return PlainTextResponse("ok")

    @app.get("/health_generate")
    async def health_generate() -> PlainTextResponse:
        ids = list(tokenizer.encode("ok"))[:1] or [0]
        parsed = ParsedGenerate(
            request=GenerationRequest(input_ids=ids, max_new_tokens=1, temperature=0.0), rid=None, method=None,
            budget=None,
        )
        try:
            await run_all(state, parsed)
        except Exception as exc:  # unhealthy, but the server keeps serving
            return PlainTextResponse(f"generation failed: {exc}", status_code=503)
        return PlainTextResponse("ok")

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [model_card()]}

    @app.get("/v1/models/{model:path}")
    async def retrieve_model(model: str) -> Any:
        if model != model_name:
            return JSONResponse(status_code=404, content={"error": {
                "message": f"The model '{model}' does not exist", "type": "invalid_request_error", "param": "model",
                "code": "model_not_found"}})
        return model_card()

    @app.get("/server_info")
    async def server_info() -> dict[str, Any]:
        avg = state.accept_length_sum / state.finished if state.finished else None
        return {
            "model_path": model_name,
            "tokenizer_path": state.tokenizer_path,
            "served_model_name": model_name,
            "method": state.method,
            "budget": state.budget,
            "max_budget": state.limits.max_budget,
            "device": device,
            "dtype": dtype,
            "max_context": state.limits.max_context,
            "version": ddtree.__version__,
            "internal_states": [{"avg_spec_accept_length": avg, "finished_requests": state.finished}],
            # cumulative seconds of the decoding loop by phase (`ddtree.engine.types.LoopStats`), or None
            "engine_loop": loop_stats() if (loop_stats := getattr(state.worker, "loop_stats", None)) else None,
            "request_timeline": dataclasses.asdict(state.timeline),  # cumulative seconds by phase (RequestTimeline)
            **state.extra_info,
        }

    @app.get("/model_info")
    @app.get("/get_model_info")
    async def model_info() -> dict[str, Any]:
        return {"model_path": model_name, "tokenizer_path": state.tokenizer_path, "is_generation": True}

    @app.post("/flush_cache")
    async def flush_cache() -> PlainTextResponse:
        return PlainTextResponse("no prefix cache to flush")  # every request starts from an empty KV cache

    @app.post("/generate")
    async def generate(request: Request) -> Any:
        parsed = parse_generate(parse_json_body(await request.body()), tokenizer, state.limits)
        rid = parsed.rid or uuid.uuid4().hex
        if parsed.stream:
            return await stream_generate(parsed, rid)
        results = await run_all(state, parsed)
        bodies = [generate_body(state, parsed, out, rid if parsed.n == 1 else f"{rid}_{i}", wait, e2e)
                  for i, (out, wait, e2e) in enumerate(results)]
        # rendered here: FastAPI's encoder would walk every id and float of the body first (~0.3 ms a request)
        return JSONResponse(bodies[0] if parsed.n == 1 else bodies)

    async def stream_generate(parsed: ParsedGenerate, rid: str) -> StreamingResponse:
        """SGLang's default stream: every event carries the cumulative `text` and `output_ids`."""
        gen = start_generation(state, parsed, stream=True)
        first = await first_item(gen)
        ids: list[int] = []
        prompt_tokens = len(parsed.request.input_ids)

        def on_chunk(chunk: list[int]) -> list[bytes]:
            ids.extend(chunk)
            text = stable_text(_text(state, parsed, ids), parsed.request.stop_strings)
            meta = {"id": rid, "finish_reason": None, "prompt_tokens": prompt_tokens, "completion_tokens": len(ids),
                    "cached_tokens": 0}
            return [sse({"text": text, "output_ids": list(ids), "meta_info": meta})]

        def on_finished(item: Finished) -> list[bytes]:
            return [sse(generate_body(state, parsed, item.output, rid, *gen.timings()))]

        return StreamingResponse(stream_events(gen, first, on_chunk, on_finished), media_type="text/event-stream")

    @app.post("/v1/completions")
    async def completions(request: Request) -> Any:
        payload = parse_json_body(await request.body())
        parsed = parse_completion(payload, tokenizer, state.limits)
        cid = parsed.rid or f"cmpl-{uuid.uuid4().hex}"
        created = int(time.time())
        model = payload.get("model") or model_name
        echo = payload["prompt"] if parsed.echo else ""
        if parsed.stream:
            return await stream_completion(parsed, cid, created, model, echo)
        results = await run_all(state, parsed)
        choices = []
        for i, (out, wait, e2e) in enumerate(results):
            _record_finished(state, build_meta_info(state, parsed, out, rid=cid, queue_wait=wait, e2e_latency=e2e))
            choices.append({"index": i, "text": echo + _text(state, parsed, out.output_ids), "logprobs": None,
                            "finish_reason": out.finish_reason, "matched_stop": out.matched_stop})
        prompt_tokens = len(parsed.request.input_ids)
        completion_tokens = sum(len(out.output_ids) for out, _, _ in results)
        return JSONResponse({
            "id": cid,
            "object": "text_completion",
            "created": created,
            "model": model,
            "choices": choices,
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens},
        })

    async def stream_completion(
        parsed: ParsedGenerate, cid: str, created: int, model: str, echo: str
    ) -> StreamingResponse:
        """OpenAI's completion stream: each chunk's `text` is the new part only."""
        gen = start_generation(state, parsed, stream=True)
        first = await first_item(gen)
        ids: list[int] = []
        sent = [""]  # what the client has so far (echo + completion text), as a one-element cell

        def chunk(text: str, reason: str | None = None, matched: int | str | None = None) -> bytes:
            return sse({"id": cid, "object": "text_completion", "created": created, "model": model,
                        "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": reason,
                                     "matched_stop": matched}]})

        def delta(text: str) -> str:
            full = echo + text
            if not full.startswith(sent[0]):  # stable_text prevents this; a sent chunk cannot be taken back
                log.warning("streamed text is not a prefix of the final text; sending its tail")
            new, sent[0] = full[len(sent[0]):], full
            return new

        def on_chunk(new_ids: list[int]) -> list[bytes]:
            ids.extend(new_ids)
            text = delta(stable_text(_text(state, parsed, ids), parsed.request.stop_strings))
            return [chunk(text)] if text else []

        def on_finished(item: Finished) -> list[bytes]:
            out = item.output
            wait, e2e = gen.timings()
            _record_finished(state, build_meta_info(state, parsed, out, rid=cid, queue_wait=wait, e2e_latency=e2e))
            events = [chunk(delta(_text(state, parsed, out.output_ids)), out.finish_reason, out.matched_stop)]
            if parsed.include_usage:
                prompt_tokens, completion_tokens = len(parsed.request.input_ids), len(out.output_ids)
                events.append(sse({"id": cid, "object": "text_completion", "created": created, "model": model,
                                   "choices": [], "usage": {"prompt_tokens": prompt_tokens,
                                                            "completion_tokens": completion_tokens,
                                                            "total_tokens": prompt_tokens + completion_tokens}}))
            return events

        return StreamingResponse(stream_events(gen, first, on_chunk, on_finished), media_type="text/event-stream")

    return app
