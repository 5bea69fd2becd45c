"""A round's small stages as one Triton kernel each (CUDA; the CPU under TRITON_INTERPRET=1).

Under CUDA-graph replay a stage costs about 2-3 us per kernel it launches, whatever the kernel does. On the
H200 the `gpu` pair's budget-64 round spent 0.074 ms compiling the tree (tokens, positions and the ancestor
mask: ~30 launches, log2(N) rounds of pointer doubling) and 0.082 ms in the greedy walk (~25 launches), of a
0.80 ms round; ddtree's compile also cost 0.028 ms more than dflash's chain (more doubling rounds). Here
each is one launch (session 12 on the H200: compile 0.074 -> 0.007 ms, walk 0.082 -> 0.028 ms):

- `compile_tree`: the verify forward's inputs from a tree: token ids (the root is the row's bonus token,
  padding columns token 0), positions (committed + depth) and the ancestor-only mask, each row's ancestors
  found by following parent pointers (a path is at most the tree's depth long).
- `greedy_walk`: the accept walk over per-node picks (the target's argmax at every node, one torch reduce
  before it): from the root, move to the child whose token is the pick at the current node, stop at the
  first pick that is no child's token (the bonus) or at `max_depth`.
- `commit_rows`: the commit's bookkeeping after the walk (emitted tokens, counts, committed length, bonus,
  coin counter, pending length: ~20 launches, 0.07 ms of the pair's round); the accepted K/V rows and the
  drafter's features stay torch (gathers and the drafter's projection).
- `admit_row`: an admitted request's row state from its admission fields (~12 launches with the torch
  index writes, after the argmax of its first token), inside the staged prefill's graph.
- `retire_row`: a finished row takes the last active row's state and the vacated row is cleared (~32
  launches: a select, a copy or a fill per state tensor), the retirement's graph.

All equal the torch reference (`ddtree.core.attention.ancestor_mask`, `ddtree.core.walk.walk`,
`ddtree.core.verify.commit` and the engine's torch updates) exactly: integers and copied floats, no arithmetic
that rounds.
"""

from __future__ import annotations

import torch

from ddtree.core.types import DDTreeBuildResult, VerifyResult

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs: the engine keeps the torch stages
    triton = None

HAS_TRITON = triton is not None


