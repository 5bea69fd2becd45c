"""Shared fixtures: model pairs for the tests of every part.

`untrained_pair`: random weights, real tokenizer, the pair layout (seconds).
`tiny_pair`: a TRAINED tiny pair (ddtree train-pair --size tiny), trained once per session.
"""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def untrained_pair(tmp_path_factory) -> Path:
    from ddtree.models.pair import random_pair

    return random_pair(tmp_path_factory.mktemp("untrained_pair"), size="tiny", seed=0)


@pytest.fixture(scope="session")
def tiny_pair(tmp_path_factory) -> Path:
    from ddtree.models.train import train_pair

    out = tmp_path_factory.mktemp("tiny_pair")
    train_pair(out, size="tiny", seed=0, device="cpu", progress=False, evaluate=False)
    return out
