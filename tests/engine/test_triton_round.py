"""The round's one-launch stages (`ddtree.engine.triton_round`) against the torch reference they replace: equal
exactly (integers only). Runs on CUDA, or on the CPU under TRITON_INTERPRET=1 (CPU CI: the child process below)."""

from __future__ import annotations

import os
import random

import pytest
import torch

from ddtree.core.attention import ancestor_mask
from ddtree.core.walk import walk
from ddtree.engine import triton_attention
from ddtree.testing.interpreter import pytest_under_interpreter
from ddtree.testing.trees import batch_trees, random_tree

ON_CUDA = torch.cuda.is_available()
INTERPRET = os.environ.get("TRITON_INTERPRET", "") == "1"
needs_kernel = pytest.mark.skipif(
    not triton_attention.HAS_TRITON or not (ON_CUDA or INTERPRET), reason="needs triton and CUDA, or TRITON_INTERPRET=1"
)
DEVICE = torch.device("cuda" if ON_CUDA else "cpu")


def _trees(seed: int, batch: int, cols: int, depth: int, vocab: int = 9):
    """Random tries of 1..cols nodes padded to `cols` columns, and picks [B, N] that follow the tree at most
    nodes (so walks go deep) and leave it elsewhere."""
    rng = random.Random(seed)
    tree = batch_trees([random_tree(rng.randint(1, cols), vocab, depth, rng) for _ in range(batch)], cols)
    gen = torch.Generator().manual_seed(seed)
    picks = torch.randint(0, vocab, (batch, cols), generator=gen)
    tok, par = tree.token_ids, tree.parents
    for b in range(batch):
        for i in range(cols - 1, 0, -1):  # the oldest child (likeliest to have descendants) is written last
            if par[b, i] >= 0 and torch.rand((), generator=gen) < 0.8:
                picks[b, par[b, i]] = tok[b, i]
    return _to(tree), picks.to(DEVICE)


def _to(tree):
    return type(tree)(*(getattr(tree, f).to(DEVICE) for f in ("token_ids", "parents", "depths", "node_logws",
                                                              "num_nodes")))


@needs_kernel
@pytest.mark.parametrize("seed,batch,cols,depth", [(0, 5, 1, 0), (1, 7, 16, 15), (2, 4, 33, 6), (3, 3, 65, 15),
                                                   (4, 2, 129, 15), (5, 9, 17, 3)])
def test_round_compile_equals_torch(seed, batch, cols, depth):
    from ddtree.engine.triton_round import compile_tree

    tree, _ = _trees(seed, batch, cols, depth)
    gen = torch.Generator().manual_seed(seed)
    bonus = torch.randint(0, 9, (batch,), generator=gen).to(DEVICE)
    committed = torch.randint(0, 500, (batch,), generator=gen).to(DEVICE)
    tokens, positions, mask = compile_tree(tree, bonus, committed)
    want_tokens = tree.token_ids.clone()
    want_tokens[:, 0] = bonus
    assert torch.equal(tokens, want_tokens.clamp_min(0))
    assert torch.equal(positions, committed.unsqueeze(1) + tree.depths)
    assert torch.equal(mask, ancestor_mask(tree.parents))


@needs_kernel
@pytest.mark.parametrize("seed,batch,cols,depth,max_depth", [(0, 6, 1, 0, 0), (1, 8, 16, 15, 15), (2, 5, 33, 6, 6),
                                                             (3, 4, 65, 15, 15), (4, 3, 129, 15, 15),
                                                             (5, 9, 40, 8, 3)])
def test_round_greedy_walk_equals_torch(seed, batch, cols, depth, max_depth):
    from ddtree.engine.triton_round import greedy_walk

    tree, picks = _trees(seed, batch, cols, depth)
    got = greedy_walk(tree, picks, max_depth)
    want = walk(tree, picks, None, max_depth)
    assert torch.equal(got.accept_len, want.accept_len)
    assert torch.equal(got.accepted_nodes, want.accepted_nodes)
    assert torch.equal(got.bonus_token, want.bonus_token)
    assert torch.equal(got.expected_accept_len, want.expected_accept_len)
    if max_depth >= 3 and cols >= 16:
        assert int(want.accept_len.max()) >= 2  # the cases reach past the root's children


@needs_kernel
@pytest.mark.parametrize("seed,batch,cols,depth,has_draft", [(0, 6, 1, 0, False), (1, 8, 16, 15, True),
                                                             (2, 5, 65, 15, True), (3, 4, 33, 6, True)])
