"""Helpers of the workflow tests: a temp copy of the workflow and a Snakemake runner."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
WORKFLOW_PATHS = ("Snakefile", "workflow", "config", "notebooks", "gpu-cluster", ".test", "environment.yml")


def copy_workflow(dest: Path) -> Path:
    """The workflow files only (the package itself is installed), so results never touch the checkout."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in WORKFLOW_PATHS:
        src = REPO / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=shutil.ignore_patterns("__pycache__", ".ipynb_checkpoints"))
        else:
            shutil.copy2(src, dest / name)
    return dest


def snakemake(cwd: Path, *args: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "snakemake", *args]
    full_env = {**os.environ, **(env or {})}
    # the sglang tests' Triton interpreter must not leak into the workflow's jobs (it makes Triton code crawl on CPU)
    full_env.pop("TRITON_INTERPRET", None)
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=full_env)
