"""Trainer of the embedded pair: stdlib corpus -> BPE tokenizer -> Qwen3 target -> DFlash drafter.

The drafter is trained against the FROZEN target as DFlash trains: many random anchors per training
sequence in one forward; the block for anchor `a` is `[token at a, mask * (b - 1)]` at positions
`a .. a + b - 1`; its context is the target's features at positions `< a` (the inference convention of
drafter.py: the bonus's own features are not context); the loss is the cross-entropy of the drafter's
logits (through the target's lm_head) at block positions 1..b-1 against the target's greedy predictions,
with decaying position weights exp(-(k-1)/4).

Training sequences ("rollout" mode, the default): a real-code prompt followed by the target's OWN greedy
continuation, generated in batches before the drafter loop (DFlash also trains on target-generated
responses). Measured on the tiny pair: real-code windows with greedy labels gave DFlash tau 1.04,
rollouts 1.69 (DDTree 2.45 both); the drafter must learn the distribution it sees at inference.

Schedules: "steps" (tiny, small) fixes the learning-rate schedule and the stopping point by step counts,
with no wall-clock limit unless one is asked for (`max_minutes`); a limit that is hit marks the pair
incomplete in its manifest (`training.complete`, `training.incomplete_reason`), never silently.
"time" (large) uses the whole wall-clock budget. `ThreadPicker` picks 1 or N CPU threads from measured
step times. `evaluate_acceptance` is a teacher-forced offline estimate of tau at
T = 0 for DFlash (argmax chain) and DDTree (tree under a node budget).
"""

from __future__ import annotations

import hashlib
import heapq
import json
import logging
import math
import os
import platform
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from ddtree.models.corpus import CorpusFile, corpus_manifest, load_corpus, make_prompts
from ddtree.models.drafter import DFlashDrafter, training_block_mask
from ddtree.models.sizes import PairSize, drafter_config, get_size, target_config
from ddtree.models.tokenizer import save_tokenizer, special_token_ids, train_bpe

log = logging.getLogger("ddtree.train")


# ---- data ------------------------------------------------------------------------------------------

def tokenize_files(tok, files: list[CorpusFile], eos_id: int) -> torch.Tensor:
    """Concatenate the token ids of the files (sorted order), each followed by eos: [N] int64."""
    encs = tok.encode_batch([f.text for f in files])
    ids: list[int] = []
    for e in encs:
        ids.extend(e.ids)
        ids.append(eos_id)
    return torch.tensor(ids, dtype=torch.long)


def random_windows(stream: torch.Tensor, batch: int, seq_len: int, gen: torch.Generator) -> torch.Tensor:
    """[batch, seq_len] windows at random offsets of the token stream, on the stream's device (`gen` is a
    generator of that device: on CUDA the offsets never visit the host, so a step does not wait for the GPU)."""
    if stream.numel() <= seq_len:
        raise ValueError(f"token stream ({stream.numel()}) shorter than seq_len ({seq_len})")
    starts = torch.randint(0, stream.numel() - seq_len, (batch,), generator=gen, device=gen.device)
    return stream[starts.unsqueeze(1) + torch.arange(seq_len, device=starts.device)]


def lr_at(step: int, total: int, peak: float, warmup: int) -> float:
    """Linear warmup then cosine decay to 10% of peak."""
    if step < warmup:
        return peak * (step + 1) / warmup
    frac = min(1.0, (step - warmup) / max(1, total - warmup))
    return peak * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * frac)))


@dataclass
class ThreadPicker:
    """Chooses torch's CPU thread count during training from measured step times.

    On a CPU shared with other jobs, two OpenMP threads can be many times SLOWER than one (spinning
    barriers); on a quiet machine two are faster. Steps 1-4 alternate 1 and `max_threads` threads and
    the faster is kept; every `reprobe_s` seconds two steps try the other count again, which is kept
    only if clearly faster. Only active on CPU with `max_threads` > 1.
    """

    def __init__(self, max_threads: int, reprobe_s: float = 30.0) -> None:
        self.choices = (1, max_threads)
        self.current = max_threads
        self.times: dict[int, list[float]] = {1: [], max_threads: []}
        self.reprobe_s, self.last_probe = reprobe_s, 0.0
        self.probe_left = 0
        self.active = max_threads > 1

    def before_step(self, step: int, elapsed: float) -> None:
        if not self.active:
            return
        if 1 <= step <= 4:
            self.current = self.choices[step % 2]
        elif step == 5:
            self.current = min(self.choices, key=self._mean)
            self.last_probe = elapsed
        elif self.probe_left == 0 and elapsed - self.last_probe > self.reprobe_s:
            self.times[self._other()].clear()
            self.current, self.probe_left, self.last_probe = self._other(), 2, elapsed
        torch.set_num_threads(self.current)

    def after_step(self, step: int, seconds: float) -> None:
        if not self.active or step == 0:
            return
        hist = self.times[self.current]
        hist.append(seconds)
        del hist[:-5]
        if self.probe_left > 0:
            self.probe_left -= 1
            if self.probe_left == 0:
                prev = self._other()
                if self._mean(self.current) < 0.8 * self._mean(prev):
                    log.info("threads: %d -> %d", prev, self.current)
                else:
                    self.current = prev

    def _other(self) -> int:
        return self.choices[0] if self.current == self.choices[1] else self.choices[1]

    def _mean(self, n: int) -> float:
        h = self.times[n]
        return sum(h) / len(h) if h else float("inf")