def test_round_commit_equals_torch(seed, batch, cols, depth, has_draft):
    """The commit's bookkeeping in one launch == `core.verify.commit` and the engine's torch updates (rows past
    the batch and the output buffers' spare columns untouched)."""
    from ddtree.core.verify import commit
    from ddtree.engine.triton_round import commit_rows, greedy_walk

    tree, picks = _trees(seed, batch, cols, depth)
    res = greedy_walk(tree, picks, depth)
    gen = torch.Generator().manual_seed(seed)
    rows, block = batch + 2, depth + 3  # state buffers larger than the batch, as the engine's
    state = {"committed": torch.randint(0, 300, (rows,), generator=gen), "bonus": torch.randint(0, 9, (rows,), generator=gen),
             "counter": torch.randint(0, 50, (rows,), generator=gen), "pending_len": torch.randint(0, 5, (rows,), generator=gen),
             "out_tokens": torch.randint(-1, 9, (rows, block), generator=gen),
             "out_counts": torch.randint(0, 9, (rows, 2), generator=gen), "out_expected": torch.rand((rows, 2), generator=gen)}
    state = {k: v.to(DEVICE) for k, v in state.items()}
    active = (torch.rand(batch, generator=gen) < 0.7).to(DEVICE)
    entropy = torch.rand(batch, generator=gen).to(DEVICE)
    bad = torch.tensor(seed % 2 == 1, device=DEVICE)
    want = {k: v.clone() for k, v in state.items()}
    done = commit(tree, res)
    kept = torch.where(active, done.num_kept, 0)
    want["committed"][:batch] += kept
    want["bonus"][:batch] = res.bonus_token
    want["counter"][:batch] += 1
    want["out_tokens"][:batch, :depth + 1] = done.emitted_tokens
    want["out_counts"][:batch, 0] = done.num_emitted
    want["out_counts"][:batch, 1] = (bad & active).long() if has_draft else 0
    want["out_expected"][:batch, 0] = res.expected_accept_len
    want["out_expected"][:batch, 1] = entropy
    if has_draft:
        want["pending_len"][:batch] = kept
    commit_rows(tree.token_ids, res, entropy, active, bad if has_draft else None, state["committed"][:batch],
                state["bonus"][:batch], state["counter"][:batch], state["pending_len"][:batch] if has_draft else None,
                state["out_tokens"][:batch], state["out_counts"][:batch], state["out_expected"][:batch])
    for key in state:
        assert torch.equal(state[key], want[key]), key


def _row_state(rows: int, dtype: torch.dtype, seed: int) -> dict[str, torch.Tensor]:
    """Random per-row state with the engine's names, dtypes and shapes (pending [rows, block, H])."""
    gen = torch.Generator().manual_seed(seed)
    ints = {name: torch.randint(-5, 1 << 40, (rows,), generator=gen)
            for name in ("committed", "bonus", "pending_len", "counter", "coin_key", "top_k")}
    state = {**ints, "active_rows": torch.rand(rows, generator=gen) < 0.5,
             "temperature": torch.rand(rows, generator=gen) * 2, "top_p": torch.rand(rows, generator=gen),
             "draft_scale": torch.rand(rows, generator=gen).to(dtype),
             "pending": torch.randn((rows, 3, 700), generator=gen).to(dtype)}  # 2,100 features: three programs
    return {k: v.to(DEVICE) for k, v in state.items()}


@needs_kernel
@pytest.mark.parametrize("dtype,row", [(torch.float32, 2), (torch.bfloat16, 0)])
def test_admit_row_equals_torch(dtype, row):
    """The admission's state writes in one launch == the engine's torch index writes (other rows untouched)."""
    from ddtree.engine.triton_round import admit_row

    state = _row_state(5, dtype, seed=row)
    fields = torch.tensor([41, row, 20, 0x1234ABCD, 0, 0], dtype=torch.int64, device=DEVICE)
    floats = fields[4:6].view(torch.float32)
    scale = torch.tensor(1 / 1.7).to(dtype).float()  # the host rounds the scale to the model's dtype
    floats.copy_(torch.tensor([0.7, 0.9, float(scale), 0.0], device=DEVICE))
    pick = torch.tensor([77], dtype=torch.int64, device=DEVICE)
    want = {k: v.clone() for k, v in state.items()}
    for name, value in (("committed", 42), ("bonus", 77), ("pending_len", 0), ("active_rows", True),
                        ("top_k", 20), ("coin_key", 0x1234ABCD), ("counter", 1)):
        want[name][row] = value
    want["temperature"][row], want["top_p"][row] = floats[0], floats[1]
    want["draft_scale"][row] = floats[2].to(dtype)
    admit_row(fields, floats, pick, state["committed"], state["bonus"], state["pending_len"], state["active_rows"],
              state["temperature"], state["draft_scale"], state["top_k"], state["top_p"], state["coin_key"],
              state["counter"])
    for key in state:
        assert torch.equal(state[key], want[key]), key


