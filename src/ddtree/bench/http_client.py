"""Helpers shared by the HTTP benchmark clients: prompts, seeds, sampling params, requests, health.

The clients speak SGLang's `/generate` dialect, so they drive the reference server and an SGLang
server alike. The load generators' requests go through aiohttp (as SGLang's `bench_serving` does): against the
reference server with a stub engine, a closed loop of /generate calls cycled 1.4-1.8 ms a request faster with it
than with httpx's AsyncClient (2-core VM, 1 and 8 concurrent), time that is the client's and not the server's.
The one-off calls (health, server info) stay on httpx's blocking client.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import httpx
from tqdm.auto import tqdm

from ddtree.jsonl import read_jsonl

T = TypeVar("T")

DEFAULT_REQUEST_TIMEOUT_S = 3600.0


@dataclass(frozen=True)
class Prompt:
    id: str
    dataset: str
    text: str


def setup_logging() -> None:
    """Client logs to stderr; httpx's per-request INFO lines would drown the progress bars."""
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)


def load_prompts(path: str | Path, num: int | None = None) -> list[Prompt]:
    """Read `{"id", "dataset", "text"}` lines (first `num` of them); ids default to the prompt's index."""
    if num is not None and num < 1:
        raise ValueError(f"num_prompts must be >= 1, got {num}")
    prompts: list[Prompt] = []
    for index, row in enumerate(read_jsonl(path)[:num]):
        if not isinstance(row.get("text"), str):
            raise ValueError(f"prompts file {path}: prompt {index + 1} has no string `text`")
        prompts.append(Prompt(id=str(row.get("id", index)), dataset=str(row.get("dataset", "")), text=row["text"]))
    if not prompts:
        raise ValueError(f"prompts file {path} holds no prompts")
    return prompts


def parse_json_arg(value: str | Any, name: str) -> Any:
    """A JSON value given inline or as a path to a JSON file (already-parsed values pass through)."""
    if not isinstance(value, str):
        return value
    text = value
    if not value.lstrip().startswith(("{", "[")) and Path(value).is_file():
        text = Path(value).read_text(encoding="utf-8")
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{name}: not valid JSON ({exc})") from None


def parse_int_list(value: str | Sequence[int], name: str) -> list[int]:
    """`"1,4,16"` -> [1, 4, 16], each >= 1."""
    items = [int(v) for v in value.split(",") if v.strip()] if isinstance(value, str) else [int(v) for v in value]
    if not items or any(v < 1 for v in items):
        raise ValueError(f"{name}: expected positive integers, got {value!r}")
    return items


def derive_seed(*parts: Any) -> int:
    """Stable 31-bit seed from the identity of a request (same on every run and machine)."""
    digest = hashlib.sha256(json.dumps(list(parts), default=str).encode("utf-8")).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


def sampling_params(variant: Mapping[str, Any], max_new_tokens: int, seed: int | None = None) -> dict[str, Any]:
    """SGLang `sampling_params`: every variant key but `name`, plus the length and the seed."""
    params = {k: v for k, v in variant.items() if k != "name"}
    params["max_new_tokens"] = int(max_new_tokens)
    if seed is not None:
        params["sampling_seed"] = int(seed)
    return params


@dataclass
class GenerateResult:
    body: dict[str, Any] | None
    error: str | None
    start_time: float  # wall clock (time.time), for cross-request timelines
    end_time: float
    e2e_latency: float  # perf_counter difference, client side

    @property
    def meta(self) -> dict[str, Any]:
        return (self.body or {}).get("meta_info") or {}


def _error_message(status: int, text: str) -> str:
    try:
        detail = json.loads(text).get("error", {}).get("message")
    except (ValueError, AttributeError):
        detail = None
    return f"HTTP {status}: {detail or text[:500]}"


async def post_generate(client: aiohttp.ClientSession, url: str, payload: Mapping[str, Any]) -> GenerateResult:
    """One `/generate` call; transport and HTTP errors come back in `error`, never raised."""
    start_wall, start = time.time(), time.perf_counter()
    body, error = None, None
    try:
        async with client.post(f"{url.rstrip('/')}/generate", json=dict(payload)) as response:
            text = await response.text()
            if response.status == 200:
                body = json.loads(text)
            else:
                error = _error_message(response.status, text)
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as exc:
        error = f"{type(exc).__name__}: {exc}"
    end = time.perf_counter()
    return GenerateResult(body=body, error=error, start_time=start_wall, end_time=time.time(),
                          e2e_latency=end - start)


def make_client(concurrency: int, timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S) -> aiohttp.ClientSession:
    """A session of at most `concurrency` kept-alive connections (enter it with `async with`, on a running loop);
    proxies from the environment are ignored, as for httpx (`trust_env` off)."""
    connector = aiohttp.TCPConnector(limit=concurrency, limit_per_host=concurrency)
    timeout = aiohttp.ClientTimeout(total=timeout_s, sock_connect=30.0)
    return aiohttp.ClientSession(connector=connector, timeout=timeout, trust_env=False)


async def run_bounded(
    items: Sequence[T], worker: Callable[[T], Awaitable[None]], concurrency: int, desc: str
) -> None:
    """Run `worker` over `items` with at most `concurrency` in flight, with a progress bar."""
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    semaphore = asyncio.Semaphore(concurrency)
    with tqdm(total=len(items), desc=desc, unit="req", leave=False) as bar:

        async def one(item: T) -> None:
            async with semaphore:
                await worker(item)
            bar.update(1)

        await asyncio.gather(*(one(item) for item in items))


def log_tail(path: str | Path | None, lines: int = 40) -> str:
    if path is None or not Path(path).exists():
        return "(no log)"
    text = Path(path).read_text(encoding="utf-8", errors="replace").splitlines()
    return "\n".join(text[-lines:])


def wait_for_health(
    url: str,
    timeout_s: float,
    *,
    process: subprocess.Popen | None = None,
    log_path: str | Path | None = None,
    interval_s: float = 0.5,
) -> float:
    """Poll `GET /health` until 200; fail fast if `process` exits. Returns the seconds waited."""
    start = time.monotonic()
    deadline = start + timeout_s
    with httpx.Client(timeout=5.0, trust_env=False) as client:
        while True:
            if process is not None and process.poll() is not None:
                raise RuntimeError(
                    f"server exited with status {process.returncode} before becoming healthy; log tail:\n"
                    f"{log_tail(log_path)}"
                )
            try:
                if client.get(f"{url.rstrip('/')}/health").status_code == 200:
                    return time.monotonic() - start
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"server at {url} not healthy after {timeout_s:.0f} s; log tail:\n"
                                   f"{log_tail(log_path)}")
            time.sleep(interval_s)


def get_json(url: str, path: str, timeout_s: float = 10.0) -> dict[str, Any] | None:
    """GET a JSON endpoint, None on any failure (informational endpoints only)."""
    try:
        with httpx.Client(timeout=timeout_s, trust_env=False) as client:
            response = client.get(f"{url.rstrip('/')}{path}")
            return response.json() if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None