if triton is not None:

    @triton.jit
    def _compile_tree_kernel(tok_ptr, par_ptr, dep_ptr, bonus_ptr, committed_ptr, out_tok_ptr, out_pos_ptr,
                             mask_ptr, N, ROWS: tl.constexpr, NP: tl.constexpr):
        b = tl.program_id(0)
        rows = tl.program_id(1) * ROWS + tl.arange(0, ROWS)  # [ROWS] nodes this program compiles
        cols = tl.arange(0, NP)
        live = rows < N
        base = b.to(tl.int64) * N
        tok = tl.load(tok_ptr + base + rows, mask=live, other=0)
        bonus = tl.load(bonus_ptr + b)
        tok = tl.where(rows == 0, bonus, tl.maximum(tok, 0))  # padding columns (-1) read token 0
        tl.store(out_tok_ptr + base + rows, tok, mask=live)
        depth = tl.load(dep_ptr + base + rows, mask=live, other=0)
        tl.store(out_pos_ptr + base + rows, tl.load(committed_ptr + b) + depth, mask=live)
        # ancestors: start at the node itself, then follow parents until every row has reached -1
        cur = tl.where(live, rows.to(tl.int64), -1)
        seen = cols[None, :] == cur[:, None]  # [ROWS, NP]
        cur = tl.load(par_ptr + base + cur, mask=cur >= 0, other=-1)
        while tl.max(cur, 0) >= 0:
            seen = seen | (cols[None, :] == cur[:, None])
            cur = tl.load(par_ptr + base + cur, mask=cur >= 0, other=-1)
        out = mask_ptr + (base + rows[:, None]) * N + cols[None, :]
        tl.store(out, seen.to(tl.int8), mask=live[:, None] & (cols[None, :] < N))

    @triton.jit
    def _greedy_walk_kernel(picks_ptr, par_ptr, tok_ptr, nodes_ptr, len_ptr, bonus_ptr, N, D,
                            NP: tl.constexpr, DP: tl.constexpr):
        b = tl.program_id(0)
        cols = tl.arange(0, NP)
        base = b.to(tl.int64) * N
        par = tl.load(par_ptr + base + cols, mask=cols < N, other=-2)  # [NP]
        tok = tl.load(tok_ptr + base + cols, mask=cols < N, other=-2)
        slots = tl.arange(0, DP)
        path = tl.where(slots == 0, 0, -1).to(tl.int64)  # [DP] accepted node per depth, root first
        node = b * 0  # loop-carried scalars need tensor types from the start
        step = b * 0
        go = step == 0
        while go:
            pick = tl.load(picks_ptr + base + node)
            child = tl.min(tl.where((par == node) & (tok == pick), cols, NP), 0)  # children carry distinct tokens
            go = (child < NP) & (step < D)
            node = tl.where(go, child, node)
            step = tl.where(go, step + 1, step)
            path = tl.where(go & (slots == step), child.to(tl.int64), path)
        tl.store(nodes_ptr + b * (D + 1) + slots, path, mask=slots < D + 1)
        tl.store(len_ptr + b, step.to(tl.int64))
        tl.store(bonus_ptr + b, tl.load(picks_ptr + base + node))


    @triton.jit
    def _commit_rows_kernel(tok_ptr, nodes_ptr, len_ptr, pick_ptr, expected_ptr, entropy_ptr, active_ptr, bad_ptr,
                            committed_ptr, bonus_ptr, counter_ptr, pending_len_ptr, out_tok_ptr, out_cnt_ptr,
                            out_exp_ptr, N, W, OUT_W, HAS_DRAFT: tl.constexpr, WP: tl.constexpr):
        b = tl.program_id(0)
        slots = tl.arange(0, WP)
        accept = tl.load(len_ptr + b)
        active = tl.load(active_ptr + b) != 0
        kept = accept + 1
        kept_active = tl.where(active, kept, 0)
        # slot j < accept emits the token of accepted node j + 1, slot accept the bonus, later slots -1
        nxt = tl.load(nodes_ptr + b * W + slots + 1, mask=slots + 1 < W, other=-1)
        drafted = tl.load(tok_ptr + b.to(tl.int64) * N + tl.maximum(nxt, 0), mask=slots < W, other=-1)
        pick = tl.load(pick_ptr + b)
        emitted = tl.where(slots < accept, drafted, tl.where(slots == accept, pick, -1))
        tl.store(out_tok_ptr + b * OUT_W + slots, emitted, mask=slots < W)
        tl.store(out_cnt_ptr + b * 2, kept)
        if HAS_DRAFT:
            bad = (tl.load(bad_ptr) != 0) & active
            tl.store(out_cnt_ptr + b * 2 + 1, bad.to(tl.int64))
            tl.store(pending_len_ptr + b, kept_active)
        else:
            tl.store(out_cnt_ptr + b * 2 + 1, kept * 0)
        tl.store(out_exp_ptr + b * 2, tl.load(expected_ptr + b))
        tl.store(out_exp_ptr + b * 2 + 1, tl.load(entropy_ptr + b))
        tl.store(committed_ptr + b, tl.load(committed_ptr + b) + kept_active)
        tl.store(bonus_ptr + b, pick)
        tl.store(counter_ptr + b, tl.load(counter_ptr + b) + 1)