@needs_kernel
@pytest.mark.parametrize("dtype,src,dst", [(torch.float32, 4, 1), (torch.bfloat16, 3, 0), (torch.float32, 2, 2),
                                           (torch.bfloat16, 0, 0)])
def test_retire_row_equals_torch(dtype, src, dst):
    """The retirement's state move and clear in one launch == the engine's torch selects, copies and fills: row dst
    takes row src's state (pending included), row src becomes a free row; src == dst only clears."""
    from ddtree.engine.triton_round import retire_row

    state = _row_state(5, dtype, seed=10 * src + dst)
    want = {k: v.clone() for k, v in state.items()}
    for t in want.values():
        t[dst] = t[src].clone()
    for name, value in (("committed", 0), ("bonus", 0), ("pending_len", 0), ("counter", 0), ("coin_key", 0),
                        ("top_k", -1), ("active_rows", False), ("temperature", 0.0), ("top_p", 1.0),
                        ("draft_scale", 1.0)):
        want[name][src] = value
    moves = torch.tensor([src, dst], dtype=torch.int64, device=DEVICE)
    retire_row(moves, state["committed"], state["bonus"], state["pending_len"], state["counter"], state["coin_key"],
               state["top_k"], state["active_rows"], state["temperature"], state["top_p"], state["draft_scale"],
               state["pending"])
    for key in state:
        assert torch.equal(state[key], want[key]), key


@pytest.mark.skipif(not triton_attention.HAS_TRITON or INTERPRET, reason="needs triton's compiler")
@pytest.mark.parametrize("model_dtype", ["bf16", "fp32"])
def test_round_kernels_compile_for_sm_90(model_dtype):
    """The admission's, retirement's, compile's and commit's kernels compile for an H100 / H200 (sm_90) on any host:
    the interpreter runs their semantics on the CPU, this their code generation, before device time is spent."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from ddtree.engine import triton_round

    pointer_types = {"floats_ptr": "*fp32", "temperature_ptr": "*fp32", "top_p_ptr": "*fp32", "active_ptr": "*i8",
                     "draft_scale_ptr": f"*{model_dtype}", "pending_ptr": f"*{model_dtype}", "mask_ptr": "*i8",
                     "bad_ptr": "*i8", "expected_ptr": "*fp32", "entropy_ptr": "*fp32", "out_exp_ptr": "*fp32"}
    scalars = {"N", "W", "OUT_W"}
    kernels = ((triton_round._admit_row_kernel, {}, 1),
               (triton_round._retire_row_kernel, {"PENDING": 16 * 512, "BLOCK": 1024}, 4),
               (triton_round._compile_tree_kernel, {"ROWS": 16, "NP": 64}, 4),
               (triton_round._commit_rows_kernel, {"HAS_DRAFT": True, "WP": 16}, 1))
    for kernel, constexprs, warps in kernels:
        names = kernel.arg_names
        signature = {n: "constexpr" if n in constexprs else "i64" if n in scalars else pointer_types.get(n, "*i64")
                     for n in names}
        compiled = triton.compile(ASTSource(fn=kernel, signature=signature, constexprs=constexprs),
                                  target=GPUTarget("cuda", 90, 32), options={"num_warps": warps})
        assert ".entry" in compiled.asm["ptx"]


@pytest.mark.skipif(ON_CUDA or INTERPRET or not triton_attention.HAS_TRITON,
                    reason="the kernel tests run directly here (CUDA or the interpreter), or there is no triton")
def test_round_kernels_under_the_interpreter():
    """CPU CI: this file's kernel tests in a child process under Triton's interpreter."""
    done = pytest_under_interpreter(__file__, "equals_torch")
    assert done.returncode == 0 and "22 passed" in done.stdout, done.stdout[-4000:] + done.stderr[-2000:]
