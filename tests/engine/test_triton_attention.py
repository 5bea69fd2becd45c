"""The Triton tree-attention kernel == the torch reference (SDPA under the dense visibility mask).

Runs on CUDA, or on the CPU under TRITON_INTERPRET=1 (float32, small shapes); else skips. The reference
itself (`Visibility.dense`) is checked against a per-element definition on the CPU everywhere.
"""

from __future__ import annotations

import os
from dataclasses import replace

import pytest
import torch

from ddtree.core.attention import ancestor_mask
from ddtree.engine import triton_attention
from ddtree.engine.fast_model import Visibility, attention_bias, grouped_attention
from ddtree.testing.interpreter import pytest_under_interpreter

ON_CUDA = torch.cuda.is_available()
INTERPRET = os.environ.get("TRITON_INTERPRET", "") == "1"
needs_kernel = pytest.mark.skipif(
    not triton_attention.HAS_TRITON or not (ON_CUDA or INTERPRET), reason="needs triton and CUDA, or TRITON_INTERPRET=1"
)
DEVICE = torch.device("cuda" if ON_CUDA else "cpu")


def _random_tree_parents(b: int, n: int, gen: torch.Generator) -> torch.Tensor:
    """[B, N] parents: node 0 the root, node j's parent a random earlier node; the last columns padding (-1)."""
    parents = torch.full((b, n), -1, dtype=torch.int64)
    for row in range(b):
        used = int(torch.randint(1, n + 1, (1,), generator=gen))
        for j in range(1, used):
            parents[row, j] = int(torch.randint(0, j, (1,), generator=gen))
    return parents


def test_dense_visibility_matches_its_definition():
    gen = torch.Generator().manual_seed(0)
    b, t, s = 3, 5, 20
    own_mask = torch.rand((b, t, t), generator=gen) < 0.5
    own_mask |= torch.eye(t, dtype=torch.bool)
    vis = Visibility(context_len=torch.tensor([0, 4, 9]), own_start=torch.tensor([0, 4, 12]), own_mask=own_mask)
    dense = vis.dense(s)
    for row in range(b):
        for i in range(t):
            for col in range(s):
                j = col - int(vis.own_start[row])
                want = col < int(vis.context_len[row]) or (0 <= j < t and bool(own_mask[row, i, j]))
                assert bool(dense[row, i, col]) == want
    assert vis.rows().tolist() == [[0, 1, 2, 3, 4], [4, 5, 6, 7, 8], [12, 13, 14, 15, 16]]


def _reference(q, keys, values, vis):
    groups = q.shape[2] // keys.shape[1]
    bias = attention_bias(vis.dense(keys.shape[2]), groups, q.dtype)
    return grouped_attention(q, keys, values, bias)


CASES = [
    # (batch, own tokens, heads, kv heads, head dim, capacity, kind)
    (1, 1, 4, 2, 16, 40, "decode"),
    (3, 1, 8, 2, 32, 96, "decode"),
    (2, 7, 4, 1, 16, 64, "tree"),
    (2, 17, 4, 2, 32, 80, "tree"),
    (1, 23, 2, 2, 16, 48, "prefill"),
    (2, 8, 4, 2, 16, 72, "block"),
]


def _case_inputs(b, t, h, kv, d, capacity, kind, dtype=torch.float32):
    """(q, keys, values, vis) of one CASES row, on DEVICE."""
    gen = torch.Generator().manual_seed(b * 1000 + t)
    keys = torch.randn((b, kv, capacity, d), generator=gen).to(DEVICE, dtype)
    values = torch.randn((b, kv, capacity, d), generator=gen).to(DEVICE, dtype)
    # q as the engine passes it: a per-head view of a wider q/k/v projection (strided rows)
    qkv = torch.randn((b, t, (h + 2 * kv) * d), generator=gen).to(DEVICE, dtype)
    q = qkv[..., : h * d].view(b, t, h, d)
    if kind == "prefill":
        context = torch.zeros(b, dtype=torch.int64)
        own_start = context.clone()
        own_mask = torch.ones((b, t, t), dtype=torch.bool).tril_()
    elif kind == "block":  # the drafter: context prefix, own rows at the end of the slot, all-ones
        context = torch.randint(1, capacity - t, (b,), generator=gen)
        own_start = torch.full((b,), capacity - t, dtype=torch.int64)
        own_mask = torch.ones((b, t, t), dtype=torch.bool)
    else:  # decode / tree verify: own rows right after the context, ancestor-only
        context = torch.randint(0, capacity - t + 1, (b,), generator=gen)
        own_start = context.clone()
        own_mask = ancestor_mask(_random_tree_parents(b, t, gen))
    vis = Visibility(context_len=context.to(DEVICE), own_start=own_start.to(DEVICE), own_mask=own_mask.to(DEVICE))
    return q, keys, values, vis