@dataclass
class LoopResult:
    steps: int
    seconds: float
    final_loss: float  # EMA of the training loss at the end
    stopped_by: str  # "max_steps" | "deadline"
    threads: int  # CPU threads in use at the end (ThreadPicker's choice)


def run_loop(
    step_fn: Callable[[int], float],
    params: list[torch.nn.Parameter],
    *,
    peak_lr: float,
    budget_s: float,
    max_steps: int,
    log_every: int,
    desc: str,
    progress: bool,
    log_file: Path | None,
    schedule: str = "time",
    auto_threads: bool = False,
) -> LoopResult:
    """Generic AdamW loop under a wall-clock budget.

    The warmup + cosine schedule runs on training progress = max(step / max_steps, elapsed / budget):
    on a shared CPU the step time varies too much to fix a step count in advance, and this way the
    whole budget is used with the learning rate decayed at the deadline. schedule="steps" uses
    step / max_steps only (reproducible runs; the budget is then only a safety stop).
    """
    if schedule not in ("time", "steps"):
        raise ValueError(f"schedule must be 'time' or 'steps', got {schedule!r}")
    from tqdm.auto import tqdm

    # fused: one kernel for the whole update on CUDA (the default foreach path launches several per tensor group)
    opt = torch.optim.AdamW(params, lr=peak_lr, betas=(0.9, 0.95), weight_decay=0.05,
                            fused=all(p.is_cuda for p in params))
    t0 = time.perf_counter()
    warmup_frac = 0.05
    bar = tqdm(total=max_steps if max_steps < 10**5 else None, desc=desc, disable=not progress,
               unit="step", mininterval=2.0)
    ema = float("nan")
    step, stopped = 0, "max_steps"
    threads_before = torch.get_num_threads()
    picker = ThreadPicker(threads_before if auto_threads else 1)
    with (log_file.open("a") if log_file else open(os.devnull, "w")) as lf:
        while step < max_steps:
            elapsed = time.perf_counter() - t0
            if elapsed >= budget_s:
                stopped = "deadline"
                break
            frac = step / max_steps if schedule == "steps" else max(step / max_steps, elapsed / budget_s)
            lr = lr_at(int(frac * 10_000), 10_000, peak_lr, int(warmup_frac * 10_000))
            for g in opt.param_groups:
                g["lr"] = lr
            picker.before_step(step, elapsed)
            t_step = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            # step_fn may return a 0-dim tensor: it is read on the host only when logged, so on CUDA the
            # next step's launches queue behind this one instead of waiting for it
            loss = torch.as_tensor(step_fn(step)).detach()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            picker.after_step(step, time.perf_counter() - t_step)
            ema = loss if step == 0 else 0.95 * ema + 0.05 * loss
            step += 1
            bar.update(1)
            if step % log_every == 0:
                loss_f, ema_f = float(loss), float(ema)
                bar.set_postfix(loss=f"{ema_f:.3f}", lr=f"{lr:.2e}")
                rec = {"phase": desc, "step": step, "loss": loss_f, "loss_ema": ema_f, "lr": lr,
                       "elapsed_s": round(time.perf_counter() - t0, 2)}
                lf.write(json.dumps(rec) + "\n")
                lf.flush()
                log.info("%s step %d loss %.4f (ema %.4f) lr %.2e %.0fs", desc, step, loss_f, ema_f, lr,
                         time.perf_counter() - t0)
    bar.close()
    torch.set_num_threads(threads_before)
    return LoopResult(step, round(time.perf_counter() - t0, 2), float(ema), stopped, picker.current)


# ---- target ----------------------------------------------------------------------------------------

def train_target(
    model, stream: torch.Tensor, spec: PairSize, *, seed: int, device: torch.device, budget_s: float,
    progress: bool = True, log_file: Path | None = None, autocast: bool = False,
    heldout: torch.Tensor | None = None, probes: int = 8,
) -> LoopResult:
    """Causal-LM training on random windows of the train token stream.

    With `heldout`, the held-out loss is logged `probes` times during training (log file phase
    "target-heldout"): the evidence of whether the step count under- or over-fits the corpus."""
    # On CUDA the stream and the window offsets live on the GPU (no host round trip per step).
    gen = torch.Generator(device=device if device.type == "cuda" else "cpu").manual_seed(seed + 1)
    stream = stream.to(gen.device)
    probe_every = max(1, spec.target_max_steps // probes)
    model.train()

    def step_fn(step: int) -> torch.Tensor:
        if heldout is not None and step > 0 and step % probe_every == 0:
            model.eval()
            loss, entropy = eval_lm(model, heldout, spec.seq_len, device)
            model.train()
            log.info("target step %d: held-out loss %.4f, entropy %.4f", step, loss, entropy)
            if log_file is not None:
                with log_file.open("a") as lf:
                    lf.write(json.dumps({"phase": "target-heldout", "step": step, "heldout_loss": round(loss, 4),
                                         "heldout_entropy": round(entropy, 4)}) + "\n")
        x = random_windows(stream, spec.target_batch, spec.seq_len + 1, gen).to(device)  # [B, S+1]
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
            logits = model(input_ids=x[:, :-1]).logits  # [B, S, V]
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))
        loss.backward()
        return loss.detach()

    res = run_loop(step_fn, [p for p in model.parameters() if p.requires_grad], peak_lr=spec.target_lr,
                   budget_s=budget_s, max_steps=spec.target_max_steps, log_every=10, desc="target",
                   progress=progress, log_file=log_file, schedule=spec.schedule,
                   auto_threads=device.type == "cpu")
    model.eval()
    return res