if triton is not None:

    @triton.jit
    def _admit_row_kernel(fields_ptr, floats_ptr, pick_ptr, committed_ptr, bonus_ptr, pending_len_ptr, active_ptr,
                          temperature_ptr, draft_scale_ptr, top_k_ptr, top_p_ptr, coin_key_ptr, counter_ptr):
        row = tl.load(fields_ptr + 1)
        tl.store(committed_ptr + row, tl.load(fields_ptr) + 1)
        tl.store(bonus_ptr + row, tl.load(pick_ptr))
        tl.store(pending_len_ptr + row, row * 0)
        tl.store(active_ptr + row, (row * 0 + 1).to(tl.int8))
        tl.store(top_k_ptr + row, tl.load(fields_ptr + 2))
        tl.store(coin_key_ptr + row, tl.load(fields_ptr + 3))
        tl.store(counter_ptr + row, row * 0 + 1)
        tl.store(temperature_ptr + row, tl.load(floats_ptr))
        tl.store(top_p_ptr + row, tl.load(floats_ptr + 1))
        # a float32 the host already rounded to the model's dtype: the cast is exact
        tl.store(draft_scale_ptr + row, tl.load(floats_ptr + 2).to(draft_scale_ptr.dtype.element_ty))

    @triton.jit
    def _retire_row_kernel(moves_ptr, committed_ptr, bonus_ptr, pending_len_ptr, counter_ptr, coin_key_ptr,
                           top_k_ptr, active_ptr, temperature_ptr, top_p_ptr, draft_scale_ptr, pending_ptr,
                           PENDING: tl.constexpr, BLOCK: tl.constexpr):
        src = tl.load(moves_ptr)
        dst = tl.load(moves_ptr + 1)
        move = src != dst
        pid = tl.program_id(0)
        if pid == 0:  # the per-row scalars: moved, then the source row cleared to a free row's state
            tl.store(committed_ptr + dst, tl.load(committed_ptr + src), mask=move)
            tl.store(bonus_ptr + dst, tl.load(bonus_ptr + src), mask=move)
            tl.store(pending_len_ptr + dst, tl.load(pending_len_ptr + src), mask=move)
            tl.store(counter_ptr + dst, tl.load(counter_ptr + src), mask=move)
            tl.store(coin_key_ptr + dst, tl.load(coin_key_ptr + src), mask=move)
            tl.store(top_k_ptr + dst, tl.load(top_k_ptr + src), mask=move)
            tl.store(active_ptr + dst, tl.load(active_ptr + src), mask=move)
            tl.store(temperature_ptr + dst, tl.load(temperature_ptr + src), mask=move)
            tl.store(top_p_ptr + dst, tl.load(top_p_ptr + src), mask=move)
            tl.store(draft_scale_ptr + dst, tl.load(draft_scale_ptr + src), mask=move)
            zero = src * 0
            tl.store(committed_ptr + src, zero)
            tl.store(bonus_ptr + src, zero)
            tl.store(pending_len_ptr + src, zero)
            tl.store(counter_ptr + src, zero)
            tl.store(coin_key_ptr + src, zero)
            tl.store(top_k_ptr + src, zero - 1)
            tl.store(active_ptr + src, zero.to(tl.int8))
            tl.store(temperature_ptr + src, zero.to(tl.float32))
            tl.store(top_p_ptr + src, (zero + 1).to(tl.float32))
            tl.store(draft_scale_ptr + src, (zero + 1).to(tl.float32).to(draft_scale_ptr.dtype.element_ty))
        else:  # the pending context features [block, H] of the row, BLOCK elements a program (moved, not cleared)
            offs = (pid - 1) * BLOCK + tl.arange(0, BLOCK)
            live = (offs < PENDING) & move
            tl.store(pending_ptr + dst * PENDING + offs, tl.load(pending_ptr + src * PENDING + offs, mask=live),
                     mask=live)


def admit_row(fields: torch.Tensor, floats: torch.Tensor, pick: torch.Tensor, committed: torch.Tensor,
              bonus: torch.Tensor, pending_len: torch.Tensor, active: torch.Tensor, temperature: torch.Tensor,
              draft_scale: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, coin_key: torch.Tensor,
              counter: torch.Tensor) -> None:
    """An admitted row's state in one launch: row fields[1] gets committed = fields[0] + 1, bonus = pick[0], pending
    length 0, active, top_k = fields[2], coin key = fields[3], counter 1, temperature / top_p / draft scale =
    floats[0:3] (the scale a float32 of draft_scale's dtype: cast exactly). fields int64, floats float32, pick [1]
    int64; the state
    tensors are the engine's [max_batch] rows (active bool)."""
    _admit_row_kernel[(1,)](fields, floats, pick, committed, bonus, pending_len, active.view(torch.int8),
                            temperature, draft_scale, top_k, top_p, coin_key, counter, num_warps=1)


def retire_row(moves: torch.Tensor, committed: torch.Tensor, bonus: torch.Tensor, pending_len: torch.Tensor,
               counter: torch.Tensor, coin_key: torch.Tensor, top_k: torch.Tensor, active: torch.Tensor,
               temperature: torch.Tensor, top_p: torch.Tensor, draft_scale: torch.Tensor,
               pending: torch.Tensor) -> None:
    """moves [2] int64 = (src, dst): row dst takes row src's state (every tensor given; pending [max_batch, ...]
    whole rows), then row src is cleared to a free row's state (0, top_k -1, inactive, temperature 0, top_p and
    draft scale 1; pending is left: nothing reads a free row's). src == dst only clears."""
    per_row = pending[0].numel()
    block = 1024
    _retire_row_kernel[(1 + triton.cdiv(per_row, block),)](
        moves, committed, bonus, pending_len, counter, coin_key, top_k, active.view(torch.int8), temperature, top_p,
        draft_scale, pending, PENDING=per_row, BLOCK=block, num_warps=4,
    )


