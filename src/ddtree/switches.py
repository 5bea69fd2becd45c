"""Every `DDTREE_*` environment switch of the project, typed and read in this one module.

The switches exist to measure or to work around a device, never to choose between two ways of doing one
job in normal use: with none set, each job takes its one fastest measured path (benchmarks/NOTES-core.md).

| variable                       | field                   | effect                                                |
|--------------------------------|-------------------------|-------------------------------------------------------|
| `DDTREE_NO_TRITON=1`           | `no_triton`             | no Triton kernel in the tree builder (torch reference) |
| `DDTREE_NO_CUDA_GRAPH=1`       | `no_cuda_graph`         | `build_tree` on CUDA runs eagerly (no graph replay)   |
| `DDTREE_TRITON_BEAM_MAX_WIDTH` | `triton_beam_max_width` | widest beam the Triton tail takes (0: torch tail)     |
| `DDTREE_STATS_PROGRAMS`        | `stats_programs`        | programs the builder's statistics kernel aims for     |
| `DDTREE_NO_OVERLAP=1`          | `no_overlap`            | the batched engine's CUDA rounds do not overlap       |
| `DDTREE_RAW_SAMPLED_TREES=1`   | `raw_sampled_trees`     | trees of sampled rows on the raw draft logits (no tree temperature) |

Code reads `current()`. The environment is read once, on the first call (set the variables before the process
starts); benchmarks and tests change switches for a block with `override(...)`. Path choices are cached per device
together with the `Switches` value they were made under, so an override never meets a choice made under others.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, fields, replace
from functools import lru_cache

_TRUE = ("1", "true", "yes")
DEFAULT_TRITON_BEAM_MAX_WIDTH = 256  # the one-program beam is checked up to width 256 (H200, NOTES-core.md)
DEFAULT_STATS_PROGRAMS = 4096  # rows x splits of the statistics kernel (H200 sweep, NOTES-core.md)


@dataclass(frozen=True)
class Switches:
    no_triton: bool = False
    no_cuda_graph: bool = False
    triton_beam_max_width: int = DEFAULT_TRITON_BEAM_MAX_WIDTH
    stats_programs: int = DEFAULT_STATS_PROGRAMS
    no_overlap: bool = False
    raw_sampled_trees: bool = False

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type == "bool" and not isinstance(value, bool):
                raise ValueError(f"switch {f.name} must be a bool, got {value!r}")
            if f.type == "int" and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise ValueError(f"switch {f.name} must be an int >= 0, got {value!r}")
        if self.stats_programs < 1:
            raise ValueError(f"switch stats_programs must be >= 1, got {self.stats_programs}")


ENV = {  # field -> environment variable
    "no_triton": "DDTREE_NO_TRITON",
    "no_cuda_graph": "DDTREE_NO_CUDA_GRAPH",
    "triton_beam_max_width": "DDTREE_TRITON_BEAM_MAX_WIDTH",
    "stats_programs": "DDTREE_STATS_PROGRAMS",
    "no_overlap": "DDTREE_NO_OVERLAP",
    "raw_sampled_trees": "DDTREE_RAW_SAMPLED_TREES",
}


def from_environment(environ: Mapping[str, str] = os.environ) -> Switches:
    """The switches that the `DDTREE_*` variables of `environ` ask for (unset or empty: the default)."""
    values: dict[str, object] = {}
    for name, var in ENV.items():
        text = environ.get(var)
        if text is None or not text.strip():
            continue
        if isinstance(getattr(Switches, name), bool):
            values[name] = text.strip().lower() in _TRUE
        else:
            try:
                values[name] = int(text)
            except ValueError:
                raise ValueError(f"{var} must be an integer, got {text!r}") from None
    return Switches(**values)


_OVERRIDE: Switches | None = None


@lru_cache(maxsize=1)
def _from_process_environment() -> Switches:
    return from_environment()


def current() -> Switches:
    """The switches in force: the innermost `override`, else the process environment (read on the first call)."""
    if _OVERRIDE is not None:
        return _OVERRIDE
    return _from_process_environment()


@contextmanager
def override(**changes: object) -> Iterator[Switches]:
    """Within the block, `current()` is the current switches with `changes` applied (names as the fields)."""
    global _OVERRIDE
    unknown = set(changes) - set(ENV)
    if unknown:
        raise ValueError(f"unknown switches {sorted(unknown)}; known: {sorted(ENV)}")
    previous = _OVERRIDE
    _OVERRIDE = replace(current(), **changes)
    try:
        yield _OVERRIDE
    finally:
        _OVERRIDE = previous
