"""Sampling parameters and the target-distribution processing shared by the verifiers.

Processing order (the same as SGLang's): temperature, then top-k, then top-p.
- `temperature == 0` makes that row greedy: its distribution is the one-hot argmax of the raw logits.
- `top_k <= 0` disables top-k (SGLang sends -1); ties with the k-th largest logit are kept.
- `top_p` in (0, 1]: keep the smallest most-probable set whose mass reaches `top_p` (ties with the
  smallest kept probability are kept), then renormalise.

Memory: the whole path works in place on ONE fp32 buffer shaped like the logits. Top-k takes a
`topk` threshold (a [.., k_max] side tensor). Top-p needs a sort, which allocates a transient sorted
copy and its int64 indices; they are freed before `process_logits` returns, and rows are never sorted
when no row uses top-p (decided from the parameters on the host, without touching the logits).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from numbers import Integral, Real

import torch

from ddtree.core.checks import check_all_finite, check_tensor

Scalar = float | int
ParamValue = float | int | torch.Tensor


def _check_param_tensor(name: str, value: torch.Tensor, *, integer: bool) -> None:
    check_tensor(name, value, ndim=1)
    if integer and (value.is_floating_point() or value.dtype == torch.bool or value.is_complex()):
        raise ValueError(f"{name} must hold integers, got dtype {value.dtype}")
    if not integer and value.dtype == torch.bool:
        raise ValueError(f"{name} must hold real numbers, got dtype {value.dtype}")
    if value.is_floating_point() and not bool(torch.isfinite(value).all()):
        raise ValueError(f"{name} contains non-finite values (nan or inf)")


def _check_scalar(name: str, value: object, *, integer: bool) -> None:
    if isinstance(value, bool):
        raise ValueError(f"{name} must be a number, got bool")
    if integer:
        if not isinstance(value, Integral):
            raise ValueError(f"{name} must be an int or an integer [B] tensor, got {type(value).__name__}")
        return
    if not isinstance(value, Real):
        raise ValueError(f"{name} must be a real number or a [B] tensor, got {type(value).__name__}")
    if not math.isfinite(float(value)):
        raise ValueError(f"{name} must be finite, got {value}")


@dataclass(frozen=True)
class SamplingParams:
    """Per-request sampling parameters: scalars (shared by all rows) or [B] tensors.

    Tensor values are validated once here (one device read when they live on an accelerator);
    the flags derived from them (`all_greedy`, `any_greedy`, `max_top_k`, `uses_top_p`) are host
    values, so processing never has to synchronise to choose its code path.
    """

    temperature: ParamValue = 0.0
    top_k: ParamValue = -1
    top_p: ParamValue = 1.0
    all_greedy: bool = field(init=False, repr=False)
    any_greedy: bool = field(init=False, repr=False)
    max_top_k: int = field(init=False, repr=False)  # 0 when no row uses top-k
    uses_top_p: bool = field(init=False, repr=False)
    min_positive_temperature: float = field(init=False, repr=False)  # inf when every row is greedy

    def __post_init__(self) -> None:
        sizes = {}
        for name, integer in (("temperature", False), ("top_k", True), ("top_p", False)):
            value = getattr(self, name)
            if isinstance(value, torch.Tensor):
                _check_param_tensor(name, value, integer=integer)
                sizes[name] = int(value.shape[0])
            else:
                _check_scalar(name, value, integer=integer)
        if len(set(sizes.values())) > 1:
            raise ValueError(f"temperature, top_k and top_p tensors have different lengths: {sizes}")
        devices = {getattr(self, n).device for n in sizes}
        if len(devices) > 1:
            raise ValueError(f"temperature, top_k and top_p tensors are on different devices: {devices}")

        t = self.temperature
        if isinstance(t, torch.Tensor):
            t_min = float(t.min()) if t.numel() else 0.0
        else:
            t_min = float(t)
        if t_min < 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got minimum {t_min}")
        p = self.top_p
        if isinstance(p, torch.Tensor):
            p_bad = p.numel() > 0 and bool(((p <= 0) | (p > 1)).any())
        else:
            p_bad = not (0.0 < float(p) <= 1.0)
        if p_bad:
            raise ValueError(f"top_p must lie in (0, 1], got {p}")

        if isinstance(t, torch.Tensor):
            all_greedy = bool((t == 0).all())
            any_greedy = bool((t == 0).any())
        else:
            all_greedy = any_greedy = float(t) == 0.0
        k = self.top_k
        max_top_k = (int(k.max()) if k.numel() else 0) if isinstance(k, torch.Tensor) else int(k)
        uses_top_p = bool((p < 1).any()) if isinstance(p, torch.Tensor) else float(p) < 1.0
        object.__setattr__(self, "all_greedy", all_greedy)
        object.__setattr__(self, "any_greedy", any_greedy)
        object.__setattr__(self, "max_top_k", max(max_top_k, 0))
        object.__setattr__(self, "uses_top_p", uses_top_p)
        if isinstance(t, torch.Tensor):
            positive = t[t > 0]
            min_positive = float(positive.min()) if positive.numel() else math.inf
        else:
            min_positive = float(t) if float(t) > 0 else math.inf
        object.__setattr__(self, "min_positive_temperature", min_positive)

    @property
    def batch_size(self) -> int | None:
        """Length of the tensor parameters, or None when all three are scalars."""
        for name in ("temperature", "top_k", "top_p"):
            value = getattr(self, name)
            if isinstance(value, torch.Tensor):
                return int(value.shape[0])
        return None

    def broadcast(self, batch_size: int, device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(temperature [B] fp32, top_k [B] int64, top_p [B] fp32) on `device`.

        Tensor parameters must already have length `batch_size` and live on `device`.
        """
        device = torch.device(device)
        out = []
        for name, dtype in (("temperature", torch.float32), ("top_k", torch.int64), ("top_p", torch.float32)):
            value = getattr(self, name)
            if isinstance(value, torch.Tensor):
                if value.shape[0] != batch_size:
                    raise ValueError(f"{name} has {value.shape[0]} rows but the batch has {batch_size} requests")
                if not _same_device(value.device, device):
                    raise ValueError(f"{name} is on {value.device} but the logits are on {device}")
                out.append(value.to(dtype))
            else:
                out.append(torch.full((batch_size,), value, dtype=dtype, device=device))
        return out[0], out[1], out[2]


