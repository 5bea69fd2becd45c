"""BatchedEngine: identical to the Hugging Face engine at T = 0 (float32), batched == alone, requests joining
mid-batch, seeded sampling independent of the batch, the counter-based coins, graph replay == eager (CUDA)."""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch

from ddtree import switches
from ddtree.engine import GenerationRequest
from ddtree.engine.batched import BatchedEngine, batch_buckets
from ddtree.engine.engine import DecodingEngine
from ddtree.engine.rng import mix32, request_key, request_keys, uniforms
from ddtree.models.pair import load_pair
from ddtree.testing.interpreter import pytest_under_interpreter

CONFIGS = [("ar", 1), ("dflash", 1), ("ddtree", 16), ("ddtree", 5)]
# mixed prompt lengths: the fourth spans several rounds' columns
TEXTS = ["def main(", "import os\nclass Foo:\n    def", "for i in range(",
         "x = [1, 2]\nfor key, value in sorted(table.items()):\n    if value is None:\n        continue\n    y",
         "return self."]


@pytest.fixture(scope="module")
def pair(tiny_pair):
    return load_pair(tiny_pair)


@pytest.fixture(scope="module", params=[False, True], ids=["sync", "overlap"])
def engine(tiny_pair, request):
    """Both round schedules: the unoverlapped one, and overlapped rounds (the default with CUDA graphs), whose
    bookkeeping (a round read one step late, finished rows decoded once more and skipped) runs the same on the CPU."""
    return BatchedEngine(load_pair(tiny_pair), method="ddtree", budget=16, max_batch=4, overlap=request.param)


@pytest.fixture(scope="module")
def prompts(pair):
    return [pair.tokenizer.encode(t) for t in TEXTS]


def _requests(prompts, **kw):
    lengths = [24, 40, 9, 33, 17]  # mixed stop points
    return [GenerationRequest(input_ids=p, max_new_tokens=kw.pop("n", None) or n, **kw) for p, n in zip(prompts, lengths)]


@pytest.mark.parametrize("method,budget", CONFIGS)
def test_greedy_equals_the_hugging_face_engine(pair, engine, prompts, method, budget):
    reference = DecodingEngine(pair, method="ddtree", budget=16)
    for request in _requests(prompts):
        want = reference.generate(request, method=method, budget=budget)
        got = engine.generate(request, method=method, budget=budget)
        assert got.output_ids == want.output_ids
        assert got.accept_lens == want.accept_lens
        assert got.finish_reason == want.finish_reason


def test_loop_stats_count_rounds_rows_and_admissions(tiny_pair, prompts):
    engine = BatchedEngine(load_pair(tiny_pair), method="ddtree", budget=8, max_batch=4)
    requests = _requests(prompts)  # 5 requests through 4 slots
    outputs = engine.generate_batch(requests)
    stats = engine.loop_stats
    assert stats.admissions == 5
    # every round emits tokens for each of its rows, so the rows summed over rounds are the rounds of each request
    assert stats.row_rounds == sum(len(o.accept_lens) for o in outputs)
    assert stats.rounds >= max(len(o.accept_lens) for o in outputs) and stats.rounds < stats.row_rounds
    assert min(stats.launch_s, stats.wait_s, stats.post_s, stats.admit_s) > 0 and stats.idle_s == 0


@pytest.mark.parametrize("method,budget", CONFIGS)
def test_batched_equals_alone_with_joins_and_leaves(engine, prompts, method, budget):
    requests = _requests(prompts)  # 5 requests through 4 slots: the fifth joins when the first leaves
    together = engine.generate_batch(requests, method=method, budget=budget)
    alone = [engine.generate(r, method=method, budget=budget) for r in requests]
    for t, a in zip(together, alone):
        assert t.output_ids == a.output_ids
        assert t.accept_lens == a.accept_lens
    assert engine.num_active == 0


