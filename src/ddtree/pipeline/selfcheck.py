"""`ddtree selfcheck --device cpu|cuda --out check.json`: the pipeline's first stage, the install check of the
core on one device (its trees come from `ddtree.testing.trees`, the fixtures the core tests use).

Checks (each recorded as {"name", "ok", "detail", "seconds"}):
- build_heap_equals_batched: `build_tree` heap and batched builders return identical trees;
- retrieve_walk: following encode_retrieve's first-child / next-sibling links visits exactly each
  node's children in descending logw, and retrieve_index is b * N + i;
- verify_greedy_walk: verify_greedy equals a plain per-request argmax walk; commit emits path + bonus;
- verify_sampling_lossless[torch|reference]: a quick chi-square (alpha = 1e-3, cells with expected
  count < 5 merged) of the emitted sequence against the exact target law;
- temperature_zero_equals_greedy;
- triton_sampler_probe (CUDA with triton importable; informational, never fails): whether the Triton lazy
  sample-and-walk compiles and matches torch, else why not (the torch path is then used);
- verify_sampling_lossless[triton] (where the Triton walk is usable): the same, T = 0.9;
- sglang_kernel_matches_reference (only where SGLang's kernel is importable on CUDA): identical
  outcomes on the same coins for at least 99% of rows.
The JSON record: {"ok", "device", "torch_version", "cuda": {"available", "version", "device_name"},
"sglang_kernel": "available"|"unavailable", "triton_sampler": "available"|"unavailable" (the Triton
walk, probed on the device), "python", "created_utc", "checks": [...]}.
Exit status 1 when any check fails.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import random
import time
import traceback
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import torch

from ddtree.testing.trees import batch_trees, children_of, random_tree, repeat_tree

ALPHA = 1e-3


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", default="cpu", help="cpu or cuda (or cuda:N)")
    parser.add_argument("--out", required=True, help="path of the JSON record to write")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rows", type=int, default=6000, help="rows of the quick lossless checks")


# ---------------------------------------------------------------- small helpers


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _naive_walk(nodes, picks: list[int], max_depth: int) -> tuple[list[int], int]:
    kids = children_of(nodes)
    path = [0]
    while True:
        cur = path[-1]
        nxt = [c for c in kids[cur] if nodes[c].token == picks[cur]] if nodes[cur].depth < max_depth else []
        if not nxt:
            return path, picks[cur]
        path.append(nxt[0])


def _exact_law(nodes, probs: list[list[float]], max_depth: int) -> dict[tuple, float]:
    kids = children_of(nodes)
    law: dict[tuple, float] = {}
    stack = [(0, 1.0, ())]
    while stack:
        u, p_path, tokens = stack.pop()
        child = {nodes[c].token: c for c in kids[u]} if nodes[u].depth < max_depth else {}
        for x, p in enumerate(probs[u]):
            if x in child:
                stack.append((child[x], p_path * p, tokens + (x,)))
            elif p > 0:
                law[tokens + (x,)] = law.get(tokens + (x,), 0.0) + p_path * p
    return law


def _chi_square_pvalue(observed: Counter, law: dict[tuple, float]) -> float:
    from scipy import stats

    impossible = set(observed) - set(law)
    if impossible:
        return 0.0
    total = sum(observed.values())
    keys = sorted(law, key=lambda k: -law[k])
    exp = [law[k] * total for k in keys]
    obs = [observed.get(k, 0) for k in keys]
    cells_e, cells_o, rest_e, rest_o = [], [], 0.0, 0
    for e, o in zip(exp, obs):
        if e >= 5:
            cells_e.append(e)
            cells_o.append(o)
        else:
            rest_e += e
            rest_o += o
    if rest_e >= 5 or not cells_e:
        cells_e.append(rest_e)
        cells_o.append(rest_o)
    else:
        cells_e[-1] += rest_e
        cells_o[-1] += rest_o
    scale = sum(cells_o) / sum(cells_e)
    return float(stats.chisquare(cells_o, [e * scale for e in cells_e]).pvalue)


# ---------------------------------------------------------------- the checks


def check_build(device: torch.device, seed: int) -> str:
    from ddtree.core.build import build_tree

    gen = torch.Generator().manual_seed(seed)
    shapes = [(1, 4, 50, 8), (4, 6, 300, 32), (3, 15, 1000, 64)]  # (B, D, V, budget)
    for batch, depth, vocab, budget in shapes:
        logits = (torch.randn(batch, depth, vocab, generator=gen) * 3).to(device)
        heap = build_tree(logits, budget, method="heap")
        batched = build_tree(logits, budget, method="batched")
        for field in ("token_ids", "parents", "depths", "node_logws", "num_nodes"):
            a, b = getattr(heap, field).cpu(), getattr(batched, field).cpu()
            if not torch.equal(a, b):
                raise AssertionError(
                    f"heap and batched differ in {field} at B={batch} D={depth} V={vocab} budget={budget}"
                )
    return f"identical on {len(shapes)} shapes"


def check_retrieve(device: torch.device, seed: int) -> str:
    from ddtree.core.build import build_tree
    from ddtree.core.retrieve import encode_retrieve

    gen = torch.Generator().manual_seed(seed + 1)
    tree = build_tree((torch.randn(6, 5, 40, generator=gen) * 2).to(device), 24)
    enc = encode_retrieve(tree)
    nxt, sib, idx = (getattr(enc, f).cpu() for f in ("retrieve_next_token", "retrieve_next_sibling", "retrieve_index"))
    parents, logws = tree.parents.cpu(), tree.node_logws.cpu()
    cols = tree.num_columns
    for b in range(tree.batch_size):
        real = [i for i in range(cols) if i == 0 or int(parents[b, i]) >= 0]
        for i in real:
            if int(idx[b, i]) != b * cols + i:
                raise AssertionError(f"retrieve_index[{b}, {i}] = {int(idx[b, i])}, expected {b * cols + i}")
            walked, c = [], int(nxt[b, i])
            while c != -1 and len(walked) <= cols:
                walked.append(c)
                c = int(sib[b, c])
            kids = (j for j in real if j > 0 and int(parents[b, j]) == i)
            expected = sorted(kids, key=lambda j: (-float(logws[b, j]), j))
            if walked != expected:
                raise AssertionError(f"request {b} node {i}: links visit {walked}, children by logw are {expected}")
    return f"{tree.batch_size} trees, {cols} columns"


def check_greedy(device: torch.device, seed: int) -> str:
    from ddtree.core.verify import commit, verify_greedy

    rng = random.Random(seed + 2)
    cols, vocab, depth = 16, 5, 4
    trees = [random_tree(rng.randint(1, cols), vocab, depth, rng) for _ in range(32)]
    tree = batch_trees(trees, cols, device)
    logits = torch.randn(32, cols, vocab, generator=torch.Generator().manual_seed(seed))
    for b, nodes in enumerate(trees):
        for node in nodes[1:]:
            logits[b, node.parent, node.token] += 2.5
    result = verify_greedy(tree, logits.to(device), max_depth=depth)
    emitted = commit(tree, result)
    picks = logits.argmax(-1).tolist()
    total = 0
    for b, nodes in enumerate(trees):
        path, bonus = _naive_walk(nodes, picks[b], depth)
        got = result.accepted_nodes[b].tolist()
        if got != path + [-1] * (depth + 1 - len(path)) or int(result.bonus_token[b]) != bonus:
            bonus_got = int(result.bonus_token[b])
            raise AssertionError(f"request {b}: walked {got} bonus {bonus_got}, expected {path} {bonus}")
        want = [nodes[i].token for i in path[1:]] + [bonus]
        if emitted.emitted_tokens[b, : len(want)].tolist() != want:
            raise AssertionError(f"request {b}: commit emitted {emitted.emitted_tokens[b].tolist()}, expected {want}")
        total += len(path) - 1
    return f"32 requests, {total} accepted nodes"


def check_lossless(device: torch.device, seed: int, rows: int, backend: str,
                   params_row: tuple[float, int, float] = (0.9, 5, 0.95)) -> str:
    from ddtree.core.sampling import SamplingParams, process_logits
    from ddtree.core.verify import commit, verify_sampling

    rng = random.Random(seed + 3)
    cols, vocab, depth = 10, 6, 3
    nodes = random_tree(cols, vocab, depth, rng)
    row_logits = torch.randn(cols, vocab, generator=torch.Generator().manual_seed(seed + 3))
    for node in nodes[1:]:
        row_logits[node.parent, node.token] += 1.5
    params = SamplingParams(*params_row)
    tree = repeat_tree(nodes, rows, device)
    logits = row_logits.to(device).expand(rows, -1, -1).contiguous()
    gen = torch.Generator(device=device).manual_seed(seed)
    result = verify_sampling(tree, logits, params, gen, max_depth=depth, backend=backend)
    out = commit(tree, result)
    seqs = Counter(tuple(r[:n]) for r, n in zip(out.emitted_tokens.tolist(), out.num_emitted.tolist()))
    probs = process_logits(row_logits.unsqueeze(0).double(), params)[0].tolist()
    pvalue = _chi_square_pvalue(seqs, _exact_law(nodes, probs, depth))
    if not pvalue > ALPHA:
        raise AssertionError(f"chi-square p = {pvalue:.3g} <= alpha {ALPHA} over {rows} rows")
    return f"chi-square p = {pvalue:.3g} over {rows} rows, mean accept {result.accept_len.float().mean().item():.3f}"


def check_temperature_zero(device: torch.device, seed: int) -> str:
    from ddtree.core.sampling import SamplingParams
    from ddtree.core.verify import verify_greedy, verify_sampling

    rng = random.Random(seed + 4)
    trees = [random_tree(rng.randint(1, 12), 6, 4, rng) for _ in range(16)]
    tree = batch_trees(trees, 12, device)
    logits = (torch.randn(16, 12, 6, generator=torch.Generator().manual_seed(seed)) * 3).to(device)
    greedy = verify_greedy(tree, logits, max_depth=4)
    for backend in ("torch", "reference"):
        sampled = verify_sampling(tree, logits, SamplingParams(0.0), max_depth=4, backend=backend)
        for field in ("accept_len", "accepted_nodes", "bonus_token"):
            if not torch.equal(getattr(sampled, field), getattr(greedy, field)):
                raise AssertionError(f"backend {backend}: {field} differs from verify_greedy")
    return "torch and reference backends equal verify_greedy"


def check_sglang_kernel(device: torch.device, seed: int) -> str:
    from ddtree.core.build import build_tree
    from ddtree.core.sglang_kernel import (
        draw_coins,
        load_sglang_kernel,
        reference_tree_speculative_sampling_target_only,
        verify_with_kernel,
    )
    from ddtree.core.retrieve import encode_retrieve
    from ddtree.core.sampling import SamplingParams, process_logits

    gen = torch.Generator().manual_seed(seed + 5)
    tree = build_tree((torch.randn(64, 7, 500, generator=gen) * 3).to(device), 48)
    logits = (torch.randn(64, tree.num_columns, 500, generator=gen) * 3).to(device)
    probs = process_logits(logits, SamplingParams(1.0, 50, 0.95))
    coins = draw_coins(64, tree.num_columns, device, torch.Generator(device=device).manual_seed(seed))
    enc = encode_retrieve(tree)
    real = verify_with_kernel(tree, enc, probs, kernel=load_sglang_kernel(), max_depth=7, coins=coins)
    ref = verify_with_kernel(tree, enc, probs, kernel=reference_tree_speculative_sampling_target_only,
                             max_depth=7, coins=coins)
    same = ((real.accepted_nodes == ref.accepted_nodes).all(1) & (real.bonus_token == ref.bonus_token)).float()
    rate = same.mean().item()
    if rate < 0.99:
        raise AssertionError(f"kernel and reference agree on {rate:.3f} of rows (< 0.99)")
    return f"agreement {rate:.4f} on 64 rows, mean accept {real.accept_len.float().mean().item():.3f}"


def _triton_importable() -> bool:
    try:
        import ddtree.core.triton_verify  # noqa: F401
    except Exception:  # noqa: BLE001 - triton missing or broken
        return False
    return True


def check_triton_probe(device: torch.device) -> str:
    # Informational: a failed probe only means verify_sampling uses the (exact) torch path.
    from ddtree.core.triton_verify import TRITON_PROBE_ERRORS, lazy_walk_usable

    if not lazy_walk_usable(device):
        return f"lazy sample-and-walk unavailable, torch path used: {TRITON_PROBE_ERRORS.get(f'lazy:{device}', '?')}"
    return "lazy sample-and-walk compiled and matches torch on the probe"


def _triton_sampler_ok(device: torch.device) -> bool:
    from ddtree.core.verify import verify_paths

    try:
        return verify_paths(device).triton
    except Exception:  # noqa: BLE001
        return False


def _run_check(name: str, fn: Callable[[], str], device: torch.device) -> dict:
    start = time.perf_counter()
    try:
        detail, ok = fn(), True
    except Exception as exc:  # noqa: BLE001 - a failing check is recorded, not raised
        detail, ok = f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=3)}", False
    try:
        _sync(device)
    except Exception:  # noqa: BLE001
        pass
    return {"name": name, "ok": ok, "detail": detail, "seconds": round(time.perf_counter() - start, 4)}


def run_checks(device_name: str, seed: int = 0, rows: int = 6000) -> dict:
    """All checks on one device; returns the JSON record (does not write it)."""
    from ddtree.core.sglang_kernel import load_sglang_kernel

    cuda = {
        "available": torch.cuda.is_available(),
        "version": torch.version.cuda,
        "device_name": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }
    record = {
        "ok": False,
        "device": device_name,
        "torch_version": torch.__version__,
        "cuda": cuda,
        "sglang_kernel": "available" if load_sglang_kernel() is not None else "unavailable",
        "triton_sampler": "unavailable",
        "python": platform.python_version(),
        "created_utc": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "checks": [],
    }
    try:
        device = torch.device(device_name)
        if device.type not in ("cpu", "cuda"):
            raise ValueError(f"--device must be cpu or cuda, got {device_name!r}")
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError("--device cuda requested but torch.cuda.is_available() is False")
        torch.empty(1, device=device)
    except Exception as exc:  # noqa: BLE001
        record["checks"].append({"name": "device", "ok": False, "detail": str(exc), "seconds": 0.0})
        return record

    record["triton_sampler"] = "available" if _triton_sampler_ok(device) else "unavailable"
    checks: list[tuple[str, Callable[[], str]]] = [
        ("build_heap_equals_batched", lambda: check_build(device, seed)),
        ("retrieve_walk", lambda: check_retrieve(device, seed)),
        ("verify_greedy_walk", lambda: check_greedy(device, seed)),
        ("verify_sampling_lossless[torch]", lambda: check_lossless(device, seed, rows, "torch")),
        ("verify_sampling_lossless[reference]", lambda: check_lossless(device, seed, rows, "reference")),
        ("temperature_zero_equals_greedy", lambda: check_temperature_zero(device, seed)),
    ]
    if device.type == "cuda" and _triton_importable():
        checks.append(("triton_sampler_probe", lambda: check_triton_probe(device)))
    if record["triton_sampler"] == "available":
        checks.append(("verify_sampling_lossless[triton]",
                       lambda: check_lossless(device, seed, rows, "triton", (0.9, -1, 1.0))))
    if device.type == "cuda" and record["sglang_kernel"] == "available":
        checks.append(("sglang_kernel_matches_reference", lambda: check_sglang_kernel(device, seed)))
        checks.append(("verify_sampling_lossless[sglang]", lambda: check_lossless(device, seed, rows, "sglang")))
    record["checks"] = [_run_check(name, fn, device) for name, fn in checks]
    record["ok"] = all(c["ok"] for c in record["checks"])
    return record


def run(args: argparse.Namespace) -> int:
    record = run_checks(args.device, seed=args.seed, rows=args.rows)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=2) + "\n")
    for check in record["checks"]:
        status = "ok  " if check["ok"] else "FAIL"
        print(f"{status} {check['name']:40s} {check['seconds']:8.3f}s  {check['detail'].splitlines()[0]}")
    print(f"selfcheck on {record['device']}: {'ok' if record['ok'] else 'FAILED'} -> {out}")
    return 0 if record["ok"] else 1
