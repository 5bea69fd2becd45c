"""Counter-based uniforms: coin (seed, round, column) is a pure function of its three integers.

Every random draw of a request is `uniforms(seed, counter, width)` for that request's own seed and round
counter, so a seeded request samples the same tokens whether it is decoded alone or in a batch, on any
batch row, and the draw is a few integer tensor ops: no generator state, nothing to register with a CUDA
graph. The mixer is a 32-bit integer hash (xor-shift / multiply rounds) evaluated in int64 tensors; only
the low 32 bits of each product are kept, which two's-complement wrap-around leaves exact. Coins carry 24
bits (exact in float32): [0, 1 - 2^-24].
"""

from __future__ import annotations

import torch

_M32 = 0xFFFFFFFF


def mix32(x: torch.Tensor) -> torch.Tensor:
    """A bijective avalanche hash of 32-bit values held in int64 (inputs are masked to 32 bits)."""
    x = x & _M32
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & _M32
    x = x ^ (x >> 15)
    x = (x * 0x846CA68B) & _M32
    return x ^ (x >> 16)


def request_keys(seed: torch.Tensor) -> torch.Tensor:
    """seed [B] int64 -> the requests' coin keys [B] (a request's key is fixed: computed once, at admission)."""
    return mix32(seed ^ mix32((seed >> 32) ^ 0x9E3779B9))


def _mix32_int(x: int) -> int:
    """`mix32` of one Python int (the same 32-bit arithmetic: masking after each product is what int64 keeps)."""
    x &= _M32
    x ^= x >> 16
    x = (x * 0x7FEB352D) & _M32
    x ^= x >> 15
    x = (x * 0x846CA68B) & _M32
    return x ^ (x >> 16)


def request_key(seed: int) -> int:
    """`request_keys` of one seed, on the host: an admission passes its row's key with its other fields, so the
    device spends no launches hashing it (equal to the tensor version for every int64 seed)."""
    return _mix32_int(seed ^ _mix32_int((seed >> 32) ^ 0x9E3779B9))


def column_keys(width: int, device: torch.device) -> torch.Tensor:
    """[width] int64: the per-column keys (fixed for a round width: computed once per width)."""
    return mix32(torch.arange(width, device=device, dtype=torch.int64) ^ 0xC2B2AE35)


def keyed_uniforms(keys: torch.Tensor, counter: torch.Tensor, columns: torch.Tensor) -> torch.Tensor:
    """keys [B] (`request_keys`), counter [B] int64, columns [W] (`column_keys`) -> coins [B, W] float32 in [0, 1)."""
    round_key = mix32(keys ^ mix32(counter ^ 0x85EBCA6B)).unsqueeze(1)  # [B, 1]
    bits = mix32(round_key ^ columns.unsqueeze(0))  # [B, W]
    bits = mix32(bits ^ (round_key >> 7))
    return (bits >> 8).to(torch.float32) * (1.0 / (1 << 24))


def uniforms(seed: torch.Tensor, counter: torch.Tensor, width: int) -> torch.Tensor:
    """seed [B] int64, counter [B] int64 -> coins [B, width] float32 in [0, 1)."""
    return keyed_uniforms(request_keys(seed), counter, column_keys(width, seed.device))