@needs_kernel
@pytest.mark.parametrize("splits", [None, 1, 3])
@pytest.mark.parametrize("b,t,h,kv,d,capacity,kind", CASES)
def test_kernel_equals_reference(b, t, h, kv, d, capacity, kind, splits):
    q, keys, values, vis = _case_inputs(b, t, h, kv, d, capacity, kind)
    launch = None
    if splits is not None:  # force the one-program path and an uneven multi-split path on every case
        launch = replace(triton_attention.launch_shape(b, kv, (h // kv) * t, capacity, DEVICE, d), splits=splits)
    got = triton_attention.tree_attention(q, keys, values, vis.context_len, vis.own_start, vis.own_mask, launch)
    want = _reference(q, keys, values, vis)
    assert got.shape == want.shape == (b, t, h * d)
    torch.testing.assert_close(got, want, atol=2e-4, rtol=2e-4)


LAUNCHES = [  # (block_m, block_n, splits, num_warps, num_stages): direct and merged, small and large tiles
    (16, 16, 1, 4, 2),
    (32, 64, 1, 8, 3),
    (64, 32, 1, 4, 1),
    (16, 32, 2, 4, 2),
    (32, 16, 5, 8, 1),
    (64, 128, 4, 4, 3),
    (16, 64, 8, 2, 2),  # more splits than key tiles: empty splits merge to nothing
]


@needs_kernel
@pytest.mark.parametrize("launch", LAUNCHES, ids=lambda x: "-".join(map(str, x)))
@pytest.mark.parametrize("case", [CASES[1], CASES[3], CASES[5]], ids=lambda c: f"{c[-1]}{c[1]}")
def test_explicit_launch_equals_reference(case, launch):
    b, t, h, kv, d, capacity, kind = case
    q, keys, values, vis = _case_inputs(b, t, h, kv, d, capacity, kind)
    got = triton_attention.tree_attention(q, keys, values, vis.context_len, vis.own_start, vis.own_mask,
                                          launch=triton_attention.Launch(*launch))
    torch.testing.assert_close(got, _reference(q, keys, values, vis), atol=2e-4, rtol=2e-4)


@pytest.mark.parametrize("field,kwargs", [
    ("block_m", dict(block_m=8)), ("block_m", dict(block_m=48)), ("block_n", dict(block_n=24)),
    ("block_n", dict(block_n=0)), ("splits", dict(splits=0)), ("splits", dict(splits=2.0)),
    ("num_warps", dict(num_warps=3)), ("num_stages", dict(num_stages=0)),
])
def test_bad_launch_names_the_field(field, kwargs):
    good = dict(block_m=16, block_n=32, splits=2, num_warps=4, num_stages=2)
    with pytest.raises(ValueError, match=f"Launch.{field}"):
        triton_attention.Launch(**{**good, **kwargs})
    if triton_attention.available(DEVICE):  # a non-Launch override is refused before anything launches
        q, keys, values, vis = _case_inputs(*CASES[0])
        with pytest.raises(ValueError, match="launch must be a Launch"):
            triton_attention.tree_attention(q, keys, values, vis.context_len, vis.own_start, vis.own_mask,
                                            launch=(16, 32, 1))


@needs_kernel
def test_split_tickets_return_to_zero_so_launches_can_repeat():
    """The split merge's per-tile tickets end every launch at zero (a graph replays the launch with the same
    counters), and a second launch over other inputs is as exact as the first."""
    b, t, h, kv, d, capacity, kind = CASES[3]
    launch = triton_attention.Launch(16, 16, 4)
    for seed_shift in (0, 1):
        q, keys, values, vis = _case_inputs(b, t + seed_shift, h, kv, d, capacity, kind)
        got = triton_attention.tree_attention(q, keys, values, vis.context_len, vis.own_start, vis.own_mask, launch)
        torch.testing.assert_close(got, _reference(q, keys, values, vis), atol=2e-4, rtol=2e-4)
        counters = triton_attention._COUNTERS[q.device]
        assert int(counters.abs().sum()) == 0


@needs_kernel
def test_kernel_ignores_rows_it_must_not_see():
    """Garbage (NaN) in rows beyond the context and in masked own rows never reaches the output."""
    b, t, h, kv, d, capacity = 2, 4, 4, 2, 16, 64
    gen = torch.Generator().manual_seed(7)
    keys = torch.full((b, kv, capacity, d), float("nan"))
    values = torch.full((b, kv, capacity, d), float("nan"))
    context = torch.tensor([10, 30])
    for row in range(b):
        used = int(context[row]) + t
        keys[row, :, :used] = torch.randn((kv, used, d), generator=gen)
        values[row, :, :used] = torch.randn((kv, used, d), generator=gen)
    q = torch.randn((b, t, h, d), generator=gen)
    own_mask = torch.eye(t, dtype=torch.bool).expand(b, t, t).clone()
    to = lambda x: x.to(DEVICE)  # noqa: E731
    got = triton_attention.tree_attention(to(q), to(keys), to(values), to(context), to(context), to(own_mask))
    assert torch.isfinite(got).all()
    keys0, values0 = torch.nan_to_num(keys), torch.nan_to_num(values)
    vis = Visibility(context_len=to(context), own_start=to(context), own_mask=to(own_mask))
    torch.testing.assert_close(got, _reference(to(q), to(keys0), to(values0), vis), atol=2e-4, rtol=2e-4)


# The H200 sweeps' best launch per (head dim, batch, width) for the kernel with the merge in the same launch
# (benchmarks/results/2026-12-03/h200-s11, call 2): Qwen3-8B heads (8 K/V heads, 4 query heads each, head dim 128,
# context 512, capacity 1488) and the `gpu` pair's (4 K/V heads, 2 each, head dim 64, context 256, capacity 1616).
# The rule must pick the best or the launch named beside it, within the stated factor of the best's time.
SWEEP_BEST = {
    (128, 1, 129): (16, 64, 1, 4, 2),  # 1.069x (the best: 3 stages)
    (128, 8, 129): (64, 64, 1, 4, 2), (128, 1, 65): (16, 64, 4, 4, 2), (128, 8, 65): (64, 64, 1, 4, 2),
    (128, 1, 33): (16, 64, 4, 4, 2), (128, 8, 33): (64, 64, 1, 4, 2),
    (128, 1, 17): (16, 64, 4, 4, 2),  # 1.052x (the best: 3 stages)
    (128, 8, 17): (64, 64, 1, 8, 3),
    (128, 1, 1): (16, 32, 8, 4, 3), (128, 8, 1): (16, 32, 4, 4, 3),  # decode: the session-8 sweep's best
    (64, 1, 65): (16, 64, 4, 4, 3),  # 1.024x (the best: 2 stages)
    (64, 8, 65): (64, 64, 1, 4, 3), (64, 1, 33): (16, 64, 4, 4, 3), (64, 8, 33): (64, 64, 1, 4, 3),
    (64, 1, 17): (16, 64, 4, 4, 3), (64, 8, 17): (16, 64, 1, 4, 3),
}
HEADS = {128: (8, 4, 1488), 64: (4, 2, 1616)}  # head dim -> (K/V heads, query heads per K/V head, capacity)


@pytest.mark.skipif(not triton_attention.HAS_TRITON, reason="needs triton")
@pytest.mark.parametrize("cell", sorted(SWEEP_BEST))
def test_launch_rule_picks_the_sweeps_best_on_an_h200(cell):
    head_dim, batch, width = cell
    kv, groups, capacity = HEADS[head_dim]
    launch = triton_attention.launch_rule(batch, kv, groups * width, capacity, sms=132, head_dim=head_dim)
    assert launch == triton_attention.Launch(*SWEEP_BEST[cell])


@pytest.mark.skipif(not triton_attention.HAS_TRITON, reason="needs triton")
def test_launch_rule_splits_are_bounded_powers_of_two():
    for batch, kv, rows, capacity, sms in [(1, 1, 4, 4096, 132), (1, 2, 4, 64, 132), (3, 4, 40, 100, 78),
                                           (1, 8, 8, 4096, 4), (16, 8, 1028, 9000, 132)]:
        launch = triton_attention.launch_rule(batch, kv, rows, capacity, sms)
        assert 1 <= launch.splits <= 8 and launch.splits & (launch.splits - 1) == 0
        assert launch.splits <= max(1, -(-capacity // launch.block_n))  # no more splits than key tiles
    assert triton_attention.launch_rule(1, 2, 4, 64, 132).splits == 2  # 64 keys: two 32-key tiles


@needs_kernel
@pytest.mark.parametrize("qk_norm,with_q", [(True, True), (False, True), (True, False)])
def test_qkv_epilogue_equals_the_reference_projection(qk_norm, with_q):
    """The fused norm + RoPE + cache write == the reference backend's `Attention.project` (float32)."""
    from ddtree.engine.fast_model import Attention, Pointwise

    b, t, h, kv, d, capacity = 2, 5, 4, 2, 32, 40
    gen = torch.Generator().manual_seed(11)
    ops = Pointwise.for_device(DEVICE, compiled=False)
    hq = h if with_q else 0
    qkv = torch.randn((b, t, (hq + 2 * kv) * d), generator=gen).to(DEVICE)
    positions = torch.tensor([[3, 4, 5, 6, 7], [900, 901, 901, 902, 903]]).to(DEVICE)  # tree depths repeat
    own_start = torch.tensor([3, 900]).to(DEVICE) % capacity
    vis = Visibility(context_len=own_start, own_start=own_start,
                     own_mask=torch.ones((b, t, t), dtype=torch.bool, device=DEVICE))
    q_norm = (1 + 0.1 * torch.randn(d, generator=gen)).to(DEVICE) if qk_norm else None
    k_norm = (1 + 0.1 * torch.randn(d, generator=gen)).to(DEVICE) if qk_norm else None
    results = []
    for backend in ("sdpa", "triton"):
        attn = Attention(backend, h, kv, d, 1e6, 1e-6, ops, DEVICE)
        keys = torch.zeros((b, kv, capacity, d), device=DEVICE)
        values = torch.zeros_like(keys)
        inputs = attn.prepare(vis, positions, capacity, torch.float32)
        q = attn.project(qkv, inputs, q_norm, k_norm, keys, values, with_q=with_q)
        results.append((q, keys, values))
    (q0, k0, v0), (q1, k1, v1) = results
    assert (q0 is None) == (q1 is None) == (not with_q)
    if with_q:
        torch.testing.assert_close(q1, q0, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(k1, k0, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(v1, v0, atol=0, rtol=0)
    assert k1.abs().sum() > 0  # something was written


def test_windowed_reference_equals_the_whole_capacity():
    """The CPU reference reads rows [0, span): same output as over the whole slot, whose rows past the span hold
    garbage (here: large random values) that nothing sees."""
    from ddtree.engine.fast_model import Attention, Pointwise

    gen = torch.Generator().manual_seed(3)
    b, t, h, kv, d, s = 3, 6, 4, 2, 8, 64
    parents = _random_tree_parents(b, t, gen)
    vis = Visibility(context_len=torch.tensor([5, 17, 9]), own_start=torch.tensor([5, 17, 9]),
                     own_mask=ancestor_mask(parents))
    assert vis.span() == 23
    q = torch.randn((b, t, h, d), generator=gen)
    keys, values = torch.randn((b, kv, s, d), generator=gen) * 50, torch.randn((b, kv, s, d), generator=gen) * 50
    positions = vis.rows()
    cpu = torch.device("cpu")
    whole = Attention("sdpa", h, kv, d, 10000.0, 1e-6, Pointwise.for_device(cpu), cpu)
    windowed = Attention("sdpa", h, kv, d, 10000.0, 1e-6, Pointwise.for_device(cpu), cpu)
    whole.windowed = False
    assert windowed.windowed
    full_inputs, window_inputs = whole.prepare(vis, positions, s, q.dtype), windowed.prepare(vis, positions, s, q.dtype)
    assert (full_inputs.window, window_inputs.window) == (s, 23)
    torch.testing.assert_close(windowed(q, keys, values, window_inputs), whole(q, keys, values, full_inputs))


@pytest.mark.skipif(ON_CUDA or INTERPRET or not triton_attention.HAS_TRITON,
                    reason="the kernel tests run directly here (CUDA or the interpreter), or there is no triton")
def test_kernel_tests_under_the_interpreter():
    """CPU CI has no GPU: run this file's kernel tests in a child process under Triton's interpreter (which must be
    set before triton is imported), so a change to the kernel is checked against the reference on every CI run."""
    done = pytest_under_interpreter(__file__, "kernel_equals or explicit_launch or ignores_rows or tickets or qkv_epilogue")
    assert done.returncode == 0 and "44 passed" in done.stdout, done.stdout[-4000:] + done.stderr[-2000:]