@torch.no_grad()
def eval_lm(model, stream: torch.Tensor, seq_len: int, device: torch.device, max_windows: int = 32
            ) -> tuple[float, float]:
    """(mean next-token loss, mean entropy of the next-token distribution at T = 1), both in nats, over
    consecutive held-out windows."""
    n = min(max_windows, stream.numel() // (seq_len + 1))
    if n == 0:
        return float("nan"), float("nan")
    x = stream[: n * (seq_len + 1)].view(n, seq_len + 1).to(device)
    logp = torch.log_softmax(model(input_ids=x[:, :-1]).logits.float(), dim=-1)  # [n, S, V]
    loss = F.nll_loss(logp.reshape(-1, logp.shape[-1]), x[:, 1:].reshape(-1))
    entropy = -(logp.exp() * logp).sum(-1).mean()
    return float(loss), float(entropy)


# ---- drafter ---------------------------------------------------------------------------------------

def position_weights(block_size: int, gamma: float | None, device: torch.device) -> torch.Tensor:
    """[D] loss weights for drafted positions 1..b-1: exp(-(k-1)/gamma), normalised to mean 1."""
    k = torch.arange(block_size - 1, device=device, dtype=torch.float32)
    w = torch.ones_like(k) if not gamma else torch.exp(-k / gamma)
    return w / w.mean()


def sample_anchors(
    batch: int, num: int, seq_len: int, block_size: int, gen: torch.Generator, lo: torch.Tensor | None = None,
) -> torch.Tensor:
    """[batch, num] sorted distinct anchors in [1, seq_len - block_size] (context never empty), on gen's device.

    lo [batch] (optional): row r's anchors are >= lo[r]; the caller guarantees seq_len - block_size - lo + 1
    >= num (checked on the host once, not here: that would wait for the GPU every step)."""
    hi = seq_len - block_size  # last anchor whose whole block has labels inside the window
    if hi < 1:
        raise ValueError(f"seq_len ({seq_len}) must exceed block_size ({block_size})")
    num = min(num, hi)
    scores = torch.rand(batch, hi, generator=gen, device=gen.device)  # [batch, hi]: score of anchor 1 .. hi
    if lo is not None:  # scores are in [0, 1): a position below lo scores -1 and loses every top-k
        pos = torch.arange(1, hi + 1, device=scores.device)
        scores = scores.masked_fill(pos < lo.to(scores.device).unsqueeze(1), -1.0)
    return (scores.topk(num, dim=1).indices + 1).sort(dim=1).values


@torch.no_grad()
def target_features(target, x: torch.Tensor, layer_ids, autocast: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """The frozen target's view of x [B, S]: drafter input features [B, S, k*H] fp32 (the hidden states of
    `layer_ids`, concatenated) and greedy predictions [B, S] (greedy[t] predicts token t + 1)."""
    with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=autocast):
        out = target(input_ids=x, output_hidden_states=True)
        feats = torch.cat([out.hidden_states[i + 1] for i in layer_ids], dim=-1).float()  # [B, S, kH]
        return feats, out.logits.argmax(-1)


def drafter_batch_loss(
    target, drafter: DFlashDrafter, x: torch.Tensor, anchors: torch.Tensor, weights: torch.Tensor,
    label_mode: str = "greedy", autocast: bool = False,
    precomputed: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One training-layout forward. x [B, S] tokens, anchors [B, M]. Returns (loss, top-1 accuracy per pos [D],
    prefix acceptance per pos [D]: the fraction of blocks whose first k drafts are all right, so that
    1 + its sum is the teacher-forced DFlash tau of the batch).

    Labels at drafted position k (token position a + k): the target's greedy prediction from position
    a + k - 1 ("greedy") or the data token itself ("data"). `precomputed` = `target_features(x)` when the
    caller has it (the rollout pool is frozen, so its features are computed once), else the target runs here.
    """
    cfg = drafter.config
    B, S = x.shape
    M, b = anchors.shape[1], cfg.block_size
    dev = x.device
    feats, greedy = precomputed if precomputed is not None else target_features(
        target, x, cfg.target_layer_ids, autocast)
    embed = target.get_input_embeddings()
    head = target.get_output_embeddings()
    offs = torch.arange(b, device=dev)
    pos = anchors.unsqueeze(-1) + offs  # [B, M, b]
    ids = torch.full((B, M, b), cfg.mask_token_id, dtype=torch.long, device=dev)
    ids[:, :, 0] = x.gather(1, anchors)
    if label_mode == "greedy":
        labels = greedy.gather(1, (pos[:, :, 1:] - 1).reshape(B, -1)).view(B, M, b - 1)
    elif label_mode == "data":
        labels = x.gather(1, pos[:, :, 1:].reshape(B, -1)).view(B, M, b - 1)
    else:
        raise ValueError(f"label_mode must be 'greedy' or 'data', got {label_mode!r}")
    mask = training_block_mask(anchors, S, b)  # [B, M*b, S + M*b]
    with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=autocast):
        ctx = drafter.hidden_norm(drafter.fc(feats))  # [B, S, H]
        with torch.no_grad():
            blk = embed(ids.view(B, M * b))
        h = drafter(blk, pos.view(B, M * b), ctx, torch.arange(S, device=dev).expand(B, S), attention_mask=mask)
        logits = head(h.view(B, M, b, -1)[:, :, 1:])  # [B, M, D, V]
    ce = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1), reduction="none")
    loss = (ce.view(B, M, b - 1) * weights).mean()
    hit = logits.argmax(-1) == labels  # [B, M, D]
    acc = hit.float().mean(dim=(0, 1))  # [D]
    accept = hit.int().cumprod(-1).float().mean(dim=(0, 1))  # [D]
    return loss, acc, accept


@torch.no_grad()
def greedy_extend(target, prompts: torch.Tensor, n_new: int) -> torch.Tensor:
    """Batched greedy decoding with a KV cache: prompts [B, P] -> [B, P + n_new]."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        out = target(input_ids=prompts, use_cache=True, logits_to_keep=1)  # [B, 1, V]: not the prompt's logits
        past, nxt = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)  # [B, 1]
        toks = [prompts, nxt]
        for _ in range(n_new - 1):
            out = target(input_ids=nxt, past_key_values=past, use_cache=True)
            past, nxt = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
            toks.append(nxt)
    return torch.cat(toks, dim=1)


@torch.no_grad()
def rollout_pool(
    target, stream: torch.Tensor, spec: PairSize, *, gen: torch.Generator, device: torch.device, budget_s: float,
    max_rows: int, chunk: int = 64,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Training sequences in the drafter's inference distribution: a real-code prompt (a random window
    of 1/8 .. 1/2 of the rollout length) followed by the target's own greedy continuation.
    Generated in chunks (one prompt length per chunk) until max_rows or the time budget.
    Returns (pool [R, rollout_len] int64, prompt lengths [R] int64), both on CPU."""
    t0 = time.perf_counter()
    length = spec.rollout_len
    rows: list[torch.Tensor] = []
    lens: list[torch.Tensor] = []
    n = 0
    while n < max_rows and (n == 0 or time.perf_counter() - t0 < budget_s):
        P = int(torch.randint(length // 8, length // 2 + 1, (1,), generator=gen))
        prompts = random_windows(stream, chunk, P, gen).to(device)
        rows.append(greedy_extend(target, prompts, length - P).cpu())
        lens.append(torch.full((chunk,), P, dtype=torch.long))
        n += chunk
    pool, prompt_lens = torch.cat(rows)[:max_rows], torch.cat(lens)[:max_rows]
    log.info("rollout pool: %d sequences of %d tokens in %.1fs", pool.shape[0], length,
             time.perf_counter() - t0)
    return pool, prompt_lens


# Largest rollout-pool feature cache kept in CPU memory; bigger pools run the target in every drafter step.
# On CUDA the cache may also take up to half of the device memory free when it is built.
POOL_FEATURE_CACHE_BYTES = 2 << 30

# Continuation length of the offline T = 0 evaluation of a trained pair (the `acceptance_t0` metric of the shipped
# manifests); a property of that metric, not a request default (that is engine.types.DEFAULT_MAX_NEW_TOKENS).
EVAL_MAX_NEW_TOKENS = 64


def _feature_cache_limit(device: torch.device) -> int:
    if device.type != "cuda":
        return POOL_FEATURE_CACHE_BYTES
    torch.cuda.empty_cache()  # blocks the rollouts' KV caches left in torch's allocator count as free
    return max(POOL_FEATURE_CACHE_BYTES, torch.cuda.mem_get_info(device)[0] // 2)


def pool_features(
    target, pool: torch.Tensor, layer_ids, *, device: torch.device, autocast: bool, chunk: int = 32,
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """`target_features` of every pool row ([R, S, k*H] in the target's dtype, [R, S]) on `device`, or None
    when the cache would exceed the device's limit. The target is frozen, so each drafter step then skips
    its forward. Filled in place (no second copy of the cache while it is built)."""
    hidden = target.config.hidden_size * len(layer_ids)
    dtype = next(target.parameters()).dtype
    R, S = pool.shape
    if R * S * hidden * dtype.itemsize > _feature_cache_limit(device):
        return None
    t0 = time.perf_counter()
    feats = torch.empty((R, S, hidden), dtype=dtype, device=device)
    greedy = torch.empty((R, S), dtype=torch.long, device=device)
    for start in range(0, R, chunk):
        f, g = target_features(target, pool[start : start + chunk].to(device), layer_ids, autocast)
        feats[start : start + chunk] = f
        greedy[start : start + chunk] = g
    log.info("rollout pool features: %d rows (%.1f GB) in %.1fs", R, feats.numel() * dtype.itemsize / 1e9,
             time.perf_counter() - t0)
    return feats, greedy


LABEL_MODES = ("rollout", "greedy", "data")


def train_drafter(
    target, drafter: DFlashDrafter, stream: torch.Tensor, spec: PairSize, *, seed: int, device: torch.device,
    budget_s: float, label_mode: str = "rollout", gamma: float | None = 4.0, progress: bool = True,
    log_file: Path | None = None, autocast: bool = False, rollout_frac: float = 0.3,
) -> tuple[LoopResult, list[float], dict[str, Any]]:
    """Train the drafter against the frozen target.

    label_mode: "rollout" = sequences whose continuation the target generated greedily (a pool built
    with up to `rollout_frac` of the budget), labels = the target's greedy predictions; "greedy" = real
    code windows, labels = the target's greedy predictions; "data" = real code windows, data labels.
    Returns the loop result, the last batch's per-position top-1 accuracy and data statistics (with the
    last batch's teacher-forced DFlash tau).
    """
    if label_mode not in LABEL_MODES:
        raise ValueError(f"label_mode must be one of {LABEL_MODES}, got {label_mode!r}")
    for p in target.parameters():
        p.requires_grad_(False)
    target.eval()
    gen = torch.Generator().manual_seed(seed + 2)
    # What each step draws (rows, windows, anchors): on CUDA from a generator of the GPU, with the pool there
    # too, so that no step waits for the previous one to finish (a host tensor copied in would).
    step_gen = gen if device.type == "cpu" else torch.Generator(device=device).manual_seed(seed + 3)
    w = position_weights(spec.block_size, gamma, device)
    last: dict[str, torch.Tensor] = {}
    info: dict[str, Any] = {"label_mode": label_mode}
    t0 = time.perf_counter()
    pool = cached = lo = None
    if label_mode == "rollout":
        threads = torch.get_num_threads()
        torch.set_num_threads(1 if device.type == "cpu" else threads)  # many tiny ops: one thread is best
        pool, prompt_lens = rollout_pool(target, stream, spec, gen=gen, device=device,
                                         budget_s=rollout_frac * budget_s, max_rows=spec.rollout_rows,
                                         chunk=64 if device.type == "cpu" else 4096)
        info.update(rollout_rows=int(pool.shape[0]), rollout_s=round(time.perf_counter() - t0, 2))
        if spec.anchors_after_prompt:
            room = spec.rollout_len - spec.block_size - int(prompt_lens.max()) + 1
            if room < spec.drafter_anchors:
                raise ValueError(f"{room} anchor positions after the longest rollout prompt, fewer than "
                                 f"drafter_anchors ({spec.drafter_anchors})")
            lo = prompt_lens.to(step_gen.device)
        pool = pool.to(step_gen.device)
        # Also on one CPU thread: under any other load two OpenMP threads ran this pass ~5x slower
        # (52 s vs 10 s for 1024 x 320 tokens); small chunks keep each forward in cache.
        t_feats = time.perf_counter()
        cached = pool_features(target, pool, drafter.config.target_layer_ids, device=device, autocast=autocast,
                               chunk=8 if device.type == "cpu" else 256)
        info.update(pool_features_cached=cached is not None,
                    pool_features_s=round(time.perf_counter() - t_feats, 2))
        torch.set_num_threads(threads)
    else:
        stream = stream.to(step_gen.device)
    drafter.train()

    def step_fn(step: int) -> torch.Tensor:
        precomputed = row_lo = None
        if pool is not None:
            rows = torch.randint(0, pool.shape[0], (spec.drafter_batch,), generator=step_gen, device=step_gen.device)
            x = pool[rows].to(device)
            if cached is not None:  # pool_features put both on `device`
                precomputed = tuple(t[rows.to(device)] for t in cached)
            if lo is not None:
                row_lo = lo[rows]
        else:
            x = random_windows(stream, spec.drafter_batch, spec.seq_len, step_gen).to(device)
        anchors = sample_anchors(x.shape[0], spec.drafter_anchors, x.shape[1], spec.block_size, step_gen,
                                 row_lo).to(device)
        loss, acc, accept = drafter_batch_loss(target, drafter, x, anchors, w,
                                               "data" if label_mode == "data" else "greedy", autocast, precomputed)
        loss.backward()
        last.update(acc=acc, accept=accept)
        if step % 100 == 0:  # one host read per 100 steps
            log.info("drafter step %d: batch tau %.3f (teacher-forced, bonus included)", step, 1 + float(accept.sum()))
        return loss.detach()

    res = run_loop(step_fn, [p for p in drafter.parameters() if p.requires_grad], peak_lr=spec.drafter_lr,
                   budget_s=budget_s - (time.perf_counter() - t0), max_steps=spec.drafter_max_steps,
                   log_every=10, desc="drafter", progress=progress, log_file=log_file, schedule=spec.schedule,
                   auto_threads=device.type == "cpu")
    drafter.eval()
    last_acc = [round(float(a), 4) for a in last["acc"]] if last else []
    if last:
        info["last_batch_tau"] = round(1 + float(last["accept"].sum()), 4)
    return res, last_acc, info


# ---- offline acceptance --------------------------------------------------------------------------------

def _heap_tree(logits: torch.Tensor, budget: int) -> tuple[list[int], list[int]]:
    """Fallback best-first DDTree builder (used only if ddtree.core.build is unavailable).

    logits [D, V] -> (tokens, parents) of the non-root nodes in pop order; node ids start at 1, root 0.
    """
    logp = torch.log_softmax(logits.float(), dim=-1)
    D, V = logp.shape
    k = min(budget, V)
    top_lp, top_id = logp.topk(k, dim=-1)  # [D, k]
    top_lp, top_id = top_lp.tolist(), top_id.tolist()
    tokens: list[int] = []
    parents: list[int] = []
    heap = [(-top_lp[0][0], 0, 0, 0, 0.0)]  # (-logw, parent node, depth index, rank, parent logw)
    while heap and len(tokens) < budget:
        neg, parent, d, r, plw = heapq.heappop(heap)
        tokens.append(top_id[d][r])
        parents.append(parent)
        node = len(tokens)
        if r + 1 < k:
            heapq.heappush(heap, (-(plw + top_lp[d][r + 1]), parent, d, r + 1, plw))
        if d + 1 < D:
            heapq.heappush(heap, (-(-neg + top_lp[d + 1][0]), node, d + 1, 0, -neg))
    return tokens, parents


def tree_for(logits: torch.Tensor, budget: int) -> tuple[list[int], list[int]]:
    """(tokens, parents) of the DDTree nodes (root excluded, root id 0) from draft logits [D, V]."""
    try:
        from ddtree.core.build import build_tree
    except ImportError:
        return _heap_tree(logits, budget)
    res = build_tree(logits.unsqueeze(0), budget)
    n = int(res.num_nodes[0])
    return res.token_ids[0, 1:n].tolist(), res.parents[0, 1:n].tolist()


def tree_accept_len(tokens: list[int], parents: list[int], truth: list[int]) -> int:
    """Greedy walk: longest tree path whose tokens equal truth[0], truth[1], ..."""
    children: dict[int, dict[int, int]] = {}
    for i, (t, p) in enumerate(zip(tokens, parents), start=1):
        children.setdefault(p, {}).setdefault(t, i)
    node, n = 0, 0
    while n < len(truth) and truth[n] in children.get(node, {}):
        node = children[node][truth[n]]
        n += 1
    return n


def chain_accept_len(drafted: list[int], truth: list[int]) -> int:
    n = 0
    while n < min(len(drafted), len(truth)) and drafted[n] == truth[n]:
        n += 1
    return n


@torch.no_grad()
def greedy_continuation(target, ids: list[int], n: int, device: torch.device) -> list[int]:
    """The target's greedy continuation of `ids` (n tokens), plain KV-cached decoding."""
    x = torch.tensor([ids], device=device)
    out = target(input_ids=x, use_cache=True)
    past, nxt = out.past_key_values, int(out.logits[0, -1].argmax())
    cont = [nxt]
    for _ in range(n - 1):
        out = target(input_ids=torch.tensor([[nxt]], device=device), past_key_values=past, use_cache=True)
        past, nxt = out.past_key_values, int(out.logits[0, -1].argmax())
        cont.append(nxt)
    return cont


@torch.no_grad()
def all_block_logits(drafter: DFlashDrafter, embed, head, seq: list[int], feats: torch.Tensor,
                     starts: list[int]) -> torch.Tensor:
    """Draft logits of a round starting at each of `starts`, in ONE masked forward: [M, D, V].

    Identical to one inference-style `draft_logits` call per start (context = features of positions
    < start), by the training layout (tests/models/test_drafter.py checks the equivalence).
    """
    cfg = drafter.config
    b, dev = cfg.block_size, feats.device
    anchors = torch.tensor([starts], device=dev)  # [1, M]
    M, T = len(starts), feats.shape[1]
    ids = torch.full((1, M, b), cfg.mask_token_id, dtype=torch.long, device=dev)
    ids[0, :, 0] = torch.tensor([seq[s] for s in starts], device=dev)
    pos = (anchors.unsqueeze(-1) + torch.arange(b, device=dev)).view(1, M * b)
    mask = training_block_mask(anchors, T, b)
    h = drafter(embed(ids.view(1, M * b)), pos, feats, torch.arange(T, device=dev).unsqueeze(0),
                attention_mask=mask)  # [1, M*b, H]
    return head(h.view(M, b, -1)[:, 1:])  # [M, D, V]


@torch.no_grad()
def evaluate_acceptance(
    pair, prompts: list[dict], *, max_new_tokens: int = EVAL_MAX_NEW_TOKENS, budgets: Sequence[int] = (32,),
    num_prompts: int | None = 32, device: torch.device | str = "cpu", progress: bool = False,
    deadline: float | None = None,
) -> dict[str, Any]:
    """Teacher-forced tau at T = 0 for DFlash (argmax chain) and DDTree (tree under each of `budgets`).

    Per prompt: the target's greedy continuation c of max_new_tokens (+ one block of slack so the last
    round is not truncated). A round starting with the bonus at position s drafts from context features
    of positions < s (the engine's convention), accepts the longest drafted prefix equal to c after s,
    and the next bonus sits at s + accepted + 1. The first bonus is the prefill's token (position P).
    tau = (accepted + 1) averaged over rounds; reported pooled over rounds and averaged per prompt, as
    `dflash_tau` and `ddtree{B}_tau` (`ddtree{B}_over_dflash` their ratio). Also the target's mean
    entropy (nats, T = 1) at the positions that chose c: `target_entropy_on_greedy`. `deadline` (a
    time.perf_counter() value): no prompt is started after it; `num_prompts` then counts those done.
    """
    import warnings

    from tqdm.auto import tqdm

    device = torch.device(device)
    target, drafter, tok = pair.target, pair.drafter, pair.tokenizer
    b = drafter.config.block_size
    embed, head = target.get_input_embeddings(), target.get_output_embeddings()
    sel = prompts if num_prompts is None else prompts[:num_prompts]
    methods = ["dflash"] + [f"ddtree{B}" for B in budgets]
    stats = {m: {"rounds": 0, "accepted": 0, "per_prompt": []} for m in methods}
    entropy_sum, entropy_n, done = 0.0, 0, 0
    for rec in tqdm(sel, desc="eval", disable=not progress):
        if deadline is not None and time.perf_counter() > deadline:
            break
        done += 1
        ids = tok(rec["text"]).input_ids
        P = len(ids)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            cont = greedy_continuation(target, ids, max_new_tokens + b, device)
        seq = ids + cont
        out = target(input_ids=torch.tensor([seq], device=device), output_hidden_states=True)
        logp = torch.log_softmax(out.logits[0, P - 1 : P - 1 + max_new_tokens].float(), dim=-1)  # [N, V]
        entropy_sum += float(-(logp.exp() * logp).sum())
        entropy_n += logp.shape[0]
        feats = drafter.extract_context(out.hidden_states)  # [1, len, H]
        starts = list(range(P, P + max_new_tokens))
        logits_all = all_block_logits(drafter, embed, head, seq, feats, starts)  # [N, D, V]
        chains = logits_all.argmax(-1).tolist()  # [N][D]
        for method in methods:
            s, rounds, acc = P, 0, 0
            while s < P + max_new_tokens:
                truth = seq[s + 1 : s + b]
                if method == "dflash":
                    n = chain_accept_len(chains[s - P], truth)
                else:
                    n = tree_accept_len(*tree_for(logits_all[s - P], int(method[len("ddtree"):])), truth)
                rounds += 1
                acc += n
                s += n + 1
            st = stats[method]
            st["rounds"] += rounds
            st["accepted"] += acc
            st["per_prompt"].append((acc + rounds) / rounds)
    result: dict[str, Any] = {"num_prompts": done, "max_new_tokens": max_new_tokens, "budgets": list(budgets),
                              "block_size": b, "temperature": 0.0,
                              "target_entropy_on_greedy": round(entropy_sum / max(entropy_n, 1), 4)}
    for m, st in stats.items():
        result[f"{m}_tau"] = round((st["accepted"] + st["rounds"]) / max(st["rounds"], 1), 4)
        result[f"{m}_tau_per_prompt_mean"] = round(sum(st["per_prompt"]) / max(len(st["per_prompt"]), 1), 4)
        result[f"{m}_rounds"] = st["rounds"]
    for B in budgets:
        result[f"ddtree{B}_over_dflash"] = round(result[f"ddtree{B}_tau"] / max(result["dflash_tau"], 1e-9), 4)
    return result


# ---- orchestration ---------------------------------------------------------------------------------

def _seed_all(seed: int) -> None:
    import random

    random.seed(seed)
    torch.manual_seed(seed)


def _file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def phase_budgets(spec: PairSize, max_minutes: float | None) -> tuple[float, float]:
    """Wall-clock budgets (seconds) of the target and drafter phases.

    schedule="steps": the schedule is fixed by step counts and no wall-clock limit applies unless
    `max_minutes` is given (then both phases share it pro rata, and a phase that hits it is reported
    incomplete: `training_status`). schedule="time": the size's minutes, scaled down to `max_minutes`.
    """
    if max_minutes is not None and max_minutes <= 0:
        raise ValueError(f"max_minutes must be > 0, got {max_minutes}")
    t_budget, d_budget = spec.target_minutes * 60, spec.drafter_minutes * 60
    if max_minutes is None:
        return (math.inf, math.inf) if spec.schedule == "steps" else (t_budget, d_budget)
    share = t_budget / (t_budget + d_budget)
    total = max_minutes * 60 if spec.schedule == "steps" else min(max_minutes * 60, t_budget + d_budget)
    return total * share, total * (1.0 - share)


def _json_budget(seconds: float) -> float | None:
    return None if math.isinf(seconds) else round(seconds, 2)


def training_status(spec: PairSize, target: LoopResult, drafter: LoopResult,
                    rollout_rows: int | None = None) -> dict[str, Any]:
    """`complete` (both phases reached their step schedule) and, when not, the reason in words.

    A step-scheduled pair stopped by a wall-clock limit is a different (weaker) pair than the one its
    size names; the stage job fails on it and the report's header says so (see `incomplete_reason`).
    """
    short = [(name, res) for name, res in (("target", target), ("drafter", drafter))
             if spec.schedule == "steps" and res.stopped_by != "max_steps"]
    pool_short = spec.schedule == "steps" and rollout_rows is not None and rollout_rows < spec.rollout_rows
    if not short and not pool_short:
        return {"complete": True, "incomplete_reason": None}
    maxima = {"target": spec.target_max_steps, "drafter": spec.drafter_max_steps}
    parts = [f"the {name} stopped at step {res.steps} of {maxima[name]} ({res.stopped_by})" for name, res in short]
    if pool_short:
        parts.append(f"the drafter's rollout pool has {rollout_rows} of {spec.rollout_rows} sequences")
    words = "; ".join(parts)
    return {"complete": False, "incomplete_reason": f"a wall-clock limit cut training short: {words}"}


def train_pair(
    out_dir: str | Path, size: str | PairSize = "small", *, seed: int = 0, device: str = "cpu",
    max_minutes: float | None = None, progress: bool = True, evaluate: bool = True,
    label_mode: str = "rollout", num_prompts: int = 200, eval_prompts: int = 32,
) -> dict[str, Any]:
    """Build the whole pair directory; returns the manifest (also written to out_dir/manifest.json).

    `size`: a preset name of ddtree.models.sizes or a PairSize (e.g. a scaled-down preset for a smoke run)."""
    from transformers import Qwen3ForCausalLM

    from ddtree.models.pair import default_dtype

    spec = size if isinstance(size, PairSize) else get_size(size)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device='cuda' requested but CUDA is not available")
    autocast = dev.type == "cuda"
    t_budget, d_budget = phase_budgets(spec, max_minutes)
    log_file = out / "train_log.jsonl"
    log_file.write_text("")
    _seed_all(seed)
    t_all = time.perf_counter()

    # corpus + prompts
    t0 = time.perf_counter()
    files = load_corpus(max_train_bytes=spec.corpus_max_train_bytes)
    train_files = [f for f in files if f.split == "train"]
    held_files = [f for f in files if f.split == "heldout"]
    prompts = make_prompts(files, n=num_prompts, seed=seed)
    (out / "prompts").mkdir(exist_ok=True)
    with (out / "prompts" / "heldout.jsonl").open("w") as fh:
        for p in prompts:
            fh.write(json.dumps(p) + "\n")

    # tokenizer (on a deterministic prefix of the train split)
    tok_texts, nbytes = [], 0
    for f in train_files:
        if spec.tokenizer_max_bytes is not None and nbytes >= spec.tokenizer_max_bytes:
            break
        tok_texts.append(f.text)
        nbytes += len(f.text)
    tok = train_bpe(tok_texts, spec.vocab_size)
    special = special_token_ids(tok)
    vocab = tok.get_vocab_size()
    train_stream = tokenize_files(tok, train_files, special["eos_token_id"])
    held_stream = tokenize_files(tok, held_files, special["eos_token_id"])
    prep_s = time.perf_counter() - t0
    log.info("corpus: %d train files (%d tokens), %d held-out files (%d tokens), vocab %d, %.1fs",
             len(train_files), train_stream.numel(), len(held_files), held_stream.numel(), vocab, prep_s)

    # target
    torch.manual_seed(seed)
    target = Qwen3ForCausalLM(target_config(spec, vocab, special["eos_token_id"])).to(dev)
    # held-out probes during training only on the GPU, where each costs ~0.1 s (seconds on a CPU)
    t_res = train_target(target, train_stream, spec, seed=seed, device=dev, budget_s=t_budget,
                         progress=progress, log_file=log_file, autocast=autocast,
                         heldout=held_stream if dev.type == "cuda" else None)
    held_loss, held_entropy = eval_lm(target, held_stream, spec.seq_len, dev)
    target.save_pretrained(str(out / "target"))
    save_tokenizer(tok, out / "target", spec.max_position_embeddings)
    # The drafter learns the target as the engine runs it on this device (bf16 on CUDA: its features and
    # greedy text, not those of the fp32 training copy).
    target.to(default_dtype(dev))

    # drafter: the budgets cover preparation too (the minutes are the whole wall-clock budget);
    # time the target did not use (it stopped at max_steps) goes to the drafter
    if math.isfinite(d_budget):
        d_budget = max(10.0, t_budget + d_budget - (time.perf_counter() - t_all))
    torch.manual_seed(seed + 100)
    drafter = DFlashDrafter(drafter_config(spec, vocab, special["mask_token_id"])).to(dev)
    d_res, d_acc, d_info = train_drafter(target, drafter, train_stream, spec, seed=seed, device=dev,
                                         budget_s=d_budget, label_mode=label_mode, progress=progress,
                                         log_file=log_file, autocast=autocast)
    drafter.save_pretrained(out / "drafter")
    train_s = time.perf_counter() - t_all

    manifest: dict[str, Any] = {
        "kind": "embedded",
        "size": spec.to_dict(),
        "seed": seed,
        "device": str(dev),
        "label_mode": label_mode,
        "vocab_size": vocab,
        **special,
        "environment": {"python": sys.version.split()[0], "torch": torch.__version__,
                        "platform": platform.platform(), "torch_threads": torch.get_num_threads()},
        "corpus": corpus_manifest(files),
        "tokens": {"train": int(train_stream.numel()), "heldout": int(held_stream.numel())},
        "prompts": {"path": "prompts/heldout.jsonl", "count": len(prompts),
                    "sha256": _file_sha256(out / "prompts" / "heldout.jsonl")},
        "training": {
            "prep_s": round(prep_s, 2),
            "target": {**t_res.__dict__, "budget_s": _json_budget(t_budget), "max_steps": spec.target_max_steps,
                       "heldout_loss": round(held_loss, 4), "heldout_entropy": round(held_entropy, 4)},
            "drafter": {**d_res.__dict__, **d_info, "budget_s": _json_budget(d_budget),
                        "max_steps": spec.drafter_max_steps, "last_batch_acc_per_pos": d_acc},
            "total_s": round(train_s, 2),
            **training_status(spec, t_res, d_res, d_info.get("rollout_rows")),
        },
        "metrics": {},
    }
    if evaluate:
        from ddtree.models.pair import load_pair

        pair = load_pair(out, device=dev, dtype=default_dtype(dev))
        threads_before = torch.get_num_threads()
        torch.set_num_threads(d_res.threads)  # what the drafter phase found fastest
        t_eval = time.perf_counter()
        manifest["metrics"]["acceptance_t0"] = evaluate_acceptance(
            pair, prompts, num_prompts=eval_prompts, device=dev, progress=progress)
        manifest["metrics"]["acceptance_t0"]["eval_s"] = round(time.perf_counter() - t_eval, 2)
        torch.set_num_threads(threads_before)
        log.info("acceptance: %s", manifest["metrics"]["acceptance_t0"])
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest
