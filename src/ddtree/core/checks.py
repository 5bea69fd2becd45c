"""Input validation shared by the core functions (every failure names the argument), and the device key of
per-device caches."""

from __future__ import annotations

import numbers

import torch


def check_tensor(
    name: str,
    value: object,
    *,
    ndim: int | None = None,
    floating: bool | None = None,
    finite: bool = False,
) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if ndim is not None and value.dim() != ndim:
        raise ValueError(f"{name} must have rank {ndim}, got shape {tuple(value.shape)}")
    if floating is True and not value.is_floating_point():
        raise ValueError(f"{name} must be a floating-point tensor, got dtype {value.dtype}")
    if finite and not bool(torch.isfinite(value).all()):
        raise ValueError(f"{name} contains non-finite values (nan or inf)")
    return value


def check_same_device(name: str, value: torch.Tensor, reference_name: str, reference: torch.Tensor) -> None:
    if value.device != reference.device:
        raise ValueError(
            f"{name} is on {value.device} but {reference_name} is on {reference.device}; move them to one device"
        )


def check_dim(name: str, value: torch.Tensor, dim: int, expected: int, what: str) -> None:
    if value.shape[dim] != expected:
        raise ValueError(
            f"{name} has size {value.shape[dim]} in dimension {dim} but {what} is {expected} "
            f"(shape {tuple(value.shape)})"
        )


def check_all_finite(name: str, value: torch.Tensor) -> None:
    """ValueError unless every element is finite, reading `value` once with no full-size temporary.

    Row min and max (NaN propagates through both) are finite exactly when every element is; unlike
    `isfinite(value).all()` this allocates no full-size bool tensor, and unlike a float64 sum it
    makes no float64 copy of low-precision logits on CUDA.
    """
    if value.numel() == 0:
        return
    rows = value.reshape(-1, value.shape[-1]) if value.dim() else value.reshape(1, 1)
    if rows.is_cuda:
        low, high = torch.aminmax(rows, dim=-1)  # one pass on the GPU
    else:
        low, high = rows.amin(dim=-1), rows.amax(dim=-1)  # CPU aminmax has a slow bf16 path
    if not bool(torch.isfinite(low).all() & torch.isfinite(high).all()):
        raise ValueError(f"{name} contains non-finite values (nan or inf)")


def check_budget(name: str, value: object) -> int:
    """A node budget: an integer >= 1 (Python or numpy int; bools, floats and tensors are refused)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be an int >= 1, got {value!r} ({type(value).__name__})")
    if value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value}")
    return int(value)


def canonical_device(device: torch.device | str) -> torch.device:
    """`device` with its index filled in ("cuda" -> "cuda:<current>"): the key of per-device caches."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device
