"""The schedulers: requests from many threads batched continuously, each result as if decoded alone."""

from __future__ import annotations

import threading

import pytest
import torch

from ddtree.engine import GenerationRequest
from ddtree.engine.batched import BatchedEngine
from ddtree.engine.scheduler import BatchScheduler, SerialScheduler, make_scheduler
from ddtree.models.pair import load_pair


@pytest.fixture(scope="module", params=[("cpu", False), ("cpu", True), pytest.param(("cuda", True), marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs CUDA"))], ids=["sync", "overlap", "cuda-overlap"])
def engine(tiny_pair, request):
    """Both round schedules on the CPU, and on CUDA the served default (graphs, overlapped rounds) driven from the
    scheduler's thread."""
    device, overlap = request.param
    return BatchedEngine(load_pair(tiny_pair), method="ddtree", budget=8, max_batch=3, overlap=overlap,
                         device=device, dtype=torch.float32)


def test_concurrent_requests_are_batched_and_equal_to_alone(engine):
    tok = engine.tokenizer
    texts = ["def f(", "import sys\n", "class A:", "while True:", "x = {", "return ["]
    requests = [GenerationRequest(input_ids=tok.encode(t), max_new_tokens=12 + 5 * i) for i, t in enumerate(texts)]
    alone = [engine.generate(r) for r in requests]
    scheduler = make_scheduler(engine)
    assert isinstance(scheduler, BatchScheduler)
    streamed: dict[int, list[int]] = {i: [] for i in range(len(requests))}
    jobs = [None] * len(requests)

    def submit(i: int) -> None:
        jobs[i] = scheduler.submit(requests[i], on_tokens=streamed[i].extend)

    threads = [threading.Thread(target=submit, args=(i,)) for i in range(len(requests))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    outputs = []
    for job in jobs:
        outputs.append(job.future.result(timeout=300))
    scheduler.stop()
    assert [o.output_ids for o in outputs] == [a.output_ids for a in alone]
    assert [streamed[i] for i in range(len(requests))] == [o.output_ids for o in outputs]
    assert all(job.started_at >= job.submitted_at for job in jobs)


def test_a_bad_request_fails_alone_and_other_budgets_wait_their_turn(engine):
    tok = engine.tokenizer
    scheduler = make_scheduler(engine)
    good = scheduler.submit(GenerationRequest(input_ids=tok.encode("def g("), max_new_tokens=10))
    bad = scheduler.submit(GenerationRequest(input_ids=[10**9], max_new_tokens=4))
    other = scheduler.submit(GenerationRequest(input_ids=tok.encode("def g("), max_new_tokens=10), budget=4)
    ar = scheduler.submit(GenerationRequest(input_ids=tok.encode("def g("), max_new_tokens=10), method="ar")
    with pytest.raises(ValueError, match="input_ids"):
        bad.future.result(timeout=120)
    assert good.future.result(timeout=120).budget == 8
    assert other.future.result(timeout=120).budget == 4
    assert ar.future.result(timeout=120).output_ids == good.future.result().output_ids
    scheduler.stop()


def test_serial_scheduler_for_engines_without_a_batch_api():
    class Echo:
        def generate(self, request, *, method=None, budget=None, on_tokens=None):
            if on_tokens is not None:
                on_tokens(list(request.input_ids))
            return list(request.input_ids)

    scheduler = make_scheduler(Echo())
    assert isinstance(scheduler, SerialScheduler)
    seen: list[int] = []
    job = scheduler.submit(GenerationRequest(input_ids=[1, 2, 3]), on_tokens=seen.extend)
    assert job.future.result(timeout=10) == [1, 2, 3] and seen == [1, 2, 3]
    scheduler.stop()


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_an_engine_on_a_second_gpu_decodes_from_the_schedulers_thread(tiny_pair):
    """CUDA's current device is per thread (a new one starts on cuda:0), while Triton launches, graph captures and
    event records use it: an engine on cuda:1, driven by the scheduler's thread, decodes as the same engine on
    cuda:0 does."""
    tok_texts = ["def f(", "import sys\n", "class A:", "while True:"]
    outputs = []
    for device in ("cuda:0", "cuda:1"):
        engine = BatchedEngine(load_pair(tiny_pair), method="ddtree", budget=8, max_batch=3, device=device,
                               dtype=torch.float32)
        requests = [GenerationRequest(input_ids=engine.tokenizer.encode(t), max_new_tokens=16) for t in tok_texts]
        scheduler = make_scheduler(engine)
        jobs = [scheduler.submit(r) for r in requests]
        outputs.append([job.future.result(timeout=300).output_ids for job in jobs])
        scheduler.stop()
    assert outputs[0] == outputs[1]
