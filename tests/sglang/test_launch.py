"""`python -m sglang.launch_server --speculative-algorithm DDTREE` on a GPU-less host: the launcher resolves
the DDTREE arguments through the plugin, spawns the scheduler, and the scheduler (which loads plugins
itself, then builds `SpeculativeAlgorithm.from_string("DDTREE")` before touching the GPU) gets as far as
CUDA initialisation. Without the plugin the launcher already refuses the name."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

pytest.importorskip("sglang")
pytest.importorskip("uvloop")  # tier C of the CPU install: the HTTP server module imports

pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(pair, env_extra: dict[str, str], timeout: float) -> str:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(_src()), os.environ.get("PYTHONPATH")) if p)}
    env.pop("TRITON_INTERPRET", None)
    env.update(env_extra)
    cmd = [
        sys.executable, "-m", "sglang.launch_server",
        "--model-path", str(pair / "target"),
        "--speculative-algorithm", "DDTREE",
        "--speculative-draft-model-path", str(pair / "drafter"),
        "--speculative-num-draft-tokens", "17",
        "--device", "cuda", "--host", "127.0.0.1", "--port", str(free_port()),
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode != 0  # there is no GPU: it must stop
    return proc.stdout + proc.stderr


def _src():
    import ddtree

    return os.path.dirname(os.path.dirname(ddtree.__file__))


def test_launch_reaches_cuda_init_with_the_plugin_in_the_scheduler(sglang_pair):
    log = launch(sglang_pair, {}, timeout=480)
    assert "Unknown speculative algorithm" not in log
    assert "'speculative_algorithm': 'DDTREE'" in log and "'speculative_dflash_block_size': 8" in log  # launcher
    assert "Scheduler hit an exception" in log  # the scheduler process was built ...
    assert "init_parallel_runtime" in log  # ... past from_string("DDTREE"), up to the device set-up
    assert "set_device" in log or "NVIDIA driver" in log


def test_without_the_plugin_the_name_is_unknown(sglang_pair):
    log = launch(sglang_pair, {"SGLANG_PLUGINS": "no-such-plugin"}, timeout=300)
    assert "Unknown speculative algorithm name: DDTREE" in log