def _same_device(a: torch.device, b: torch.device) -> bool:
    if a.type != b.type:
        return False
    if a.type == "cuda":
        current = torch.cuda.current_device() if torch.cuda.is_available() else 0
        return (a.index if a.index is not None else current) == (b.index if b.index is not None else current)
    return True


def _row_view(values: torch.Tensor, ndim: int) -> torch.Tensor:
    """[B] -> [B, 1, ..., 1] so it broadcasts over a rank-`ndim` tensor."""
    return values.view(values.shape[0], *([1] * (ndim - 1)))


def _apply_top_k(buf: torch.Tensor, top_k: torch.Tensor, max_top_k: int) -> None:
    """In place on logits: -inf below each row's k-th largest value (rows with k <= 0 untouched)."""
    vocab = buf.shape[-1]
    k_max = min(max_top_k, vocab)
    kth_vals = torch.topk(buf, k_max, dim=-1, sorted=True).values  # [B, ..., k_max]
    k_row = _row_view(top_k, buf.dim()).clamp(1, k_max) - 1  # [B, 1.., 1]
    threshold = kth_vals.gather(-1, k_row.expand(*buf.shape[:-1], 1))  # [B, ..., 1]
    disabled = _row_view((top_k <= 0) | (top_k >= vocab), buf.dim())
    threshold.masked_fill_(disabled, -math.inf)
    buf.masked_fill_(buf < threshold, -math.inf)