def test_stop_tokens_and_first_token_finish(engine, prompts):
    first = engine.generate(GenerationRequest(input_ids=prompts[0], max_new_tokens=8))
    stop = first.output_ids[3]
    out = engine.generate(GenerationRequest(input_ids=prompts[0], max_new_tokens=8, stop_token_ids=[stop]))
    assert out.output_ids == first.output_ids[: first.output_ids.index(stop)]
    assert out.finish_reason == "stop" and out.matched_stop == stop
    one = engine.generate_batch([GenerationRequest(input_ids=p, max_new_tokens=1) for p in prompts[:3]])
    assert [len(o.output_ids) for o in one] == [1, 1, 1]


@pytest.mark.parametrize("sampling", [{"temperature": 0.8}, {"temperature": 1.0, "top_k": 5, "top_p": 0.9}])
def test_seeded_sampling_is_independent_of_the_batch(engine, prompts, sampling):
    requests = [GenerationRequest(input_ids=p, max_new_tokens=20, seed=7 + i, **sampling)
                for i, p in enumerate(prompts)]
    together = engine.generate_batch(requests, method="ddtree", budget=16)
    alone = [engine.generate(r, method="ddtree", budget=16) for r in requests]
    assert [t.output_ids for t in together] == [a.output_ids for a in alone]
    mixed = engine.generate_batch([requests[0], GenerationRequest(input_ids=prompts[1], max_new_tokens=20)])
    assert mixed[0].output_ids == alone[0].output_ids  # a greedy neighbour changes nothing either


def test_an_overlapped_round_past_a_full_request_stays_in_its_slot(tiny_pair, prompts):
    """A request sized to the engine's limit finishes while its neighbour goes on: the overlapped round after its
    last one decodes its row once more (its outputs dropped), inside the slot's working rows, and both requests'
    tokens equal their decodes alone."""
    engine = BatchedEngine(load_pair(tiny_pair), method="ddtree", budget=8, max_batch=2, max_seq_len=64,
                           overlap=True)

    def most(prompt: list[int]) -> int:  # the most max_new_tokens a request may ask
        return engine.max_seq_len - len(prompt) - (8 + 1 + engine.block_size)

    full = prompts[1] + prompts[1]  # a longer prompt: fewer new tokens, so it ends first
    requests = [GenerationRequest(input_ids=full, max_new_tokens=most(full)),
                GenerationRequest(input_ids=prompts[0], max_new_tokens=most(prompts[0]))]
    assert 0 < most(full) < most(prompts[0]) - 2 * engine.block_size
    dropped = []  # requests an applied round decoded after they had finished
    apply = engine._apply

    def spy(flight, outputs):
        dropped.extend(e.request for e in flight.entries if e.output is not None)
        return apply(flight, outputs)

    engine._apply = spy
    together = engine.generate_batch(requests)
    assert requests[0] in dropped  # the full request's row was decoded past its end
    assert len(together[0].output_ids) == most(full)
    engine._apply = apply
    assert [o.output_ids for o in together] == [engine.generate(r).output_ids for r in requests]
    assert engine._inflight is None and engine.num_active == 0


def test_requests_beyond_the_capacity_name_the_limit(engine, prompts):
    with pytest.raises(ValueError, match="max_seq_len"):
        engine.generate(GenerationRequest(input_ids=prompts[0], max_new_tokens=engine.max_seq_len))
    with pytest.raises(ValueError, match="budget"):
        engine.generate(GenerationRequest(input_ids=prompts[0]), budget=0)
    assert engine.num_active == 0


def test_buckets():
    assert batch_buckets(1) == (1,)
    assert batch_buckets(6) == (1, 2, 4, 6)
    assert batch_buckets(8) == (1, 2, 4, 8)


def test_the_host_request_key_equals_the_device_one():
    """An admission hashes its seed on the host (`request_key`) for the device's `request_keys`: equal for every
    int64, negative and past 32 bits included."""
    seeds = [0, 1, -1, 7, 2**31, 2**32 - 1, 2**32, 2**62 + 12345, 2**63 - 1, -(2**63), -98765432123]
    gen = torch.Generator().manual_seed(0)
    seeds += torch.randint(-(2**63), 2**63 - 1, (200,), generator=gen, dtype=torch.int64).tolist()
    assert [request_key(s) for s in seeds] == request_keys(torch.tensor(seeds, dtype=torch.int64)).tolist()


def test_coins_match_an_integer_reference_and_look_uniform():
    def mix_ref(x: int) -> int:
        x &= 0xFFFFFFFF
        x ^= x >> 16
        x = (x * 0x7FEB352D) & 0xFFFFFFFF
        x ^= x >> 15
        x = (x * 0x846CA68B) & 0xFFFFFFFF
        return x ^ (x >> 16)

    values = torch.tensor([0, 1, 2**31, 2**32 - 1, 123456789], dtype=torch.int64)
    assert mix32(values).tolist() == [mix_ref(v) for v in values.tolist()]
    seeds = torch.arange(64, dtype=torch.int64) * 7919 - 100
    coins = uniforms(seeds, torch.full((64,), 3, dtype=torch.int64), 512)  # [64, 512]
    assert torch.equal(coins, uniforms(seeds, torch.full((64,), 3, dtype=torch.int64), 512))
    assert not torch.equal(coins, uniforms(seeds, torch.full((64,), 4, dtype=torch.int64), 512))
    assert float(coins.min()) >= 0.0 and float(coins.max()) < 1.0
    # chi-square over 16 equal bins, 32768 coins: the 0.1% critical value of chi2(15) is 37.7
    counts = torch.bincount((coins.flatten() * 16).long(), minlength=16).double()
    chi2 = float(((counts - counts.mean()) ** 2 / counts.mean()).sum())
    assert chi2 < 37.7


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("method,budget", CONFIGS)
def test_cuda_graph_rounds_equal_eager_rounds(tiny_pair, prompts, method, budget):
    graphed = BatchedEngine(load_pair(tiny_pair), budget=16, max_batch=4, device="cuda", dtype=torch.float32)
    eager = BatchedEngine(load_pair(tiny_pair), budget=16, max_batch=4, device="cuda", dtype=torch.float32,
                          cuda_graphs=False)
    # the torch reference attention (SDPA over the whole slot) against the Triton kernel the others use
    reference = BatchedEngine(load_pair(tiny_pair), budget=16, max_batch=4, device="cuda", dtype=torch.float32,
                              cuda_graphs=False, attention="sdpa")
    assert graphed.target.attention.backend == "triton"
    graphed.warmup([(method, budget)])
    for sampling in ({}, {"temperature": 0.9, "seed": 3}):
        requests = _requests(prompts, **sampling)
        a = graphed.generate_batch(requests, method=method, budget=budget)
        b = eager.generate_batch(requests, method=method, budget=budget)
        assert [x.output_ids for x in a] == [x.output_ids for x in b]
        if not sampling:
            c = reference.generate_batch(requests, method=method, budget=budget)
            assert [x.output_ids for x in a] == [x.output_ids for x in c]


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="CUDA streams, events and pinned buffers need a GPU"))])
@pytest.mark.parametrize("method,budget", CONFIGS)
def test_overlapped_rounds_equal_unoverlapped_rounds(tiny_pair, prompts, method, budget, device):
    """The overlapped schedule (on CUDA: each round's outputs copied to one of two pinned buffers and read one step
    late through its event, the prefill's inputs through a ring of pinned buffers, first tokens read with the next
    round; the Triton round kernels) decodes the same tokens, acceptances and finish reasons as the unoverlapped
    one: requests joining and leaving, stop tokens, first-token finishes, seeded sampling, and a request that
    fills its slot to the engine's max_seq_len while a neighbour goes on."""
    engines = [BatchedEngine(load_pair(tiny_pair), budget=16, max_batch=4, max_seq_len=128, device=device,
                             dtype=torch.float32, overlap=overlap) for overlap in (False, True)]
    sync, overlapped = engines
    assert overlapped.overlap and not sync.overlap
    assert (overlapped._copied is not None) == (device == "cuda")  # the pinned buffers' events exist on CUDA only
    columns = sync._columns(method, sync._effective_budget(method, budget))

    def most(prompt: list[int]) -> int:  # the most max_new_tokens a request may ask
        return sync.max_seq_len - len(prompt) - columns - sync.block_size

    first = sync.generate(GenerationRequest(input_ids=prompts[0], max_new_tokens=8), method=method, budget=budget)
    full = prompts[1] + prompts[1]
    batches = [
        _requests(prompts),
        _requests(prompts, temperature=0.9, seed=3),
        [GenerationRequest(input_ids=full, max_new_tokens=most(full)),
         GenerationRequest(input_ids=prompts[0], max_new_tokens=8, stop_token_ids=[first.output_ids[3]]),
         *(GenerationRequest(input_ids=p, max_new_tokens=1) for p in prompts[1:3]),
         GenerationRequest(input_ids=prompts[4], max_new_tokens=most(prompts[4]), temperature=1.0, top_k=5,
                           seed=11)],
    ]
    for requests in batches:
        want, got = (engine.generate_batch(requests, method=method, budget=budget) for engine in engines)
        assert [(o.output_ids, o.accept_lens, o.finish_reason) for o in got] == \
               [(o.output_ids, o.accept_lens, o.finish_reason) for o in want]
        assert overlapped._inflight is None and overlapped.num_active == 0
    assert want[1].finish_reason == "stop" and len(want[0].output_ids) == most(full)


class _EagerGraph:
    """Stands in for a captured CUDA graph on the CPU: a replay runs the stage's function."""

    def __init__(self, fn) -> None:
        self.replay = fn


def _capture_eagerly(stage, device, pool) -> None:
    """`_Stage.capture`'s protocol without CUDA: the two warm-up runs, the stand-in graph, its first replay."""
    for _ in range(2):
        stage.fn()
    stage.graph = _EagerGraph(stage.fn)
    stage.graph.replay()


@pytest.mark.parametrize("method,budget", [("dflash", 1), ("ddtree", 16)])
def test_a_walk_variant_first_met_while_serving_is_captured_on_fresh_inputs(tiny_pair, prompts, monkeypatch,
                                                                            method, budget):
    """CUDA graphs share one memory pool, so between a program's rounds its tree and logits may hold another
    graph's scratch (on the H200 a seeded batch after a greedy one gathered out of bounds in the capture's warm-up
    walk). On the CPU, with stand-in graphs: after a greedy batch every program's tree and logits are overwritten
    with out-of-range values, then a sampled batch captures its walk variant mid-serving and decodes the same
    tokens as an engine that never captures."""
    from ddtree.engine import batched

    monkeypatch.setattr(batched._Stage, "capture", _capture_eagerly)
    engine = BatchedEngine(load_pair(tiny_pair), budget=16, max_batch=4, device="cpu", dtype=torch.float32)
    engine.use_graphs = True  # the capture protocol (`_capture`, `_refresh`) with the stand-in graphs
    plain = BatchedEngine(load_pair(tiny_pair), budget=16, max_batch=4, device="cpu", dtype=torch.float32)
    engine.generate_batch(_requests(prompts), method=method, budget=budget)
    assert engine._programs and all(len(p["walks"]) == 1 for p in engine._programs.values())
    greedy_programs = set(engine._programs)
    for program in engine._programs.values():  # another graph's scratch
        program["tree"].parents.fill_(10**6)
        program["tree"].token_ids.fill_(10**6)
        program["logits"].fill_(float("nan"))
    sampled = _requests(prompts, temperature=0.9, seed=3)
    got = engine.generate_batch(sampled, method=method, budget=budget)
    want = plain.generate_batch(sampled, method=method, budget=budget)
    assert [(o.output_ids, o.accept_lens) for o in got] == [(o.output_ids, o.accept_lens) for o in want]
    # programs the greedy batch captured took their sampled walk while serving (buckets both batches reached)
    met = greedy_programs & {key for key, p in engine._programs.items() if any(v[0] == "sample" for v in p["walks"])}
    assert met and all(len(engine._programs[key]["walks"]) == 2 for key in met)


def test_the_ar_draw_is_the_root_only_walk():
    """`ar` rounds draw the root's token directly (no walk): the same token as the root-only tree's sample-and-walk
    with the same coin, for greedy and sampled rows side by side."""
    from ddtree.core.sampling import SamplingParams
    from ddtree.engine.batched import _root_tree, pick_tokens, sample_and_walk
    from ddtree.engine.rng import column_keys, keyed_uniforms, request_keys

    gen = torch.Generator().manual_seed(11)
    b, vocab = 6, 300
    params = SamplingParams(temperature=torch.tensor([0.0, 1.0, 0.7, 1.0, 0.3, 1.0]),
                            top_k=torch.tensor([-1, -1, 20, -1, -1, 5]), top_p=torch.tensor([1.0, 1.0, 1.0, 0.9, 1.0, 0.8]))
    keys = request_keys(torch.arange(b, dtype=torch.int64) * 7919)
    for counter in range(40):
        logits = torch.randn((b, 1, vocab), generator=gen) * 4
        coins = keyed_uniforms(keys, torch.full((b,), counter, dtype=torch.int64), column_keys(1, torch.device("cpu")))
        walked, _ = sample_and_walk(_root_tree(b, torch.device("cpu")), logits, params, coins, 0)
        assert torch.equal(pick_tokens(logits[:, 0], params, coins), walked.bonus_token)
        assert walked.accept_len.eq(0).all()


def _lazy_walk_runs() -> bool:
    try:
        from ddtree.core.triton_verify import lazy_walk_usable
    except ImportError:
        return False
    return lazy_walk_usable(torch.device("cuda" if torch.cuda.is_available() else "cpu"))


needs_lazy_walk = pytest.mark.skipif(not _lazy_walk_runs(), reason="the Triton lazy walk needs CUDA, or TRITON_INTERPRET=1")


