"""Fixtures for the SGLang plugin tests (CPU, against the real sglang 0.5.23 package).

SGLang's Triton kernels are decorated when their modules are imported, and Triton decides then whether a
kernel is interpreted (and checks again at launch): the modules the tests launch are imported here with
TRITON_INTERPRET=1, the variable stays set while this directory's tests run and is restored after them,
so the rest of the suite runs as it would alone. Every test module skips when sglang is not importable.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

KERNEL_MODULES = (
    "triton.experimental.gluon",  # imported lazily at the first interpreted launch; asserts the mode
    "sglang.kernels.ops.speculative.spec_tree",
    "sglang.kernels.ops.attention.extend_attention",
    "sglang.kernels.ops.speculative.cache_locs",
    "sglang.kernels.ops.speculative.eagle",
    "sglang.kernels.ops.kvcache.cache_move",
)


# Triton imported before this conftest (by earlier tests of a full-suite run) can leave the interpreter
# unable to patch `tl` helpers inside SGLang's kernels ("Cannot call @triton.jit'd outside of the scope of
# a kernel"). Tests that launch SGLang kernels are then run in a clean subprocess (same test, same
# assertions), one per test function; standalone runs of tests/sglang stay in-process.
TAINTED = "triton" in sys.modules
CLEAN_ENV = "DDTREE_SGLANG_CLEAN_PROCESS"
_clean_runs: dict[str, subprocess.CompletedProcess] = {}


def pytest_configure(config) -> None:
    config.addinivalue_line("markers", "sglang_kernels: launches SGLang Triton kernels under the interpreter")


def pytest_pyfunc_call(pyfuncitem):
    if not (TAINTED and pyfuncitem.get_closest_marker("sglang_kernels") and not os.environ.get(CLEAN_ENV)):
        return None
    function_id = pyfuncitem.nodeid.split("[", 1)[0]
    if function_id not in _clean_runs:
        env = {**os.environ, CLEAN_ENV: "1", "TRITON_INTERPRET": "1"}
        _clean_runs[function_id] = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", function_id],
            cwd=pyfuncitem.config.rootpath, env=env, capture_output=True, text=True, timeout=900,
        )
    done = _clean_runs[function_id]
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    return True


def _import_interpreted() -> None:
    if importlib.util.find_spec("sglang") is None:
        return
    previous = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        for name in KERNEL_MODULES:
            importlib.import_module(name)
    finally:
        if previous is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = previous


_import_interpreted()


@pytest.fixture(scope="package", autouse=True)
def triton_interpreter():
    previous = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    yield
    if previous is None:
        del os.environ["TRITON_INTERPRET"]
    else:
        os.environ["TRITON_INTERPRET"] = previous


@pytest.fixture(scope="session")
def sglang_pair(tmp_path_factory) -> Path:
    """A tiny untrained pair (block-8 drafter) plus `drafter16/`, the same drafter declaring block 16."""
    from ddtree.models.pair import random_pair

    root = random_pair(tmp_path_factory.mktemp("sglang_pair"), size="tiny", seed=0)
    shutil.copytree(root / "drafter", root / "drafter16")
    config_path = root / "drafter16" / "config.json"
    config = json.loads(config_path.read_text())
    config["block_size"] = 16
    config_path.write_text(json.dumps(config))
    return root
