"""The decoding engine in a process of its own, behind the scheduler interface the server uses (`submit`, `stop`,
`loop_stats`).

Why a process: in one process the HTTP event loop and the decoding loop share one GIL, and the event loop's
Python work for a request (parsing, tokenising, rendering and sending the response: about a millisecond) is
serialised with the rounds' host work. At 8 concurrent requests on an H200 a ddtree round's host phases grew from
0.17 ms at one request to 0.56 ms of a 0.74 ms round, and the extra roughly matched the requests finishing per
round times that work. Serving engines split the two the same way (SGLang's tokenizer manager and scheduler,
vLLM's API server and engine core): the server process keeps HTTP, tokenising and rendering; the engine process
keeps the model, the CUDA graphs and the decoding loop, which runs on its main thread with no other Python thread
beside it.

Protocol (pickled tuples over one `multiprocessing` pipe; `perf_counter` is system-wide on Linux, so the engine's
timestamps are the server's):
  server -> engine   ("submit", rid, request, method, budget, stream)  ("cancel", rid)  ("stop",)
  engine -> server   ("ready", EngineInfo, loop stats) or ("failed", message) once at start; then ("tokens", rid,
                     ids), ("done", rid, output, started_at, finished_at, loop stats), ("error", rid, exception,
                     started_at, finished_at, loop stats)
A cancelled request that has not started is dropped; a streamed one that has started stops at its next round (its
token callback raises `RequestCancelled` in the engine process, as the in-process stream's does).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import multiprocessing
import queue
import time
import traceback
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from ddtree.engine.scheduler import Job, TokenCallback, make_scheduler
from ddtree.engine.types import GenerationRequest
from ddtree.server.streaming import RequestCancelled

log = logging.getLogger("ddtree.server")

STOP_TIMEOUT_S = 5.0


class EngineStartError(RuntimeError):
    """The engine process failed before it was ready (its message carries the child's traceback)."""


@dataclass(frozen=True)
class EngineInfo:
    """What the server needs to know about the engine it cannot see (`create_app` reads these names)."""

    max_context: int
    vocab_size: int | None
    has_drafter: bool
    device: str


def describe(engine: Any) -> EngineInfo:
    return EngineInfo(max_context=int(engine.max_context), vocab_size=getattr(engine, "vocab_size", None),
                      has_drafter=getattr(engine, "drafter", True) is not None,
                      device=str(getattr(engine, "device", "cpu")))


class _PipeInbox:
    """The engine process's scheduler inbox (`ddtree.engine.scheduler.Inbox`): submits become jobs, cancels and stats
    requests are answered in passing, "stop" or a closed pipe end the loop."""

    def __init__(self, conn) -> None:
        self.conn = conn
        self.scheduler: Any = None  # set once the scheduler exists (stats replies read it)
        self._jobs: dict[int, Job] = {}
        self._cancelled: set[int] = set()

    def get(self, block: bool = True) -> Job | None:
        while True:
            if not block and not self.conn.poll():
                raise queue.Empty
            try:
                message = self.conn.recv()
            except (EOFError, OSError):  # the server went away
                return None
            kind = message[0]
            if kind == "submit":
                return self._job(*message[1:])
            if kind == "cancel":
                self._cancel(message[1])
            elif kind == "stop":
                return None

    def _job(self, rid: int, request: GenerationRequest, method: str | None, budget: int | None, stream: bool) -> Job:
        on_tokens = self._token_sender(rid) if stream else None
        job = Job(request, method, budget, on_tokens, Future(), time.perf_counter())
        self._jobs[rid] = job
        job.future.add_done_callback(lambda future, rid=rid: self._settled(rid, future))
        return job

    def _token_sender(self, rid: int) -> TokenCallback:
        def on_tokens(ids: list[int]) -> None:
            if rid in self._cancelled:
                raise RequestCancelled("the client closed the stream")
            self.conn.send(("tokens", rid, list(ids)))

        return on_tokens

    def _cancel(self, rid: int) -> None:
        job = self._jobs.get(rid)
        if job is not None and not job.future.cancel():  # running: a stream stops at its next round
            self._cancelled.add(rid)

    def _settled(self, rid: int, future: Future) -> None:
        job = self._jobs.pop(rid)
        self._cancelled.discard(rid)
        if future.cancelled():
            return  # the server dropped it first
        stats = self.scheduler.loop_stats()
        error = future.exception()
        if error is None:
            self.conn.send(("done", rid, future.result(), job.started_at, job.finished_at, stats))
            return
        try:
            self.conn.send(("error", rid, error, job.started_at, job.finished_at, stats))
        except Exception:  # an exception that does not pickle goes as its text
            self.conn.send(("error", rid, RuntimeError(f"{type(error).__name__}: {error}"), job.started_at,
                            job.finished_at, stats))


def serve_engine(conn, factory: Callable[[], Any], log_level: str = "INFO") -> None:
    """The engine process's main: build the engine, report it ready, decode until told to stop."""
    logging.basicConfig(level=log_level, format="%(asctime)s %(levelname)s %(name)s [engine]: %(message)s")
    try:
        engine = factory()
        info = describe(engine)
    except BaseException as exc:
        conn.send(("failed", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))
        raise SystemExit(1) from None
    inbox = _PipeInbox(conn)
    scheduler = make_scheduler(engine, inbox=inbox, start=False)
    inbox.scheduler = scheduler
    conn.send(("ready", info, scheduler.loop_stats()))
    scheduler.run_here()


class EngineProcess:
    """`submit` / `stop` / `loop_stats` (the in-process schedulers' interface) over an engine decoding in a child
    process. `factory` builds the engine there: it must pickle (a module-level function, or a `functools.partial`
    of one). The constructor returns once the engine is ready (models loaded, CUDA graphs captured) and raises
    `EngineStartError` with the child's traceback if it is not.

    The pipe is read and written by the server's event loop alone (`attach`; the app's start-up calls it): no
    thread of this process waits on it. A thread would need the GIL back after every message while the event loop
    holds it, and under load waits up to the 5 ms switch interval each time: with one receiving thread the served
    rate fell from 383 requests/s at 8 concurrent requests to 239 at 16 (session 16, H200). `submit` therefore runs
    on the attached loop's thread (the app's handlers do). A send blocks only while the engine's inbox is full, and
    the engine drains it every round."""

    def __init__(self, factory: Callable[[], Any], *, name: str = "ddtree-engine", log_level: str = "INFO") -> None:
        context = multiprocessing.get_context("spawn")  # CUDA cannot run in a forked child
        self._conn, child_conn = context.Pipe()
        self._process = context.Process(target=serve_engine, args=(child_conn, factory, log_level), name=name,
                                        daemon=True)
        self._process.start()
        child_conn.close()
        self.info, self._stats = self._wait_ready()
        # the names create_app reads from an engine
        self.max_context = self.info.max_context
        self.vocab_size = self.info.vocab_size
        self.drafter = True if self.info.has_drafter else None
        self.device = self.info.device
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ids = itertools.count()
        self._jobs: dict[int, Job] = {}
        self._dead: BaseException | None = None

    def _wait_ready(self) -> tuple[EngineInfo, dict[str, float] | None]:
        while not self._conn.poll(0.2):
            if not self._process.is_alive():
                raise EngineStartError(f"the engine process exited with code {self._process.exitcode} before it "
                                       "was ready (see its log above)")
        try:
            message = self._conn.recv()
        except EOFError:
            self._process.join(timeout=STOP_TIMEOUT_S)
            raise EngineStartError(f"the engine process exited with code {self._process.exitcode} before it was "
                                   "ready") from None
        if message[0] != "ready":
            self._process.join(timeout=STOP_TIMEOUT_S)
            raise EngineStartError(f"the engine failed to start: {message[1]}")
        return message[1], message[2]

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        """Read the engine's messages on `loop` (call from that loop's thread, before the first `submit`)."""
        if self._loop is not None:
            raise RuntimeError("the engine process is attached to an event loop already")
        self._loop = loop
        if self._dead is None:
            loop.add_reader(self._conn.fileno(), self._on_readable)

    # ------------------------------------------------------------------------------ the scheduler interface
    def submit(self, request: GenerationRequest, *, method: str | None = None, budget: int | None = None,
               on_tokens: TokenCallback | None = None) -> Job:
        if self._loop is None:
            raise RuntimeError("attach the engine process to the event loop that submits (`attach`) first")
        job = Job(request, method, budget, on_tokens, Future(), time.perf_counter())
        if self._dead is not None:
            job.future.set_exception(self._dead)
            return job
        rid = next(self._ids)
        self._jobs[rid] = job
        self._send(("submit", rid, request, method, budget, on_tokens is not None))
        job.future.add_done_callback(lambda future, rid=rid: self._drop_if_cancelled(rid, future))
        return job

    def loop_stats(self) -> dict[str, float] | None:
        """The engine's decoding-loop phases (`BatchScheduler.loop_stats`) as of its last finished request (each
        result carries them, so reading them costs no round trip); None for an engine that keeps none."""
        return self._stats

    def stop(self) -> None:
        """Ask the engine's loop to stop, then end the process (terminated if it does not exit in time)."""
        if self._loop is not None and self._dead is None:
            self._loop.remove_reader(self._conn.fileno())
        self._send(("stop",))
        self._process.join(timeout=STOP_TIMEOUT_S)
        if self._process.is_alive():
            self._process.terminate()
            self._process.join(timeout=STOP_TIMEOUT_S)

    @property
    def alive(self) -> bool:
        return self._process.is_alive()

    # ------------------------------------------------------------------------------ the server's side of the pipe
    def _send(self, message: tuple) -> None:
        if self._dead is None:
            try:
                self._conn.send(message)
            except (BrokenPipeError, OSError):
                pass  # the reader reports the engine's exit

    def _drop_if_cancelled(self, rid: int, future: Future) -> None:
        """Done callback of a submitted job: a request the server cancelled is forgotten here and dropped there."""
        if future.cancelled() and self._jobs.pop(rid, None) is not None:
            self._send(("cancel", rid))

    def _on_readable(self) -> None:
        """Every message the engine has sent (the event loop calls this when the pipe is readable)."""
        try:
            while self._conn.poll():
                self._dispatch(self._conn.recv())
        except (EOFError, OSError):
            self._engine_exited()

    def _dispatch(self, message: tuple) -> None:
        kind, rid = message[0], message[1]
        if kind == "tokens":
            job = self._jobs.get(rid)
            if job is not None and job.on_tokens is not None:
                try:
                    job.on_tokens(message[2])
                except Exception:  # the stream's client left (RequestCancelled) or its callback failed: stop it
                    self._send(("cancel", rid))
            return
        # "done" / "error": (kind, rid, output or exception, started_at, finished_at, loop stats)
        self._stats = message[5]
        job = self._jobs.pop(rid, None)
        if job is None or not job.future.set_running_or_notify_cancel():
            return  # cancelled here after it started there
        job.started_at, job.finished_at = message[3], message[4]
        if kind == "done":
            job.future.set_result(message[2])
        else:
            job.future.set_exception(message[2])

    def _engine_exited(self) -> None:
        if self._loop is not None:
            self._loop.remove_reader(self._conn.fileno())
        self._process.join(timeout=STOP_TIMEOUT_S)
        self._dead = RuntimeError(f"the engine process exited (code {self._process.exitcode})")
        jobs, self._jobs = self._jobs, {}
        for job in jobs.values():
            if job.future.set_running_or_notify_cancel():
                job.future.set_exception(self._dead)
        if jobs:
            log.error("the engine process exited with %d requests in flight", len(jobs))
