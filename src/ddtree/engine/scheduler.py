"""Feeding requests into one engine: continuous batching for `BatchedEngine`, one request at a time for the Hugging
Face engine. Both run the engine in one thread (the engine is not thread-safe) and hand results back as
`concurrent.futures.Future`s. Jobs come from an inbox: an in-process queue fed by `submit` from other threads, or
any object with the same `get(block)` (the server's engine process reads its pipe through one:
`ddtree.server.engine_process`); the loop runs in a daemon thread of its own, or on the caller's (`run_here`).

Batching policy: requests are admitted in arrival order as long as the head of the queue decodes with the
batch's (method, budget) and a row is free; a finished request frees its row at once and the next one is
prefilled before the following round. A head with another (method, budget) waits until the batch drains,
so no request waits behind later arrivals.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Protocol

from ddtree.engine.types import GenerationRequest

log = logging.getLogger("ddtree.scheduler")

TokenCallback = Callable[[list[int]], None]


@dataclass
class Job:
    request: GenerationRequest
    method: str | None
    budget: int | None
    on_tokens: TokenCallback | None
    future: Future
    submitted_at: float
    started_at: float | None = None  # when decoding of this request began (prefill), perf_counter seconds
    finished_at: float | None = None  # when the engine handed its result back (decoding thread), perf_counter seconds


class Inbox(Protocol):
    """Where a scheduler's jobs come from: `get` returns the next job, None to stop; with block=False it raises
    `queue.Empty` when no job is waiting (`queue.SimpleQueue` is one)."""

    def get(self, block: bool = True) -> Job | None: ...


class _Scheduler:
    """Inbox and decoding loop; subclasses define `_loop`."""

    def __init__(self, engine, name: str, *, inbox: Inbox | None = None, start: bool = True) -> None:
        self.engine = engine
        self._queue: queue.SimpleQueue[Job | None] | None = None if inbox is not None else queue.SimpleQueue()
        self._inbox: Inbox = inbox if inbox is not None else self._queue  # type: ignore[assignment]
        self._thread = threading.Thread(target=self._run, name=name, daemon=True) if start else None
        if self._thread is not None:
            self._thread.start()

    def submit(self, request: GenerationRequest, *, method: str | None = None, budget: int | None = None,
               on_tokens: TokenCallback | None = None) -> Job:
        if self._queue is None:
            raise RuntimeError("this scheduler reads its jobs from its own inbox")
        job = Job(request, method, budget, on_tokens, Future(), time.perf_counter())
        self._queue.put(job)
        return job

    def stop(self) -> None:
        if self._queue is not None:
            self._queue.put(None)

    def run_here(self) -> None:
        """Run the decoding loop on the calling thread until the inbox says stop (a scheduler made with start=False)."""
        if self._thread is not None:
            raise RuntimeError("this scheduler's loop runs in its own thread")
        self._run()

    def _run(self) -> None:
        device = getattr(self.engine, "device", None)
        if getattr(device, "type", None) == "cuda" and device.index is not None:
            import torch

            # CUDA's current device is per thread and a new thread starts on cuda:0: this one decodes on the
            # engine's device (kernel launches and graph captures use the current device)
            torch.cuda.set_device(device)
        self._loop()

    def loop_stats(self) -> dict[str, float] | None:
        return None  # only the batch scheduler's engine keeps them


class SerialScheduler(_Scheduler):
    """One request at a time through `engine.generate` (engines without a batch API)."""

    def __init__(self, engine, name: str = "ddtree-decode", *, inbox: Inbox | None = None, start: bool = True) -> None:
        super().__init__(engine, name, inbox=inbox, start=start)

    def _loop(self) -> None:
        while (job := self._inbox.get()) is not None:
            if not job.future.set_running_or_notify_cancel():
                continue
            job.started_at = time.perf_counter()
            try:
                output = self.engine.generate(job.request, method=job.method, budget=job.budget, on_tokens=job.on_tokens)
            except BaseException as exc:  # handed to the waiting request
                job.future.set_exception(exc)
                continue
            job.finished_at = time.perf_counter()
            job.future.set_result(output)


class BatchScheduler(_Scheduler):
    """Continuous batching over a `BatchedEngine` (admit between rounds, free rows as requests finish)."""

    def __init__(self, engine, name: str = "ddtree-batch", *, inbox: Inbox | None = None, start: bool = True) -> None:
        self._waiting: deque[Job] = deque()
        self._running: dict[int, Job] = {}  # id(engine entry) -> job
        self._stopping = False
        self._idle_since: float | None = None  # set while the loop waits for requests
        super().__init__(engine, name, inbox=inbox, start=start)

    def _key(self, job: Job) -> tuple[str, int]:
        method = job.method or self.engine.method
        return method, job.budget or self.engine.budget

    def _drain_inbox(self, block: bool) -> None:
        while True:
            try:
                job = self._inbox.get(block=block)
            except queue.Empty:
                return
            block = False
            if job is None:
                self._stopping = True
                return
            self._waiting.append(job)

    def _admit(self) -> None:
        engine = self.engine
        while self._waiting:
            job = self._waiting[0]
            method, budget = self._key(job)
            if not engine.can_admit(method, budget):
                return
            self._waiting.popleft()
            if not job.future.set_running_or_notify_cancel():
                continue
            job.started_at = time.perf_counter()
            try:
                entry = engine.admit(job.request, method=method, budget=budget, on_tokens=job.on_tokens)
            except BaseException as exc:  # a request the engine refuses fails alone
                job.future.set_exception(exc)
                continue
            if entry.output is not None:  # finished with its first token
                _settle(job, entry)
            else:
                self._running[id(entry)] = job

    def loop_stats(self) -> dict[str, float] | None:
        """The engine's `LoopStats` (cumulative; read from another thread: a snapshot, good to a round), the idle
        time counted up to now while waiting for requests (so a span's snapshots split an idle stretch)."""
        stats = getattr(self.engine, "loop_stats", None)
        if stats is None:
            return None
        out = stats.as_dict()
        since = self._idle_since
        if since is not None:
            out["idle_s"] += time.perf_counter() - since
        return out

    def _loop(self) -> None:
        while not self._stopping:
            idle = not self._running and not self._waiting
            if idle:
                self._idle_since = time.perf_counter()
            self._drain_inbox(block=idle)
            if idle:
                since, self._idle_since = self._idle_since, None
                if hasattr(self.engine, "loop_stats"):
                    self.engine.loop_stats.idle_s += time.perf_counter() - since
            if self._stopping:
                break
            self._admit()
            if not self._running:
                continue
            try:
                finished = self.engine.step()
            except BaseException as exc:  # every request of the batch fails; the engine is reset
                log.exception("decoding round failed; failing %d requests", len(self._running))
                self.engine.cancel_all(exc)
                for job in self._running.values():
                    job.future.set_exception(exc)
                self._running.clear()
                continue
            for entry in finished:
                _settle(self._running.pop(id(entry)), entry)
        error = RuntimeError("the decoding scheduler stopped")
        for job in [*self._running.values(), *self._waiting]:
            if not job.future.done():
                job.future.set_exception(error)


def _settle(job: Job, entry) -> None:
    job.finished_at = time.perf_counter()
    if entry.error is not None:
        job.future.set_exception(entry.error)
    else:
        job.future.set_result(entry.output)


def make_scheduler(engine, *, inbox: Inbox | None = None, start: bool = True) -> _Scheduler:
    """Continuous batching when the engine has a batch API, else one request at a time."""
    if hasattr(engine, "admit") and hasattr(engine, "step"):
        return BatchScheduler(engine, inbox=inbox, start=start)
    return SerialScheduler(engine, inbox=inbox, start=start)
