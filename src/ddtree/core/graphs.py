"""CUDA-graph capture of a piece of work given as a function, and an LRU cache of the captured graphs.

Nothing here knows what is captured: callers pass the work (`body`), so this module imports nothing of ddtree.
"""

from __future__ import annotations

import warnings
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

import torch

T = TypeVar("T")


def capture(body: Callable[[], T], device: torch.device) -> tuple[torch.cuda.CUDAGraph, T]:
    """Run `body()` twice on a side stream (compiles kernels, runs first-call checks, fills constant caches:
    none of that may happen inside a capture), then capture one call. Returns the graph and the output of the
    captured call (its tensors are the graph's static outputs, rewritten by every replay)."""
    stream = torch.cuda.Stream(device=device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        for _ in range(2):
            body()
    torch.cuda.current_stream(device).wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = body()
    return graph, static_out


class GraphCache(Generic[T]):
    """At most `size` captured objects by key, least recently used evicted first. A key whose capture raised
    RuntimeError (e.g. inside another capture) is remembered and warned about once: `get` then returns None
    and the caller runs the work eagerly."""

    def __init__(self, what: str, size: int = 16) -> None:
        self.what = what
        self.size = size
        self._items: OrderedDict[Hashable, T] = OrderedDict()
        self._failed: set[Hashable] = set()

    def get(self, key: Hashable, make: Callable[[], T]) -> T | None:
        if key in self._failed:
            return None
        item = self._items.get(key)
        if item is not None:
            self._items.move_to_end(key)
            return item
        try:
            item = make()
        except RuntimeError as exc:
            warnings.warn(f"ddtree: CUDA graph capture of the {self.what} failed ({exc}); running it eagerly")
            self._failed.add(key)
            return None
        self._items[key] = item
        while len(self._items) > self.size:
            self._items.popitem(last=False)
        return item

    def __len__(self) -> int:
        return len(self._items)

    def clear(self) -> None:
        self._items.clear()
        self._failed.clear()
