"""FastAPI app of the reference server, speaking SGLang's HTTP dialect.

Decoding runs one request at a time in a single daemon worker thread fed by a FIFO queue:
concurrent requests are all accepted and served in arrival order, the event loop stays free
(health answers while decoding), and a stuck decode never blocks process exit on SIGTERM.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import queue
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse

import ddtree
from ddtree.engine.types import GenerationOutput, GenerationRequest
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
    trim_at_stop,
)

log = logging.getLogger("ddtree.server")


class EngineLike(Protocol):
    """What the server needs from `ddtree.engine.DecodingEngine`."""

    max_context: int

    def generate(
        self, request: GenerationRequest, *, method: str | None = None, budget: int | None = None
    ) -> GenerationOutput: ...


class SerialWorker:
    """One daemon thread running submitted calls in FIFO order; results come back as asyncio futures."""

    def __init__(self, name: str = "ddtree-decode") -> None:
        self._jobs: queue.SimpleQueue[tuple[Callable[[], Any], asyncio.AbstractEventLoop, asyncio.Future] | None]
        self._jobs = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while (job := self._jobs.get()) is not None:
            fn, loop, future = job
            if future.cancelled():  # its request is gone (shutdown): do not decode for nobody
                continue
            try:
                result, error = fn(), None
            except BaseException as exc:  # handed to the awaiting request
                result, error = None, exc
            loop.call_soon_threadsafe(_settle, future, result, error)

    async def run(self, fn: Callable[[], Any]) -> Any:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._jobs.put((fn, loop, future))
        return await future

    def stop(self) -> None:
        self._jobs.put(None)


def _settle(future: asyncio.Future, result: Any, error: BaseException | None) -> None:
    if future.cancelled():  # the client went away or the server is shutting down
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


@dataclass
class ServerState:
    engine: EngineLike
    tokenizer: TokenizerLike
    method: str
    budget: int
    model_name: str
    device: str
    dtype: str
    limits: Limits
    worker: SerialWorker
    accept_length_sum: float = 0.0  # over finished requests, for avg_spec_accept_length
    finished: int = 0
    extra_info: dict[str, Any] = field(default_factory=dict)


async def sse_events(body: dict[str, Any]) -> AsyncIterator[bytes]:
    yield f"data: {json.dumps(body)}\n\n".encode()
    yield b"data: [DONE]\n\n"


class InternalError(Exception):
    """An unexpected failure while serving a request (HTTP 500)."""


def error_response(status: int, message: str, kind: str) -> JSONResponse:
    return JSONResponse(status_code=status, content={"error": {"message": message, "type": kind}})


def infer_vocab_size(engine: Any, tokenizer: TokenizerLike, model_vocab_size: int | None = None) -> int:
    """Ids must be valid for both the model's embedding and the tokenizer's decoder."""
    sizes = [len(tokenizer)]
    for value in (model_vocab_size, getattr(engine, "vocab_size", None)):
        if isinstance(value, int) and value > 0:
            sizes.append(value)
    return min(sizes)


def build_meta_info(
    state: ServerState,
    parsed: ParsedGenerate,
    output: GenerationOutput,
    *,
    rid: str,
    queue_wait: float,
    e2e_latency: float,
) -> dict[str, Any]:
    """`meta_info` with exactly the keys of docs/CONTRACTS.md."""
    completion = len(output.output_ids)
    rounds = int(output.rounds)
    expected = [float(x) for x in output.expected_accept_lens]
    return {
        "id": rid,
        "prompt_tokens": len(parsed.request.input_ids),
        "completion_tokens": completion,
        "finish_reason": _finish_reason(output),
        "spec_verify_ct": rounds,
        # SGLang's definition: committed tokens per verify round, bonus included
        "spec_accept_length": completion / max(rounds, 1),
        "e2e_latency": e2e_latency,
        "ttft": queue_wait + float(output.ttft),  # from arrival, like SGLang
        "decode_time": float(output.decode_time),
        "accept_lens": [int(x) for x in output.accept_lens],
        "expected_accept_lens": expected,
        # expected tokens per round incl. the bonus, the variance-free counterpart of tau
        "spec_expected_accept_length": (1.0 + sum(expected) / len(expected)) if expected else None,
        "stage_times": {k: float(v) for k, v in output.stage_times.items()},
        # per round, nats: the target's processed next-token entropy at the round's root (speculative methods)
        "entropies": [float(x) for x in getattr(output, "entropies", [])],
        # the engine reports what it actually ran (budget 0 for ar, the chain length for dflash)
        "method": getattr(output, "method", "") or parsed.method or state.method,
        "budget": getattr(output, "budget", 0) if getattr(output, "method", "") else parsed.budget or state.budget,
    }


def _finish_reason(output: GenerationOutput) -> dict[str, Any]:
    reason: dict[str, Any] = {"type": output.finish_reason}
    matched = getattr(output, "matched_stop", None)
    if matched is not None:
        reason["matched"] = matched
    return reason


async def run_generation(state: ServerState, parsed: ParsedGenerate) -> tuple[GenerationOutput, float, float]:
    """Queue one request on the decode worker; returns (output, queue wait, e2e latency)."""
    arrival = time.perf_counter()
    started: list[float] = []

    def job() -> GenerationOutput:
        started.append(time.perf_counter())
        return state.engine.generate(
            parsed.request, method=parsed.method or state.method, budget=parsed.budget or state.budget
        )

    output = await state.worker.run(job)
    done = time.perf_counter()
    return output, started[0] - arrival, done - arrival


def _record_finished(state: ServerState, meta: dict[str, Any]) -> None:
    state.accept_length_sum += meta["spec_accept_length"]
    state.finished += 1


def create_app(
    engine: EngineLike,
    tokenizer: TokenizerLike,
    *,
    method: str,
    budget: int,
    model_name: str,
    device: str = "cpu",
    dtype: str = "float32",
    vocab_size: int | None = None,
    extra_info: dict[str, Any] | None = None,
) -> FastAPI:
    """Build the app around any object with `generate(request, method=, budget=)` and `max_context`."""
    method = check_method(method, "method")
    budget = check_budget(budget, "budget")
    max_context = getattr(engine, "max_context", None)
    if not isinstance(max_context, int) or max_context < 2:
        raise ValueError(f"engine.max_context must be an int >= 2, got {max_context!r}")
    state = ServerState(
        engine=engine,
        tokenizer=tokenizer,
        method=method,
        budget=budget,
        model_name=model_name,
        device=device,
        dtype=dtype,
        limits=Limits(max_context=max_context, vocab_size=infer_vocab_size(engine, tokenizer, vocab_size)),
        worker=SerialWorker(),
        extra_info=dict(extra_info or {}),
    )

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
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

    async def generate_checked(parsed: ParsedGenerate) -> tuple[GenerationOutput, float, float]:
        try:
            return await run_generation(state, parsed)
        except RequestError:
            raise
        except ValueError as exc:  # the engine refused the request: a client error
            raise RequestError("request", str(exc)) from None
        except Exception as exc:  # reported to the client; the server keeps serving
            log.exception("generation failed")
            raise InternalError(f"internal error: {type(exc).__name__}: {exc}") from None

    @app.get("/health")
    async def health() -> PlainTextResponse:
        return PlainTextResponse("ok")

    @app.get("/health_generate")
    async def health_generate() -> PlainTextResponse:
        ids = list(tokenizer.encode("ok"))[:1] or [0]
        parsed = ParsedGenerate(
            request=GenerationRequest(input_ids=ids, max_new_tokens=1, temperature=0.0), rid=None, method=None,
            budget=None,
        )
        try:
            await run_generation(state, parsed)
        except Exception as exc:  # unhealthy, but the server keeps serving
            log.exception("health_generate failed")
            return PlainTextResponse(f"generation failed: {exc}", status_code=503)
        return PlainTextResponse("ok")

    @app.get("/server_info")
    async def server_info() -> dict[str, Any]:
        avg = state.accept_length_sum / state.finished if state.finished else None
        return {
            "model_path": model_name,
            "tokenizer_path": model_name,
            "method": state.method,
            "budget": state.budget,
            "device": device,
            "dtype": dtype,
            "max_context": state.limits.max_context,
            "version": ddtree.__version__,
            "internal_states": [{"avg_spec_accept_length": avg, "finished_requests": state.finished}],
            **state.extra_info,
        }

    @app.get("/get_model_info")
    async def get_model_info() -> dict[str, Any]:
        return {"model_path": model_name, "tokenizer_path": model_name, "is_generation": True}

    @app.post("/generate")
    async def generate(request: Request) -> Any:
        parsed = parse_generate(parse_json_body(await request.body()), tokenizer, state.limits)
        rid = parsed.rid or uuid.uuid4().hex
        output, queue_wait, e2e = await generate_checked(parsed)
        meta = build_meta_info(state, parsed, output, rid=rid, queue_wait=queue_wait, e2e_latency=e2e)
        _record_finished(state, meta)
        text, _ = trim_at_stop(tokenizer.decode(output.output_ids, skip_special_tokens=True), parsed.request.stop_strings)
        body = {"text": text, "output_ids": list(output.output_ids), "meta_info": meta}
        if parsed.stream:  # SGLang's stream framing, so streaming clients work; decoding is not incremental
            return StreamingResponse(sse_events(body), media_type="text/event-stream")
        return body

    @app.post("/v1/completions")
    async def completions(request: Request) -> dict[str, Any]:
        payload = parse_json_body(await request.body())
        parsed = parse_completion(payload, tokenizer, state.limits)
        output, queue_wait, e2e = await generate_checked(parsed)
        meta = build_meta_info(state, parsed, output, rid="", queue_wait=queue_wait, e2e_latency=e2e)
        _record_finished(state, meta)
        text, _ = trim_at_stop(tokenizer.decode(output.output_ids, skip_special_tokens=True), parsed.request.stop_strings)
        prompt_tokens, completion_tokens = len(parsed.request.input_ids), len(output.output_ids)
        return {
            "id": f"cmpl-{uuid.uuid4().hex}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": payload.get("model") if isinstance(payload.get("model"), str) else model_name,
            "choices": [{"index": 0, "text": text, "finish_reason": output.finish_reason, "logprobs": None}],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
        }

    return app