def _apply_top_p(buf: torch.Tensor, total: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """In place on unnormalised weights (row sums `total`): zero everything outside the top-p set.

    Returns the new row sums [B, ..., 1].
    """
    vocab = buf.shape[-1]
    sorted_vals, sorted_idx = torch.sort(buf, dim=-1, descending=True)  # transient [B, ..., V] each
    sorted_vals.cumsum_(dim=-1)  # inclusive mass, descending order
    p_row = _row_view(top_p, buf.dim()).expand(*buf.shape[:-1], 1)  # [B, ..., 1]
    # Sorted position j is kept iff j == 0 or the mass before it (cumsum[j - 1]) is < top_p * total.
    kept = torch.searchsorted(sorted_vals, (p_row * total).contiguous(), right=False) + 1  # [B, ..., 1]
    last_kept = sorted_idx.gather(-1, kept.clamp_max(vocab) - 1)  # token id of the smallest kept weight
    del sorted_vals, sorted_idx
    threshold = buf.gather(-1, last_kept)  # [B, ..., 1], the exact stored value (ties kept)
    threshold.masked_fill_(p_row >= 1.0, 0.0)
    buf.masked_fill_(buf < threshold, 0.0)
    return buf.sum(dim=-1, keepdim=True)


def greedy_one_hot_(buf: torch.Tensor, argmax: torch.Tensor, rows: torch.Tensor | None) -> None:
    """Overwrite greedy rows of `buf` ([B, ..., V]) with one-hot(argmax) ([B, ..., 1]); rows=None means all."""
    if rows is None:
        buf.zero_()
        buf.scatter_(-1, argmax, 1.0)
        return
    keep = _row_view(~rows, buf.dim())
    buf.mul_(keep)  # zero the greedy rows
    one = torch.ones((), dtype=buf.dtype, device=buf.device)
    buf.scatter_(-1, argmax, torch.where(keep, buf.gather(-1, argmax), one))


def process_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Processed target probabilities, fp32, same shape as `logits` ([B, V] or [B, N, V]).

    Row b of dimension 0 uses request b's parameters. Greedy rows are the one-hot argmax of the
    raw logits (first maximum on ties, as `torch.argmax`). The input is not modified.
    """
    check_tensor("logits", logits, floating=True)
    if logits.dim() < 2:
        raise ValueError(f"logits must have rank >= 2 ([B, ..., V]), got shape {tuple(logits.shape)}")
    check_all_finite("logits", logits)
    return process_logits_unchecked(logits, params)


def process_logits_unchecked(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """`process_logits` without the shape and finiteness checks (callers that already validated)."""
    weights, total = processed_weights(logits, params)
    return weights.div_(total)


def processed_weights(logits: torch.Tensor, params: SamplingParams) -> tuple[torch.Tensor, torch.Tensor]:
    """Unnormalised processed target weights (the ONE fp32 buffer, [B, ..., V]) and their row sums
    ([B, ..., 1]); probs = weights / sums. Samplers that normalise implicitly skip a full pass."""
    if not isinstance(params, SamplingParams):
        raise ValueError(f"params must be a SamplingParams, got {type(params).__name__}")
    batch = int(logits.shape[0])
    temperature, top_k, top_p = params.broadcast(batch, logits.device)

    buf = torch.empty(logits.shape, dtype=torch.float32, device=logits.device)  # the one fp32 buffer
    if params.all_greedy:
        greedy_one_hot_(buf, logits.argmax(dim=-1, keepdim=True), None)
        return buf, torch.ones((*buf.shape[:-1], 1), dtype=buf.dtype, device=buf.device)
    argmax = logits.argmax(dim=-1, keepdim=True) if params.any_greedy else None  # [B, ..., 1]
    # Shift by the row max BEFORE dividing by a (possibly tiny) temperature: values stay <= 0, so
    # the scaling cannot overflow to +inf, and the max stays exactly 0 through top-k. The fp32 max
    # makes the subtraction itself run in fp32 (it also is the copy into the buffer).
    torch.sub(logits, logits.amax(dim=-1, keepdim=True).float(), out=buf)
    greedy_rows = temperature == 0  # [B]
    inv_t = torch.where(greedy_rows, torch.ones_like(temperature), temperature).reciprocal_()
    buf.mul_(_row_view(inv_t, buf.dim()))
    if params.max_top_k > 0:
        _apply_top_k(buf, top_k, params.max_top_k)
    buf.exp_()
    total = buf.sum(dim=-1, keepdim=True)  # [B, ..., 1], >= 1 (the max contributes exp(0))
    if params.uses_top_p:
        total = _apply_top_p(buf, total, top_p)
    if argmax is not None:
        greedy_one_hot_(buf, argmax, greedy_rows)
        total = torch.where(_row_view(greedy_rows, total.dim()), torch.ones_like(total), total)
    return buf, total
