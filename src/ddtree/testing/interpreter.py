"""Run a test file's Triton-kernel tests on a machine without a GPU: pytest in a child process under Triton's
interpreter (`TRITON_INTERPRET=1` must be set before triton is imported, so not in the calling process)."""

from __future__ import annotations

import os
import subprocess
import sys


def pytest_under_interpreter(test_file: str, selector: str, timeout_s: float = 900) -> subprocess.CompletedProcess:
    """`pytest -q -k selector test_file` with TRITON_INTERPRET=1; the caller asserts on the returned output."""
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test_file, "-k", selector],
        env={**os.environ, "TRITON_INTERPRET": "1"}, capture_output=True, text=True, timeout=timeout_s,
    )