@needs_lazy_walk
def test_lazy_walk_makes_the_torch_walks_draws():
    """Temperature-only sampled rounds on CUDA take the Triton lazy walk: with the same per-depth coins it accepts
    the same nodes and draws the same bonus as the torch sample-and-walk (greedy and sampled rows side by side,
    walks down to the last depth, a vocabulary over two of the kernel's blocks), with the same expectation and a
    root entropy equal to the float64 one. Draws could differ only where a coin falls within fp32 rounding of a
    CDF boundary, which these continuous coins do not hit."""
    from ddtree.core.build import build_tree
    from ddtree.core.sampling import SamplingParams
    from ddtree.engine.batched import lazy_sample_and_walk, sample_and_walk
    from ddtree.engine.rng import column_keys, keyed_uniforms, request_keys

    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    gen = torch.Generator().manual_seed(5)
    b, depth, vocab, budget = 4, 3, 4500, 10
    temperature = torch.tensor([0.0, 1.0, 0.6, 1.4], device=dev)
    params = SamplingParams(temperature=temperature)
    keys = request_keys(torch.arange(b, dtype=torch.int64, device=dev) * 31 + 1)
    columns = column_keys(depth + 1, dev)
    deepest = 0
    for counter in range(12):
        draft = torch.randn((b, depth, vocab), generator=gen).to(dev) * 3
        tree = build_tree(draft, budget, method="heap")
        # each node's target row favours its children's tokens, so that sampled walks go deep
        logits = torch.randn((b, budget + 1, vocab), generator=gen).to(dev)
        for row in range(b):
            parents = tree.parents[row, 1:]
            real = parents >= 0
            logits[row, parents[real], tree.token_ids[row, 1:][real]] += 12.0
        coins = keyed_uniforms(keys, torch.full((b,), counter, dtype=torch.int64, device=dev), columns)
        torch_res, torch_h = sample_and_walk(tree, logits, params, coins, depth)
        lazy_res, lazy_h = lazy_sample_and_walk(tree, logits, temperature, coins, depth)
        assert torch.equal(torch_res.accept_len, lazy_res.accept_len)
        assert torch.equal(torch_res.accepted_nodes, lazy_res.accepted_nodes)
        assert torch.equal(torch_res.bonus_token, lazy_res.bonus_token)
        torch.testing.assert_close(torch_res.expected_accept_len, lazy_res.expected_accept_len, rtol=1e-4, atol=1e-5)
        root = logits[:, 0].double() / temperature.double().clamp_min(1e-9).unsqueeze(1)
        p = root.softmax(-1)
        exact = torch.where(temperature == 0, 0.0, -(p * p.clamp_min(1e-300).log()).sum(-1)).float()
        torch.testing.assert_close(lazy_h, exact, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(torch_h, exact, rtol=1e-4, atol=1e-5)
        deepest = max(deepest, int(lazy_res.accept_len[1:].max()))
    assert deepest == depth, "no sampled walk reached the last depth: the last coin was never used"


@needs_lazy_walk
def test_a_mixed_batch_walks_each_row_its_own_way(tiny_pair):
    """A batch of a temperature-only request (the lazy walk's), a top-p one and a T = 0.02 one (the torch walk's)
    runs both walks and keeps each row's own: the temperature-only request decodes the same tokens alone (lazy
    walk only) and in that batch, and so do the others."""
    from ddtree.engine.batched import BOTH, LAZY, TORCH

    engine = BatchedEngine(load_pair(tiny_pair), method="ddtree", budget=8, max_batch=4)
    engine._lazy_walk, engine._warm_walks = True, (LAZY, TORCH)  # as on CUDA (this test runs under the interpreter)
    prompt = engine.tokenizer.encode("def main(")
    requests = [GenerationRequest(input_ids=prompt, max_new_tokens=12, temperature=1.0, seed=3),
                GenerationRequest(input_ids=prompt, max_new_tokens=12, temperature=0.8, top_p=0.9, seed=4),
                GenerationRequest(input_ids=prompt, max_new_tokens=12, temperature=0.02, seed=5)]
    for request in requests:
        engine.admit(request, method="ddtree", budget=8)
    assert engine._variant()[3] == BOTH
    engine.cancel_all(RuntimeError("variant checked"))
    together = engine.generate_batch(requests)
    alone = [engine.generate(r) for r in requests]
    assert [t.output_ids for t in together] == [a.output_ids for a in alone]


@needs_lazy_walk
@pytest.mark.parametrize("method,budget,temperature", [("ddtree", 8, 0.0), ("dflash", 15, 0.0), ("ar", 1, 0.0),
                                                       ("ddtree", 8, 1.0)])
def test_round_kernels_decode_as_the_torch_stages(tiny_pair, prompts, method, budget, temperature):
    """On CUDA the tree compile, the greedy walk and the commit's bookkeeping are one Triton launch each
    (`triton_round`): a batch with joins and leaves decodes the same tokens, acceptances and finish reasons
    through them as through the torch stages, greedy and (seeded) sampled."""
    device = "cuda" if torch.cuda.is_available() else "cpu"  # the CPU under the interpreter
    engine = BatchedEngine(load_pair(tiny_pair), method=method, budget=budget, max_batch=3, device=device)
    requests = _requests(prompts, temperature=temperature, seed=11)
    for kernels in (False, True):
        engine._round_kernels = kernels
        engine._programs.clear()
        outputs = engine.generate_batch(requests)
        if not kernels:
            want = outputs
    assert [o.output_ids for o in outputs] == [w.output_ids for w in want]
    assert [o.accept_lens for o in outputs] == [w.accept_lens for w in want]
    assert [o.finish_reason for o in outputs] == [w.finish_reason for w in want]


@pytest.mark.skipif(torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1"
                    or importlib.util.find_spec("triton") is None,
                    reason="the lazy-walk tests run directly here (CUDA or the interpreter), or there is no triton")
def test_lazy_walk_tests_under_the_interpreter():
    """CPU CI has no GPU: run the lazy-walk tests above in a child process under Triton's interpreter (which must
    be set before triton is imported)."""
    done = pytest_under_interpreter(__file__, "lazy_walk_makes or mixed_batch_walks or round_kernels_decode")
    assert done.returncode == 0 and "6 passed" in done.stdout, done.stdout[-4000:] + done.stderr[-2000:]


def test_warmup_prepares_every_temperature_only_walk(tiny_pair):
    """Warm-up builds (on CUDA: captures) the greedy walk and, per sampled walk the engine can take for a
    temperature-only request (the lazy walk where it runs, the torch walk for T < FUSED_MIN_TEMPERATURE), its
    walk, for every bucket: none of those is captured while serving."""
    from ddtree.engine.batched import LAZY, TORCH

    engine = BatchedEngine(load_pair(tiny_pair), method="ddtree", budget=8, max_batch=2)
    assert engine._warm_walks == (TORCH,)  # the CPU: no lazy walk
    engine._warm_walks = (LAZY, TORCH)  # as on CUDA (programs are built, not run, here)
    engine.warmup([("ddtree", 8)])
    for bucket in engine.buckets:
        walks = engine._programs[(bucket, "ddtree", 8)]["walks"]
        assert set(walks) == {("greedy",), ("sample", 0, False, LAZY), ("sample", 0, False, TORCH)}


@pytest.mark.parametrize("method,budget", CONFIGS)
def test_staged_prefill_equals_the_direct_prefill(tiny_pair, prompts, method, budget, monkeypatch):
    """The staged prefill (the CUDA-graph path, run eagerly here): prompts padded to a length bucket, prefilled
    into the staging cache and copied into the request's slot, decode like the direct prefill, greedy and seeded
    sampled, with joins (rows reused) and a prompt beyond the largest bucket (direct prefill inside a staged
    engine)."""
    direct = BatchedEngine(load_pair(tiny_pair), budget=16, max_batch=2)
    staged = BatchedEngine(load_pair(tiny_pair), budget=16, max_batch=2, prefill_graphs=True)
    assert direct.prefill_buckets == () and staged.prefill_buckets[0] == 64
    long_prompt = (prompts[1] * 12)[:90]  # bucket 128
    beyond = (prompts[0] * 40)[:150]
    monkeypatch.setattr(staged, "prefill_buckets", (64, 128))
    cases = [*prompts[:3], long_prompt, beyond]
    for sampling in ({}, {"temperature": 0.9, "seed": 3}):
        requests = _requests(cases, **sampling)
        a = staged.generate_batch(requests, method=method, budget=budget)
        b = direct.generate_batch(requests, method=method, budget=budget)
        assert [x.output_ids for x in a] == [x.output_ids for x in b]
    assert {length for length, _ in staged._prefills} == {64, 128}


def test_warmup_builds_the_prefill_programs(tiny_pair):
    engine = BatchedEngine(load_pair(tiny_pair), method="ddtree", budget=8, max_batch=2, prefill_graphs=True)
    engine.warmup([("ddtree", 8), ("ar", 1)])
    assert set(engine._prefills) == {(length, d) for length in engine.prefill_buckets for d in (False, True)}


def _row_state(engine: BatchedEngine, row: int) -> list:
    return [t[row].clone() for t in engine._state_tensors()]


def test_admission_fields_and_row_retirement(pair, prompts):
    """The device-side bookkeeping (`_admit_row` inside the staged prefill, `_retire` on finish): each field lands in
    its row, the staged and the direct path write the same state, a finished row takes the last row's state and
    cache slot, and the vacated row is cleared to a free row's state."""
    staged = BatchedEngine(pair, budget=8, max_batch=3, prefill_graphs=True)
    direct = BatchedEngine(pair, budget=8, max_batch=3)
    requests = [GenerationRequest(input_ids=prompts[0], max_new_tokens=8, seed=10),
                GenerationRequest(input_ids=prompts[1], max_new_tokens=8, temperature=0.7, top_k=5, seed=11),
                GenerationRequest(input_ids=prompts[2], max_new_tokens=8, temperature=1.3, top_p=0.9, seed=12)]
    for engine in (staged, direct):
        for request in requests:
            engine.admit(request, method="ddtree", budget=8)
    for row, request in enumerate(requests):
        assert int(staged.committed[row]) == len(request.input_ids)
        assert bool(staged.active_rows[row]) and int(staged.counter[row]) == 1 and int(staged.pending_len[row]) == 0
        assert float(staged.temperature[row]) == pytest.approx(request.temperature)
        assert int(staged.top_k[row]) == request.top_k and float(staged.top_p[row]) == pytest.approx(request.top_p)
        assert float(staged.draft_scale[row]) == pytest.approx(1 / (1 + request.temperature))  # the tree temperature
        assert int(staged.bonus[row]) == staged._active[row].state.output_ids[0]
        assert int(staged.coin_key[row]) == int(request_keys(torch.tensor([request.seed]))[0])
        for a, b in zip(_row_state(staged, row), _row_state(direct, row)):
            assert torch.equal(a, b)
        for cache in ("target_cache", "drafter_cache"):  # the prompt's rows of the slot (padding rows lie beyond)
            n = len(request.input_ids)
            for name in ("keys", "values"):
                got = getattr(getattr(staged, cache), name)[:, row, :, :n]
                want = getattr(getattr(direct, cache), name)[:, row, :, :n]
                torch.testing.assert_close(got, want)
    last_state = _row_state(staged, 2)
    n = len(requests[2].input_ids)  # its committed rows (the staged prefill's padding beyond them is scratch)
    last_keys = staged.target_cache.keys[:, 2, :, :n].clone()
    staged._active[0].state.finish_reason = "length"
    finished = staged._finish_rows([0])
    assert [e.request for e in finished] == [requests[0]] and [e.request for e in staged._active] == requests[2:0:-1]
    for a, b in zip(_row_state(staged, 0), last_state):
        assert torch.equal(a, b)
    assert torch.equal(staged.target_cache.keys[:, 0, :, :n], last_keys)
    free = BatchedEngine(pair, budget=8, max_batch=3)
    for a, b in zip(_row_state(staged, 2), _row_state(free, 2)):
        assert torch.equal(a, b)
    staged._active[1].state.finish_reason = "length"  # the last row itself: only cleared
    staged._finish_rows([1])
    assert not bool(staged.active_rows[1]) and int(staged.committed[1]) == 0
    assert bool(staged.active_rows[0]) and int(staged.committed[0]) == len(requests[2].input_ids)


@pytest.mark.parametrize("method,budget", [("ar", 1), ("ddtree", 8)])
def test_committed_rows_are_prompt_plus_output_minus_one(pair, prompts, method, budget):
    """What a retirement copies (`_retire`: prompt + output rows of the moved request) covers its committed cache
    rows: for every active request after every round, committed == prompt + output - 1 (the last token is the
    next round's root, not yet in the cache)."""
    engine = BatchedEngine(pair, budget=8, max_batch=3)
    for request in _requests(prompts[:3]):
        engine.admit(request, method=method, budget=budget)
    for _ in range(12):
        if not engine._active:
            break
        engine.step()
        for row, entry in enumerate(engine._active):
            assert int(engine.committed[row]) == len(entry.request.input_ids) + len(entry.state.output_ids) - 1


def test_sampled_rows_draft_at_the_tree_temperature(pair, prompts):
    """The draft logits a round builds its trees from: a greedy row's are the raw ones bit for bit, a sampled row's
    the raw ones divided by 1 + T; with DDTREE_RAW_SAMPLED_TREES every row's are raw. Same prompts, one eager round."""
    def first_round_logits(**overrides) -> torch.Tensor:
        with switches.override(**overrides):
            engine = BatchedEngine(pair, budget=8, max_batch=2, overlap=False)
        for temperature, ids in ((0.0, prompts[0]), (1.0, prompts[1])):
            engine.admit(GenerationRequest(input_ids=ids, max_new_tokens=8, temperature=temperature, seed=3),
                         method="ddtree", budget=8)
        engine.step()
        return engine._draft_logits[2].clone()  # [2, D, V]: the bucket of 2 rows

    tempered, raw = first_round_logits(), first_round_logits(raw_sampled_trees=True)
    assert torch.equal(tempered[0], raw[0])
    torch.testing.assert_close(tempered[1], raw[1] / 2)
    assert not torch.allclose(tempered[1], raw[1])