def compile_tree(tree: DDTreeBuildResult, bonus: torch.Tensor, committed: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(tokens [B, N] int64, positions [B, N] int64, ancestor mask [B, N, N] bool) of the verify forward.

    tree: [B, N] token ids (-1 at the root and on padding), parents (-1 at the root and on padding: padding
    columns see only themselves), depths; bonus [B] (the root's token); committed [B] (the root's position)."""
    batch, cols = tree.token_ids.shape
    device = tree.token_ids.device
    tokens = torch.empty((batch, cols), dtype=torch.int64, device=device)
    positions = torch.empty_like(tokens)
    mask = torch.empty((batch, cols, cols), dtype=torch.bool, device=device)
    rows = 16
    _compile_tree_kernel[(batch, triton.cdiv(cols, rows))](
        tree.token_ids.contiguous(), tree.parents.contiguous(), tree.depths.contiguous(), bonus.contiguous(),
        committed.contiguous(), tokens, positions, mask.view(torch.int8), cols, ROWS=rows,
        NP=max(16, triton.next_power_of_2(cols)), num_warps=4,
    )
    return tokens, positions, mask


def greedy_walk(tree: DDTreeBuildResult, picks: torch.Tensor, max_depth: int) -> VerifyResult:
    """`ddtree.core.walk.walk(tree, picks, None, max_depth)` in one launch (one program per request).

    picks [B, N] int64: the target's pick at every node. Returns accept_len [B], accepted_nodes [B, D + 1]
    (root first, -1 padded), bonus [B] (the pick at the last accepted node), expected_accept_len = accept_len."""
    batch, cols = tree.token_ids.shape
    device = picks.device
    nodes = torch.empty((batch, max_depth + 1), dtype=torch.int64, device=device)
    accept_len = torch.empty(batch, dtype=torch.int64, device=device)
    bonus = torch.empty(batch, dtype=torch.int64, device=device)
    _greedy_walk_kernel[(batch,)](
        picks.contiguous(), tree.parents.contiguous(), tree.token_ids.contiguous(), nodes, accept_len, bonus,
        cols, max_depth, NP=max(16, triton.next_power_of_2(cols)), DP=max(16, triton.next_power_of_2(max_depth + 1)),
        num_warps=4,
    )
    return VerifyResult(accept_len=accept_len, accepted_nodes=nodes, bonus_token=bonus,
                        expected_accept_len=accept_len.to(torch.float32))


def commit_rows(token_ids: torch.Tensor, result: VerifyResult, entropy: torch.Tensor, active: torch.Tensor,
                bad: torch.Tensor | None, committed: torch.Tensor, bonus: torch.Tensor, counter: torch.Tensor,
                pending_len: torch.Tensor | None, out_tokens: torch.Tensor, out_counts: torch.Tensor,
                out_expected: torch.Tensor) -> None:
    """A round's bookkeeping after the walk, in place, in one launch: what `ddtree.core.verify.commit` and the
    engine's per-row updates do in ~20. Per row b (B = token_ids' rows): out_tokens[b, :D + 1] <- the accepted
    drafted tokens then the bonus, -1 padded; out_counts[b] <- (accept_len + 1, bad & active: non-finite draft
    logits, 0 without a draft); out_expected[b] <- (expected_accept_len, entropy); committed += accept_len + 1
    on active rows; bonus <- the walk's bonus; counter += 1; pending_len <- accept_len + 1 on active rows (0 on
    padding rows) when there is a draft (`bad` and `pending_len` given).

    token_ids [B, N] (the tree's); result: the walk's (accepted_nodes [B, D + 1]); entropy [B] fp32; active [B]
    bool (the engine's `active_rows`); bad: a 0-dim bool; the rest the engine's per-row state ([B] int64) and
    output buffers."""
    batch, cols = token_ids.shape
    width = result.accepted_nodes.shape[1]
    has_draft = bad is not None
    dummy = counter  # pointer arguments a launch without a draft never reads
    _commit_rows_kernel[(batch,)](
        token_ids.contiguous(), result.accepted_nodes.contiguous(), result.accept_len.contiguous(),
        result.bonus_token.contiguous(), result.expected_accept_len.contiguous(), entropy.contiguous(),
        active.view(torch.int8), bad.view(torch.int8) if has_draft else dummy,
        committed, bonus, counter, pending_len if has_draft else dummy, out_tokens, out_counts, out_expected,
        cols, width, out_tokens.stride(0), HAS_DRAFT=has_draft, WP=max(16, triton.next_power_of_2(width)), num_warps=1,
    )
