"""Target KV cache for tree verification: preallocated per-layer buffers inside a transformers `DynamicCache`.

Every verify forward appends the N tree rows after the committed rows; the round then keeps only the
accepted path. With a preallocated buffer per layer the append is an in-place write and the compaction
is one gather into the rows right after the committed context, with no reallocation of the cache.

Works with transformers 5.17 (forward keyword `past_key_values`) and 5.24 (`cache`): both keep a list of
per-layer objects in `cache.layers` whose `keys` / `values` tensors are `[B, H_kv, S, head_dim]`.
"""

from __future__ import annotations

import inspect

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer


class BufferedLayer(DynamicLayer):
    """A dynamic cache layer backed by a fixed-capacity buffer; `keys` / `values` are views of its prefix."""

    def __init__(self, capacity: int) -> None:
        super().__init__()
        self.capacity = int(capacity)
        self.length = 0
        self._key_buf: torch.Tensor | None = None  # [B, H_kv, capacity, head_dim]
        self._value_buf: torch.Tensor | None = None

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        batch, heads, _, key_dim = key_states.shape
        self.device = key_states.device
        self.dtype = key_states.dtype
        self._key_buf = key_states.new_empty(batch, heads, self.capacity, key_dim)
        self._value_buf = value_states.new_empty(batch, heads, self.capacity, value_states.shape[-1])
        self.is_initialized = True
        self.set_length(0)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        start, end = self.length, self.length + key_states.shape[-2]
        if end > self.capacity:
            raise ValueError(f"KV cache capacity {self.capacity} exceeded: {end} rows needed")
        self._key_buf[:, :, start:end] = key_states
        self._value_buf[:, :, start:end] = value_states
        self.set_length(end)
        return self.keys, self.values

    def set_length(self, length: int) -> None:
        self.length = int(length)
        self.keys = self._key_buf[:, :, : self.length]
        self.values = self._value_buf[:, :, : self.length]

    def get_seq_length(self) -> int:
        return self.length if self.is_initialized else 0

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove > 0:
            raise ValueError(f"crop expects a negative count of rows to remove, got {tokens_to_remove}")
        if self.is_initialized and tokens_to_remove:
            self.set_length(max(self.length + tokens_to_remove, 0))

    def reset(self) -> None:
        if self.is_initialized:
            self.set_length(0)


def new_cache(target: torch.nn.Module, capacity: int) -> DynamicCache:
    """A `DynamicCache` whose every layer is a `BufferedLayer` of `capacity` rows (full-attention models only)."""
    config = target.config.get_text_config(decoder=True) if hasattr(target.config, "get_text_config") else target.config
    if getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", False):
        raise ValueError("sliding-window targets are not supported by the tree verifier (the mask is custom)")
    num_layers = int(config.num_hidden_layers)
    cache = DynamicCache()
    cache.layers = [BufferedLayer(capacity) for _ in range(num_layers)]
    return cache


def cache_length(cache: DynamicCache) -> int:
    return cache.layers[0].get_seq_length()


def keep_rows(cache: DynamicCache, committed: int, rows: torch.Tensor | None, num_rows: int) -> None:
    """Keep the first `committed` rows plus rows `committed + rows` (in that order) of every layer.

    `rows` ([K] int64 on the cache device, node indices of the accepted path) may be None when the
    accepted rows are already contiguous (0..K-1), then the cache is only cropped.
    """
    new_length = committed + num_rows
    for layer in cache.layers:
        if isinstance(layer, BufferedLayer):
            if rows is not None:
                src = rows + committed  # [K]
                layer._key_buf[:, :, committed:new_length] = layer._key_buf.index_select(2, src)
                layer._value_buf[:, :, committed:new_length] = layer._value_buf.index_select(2, src)
            layer.set_length(new_length)
        else:  # a plain DynamicLayer (foreign cache): rebuild the tensors
            keys, values = layer.keys, layer.values  # [B, H_kv, S, head_dim]
            if rows is not None:
                src = rows + committed
                layer.keys = torch.cat([keys[:, :, :committed], keys.index_select(2, src)], dim=2)
                layer.values = torch.cat([values[:, :, :committed], values.index_select(2, src)], dim=2)
            else:
                layer.keys = keys[:, :, :new_length]
                layer.values = values[:, :, :new_length]


def cache_keyword(target: torch.nn.Module) -> str:
    """The forward keyword that takes the KV cache: `cache` (transformers >= 5.2x) or `past_key_values`."""
    params = inspect.signature(target.forward).parameters
    return "cache" if "cache" in params else "past_key_values"
